"""fla's chunked gated delta rule (Qwen3-Next, Qwen3.5, OLMo hybrid on a GPU), counted at its ``autograd.Function``
(``flopscope.capture.catalog``) on a CPU: its Triton kernels cannot run here, and on fake tensors and meta they are
not run. One price for the algorithm: the model with fla counts what it counts on transformers' torch reference path,
total and roles, each the closed form of the chunked algorithm (``docs/conventions.md``).

Runs where flash-linear-attention is installed: the matrix's ``kernels`` cell (``tools/matrix.py kernels``, part of
``.ci/run``). It is kept out of the main environment, where transformers would bind fla's Triton kernels on the CPU
for every Qwen3-Next test (a real run there cannot launch them)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopscope
from flopscope.formulas import gated_delta_rule_chunked

fla = pytest.importorskip("fla", reason="flash-linear-attention is installed in the matrix's kernels cell")
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule  # noqa: E402
from fla.ops.gla import chunk_gla  # noqa: E402
from fla.ops.simple_gla import chunk_simple_gla  # noqa: E402
from transformers import Qwen3NextConfig, Qwen3NextModel  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: E402

B, T, D = 2, 100, 64
HK, H, KW, VW = 2, 4, 16, 32  # key heads, value heads, key width, value width


class Core(nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, q, k, v, g, beta):
        return self.function(q, k, v, g, beta, initial_state=None, output_final_state=True)


def profile(model, *args, **kwargs) -> flopscope.Profile:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(model, *args, **kwargs)


def inputs(device: str = "cpu"):
    q, k = torch.randn(B, T, HK, KW, device=device), torch.randn(B, T, HK, KW, device=device)
    v = torch.randn(B, T, H, VW, device=device)
    return q, k, v, -torch.rand(B, T, H, device=device), torch.rand(B, T, H, device=device)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_fla_chunk_gated_delta_rule_is_one_record_priced_as_the_chunked_algorithm(device):
    """fla's function on fake tensors (and meta): one record, the closed form's total; its outputs' shapes are the
    kernel's (o like v, the final state [B, h, K, V] in float32)."""
    prof = profile(Core(chunk_gated_delta_rule), *inputs(device))
    assert prof.total() == sum(gated_delta_rule_chunked((B, T, HK, KW), (B, T, H, VW)).values())
    assert [op.op_name for op in prof._ops if op.macs] == ["fla.chunk_gated_delta_rule"]
    out, state = prof.output
    assert tuple(out.shape) == (B, T, H, VW) and tuple(state.shape) == (B, H, KW, VW)
    assert state.dtype == torch.float32


def test_the_torch_reference_path_counts_the_same():
    reference = modeling_qwen3_next.torch_chunk_gated_delta_rule.__wrapped__  # transformers' own, unwrapped
    ours = profile(Core(chunk_gated_delta_rule), *inputs())
    theirs = profile(Core(reference), *inputs())
    assert ours.total() == theirs.total() == sum(gated_delta_rule_chunked((B, T, HK, KW), (B, T, H, VW)).values())


def test_qwen3_next_with_fla_counts_and_attributes_as_on_the_reference_path():
    """A Qwen3-Next linear-attention layer whose core is fla's kernel: projections found through the kernel's q, k, v
    (closed forms), the core's parts the chunked algorithm's, the conv and the gate columns as on the reference
    path."""
    config = Qwen3NextConfig(
        hidden_size=D, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=HK, linear_num_value_heads=H, linear_key_head_dim=KW,
        linear_value_head_dim=VW, linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        vocab_size=100, decoder_sparse_step=1)
    with torch.device("meta"):
        model = Qwen3NextModel(config).eval()
    prof = profile(model, torch.zeros(B, T, dtype=torch.long))
    assert [op.module for op in prof._ops if op.op_name == "fla.chunk_gated_delta_rule"] == [
        "layers.0.linear_attn"]  # (transformers bound fla's function, not its torch path)
    core = gated_delta_rule_chunked((B, T, HK, KW), (B, T, H, VW))
    tokens, channels, width = B * T, 2 * HK * KW + H * VW, 4
    assert prof.by_block()["layers.0.linear_attn"] == {
        "q_proj": tokens * D * HK * KW, "k_proj": tokens * D * HK * KW, "v_proj": tokens * D * H * VW,
        "out_proj": tokens * H * VW * D, "attn_scores": core["attn_scores"],
        "attn_weighted_sum": core["attn_weighted_sum"], "attn_kv_state": core["attn_kv_state"],
        "attn_readout": core["attn_readout"],
        "conv": B * channels * width * (T + width - 1),  # nn.Conv1d(padding=W-1): T + W - 1 outputs per channel
        "other": core["other"] + tokens * D * H * VW}  # the gate z's columns of in_proj_qkvz


