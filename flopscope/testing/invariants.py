"""Invariants every count must satisfy, whatever the model: checked over whole zoos
(``benchmarks/zoo.py``, ``benchmarks/timm_zoo.py``) and in test suites, where closed
forms cannot reach 600 architectures.

:func:`check_invariants` profiles one model several ways and names each invariant that
does not hold:

- ``repeat``: two profiles in one process give the same total, roles and module totals;
- ``modes``: fake, real and meta (a copy of the model on ``device="meta"``) give the
  same total, roles and module totals, and the same attention core under every
  convention (``attention="causal"`` and ``"mask"``: one price per algorithm, whatever
  path ran it), where each can run. A model that reads its data cannot run on fake or
  meta tensors (skipped, with the reason); a count on fake tensors that is an upper
  bound, as ``prof.notes`` says, is not compared; on meta a fused-layer fast path is not
  taken (PyTorch checks the device), so module totals are not compared there when the
  real run took one;
- ``attention``: a Hugging Face model's eager attention and its SDPA attention give the
  same total and roles, under every convention (on a copy switched with
  ``set_attn_implementation``; skipped where the model has only one);
- ``forward``: a plain forward after the profiles returns real tensors equal to those of
  one before them;
- ``caches``: no fake tensor sits in the caches and stores the model's code reaches
  (:func:`flopscope.capture.model_caches.fake_tensors_held`).

The same roles in two processes with different ``PYTHONHASHSEED`` is the sixth: it needs
two interpreters, so the zoo scripts compare two runs' JSON (``--against``) and the test
suite runs two subprocesses. Units: MACs.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from ..api import profile
from ..attribute.paths import within
from ..capture.fake import map_tensors, tensors_in
from ..capture.model_caches import fake_tensors_held
from ..capture.records import FORWARD
from ..conventions import CAUSAL, MASK
from ..errors import FlopscopeError
from ..formulas.registry import REGISTRY, OpFamily
from ..profile import Profile
from ..role import ATTENTION_CORE, PAIR_ROLES, Role, RoleGroup

INVARIANTS = ("repeat", "modes", "attention", "forward", "caches")
"""The invariants :func:`check_invariants` checks, in the order it checks them."""
CONVENTIONS = (CAUSAL, MASK)
"""The attention conventions other than ``"executed"`` (what ``by_role()`` counts)
compared by the invariants."""


@dataclass(frozen=True)
class Counted:
    """What the invariants compare of one profile (MACs)."""

    mode: str
    total: int
    roles: dict[str, int]
    modules: dict[str, int]
    # a fused-layer kernel ran (FUSED_LAYER: nn.MultiheadAttention's fast path, ...)
    fused_layers: bool = False
    # convention -> attention core's roles
    conventions: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, prof: Profile) -> Counted:
        # (by_op names: "aten.x")
        fused = {op.replace("::", ".") for op in REGISTRY.ops(OpFamily.FUSED_LAYER)}
        roles = dict(prof.by_role())
        conventions = {}
        if any(roles.get(role) for role in PAIR_ROLES):
            for convention in CONVENTIONS:
                priced = prof.by_role(attention=convention)
                conventions[convention] = {role: priced.get(role, 0) for role in PAIR_ROLES}
        return cls(prof.mode, prof.total(), roles, dict(prof.by_module()),
                   any(op in fused for op in prof.by_op()),
                   conventions)

    def differences(self, other: Counted, *, modules: bool = True) -> str:
        """What differs from ``other``, in one line ("" when nothing does)."""
        parts = []
        if self.total != other.total:
            parts.append(f"total {self.total:,} vs {other.total:,}")
        roles = [f"{r} {self.roles.get(r, 0):,} vs {other.roles.get(r, 0):,}" for r in sorted({*self.roles,
                                                                                               *other.roles})
                 if self.roles.get(r, 0) != other.roles.get(r, 0)]
        if roles:
            parts.append("roles: " + ", ".join(roles[:4]) + (", ..." if len(roles) > 4 else ""))
        for convention in CONVENTIONS:
            mine, theirs = self.conventions.get(convention, {}), other.conventions.get(convention, {})
            moved = [f"{r} {mine.get(r, 0):,} vs {theirs.get(r, 0):,}" for r in PAIR_ROLES
                     if mine.get(r, 0) != theirs.get(r, 0)]
            if moved and not roles:
                parts.append(f"attention={convention!r}: " + ", ".join(moved))
        if modules and self.total == other.total:
            paths = [p for p in sorted({*self.modules, *other.modules}) if self.modules.get(p) != other.modules.get(p)]
            if paths:
                parts.append(f"{len(paths)} module totals, first '{paths[0]}' "
                             f"{self.modules.get(paths[0], 0):,} vs "
                             f"{other.modules.get(paths[0], 0):,}")
        return "; ".join(parts)


@dataclass
class InvariantReport:
    """The outcome of :func:`check_invariants`: ``violations`` (invariant -> what
    differs), ``skipped`` (invariant -> why it could not be checked) and the
    ``counts`` compared (label -> :class:`Counted`)."""

    violations: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    counts: dict[str, Counted] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def status(self, invariant: str) -> str:
        """``"ok"``, ``"violated: ..."`` or ``"skipped: ..."``."""
        if invariant in self.violations:
            return f"violated: {self.violations[invariant]}"
        if invariant in self.skipped:
            return f"skipped: {self.skipped[invariant]}"
        return "ok"


def check_invariants(model: nn.Module, *args: Any, grad: bool = False,
                     **kwargs: Any) -> InvariantReport:
    """Check :data:`INVARIANTS` on ``model(*args, **kwargs)`` (under
    ``torch.set_grad_enabled(grad)``; the random seed is set before each forward).
    The model is left as it was: the meta and eager-attention counts run on copies."""
    report = InvariantReport()
    with torch.set_grad_enabled(grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fall-backs and notes: the counts say what matters here
        before = _forward(model, args, kwargs)
        real = _count(report, "real", lambda: profile(model, *args, mode="real", **kwargs))
        again = _count(report, "real again", lambda: profile(model, *args, mode="real", **kwargs))
        fake = _count(report, "fake", lambda: profile(model, *args, mode="fake", **kwargs))
        fake_again = _count(report, "fake again",
                            lambda: profile(model, *args, mode="fake", **kwargs))
        meta = _count(report, "meta", lambda: _on_meta(model, args, kwargs))
        eager = _count(report, "eager", lambda: _eager(model, args, kwargs))
        after = _forward(model, args, kwargs)
    _repeat(report, [(real, again), (fake, fake_again)])
    _modes(report, real, fake, meta)
    _attention(report, real, eager)
    _same_forward(report, before, after)
    held = fake_tensors_held(model)
    if held:
        report.violations["caches"] = "fake tensors in " + "; ".join(held)
    return report


def _count(report: InvariantReport, label: str, run: Callable[[], Profile | None]) -> Counted | str:
    """The count of one run, or why it could not run (a :class:`FlopscopeError`'s first
    line, or "n/a: ..."). The random seed is set first: a model that draws random
    numbers in its forward (a stochastic duration predictor, say) may execute other
    work for other draws."""
    torch.manual_seed(0)
    try:
        prof = run()
    except FlopscopeError as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    except Exception as error:  # not flopscope's error: the model's own (a copy on meta, say)
        return f"the model raised {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    if prof is None:
        return "n/a"
    counted = Counted.of(prof)
    if any("upper bound" in note for note in prof.notes):
        return f"an upper bound ({label}): " + next(n for n in prof.notes if "upper bound" in n)[:160]
    report.counts[label] = counted
    return counted


def _repeat(report: InvariantReport, pairs: list[tuple[Counted | str, Counted | str]]) -> None:
    found = [f"{a.mode}: {a.differences(b)}" for a, b in pairs
             if isinstance(a, Counted) and isinstance(b, Counted) and a.differences(b)]
    if found:
        report.violations["repeat"] = " | ".join(found)
    elif not any(isinstance(a, Counted) and isinstance(b, Counted) for a, b in pairs):
        report.skipped["repeat"] = "no mode ran twice"


def _modes(report: InvariantReport, real: Counted | str, fake: Counted | str,
           meta: Counted | str) -> None:
    if not isinstance(real, Counted):
        report.skipped["modes"] = f"real: {real}"
        return
    found, missing = [], []
    for label, other in (("fake", fake), ("meta", meta)):
        if isinstance(other, Counted):
            # PyTorch takes its fused-layer fast paths on CPU and CUDA tensors only: on
            # meta the layer runs unfused, its multiplies in its submodules (same total
            # and roles, other module totals)
            difference = other.differences(real, modules=not (label == "meta" and real.fused_layers))
            if difference:
                found.append(f"{label} vs real: {difference}")
        else:
            missing.append(f"{label}: {other}")
    if found:
        report.violations["modes"] = " | ".join(found)
    elif len(missing) == 2:
        report.skipped["modes"] = " | ".join(missing)


def _attention(report: InvariantReport, sdpa: Counted | str, eager: Counted | str) -> None:
    if not isinstance(eager, Counted) or not isinstance(sdpa, Counted):
        report.skipped["attention"] = eager if isinstance(eager, str) else f"sdpa: {sdpa}"
        return
    difference = eager.differences(sdpa, modules=False)
    if difference:
        report.violations["attention"] = f"eager vs sdpa: {difference}"


def _same_forward(report: InvariantReport, before: Any, after: Any) -> None:
    if isinstance(before, str) or isinstance(after, str):
        report.skipped["forward"] = before if isinstance(before, str) else after
        return
    if any(isinstance(t, FakeTensor) for t in after):
        report.violations["forward"] = f"{sum(isinstance(t, FakeTensor) for t in after)} fake tensors in the output"
        return
    if len(before) != len(after):
        report.violations["forward"] = f"{len(before)} output tensors before, {len(after)} after"
        return
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        if a.shape != b.shape or not torch.equal(a.nan_to_num(), b.nan_to_num()):
            report.violations["forward"] = f"output tensor {i} (shape {list(a.shape)}) differs after the profiles"
            return


def _forward(model: nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> list[torch.Tensor] | str:
    """The output tensors of a plain forward (detached), or why it raised."""
    torch.manual_seed(0)
    try:
        output = model(*args, **kwargs)
    except Exception as error:  # the model's own error: the forward invariant cannot be checked
        return f"a plain forward raised {type(error).__name__}"
    return [t.detach() for t in tensors_in(_plain(output))]


def _plain(output: Any) -> Any:
    """A Hugging Face ``ModelOutput`` as a tuple of its values (``tensors_in`` walks
    tuples, lists, dicts)."""
    to_tuple = getattr(output, "to_tuple", None)
    return to_tuple() if callable(to_tuple) else output


def _on_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Profile | None:
    """A profile of a copy of the model, and of the inputs, on ``device="meta"``."""
    if any(t.is_meta for t in model.parameters()):
        return None
    copied = copy.deepcopy(model).to("meta")
    meta_args, meta_kwargs = map_tensors((args, kwargs), lambda t: t.to("meta"))
    return profile(copied, *meta_args, **meta_kwargs)


def _eager(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Profile | None:
    """A profile of a copy of a Hugging Face model switched to eager attention (``None``
    where it has no other)."""
    config = getattr(model, "config", None)
    switch = getattr(model, "set_attn_implementation", None)
    if config is None or switch is None or getattr(config, "_attn_implementation", None) in (None, "eager"):
        return None
    copied = copy.deepcopy(model)
    try:
        cast(Any, copied).set_attn_implementation("eager")
    except Exception:  # the model supports only the implementation it has
        return None
    return profile(copied, *args, mode="real", **kwargs)


# --------------------------------------------------------------------------------------------------
# roles that must balance (issue 47): statements about one layer's roles that hold in every standard block
BALANCE_RULES = ("ffn", "gate", "attention", "projections", "head")
"""What :func:`role_balance` checks, per layer (an item of a module list that has
submodules, the outermost one):

