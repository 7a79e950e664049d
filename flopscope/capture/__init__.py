"""Layer 2, run the model and record its ops: what executed, never what it means.

- ``records``: :class:`~flopscope.capture.records.CapturedOp` (one op, its dataflow and versions, its cost), the
  fx graph built from them and :class:`~flopscope.capture.records.Capture`, what one run produced;
- ``recorder``: the dispatch mode that records every ATen op, with its cost from the formulas;
- ``module_tracker``: which module call is running; ``facts``: what the model declares, read before it runs;
- ``fake``: the model's state and inputs as fake tensors; ``state``: the model put back as it was;
  ``model_caches``: fake tensors kept out of the model code's caches; ``undispatched``: work that never reached
  the dispatcher; ``compiled``: compiled and exported models; ``checks``: validators of flopscope's arguments;
- ``replay``: a repeated call replayed from an earlier call's records where they are provably the same; inside it
  ``replay.attribute_reads``: which plain attributes of its modules a call reads (what a block is keyed on), and
  ``replay.given_objects``: the methods of the objects a block is given (a KV cache) that it calls, which a replay
  calls again;
- ``catalog``: kernels launched outside the dispatcher (Triton, pybind), counted at their ``autograd.Function``;
  ``launches``: Triton kernels launched from plain functions, counted (or listed by name) at the launch;
  ``scoped_patch``: a patch held while any thread needs it, with each thread's own values (what both wrap).

May import: ``flopscope.formulas`` and the vocabulary (``errors``, ``enums``, ``role``, ``conventions``); never
the role passes, the predictions, the renderers or the façade.
"""
