"""The counters people already use, checked against flopscope, and plug-ins that fix them.

Units: **MACs** (multiply-accumulates) everywhere; FLOPs = 2 x MACs, and only PyTorch's
``FlopCounterMode`` speaks FLOPs (its counts are halved here, its plug-in formulas return ``2 x MACs``).
fvcore's "flop" is one fused multiply-add, i.e. a MAC; thop's ``total_ops`` are MACs for its GEMM and
convolution rules and elementwise operation counts for its norm / softmax / pooling rules.

:func:`crosscheck` runs flopscope (``mode="real"``) and every peer that is installed on the same model and
inputs, and explains each peer's difference per role: which ops it does not count, which roles those
ops carry in flopscope's records, and how many MACs that is, so the explained amounts add up to the
difference (anything left is reported as unexplained).

The plug-ins are built from flopscope's formula registry (:data:`flopscope.formulas.REGISTRY`), so each
tool counts what flopscope counts:

- :func:`flop_counter_mapping`: ``FlopCounterMode(custom_mapping=flop_counter_mapping())``;
- :func:`fvcore_handles` / :func:`fvcore_analysis`: op handles for fvcore's ``FlopCountAnalysis``;
- :func:`thop_custom_ops`: ``thop.profile(model, inputs, custom_ops=thop_custom_ops())``.

Peers are imported lazily, inside the functions; a peer that is not installed is skipped.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tabulate import tabulate
from torch import nn

from .formulas import REGISTRY, FormulaRegistry, MacFormula, Shape, total_of
from .profile import OpRecord, Profile
from .role import ROLE_ORDER

TOOLS: tuple[str, ...] = ("FlopCounterMode", "fvcore", "thop")
"""The peers :func:`crosscheck` knows, in the order it runs them."""

aten = torch.ops.aten


# --------------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """One explained part of a peer's difference from flopscope.

    ``delta``: the peer's MACs minus flopscope's on this part (negative: the peer misses work).
    ``roles``: flopscope's MACs per role on the work concerned (for ``kind="missing"``, exactly what the
    peer misses, summing to ``-delta``). ``kind``: ``"missing"`` (the peer counts 0 of that work),
    ``"under"`` / ``"over"`` (it counts that work, but less / more), ``"extra"`` (it counts work that is not
    multiply-accumulates: norms, softmax, pooling), ``"path"`` (the peer runs the model differently, so
    different kernels execute).
    """

    tool: str
    kind: str
    delta: int
    reason: str
    roles: Mapping[str, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The explanation without the tool name."""
        roles = _role_list(self.roles)
        if self.kind in ("missing", "under") and not roles:
            return f"{-self.delta:,} MACs {'missing' if self.kind == 'missing' else 'undercounted'} — {self.reason}"
        if self.kind == "missing":
            return f"{roles} missing ({-self.delta:,} MACs) — {self.reason}"
        if self.kind == "under":
            return f"{roles} undercounted by {-self.delta:,} MACs — {self.reason}"
        if self.kind == "over" and roles:
            return f"{roles} overcounted by {self.delta:,} MACs — {self.reason}"
        return f"{self.delta:+,} MACs — {self.reason}"

    @property
    def line(self) -> str:
        """``"FlopCounterMode: attn_scores and attn_weighted_sum missing (... MACs) — ..."``."""
        return f"{self.tool}: {self.text}"


@dataclass(frozen=True)
class PeerCount:
    """What one peer reported, in MACs, and its difference from flopscope explained.

    ``by_op``: MACs per op as the tool names them (``FlopCounterMode``: ``"aten.mm"``; fvcore: ``"addmm"``),
    ``None`` where the tool has no per-op output (thop). ``by_type``: thop's MACs per module type (the
    total of its rule over the modules of that type; ``"(functional)"`` for what its function hooks
    counted). ``error``: the exception the tool raised (then ``macs`` is ``None``).
    """

    tool: str
    macs: int | None
    reference: int  # flopscope's total() (MACs)
    by_op: Mapping[str, int] | None = None
    by_type: Mapping[str, int] | None = None
    error: str | None = None
    differences: tuple[Difference, ...] = ()
    unsupported: Mapping[str, int] | None = None  # fvcore's unsupported_ops(): {op: calls}

    @property
    def difference(self) -> int | None:
        """The peer's MACs minus flopscope's."""
        return None if self.macs is None else self.macs - self.reference

    @property
    def ratio(self) -> float | None:
        """The peer's MACs / flopscope's (1.0 is agreement)."""
        if self.macs is None:
            return None
        return self.macs / self.reference if self.reference else (1.0 if self.macs == 0 else math.inf)

    @property
    def unexplained(self) -> int:
        """MACs of the difference that no :class:`Difference` explains (0 when fully explained)."""
        if self.macs is None:
            return 0
        return self.macs - self.reference - sum(d.delta for d in self.differences)

    def lines(self) -> list[str]:
        """One line per explained difference, then the unexplained rest (if any)."""
        if self.error is not None:
            return [f"{self.tool}: failed — {self.error}"]
        out = [d.line for d in self.differences]
        if self.unexplained:
            out.append(f"{self.tool}: {self.unexplained:+,} MACs unexplained")
        if not out:
            out.append(f"{self.tool}: agrees exactly")
        return out


