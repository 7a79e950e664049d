"""Layer 10, the seed study measured: self-attention beside convolution, recurrence and
a fully-connected layer.

- ``models``: the small modules the study compares; ``why_self_attention``: ``flopscope
  demo`` and ``flopscope.compare``, each architecture counted and its closed form beside
  it.

May import: the workloads, the entry points, the façade and every layer below.
"""