class Recurrent(nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, q, k, v, g, beta, state):
        return self.function(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                             use_qk_l2norm_in_kernel=True)  # (by keyword, as transformers calls it)


def test_fla_fused_recurrent_counts_as_the_torch_recurrence():
    """A decoding step's recurrence (fla's fused recurrent kernel; transformers' torch_recurrent_gated_delta_rule on a
    CPU): on fake tensors the kernel is recorded as the recurrence it computes, so both paths count the same, total
    and elementwise work (its state products are elementwise products and sums: no MAC on either path)."""
    reference = modeling_qwen3_next.torch_recurrent_gated_delta_rule.__wrapped__
    q, k, v, g, beta = (t[:, :1] for t in inputs())  # one new token
    state = torch.randn(B, H, KW, VW)
    ours, theirs = (profile(Recurrent(f), q, k, v, g, beta, state)
                    for f in (fused_recurrent_gated_delta_rule, reference))
    assert ours.total() == theirs.total() == 0
    assert ours.elementwise() == theirs.elementwise() and sum(ours.elementwise().values()) > 0
    (out, final), (expected, expected_state) = ours.output, theirs.output
    assert out.shape == expected.shape == (B, 1, H, VW) and final.shape == expected_state.shape == (B, H, KW, VW)


KIMI = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=32, intermediate_size=64,
            moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            kv_lora_rank=8, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8, num_local_experts=4,
            num_experts_per_tok=2, linear_head_dim=8, linear_num_heads=4,
            layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"])


@pytest.mark.parametrize(("tokens", "padded"), [(8, 64), (130, 192)])
def test_kimi_linear_with_fla_counts_as_on_the_reference_path(tokens, padded, monkeypatch):
    """Kimi-Linear's KDA through fla's ``chunk_kda`` (chunks of 64): one record, priced as transformers' chunked
    algorithm (``kda_chunked``): the state's write T'·K·V and two reads per head, the UT transform's products with
    the values and the decayed keys and the in-chunk scores' product with the corrected values, T'·C·(2V + K). The
    total and the core's parts are the reference path's. Its q, k, v and o projections are found through the
    kernel's operands (q_proj ...); the reference path, whose in-chunk scores are elementwise, leaves them other."""
    kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    heads, width, chunk, d = 4, 8, 64, 32
    model = kimi.KimiLinearForCausalLM(kimi.KimiLinearConfig(**KIMI)).eval()
    ids = torch.randint(0, 64, (1, tokens))
    ours = profile(model, ids, mode="fake")
    assert [op.module for op in ours._ops if op.op_name == "fla.chunk_kda"] == ["model.layers.0.self_attn"]
    monkeypatch.setattr(kimi, "chunk_kimi_delta_attention", kimi.chunk_kimi_delta_attention.__wrapped__)
    theirs = profile(model, ids, mode="fake")
    assert ours.total() == theirs.total()
    block = ours.by_block()["model.layers.0.self_attn"]
    core = {"attn_kv_state": heads * padded * width * width, "attn_readout": 2 * heads * padded * width * width}
    assert {role: block[role] for role in core} == core
    projection = tokens * d * heads * width
    assert [block[role] for role in ("q_proj", "k_proj", "v_proj", "out_proj")] == [projection] * 4
    reference = theirs.by_block()["model.layers.0.self_attn"]
    assert {role: reference[role] for role in core} == core
    ufunc = heads * padded * chunk * (2 * width + width)
    assert block["other"] == reference["other"] == ufunc


class Gated(nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, q, k, v, g):
        return self.function(q, k, v, g, output_final_state=True)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("function", "name", "per_channel"), [(chunk_gla, "fla.chunk_gla", True),
                                                                (chunk_simple_gla, "fla.chunk_simple_gla", False)])
