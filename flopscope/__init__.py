"""flopscope: exact multiply counts of PyTorch models, attributed to modules and semantic roles.

    >>> import torch, flopscope
    >>> prof = flopscope.profile(torch.nn.Linear(512, 256), torch.zeros(8, 512))
    >>> prof.total() == 8 * 512 * 256          # MACs (multiply-accumulates)
    True
    >>> prof.total_flops() == 2 * prof.total()  # FLOPs = 2 x MACs
    True
"""

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
from .generation import Step
from .peers import crosscheck
from .pipeline import DenoisingStep, PipelineProfile, Workload, WorkloadTerm, profile_pipeline
from .predict.reconcile import ReconcileRow, Reconciliation, TransformerSpec
from .profile import OpRecord, Profile
from .resolution import ResolutionScaling, resolution_scaling
from .role import Role
from .roofline import Roofline, roofline
from .scaling import Polynomial, Scaling, scaling
from .training import BatchPricer, Throughput, flops_per_batch, measure_flops
from .version import __version__ as __version__
from .why_self_attention import compare, compare_lengths

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
    "profile_pipeline",
    "profiler",
    "resolution_scaling",
    "roofline",
    "scaling",
]
