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
from .version import __version__ as __version__
from .workloads.scaling import Polynomial, Scaling, scaling

if TYPE_CHECKING:  # (imported when first used: __getattr__ below)
    from .peers import crosscheck
    from .studies.why_self_attention import compare, compare_lengths
    from .workloads.generation import Step, profile_generation
    from .workloads.pipeline import DenoisingStep, PipelineProfile, Workload, WorkloadTerm, profile_pipeline
    from .workloads.resolution import ResolutionScaling, resolution_scaling
    from .workloads.roofline import Roofline, roofline
    from .workloads.training import BatchPricer, Throughput, flops_per_batch, measure_flops

_LAZY = {
    "Step": "workloads.generation", "profile_generation": "workloads.generation", "crosscheck": "peers",
    "DenoisingStep": "workloads.pipeline", "PipelineProfile": "workloads.pipeline", "Workload": "workloads.pipeline",
    "WorkloadTerm": "workloads.pipeline", "profile_pipeline": "workloads.pipeline",
    "ResolutionScaling": "workloads.resolution", "resolution_scaling": "workloads.resolution",
    "Roofline": "workloads.roofline", "roofline": "workloads.roofline", "BatchPricer": "workloads.training",
    "Throughput": "workloads.training", "flops_per_batch": "workloads.training", "measure_flops": "workloads.training",
    "compare": "studies.why_self_attention", "compare_lengths": "studies.why_self_attention",
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
