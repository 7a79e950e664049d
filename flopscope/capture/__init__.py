"""Layer 3, run the model and record its ops: what executed, never what it means.

The front door, as ``torch.export.export() -> ExportedProgram`` is export's:

- :func:`capture` ``(model, args, kwargs, plan) -> CaptureResult``: one counted run,
  recorded without roles (:mod:`.engine`);
- :class:`CapturePlan`: what to count and how, planned before the run, which raises
  every refusal known then (:mod:`.plan`);
- :class:`Session`: every forward of a block of the caller's calls
  (``flopscope.profiler``);
- :class:`CaptureResult`: the records (:class:`Capture`), the model's facts, the mode,
  the output and the notes;
- :class:`CapturedOp`: one op, its dataflow and versions, its cost; :class:`LeafKind`:
  what a graph input is (a parameter, a buffer, an input).

Beside it, what the workloads use: the modes (:data:`MODES`, :data:`BLOCK_MODES`), the
converters of a sweep (:func:`new_converter`, :func:`fake_converter`) and
:func:`paused_gc`.

The modules behind it:

- ``records``: :class:`~flopscope.capture.records.CapturedOp`, the fx graph built from
  them and :class:`~flopscope.capture.records.Capture`, what one run produced;
- ``recorder``: the dispatch mode that records every ATen op, with its cost from the
  formulas;
- ``module_tracker``: which module call is running; ``facts``: what the model declares,
  read before it runs;
- ``fake``: the model's state and inputs as fake tensors; ``state``: the model put back
  as it was; ``model_caches``: fake tensors kept out of the model code's caches;
  ``undispatched``: work that never reached the dispatcher; ``compiled``: compiled and
  exported models; ``checks``: validators of flopscope's arguments;
- ``replay``: a repeated call replayed from an earlier call's records where they are
  provably the same; inside it ``replay.attribute_reads``: which plain attributes of its
  modules a call reads (what a block is keyed on), and ``replay.given_objects``: the
  methods of the objects a block is given (a KV cache) that it calls, which a replay
  calls again;
- ``catalog``: kernels launched outside the dispatcher (Triton, pybind), counted at
  their ``autograd.Function``; ``launches``: Triton kernels launched from plain
  functions, counted (or listed by name) at the launch; ``scoped_patch``: a patch held
  while any thread needs it, with each thread's own values (what both wrap);
- ``_process``: the process-wide switches held while capturing; ``_explain``: an error
  of the run rebuilt as the error that names its module, op and shapes.

May import: ``flopscope.formulas``, ``flopscope.hardware`` and the vocabulary
(``errors``, ``enums``, ``role``, ``conventions``); never the role passes, the
predictions, the renderers or the façade.
"""

from ._process import paused_gc
from .engine import CaptureResult, Session, capture
from .plan import BLOCK_MODES, MODES, CapturePlan, fake_converter, new_converter
from .records import Capture, CapturedOp, LeafKind

__all__ = [
    "BLOCK_MODES",
    "MODES",
    "Capture",
    "CapturePlan",
    "CaptureResult",
    "CapturedOp",
    "LeafKind",
    "Session",
    "capture",
    "fake_converter",
    "new_converter",
    "paused_gc",
]
