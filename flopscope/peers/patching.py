"""DeepSpeed's flops profiler and calflops: their runners for
:func:`~.common.crosscheck`.

Both count the same way (calflops is an older copy of DeepSpeed's profiler): while
profiling they replace Python functions (``F.linear``, ``F.conv*``, ``torch.matmul``,
``torch.addmm``, ...; DeepSpeed also ``torch.Tensor.__matmul__``, ``torch.mm`` / ``bmm``
and ``F.scaled_dot_product_attention``) with wrappers that add a count to the innermost
module running (its forward pre-hook opened a frame), and give RNN modules a rule of
their own (a forward hook). Units: each reports **MACs** (``get_total_macs()``, compared
here) beside FLOPs; a wrapper's MACs are 0 for elementwise work, and their RNN rules
count FLOPs only (0 MACs). Nothing reached through an unpatched function (the fused
``torch._native_multi_head_attention`` / ``_transformer_encoder_layer_fwd`` fast paths,
the LSTM kernel, calflops' ``@``, ``torch.bmm`` and SDPA) is counted.

The runner drives each tool as its own entry point does (DeepSpeed's
``get_model_profile``, calflops' ``calculate_flops``: start, one forward, read the
totals, end; no clean-up when the forward raises, so what the tool leaves behind then is
what :func:`~.isolation.isolated` finds, undoes and reports), on a copy of the model,
with flopscope counting the very run. The evidence, per module path:

- the tool's own count there (``module.__macs__``: the wrappers' MACs while that module
  was the innermost one running), and the functions it patched (read off ``torch``,
  ``torch.nn.functional`` and ``torch.Tensor`` right after it started);
- flopscope's records of that run, each owned by the innermost module on its stack that
  has an RNN rule (that rule should count it), else by its own module;
- per path where the two differ, grouped by module type: which ATen ops ran there and
  which of the Python functions that reach them the tool does not patch. Where the MACs
  of the ops reached only through unpatched functions are exactly the shortfall, those
  ops are the explanation, with their roles.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..profile import OpRecord, Profile
from .common import Difference, PeerCount, copy_for, inner_profile, ordered, path_difference, quiet, sum_roles
from .isolation import Functions

_MATMUL_FUNCTIONS = ("torch.matmul", "Tensor.matmul", "Tensor.__matmul__", "torch.einsum")
REACHED_THROUGH: Mapping[str, tuple[str, ...]] = {
    "aten.mm": ("F.linear", *_MATMUL_FUNCTIONS, "torch.mm", "Tensor.mm"),
    "aten.addmm": ("F.linear", "torch.addmm", "Tensor.addmm"),
    "aten.bmm": (*_MATMUL_FUNCTIONS, "torch.bmm", "Tensor.bmm"),
    "aten.baddbmm": ("torch.baddbmm", "Tensor.baddbmm"),
    "aten.convolution": ("F.conv1d", "F.conv2d", "F.conv3d", "F.conv_transpose1d",
                         "F.conv_transpose2d",
                         "F.conv_transpose3d"),
    "aten._native_multi_head_attention": ("torch._native_multi_head_attention",),
    "aten._transformer_encoder_layer_fwd": ("torch._transformer_encoder_layer_fwd",),
}
"""The Python functions a model calls that reach each ATen op (its name in flopscope's
records); every SDPA kernel is reached through ``F.scaled_dot_product_attention``. An op
not listed has no function these tools could patch."""


def _reached_through(op: str) -> tuple[str, ...]:
    if op.startswith("aten._scaled_dot_product") or op == "aten.scaled_dot_product_attention":
        return ("F.scaled_dot_product_attention",)
    return REACHED_THROUGH.get(op, ())


@dataclass(frozen=True)
class _Driver:
    """How one tool is started, read and ended (as its own entry point does it)."""

    tool: str
    start: Callable[[nn.Module], Any]  # the model -> the tool's profiler, started
    total_macs: Callable[[Any], int]
    end: Callable[[Any], None]
    # its module-level rules (RNN modules): a forward hook instead of the wrappers
    rules: Mapping[type, Any]


def _deepspeed() -> _Driver:
    from deepspeed.profiling.flops_profiler.profiler import MODULE_HOOK_MAPPING, FlopsProfiler

    def start(model: nn.Module) -> Any:
        profiler = FlopsProfiler(model)
        profiler.start_profile()
        return profiler

    return _Driver("deepspeed", start, lambda p: int(p.get_total_macs()), lambda p: p.end_profile(),
                   MODULE_HOOK_MAPPING)


def _calflops() -> _Driver:
    from calflops.calculate_pipline import CalFlopsPipline
    from calflops.pytorch_ops import MODULE_HOOK_MAPPING

    def start(model: nn.Module) -> Any:
        pipeline = CalFlopsPipline(model=model, include_backPropagation=False,
                                   compute_bp_factor=2.0)
        pipeline.start_flops_calculate(ignore_list=None)
        return pipeline

    return _Driver("calflops", start, lambda p: int(p.get_total_macs()),
                   lambda p: p.end_flops_calculate(),
                   MODULE_HOOK_MAPPING)


def _run_deepspeed(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
                   plugins: bool) -> PeerCount:
    """DeepSpeed's ``FlopsProfiler`` on a copy of ``model`` (module docstring);
    ``plugins``: it has none."""
    return _run(_deepspeed(), model, args, kwargs, prof)


def _run_calflops(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
                  plugins: bool) -> PeerCount:
    """calflops' ``CalFlopsPipline`` on a copy of ``model`` (module docstring);
    ``plugins``: it has none."""
    return _run(_calflops(), model, args, kwargs, prof)


def _run(driver: _Driver, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
         prof: Profile) -> PeerCount:
    twin = copy_for(model, {})
    before = Functions.snapshot()
    with quiet(), inner_profile(twin) as followed:
        profiler = driver.start(twin)
        patched = set(before.patched())
        # as get_model_profile / calculate_flops: if this raises, the tool cleans up
        # nothing
        twin(*args, **kwargs)
        total = driver.total_macs(profiler)
        macs = {path: int(getattr(m, "__macs__", 0) or 0) for path, m in twin.named_modules()}
        flops = {path: int(getattr(m, "__flops__", 0) or 0) for path, m in twin.named_modules()}
        driver.end(profiler)

    everywhere = dict(twin.named_modules(remove_duplicate=False))
    first: dict[int, str] = {}
    for path, m in everywhere.items():
        first.setdefault(id(m), path)  # a shared module: the tool counts it at its first path
    canonical = {path: first[id(m)] for path, m in everywhere.items()}
    ruled = {path for path, m in everywhere.items() if type(m) in driver.rules}
    mine: dict[str, list[OpRecord]] = {}
    for record in (followed.profile or prof).records:
        owner = next((p for p in reversed(record.module_stack) if p in ruled), record.module)
        mine.setdefault(canonical.get(owner, owner), []).append(record)

    differences = path_difference(driver.tool, "its module hooks change what runs",
                                  followed.profile, prof)
    # the same MACs, maybe through other kernels
    if followed.profile is not None and not differences:
        ours, theirs_ops = set(prof.by_op()), set(followed.profile.by_op())
        if ours != theirs_ops:
            differences.append(Difference(driver.tool, "path", 0,
                                          "its module hooks change what runs, with the same "
                                          "MACs: "
                                          f"{', '.join(sorted(ours - theirs_ops)) or 'nothing'} in "
                                          "the caller's run, "
                                          f"{', '.join(sorted(theirs_ops - ours)) or 'nothing'} in "
                                          "its"))
    # (module type, kind, by an RNN rule) -> paths
    groups: dict[tuple[str, str, bool], list[str]] = {}
    for path in [*mine, *(p for p in macs if p not in mine)]:
        counted, executed = macs.get(path, 0), sum(r.multiplies for r in mine.get(path, ()))
        if counted != executed:
            by_rule = path in ruled
            type_name = type(everywhere[path]).__name__ if path in everywhere else "?"
            groups.setdefault((type_name, _kind(counted, executed), by_rule), []).append(path)
    for (type_name, kind, by_rule), paths in groups.items():
        concerned = [r for path in paths for r in mine.get(path, ())]
        counted = sum(macs.get(path, 0) for path in paths)
        if by_rule:
            native = sum(flops.get(path, 0) for path in paths)
            differences.append(Difference(driver.tool, kind,
                                          counted - sum(r.multiplies for r in concerned),
                                          f"its {type_name} rule counts {native:,} FLOPs and "
                                          f"{counted:,} MACs",
                                          sum_roles(concerned), tuple(paths)))
        else:
            differences.extend(_explain(driver.tool, type_name, kind, counted, concerned, patched,
                                        tuple(paths)))
    by_module = {path: value for path, value in macs.items() if value}
    return PeerCount(driver.tool, total, prof.total(), differences=ordered(differences),
                     by_module=by_module)


def _kind(counted: int, executed: int) -> str:
    if counted > executed:
        return "extra" if executed == 0 else "over"
    return "missing" if counted == 0 else "under"


def _explain(tool: str, type_name: str, kind: str, counted: int, records: list[OpRecord],
             patched: set[str],
             paths: tuple[str, ...]) -> list[Difference]:
    """The difference in the modules of one type, per op where the evidence allows: when
    the MACs of one set of ops, each with a function reaching it that the tool does
    not patch, are exactly the shortfall, those ops (with their roles) are the
    explanation; else the modules' whole count against flopscope's."""
    executed = sum(r.multiplies for r in records)
    by_op: dict[str, int] = {}
    for record in records:
        by_op[record.op] = by_op.get(record.op, 0) + record.multiplies
    ops = sorted(by_op)
    if kind in ("missing", "under"):
        unseen = [op for op in ops if not _reached_through(op) or any(fn not in patched for fn in
                                                                         _reached_through(op))]
        found = _exact_subsets(unseen, by_op, executed - counted) if len(unseen) <= 8 else []
        if len(found) == 1:
            missed = set(found[0])
            return [Difference(tool, "missing", -sum(by_op[op] for op in missed),
                               f"{', '.join(sorted(missed))} in {type_name}: not counted ("
                               f"{'; '.join(_not_patched(op, patched) for op in sorted(missed))})",
                               sum_roles(r for r in records if r.op in missed), paths)]
    unpatched = sorted({fn for op in ops for fn in _reached_through(op) if fn not in patched})
    hint = f" (it does not patch {_or(unpatched)})" if unpatched else ""
    if kind == "missing":
        reason = f"it counts none of the MACs of {', '.join(ops)} in {type_name}{hint}"
    elif kind == "under":
        reason = f"its patched functions count {counted:,} of the {executed:,} MACs of {', '.join(ops)} in " \
                 f"{type_name}{hint}"
    elif kind == "over":
        reason = f"its patched functions count {counted:,} MACs in {type_name}, flopscope's formulas {executed:,} " \
                 f"({', '.join(ops)})"
    else:
        reason = f"its patched functions count {counted:,} MACs in {type_name}, where flopscope counts none"
    return [Difference(tool, kind, counted - executed, reason,
                       {} if kind == "extra" else sum_roles(records), paths)]


def _exact_subsets(ops: list[str], by_op: Mapping[str, int],
                   shortfall: int) -> list[tuple[str, ...]]:
    """The sets of ``ops`` whose MACs sum to ``shortfall`` exactly."""
    return [subset for size in range(1, len(ops) + 1) for subset in itertools.combinations(ops, size)
            if sum(by_op[op] for op in subset) == shortfall]


def _not_patched(op: str, patched: set[str]) -> str:
    through = _reached_through(op)
    if not through:
        return f"{op} is reached through no function it could patch"
    missing = [fn for fn in through if fn not in patched]
    if len(missing) == len(through):
        return f"reached through {_or(missing)}, which it does not patch"
    return f"it does not patch {_or(missing)}"


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
