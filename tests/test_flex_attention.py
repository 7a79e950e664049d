"""FlexAttention (``torch.nn.attention.flex_attention``, a higher-order op): counted as its eager implementation
executes it on the CPU (dense: every query-key pair of every head, whatever the block mask), with its roles."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope

flex = pytest.importorskip("torch.nn.attention.flex_attention")

B, H, N, D = 2, 4, 128, 16


def _cpu_refuses_backward() -> bool:
    """Newer torch refuses FlexAttention's backward on the CPU; older torch runs it (2.6, 2.7: compiled eagerly).
    Asked once, at import, before any test: after other calls, torch 2.7's compiled FlexAttention can fail this
    backward (dynamo: "Attempted to inline function marked as skipped")."""
    q = torch.zeros(1, 1, 16, 8, requires_grad=True)
    try:
        flex.flex_attention(q, q, q).sum().backward()
    except NotImplementedError:
        return True
    return False


CPU_REFUSES_BACKWARD = _cpu_refuses_backward()
E = H * D
WINDOW = 32


def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return q >= kv


def sliding_window(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return (q >= kv) & (q - kv < WINDOW)


class FlexSelfAttention(nn.Module):
    def __init__(self, mask_mod) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(E, E) for _ in range(4))
        self.block_mask = flex.create_block_mask(mask_mod, B, H, N, N, device="cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (p(x).unflatten(-1, (H, D)).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = flex.flex_attention(q, k, v, block_mask=self.block_mask)
        return self.out_proj(out.transpose(1, 2).flatten(-2))


EXPECTED = {"q_proj": B * N * E * E, "k_proj": B * N * E * E, "v_proj": B * N * E * E, "out_proj": B * N * E * E,
            "attn_scores": B * H * N * N * D, "attn_weighted_sum": B * H * N * N * D}


@pytest.mark.parametrize("mask_mod", [causal, sliding_window])
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_flex_attention_counts_its_dense_eager_work_with_roles(mask_mod, mode) -> None:  # type: ignore[no-untyped-def]
    before = getattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", None)  # (not in torch 2.6)
    with torch.no_grad():
        prof = flopscope.profile(FlexSelfAttention(mask_mod), torch.randn(B, N, E), mode=mode)
    assert prof.mode == mode
    assert prof.by_role() == EXPECTED  # the block mask changes which scores count, not how many are computed
    assert prof.by_op()["flex_attention"] == 2 * B * H * N * N * D
    assert prof.unsupported() == {}
    assert getattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", None) is before  # put back after the capture


ALLOWED = {causal: N * (N + 1) // 2, sliding_window: sum(min(i + 1, WINDOW) for i in range(N))}
"""Pairs each mask allows, per (batch, head): query i sees keys 0..i, or the last WINDOW of them."""


@pytest.mark.parametrize("mask_mod", [causal, sliding_window])
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_the_mask_convention_reads_the_block_masks_mask_mod(mask_mod, mode) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        prof = flopscope.profile(FlexSelfAttention(mask_mod), torch.randn(B, N, E), mode=mode)
    useful = prof.by_role(attention="mask")
    assert useful["attn_scores"] == useful["attn_weighted_sum"] == B * H * ALLOWED[mask_mod] * D
    assert useful["q_proj"] == B * N * E * E  # the projections are not attention pairs
    half = prof.by_role(attention="causal")  # the causal half, n²/2, where the mask is causal
    assert half["attn_scores"] == B * H * N * N * D // 2


def test_flex_attention_backward_is_refused_by_torch_on_the_cpu() -> None:
    if not CPU_REFUSES_BACKWARD:
        pytest.skip("this torch runs FlexAttention's backward on the CPU")
    with pytest.raises(flopscope.ForwardError, match="FlexAttention does not support backward on CPU"):
        flopscope.profile(FlexSelfAttention(causal), torch.randn(B, N, E), mode="real", backward=True)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_flex_attention_backward_where_the_cpu_runs_it(mode) -> None:  # type: ignore[no-untyped-def]
    if CPU_REFUSES_BACKWARD:
        pytest.skip("this torch refuses FlexAttention's backward on the CPU (above)")
    prof = flopscope.profile(FlexSelfAttention(causal), torch.randn(B, N, E), mode=mode, backward=True)
    assert prof.by_role(phase="forward") == EXPECTED
    # the input needs no gradient: a weight gradient for each projection, and out_proj's input gradient; the
    # core's backward recomputes the scores, then dQ, dK (score-sized), dV, dP (weighted-sum-sized)
    core = B * H * N * N * D
    assert prof.by_role(phase="backward") == {"q_proj": B * N * E * E, "k_proj": B * N * E * E,
                                               "v_proj": B * N * E * E, "out_proj": 2 * B * N * E * E,
                                               "attn_scores": 3 * core, "attn_weighted_sum": 2 * core}
    assert prof.unsupported() == {}


def test_the_backward_formula_is_the_dense_core_backward() -> None:
    """The CPU refuses FlexAttention's backward (above), so its op's formula is checked on shapes: the scores
    recomputed and dQ, dK (score-sized), dV, dP (weighted-sum-sized), with grouped-query K/V of 2 heads."""
    from flopscope import formulas

    spec = flopscope.REGISTRY.spec(formulas.FLEX_ATTENTION_BACKWARD)
    q, kv = torch.empty(B, H, N, D, device="meta"), torch.empty(B, 2, 3 * N, D, device="meta")
    parts = formulas.count(spec.formula, (q, kv, kv, q, None, q, None), {}, None)
    assert parts == {"attn_scores": 3 * B * H * N * 3 * N * D, "attn_weighted_sum": 2 * B * H * N * 3 * N * D}
