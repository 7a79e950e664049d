"""flopscope: exact multiply counts of PyTorch models, attributed to modules and semantic roles.

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
from .errors import (
    BudgetError,
    ConfigurationError,
    DoesNotFitError,
    FakeTensorError,
    FlopscopeError,
    FlopscopeWarning,
    FormulaError,
    ForwardError,
    InputError,
    NotAModuleError,
    NotFoundError,
    RecordingError,
    RegistryError,
    RoleError,
    RunError,
)
from .formulas.registry import REGISTRY, FormulaRegistry, OpFamily
from .predict.reconcile import ReconcileRow, Reconciliation, TransformerSpec
from .profile import OpRecord, Profile
from .role import Role
from .scaling import Polynomial, Scaling, scaling
from .version import __version__ as __version__

if TYPE_CHECKING:  # (imported when first used: __getattr__ below)
    from .generation import Step, profile_generation
    from .peers import crosscheck
    from .pipeline import DenoisingStep, PipelineProfile, Workload, WorkloadTerm, profile_pipeline
    from .resolution import ResolutionScaling, resolution_scaling
    from .roofline import Roofline, roofline
    from .training import BatchPricer, Throughput, flops_per_batch, measure_flops
    from .why_self_attention import compare, compare_lengths

_LAZY = {
    "Step": "generation", "profile_generation": "generation", "crosscheck": "peers", "DenoisingStep": "pipeline",
    "PipelineProfile": "pipeline",
    "Workload": "pipeline", "WorkloadTerm": "pipeline", "profile_pipeline": "pipeline",
    "ResolutionScaling": "resolution", "resolution_scaling": "resolution", "Roofline": "roofline",
    "roofline": "roofline", "BatchPricer": "training", "Throughput": "training", "flops_per_batch": "training",
    "measure_flops": "training", "compare": "why_self_attention", "compare_lengths": "why_self_attention",
}
"""Public names of the workloads (pipelines, training, generation, the peers, the seed study's comparison), imported
on first use: ``import flopscope`` stays as light as the profiling core (``benchmarks/import_time.py``)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flopscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # (the next access is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

__all__ = [
    "REGISTRY",
    "Assignment",
    "BatchPricer",
    "BudgetError",
    "ConfigurationError",
    "DenoisingStep",
    "DoesNotFitError",
    "FakeTensorError",
    "FlopscopeError",
    "FlopscopeWarning",
    "FormulaError",
    "FormulaRegistry",
    "ForwardError",
    "InputError",
    "NotAModuleError",
    "NotFoundError",
    "OpFamily",
    "OpRecord",
    "PipelineProfile",
    "Polynomial",
    "Profile",
    "ReconcileRow",
    "Reconciliation",
    "RecordingError",
    "RegistryError",
    "ResolutionScaling",
    "Role",
    "RoleError",
    "RoleRule",
    "Roofline",
    "RunError",
    "Scaling",
    "Step",
    "Throughput",
    "TransformerSpec",
    "Workload",
    "WorkloadTerm",
    "compare",
    "compare_lengths",
    "crosscheck",
    "flops_per_batch",
    "measure_flops",
    "profile",
    "profile_generation",
    "profile_pipeline",
    "profiler",
    "resolution_scaling",
    "roofline",
    "scaling",
]
