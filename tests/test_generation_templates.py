"""Generation counted from templates (a prefill and a decode step traced with a symbolic cache length) against
step-by-step counting (``profile_generation(..., reuse=False)``) and the closed form, on tiny configs built on
meta: the same total, roles, bytes, modules and steps, across the guards' boundaries (a sliding window that binds,
a rope that switches at a length, a scan's chunks), and a refusal with its reason where the guards split every
length."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from flopscope.errors import SymbolicError
from flopscope.predict.polynomial import Polynomial
from flopscope.workloads import count_generation, profile_generation
from flopscope.workloads.symbolic import symbolic_limits, symbolic_sizes_kept

transformers = pytest.importorskip("transformers")
# one symbolic trace per template: a PyTorch that makes symbolic sizes constants refuses them
# (tests/test_symbolic.py checks the refusal)
pytestmark = pytest.mark.skipif(not symbolic_sizes_kept(), reason=str(symbolic_limits()))

d, d_ff, L, h, kv, V = 64, 112, 2, 4, 2, 96
head = d // h
WINDOW = 6


def build(cls: type, config: object) -> nn.Module:
    with torch.device("meta"):
        return cls(config)


def llama() -> nn.Module:
    return build(transformers.LlamaForCausalLM, transformers.LlamaConfig(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V))


FAMILIES = {
    "llama": llama,
    "gpt2": lambda: build(transformers.GPT2LMHeadModel, transformers.GPT2Config(
        n_embd=d, n_layer=L, n_head=h, vocab_size=V, n_positions=64, bos_token_id=0, eos_token_id=0)),
    "mistral_window": lambda: build(transformers.MistralForCausalLM, transformers.MistralConfig(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V, sliding_window=WINDOW)),
    "gemma2": lambda: build(transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        head_dim=16, vocab_size=V, sliding_window=WINDOW)),
    "gemma3": lambda: build(transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=3, num_attention_heads=h, num_key_value_heads=kv,
        head_dim=16, vocab_size=V, sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "mixtral": lambda: build(transformers.MixtralForCausalLM, transformers.MixtralConfig(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V, num_local_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": lambda: build(transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config(
        hidden_size=d, intermediate_size=d_ff, moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=h, num_key_value_heads=h, vocab_size=V, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=12)),
    # LongRoPE: the cache dropped and the sequence fed again where it first passes the original context (8)
    "phi3_longrope": lambda: build(transformers.Phi3ForCausalLM, transformers.Phi3Config(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V, max_position_embeddings=64, original_max_position_embeddings=8, pad_token_id=0,
        bos_token_id=0, eos_token_id=0,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * (head // 2), "long_factor": [2.0] * (head // 2)})),
    # attention beside Mamba-2 in each layer: the scan's chunks (4) split the cache lengths by their remainder
    "falcon_h1": lambda: build(transformers.FalconH1ForCausalLM, transformers.FalconH1Config(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
        mamba_chunk_size=4, pad_token_id=0, bos_token_id=0, eos_token_id=0)),
    # linear attention (gated DeltaNet: a state, chunks padded by a symbolic amount) beside full attention
    "qwen3_next": lambda: build(transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig(
        hidden_size=d, intermediate_size=d_ff, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=h,
        num_key_value_heads=kv, head_dim=16, vocab_size=V, num_experts=4, num_experts_per_tok=2,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_templates_give_the_numbers_of_step_by_step_counting(family: str) -> None:
    """Prompt 4, 9 new tokens: the decode steps' caches cross the window (6) where the config has one, Phi-3's
    original context (8: the step at 8 feeds all 9 positions again), Falcon-H1's chunk boundaries."""
    model = FAMILIES[family]()
    ids = torch.zeros(1, 4, dtype=torch.long)
    counted = count_generation(model, ids, 9)
    stepwise = profile_generation(model, ids, 9, reuse=False)
    assert counted.total() == stepwise.total() > 0
    assert counted.by_role() == stepwise.by_role()
    assert counted.total_bytes() == stepwise.total_bytes()
    assert {k: v for k, v in counted.by_module().items() if v} == {k: v for k, v in stepwise.by_module().items() if v}
    assert [s.row() for s in counted.steps()] == [{**s.row(), "seconds": None} for s in stepwise.steps()]