@dataclass(frozen=True)
class Crosscheck:
    """flopscope's count and every peer's, per tool (``crosscheck["thop"]``), all in MACs."""

    profile: Profile
    peers: Mapping[str, PeerCount]
    plugins: bool = False  # the peers ran with flopscope's plug-ins

    @property
    def macs(self) -> int:
        """flopscope's total MACs (the reference)."""
        return self.profile.total()

    def __getitem__(self, tool: str) -> PeerCount:
        return self.peers[tool]

    def __iter__(self) -> Iterator[str]:
        return iter(self.peers)

    def lines(self) -> list[str]:
        """Every peer's explanation lines."""
        return [line for peer in self.peers.values() for line in peer.lines()]

    def to_table(self, tablefmt: str = "simple") -> str:
        """A table (``tabulate`` format ``tablefmt``): tool, MACs, ratio to flopscope, explanation."""
        rows: list[list[str]] = [["flopscope", f"{self.macs:,}", "1.0000", "reference (mode='real')"]]
        for peer in self.peers.values():
            if peer.error is not None:
                rows.append([peer.tool, "-", "-", f"failed — {peer.error}"])
                continue
            texts = [d.text for d in peer.differences]
            if peer.unexplained:
                texts.append(f"{peer.unexplained:+,} MACs unexplained")
            assert peer.macs is not None and peer.ratio is not None
            rows.append([peer.tool + (" + flopscope plug-ins" if self.plugins else ""), f"{peer.macs:,}",
                         f"{peer.ratio:.4f}", "\n".join(texts) or "agrees exactly"])
        return tabulate(rows, headers=["tool", "MACs", "ratio", "explanation"], tablefmt=tablefmt,
                        colalign=("left", "right", "right", "left"), disable_numparse=True)

    def __repr__(self) -> str:
        peers = ", ".join(f"{p.tool}={p.macs if p.error is None else 'error'}" for p in self.peers.values())
        return f"<Crosscheck flopscope={self.macs:,} MACs, {peers}>"


_KIND_ORDER = {"path": 0, "missing": 1, "under": 2, "over": 3, "extra": 4}


def _ordered(differences: Iterable[Difference]) -> tuple[Difference, ...]:
    """Path differences first, then what the peer misses (largest first), then what it adds."""
    return tuple(sorted(differences, key=lambda d: (_KIND_ORDER.get(d.kind, 5), -abs(d.delta))))


def _role_list(roles: Mapping[str, int]) -> str:
    names = [r for r in ROLE_ORDER if roles.get(r)] + [r for r in roles if r not in ROLE_ORDER and roles[r]]
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return ", ".join(names)


