"""Diffusion pipelines profiled as a whole: every multiply of one call of a diffusers
pipeline (text encoders, the denoiser at every step, ControlNets beside it, the VAE
decoder), by component and by denoising step.

:func:`profile_pipeline` runs ``pipe(**call_kwargs)`` once, counting every forward of
the pipeline's ``nn.Module`` components (``pipe.components``, by attribute name:
``text_encoder``, ``transformer`` or ``unet``, ``vae``, ...). By default the components
count on **fake tensors**: their parameters are swapped for fake ones for the call (a
pipeline built on ``device="meta"`` works: nothing is allocated for weights or
activations), while the pipeline's own code (the scheduler, the loop, the initial noise,
CFG's arithmetic on the denoiser's output) runs as written on the small real tensors it
makes, so every data-dependent step of a scheduler works. The denoiser's outputs are
fake tensors, and so are the latents after the first step and the returned images: their
shapes are right, their values are not (the returned images are a ``"pt"`` tensor unless
the call says otherwise, as PIL and numpy need values). ``mode="real"`` runs everything.

Steps: each call of ``pipe.scheduler.step`` closes a denoising step; the component calls
since the previous one belong to it. Classifier-free guidance is stated per step:
``"batch"`` (one call of the denoiser on twice the latents' batch: Stable Diffusion),
``"passes"`` (several calls per step: Flux's true CFG, Wan's), or ``"none"`` (Flux-dev's
guidance-distilled single pass).

The pipeline is left as it was: its attributes (the ``_guidance_scale`` and other fields
a call sets), its scheduler's state (``timesteps``, ``sigmas``, step index) and its
components (parameters, buffers, devices: the swap is undone). Offloading hooks are not
run on fake tensors: profile a pipeline without them (or in real mode).

Units: MACs (multiply-accumulates; FLOPs = 2 x MACs), as everywhere in flopscope.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate
from torch import nn

from ..attribute.roles import RoleRule
from ..capture import BLOCK_MODES, CapturePlan, Session, paused_gc
from ..capture.checks import check_mode
from ..capture.module_tracker import ModuleCall
from ..errors import ConfigurationError, NotAModuleError
from ..formulas.registry import FormulaRegistry
from ..profile import Profile
from ..render.html import write_html
from ..render.pipeline_chart import call_bars, component_colours
from ..role import ROLE_ORDER

GUIDANCE = ("none", "batch", "passes")
"""How a step applies classifier-free guidance: not at all (one call on the latents'
batch), by batch (one call on twice the batch: unconditional and conditional together),
by passes (several calls of the denoiser per step)."""


class PipelineComponents(nn.Module):
    """The pipeline's ``nn.Module`` components as children named by their attribute
    names, so that module paths read ``transformer.transformer_blocks.0.attn`` and
    the first part of a path is the component. The components are not copied: the
    same modules, also held by the pipeline. Never called itself."""

    def __init__(self, components: Mapping[str, nn.Module]) -> None:
        super().__init__()
        for name, module in components.items():
            self.add_module(name, module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError("PipelineComponents is never called: call the pipeline")


@dataclass(frozen=True)
class DenoisingStep:
    """One denoising step: the component calls since the previous ``scheduler.step``
    (its MACs per component and calls per component), the latents' batch the
    scheduler stepped, and how guidance was applied (:data:`GUIDANCE`)."""

    step: int
    macs: Mapping[str, int]  # component -> MACs in this step
    calls: Mapping[str, int]  # component -> calls in this step
    # the latents' batch (the scheduler's ``sample``); None where it was not a tensor
    batch: int | None
    denoiser_batch: int | None  # the batch of the denoiser's first tensor input (each call)
    guidance: str

    @property
    def total(self) -> int:
        return sum(self.macs.values())


@dataclass(frozen=True)
class WorkloadTerm:
    """Calls of one entry point of a component (the module a pipeline calls:
    ``transformer``, ``vae.decoder``) that each cost the same: ``calls`` x
    ``macs_per_call``. For a denoiser, the steps they ran in and the calls per step
    (``passes``: 2 for guidance by passes) and the denoiser's batch per call (twice
    the latents' for guidance by batch)."""

    component: str
    entry: str  # module path of the calls ("transformer", "vae.decoder")
    calls: int
    macs_per_call: int
    steps: int | None = None  # denoiser: the denoising steps these calls ran in
    passes: int | None = None  # denoiser: calls per step
    batch: int | None = None  # denoiser: batch of each call
    guidance: str | None = None  # denoiser: how its steps applied guidance (GUIDANCE)

    @property
    def total(self) -> int:
        return self.calls * self.macs_per_call

    def describe(self) -> str:
        """``"28 steps x 1 pass x 37,192,326,709,248"`` or ``"1 call x 6,649,251,840"``."""
        if self.steps is not None and self.passes is not None:
            batch = (f" (batch {self.batch}" + (f", guidance by {self.guidance}" if self.guidance not in (None, "none")
                                                else "") + ")") if self.batch is not None else ""
            return (f"{self.steps} step{'s' * (self.steps != 1)} x {self.passes} "
                    f"pass{'es' * (self.passes != 1)} x {self.macs_per_call:,}{batch}")
        return f"{self.calls} call{'s' * (self.calls != 1)} x {self.macs_per_call:,}"