- ``ffn``: ``ffn_up == ffn_down`` (an FFN maps d → f → d: both are n·d·f, gated or not,
  each expert alike);
- ``gate``: ``ffn_gate`` is 0 or ``ffn_up`` (a GLU's gate has the up projection's
  shape);
- ``attention``: scores and weighted sum come together, and the projections balance with
  them: ``q_proj / out_proj == k_proj / v_proj == attn_scores / attn_weighted_sum``
  (each ratio is d_qk / d_v: true for multi-head, grouped-query, multi-query and
  cross-attention; written as products of integers);
- ``projections``: a layer with q/k/v/out projections has an attention core (quadratic
  or linear);
- ``head``: nothing in a head (a pooler, a classifier, an LM head: the paths given) is
  an attention or FFN role.
"""


@dataclass(frozen=True)
class Imbalance:
    """One rule of :data:`BALANCE_RULES` that one layer (or head) breaks: ``where`` (its
    module path), ``rule`` and ``detail`` (the MACs that do not balance)."""

    where: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where or '(root)'}: {self.rule}: {self.detail}"


def role_balance(prof: Profile, heads: Sequence[str] = ()) -> list[Imbalance]:
    """The :data:`BALANCE_RULES` that ``prof``'s forward roles break, per layer and per
    head (``heads``: module paths of the model's heads). A layer is an item of a
    module list (``layers.3``), the outermost where lists nest (a layer's experts
    belong to it). No closed form is needed: the rules hold whatever the widths
    (MACs)."""
    types = prof.facts.types
    layers: dict[str, Counter[str]] = {}
    in_heads: dict[str, Counter[str]] = {head: Counter() for head in heads}
    layer_of: dict[str, str | None] = {}
    for record in prof.records:
        if record.phase != FORWARD or not record.roles:
            continue
        path = record.module
        if path not in layer_of:
            layer_of[path] = _layer(path, types)
        layer = layer_of[path]
        if layer is not None:
            layers.setdefault(layer, Counter()).update(record.roles)
        for head, roles in in_heads.items():
            if within(path, head):
                roles.update(record.roles)
    found = [imbalance for layer, roles in layers.items() for imbalance in _layer_balance(layer, roles)]
    for head, roles in in_heads.items():
        wrong = {role: macs for role, macs in roles.items()
                 if macs and Role(role).group in (RoleGroup.ATTENTION, RoleGroup.FFN)}
        if wrong:
            found.append(Imbalance(head, "head",
                                   ", ".join(f"{r} {m:,}" for r, m in sorted(wrong.items()))))
    return found


def head_paths(prof: Profile) -> list[str]:
    """The model's heads, found from the run: the outermost modules beside the layers
    (children of a module that holds a layer list, outside every layer) whose every
    multiply ran after the last layer's (a pooler, a classifier, an LM head). Empty
    for a model without a layer list."""
    types = prof.facts.types
    records = [r for r in prof.records if r.phase == FORWARD]
    layers = [_layer(r.module, types) for r in records]
    last = max((i for i, layer in enumerate(layers) if layer is not None), default=None)
    if last is None:
        return []
    holders = {".".join(layer.split(".")[:i]) for layer in filter(None, layers)
               # every module above a layer (the root "" among them)
               for i in range(len(layer.split(".")))}
    first: dict[str, int] = {}
    for i, record in enumerate(records):
        parts = record.module.split(".") if record.module else []
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            if path in holders:
                continue
            if ".".join(parts[:depth - 1]) in holders:
                first.setdefault(path, i)
            break
    return [path for path, i in first.items() if i > last]


def _layer(path: str, types: Mapping[str, type]) -> str | None:
    """The outermost item of a module list that contains ``path`` and is a block (a
    module with submodules: a list of plain ``Linear`` s, an MLP's layers, holds no
    layers) as every other item is (a list that also holds leaves, diffusers'
    ``FeedForward.net = [GELU(proj), Dropout, Linear]``, holds the steps of one
    block, no layers; a hybrid model's list of attention and Mamba blocks holds
    layers); ``None``: in no such item."""
    parts = path.split(".") if path else []
    for i in range(1, len(parts)):
        parent, item = ".".join(parts[:i]), ".".join(parts[:i + 1])
        if (parts[i].isdigit() and isinstance(types.get(parent), type)
                and issubclass(types[parent], (nn.ModuleList, nn.Sequential)) and _has_submodules(item, types)
                and _all_blocks(parent, types)):
            return item
    return None


def _all_blocks(parent: str, types: Mapping[str, type]) -> bool:
    prefix = parent + "."
    items = [path for path in types if path.startswith(prefix) and path[len(prefix):].isdigit()]
    return all(_has_submodules(item, types) for item in items)


def _has_submodules(path: str, types: Mapping[str, type]) -> bool:
    prefix = path + "."
    return any(other.startswith(prefix) for other in types)


def _layer_balance(layer: str, roles: Mapping[str, int]) -> list[Imbalance]:
    up, gate, down = roles.get("ffn_up", 0), roles.get("ffn_gate", 0), roles.get("ffn_down", 0)
    q, k, v, out = (roles.get(r, 0) for r in ("q_proj", "k_proj", "v_proj", "out_proj"))
    scores, weighted = roles.get("attn_scores", 0), roles.get("attn_weighted_sum", 0)
    found = []
    if up != down:
        found.append(Imbalance(layer, "ffn", f"ffn_up {up:,} != ffn_down {down:,}"))
    if gate and gate != up:
        found.append(Imbalance(layer, "gate", f"ffn_gate {gate:,} != ffn_up {up:,}"))
    if scores or weighted:
        if not (scores and weighted):
            found.append(Imbalance(layer, "attention",
                                   f"attn_scores {scores:,}, attn_weighted_sum {weighted:,}"))
        else:  # (each ratio on its own: a layer may break both)
            if (q or out) and q * weighted != out * scores:
                found.append(Imbalance(layer, "attention", f"q_proj {q:,} / out_proj {out:,} != "
                                                           f"attn_scores {scores:,} / "
                                                           f"attn_weighted_sum {weighted:,}"))
            if (k or v) and k * weighted != v * scores:
                found.append(Imbalance(layer, "attention", f"k_proj {k:,} / v_proj {v:,} != "
                                                           f"attn_scores {scores:,} / "
                                                           f"attn_weighted_sum {weighted:,}"))
    if (q or k or v or out) and not any(roles.get(r, 0) for r in ATTENTION_CORE):
        found.append(Imbalance(layer, "projections",
                               f"q/k/v/out {q:,}/{k:,}/{v:,}/{out:,} without an attention core"))
    return found
