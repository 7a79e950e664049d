"""The 17 cases of reference/peers.md and the Llama-7B shape: total() equals the closed form exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import flopscope

from closed_forms import add, attention, ffn, rotary, times, total
from zoo import CASES, CPU_FUSED_GQA, FASTPATH_KERNELS, LLAMA_7B, SDPA_CPU, built, fastpath, llama_7b_on_meta

pytest.importorskip("transformers")


def run(name: str, mode: str) -> flopscope.Profile:
    model, args, kwargs = built(name)
    with fastpath(CASES[name].fastpath), torch.no_grad():
        return flopscope.profile(model, *args, mode=mode, **kwargs)


@pytest.mark.parametrize("mode", ["fake", "real"])
@pytest.mark.parametrize("name", list(CASES))
def test_total_equals_closed_form(name: str, mode: str) -> None:
    case = CASES[name]
    if case.grouped_query and SDPA_CPU in case.must_run and not CPU_FUSED_GQA:
        pytest.skip("this torch runs grouped-query SDPA on the CPU as the math path, not the fused kernel")
    prof = run(name, mode)
    assert prof.mode == mode
    assert prof.total() == case.total
    assert prof.total_flops() == 2 * case.total
    assert prof.by_module()[""] == case.total
    assert sum(prof.by_op().values()) == case.total
    assert prof.unsupported() == {}
    ops = set(prof.by_op())
    assert case.must_run <= ops, "the fused kernel this case exists for did not run"
    # the case exercises what its attributes say
    if case.fastpath_kind is not None:
        assert (FASTPATH_KERNELS[case.fastpath_kind] in ops) == (case.fastpath is not False)
    sdpa = any("scaled_dot_product" in op for op in ops)
    fused = any(kernel in ops for kernel in FASTPATH_KERNELS.values())
    assert sdpa == (case.attention == "sdpa") and fused == (case.attention == "fused")
    assert (case.attention is None) == ("attn_scores" not in case.roles)


@pytest.mark.parametrize("name", list(CASES))
def test_agrees_with_flop_counter_mode_on_the_ops_it_counts_right(name: str) -> None:
    """PyTorch's counter is exact on plain GEMMs and convolutions; per op, the two must agree."""
    model, args, kwargs = built(name)
    counter = FlopCounterMode(display=False)
    with fastpath(CASES[name].fastpath), torch.no_grad(), counter:
        model(*args, **kwargs)
    theirs = {str(op): flops for op, flops in counter.get_flop_counts().get("Global", {}).items()}
    ours = run(name, "real").by_op()
    for op in ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.convolution"):
        assert 2 * ours.get(op, 0) == theirs.get(op, 0), op


def test_llama_7b_shape_on_meta_counts_exactly() -> None:
    c = LLAMA_7B
    layer = add(attention(1, c["n"], c["n"], c["d"], c["h"]), ffn(1, c["n"], c["d"], c["d_ff"], gated=True))
    expected = sum(times(c["L"], layer).values())
    assert expected == 14_362_370_637_824  # the figure of reference/peers.md
    angles = total(rotary(c["n"], c["d"] // c["h"]))  # (transformers before 5.19: the rotary angles, a bmm)
    expected += angles
    model, ids = llama_7b_on_meta()
    for mode in ("fake", "auto"):
        prof = flopscope.profile(model, ids, mode=mode)
        assert prof.mode == "fake"
        assert prof.total() == expected
        # on meta kernels, scaled_dot_product_attention takes its math path: QKᵀ and the weighted sum as bmm's
        assert prof.by_op()["aten.bmm"] == c["L"] * 2 * c["n"] ** 2 * c["d"] + angles
        assert prof.by_role()["attn_scores"] == prof.by_role()["attn_weighted_sum"] == c["L"] * c["n"] ** 2 * c["d"]
    assert all(p.is_meta for p in model.parameters())
