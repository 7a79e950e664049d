"""Role rules: what dataflow cannot see, said by module type or module path.

- :class:`RoleRule`: a role forced on the multiplies run inside matching modules;
- :data:`BUILTIN_RULES`: the rules every profile applies (recurrent modules).

The passes that apply them are in :mod:`flopscope.attribute.passes.other` (docs/roles.md
section 3.7).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from torch import nn

from ..role import Role, parse_role


@dataclass(frozen=True)
class RoleRule:
    """Force a role on the multiplies run inside matching modules.

    ``module``: an ``fnmatch`` pattern over module paths (``"blocks.*.mixer"``) or a
    module class (instances and subclasses match). ``op``: restrict to one op name
    (``"aten.bmm"``), optional. User rules (``roles=`` of :func:`flopscope.profile`)
    apply after the dataflow passes and win.
    """

    module: str | type
    role: Role | str
    op: str | None = None

    def __post_init__(self) -> None:
        # an unknown role name is an error here, not at the end of a profile
        parse_role(self.role)

    def matches(self, path: str, module_type: type | None, op: str) -> bool:
        if self.op is not None and self.op != op:
            return False
        if isinstance(self.module, str):
            return fnmatch.fnmatchcase(path, self.module)
        return module_type is not None and issubclass(module_type, self.module)


BUILTIN_RULES: tuple[RoleRule, ...] = (
    RoleRule(nn.RNNBase, Role.RECURRENT),
    RoleRule(nn.RNNCellBase, Role.RECURRENT),
)
"""Every multiply inside a recurrent module is ``recurrent``."""
