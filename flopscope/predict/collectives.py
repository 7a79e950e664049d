"""The collectives of a capture, by kind, group, module, carried role and phase, and the
closed forms of what Megatron-LM tensor parallelism, FSDP and DDP send
(``docs/conventions.md`` §12; message bytes as :mod:`flopscope.formulas.collectives`
defines them). :mod:`flopscope.communication` is the public module."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..attribute.roles import Assignment
from ..capture.records import CapturedOp, link
from ..formulas.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER


@dataclass(frozen=True)
class CollectiveRow:
    """Collectives of one kind, group size, module, role and phase: how many calls and
    their message bytes."""

    kind: str  # "all_reduce", "all_gather", ...
    group: int | None  # ranks in the group
    # the module of the multiply whose result it carries (else where it ran; "" is the
    # root)
    module: str
    role: str  # the role of that multiply ("" if none: a parameter's all-gather, for instance)
    phase: str  # "forward", "backward" or "recompute"
    calls: int
    bytes: int  # message bytes of all the calls together

    def row(self) -> dict[str, Any]:
        return {"kind": self.kind, "group": self.group, "module": self.module, "role": self.role,
                "phase": self.phase, "calls": self.calls, "bytes": self.bytes}


def collectives(ops: Sequence[CapturedOp],
                assignments: Mapping[CapturedOp, Assignment]) -> list[CollectiveRow]:
    """Every collective among a capture's records (``ops``, in order; ``assignments``:
    ``{record: Assignment}``, for the role a collective carries), grouped (see
    :class:`CollectiveRow`), in first-seen order."""
    link(ops)
    calls: Counter[tuple[str, int | None, str, str, str]] = Counter()
    sizes: Counter[tuple[str, int | None, str, str, str]] = Counter()
    for op in ops:
        if op.collective is None:
            continue
        kind, size, group = op.collective
        source = _carried(op, assignments)
        role = "" if source is None else max(assignments[source].parts,
                                             key=assignments[source].parts.__getitem__)
        # the caller, not the hook's parent
        module = source.module if source is not None else op.module
        key = (kind, group, module or "", role, op.phase)
        calls[key] += 1
        sizes[key] += size
    return [CollectiveRow(*key, calls[key], sizes[key]) for key in calls]


def _carried(op: CapturedOp, assignments: Mapping[CapturedOp, Assignment],
             depth: int = 8) -> CapturedOp | None:
    """The nearest multiply upstream of ``op`` through ops that do not multiply (whose
    result it carries)."""
    frontier = list(op.inputs)
    for _ in range(depth):
        for candidate in frontier:
            assignment = assignments.get(candidate)
            if assignment is not None and any(assignment.parts.values()):
                return candidate
        frontier = [arg for candidate in frontier for arg in candidate.inputs]
        if not frontier:
            break
    return None


# -------------------------------------------------------------------------------------------------- closed forms
@dataclass(frozen=True)
class PredictedCollective:
    """What a parallelism scheme's closed form says a rank sends: ``calls`` collectives
    of ``kind`` in ``phase``, ``bytes`` of messages in all; ``basis`` names the
    source."""

    kind: str
    phase: str
    calls: int
    bytes: int
    basis: str


def megatron(batch: int, tokens: int, width: int, layers: int, *, element_bytes: int,
             backward: bool = False,
             sequence_parallel: bool = False) -> list[PredictedCollective]:
    """Megatron-LM tensor parallelism (Shoeybi et al. 2019, §3: the f and g operators):
    per layer, one all-reduce of the ``[batch, tokens, width]`` activation after each
    row-parallel GEMM (attention output, FFN down) in the forward pass, and one per
    column-parallel block (its input gradient) in the backward pass. With sequence
    parallelism (Korthikanti et al. 2022, §4.2.2) each all-reduce becomes an
    all-gather and a reduce-scatter of the same volume. Messages are whole
    activations (:func:`message_bytes`)."""
    volume = batch * tokens * width * element_bytes
    basis = "Megatron-LM sequence parallel" if sequence_parallel else "Megatron-LM tensor parallel"
    phases = ("forward", "backward") if backward else ("forward",)
    out = []
    for phase in phases:
        if sequence_parallel:
            out += [PredictedCollective(ALL_GATHER, phase, 2 * layers, 2 * layers * volume, basis),
                    PredictedCollective(REDUCE_SCATTER, phase, 2 * layers, 2 * layers * volume,
                                        basis)]
        else:
            out.append(PredictedCollective(ALL_REDUCE, phase, 2 * layers, 2 * layers * volume,
                                           basis))
    return out


def fsdp(unit_bytes: Sequence[int], *, resharded: Sequence[bool] | None = None,
         backward: bool = True) -> list[PredictedCollective]:
    """FSDP (ZeRO-3; FSDP2's ``fully_shard``): every unit's parameters (``unit_bytes``,
    unsharded) are all-gathered once in the forward pass, again in the backward pass
    for each unit resharded after its forward (default: all but the first, the root,
    which FSDP2 keeps), and every gradient is reduce-scattered once."""
    again = list(resharded) if resharded is not None else [False, *([True] * (len(unit_bytes) - 1))]
    out = [PredictedCollective(ALL_GATHER, "forward", len(unit_bytes), sum(unit_bytes),
                               "FSDP: gather per forward")]
    if backward:
        gathered = [size for size, redo in zip(unit_bytes, again, strict=True) if redo]
        out += [PredictedCollective(ALL_GATHER, "backward", len(gathered), sum(gathered),
                                    "FSDP: resharded units gathered again"),
                PredictedCollective(REDUCE_SCATTER, "backward", len(unit_bytes), sum(unit_bytes),
                                    "FSDP: gradients reduce-scattered")]
    return out


def ddp(gradient_bytes: int, buckets: int = 1) -> list[PredictedCollective]:
    """DDP: every gradient all-reduced once per backward pass, in ``buckets`` messages."""
    return [PredictedCollective(ALL_REDUCE, "backward", buckets, gradient_bytes,
                                "DDP: gradient all-reduce")]
