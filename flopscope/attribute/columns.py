"""Column replay: which output columns of a fused projection reach each of its
consumers.

A projection feeding several roles (``nn.MultiheadAttention.in_proj``, GPT-2 ``c_attn``,
GPT-NeoX ``query_key_value`` with per-head interleaving, a fused ``gate_up_proj``) is
split by output columns: the index of every column is replayed through the zero-cost ops
(views, splits, slices, transposes, copies) between the projection and a consumer, on
small ``int64`` label tensors, and each role is charged exactly its columns. Elementwise
ops keep the labels of their input; any other op passes on the set of labels it
received.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..capture.recorder import INDEX_DTYPES, UNINITIALISED
from ..capture.records import CapturedOp, Cost, after_write
from ..formulas.elementwise import VALUE_COPIES
from ..formulas.registry import OpFamily
from ..role import ROLE_ORDER, Role
from .graph_view import inputs_of, is_channelwise_conv, reach

aten = torch.ops.aten

IDENTITY_OPS = VALUE_COPIES | {aten.copy}
"""Ops whose output columns are their first input's (``copy``: the functional form of
``copy_``)."""

REPLAY_ERRORS = (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError)
"""What replaying an op on label tensors may raise: it needs real data (an index
tensor), or does not take int64; the labels then pass on as a set."""

Labels = Any  # a label tensor, a list of them (a multi-output op), or a set of labels
MAX_COUNTED_LABEL = 1 << 24
"""Labels below this are collected by counting (``bincount`` allocates one slot per
value up to the largest); larger values, which no real column index reaches, by
sorting."""


def feature_axis(p: CapturedOp) -> int:
    """The axis of ``p``'s output that holds its columns: a convolution's channels (dim
    1), else the last dim."""
    return 1 if p.spec is not None and p.spec.family is OpFamily.CONV else -1


def columns(p: CapturedOp, target: CapturedOp) -> set[int]:
    """Which output columns (last dim; a convolution's channels) of ``p`` reach
    ``target``."""
    return {c for c in _union([_column_labels(p, target)]) if c >= 0}


def holds_columns_along(p: CapturedOp, target: CapturedOp, axis: int) -> bool | None:
    """Whether ``axis`` of ``target`` runs over ``p``'s output columns (a head's
    features: the labels change along it) rather than its rows (positions: every
    entry along it holds the same column). ``None`` where the labels did not reach
    ``target`` as a tensor."""
    found = _column_labels(p, target)
    if not isinstance(found, torch.Tensor) or not found.dim() or not found.numel():
        return None
    along = found.movedim(axis, -1)
    return bool((along != along[..., :1]).any())


def _column_labels(p: CapturedOp, target: CapturedOp) -> Labels:
    """Each output column's index replayed from ``p`` to ``target``: a label tensor of
    ``target``'s shape, or a set where an op between could not be replayed."""
    shape = tuple(p.output_shapes[0])
    axis = feature_axis(p) % len(shape)
    index = torch.arange(shape[axis]).reshape(*([1] * axis), shape[axis],
                                              *([1] * (len(shape) - axis - 1)))
    labels: dict[CapturedOp, Labels] = {p: index.expand(shape)}
    for n in _between(p, target):
        labels[n] = _replay(n, labels)
    return labels.get(target, set())


def split_by_columns(p: CapturedOp, wanted: Sequence[tuple[CapturedOp, str]],
                     macs: int) -> dict[str, int]:
    """Charge each role the MACs of the output columns of ``p`` that reach its consumer;
    columns no consumer takes are ``other``. A role wanted twice for one column keeps
    the first in role order.

    The consumers are replayed in that order, nearest first, until every column is
    taken: the later ones could take none."""
    width = int(p.output_shapes[0][feature_axis(p)])
    found: list[tuple[set[int], str]] = []
    taken: set[int] = set()
    for target, role in sorted(wanted, key=lambda tr: (ROLE_ORDER.index(tr[1]), tr[0].index)):
        if len(taken) == width:
            break
        reached = columns(p, target)
        found.append((reached, role))
        taken.update(c for c in reached if c < width)
    return _charge(width, found, macs)


def split_by_rows(p: CapturedOp, x: CapturedOp, wanted: Sequence[tuple[CapturedOp, str]], macs: int
                  ) -> dict[str, int]:
    """Charge each role the MACs of the rows of ``p`` (the columns of its input ``x``,
    the contracted dim) that hold the values of its source; rows no source holds are
    ``other``. A row wanted twice keeps the first role in role order."""
    return _charge(int(x.output_shapes[0][-1]),
                   [(held_by(source, x), role) for source, role in wanted], macs)


