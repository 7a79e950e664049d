"""Layer 2, what the hardware offers: datasheet peaks and measured ones, and the memory
a real run needs.

- ``peaks``: peak FLOP/s and bandwidth by device and dtype (datasheet tables, a measured
  CPU GEMM);
- ``memory``: whether a real run fits where it would allocate (bytes of state, free
  memory).

May import: the vocabulary only.
"""