@dataclass(frozen=True)
class ComponentClosedForm:
    """One component's MACs against the closed forms of its blocks
    (:meth:`Profile.reconcile` rows): ``predicted`` what the closed forms give,
    ``reconciled`` what was measured in those rows (equal where every row is exact),
    ``explained`` the rows that differ with their reasons, and ``outside`` the MACs
    no closed form covers, by role (conditioning MLPs, patch embeddings, timestep
    projections: role ``other`` mostly)."""

    component: str
    measured: int
    reconciled: int
    predicted: int
    explained: tuple[str, ...]
    outside: Mapping[str, int]


@dataclass(frozen=True)
class Workload:
    """The pipeline call as a sum of terms: every entry point's calls grouped by their
    MACs (a denoiser's as steps x passes per step x MACs per call), which add up to
    the measured total exactly, and each component against the closed forms of its
    blocks. Units: MACs (FLOPs = 2 x MACs)."""

    terms: tuple[WorkloadTerm, ...]
    components: tuple[ComponentClosedForm, ...]
    measured: int  # the profile's total

    @property
    def total(self) -> int:
        return sum(term.total for term in self.terms)

    def formula(self) -> str:
        """``"total = transformer: 28 steps x 1 pass x 37,192,326,709,248 +
        text_encoder: 1 call x ... = ..."``."""
        parts = " + ".join(f"{t.entry}: {t.describe()}" for t in self.terms)
        return f"total = {parts} = {self.total:,} MACs"

    def to_table(self, tablefmt: str = "simple") -> str:
        terms = tabulate([[t.component, t.entry, t.describe(), f"{t.total:,}"] for t in self.terms],
                         headers=["component", "called as", "calls x MACs per call", "MACs"],
                         tablefmt=tablefmt,
                         disable_numparse=True)
        closed = tabulate([[c.component, f"{c.measured:,}", f"{c.reconciled:,}", f"{c.predicted:,}",
                            "; ".join(f"{role} {macs:,}" for role, macs in c.outside.items()) or "-",
                            "; ".join(c.explained) or ("-" if c.reconciled == c.predicted else "?")]
                           for c in self.components],
                          headers=["component", "measured", "in closed-form rows", "closed forms",
                                   "outside closed forms", "differences explained"],
                          tablefmt=tablefmt,
                          disable_numparse=True)
        check = "equal to" if self.total == self.measured else "DIFFERENT FROM"
        return f"{terms}\n\n{self.formula()}, {check} the measured total\n\n{closed}"


