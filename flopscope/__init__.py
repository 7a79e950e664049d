"""flopscope: exact multiply counts of PyTorch models, attributed to modules and
semantic roles.

    >>> import torch, flopscope
    >>> prof = flopscope.profile(torch.nn.Linear(512, 256), torch.zeros(8, 512))
    >>> prof.total() == 8 * 512 * 256          # MACs (multiply-accumulates)
    True
    >>> prof.total_flops() == 2 * prof.total()  # FLOPs = 2 x MACs
    True
"""

import importlib
from typing import TYPE_CHECKING, Any

from .api import profile, profiler
from .attribute.roles import Assignment, RoleRule
from .errors import FlopscopeError, FlopscopeWarning
from .formulas.registry import REGISTRY, FormulaRegistry, OpFamily
from .predict.reconcile import ReconcileRow, Reconciliation, TransformerSpec
from .profile import OpRecord, Profile
from .role import Role
from .version import __version__ as __version__
from .workloads.scaling import Polynomial, Scaling, scaling

if TYPE_CHECKING:  # (imported when first used: __getattr__ below)
    from .peers import crosscheck
    from .studies.why_self_attention import compare
    from .workloads import Throughput, measure_flops, profile_generation, profile_pipeline, roofline

_LAZY = {
    "crosscheck": "peers", "compare": "studies.why_self_attention",
    "compare_lengths": "studies.why_self_attention",
    **dict.fromkeys(["BatchPricer", "DenoisingStep", "PipelineProfile", "ResolutionScaling",
                     "Roofline", "Step",
                     "Throughput", "Workload", "WorkloadTerm", "flops_per_batch", "measure_flops",
                     "profile_generation", "profile_pipeline", "resolution_scaling", "roofline"],
                    "workloads"),
    **dict.fromkeys(["BudgetError", "ConfigurationError", "DoesNotFitError", "FakeTensorError",
                     "FormulaError",
                     "ForwardError", "InputError", "NotAModuleError", "NotFoundError",
                     "RecordingError",
                     "RegistryError", "RoleError", "RunError"], "errors"),
}
"""Names imported on first use, from the module that holds them: the workloads
(pipelines, training, generation), the peers and the seed study's comparison, so that
``import flopscope`` stays as light as the profiling core
(``benchmarks/import_time.py``); and the aliases kept for one release of names now
reached through their folder (``flopscope.errors.RunError``,
``flopscope.workloads.PipelineProfile``)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flopscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # (the next access is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

# the public surface: the entry points, the result and its vocabulary, the most used
# workloads
__all__ = [
    "REGISTRY",
    "Assignment",
    "FlopscopeError",
    "FlopscopeWarning",
    "FormulaRegistry",
    "OpFamily",
    "OpRecord",
    "Polynomial",
    "Profile",
    "ReconcileRow",
    "Reconciliation",
    "Role",
    "RoleRule",
    "Scaling",
    "Throughput",
    "TransformerSpec",
    "compare",
    "crosscheck",
    "measure_flops",
    "profile",
    "profile_generation",
    "profile_pipeline",
    "profiler",
    "roofline",
    "scaling",
]
"""25 names. The error classes are reached as ``flopscope.errors.*`` and the other
workload names as ``flopscope.workloads.*``; their top-level names
(``flopscope.RunError``, ``flopscope.PipelineProfile``, ...) stay as aliases outside
``__all__`` for one release (CHANGELOG)."""
