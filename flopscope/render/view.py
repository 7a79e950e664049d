"""What a renderer reads of a profile: :class:`ProfileView`, the members of
:class:`flopscope.Profile` that the text report, the plots, the trace merge and the
diff use. Renderers take a ``ProfileView``, never the façade's class, so this layer
imports nothing above it (the façade calls the renderers). Units: MACs unless a name
says FLOPs or bytes; ``attention`` is a convention of
:data:`flopscope.conventions.ATTENTION_CONVENTIONS`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from torch import fx

from ..attribute.op_record import OpRecord
from ..attribute.roles import Assignment
from ..capture.facts import ModelFacts
from ..capture.records import CapturedOp
from ..predict.attention import CoreOp
from ..predict.reconcile import Reconciliation, TransformerSpec
from ..predict.steps import Step
from ..predict.timing import Timing


class ProfileView(Protocol):
    """A counted run as the renderers read it (:class:`flopscope.Profile` is one)."""

    @property
    def graph(self) -> fx.Graph: ...

    @property
    def records(self) -> tuple[OpRecord, ...]: ...

    @property
    def mode(self) -> str: ...

    @property
    def timed(self) -> bool: ...

    @property
    def facts(self) -> ModelFacts: ...

    @property
    def notes(self) -> list[str]: ...

    def steps(self, attention: str = ...) -> list[Step]: ...

    def total(self, module: str = ..., phase: str | None = ..., attention: str = ...) -> int: ...

    def total_flops(self, module: str = ..., phase: str | None = ...,
                    attention: str = ...) -> int: ...

    def total_bytes(self, module: str = ..., phase: str | None = ...) -> int: ...

    def by_phase(self) -> dict[str, int]: ...

    def by_module(self) -> dict[str, int]: ...

    def by_op(self) -> dict[str, int]: ...

    def op_calls(self) -> dict[str, int]: ...

    def bytes_by_role(self, phase: str | None = ...) -> dict[str, int]: ...

    def by_role(self, phase: str | None = ..., attention: str = ...) -> dict[str, int]: ...

    def by_block(self, attention: str = ...) -> dict[str, dict[str, int]]: ...

    def role_assignments_by_op(self) -> Mapping[CapturedOp, Assignment]: ...

    def attention_core(self) -> tuple[CoreOp, ...]: ...

    def reconcile(self, spec: TransformerSpec | None = ...) -> Reconciliation: ...

    def timing(self) -> Timing: ...

    def unsupported(self) -> dict[str, int]: ...

    def elementwise(self) -> dict[str, int]: ...

    def uncalled_modules(self) -> set[str]: ...

    def module_calls(self) -> dict[str, int]: ...


__all__ = ["ProfileView"]
