"""Layer 4, a role for every multiply, from the captured dataflow, never module names.

The front door, what other stages import (:data:`__all__`):

- :func:`find_roles`: the role split of every record with multiplies of a capture;
- :class:`Assignment`: one record's roles (``{role: MACs}``) and its block;
- :class:`RoleRule`: a role forced on the multiplies inside matching modules.

The modules:

- ``roles``: :func:`find_roles` and :class:`Assignment` (also importable from here);
- ``pipeline``: the passes in the order they run, one tuple;
- ``passes/``: one module a pass (what each claims: its docstring);
- ``state``: ``RoleState``, what the passes claim and ask for;
- ``rules``: :class:`RoleRule` and the built-in rules;
- ``graph_view``: the records as a graph, and the walks the passes are written with;
- ``columns``: a fused projection split by the columns each consumer reads;
- ``carried``: roles found once and carried, to a replayed call's records from the call
  they copy, to a sweep's other lengths from a template (``alignment`` pairs the
  records);
- ``paths``: module paths (``""`` is the root);
- ``tally``: a capture's records summed once for the profile's queries;
- ``op_record``: :class:`OpRecord`, one counted op as a user reads it.

May import: ``flopscope.capture`` (its records), ``flopscope.formulas``, the vocabulary.
"""

from .roles import Assignment, find_roles
from .rules import RoleRule

__all__ = ["Assignment", "RoleRule", "find_roles"]