def test_a_window_that_binds_splits_the_cache_lengths_at_the_window() -> None:
    """Mistral's cache keeps the last W - 1 positions once it holds W: the trace at the prompt's length stands
    for the lengths below the window, and a trace at W for the lengths from W on, the rest of the run."""
    counted = count_generation(FAMILIES["mistral_window"](), torch.zeros(1, 4, dtype=torch.long), 40)
    last = counted.pieces[-1]
    assert last.hint == WINDOW and last.lengths == ((WINDOW, 4 + 40 - 2),)
    assert all(b < WINDOW for piece in counted.pieces[:-1] for _, b in piece.lengths)


def test_the_decode_step_is_the_closed_form_in_the_cache_length() -> None:
    """Llama, batch 2: per layer q and o are d·d, k and v d·(kv·head), the FFN 3·d·d_ff, the scores and the
    weighted sum h·head·(n + 1) each for a cache of n; the head d·V. Per sequence, times 2."""
    batch = 2
    counted = count_generation(llama(), torch.zeros(batch, 8, dtype=torch.long), 5)
    decode = counted.pieces[0].decode.macs.polynomial
    per_layer = [2 * d * d + 2 * d * kv * head + 3 * d * d_ff + 2 * h * head, 2 * h * head]
    assert decode == Polynomial((Fraction(batch * (L * per_layer[0] + d * V)), Fraction(batch * L * per_layer[1])))


def test_a_long_generation_costs_a_short_ones_count() -> None:
    """32,768 new tokens: the prefill's count plus the decode step's polynomial summed in closed form, equal to
    the sum of the closed form step by step."""
    prompt, new = 16, 32_768
    counted = count_generation(llama(), torch.zeros(1, prompt, dtype=torch.long), new)
    layer = 2 * d * d + 2 * d * kv * head + 3 * d * d_ff
    prefill = L * (prompt * layer + 2 * h * head * prompt * prompt) + d * V
    decode = sum(L * (layer + 2 * h * head * (n + 1)) + d * V for n in range(prompt, prompt + new - 1))
    assert counted.total() == prefill + decode
    assert len(counted.pieces) == 1 and counted.seconds < 60


def test_a_one_token_prompt_is_counted_concretely_then_symbolically() -> None:
    """Sizes 0 and 1 are constants of PyTorch's symbolic shapes: the cache length 1 is its own piece."""
    model = llama()
    ids = torch.zeros(1, 1, dtype=torch.long)
    counted = count_generation(model, ids, 5)
    assert [p.hint for p in counted.pieces] == [1, 2]
    assert counted.total() == profile_generation(model, ids, 5, reuse=False).total()


def test_a_guard_that_splits_every_length_is_refused_after_max_traces() -> None:
    """A model whose Python loops over the prompt's positions (Jamba's Mamba scan) specialises each trace to its
    length: refused, naming the guard, once ``max_traces`` pieces are made."""
    config = transformers.JambaConfig(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=2, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V, num_experts=2, expert_layer_period=2, attn_layer_period=2, attn_layer_offset=1,
        mamba_d_state=8, mamba_expand=2, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    model = build(transformers.JambaForCausalLM, config)
    with pytest.raises(SymbolicError, match="guard"):
        count_generation(model, torch.zeros(1, 4, dtype=torch.long), 9, max_traces=2)


def test_a_step_that_reads_a_value_is_refused_naming_its_module() -> None:
    """A forward that reads a value of its activations into Python (a branch on ``x.abs().max().item()``) cannot be
    traced on fake tensors: refused, naming the module, before any number."""
    model = llama()
    norm = model.model.norm
    forward = norm.forward

    def reading(x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 1e9:
            x = x * 0
        return forward(x)

    norm.forward = reading
    with pytest.raises(SymbolicError, match=r"module 'model\.norm' needs real data"):
        count_generation(model, torch.zeros(1, 4, dtype=torch.long), 5)
