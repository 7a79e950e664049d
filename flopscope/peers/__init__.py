"""The counters people already use, checked against flopscope, and plug-ins that fix
them.

Units: **MACs** (multiply-accumulates) everywhere; FLOPs = 2 x MACs, and only PyTorch's
``FlopCounterMode`` speaks FLOPs (its counts are halved here, its plug-in formulas
return ``2 x MACs``). fvcore's "flop" is one fused multiply-add, i.e. a MAC; thop's
``total_ops`` are MACs for its GEMM and convolution rules and elementwise operation
counts for its norm / softmax / pooling rules.

:func:`crosscheck` runs flopscope (``mode="real"``) and every peer that is installed on
the same model and inputs, and explains each peer's difference from evidence per op
(``FlopCounterMode``, fvcore) or per module (thop): which work it does not count, which
roles that work carries in flopscope's records, and where; whatever that evidence does
not show is reported as unexplained, never forced to add up.

The plug-ins are built from flopscope's formula registry
(:data:`flopscope.formulas.registry.REGISTRY`), so each tool counts what flopscope
counts:

- :func:`flop_counter_mapping`:
  ``FlopCounterMode(custom_mapping=flop_counter_mapping())``;
- :func:`fvcore_handles` / :func:`fvcore_analysis`: op handles for fvcore's
  ``FlopCountAnalysis``;
- :func:`thop_custom_ops`: ``thop.profile(model, inputs,
  custom_ops=thop_custom_ops())``.

Layout: :mod:`.common` (the results, :func:`crosscheck`, the tool table), and one module
per peer holding its runner and its plug-in: :mod:`.flop_counter`, :mod:`.fvcore`,
:mod:`.thop`. The peers themselves are imported lazily, inside the functions; a peer
that is not installed is skipped.
"""

from .common import TOOLS, Crosscheck, Difference, PeerCount, crosscheck
from .flop_counter import flop_counter_mapping
from .fvcore import FvcoreHandle, fvcore_analysis, fvcore_handles
from .thop import ThopRule, thop_custom_ops

__all__ = [
    "TOOLS",
    "Crosscheck",
    "Difference",
    "FvcoreHandle",
    "PeerCount",
    "ThopRule",
    "crosscheck",
    "flop_counter_mapping",
    "fvcore_analysis",
    "fvcore_handles",
    "thop_custom_ops",
]
