"""Layer 10, FLOP counts in test suites: budgets, the pytest plug-in, and invariants a
count must keep.

- ``budgets``: :func:`assert_macs`, :class:`FlopBudget` and :func:`diff_table`
  (re-exported here);
- ``pytest_plugin``: the ``flop_budget`` fixture and ``--flop-budget-update`` (the
  ``pytest11`` entry point);
- ``invariants``: the same count on every path (modes, attention implementations,
  conventions) and the roles that must balance in every standard layer.

May import: the workloads, the entry points, the façade and every layer below.
"""

from .budgets import FlopBudget, assert_macs, diff_table

__all__ = ["FlopBudget", "assert_macs", "diff_table"]
