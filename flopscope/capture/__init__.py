"""Layer 2, run the model and record its ops: what executed, never what it means.

- ``recorder``: the dispatch mode that records every ATen op (:class:`~flopscope.capture.recorder.CapturedOp`,
  its dataflow and versions, its cost from the formulas) and :class:`~flopscope.capture.recorder.Capture`, what
  one run produced;
- ``module_tracker``: which module call is running; ``facts``: what the model declares, read before it runs;
- ``fake``: the model's state and inputs as fake tensors; ``state``: the model put back as it was;
  ``model_caches``: fake tensors kept out of the model code's caches; ``undispatched``: work that never reached
  the dispatcher; ``compiled``: compiled and exported models; ``checks``: validators of flopscope's arguments.

May import: ``flopscope.formulas`` and the vocabulary (``errors``, ``enums``, ``role``, ``conventions``); never
the role passes, the predictions, the renderers or the façade.
"""