def _sum_roles(records: Iterable[OpRecord]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for record in records:
        for role, macs in record.roles.items():
            out[role] += macs
    return dict(out)


# --------------------------------------------------------------------------------------------------
# crosscheck
# --------------------------------------------------------------------------------------------------
def crosscheck(model: nn.Module, *args: Any, tools: Sequence[str] | None = None, plugins: bool = False,
               forward_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Crosscheck:
    """Count ``model(*args, **kwargs)`` with flopscope and each installed peer; explain the differences.

    flopscope runs with ``mode="real"`` on ``model`` (which it leaves unchanged); each peer runs on its own
    ``copy.deepcopy(model)``, so hooks, buffers and attributes a peer adds never reach ``model``. The grad
    mode and training flags are the caller's (thop always switches to eval mode under ``no_grad``; what
    that changes is reported as a ``"path"`` difference). A peer that raises is reported with its error.

    Args:
        tools: which peers to run (default all of :data:`TOOLS`); a peer that is not installed is skipped.
        plugins: run the peers with flopscope's plug-ins (:func:`flop_counter_mapping`,
            :func:`fvcore_handles` with elementwise counters off, :func:`thop_custom_ops`): they should
            then agree exactly.
        forward_kwargs: keyword arguments for the model whose names clash with ``tools`` / ``plugins``.

    All counts are MACs (FLOPs = 2 x MACs).
    """
    from .api import profile

    kwargs = {**kwargs, **(forward_kwargs or {})}
    prof = profile(model, *args, mode="real", forward_kwargs=kwargs)
    reference = prof.total()
    peers: dict[str, PeerCount] = {}
    for tool in tools if tools is not None else TOOLS:
        if tool not in _RUNNERS:
            raise ValueError(f"unknown tool {tool!r}; choose from {', '.join(TOOLS)}")
        if tool != "FlopCounterMode" and not _installed(tool):
            continue
        try:
            peers[tool] = _RUNNERS[tool](model, args, kwargs, prof, plugins)
        except Exception as error:  # a peer's failure is a result, never a crash
            peers[tool] = PeerCount(tool, None, reference, error=f"{type(error).__name__}: {error}"[:300])
    return Crosscheck(prof, peers, plugins)


def _installed(tool: str) -> bool:
    import importlib.util

    return importlib.util.find_spec({"fvcore": "fvcore", "thop": "thop"}[tool]) is not None


def _copy_for(model: nn.Module, kwargs: Mapping[str, Any]) -> nn.Module:
    """A deep copy of ``model`` that a tool may hook; keyword arguments are bound into its ``forward``
    (fvcore and thop call ``model(*inputs)`` only)."""
    twin = copy.deepcopy(model)
    if kwargs:
        twin.forward = functools.partial(twin.forward, **kwargs)
    return twin


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _inner_profile(model: nn.Module) -> Iterator[list[Profile]]:
    """flopscope counting the very run a peer makes (so a peer that changes the execution path is
    compared with what actually ran); yields a list that holds the profile after the block, or stays
    empty if flopscope could not follow."""
    from .api import profiler

    got: list[Profile] = []
    recorder = profiler(model, mode="real")
    try:
        recorder.__enter__()
    except Exception:
        yield got
        return
    try:
        yield got
    finally:
        try:
            recorder.__exit__(None, None, None)
            got.append(recorder.result)
        except Exception:
            got.clear()


def _path_difference(tool: str, reason: str, inner: Profile | None, prof: Profile) -> list[Difference]:
    if inner is None or inner.total() == prof.total():
        return []
    ours, theirs = prof.by_role(), inner.by_role()
    roles = {r: theirs.get(r, 0) - ours.get(r, 0) for r in {*ours, *theirs} if theirs.get(r, 0) != ours.get(r, 0)}
    return [Difference(tool, "path", inner.total() - prof.total(),
                       f"{reason}, where the model executes {inner.total():,} MACs, not {prof.total():,} "
                       f"({', '.join(f'{r} {v:+,}' for r, v in roles.items())})")]


# ---------------------------------------------------------------------------------------------
# FlopCounterMode
def _run_flop_counter(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
                      plugins: bool) -> PeerCount:
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    twin = copy.deepcopy(model)  # its forward may update buffers (running stats, caches)
    counter = FlopCounterMode(display=False, custom_mapping=flop_counter_mapping() if plugins else None)
    with _quiet(), counter:
        twin(*args, **kwargs)
    flops = {str(op): int(v) for op, v in counter.get_flop_counts().get("Global", {}).items()}
    by_op = {op: v // 2 for op, v in flops.items()}
    known = {str(p) for p in flop_registry} | ({str(p) for p in flop_counter_mapping()} if plugins else set())
    ours = prof.by_op()
    differences = []
    for op in [*ours, *(op for op in by_op if op not in ours)]:
        theirs, mine = by_op.get(op, 0), ours.get(op, 0)
        if theirs == mine:
            continue
        records = [r for r in prof.records if r.op == op]
        if theirs == 0:
            reason = f"no formula for {op}" if op not in known else f"counts 0 for {op}"
            differences.append(Difference("FlopCounterMode", "missing", -mine, reason, _sum_roles(records)))
        elif mine == 0:
            differences.append(Difference("FlopCounterMode", "extra", theirs, f"{op}, which flopscope does not count"))
        else:
            kind = "under" if theirs < mine else "over"
            differences.append(Difference("FlopCounterMode", kind, theirs - mine,
                                          f"its formula for {op} gives {theirs:,}, flopscope's {mine:,}",
                                          _sum_roles(records)))
    return PeerCount("FlopCounterMode", sum(by_op.values()), prof.total(), by_op=by_op,
                     differences=_ordered(differences))


# ---------------------------------------------------------------------------------------------
# fvcore
def _family(op: str) -> str:
    """``"aten.addmm"`` / ``"aten::linear"`` / ``"addmm"`` -> a family name, so counts on TorchScript ops
    (fvcore) and on dispatched ATen ops (flopscope) can be matched."""
    bare = op
    for sep in ("::", "."):
        if sep in bare:
            bare = bare.split(sep, 1)[1]
    bare = bare.split(".", 1)[0]
    if bare in ("mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
                "linear", "matmul", "einsum", "_int_mm"):
        return "matrix products"
    return "convolution" if "conv" in bare else bare


def _run_fvcore(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
                plugins: bool) -> PeerCount:
    """fvcore as asked (plain, or with the plug-ins), then once more with flopscope's formulas as handles
    (each op's MACs per role), on the same TorchScript trace: that second count is what flopscope counts
    on the path the trace took, and the per-op difference between the two is fvcore's shortfall."""
    from fvcore.nn import FlopCountAnalysis

    twin = _copy_for(model, kwargs)
    with _quiet():
        analysis = fvcore_analysis(twin, args) if plugins else FlopCountAnalysis(twin, args)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        total = int(analysis.total())
        by_op = {op: int(v) for op, v in analysis.by_operator().items()}
        unsupported = {str(op): int(n) for op, n in analysis.unsupported_ops().items()}
        ours = fvcore_analysis(twin, args, roles=True)
        ours.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        by_role_op = {op: int(v) for op, v in ours.by_operator().items()}
    traced = sum(by_role_op.values())
    differences = []
    if traced != prof.total():
        differences.append(Difference("fvcore", "path", traced - prof.total(),
                                      f"its TorchScript trace runs other kernels: flopscope's formulas give "
                                      f"{traced:,} MACs on the traced graph, {prof.total():,} on the profiled run"))
    mine: dict[str, Counter[str]] = {}  # family -> {role: MACs} ("" where the formula has no role split)
    names: dict[str, list[str]] = {}  # family -> TorchScript op names
    for key, macs in by_role_op.items():
        op, _, role = key.partition("|")
        mine.setdefault(_family(op), Counter())[role] += macs
        names.setdefault(_family(op), []).append(f"aten::{op}")
    theirs: Counter[str] = Counter()
    for op, macs in by_op.items():
        theirs[_family(op)] += macs
        names.setdefault(_family(op), []).append(f"aten::{op}")
    for family in [*mine, *(f for f in theirs if f not in mine)]:
        counted = sum(mine.get(family, {}).values())
        delta = theirs[family] - counted
        if delta == 0:
            continue
        parts = dict(mine.get(family, {}))
        if "" in parts:  # GEMMs / convolutions: their roles are those of flopscope's records of that family
            roles = _sum_roles(r for r in prof.records if _family(r.op) == family)
            parts = roles if sum(roles.values()) == counted else {}
        ops = sorted(set(names[family]))
        missed = [op for op in ops if op in unsupported]
        if counted == 0:
            differences.append(Difference("fvcore", "extra", delta,
                                          f"{', '.join(ops)}: not multiply-accumulates (elementwise work)"))
        elif theirs[family] == 0:
            reason = f"{', '.join(missed)} unsupported" if missed else f"it counts none of {', '.join(ops)}"
            differences.append(Difference("fvcore", "missing", delta, reason, parts))
        else:
            reason = f"its handles give {theirs[family]:,} MACs of {family}, flopscope's formulas {counted:,}"
            if missed:
                reason += f" ({', '.join(missed)} unsupported)"
            differences.append(Difference("fvcore", "under" if delta < 0 else "over", delta, reason, parts))
    return PeerCount("fvcore", total, prof.total(), by_op=by_op, differences=_ordered(differences),
                     unsupported=unsupported)


# ---------------------------------------------------------------------------------------------
# thop
def _thop_rules(custom_ops: Mapping[type, Callable[..., Any]]) -> Callable[[type], Callable[..., Any] | None]:
    """thop's rule resolution (``thop.profile._resolve_rule``): the first class of the MRO with a rule,
    ``custom_ops`` first at each level; ``None`` where it has none."""
    from thop.profile import register_hooks

    def rule(module_type: type) -> Callable[..., Any] | None:
        for t in module_type.__mro__:
            if t in custom_ops:
                return custom_ops[t]
            if t in register_hooks:
                return register_hooks[t]
        return None

    return rule


def _layer_tree(tree: Mapping[str, Any], prefix: str, modules: Mapping[str, nn.Module], seen: set[int],
                own: dict[str, float]) -> float:
    """Own ops per module path from thop's ``ret_layer_info`` tree (inclusive counts per child)."""
    children = 0.0
    for name, (ops, _, sub) in tree.items():
        path = f"{prefix}{name}"
        inner = _layer_tree(sub, f"{path}.", modules, seen, own)
        module = modules.get(path)
        if module is not None and id(module) in seen:
            continue
        if module is not None:
            seen.add(id(module))
        own[path] = float(ops) - inner
        children += float(ops)
    return children


def _run_thop(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
              plugins: bool) -> PeerCount:
    import thop
    from thop.vision.basic_hooks import zero_ops

    custom = thop_custom_ops() if plugins else {}
    twin = _copy_for(model, kwargs)
    with _quiet(), _inner_profile(twin) as inner:
        total_f, _, tree = thop.profile(twin, args, custom_ops=dict(custom), verbose=False, ret_layer_info=True)
    seen = inner[0] if inner else None
    total = round(total_f)
    modules = dict(twin.named_modules(remove_duplicate=False))
    rule_of = _thop_rules(custom)

    def ruled(path: str) -> bool:
        rule = rule_of(type(modules[path])) if path in modules else None
        return rule is not None and rule is not zero_ops

    own: dict[str, float] = {}
    below_root = _layer_tree(tree, "", modules, set(), own)
    if ruled(""):
        own[""] = total_f - below_root
        functional = 0
    else:
        functional = round(total_f - below_root)
    by_type: Counter[str] = Counter()
    for path, ops in own.items():
        if path in modules and round(ops):
            by_type[type(modules[path]).__name__] += round(ops)
    if functional:
        by_type["(functional)"] += functional

    differences = _path_difference("thop", "it runs the model in eval mode under no_grad", seen, prof)
    records = (seen or prof).records
    # which mechanism of thop should count each record: the innermost module with a rule, or its function hooks
    under: dict[str, list[OpRecord]] = {}
    loose: list[OpRecord] = []
    for record in records:
        owner = next((p for p in reversed(record.module_stack) if ruled(p)), None)
        if owner is None:
            loose.append(record)
        else:
            under.setdefault(type(modules[owner]).__name__, []).append(record)
    for type_name in sorted({*under, *(t for t in by_type if t != "(functional)")}):
        concerned = under.get(type_name, [])
        mine = sum(r.multiplies for r in concerned)
        theirs = by_type.get(type_name, 0)
        if theirs == mine:
            continue
        if mine == 0:
            differences.append(Difference("thop", "extra", theirs - mine,
                                          f"its {type_name} rule counts elementwise work (not MACs)"))
        elif theirs == 0:
            differences.append(Difference("thop", "missing", theirs - mine, f"its {type_name} rule counts 0",
                                          _sum_roles(concerned)))
        elif theirs > mine:
            differences.append(Difference("thop", "extra", theirs - mine,
                                          f"its {type_name} rule counts elementwise work on top of the "
                                          f"{mine:,} MACs"))
        else:
            differences.append(Difference("thop", "under", theirs - mine, f"its {type_name} rule counts {theirs:,}",
                                          _sum_roles(concerned)))
    missing = sum(r.multiplies for r in loose) - functional
    if missing > 0:
        groups: dict[tuple[str, str], list[OpRecord]] = {}
        for record in loose:
            path = record.module
            groups.setdefault((type(modules[path]).__name__ if path in modules else "?", record.op), []).append(record)
        found = _subset_summing({key: sum(r.multiplies for r in rs) for key, rs in groups.items()}, missing)
        by_owner: dict[str, list[tuple[str, str]]] = {}
        for key in found or ():
            by_owner.setdefault(key[0], []).append(key)
        for type_name, keys in by_owner.items():
            concerned = [r for key in keys for r in groups[key]]
            op_names = ", ".join(sorted({op for _, op in keys}))
            differences.append(Difference("thop", "missing", -sum(r.multiplies for r in concerned),
                                          f"no rule for {type_name} ({op_names})", _sum_roles(concerned)))
    return PeerCount("thop", total, prof.total(), by_type=dict(by_type), differences=_ordered(differences))


def _subset_summing(amounts: Mapping[Any, int], target: int, max_size: int = 4) -> list[Any] | None:
    """The smallest set of keys whose amounts sum to ``target`` exactly (up to ``max_size`` keys, or all)."""
    items = sorted(((k, v) for k, v in amounts.items() if 0 < v <= target), key=lambda kv: -kv[1])[:24]
    for size in range(1, min(max_size, len(items)) + 1):
        for combo in itertools.combinations(items, size):
            if sum(v for _, v in combo) == target:
                return [k for k, _ in combo]
    if sum(v for _, v in items) == target:
        return [k for k, _ in items]
    return None


_RUNNERS: dict[str, Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Profile, bool], PeerCount]] = {
    "FlopCounterMode": _run_flop_counter,
    "fvcore": _run_fvcore,
    "thop": _run_thop,
}


# --------------------------------------------------------------------------------------------------
# plug-ins
# --------------------------------------------------------------------------------------------------
def _packet(name: str) -> Any:
    """``"aten::mm"`` -> ``torch.ops.aten.mm`` (``None`` if that library is not loaded)."""
    namespace, _, op = name.partition("::")
    try:
        return getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None


def _plain(x: Any) -> Any:
    """``torch.Size`` -> tuple of ints, recursively through lists and tuples of shapes."""
    if isinstance(x, torch.Size):
        return tuple(int(s) for s in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    return x


def _first_shape(out: Any) -> Shape | None:
    if isinstance(out, torch.Size):
        return tuple(int(s) for s in out)
    if isinstance(out, (list, tuple)):
        for item in out:
            shape = _first_shape(item)
            if shape is not None:
                return shape
    return None


def _flop_counter_formula(fn: MacFormula) -> Callable[..., int]:
    """A flopscope formula (MACs) in ``FlopCounterMode``'s convention: shapes in, FLOPs (2 x MACs) out."""

    @functools.wraps(fn)
    def flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return 2 * total_of(fn(*_plain(args), out_shape=_first_shape(out_shape), **_plain(kwargs)))

    return flops


def flop_counter_mapping(registry: FormulaRegistry | None = None) -> dict[Any, Callable[..., int]]:
    """``custom_mapping`` for ``torch.utils.flop_counter.FlopCounterMode``: every op of flopscope's
    registry that PyTorch's ``flop_registry`` lacks (CPU SDPA ``_scaled_dot_product_flash_attention_for_cpu``,
    the fused ``_native_multi_head_attention`` / ``_transformer_encoder_layer_fwd`` fast paths, the CPU LSTM
    kernel ``mkldnn_rnn_layer``, ``_grouped_mm``, ...), keyed by op packet.

    Each function follows FlopCounterMode's convention (tensors replaced by shapes, ``out_shape=``) and
    returns **FLOPs** = 2 x flopscope's MACs::

        with FlopCounterMode(custom_mapping=flopscope.peers.flop_counter_mapping()) as counter:
            model(x)
    """
    from torch.utils.flop_counter import flop_registry

    registry = registry if registry is not None else REGISTRY
    mapping: dict[Any, Callable[..., int]] = {}
    for name in registry.ops():
        packet = _packet(name)
        if packet is None or packet in flop_registry:
            continue
        fn = registry.get(packet)
        if fn is not None:
            mapping[packet] = _flop_counter_formula(fn)
    return mapping


# ---------------------------------------------------------------------------------------------
# fvcore
def _jit_value(value: Any) -> Any:
    """A TorchScript value as a flopscope formula wants it: a tensor's shape, a list of shapes, or the
    constant (``None`` if it is neither)."""
    kind = value.type().kind()
    if kind == "TensorType":
        if not value.isCompleteTensor():
            raise ValueError(f"fvcore traced a tensor without a complete shape: {value}")
        return tuple(int(s) for s in value.type().sizes())
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [_jit_value(v) for v in node.inputs()]
    try:
        return value.toIValue()
    except Exception:
        return None


FvcoreHandle = Callable[[list[Any], list[Any]], Any]


def _fvcore_handle(fn: MacFormula, select: Callable[[list[Any]], list[Any]] | None = None,
                   name: str | None = None) -> FvcoreHandle:
    """A flopscope formula as an fvcore op handle: ``(inputs, outputs)`` JIT values in, MACs out.
    ``select`` picks and orders the formula's arguments from the op's (converted) inputs. With ``name``
    the handle returns ``Counter({"name|role": MACs})`` (role ``""`` for a formula without parts)."""

    def handle(inputs: list[Any], outputs: list[Any]) -> Any:
        values = [_jit_value(v) for v in inputs]
        out = _jit_value(outputs[0]) if outputs and outputs[0].type().kind() == "TensorType" else None
        keywords = _keyword_only(outputs[0].node(), len(values)) if outputs else {}
        positional = [v for i, v in enumerate(values) if i not in keywords]
        named = {keywords[i]: v for i, v in enumerate(values) if i in keywords}
        macs = fn(*(select(positional) if select else positional), out_shape=out, **named)
        if name is None:
            return total_of(macs)
        parts = {"": macs} if isinstance(macs, int) else macs
        return Counter({f"{name}|{role}": v for role, v in parts.items()})

    return handle


def _keyword_only(node: Any, count: int) -> dict[int, str]:
    """Positions of the keyword-only arguments of a TorchScript op (``beta``, ``alpha`` of ``aten::addmm``):
    at the ATen level they are passed by keyword, which is how flopscope's formulas take them."""
    try:
        schema = torch._C.parse_schema(node.schema())
    except Exception:
        return {}
    arguments = list(schema.arguments)
    if len(arguments) != count:
        return {}
    return {i: a.name for i, a in enumerate(arguments) if a.kwarg_only}


def _named(handle: FvcoreHandle, name: str) -> FvcoreHandle:
    """One of fvcore's own handles, its count keyed ``"name|"``."""

    def named(inputs: list[Any], outputs: list[Any]) -> Any:
        count = handle(inputs, outputs)
        return Counter({f"{name}|": sum(count.values()) if isinstance(count, Mapping) else count})

    return named


def _rnn_arguments(values: list[Any]) -> list[Any]:
    """``aten::lstm`` / ``gru`` / ``rnn_*`` (``.input`` and ``.data`` overloads) -> ``(x, weights)``:
    the flat weights are the last list among the arguments after the input."""
    weights = [v for v in values[1:4] if isinstance(v, list)][-1]
    return [values[0], weights]


def _rnn_cell_arguments(values: list[Any]) -> list[Any]:
    """``aten::lstm_cell(input, hx, w_ih, w_hh, ...)`` (and gru / rnn cells) -> ``(x, w_ih, w_hh)``."""
    return [values[0], values[2], values[3]]


def fvcore_handles(registry: FormulaRegistry | None = None) -> dict[str, FvcoreHandle]:
    """Op handles for fvcore's ``FlopCountAnalysis.set_op_handle(**handles)``, returning **MACs** (fvcore's
    "flop" is one fused multiply-add): every op of flopscope's registry that fvcore does not handle
    (``aten::_native_multi_head_attention``, ``aten::_transformer_encoder_layer_fwd``, ``aten::baddbmm``,
    ``aten::_grouped_mm``, ...), plus the ops TorchScript records above the kernels flopscope counts:
    ``aten::scaled_dot_product_attention``, ``aten::lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` and their
    cells. Keys are TorchScript names (``"aten::lstm"``).
    """
    from fvcore.nn.flop_count import _DEFAULT_SUPPORTED_OPS

    return {name: handle for name, handle in _handles(registry, roles=False).items()
            if name not in _DEFAULT_SUPPORTED_OPS}


def _handles(registry: FormulaRegistry | None, roles: bool) -> dict[str, FvcoreHandle]:
    registry = registry if registry is not None else REGISTRY
    handles: dict[str, FvcoreHandle] = {}
    composite: dict[str, tuple[Any, Callable[[list[Any]], list[Any]] | None]] = {
        "aten::scaled_dot_product_attention": (aten._scaled_dot_product_attention_math, None),
        **dict.fromkeys(["aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"],
                        (aten._cudnn_rnn, _rnn_arguments)),
        **dict.fromkeys(["aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"],
                        (aten.mkldnn_rnn_layer, _rnn_cell_arguments)),
    }
    for name in registry.ops():
        fn = registry.get(_packet(name) or name)
        if fn is not None:
            handles[name] = _fvcore_handle(fn, None, name.partition("::")[2] if roles else None)
    for name, (kernel, select) in composite.items():
        fn = registry.get(kernel)
        if fn is not None:
            handles[name] = _fvcore_handle(fn, select, name.partition("::")[2] if roles else None)
    return handles


def fvcore_analysis(model: nn.Module, inputs: Any, elementwise: bool = False, roles: bool = False) -> Any:
    """fvcore's ``FlopCountAnalysis(model, inputs)`` with :func:`fvcore_handles` set. Counts are MACs.

    ``elementwise=False`` (default): fvcore's norm / upsample / pooling counters are switched off, so it
    counts multiply-accumulates only, as flopscope's ``total()`` does. ``roles=True``: every op flopscope
    has a formula for is counted by that formula (fvcore's own GEMM and convolution handles included),
    and ``by_operator()`` keys are ``"op|role"`` (``"scaled_dot_product_attention|attn_scores"``; role ``""``
    for a plain GEMM or convolution, whose role only flopscope's dataflow knows).
    """
    from fvcore.nn import FlopCountAnalysis
    from fvcore.nn.flop_count import _DEFAULT_SUPPORTED_OPS

    analysis = FlopCountAnalysis(model, inputs)
    analysis.clear_op_handles()  # setting a handle to None does not remove a default one
    ours = _handles(None, roles)
    for name, handle in _DEFAULT_SUPPORTED_OPS.items():
        # fvcore's elementwise counters are the handles made by norm_flop_counter / elementwise_flop_counter,
        # and batchnorm_flop_jit
        qualname = getattr(handle, "__qualname__", "")
        if not elementwise and ("norm" in qualname or "elementwise" in qualname):
            analysis.set_op_handle(name, None)
        elif not roles or name not in ours:
            analysis.set_op_handle(name, _named(handle, name.partition("::")[2]) if roles else handle)
    analysis.set_op_handle(**(ours if roles else fvcore_handles()))
    return analysis


# ---------------------------------------------------------------------------------------------
# thop
ThopRule = Callable[[Any, tuple[Any, ...], Any], None]  # (module, inputs, output), adds to module.total_ops


def _shape(t: torch.Tensor) -> Shape:
    return tuple(int(s) for s in t.shape)


def _thop_conv1d(registry: FormulaRegistry) -> ThopRule:
    addmm = registry.get(aten.addmm)
    assert addmm is not None

    def count_conv1d(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """transformers' ``Conv1D``: ``addmm(bias, x.view(-1, nx), weight[nx, nf])``."""
        inp = x[0]
        rows = math.prod(int(s) for s in inp.shape[:-1])
        m.total_ops += total_of(addmm(_shape(m.bias), (rows, int(inp.shape[-1])), _shape(m.weight)))

    return count_conv1d


def _thop_mha(registry: FormulaRegistry) -> ThopRule:
    mm, sdpa = registry.get(aten.mm), registry.get(aten._scaled_dot_product_attention_math)
    assert mm is not None and sdpa is not None

    def count_mha(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """``nn.MultiheadAttention``: the Q/K/V/out projections and the attention core, MACs only."""
        query, key = x[0], x[1] if len(x) > 1 else x[0]
        E, h = int(m.embed_dim), int(m.num_heads)
        first = bool(getattr(m, "batch_first", False))
        if query.dim() == 3:
            B, n_q, n_k = query.shape[0 if first else 1], query.shape[1 if first else 0], key.shape[1 if first else 0]
        else:
            B, n_q, n_k = 1, query.shape[0], key.shape[0]
        B, n_q, n_k = int(B), int(n_q), int(n_k)
        kdim, vdim = int(m.kdim), int(m.vdim)
        attended = n_k + (m.bias_k is not None) + int(m.add_zero_attn)
        macs = 2 * total_of(mm((B * n_q, E), (E, E)))  # q and out projections
        macs += total_of(mm((B * n_k, kdim), (kdim, E))) + total_of(mm((B * n_k, vdim), (vdim, E)))
        macs += total_of(sdpa((B, h, n_q, E // h), (B, h, attended, E // h), (B, h, attended, E // h)))
        m.total_ops += macs

    return count_mha


def _thop_rnn(registry: FormulaRegistry) -> ThopRule:
    rnn = registry.get(aten._cudnn_rnn)
    assert rnn is not None

    def count_rnn(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """``nn.LSTM`` / ``GRU`` / ``RNN``: every 2-D weight of every layer and direction once per token."""
        inp = x[0]
        data = inp.data if isinstance(inp, nn.utils.rnn.PackedSequence) else inp
        m.total_ops += total_of(rnn(_shape(data), [_shape(w) for w in m._flat_weights]))

    return count_rnn


def _thop_rnn_cell(registry: FormulaRegistry) -> ThopRule:
    layer = registry.get(aten.mkldnn_rnn_layer)
    assert layer is not None

    def count_rnn_cell(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """``nn.LSTMCell`` / ``GRUCell`` / ``RNNCell``: ``W_ih x`` and ``W_hh h`` once per batch row."""
        m.total_ops += total_of(layer(_shape(x[0]), _shape(m.weight_ih), _shape(m.weight_hh)))

    return count_rnn_cell


def thop_custom_ops(elementwise: bool = False,
                    registry: FormulaRegistry | None = None) -> dict[type, Callable[[nn.Module, tuple[Any, ...], Any],
                                                                                 None]]:
    """``custom_ops`` for ``thop.profile(model, inputs, custom_ops=...)``, from flopscope's formulas.

    - transformers' ``Conv1D`` (GPT-2 and relatives: ``addmm``, which thop has no rule for; it counts 0);
    - ``nn.MultiheadAttention``, ``nn.LSTM`` / ``GRU`` / ``RNN`` and their cells: MACs only (thop's own rules
      add softmax, gate and bias operations);
    - with ``elementwise=False`` (default), thop's norm / softmax / pooling / upsampling / PReLU rules are
      replaced by its ``zero_ops``, so thop counts multiply-accumulates only, as flopscope's ``total()``.

    Each rule adds **MACs** to ``module.total_ops``, as thop's own rules do.
    """
    from thop.profile import register_hooks
    from thop.vision import basic_hooks as basic

    registry = registry if registry is not None else REGISTRY
    keep = {basic.count_convNd, basic.count_convtNd, basic.count_linear, basic.count_bilinear,
            basic.count_embedding, basic.zero_ops}
    rnn_rules = {"count_lstm", "count_gru", "count_rnn"}
    cell_rules = {"count_lstm_cell", "count_gru_cell", "count_rnn_cell"}
    rules: dict[type, ThopRule] = {}
    for module_type, rule in register_hooks.items():
        name = getattr(rule, "__name__", "")
        if name in rnn_rules:
            rules[module_type] = _thop_rnn(registry)
        elif name in cell_rules:
            rules[module_type] = _thop_rnn_cell(registry)
        elif rule is basic.count_multihead_attention:
            rules[module_type] = _thop_mha(registry)
        elif not elementwise and rule not in keep:
            rules[module_type] = basic.zero_ops
    rules.setdefault(nn.MultiheadAttention, _thop_mha(registry))  # thop registers it only on torch >= 2.0
    with contextlib.suppress(ImportError):
        from transformers.pytorch_utils import Conv1D

        rules[Conv1D] = _thop_conv1d(registry)
    return rules
