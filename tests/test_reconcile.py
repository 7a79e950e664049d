"""Reconciliation: ratio exactly 1 where the model does what the formula says, an explained ratio where not."""

from __future__ import annotations

import warnings
from fractions import Fraction

import pytest
import torch

import flopscope
from flopscope import TransformerSpec
from flopscope.studies.models import TransformerBlock

from zoo import CASES, built, fastpath

transformers = pytest.importorskip("transformers")

d, h, n, m, d_ff, B = 64, 4, 10, 7, 128, 2


def reconcile(model, *args, mode="fake", spec=None, **kwargs) -> flopscope.Reconciliation:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model.eval(), *args, mode=mode, **kwargs)
    result = prof.reconcile(spec)
    measured = sum(row.measured for row in result.rows)
    assert measured == prof.total() - prof.by_role().get("other", 0)
    return result


def ids(length: int) -> torch.Tensor:
    return torch.randint(0, 100, (B, length), generator=torch.Generator().manual_seed(length))


# base-size BERT and ViT take seconds each here; their families are reconciled at small sizes below
@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.family not in ("bert", "vit")])
def test_zoo_reconciles_exactly(name):
    model, args, kwargs = built(name)
    with fastpath(CASES[name].fastpath):
        result = reconcile(model, *args, **kwargs)
    assert result.rows and result.all_exact(), result.to_table()