def test_gated_linear_attention_is_one_record_priced_as_its_chunks(function, name, per_channel, device):
    """fla's GLA (a decay per key channel) and simple GLA (one per head) over 100 tokens, in chunks of 64 (padded
    to 128): per head the in-chunk scores q·kᵀ 128·64·K and their product with v 128·64·V, the state's read q·S and
    write kᵀ·v, 128·K·V each."""
    q, k = torch.randn(B, T, H, KW, device=device), torch.randn(B, T, H, KW, device=device)
    v = torch.randn(B, T, H, VW, device=device)
    g = -torch.rand(B, T, H, KW, device=device) if per_channel else -torch.rand(B, T, H, device=device)
    prof = profile(Gated(function), q, k, v, g)
    padded, chunk = 128, 64
    assert prof.by_role() == {
        "attn_scores": B * H * padded * chunk * KW, "attn_weighted_sum": B * H * padded * chunk * VW,
        "attn_kv_state": B * H * padded * KW * VW, "attn_readout": B * H * padded * KW * VW}
    assert [op.op_name for op in prof._ops if op.macs] == [name]
    out, state = prof.output
    assert tuple(out.shape) == (B, T, H, VW) and tuple(state.shape) == (B, H, KW, VW)


def test_kimi_linear_decoding_with_fla_counts_as_on_the_reference_path(monkeypatch):
    """Greedy decoding of two tokens: the prefill through ``chunk_kda``, each step through ``fused_recurrent_kda``, a
    plain function launching its Triton kernel (counted at the launch, ``flopscope.capture.launches``: one record per
    step, 0 MACs, its state products being elementwise as on the reference recurrence). The same total and core as
    the reference path (the projections' roles differ as in the prefill, above); nothing unpriced."""
    kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    from flopscope.workloads.decoding import greedy_decode

    model = kimi.KimiLinearForCausalLM(kimi.KimiLinearConfig(**KIMI)).eval()
    ids = torch.randint(0, 64, (1, 8))

    def decode() -> flopscope.Profile:
        with torch.no_grad(), warnings.catch_warnings(), flopscope.profiler(model, mode="fake") as recording:
            warnings.simplefilter("ignore")
            greedy_decode(model, ids, 2)
        return recording.result

    ours = decode()
    assert ours.op_calls()["fla.fused_recurrent_kda"] == 1 and ours.unsupported() == {}
    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
        monkeypatch.setattr(kimi, name, getattr(kimi, name).__wrapped__)
    theirs = decode()
    assert "fla.fused_recurrent_kda" not in theirs.op_calls()
    assert ours.total() == theirs.total()
    mine, reference = ours.by_role(), theirs.by_role()
    assert [mine[role] for role in ("attn_kv_state", "attn_readout", "conv", "logits")] == [
        reference[role] for role in ("attn_kv_state", "attn_readout", "conv", "logits")]


class Dplr(nn.Module):
    def __init__(self, function, **kwargs) -> None:
        super().__init__()
        self.function, self.kwargs = function, kwargs

    def forward(self, q, k, v, a, b, gk):
        return self.function(q, k, v, a, b, gk, **self.kwargs)


def test_the_dplr_delta_rule_is_priced_as_fla_s_chunked_reference():
    """RWKV-7's transition (diagonal plus low rank) through fla's ``chunk_dplr_delta_rule`` over 64 tokens, in fla's
    chunks of 16: one record, the total of fla's own chunked reference in torch (``dplr_chunkwise``, the same chunks)
    and the closed form: per head 2·T·C·V weighted sums, 2·T·K·V state writes and reads each, T·C·(2V + K) for the
    UT transform."""
    from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_chunkwise

    length, chunk = 64, 16
    q, k, a, b = (torch.randn(B, length, H, KW) for _ in range(4))
    v, gk = torch.randn(B, length, H, VW), -torch.rand(B, length, H, KW)
    ours = profile(Dplr(chunk_dplr_delta_rule, output_final_state=True), q, k, v, a, b, gk)
    assert [op.op_name for op in ours._ops if op.macs] == ["fla.chunk_dplr_delta_rule"]
    expected = B * H * length * (2 * chunk * VW + 4 * KW * VW + chunk * (2 * VW + KW))
    assert ours.total() == expected
    heads_first = [t.transpose(1, 2) for t in (q, k, v, a, b, gk)]
    theirs = profile(Dplr(dplr_chunkwise, chunk_size=chunk), *heads_first)
    assert theirs.total() == expected
    out, state = ours.output
    assert tuple(out.shape) == (B, length, H, VW) and tuple(state.shape) == (B, H, KW, VW)
