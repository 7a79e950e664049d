"""flopscope: exact multiply counts of PyTorch models, attributed to modules (and, later, roles).

    >>> import torch, flopscope
    >>> prof = flopscope.profile(torch.nn.Linear(512, 256), torch.zeros(8, 512))
    >>> prof.total() == 8 * 512 * 256          # MACs (multiply-accumulates)
    True
    >>> prof.total_flops() == 2 * prof.total()  # FLOPs = 2 x MACs
    True
"""

from .api import profile, profiler
from .errors import (
    FakeTensorError,
    FlopscopeError,
    FlopscopeWarning,
    ForwardError,
    InputError,
    NotAModuleError,
    RegistryError,
)
from .formulas import REGISTRY, FormulaRegistry
from .layer_types import compare, compare_lengths
from .peers import crosscheck
from .profile import OpRecord, Profile
from .reconcile import ReconcileRow, Reconciliation, TransformerSpec
from .roles import Role, RoleRule
from .scaling import Polynomial, Scaling, scaling

__version__ = "0.1.0"

__all__ = [
    "REGISTRY",
    "FakeTensorError",
    "FlopscopeError",
    "FlopscopeWarning",
    "FormulaRegistry",
    "ForwardError",
    "InputError",
    "NotAModuleError",
    "OpRecord",
    "Polynomial",
    "Profile",
    "ReconcileRow",
    "Reconciliation",
    "RegistryError",
    "Role",
    "RoleRule",
    "Scaling",
    "TransformerSpec",
    "compare",
    "compare_lengths",
    "crosscheck",
    "profile",
    "profiler",
    "scaling",
]
