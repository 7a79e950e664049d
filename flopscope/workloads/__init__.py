"""Layer 9, ways of running a model, each counted through :func:`flopscope.profile` or its engine.

- ``training``: steps of a training loop, MFU and HFU; ``generation`` and ``decoding``: prefill and decode steps;
- ``pipeline`` (with ``pipeline_configs``): diffusion pipelines, per image and per video; ``resolution``: their
  costs against the image size;
- ``scaling`` and ``symbolic``: counts as exact polynomials in the sequence length;
- ``distributed``: sharded models, per rank; ``roofline``: a profile's time bound on a device.

May import: the entry point (``flopscope.api``), the façade and every layer below.
"""