class PipelineProfile:
    """The profile of one pipeline call. :attr:`profile` is the
    :class:`~flopscope.profile.Profile` of every multiply of the call (module paths
    start with the component's name); every query of a ``Profile`` works on this
    object too (``total()``, ``by_role()``, ``by_module()``, ``reconcile()``,
    ``to_html()``, ...), except ``steps()``, which here are the denoising steps.
    :attr:`output` is what the pipeline returned."""

    def __init__(self, profile: Profile, components: Sequence[str], denoisers: Sequence[str],
                 steps: Sequence[DenoisingStep], output: Any, reuse: Sequence[str] = (),
                 step_of_call: Mapping[ModuleCall, int] | None = None,
                 name: str = "pipeline") -> None:
        self.profile = profile
        self.name = name
        """The pipeline's class name (``"StableDiffusionPipeline"``): the report's title
        and its chart's root."""
        self.components = tuple(components)
        self.denoisers = tuple(denoisers)
        self._steps = tuple(steps)
        self.output = output
        self.reuse = tuple(reuse)
        """How repeated calls were counted: per component, the calls replayed from an
        earlier call's records, or why its calls were captured again
        (:mod:`flopscope.capture.replay`); empty without reuse."""
        # a component's call in the loop -> the step it ran in
        self._step_of_call = dict(step_of_call or {})

    def __getattr__(self, name: str) -> Any:  # only called for names this object lacks
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.profile, name)

    def by_component(self) -> dict[str, int]:
        """MACs per component (every ``nn.Module`` component of the pipeline, in the
        pipeline's order; 0 for one that did not run)."""
        out = dict.fromkeys(self.components, 0)
        for op in self.profile._ops:
            component = component_of(op.module)
            if op.macs and component in out:
                out[component] += op.macs
        return out

    def by_component_role(self) -> dict[str, dict[str, int]]:
        """``{component: {role: MACs}}``: each component's roles, in the canonical role
        order."""
        out: dict[str, Counter[str]] = {name: Counter() for name in self.components}
        for op, assignment in self.profile.role_assignments_by_op().items():
            component = component_of(op.module)
            if component in out:
                for role, macs in assignment.parts.items():
                    out[component][role] += macs
        return {name: {r: roles[r] for r in ROLE_ORDER if roles.get(r)} for name, roles in out.items()}

    def steps(self) -> list[DenoisingStep]:
        """The denoising steps, in order (one per ``scheduler.step`` call)."""
        return list(self._steps)

    def around_steps(self) -> tuple[dict[str, int], dict[str, int]]:
        """MACs per component of the calls outside the denoising steps: ``(before,
        after)``, the calls made before the first step's first call (the prompt's
        encoding, an image's VAE encode) and the others (after the last step: the VAE
        decode), each in the order of :attr:`components` (a component without such
        calls left out). With the steps' MACs they add up to :meth:`by_component`.
        Without steps every call is before."""
        before: Counter[str] = Counter()
        after: Counter[str] = Counter()
        step_of = self._step_of_call
        looped = False
        for op in self.profile._ops:  # (in the order they ran)
            if not op.module_stack:
                continue
            if op.module_stack[0] in step_of:
                looped = True
            elif op.macs:
                (after if looped else before)[component_of(op.module_stack[0].path)] += op.macs
        return ({c: before[c] for c in self.components if before[c]},
                {c: after[c] for c in self.components if after[c]})

    def by_step_role(self) -> list[dict[str, int]]:
        """Each denoising step's MACs by role, in step order (the component calls the
        step made; each adds up to the step's :attr:`~DenoisingStep.total`)."""
        out: list[Counter[str]] = [Counter() for _ in self._steps]
        step_of = self._step_of_call
        for op, assignment in self.profile.role_assignments_by_op().items():
            step = next((step_of[call] for call in op.module_stack if call in step_of), None)
            if step is not None:
                for role, macs in assignment.parts.items():
                    out[step][role] += macs
        return [{r: roles[r] for r in ROLE_ORDER if roles.get(r)} for roles in out]

    def workload(self) -> Workload:
        """The call as calls x MACs per call of each entry point (a denoiser's as steps
        x passes), adding up to :meth:`total`, and each component against its blocks'
        closed forms (:class:`Workload`)."""
        per_call = _macs_by_entry(self.profile)
        entries = {path: sorted(n for p, n in per_call if p == path) for path, _ in per_call}
        step_of = self._step_of_call
        terms = []
        for component in self.components:
            for entry in [p for p in entries if component_of(p) == component]:
                groups: dict[int, list[int]] = {}
                for call in entries[entry]:
                    groups.setdefault(per_call[ModuleCall(entry, call)], []).append(call)
                for macs, calls in groups.items():
                    steps = {step_of.get(ModuleCall(entry, call)) for call in calls}
                    if entry in self.denoisers and None not in steps and len(calls) % len(steps) == 0:
                        batch = _batch_of(self.profile, ModuleCall(entry, calls[0]))
                        guidance = self._steps[step_of[ModuleCall(entry, calls[0])]].guidance
                        terms.append(WorkloadTerm(component, entry, len(calls), macs, len(steps),
                                                  len(calls) // len(steps), batch, guidance))
                    else:
                        terms.append(WorkloadTerm(component, entry, len(calls), macs))
        return Workload(tuple(terms), self._closed_forms(), self.profile.total())

    def _closed_forms(self) -> tuple[ComponentClosedForm, ...]:
        rows = self.profile.reconcile().rows
        roles = self.by_component_role()
        by_component = self.by_component()
        out = []
        for component in self.components:
            mine = [r for r in rows if component_of(r.block) == component]
            if not by_component[component]:
                continue
            covered: Counter[str] = Counter()
            for r in mine:
                covered[r.role] += r.measured
            outside = {role: macs - covered[role] for role, macs in roles[component].items() if macs - covered[role]}
            explained = tuple(dict.fromkeys(f"{r.role}: {r.reason}" for r in mine if not r.exact and r.reason))
            out.append(ComponentClosedForm(component, by_component[component],
                                           sum(r.measured for r in mine),
                                           sum(r.predicted or 0 for r in mine), explained, outside))
        return tuple(out)

    def denoising_macs(self) -> int:
        """MACs of every denoising step together."""
        return sum(step.total for step in self._steps)

    def role_rows(self) -> tuple[list[str], list[list[Any]]]:
        """The components that multiplied, and a row ``[role, MACs in each of them]``
        per role any of them has, in the order of :meth:`by_role` (the command line's
        table and the HTML report's)."""
        roles = self.by_component_role()
        names = [name for name, r in roles.items() if r]
        order = [role for role in self.profile.by_role() if any(roles[n].get(role) for n in names)]
        return names, [[role, *[roles[n].get(role, 0) for n in names]] for role in order]

    def _stepped(self) -> list[str]:
        """The components called in the denoising steps, in the pipeline's order."""
        return [c for c in self.components if any(c in s.macs for s in self._steps)]

    def steps_table(self, tablefmt: str = "simple") -> str:
        """The steps as a table: MACs per component called in the steps, calls, batches,
        guidance."""
        names = self._stepped()
        body = [[s.step, *[f"{s.macs.get(c, 0):,}" for c in names], f"{s.total:,}",
                 " ".join(f"{c}x{n}" for c, n in s.calls.items()), s.batch, s.denoiser_batch,
                 s.guidance]
                for s in self._steps]
        return tabulate(body, headers=["step", *[f"{c} MACs" for c in names], "MACs", "calls",
                                       "latents batch",
                                       "denoiser batch", "guidance"], tablefmt=tablefmt,
                        disable_numparse=True)

    def to_html(self, path: str | Path, title: str | None = None) -> Path:
        """The HTML report of the whole call (:meth:`Profile.to_html`'s page: its module
        tree rooted at the pipeline, every component below it) with the pipeline's
        own sections: the call by component and by step as pictures
        (:mod:`flopscope.render.pipeline_chart`: before the steps, each step, after
        them), each component's MACs by role, the steps by component and by role (a
        row per run of identical steps), and the reconciliation grouped by component."""
        names, rows = self.role_rows()
        stepped = self._stepped()
        by_step = self.by_step_role()
        step_roles = [role for role in ROLE_ORDER if any(r.get(role) for r in by_step)]
        before, after = self.around_steps()
        section = {
            "name": self.name, "components": names, "stepped": stepped, "roles": rows,
            "totals": [self.by_component()[n] for n in names], "denoisers": list(self.denoisers),
            "colours": component_colours(self.components),
            "bars": call_bars(before, self._steps, after),
            "steps": [[s.step, *[s.macs.get(c, 0) for c in stepped], s.total, s.guidance] for s in self._steps],
            "step_roles": step_roles,
            "steps_by_role": [[s.step, *[r.get(role, 0) for role in step_roles], s.total]
                              for s, r in zip(self._steps, by_step, strict=True)]}
        return write_html(self.profile, path, title=title or f"flopscope: {self.name}",
                          pipeline=section)

    def summary_table(self, tablefmt: str = "simple") -> str:
        """MACs and FLOPs per component, with the share of the call."""
        total = self.profile.total() or 1
        body = [[name, f"{macs:,}", f"{2 * macs:,}", f"{100 * macs / total:.1f}%"]
                for name, macs in self.by_component().items()]
        body.append(["total", f"{self.profile.total():,}", f"{2 * self.profile.total():,}",
                     "100.0%"])
        return tabulate(body, headers=["component", "MACs", "FLOPs", "share"], tablefmt=tablefmt,
                        disable_numparse=True)

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={macs:,}" for name, macs in self.by_component().items() if macs)
        return f"<PipelineProfile {self.profile.total():,} MACs: {parts}; {len(self._steps)} steps>"


def profile_pipeline(pipe: Any, *, mode: str = "fake", registry: FormulaRegistry | None = None,
                     roles: Sequence[RoleRule] = (), reuse: bool = True,
                     **call_kwargs: Any) -> PipelineProfile:
    """Run ``pipe(**call_kwargs)`` once (a diffusers ``DiffusionPipeline``, or any
    object with ``components`` and a ``scheduler``) and count every multiply of its
    components: see the module docstring.

    Args:
        pipe: the pipeline; built from configs on ``device="meta"`` is fine in fake
            mode.
        mode: ``"fake"`` (default: nothing computed in the components, no weights
        needed) or ``"real"``. registry, roles: as :func:`flopscope.profile`.
        reuse: in fake mode, a call of a component whose records are provably those of
            an earlier call (the same inputs' shapes and plain arguments, no value read:
            the denoiser at every step after the first) is replayed from them, not run
            again (:mod:`flopscope.capture.replay`); ``False`` runs every call. The
            counts are the same; :attr:`PipelineProfile.reuse` says what was replayed.
        call_kwargs: the pipeline call's arguments (``prompt`` or ``prompt_embeds``,
            ``num_inference_steps``, ``guidance_scale``, ``height``, ``width``,
            ``num_frames``, ...). In fake mode ``output_type`` defaults to ``"pt"``
            where the call takes one.
    """
    check_mode(mode, BLOCK_MODES, "profile_pipeline mode")
    modules = _module_components(pipe)
    scheduler = getattr(pipe, "scheduler", None)
    if mode == "fake" and "output_type" in _parameters(pipe) and "output_type" not in call_kwargs:
        call_kwargs["output_type"] = "pt"  # PIL and numpy read values, which fake images have not
    box = PipelineComponents(modules)
    session = Session(box, CapturePlan.of(mode, registry), fake_block=False)
    marks: list[tuple[Counter[str], int | None]] = []
    # the calls made when the loop began (the last set_timesteps)
    begun: list[Counter[str]] = [Counter()]

    def start() -> None:
        if not marks:
            begun[0] = session.calls_by_path()

    notes: list[str] = []
    with _pipeline_kept(pipe):
        session.start()
        try:
            with ExitStack() as stack:
                stack.enter_context(_marking_steps(
                    scheduler, start,
                    lambda sample: marks.append((session.calls_by_path(), _batch(sample)))))
                replayer = stack.enter_context(session.replaying(modules)) if reuse and mode == "fake" else None
                stack.enter_context(paused_gc(promote=mode == "fake"))
                output = pipe(**call_kwargs)
                notes = replayer.notes() if replayer is not None else []
        finally:
            prof = Profile(session.finish(stacklevel=3), role_rules=tuple(roles))
    steps, denoisers, step_of_call = _steps(prof, list(modules), begun[0], marks)
    return PipelineProfile(prof, list(modules), denoisers, steps, output, notes, step_of_call,
                           type(pipe).__name__)


def _module_components(pipe: Any) -> dict[str, nn.Module]:
    components = getattr(pipe, "components", None)
    if not isinstance(components, Mapping):
        raise NotAModuleError(f"{type(pipe).__name__} has no `components` mapping: give a "
                              "diffusers pipeline (a DiffusionPipeline), or profile a module with "
                              "flopscope.profile")
    modules = {name: c for name, c in components.items() if isinstance(c, nn.Module)}
    if not modules:
        raise NotAModuleError(f"{type(pipe).__name__} has no nn.Module components to count")
    return modules


def _parameters(pipe: Any) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(pipe.__call__).parameters
    except (TypeError, ValueError):
        return {}


@contextmanager
def _pipeline_kept(pipe: Any) -> Iterator[None]:
    """Restore the pipeline's own attributes (a call sets ``_guidance_scale``,
    ``_num_timesteps``, ...) and its scheduler's state (``set_timesteps`` writes
    ``timesteps``, ``sigmas``, the step index) afterwards, also when the call raised.
    Progress bars are off for the call."""
    attributes = dict(vars(pipe))
    scheduler = getattr(pipe, "scheduler", None)
    state = copy.deepcopy(vars(scheduler)) if scheduler is not None and hasattr(scheduler, "__dict__") else None
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    try:
        yield
    finally:
        vars(pipe).clear()
        vars(pipe).update(attributes)
        if state is not None:
            vars(scheduler).clear()
            vars(scheduler).update(state)


@contextmanager
def _marking_steps(scheduler: Any, start: Callable[[], None],
                   mark: Callable[[Any], None]) -> Iterator[None]:
    """For the call: ``start()`` at each ``scheduler.set_timesteps`` (the loop is about to begin: what ran before,
    the prompt's encoding, is no step), ``mark(sample)`` at each ``scheduler.step(model_output, timestep, sample,
    ...)``. The scheduler's methods are wrapped on the instance and unwrapped afterwards."""
    if scheduler is None:
        yield
        return
    wrapped = {}
    for name, before in (("set_timesteps", lambda *args, **kwargs: start()),
                         ("step", lambda *args, **kwargs: mark(kwargs.get("sample", args[2] if len(args) > 2
                                                                          else None)))):
        method = getattr(scheduler, name, None)
        if callable(method):
            wrapped[name] = (method, name in vars(scheduler))
            setattr(scheduler, name, _before(before, method))
    try:
        yield
    finally:
        for name, (method, had_own) in wrapped.items():
            if had_own:
                setattr(scheduler, name, method)
            else:
                delattr(scheduler, name)


def _before(hook: Callable[..., None], method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with ``hook`` called first; its signature stays ``method``'s
    (pipelines inspect ``set_timesteps`` for the arguments it takes)."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        hook(*args, **kwargs)
        return method(*args, **kwargs)

    return call


def _batch(sample: Any) -> int | None:
    return int(sample.shape[0]) if isinstance(sample, torch.Tensor) and sample.dim() else None


def component_of(path: str | None) -> str:
    """The component a module path belongs to: its first part (``"transformer"`` of
    ``"transformer.transformer_blocks.0.attn"``)."""
    return (path or "").split(".", 1)[0]



def _macs_by_entry(prof: Profile) -> Counter[ModuleCall]:
    """MACs of each outermost module call: a component's call, or a call of one of its
    modules made by another method than ``forward`` (``vae.decode`` calls
    ``vae.decoder``)."""
    out: Counter[ModuleCall] = Counter()
    for op in prof._ops:
        if op.module_stack and op.macs:
            out[op.module_stack[0]] += op.macs
    return out


def _batch_of(prof: Profile, call: ModuleCall) -> int | None:
    """The batch of a module call: the leading size of its first tensor input (``None``
    if it had none)."""
    shapes = prof._capture.module_inputs.get(call, ())
    return next((int(shape[0]) for _, shape in shapes if len(shape) and type(shape[0]) is int),
                None)


def _steps(prof: Profile, components: list[str], begun: Counter[str],
           marks: list[tuple[Counter[str], int | None]]
           ) -> tuple[list[DenoisingStep], list[str], dict[ModuleCall, int]]:
    """The denoising steps between the scheduler's marks (the first from ``begun``, the
    calls made when the loop began): each component's calls and MACs per step; the
    denoisers are the components called in every step; and the step each component
    call of the loop ran in."""
    if not marks:
        return [], [], {}
    macs_of_call = _macs_by_entry(prof)
    calls_at = [Counter({c: n for c, n in counts.items() if c in components}) for counts, _ in marks]
    start = Counter({c: n for c, n in begun.items() if c in components})
    per_step = [calls_at[0] - start,
                *[calls_at[i] - calls_at[i - 1] for i in range(1, len(calls_at))]]
    denoisers = [c for c in components if all(step.get(c) for step in per_step)]
    steps, step_of_call = [], {}
    for i, (calls, (_, batch)) in enumerate(zip(per_step, marks, strict=True)):
        first = calls_at[i - 1] if i else start
        made = {c: [ModuleCall(c, k) for k in range(first[c] + 1, first[c] + n + 1)] for c, n in calls.items() if n}
        step_of_call.update({call: i for each in made.values() for call in each})
        macs = {c: sum(macs_of_call[call] for call in each) for c, each in made.items()}
        denoiser_batch = _batch_of(prof, ModuleCall(denoisers[0], first[denoisers[0]] + 1)) if denoisers else None
        passes = calls.get(denoisers[0], 0) if denoisers else 0
        guidance = ("passes" if passes > 1 else "batch" if batch and denoiser_batch == 2 * batch else "none")
        steps.append(DenoisingStep(i, macs, {c: n for c, n in calls.items() if n}, batch,
                                   denoiser_batch, guidance))
    return steps, denoisers, step_of_call