def _charge(width: int, wanted: Sequence[tuple[set[int], str]], macs: int) -> dict[str, int]:
    """``macs // width`` per index to the role that wants it (the first in role order
    where several do), ``other`` for indices no one wants, the remainder to the
    largest part."""
    # each role's indices (those an earlier role in role order took are not its), the
    # roles in the order of their first index
    valid = set(range(width))
    taken: set[int] = set()
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for indices, role in sorted(wanted, key=lambda ir: ROLE_ORDER.index(ir[1])):
        mine = (indices & valid) - taken
        if mine:
            count[role] = count.get(role, 0) + len(mine)
            first[role] = min(first.get(role, width), min(mine))
            taken |= mine
    if len(taken) < width:
        other = Role.OTHER.value
        count[other] = count.get(other, 0) + width - len(taken)
        first[other] = min(first.get(other, width), next(c for c in range(width) if c not in taken))
    parts = {role: count[role] * (macs // width) for role in sorted(count, key=first.__getitem__)}
    return spread_remainder(parts, macs)


def held_by(source: CapturedOp, target: CapturedOp) -> set[int]:
    """Which columns (last dim) of ``target`` hold values of ``source`` (a
    concatenation's part), replayed on labels. The replay runs on tensors of the full
    shapes (a single-stream DiT block at 1024²: hundreds of MB), so its answer is
    kept per path (:func:`_path_key`): the same ops on the same shapes give the same
    columns in every block and every call."""
    between = _between(source, target)
    key = _path_key(source, target, between)
    found_before = _HELD_BY.get(key) if key is not None else None
    if found_before is not None:
        return set(found_before)
    labels: dict[CapturedOp, Labels] = {source: torch.zeros(tuple(source.output_shapes[0]),
                                                            dtype=torch.long)}
    for n in between:
        labels[n] = _replay(n, labels)
    found = labels.get(target)
    held = (set() if not isinstance(found, torch.Tensor) or not found.dim() else
            {int(c) for c in torch.nonzero((found.reshape(-1, found.shape[-1]) == 0).any(0)).flatten()})
    if key is not None:
        if len(_HELD_BY) >= _MAX_KEPT_PATHS:
            _HELD_BY.clear()
        _HELD_BY[key] = frozenset(held)
    return held


_HELD_BY: dict[tuple[Any, ...], frozenset[int]] = {}  # path key -> what held_by found on it
_MAX_KEPT_PATHS = 4096


def _path_key(source: CapturedOp, target: CapturedOp,
              between: Sequence[CapturedOp]) -> tuple[Any, ...] | None:
    """What a replay from ``source`` to ``target`` depends on: each op between (its
    target, cost, output shapes and arguments, a record on the path by its position,
    one off it by its shape and known values), ``None`` where an argument cannot be
    keyed."""
    if any(n.target is after_write for n in between):
        return None  # (a write's replay follows view chains off the path: not keyed)
    at = {source: 0, **{n: i for i, n in enumerate(between, 1)}}

    def argument(a: Any) -> Any:
        if isinstance(a, CapturedOp):
            if a in at:
                return ("path", at[a])
            value = a.value
            return ("off", a.output_shapes, None if value is None else
                    (value.dtype, tuple(value.shape), tuple(value.flatten().tolist())))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(argument(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, argument(v)) for k, v in a.items()))
        return a

    try:
        key = (source.output_shapes, at.get(target), tuple(
            (n.node_op, n.target, n.cost, n.output_shapes,
             n.spec.family if n.spec is not None else None,
             argument(n.args), argument(n.kwargs)) for n in between))
        hash(key)
    except TypeError:
        return None
    return key


def spread_remainder(parts: dict[str, int], total: int,
                     largest: str | None = None) -> dict[str, int]:
    """``parts`` with what they miss of ``total`` (integer division) added to
    ``largest`` (default: the largest part)."""
    missing = total - sum(parts.values())
    if missing:
        parts[largest if largest is not None else max(parts, key=parts.__getitem__)] += missing
    return parts


def scale_parts(parts: Mapping[str, int], total: int) -> dict[str, int]:
    """``parts`` rescaled to sum to ``total`` exactly (the remainder to the largest
    part)."""
    if len(parts) == 1:  # (no arithmetic: a symbolic total stays as it is)
        return {role: total for role in parts}
    whole = sum(parts.values())
    return spread_remainder({role: macs * total // whole for role, macs in parts.items()}, total,
                            largest=max(parts, key=parts.__getitem__))


def _between(p: CapturedOp, target: CapturedOp) -> list[CapturedOp]:
    """Nodes on paths from ``p`` to ``target`` (excluding ``p``), in graph order."""
    # (an op's inputs ran before it: nothing before p is on a path from p)
    ancestors = set(reach([target], inputs_of, lambda x: x is not p and x.index > p.index)) - {p}
    descendants = [x for x in reach(p.users, lambda x: x.users, lambda x: x in ancestors) if x in ancestors]
    return sorted(descendants, key=lambda x: x.index)


def _replay(n: CapturedOp, labels: Mapping[CapturedOp, Labels]) -> Labels:
    inputs = [labels[a] for a in n.inputs if a in labels]
    if n.node_op != "call_function" or any(isinstance(x, set) for x in inputs):
        return _union(inputs)
    if n.target is operator.getitem:
        source = labels.get(n.args[0]) if isinstance(n.args[0], CapturedOp) else None
        index = n.args[1]
        return source[index] if isinstance(source, (list, tuple)) and isinstance(index, int) else _union(inputs)
    out_shape = tuple(n.output_shapes[0]) if n.output_shapes else ()
    if n.target is after_write:
        return _replay_write(n, labels, inputs, out_shape)
    if n.cost is Cost.ZERO:
        return _replay_zero_cost(n, labels, inputs, out_shape)
    if is_channelwise_conv(n) and isinstance(labels.get(n.args[0]), torch.Tensor):
        return _replay_channelwise(labels[n.args[0]], out_shape, inputs)
    if n.cost is Cost.ELEMENTWISE and isinstance(inputs[0], torch.Tensor):
        first = inputs[0]
        try:
            result = first if tuple(first.shape) == out_shape else first.expand(out_shape)
        except RuntimeError:
            return _union(inputs)
        # an op with several outputs (eval batch norm: the output, then its statistics)
        # labels its first
        return [result, *[set() for _ in n.output_shapes[1:]]] if len(n.output_shapes) > 1 else result
    return _union(inputs)


def _replay_write(n: CapturedOp, labels: Mapping[CapturedOp, Labels], inputs: list[Labels],
                  out_shape: tuple[int, ...]) -> Labels:
    """A version record (``after_write(before, write)``): the labels of the tensor
    ``before`` names, with the region the write went through (a chain of views of the
    same tensor: ``key[..., :k].copy_(k_nope)``) holding the write's labels. Where
    the chains do not meet in one tensor, the labels pass on as a set."""
    before, write = n.args
    written = write.args[0] if write.args and isinstance(write.args[0], CapturedOp) else None
    if written is None or not isinstance(labels.get(write), torch.Tensor):
        return _union(inputs)
    root, into = _view_chain(written)
    start, out_of = _view_chain(before)
    if _unversioned(root) is not _unversioned(start):
        return _union(inputs)
    base = labels.get(root)
    if isinstance(base, set):
        return _union(inputs)
    shape = tuple(root.output_shapes[0]) if root.output_shapes else ()
    whole = base.clone() if isinstance(base, torch.Tensor) else torch.full(shape, -1, dtype=torch.long)
    try:
        region = _along(whole, into)
        if region is not None:
            region.copy_(labels[write])
        result = _along(whole, out_of) if region is not None else None
    except REPLAY_ERRORS:
        return _union(inputs)
    return result if result is not None and tuple(result.shape) == out_shape else _union(inputs)


def _replay_channelwise(x: torch.Tensor, out_shape: tuple[int, ...],
                        inputs: list[Labels]) -> Labels:
    """A depthwise convolution's output channel holds its input channel's column, where
    that channel holds one column at every position (it mixes positions, not
    channels)."""
    flat = x.flatten(2)
    if len(out_shape) != x.dim() or not bool((flat == flat[..., :1]).all()):
        return _union(inputs)
    return flat[..., :1].reshape(*x.shape[:2], *[1] * (x.dim() - 2)).expand(out_shape)


def _view_chain(n: CapturedOp) -> tuple[CapturedOp, list[CapturedOp]]:
    """The record whose tensor ``n`` views, and the view ops (and their tuple getters)
    from it to ``n``."""
    chain: list[CapturedOp] = []
    while n.node_op == "call_function":
        source = n.args[0] if n.args and isinstance(n.args[0], CapturedOp) else None
        # (a getter of a multi-output view: split)
        viewed = n if n.target is not operator.getitem else source
        if source is None or viewed is None or not getattr(viewed.target, "is_view", False):
            break
        chain.append(n)
        n = source
    return n, chain[::-1]


def _unversioned(n: CapturedOp) -> CapturedOp:
    """The record a chain of version records starts from (they all name one tensor)."""
    while n.target is after_write:
        n = n.args[0]
    return n


def _along(whole: torch.Tensor, chain: Sequence[CapturedOp]) -> torch.Tensor | None:
    """``whole`` seen through the view ops of ``chain`` (a view of it: a write into the
    result writes into it); ``None`` where a view takes a tensor argument or the
    chain ends in a tuple."""
    x: Any = whole
    for v in chain:
        if v.target is operator.getitem:
            x = x[v.args[1]]
        elif any(isinstance(a, CapturedOp) for a in (*v.args[1:], *v.kwargs.values())):
            return None
        else:
            x = v.target(x, *v.args[1:], **v.kwargs)
    return x if isinstance(x, torch.Tensor) else None


def _replay_zero_cost(n: CapturedOp, labels: Mapping[CapturedOp, Labels], inputs: list[Labels],
                      out_shape: tuple[int, ...]) -> Labels:
    """Run a view / copy / index op on the label tensors themselves."""
    packet = getattr(n.target, "overloadpacket", None)
    # (laid out as the op lays its output: a copy is contiguous, as _unsafe_view needs)
    if packet in IDENTITY_OPS:
        first = inputs[0]
        return first.contiguous() if isinstance(first, torch.Tensor) and packet is not aten.detach else first
    if packet in UNINITIALISED:  # whatever memory held: no column of the projection
        return torch.full(out_shape, -1, dtype=torch.long)
    in_place = str(packet).endswith("_")

    def arg(a: Any) -> Any:
        if isinstance(a, CapturedOp):
            if a in labels:
                return labels[a].clone() if in_place else labels[a]
            # an index tensor with known values
            if a.value is not None and a.value.dtype in INDEX_DTYPES:
                return a.value
            return torch.full(tuple(a.output_shapes[0]) if a.output_shapes else (), -1,
                              dtype=torch.long)
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    args = arg(n.args)
    # the padding holds no column (not the column its fill value names)
    if packet is aten.constant_pad_nd:
        args = (*args[:2], -1)
    try:
        target: Any = n.target
        result = target(*args, **{k: arg(v) for k, v in n.kwargs.items()})
    except REPLAY_ERRORS:
        return _union(inputs)
    if isinstance(result, torch.Tensor) and result.dtype == torch.long and tuple(result.shape) == out_shape:
        return result
    if isinstance(result, (list, tuple)) and all(isinstance(r, torch.Tensor) for r in result):
        return list(result)
    return _union(inputs)


SMALL_LABELS = 1 << 16
"""Label tensors of fewer entries are collected as they are (:func:`_distinct_part`)."""


def _distinct_part(v: torch.Tensor) -> torch.Tensor:
    """A part of ``v`` that holds every value of it: each dim along which every entry is
    the same (stride 0, an expanded one; or a sequence's positions, which all carry the
    same columns) taken at its first entry. The widest dims are tried first, each with a
    cheap look at its second entry before a full comparison."""
    for dim, stride in enumerate(v.stride()):
        if stride == 0 and v.shape[dim] > 1:
            v = v.narrow(dim, 0, 1)
    tried: set[int] = set()
    while v.numel() > SMALL_LABELS:
        dims = [d for d in range(v.dim()) if v.shape[d] > 1 and d not in tried]
        if not dims:
            break
        dim = max(dims, key=lambda d: v.shape[d])
        first = v.narrow(dim, 0, 1)
        if torch.equal(v.narrow(dim, 1, 1), first) and bool((v == first).all()):
            v = first
        else:
            tried.add(dim)
    return v


def _union(values: Sequence[Labels]) -> set[int]:
    out: set[int] = set()
    for v in values:
        if isinstance(v, set):
            out |= v
        elif isinstance(v, (list, tuple)):
            out |= _union(v)
        elif v.numel():
            v = _distinct_part(v)
            low, high = (int(x) for x in torch.aminmax(v))  # (one pass for both)
            if low >= -1 and high < MAX_COUNTED_LABEL:
                # labels are column indices, or -1 where unknown: counting them is
                # linear, where torch.unique sorts
                counts = torch.bincount(v.flatten() + 1)
                # (.tolist(): iterating a tensor makes one tensor per element)
                out |= {x - 1 for x in torch.nonzero(counts).flatten().tolist()}
            else:
                out |= set(torch.unique(v).tolist())
    return out
