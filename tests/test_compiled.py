"""flopscope.profile of ``torch.compile(model)`` and of a ``torch.export`` ``ExportedProgram``, against closed forms;
a compiled model stays compiled after a profile (no recompilation, no eager fall-back: the compiled graph runs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo  # reset() between tests

import flopscope
from flopscope.capture.compiled import COMPILED_NOTE, EXPORTED_NOTE
from flopscope.studies.models import TransformerBlock

n, d, h, d_ff = 16, 32, 4, 128
d_k = d // h
ROLES = {"q_proj": n * d * d, "k_proj": n * d * d, "v_proj": n * d * d, "out_proj": n * d * d,
         "attn_scores": h * n * n * d_k, "attn_weighted_sum": h * n * n * d_k,
         "ffn_up": n * d * d_ff, "ffn_down": n * d_ff * d}
MODULES = {"attention.q_proj": n * d * d, "ffn.up": n * d * d_ff, "ffn.down": n * d_ff * d}


class Counting:
    """A torch.compile backend that runs Dynamo's graph as it is and counts compilations and calls of it."""

    def __init__(self) -> None:
        self.compiled = self.calls = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.compiled += 1

        def run(*args: Any) -> Any:
            self.calls += 1
            return graph.forward(*args)

        return run


def block() -> tuple[TransformerBlock, torch.Tensor]:
    # Dynamo's caches start empty: a compiled call made under a dispatch mode anywhere before in this process (a
    # FlopCounterMode, a profiler block) would have marked TransformerBlock.forward's code as not to be compiled
    torch._dynamo.reset()
    torch.manual_seed(0)
    return TransformerBlock(d, h, d_ff).eval(), torch.randn(1, n, d)


def check(prof: flopscope.Profile, note: str) -> None:
    assert {role: macs for role, macs in prof.by_role().items() if macs} == ROLES
    assert prof.total() == n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    modules = prof.by_module()
    assert {path: modules[path] for path in MODULES} == MODULES  # the model's own paths
    assert not any("_orig_mod" in path for path in modules)
    assert note in prof.notes


@pytest.mark.parametrize("mode", ["fake", "real", "auto"])
def test_a_compiled_model_is_counted_and_stays_compiled(mode: str) -> None:
    model, x = block()
    backend = Counting()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        expected = compiled(x)
    assert (backend.compiled, backend.calls) == (1, 1)
    with torch.no_grad():
        prof = flopscope.profile(compiled, x, mode=mode)
    check(prof, COMPILED_NOTE)
    assert (backend.compiled, backend.calls) == (1, 1)  # the profile neither compiled nor ran the compiled graph
    if mode == "real":
        torch.testing.assert_close(prof.output, expected)
    with torch.no_grad():
        again = compiled(x)
    assert (backend.compiled, backend.calls) == (1, 2)  # no recompilation, and the compiled graph ran (not eager)
    torch.testing.assert_close(again, expected)


def test_a_profile_before_the_first_call_compiles_nothing_and_counts_the_backward() -> None:
    model, x = block()
    backend = Counting()
    compiled = torch.compile(model, backend=backend)
    prof = flopscope.profile(compiled, x, mode="fake", backward=True)
    assert {role: macs for role, macs in prof.by_role(phase="forward").items() if macs} == ROLES
    assert prof.by_phase()["backward"] > 0
    assert backend.compiled == 0
    with torch.no_grad():
        compiled(x)
    assert (backend.compiled, backend.calls) == (1, 1)


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_an_exported_program_is_counted_as_itself(mode: str) -> None:
    model, x = block()
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        prof = flopscope.profile(program, x, mode=mode)
    check(prof, EXPORTED_NOTE)
    if mode == "real":
        torch.testing.assert_close(prof.output, program.module()(x))
    flat = flopscope.profile(program.module(), x, mode=mode)  # its flat graph: the same ops
    assert flat.by_role() == prof.by_role()


def test_something_else_is_still_refused() -> None:
    with pytest.raises(flopscope.NotAModuleError, match="got function"):
        flopscope.profile(lambda x: x, torch.zeros(1))


def test_a_profiler_block_around_a_compiled_model_warns() -> None:
    model, _ = block()
    compiled = torch.compile(model, backend=Counting())
    with pytest.warns(flopscope.FlopscopeWarning, match=r"runs eagerly there .* flopscope.profile\(compiled, ...\)"):
        flopscope.profiler(compiled)


def test_crosscheck_of_a_compiled_model_leaves_it_compiled() -> None:
    model, x = block()
    backend = Counting()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(x)
        cc = flopscope.crosscheck(compiled, x, tools=["FlopCounterMode"])  # a dispatch mode, on a copy
        compiled(x)
    assert cc.macs == sum(ROLES.values()) and cc["FlopCounterMode"].error is None
    assert (backend.compiled, backend.calls) == (1, 2)
