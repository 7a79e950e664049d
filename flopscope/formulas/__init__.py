"""Layer 1, what one ATen op costs: pure functions of an op's arguments and shapes, and
the registry that declares each formula with its family and operand positions
(``docs/extending.md``).

- ``registry``: :class:`FormulaRegistry`, :class:`OpSpec`, :class:`OpFamily`,
  ``@formula``, the calling convention and the shape helpers; ``linear_algebra``: the
  multiply formulas of matrix products, convolutions, recurrent layers, Fourier
  transforms and their backward kernels, in MACs; ``attention``: those of the attention
  kernels (SDPA and its fused kernels, the fast paths) and their backward; ``kernels``:
  the kernels production GPUs run, by their libraries' op names (FlashAttention 2 and 3,
  Hub kernels, causal-conv1d);
- ``elementwise``: work that is not a multiply (elementwise ops, their own unit) and the
  ops known to do none;
- ``traffic``: the bytes an op must move at minimum;
- ``collectives``: what a collective op sends (kind, message bytes, group size).

May import: ``flopscope.errors``, ``flopscope.enums``, ``flopscope.role``,
``flopscope.conventions`` and this package; nothing above it. ``from flopscope.formulas
import OpFamily, mm`` is the public path of the registry.
"""

from . import attention, kernels, linear_algebra, registry
from .attention import *  # noqa: F403
from .kernels import *  # noqa: F403
from .linear_algebra import *  # noqa: F403
from .registry import *  # noqa: F403

__all__ = [*registry.__all__, *linear_algebra.__all__, *attention.__all__, *kernels.__all__]
