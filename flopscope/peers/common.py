"""The cross-check itself: its results (:class:`Difference`, :class:`PeerCount`,
:class:`Crosscheck`), :func:`crosscheck`, the table of peer tools and the helpers their
runners share.

Each peer's runner lives in its own module beside its plug-in (:mod:`.flop_counter`,
:mod:`.fvcore`, :mod:`.thop`) and is imported only when :func:`crosscheck` runs it; the
peers themselves (fvcore, thop) are imported inside those runners, never at import time.

Units: MACs everywhere (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from tabulate import tabulate
from torch import nn

from ..api import profile
from ..capture import CapturePlan, Session
from ..capture.compiled import eager_module
from ..errors import ConfigurationError, FlopscopeError, RegistryError
from ..formulas.registry import FormulaRegistry, MacFormula
from ..profile import OpRecord, Profile
from ..role import ROLE_ORDER
from .isolation import isolated, track_copy

Runner = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Profile, bool], "PeerCount"]
"""A peer's runner: ``(model, args, kwargs, flopscope's profile, plugins) ->
PeerCount``."""


@dataclass(frozen=True)
class _Tool:
    name: str  # as results and ``tools=`` name it
    module: str  # the module of this package holding its runner and its plug-in
    runner: str  # the runner's name in that module
    package: str | None  # the third-party package it needs (None: part of torch, always there)
    # namespaces beyond torch / F / Tensor it patches (checked and restored after)
    patches: tuple[str, ...] = ()
    # what to import before the run's snapshot (the tool's own import changes)
    imports: tuple[str, ...] = ()


_TOOL_TABLE: dict[str, _Tool] = {tool.name: tool for tool in (
    _Tool("FlopCounterMode", "flop_counter", "_run_flop_counter", None),
    _Tool("fvcore", "fvcore", "_run_fvcore", "fvcore", imports=("fvcore.nn",)),
    _Tool("thop", "thop", "_run_thop", "thop"),
    _Tool("deepspeed", "patching", "_run_deepspeed", "deepspeed", patches=("einops",),
          imports=("deepspeed.profiling.flops_profiler.profiler",)),
    _Tool("calflops", "patching", "_run_calflops", "calflops",
          imports=("calflops.calculate_pipline",)),
    _Tool("torchprofile", "torchprofile", "_run_torchprofile", "torchprofile"),
)}

TOOLS: tuple[str, ...] = tuple(_TOOL_TABLE)
"""The peers :func:`crosscheck` knows, in the order it runs them."""

_PLUGIN_TOOLS = frozenset({"FlopCounterMode", "fvcore", "thop"})
"""The peers with flopscope plug-ins (``plugins=True``); the others run as they are."""


# --------------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """One explained part of a peer's difference from flopscope.

    ``delta``: the peer's MACs minus flopscope's on this part (negative: the peer misses
    work). ``roles``: flopscope's MACs per role on the work concerned (for
    ``kind="missing"``, exactly what the peer misses, summing to ``-delta``). ``kind``:
    ``"missing"`` (the peer counts 0 of that work), ``"under"`` / ``"over"`` (it counts
    that work, but less / more), ``"extra"`` (it counts work that is not
    multiply-accumulates: norms, softmax, pooling), ``"path"`` (the peer runs the model
    differently, so different kernels execute). ``modules``: the module paths where the
    evidence shows this part (thop: the modules where its count and flopscope's differ),
    in execution order; empty where the evidence is per op (``FlopCounterMode``,
    fvcore).
    """

    tool: str
    kind: str
    delta: int
    reason: str
    roles: Mapping[str, int] = field(default_factory=dict)
    modules: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The explanation without the tool name."""
        where = f", in {_module_list(self.modules)}" if self.modules else ""
        return self._summary() + where

    def _summary(self) -> str:
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
        """``"FlopCounterMode: attn_scores and attn_weighted_sum missing (... MACs) —
        ..."``."""
        return f"{self.tool}: {self.text}"


@dataclass(frozen=True)
class PeerCount:
    """What one peer reported, in MACs, and its difference from flopscope explained.

    ``by_op``: MACs per op as the tool names them (``FlopCounterMode``: ``"aten.mm"``;
    fvcore: ``"addmm"``), ``None`` where the tool has no per-op output (thop).
    ``by_type``: thop's MACs per module type (the total of its rule over the modules of
    that type; ``"(functional)"`` for what its function hooks counted). ``by_module``:
    thop's MACs per module path (its rule there, plus what its function hooks counted in
    that module's own code, where that could be attributed). ``error``: the exception
    the tool raised (then ``macs`` is ``None``).
    """

    tool: str
    macs: int | None
    reference: int  # flopscope's total() (MACs)
    by_op: Mapping[str, int] | None = None
    by_type: Mapping[str, int] | None = None
    error: str | None = None
    differences: tuple[Difference, ...] = ()
    unsupported: Mapping[str, int] | None = None  # fvcore's unsupported_ops(): {op: calls}
    by_module: Mapping[str, int] | None = None
    # what the tool left behind (patched functions, hooks), undone before the next
    leaks: tuple[str, ...] = ()
    # how the peer was run when not as given ("counted with use_cache=False: ..."), and
    # why
    note: str = ""

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
        """MACs of the difference that no :class:`Difference` explains (0 when fully
        explained)."""
        if self.macs is None:
            return 0
        return self.macs - self.reference - sum(d.delta for d in self.differences)

    @property
    def explained(self) -> bool:
        """The peer ran, and every MAC of its difference from flopscope is explained."""
        return self.error is None and self.macs is not None and self.unexplained == 0

    def lines(self) -> list[str]:
        """One line per explained difference, then the unexplained rest (if any)."""
        leaks = [f"{self.tool}: {leak}" for leak in self.leaks]
        if self.error is not None:
            return [f"{self.tool}: failed — {self.error}", *leaks]
        out = [d.line for d in self.differences]
        if self.unexplained:
            out.append(f"{self.tool}: {self.unexplained:+,} MACs unexplained")
        if not out:
            out.append(f"{self.tool}: agrees exactly")
        return out + ([f"{self.tool}: {self.note}"] if self.note else []) + leaks


@dataclass(frozen=True)
class Crosscheck:
    """flopscope's count and every peer's, per tool (``crosscheck["thop"]``), all in
    MACs."""

    profile: Profile
    peers: Mapping[str, PeerCount]
    plugins: bool = False  # the peers ran with flopscope's plug-ins

    @property
    def macs(self) -> int:
        """flopscope's total MACs (the reference)."""
        return self.profile.total()

    @property
    def all_explained(self) -> bool:
        """Every peer ran and every difference is explained."""
        return all(peer.explained for peer in self.peers.values())

    @property
    def ran(self) -> tuple[str, ...]:
        """The peers that counted (did not fail), in the order they ran."""
        return tuple(name for name, peer in self.peers.items() if peer.error is None and peer.macs is not None)

    @property
    def ran_explained(self) -> bool:
        """At least one peer counted, and every difference of those that did is
        explained (what ``flopscope crosscheck`` exits 0 on: a peer that fails is a
        finding about that peer, reported with its reason)."""
        return bool(self.ran) and all(self.peers[name].explained for name in self.ran)

    def __getitem__(self, tool: str) -> PeerCount:
        return self.peers[tool]

    def __iter__(self) -> Iterator[str]:
        return iter(self.peers)

    def lines(self) -> list[str]:
        """Every peer's explanation lines."""
        return [line for peer in self.peers.values() for line in peer.lines()]

    def to_table(self, tablefmt: str = "simple") -> str:
        """A table (``tabulate`` format ``tablefmt``): tool, MACs, ratio to flopscope,
        explanation."""
        rows: list[list[str]] = [["flopscope", f"{self.macs:,}", "1.0000",
                                  "reference (mode='real')"]]
        for peer in self.peers.values():
            if peer.error is not None or peer.macs is None:
                rows.append([peer.tool, "-", "-",
                             "\n".join([f"failed — {peer.error}", *peer.leaks])])
                continue
            texts = [d.text for d in peer.differences]
            if peer.unexplained:
                texts.append(f"{peer.unexplained:+,} MACs unexplained")
            ratio = f"{peer.ratio:.4f}" if peer.ratio is not None else "-"
            plugged = self.plugins and peer.tool in _PLUGIN_TOOLS
            rows.append([peer.tool + (" + flopscope plug-ins" if plugged else ""), f"{peer.macs:,}",
                         ratio,
                         "\n".join([*(texts or ["agrees exactly"]),
                                    *([peer.note] if peer.note else []),
                                    *peer.leaks])])
        return tabulate(rows, headers=["tool", "MACs", "ratio", "explanation"], tablefmt=tablefmt,
                        colalign=("left", "right", "right", "left"), disable_numparse=True)

    def __repr__(self) -> str:
        peers = ", ".join(f"{p.tool}={p.macs if p.error is None else 'error'}" for p in self.peers.values())
        return f"<Crosscheck flopscope={self.macs:,} MACs, {peers}>"


_KIND_ORDER = {"path": 0, "missing": 1, "under": 2, "over": 3, "extra": 4}


def ordered(differences: Iterable[Difference]) -> tuple[Difference, ...]:
    """Path differences first, then what the peer misses (largest first), then what it
    adds."""
    return tuple(sorted(differences, key=lambda d: (_KIND_ORDER.get(d.kind, 5), -abs(d.delta))))


def _role_list(roles: Mapping[str, int]) -> str:
    names = [r for r in ROLE_ORDER if roles.get(r)] + [r for r in roles if r not in ROLE_ORDER and roles[r]]
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return ", ".join(names)


def _module_list(paths: Sequence[str], shown: int = 3) -> str:
    names = [path or "(root)" for path in paths]
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def sum_roles(records: Iterable[OpRecord]) -> dict[str, int]:
    """flopscope's MACs per role over ``records``."""
    out: Counter[str] = Counter()
    for record in records:
        for role, macs in record.roles.items():
            out[role] += macs
    return dict(out)


# --------------------------------------------------------------------------------------------------
# crosscheck
# --------------------------------------------------------------------------------------------------
def crosscheck(model: nn.Module, *args: Any, tools: Sequence[str] | None = None,
               plugins: bool = False,
               forward_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Crosscheck:
    """Count ``model(*args, **kwargs)`` with flopscope and each installed peer; explain
    the differences.

    flopscope runs with ``mode="real"`` on ``model`` (which it leaves unchanged); each
    peer runs on its own ``copy.deepcopy(model)``, so hooks, buffers and attributes a
    peer adds never reach ``model``. The grad mode and training flags are the caller's
    (thop always switches to eval mode under ``no_grad``; what that changes is reported
    as a ``"path"`` difference). A peer that raises is reported with its error, said
    plainly where it is known (:func:`failure`: a TorchScript trace given a value it
    cannot take). When the model's forward takes ``use_cache`` (Hugging Face models) and
    the call does not set it, a peer that raises runs once more with ``use_cache=False``
    (fvcore's trace cannot return a ``DynamicCache``), compared with flopscope's count
    of that call; :attr:`PeerCount.note` says so, and why. After each peer, what it left
    behind (functions of ``torch``, ``torch.nn.functional``, ``torch.Tensor`` still
    patched, global module hooks, hooks on its copy: DeepSpeed and calflops after a
    forward that raises) is undone before the next runs and listed in
    :attr:`PeerCount.leaks` (:mod:`.isolation`).

    Peers (:data:`TOOLS`, each in its own unit converted to MACs): PyTorch's
    ``FlopCounterMode`` (FLOPs, halved), fvcore (MACs), thop (MACs and elementwise
    operations), DeepSpeed's flops profiler and calflops (their MACs:
    ``get_total_macs()``), torchprofile (MACs).

    Args:
        tools: which peers to run (default all of :data:`TOOLS`); a peer that is not
            installed is skipped. An unknown name is a
            :class:`~flopscope.errors.ConfigurationError`.
        plugins: run the peers with flopscope's plug-ins (:func:`flop_counter_mapping`,
            :func:`fvcore_handles` with elementwise counters off,
            :func:`thop_custom_ops`): they should then agree exactly. DeepSpeed,
            calflops and torchprofile have none and run as they are.
        forward_kwargs: keyword arguments for the model whose names clash with ``tools``
            / ``plugins``.

    All counts are MACs (FLOPs = 2 x MACs).
    """
    chosen = [tools] if isinstance(tools, str) else list(tools if tools is not None else TOOLS)
    for name in chosen:
        if name not in _TOOL_TABLE:
            raise ConfigurationError(f"unknown tool {name!r}; choose from {', '.join(TOOLS)}")
    kwargs = {**kwargs, **(forward_kwargs or {})}
    prof = profile(model, *args, mode="real", forward_kwargs=kwargs)
    # the peers run on (copies of) the eager module: a compiled call under their hooks
    # and modes would leave the caller's compiled model uncompiled
    # (flopscope.capture.compiled), and an ExportedProgram is no module
    model, _ = eager_module(model)
    peers: dict[str, PeerCount] = {}
    cacheless = _without_cache(model, kwargs)
    # flopscope's count of the call without the cache, made once if a peer needs it
    uncached: Profile | None = None
    for name in chosen:
        tool = _TOOL_TABLE[name]
        if tool.package is not None and importlib.util.find_spec(tool.package) is None:
            continue
        peer, why = _run_peer(tool, model, args, kwargs, prof, plugins)
        if peer.error is not None and cacheless is not None:
            # a peer that cannot take the model's cache (fvcore's TorchScript trace of a
            # DynamicCache output) counts the same call without one, compared with
            # flopscope's count of that call
            if uncached is None:
                uncached = profile(model, *args, mode="real", forward_kwargs=cacheless)
            retried, _ = _run_peer(tool, model, args, cacheless, uncached, plugins)
            if retried.error is None:
                path = path_difference(name, "run with use_cache=False", uncached, prof)
                peer = dataclasses.replace(retried, reference=prof.total(),
                                           differences=ordered([*path, *retried.differences]),
                                           note="counted with use_cache=False: with the model's "
                                                f"cache, {why}",
                                           leaks=(*(f"with the cache, {leak}" for leak in peer.leaks),
                                                  *retried.leaks))
        peers[name] = peer
    return Crosscheck(prof, peers, plugins)


def _run_peer(tool: _Tool, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              prof: Profile,
              plugins: bool) -> tuple[PeerCount, str]:
    """One peer's count of ``model(*args, **kwargs)`` against ``prof``, isolated
    (:mod:`.isolation`), and why it failed (``""`` when it counted): a peer that
    raises gives a :class:`PeerCount` whose ``error`` says why and the way out
    (:func:`failure`)."""
    why = ""
    run = _runner(tool)
    # before the snapshot
    modules = {space: _imported(space) for space in (*tool.imports, *tool.patches)}
    extra = [modules[space] for space in tool.patches if modules[space] is not None]
    with isolated(model, extra) as isolation:
        try:
            peer = run(model, args, kwargs, prof, plugins)
        except Exception as error:
            # Catching everything is deliberate: a third-party counter failing on the
            # user's model (fvcore's TorchScript tracer, a thop rule, a FlopCounterMode
            # formula, any of them with flopscope's plug-ins) is a finding reported
            # beside the others, never a crash of the whole cross-check.
            why, fix = failure(error)
            peer = PeerCount(tool.name, None, prof.total(), error=f"{why}; {fix}" if fix else why)
    return (dataclasses.replace(peer, leaks=tuple(isolation.leaks)) if isolation.leaks else peer), why


def _without_cache(model: nn.Module, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` with ``use_cache=False`` when ``model``'s forward takes ``use_cache``
    (Hugging Face models) and the caller did not set it, else ``None``. A single
    forward executes the same MACs with or without its cache: the cache only keeps
    the keys and values for the next call."""
    if "use_cache" in kwargs:
        return None
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature Python can read
        return None
    return {**kwargs, "use_cache": False} if "use_cache" in parameters else None


_TRACE_TYPE = re.compile(r"supported as JIT inputs/outputs.*unsupported type: ([\w.]+)", re.DOTALL)


def failure(error: BaseException) -> tuple[str, str]:
    """Why a peer failed, in a line, and the way out (``""`` where there is none to
    give): a TorchScript trace given a value it cannot take (fvcore and torchprofile
    trace the model with ``torch.jit``: tensors, tuples, lists and dicts only) says
    which; any other error is its type and message (at most 300 characters)."""
    traced = _TRACE_TYPE.search(str(error))
    if traced is not None:
        return ("its TorchScript trace takes tensors, tuples, lists and dicts only, and the "
                f"forward gave it a {traced.group(1)} ({type(error).__name__})",
                "return tensors, tuples or dicts from the forward (or wrap the model in a module "
                "that does)")
    return f"{type(error).__name__}: {error}"[:300], ""


def _imported(name: str) -> Any:
    """The module ``name``, imported now (``None`` where it is not installed or fails to
    import)."""
    try:
        return importlib.import_module(name)
    except Exception:  # an optional peer's import failing: its runner reports the error itself
        return None


def _runner(tool: _Tool) -> Runner:
    """The tool's runner, imported now (its module imports the peer itself only when the
    runner runs)."""
    module = importlib.import_module(f"{__package__}.{tool.module}")
    return cast(Runner, getattr(module, tool.runner))


# --------------------------------------------------------------------------------------------------
# helpers the runners share
# --------------------------------------------------------------------------------------------------
def copy_for(model: nn.Module, kwargs: Mapping[str, Any]) -> nn.Module:
    """A deep copy of ``model`` that a tool may hook; keyword arguments are bound into
    its ``forward`` (fvcore and thop call ``model(*inputs)`` only)."""
    twin = copy.deepcopy(model)
    track_copy(twin, model)  # isolation: the hooks the peer leaves on it are reported
    if kwargs:
        twin.forward = functools.partial(twin.forward, **kwargs)
    return twin


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The peers' own warnings (tracer warnings, unsupported ops) silenced: crosscheck
    reports them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@dataclass
class Followed:
    """What :func:`inner_profile` saw: the profile of the run, once the block has ended
    (``None`` if flopscope could not build one)."""

    profile: Profile | None = None


@contextlib.contextmanager
def inner_profile(model: nn.Module) -> Iterator[Followed]:
    """flopscope counting the very run a peer makes inside the block (so a peer that
    changes the execution path is compared with what actually ran). After the block,
    ``followed.profile`` holds that run's profile, or ``None`` when flopscope could
    not build it (then the runner compares with the caller's)."""
    session = Session(model, CapturePlan(mode="real"))
    followed = Followed()
    session.start()
    try:
        yield followed
    finally:
        try:
            followed.profile = Profile(session.finish())
        # flopscope's own failure to build that profile: compare with the caller's
        except FlopscopeError:
            followed.profile = None


def path_difference(tool: str, reason: str, inner: Profile | None,
                    prof: Profile) -> list[Difference]:
    """A ``"path"`` difference when the run the peer made executes other MACs than the
    caller's."""
    if inner is None or inner.total() == prof.total():
        return []
    ours, theirs = prof.by_role(), inner.by_role()
    roles = {r: theirs.get(r, 0) - ours.get(r, 0) for r in {*ours, *theirs} if theirs.get(r, 0) != ours.get(r, 0)}
    return [Difference(tool, "path", inner.total() - prof.total(),
                       f"{reason}, where the model executes {inner.total():,} MACs, not "
                       f"{prof.total():,} ({', '.join(f'{r} {v:+,}' for r, v in roles.items())})")]


def required_formula(registry: FormulaRegistry, op: Any, plugin: str) -> MacFormula:
    """The formula of ``op`` in ``registry``, which the plug-in ``plugin`` builds on."""
    fn = registry.get(op)
    if fn is None:
        raise RegistryError(f"{plugin} needs a formula for {op} in the registry it was given; "
                            "register one (or start from flopscope.REGISTRY.copy())")
    return fn