@pytest.mark.parametrize("family", ["bert", "gpt2", "t5", "bart", "mixtral", "vit"])
def test_hugging_face_families_reconcile_exactly(family):
    T = transformers
    if family == "bert":
        model, args = T.BertModel(T.BertConfig(hidden_size=d, num_hidden_layers=2, num_attention_heads=h,
                                               intermediate_size=d_ff, vocab_size=100)), (ids(n),)
    elif family == "gpt2":
        model, args = T.GPT2LMHeadModel(T.GPT2Config(n_embd=d, n_layer=2, n_head=h, vocab_size=100)), (ids(n),)
    elif family == "vit":
        model = T.ViTModel(T.ViTConfig(hidden_size=d, num_hidden_layers=2, num_attention_heads=h,
                                       intermediate_size=d_ff, image_size=32, patch_size=8))
        args = (torch.randn(B, 3, 32, 32),)
    elif family == "mixtral":
        model = T.MixtralModel(T.MixtralConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=2,
                                               num_attention_heads=h, num_key_value_heads=2, num_local_experts=4,
                                               num_experts_per_tok=2, vocab_size=100))
        args = (ids(n),)
    else:
        config = (T.T5Config(d_model=d, d_kv=d // h, d_ff=d_ff, num_layers=2, num_heads=h, vocab_size=100)
                  if family == "t5" else
                  T.BartConfig(d_model=d, encoder_layers=2, decoder_layers=2, encoder_attention_heads=h,
                               decoder_attention_heads=h, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff, vocab_size=100))
        model = (T.T5Model if family == "t5" else T.BartModel)(config)
        result = reconcile(model, input_ids=ids(n), decoder_input_ids=ids(m), mode="auto")
        assert result.all_exact(), result.to_table()
        return
    result = reconcile(model, *args, mode="auto")
    assert result.all_exact(), result.to_table()


def llama(**extra) -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=2,
                                      num_attention_heads=h, num_key_value_heads=2, vocab_size=100, **extra)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_causal_attention_reports_useful_work_beside_executed_work():
    result = reconcile(llama(), ids(n))
    assert result.all_exact()
    scores = next(r for r in result.rows if r.role == "attn_scores")
    assert scores.measured == B * h * n * n * (d // h)  # the dense kernel executes every pair
    assert scores.useful == B * h * (n * (n + 1) // 2) * (d // h)  # the causal mask needs n(n+1)/2 of them
    assert scores.term == "n²·d"


def test_sliding_window_useful_work():
    W = 4
    config = transformers.MistralConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=1,
                                        num_attention_heads=h, num_key_value_heads=2, vocab_size=100,
                                        sliding_window=W)
    result = reconcile(transformers.MistralModel(config), ids(n))
    scores = next(r for r in result.rows if r.role == "attn_scores")
    assert result.all_exact()
    assert scores.useful == B * h * (W * n - W * (W - 1) // 2) * (d // h)


def test_decoding_with_a_cache_is_an_explained_ratio():
    model = llama()
    with torch.no_grad():
        cache = model(ids(n), use_cache=True).past_key_values
    result = reconcile(model, ids(1), mode="real", past_key_values=cache)
    scores = [r for r in result.rows if r.role in ("attn_scores", "attn_weighted_sum")]
    others = [r for r in result.rows if r.role not in ("attn_scores", "attn_weighted_sum")]
    assert all(r.exact for r in others), result.to_table()
    for row in scores:  # predicted from the block input (one token); the query also meets n cached keys
        assert row.ratio == Fraction(n + 1, 1)
        assert "KV cache" in row.reason
    assert result.unexplained() == []


def test_a_stated_spec_wins_and_a_wrong_one_shows():
    block = flopscope.studies.models.TransformerBlock(d, h, d_ff)
    x = torch.randn(1, n, d)
    assert reconcile(block, x, spec=TransformerSpec(n=n, d=d, h=h, d_ff=d_ff)).all_exact()
    wrong = reconcile(block, x, spec=TransformerSpec(n=2 * n, d=d, h=h, d_ff=d_ff))
    q = next(r for r in wrong.rows if r.role == "q_proj")
    assert q.ratio == Fraction(1, 2)


def test_an_unrecognised_block_says_so():
    class Bare(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    q = torch.randn(B, n, d)
    result = reconcile(Bare(), q, q, q)
    assert result.rows and all(r.predicted is None and "unrecognised" in r.reason for r in result.rows)


@pytest.mark.parametrize("options", [dict(kdim=24, vdim=20), dict(add_bias_kv=True), dict(add_zero_attn=True)])
def test_multihead_attention_options_are_predicted_from_its_declaration(options):
    E, heads, n_q, n_k = 32, 4, 5, 7
    mha = torch.nn.MultiheadAttention(E, heads, batch_first=True, **options)

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, q, k, v):
            return self.mha(q, k, v)[0]

    k_in, v_in = options.get("kdim", E), options.get("vdim", E)
    result = reconcile(Call(), torch.randn(1, n_q, E), torch.randn(1, n_k, k_in), torch.randn(1, n_k, v_in))
    assert result.all_exact(), result.to_table()
    appended = int(options.get("add_bias_kv", False)) + int(options.get("add_zero_attn", False))
    scores = next(r for r in result.rows if r.role == "attn_scores")
    assert scores.measured == n_q * (n_k + appended) * E
    k_proj = next(r for r in result.rows if r.role == "k_proj")
    assert k_proj.measured == n_k * k_in * E


def test_stages_of_different_widths_use_each_blocks_own_declaration():
    """Swin: the width doubles per stage; the config's hidden_size is only the last stage's."""
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                                     window_size=4)
    result = reconcile(transformers.SwinModel(config), torch.randn(1, 3, 32, 32))
    assert result.all_exact(), result.to_table()
    first = next(r for r in result.rows if r.block == "encoder.layers.0.blocks.0.attention" and r.role == "q_proj")
    windows, area, width = (32 // 4 // 4) ** 2, 4 * 4, 16  # 4 windows of 4x4 patches, stage-0 width 16
    assert first.predicted == windows * area * width * width


def test_rows_follow_the_data_through_each_block() -> None:
    prof = flopscope.profile(TransformerBlock(64, 4, 256), torch.zeros(1, 16, 64))
    assert [row.role for row in prof.reconcile().rows] == [
        "q_proj", "k_proj", "v_proj", "attn_scores", "attn_weighted_sum", "out_proj", "ffn_up", "ffn_down"]


class CausalConv3d(torch.nn.Conv3d):
    """A causal 3-D convolution as video VAEs write it: pad the time axis on the left in forward, convolve unpadded."""

    def __init__(self) -> None:
        super().__init__(4, 8, kernel_size=3, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.nn.functional.pad(x, (1, 1, 1, 1, 2, 0)))


def test_a_convolution_that_pads_its_own_input_is_explained():
    """Declared padding 0, executed on the padded input: T·H·W outputs (5·6·6) instead of (T-2)·(H-2)·(W-2), each
    8 × 4 × 27 MACs; the row is not exact and says why."""
    prof = flopscope.profile(CausalConv3d(), torch.randn(1, 4, 5, 6, 6), mode="fake")
    (row,) = prof.reconcile().rows
    assert row.measured == 5 * 6 * 6 * 8 * 4 * 27
    assert row.predicted == 3 * 4 * 4 * 8 * 4 * 27
    assert "pads its input" in row.reason and not prof.reconcile().unexplained()
