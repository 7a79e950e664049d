"""Pass 3, logits (docs/roles.md section 3.3).

Claims ``embedding`` (0 MACs) for every table lookup, and ``logits`` for a weight matmul
onto the vocabulary: its weight is a token table (tied) or has its shape, and no weight
matmul takes its result.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...capture.records import CapturedOp
from ...formulas.elementwise import EMBEDDING_LOOKUPS
from ...role import Role
from ..graph_view import GraphView, reach
from ..state import RoleState
from ._walks import writes_back


def logits(view: GraphView, state: RoleState) -> None:
    """A weight matmul onto the vocabulary: its weight is a token-embedding table (tied)
    or has its shape and no weight matmul takes its result (the last projection), and
    its output has one column per token of that table. Token tables are those looked
    up with indices that come from the inputs (position tables are looked up with
    ``arange``). A matmul on one vector per sample pooled from the positions (a
    sequence classifier) matches a table's shape only if that table is the vocabulary
    (the largest): a classifier whose labels are as many as the token types is no LM
    head. The model's last projection onto the whole vocabulary is logits whatever
    its input width (RemBERT decouples its output embeddings' width from its input
    embeddings')."""
    tables: dict[Any, int] = {}  # leaf name or ("shape", shape) -> vocabulary size
    for n in view.nodes:
        if view.packet(n) not in EMBEDDING_LOOKUPS:
            continue
        weight, indices = n.args[0], n.args[1] if len(n.args) > 1 else None
        if isinstance(weight, CapturedOp) and isinstance(indices, CapturedOp) and view.dynamic[indices]:
            shape = tuple(weight.output_shapes[0])
            if len(shape) == 2:
                tables[_leaf_key(weight)] = shape[0]
                tables[("shape", shape)] = shape[0]
        state.claim(n, {Role.EMBEDDING.value: 0})
    if not tables:
        return
    vocabulary = max(tables.values())
    shapes = [key[1] for key in tables if isinstance(key, tuple) and key[0] == "shape"]
    for n in view.nodes:
        if not view.is_weight_matmul(n) or state.claimed(n):
            continue
        width = n.output_shapes[0][-1:]
        leaves = view.leaves_of(view.weight_operand(n))
        tied = {_leaf_key(x) for x in leaves} & tables.keys()
        shaped = {rows for x in leaves for rows in _leading_rows_of(x, shapes)}
        if view.pooled(n):
            # one vector per sample pooled from the positions: a classifier, unless the
            # table it has the shape of is the vocabulary
            shaped = {rows for rows in shaped if rows[1] == vocabulary}
        # onto the whole vocabulary, from another width (not an FFN's down projection
        # as wide as a small vocabulary)
        decoupled = vocabulary in width and not view.pooled(n) and not writes_back(view, n)
        if any(tables[key] in width for key in tied) or (
                (decoupled or any(rows in width for rows, _ in shaped)) and not _feeds_a_weight_matmul(view, n)):
            state.claim(n, Role.LOGITS)


EXTRA_ROWS = 8
"""A token table may hold up to one row in this many beyond the tokens its untied LM
head predicts (Llama 3.2 Vision's image tokens, CPM-Ant's prompt tokens): the head's
weight matches the table's leading rows."""


def _leading_rows_of(leaf: CapturedOp, shapes: Iterable[tuple[int, ...]]) -> list[tuple[int, int]]:
    """``(rows, table rows)`` for each token table (``shapes``: the tables' shapes)
    whose leading rows ``leaf`` (a weight ``[rows, d]``) has the shape of: as wide,
    with as many rows or up to one in :data:`EXTRA_ROWS` fewer."""
    shape = tuple(leaf.output_shapes[0]) if leaf.output_shapes else ()
    if len(shape) != 2 or not all(type(s) is int for s in shape):
        return []
    rows, width = shape
    return [(rows, table_rows) for table_rows, table_width in shapes
            if table_width == width and table_rows - table_rows // EXTRA_ROWS <= rows <= table_rows]


def _feeds_a_weight_matmul(view: GraphView, n: CapturedOp) -> bool:
    """Some weight matmul takes ``n``'s result (through any ops): ``n`` is not the
    model's last projection. Tells an untied LM head from an FFN up projection whose
    width happens to equal the vocabulary."""
    return view.cached("feeds_weight_matmul", n, lambda: any(
        view.is_weight_matmul(x) for x in reach(view.users(n), view.users,
                                                lambda x: not view.is_weight_matmul(x))))


def _leaf_key(n: CapturedOp) -> Any:
    return ("leaf", n.target) if n.node_op == "get_attr" else ("node", n)
