"""An analytic tool's FLOPs beside flopscope's, row by row, each difference named.

A row covers some of the tool's terms and the flopscope roles they price. Its
difference (tool minus flopscope, FLOPs) is split into causes by walking the tool's
chain of fixes (:class:`~flopscope.predict.serving_tools._tool.Tool`): the tool's
formula with the first k causes fixed, for k = 0 .. n; cause k gets what its fix moves
in the row. What the fully fixed formula still misses of flopscope's count is
``"unexplained"``. So the causes of a row sum to its difference exactly, and the rows'
differences to the total's.

flopscope's side is its MACs by role, doubled (FLOPs = 2 x MACs), under its default
attention convention ``executed``: the attention core is the whole ``t x (c + t)`` block
the kernels compute, causal mask or not; a decode step attends to ``c + 1`` keys (the
cache and its own); only the last position's logits are computed, as ``generate()``
does with ``logits_to_keep=1``. Take them from
``flopscope.workloads.cost_model(model).request(prompt, 0)`` for a prefill and
``.request(1, context)`` for a decode step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from ._dims import read
from ._tool import PHASES, UNEXPLAINED, Tool

__all__ = ["Row", "explain"]


@dataclass(frozen=True)
class Row:
    """One term (or group of terms) of a tool beside the flopscope roles it prices.

    ``tool_flops`` and ``flopscope_flops`` in FLOPs; ``difference = tool_flops -
    flopscope_flops``; ``causes``: (cause, FLOPs) pairs that sum to the difference
    (empty when it is 0)."""

    term: str
    tool_terms: tuple[str, ...]
    roles: tuple[str, ...]
    tool_flops: int
    flopscope_flops: int
    causes: tuple[tuple[str, int], ...]

    @property
    def difference(self) -> int:
        return self.tool_flops - self.flopscope_flops

    @property
    def cause(self) -> str:
        """The causes' names, ``"; "``-joined (``""`` for no difference)."""
        return "; ".join(name for name, _ in self.causes)


def explain(tool: Tool, flopscope_macs_by_role: Mapping[str, int], config: Mapping[str, Any], *,
            phase: str, prompt: int, context: int) -> list[Row]:
    """``tool``'s FLOPs for ``config`` against flopscope's MACs by role (doubled), one
    :class:`Row` per row of the tool; a last row ``"not modelled"`` holds the roles and
    terms no row covers. ``phase``: ``"prefill"`` (``prompt`` tokens, an empty cache) or
    ``"decode"`` (one token on a cache of ``context``)."""
    if phase not in tool.phases:
        raise ConfigurationError(f"{tool.name} has no {phase} phase; it has {', '.join(tool.phases)}"
                                 if phase in PHASES else f"phase is one of {PHASES}, not {phase!r}")
    dims = read(config)
    steps = [tool.terms(dims, phase, prompt, context, frozenset(tool.chain[:k]))
             for k in range(len(tool.chain) + 1)]
    table = list(tool.rows(dims))
    named_terms = {term for _, terms, _ in table for term in terms}
    named_roles = {role for _, _, roles in table for role in roles}
    rest_terms = tuple(sorted({term for step in steps for term in step} - named_terms))
    rest_roles = tuple(sorted(role for role in flopscope_macs_by_role if role not in named_roles))
    table.append(("not modelled", rest_terms, rest_roles))
    rows: list[Row] = []
    for name, terms, roles in table:
        values = [sum(step.get(term, 0) for term in terms) for step in steps]
        ours = 2 * sum(int(flopscope_macs_by_role.get(role, 0)) for role in roles)
        causes = [(cause, values[k] - values[k + 1]) for k, cause in enumerate(tool.chain)]
        causes.append((UNEXPLAINED, values[-1] - ours))
        rows.append(Row(name, terms, roles, values[0], ours, tuple((c, v) for c, v in causes if v)))
    return [row for row in rows if row.tool_flops or row.flopscope_flops or row.causes]
