"""Semantic roles: which multiplies are Q/K/V projections, attention scores, FFN, convolution, ...

Roles are found from the dataflow of the captured graph (see :mod:`flopscope.capture`), not from module
names, in passes that each look for one pattern:

1. **by op**: convolutions are ``conv``; recurrent kernels ``recurrent``; fused kernels (SDPA, the
   ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` fast paths) are split by their formula's parts.
2. **attention**: a *softmax* whose nearest multiply ancestor multiplies two activations is attention;
   that matmul is ``attn_scores``, the activation x activation matmuls that consume the softmax are
   ``attn_weighted_sum``. The weight matmuls (one operand a parameter, the other an activation) nearest
   to the query / key / value operands, through views, transposes, rotary embeddings, norms, repeated
   KV heads and caches, are ``q_proj`` / ``k_proj`` / ``v_proj``; the nearest weight matmul consuming
   the attention output is ``out_proj``.
3. **logits**: a weight matmul whose weight is an embedding table (tied) or has its shape.
4. **FFN**: a weight matmul whose input passes an activation function from nearer weight matmuls is
   ``ffn_down``; those are ``ffn_up``, or, when two branches are multiplied elementwise (SwiGLU, GeGLU),
   the branch through the activation is ``ffn_gate`` and the other ``ffn_up``.
5. **rules**: :class:`RoleRule` data (module type or module-path pattern -> role) for what dataflow
   cannot see; built in: every multiply inside an ``nn.RNNBase`` / ``nn.RNNCellBase`` is ``recurrent``.
6. everything left is ``other`` (routers, poolers, classifier heads, rotary frequencies, ...).

A projection feeding several roles (a fused QKV projection: ``nn.MultiheadAttention.in_proj``, GPT-2
``c_attn``, GPT-NeoX ``query_key_value`` with per-head interleaving, a fused ``gate_up_proj``) is split
by output columns: the column indices are replayed through the views / splits / slices between the
projection and each consumer, and each role is charged exactly its columns.
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import fx, nn

aten = torch.ops.aten


class Role(str, Enum):
    """What a multiply does. Compare with plain strings: ``Role.Q_PROJ == "q_proj"``."""

    Q_PROJ = "q_proj"
    K_PROJ = "k_proj"
    V_PROJ = "v_proj"
    OUT_PROJ = "out_proj"
    ATTN_SCORES = "attn_scores"
    ATTN_WEIGHTED_SUM = "attn_weighted_sum"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    CONV = "conv"
    RECURRENT = "recurrent"
    EMBEDDING = "embedding"
    LOGITS = "logits"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


ROLE_ORDER: tuple[str, ...] = tuple(r.value for r in Role)


@dataclass(frozen=True)
class RoleRule:
    """Force a role on the multiplies run inside matching modules.

    ``module``: an ``fnmatch`` pattern over module paths (``"blocks.*.mixer"``) or a module class
    (instances and subclasses match). ``op``: restrict to one op name (``"aten.bmm"``), optional.
    User rules (``roles=`` of :func:`flopscope.profile`) apply after the dataflow passes and win.
    """

    module: str | type
    role: Role | str
    op: str | None = None

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

# --------------------------------------------------------------------------------------------------
# op families
CONV_OPS = frozenset(str(p) for p in (
    aten.convolution, aten._convolution, aten.convolution_overrideable, aten.mkldnn_convolution,
    aten.cudnn_convolution, aten._slow_conv2d_forward, aten.slow_conv3d_forward, aten.slow_conv_dilated2d,
    aten.slow_conv_dilated3d, aten._conv_depthwise2d, aten.conv_depthwise3d, aten.miopen_convolution,
    aten.miopen_depthwise_convolution, aten._nnpack_spatial_convolution, aten.cudnn_convolution_transpose,
    aten.slow_conv_transpose2d, aten.slow_conv_transpose3d, aten.miopen_convolution_transpose))
# matmul ops and the argument positions of their two matrix operands
MATMUL_OPERANDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(["aten.mm", "aten.bmm", "aten.matmul", "aten.mv", "aten.dot", "aten.vdot", "aten._int_mm",
                     "aten._scaled_mm", "aten._grouped_mm", "aten._scaled_grouped_mm", "aten.linear",
                     "transformers.grouped_mm_fallback"], (0, 1)),
    **dict.fromkeys(["aten.addmm", "aten._addmm_activation", "aten.baddbmm", "aten.addbmm", "aten.addmv"], (1, 2)),
}
SOFTMAX_OPS = frozenset({aten._softmax, aten._safe_softmax, aten.softmax, aten._log_softmax})
ACTIVATION_OPS = frozenset({
    aten.relu, aten.relu_, aten.gelu, aten.gelu_, aten.silu, aten.silu_, aten.sigmoid, aten.sigmoid_, aten.tanh,
    aten.tanh_, aten.elu, aten.elu_, aten.leaky_relu, aten.leaky_relu_, aten.hardswish, aten.hardswish_,
    aten.hardsigmoid, aten.hardsigmoid_, aten.mish, aten.mish_, aten.softplus, aten.glu, aten.celu, aten.selu,
    aten.hardtanh, aten.hardtanh_, aten.erf, aten.prelu, aten._prelu_kernel, aten.log_sigmoid_forward,
    aten.rrelu_with_noise, aten.threshold, aten.sin,
})
MUL_OPS = frozenset({aten.mul, aten.mul_})
IDENTITY_OPS = frozenset({aten._to_copy, aten.clone, aten.contiguous, aten.detach, aten.alias, aten.lift_fresh,
                          aten.lift_fresh_copy, aten.copy})


def _packet(node: fx.Node) -> Any:
    return getattr(node.target, "overloadpacket", None)


def _op(node: fx.Node) -> str:
    return str(_packet(node)) if node.op == "call_function" else node.op


@dataclass
class Assignment:
    """Roles of one multiply node: ``{role: MACs}``, summing to the node's multiplies."""

    parts: dict[str, int]
    block: str | None = None  # module path of the attention / FFN block it belongs to
    kind: str | None = None  # "attention", "ffn", "conv", "recurrent" or None (a lone multiply)


class RoleFinder:
    """Runs the passes over a captured graph; :meth:`assign` returns the role split of every MAC node."""

    def __init__(self, graph: fx.Graph, module_types: Mapping[str, type],
                 rules: Sequence[RoleRule] = ()) -> None:
        self.graph = graph
        self.module_types = module_types
        self.rules = tuple(rules)
        every = list(graph.nodes)
        self.backward_nodes = [n for n in every if n.meta.get("phase") == "backward"]
        self.nodes = [n for n in every if n.meta.get("phase") != "backward"]
        self.macs = {n: int(n.meta.get("multiplies") or 0) for n in every}
        self.dynamic: dict[fx.Node, bool] = {}  # depends on a forward input
        self.weighty: dict[fx.Node, bool] = {}  # depends on a parameter
        self.computed: dict[fx.Node, bool] = {}  # comes out of a multiply (a projected tensor)
        for n in self.nodes:
            parents = n.all_input_nodes
            leaf = n.meta.get("leaf")
            self.dynamic[n] = leaf in ("input", "constant") or any(self.dynamic[p] for p in parents)
            self.weighty[n] = leaf == "parameter" or any(self.weighty[p] for p in parents)
            self.computed[n] = any(self.computed[p] or self.macs[p] for p in parents)
        # an activation depends on the input or was computed by a multiply (a learned query projected by
        # a weight is one); a raw weight is parameter data that no multiply produced
        self.live = {n: self.dynamic[n] or self.computed[n] for n in self.nodes}
        self.raw_weight = {n: self.weighty[n] and not self.live[n] for n in self.nodes}
        self.users: dict[fx.Node, list[fx.Node]] = {
            n: [u for u in n.users if u.meta.get("phase") != "backward"] for n in self.nodes}
        self.packets: dict[fx.Node, Any] = {n: _packet(n) for n in self.nodes}
        self.op_names: dict[fx.Node, str] = {n: _op(n) for n in self.nodes}
        self._weight_mm: dict[fx.Node, bool] = {}
        self._before: dict[fx.Node, list[fx.Node]] = {}
        self._activated: dict[fx.Node, bool] = {}
        self.result: dict[fx.Node, Assignment] = {}
        # projection demands: node -> [(consumer target, role)]
        self.demands: dict[fx.Node, list[tuple[fx.Node, str]]] = {}
        self.groups: list[tuple[str, set[fx.Node]]] = []  # (kind, nodes) of attention / FFN instances

    # ---------------------------------------------------------------------------------------------
    def assign(self) -> dict[fx.Node, Assignment]:
        self._by_op()
        self._attention()
        self._logits()
        self._settle_demands()
        self._ffn()
        self._settle_demands()
        for n in self.nodes:
            if self.macs[n] and n not in self.result:
                self.result[n] = Assignment({Role.OTHER.value: self.macs[n]})
        self._apply_rules(BUILTIN_RULES, only_unfused=True)
        self._apply_rules(self.rules, only_unfused=False)
        self._blocks()
        self._backward()
        return self.result

    def _backward(self) -> None:
        """A backward op takes the roles of the forward op whose autograd node ran it, in the same
        proportions (a fused QKV projection's gradient GEMMs split like the projection); a fused
        backward kernel with its own parts (SDPA backward) keeps them."""
        for n in self.backward_nodes:
            macs = self.macs[n]
            if not macs:
                continue
            forward = n.meta.get("forward")
            source = self.result.get(forward) if forward is not None else None
            parts = n.meta.get("multiply_parts")
            if parts:
                self.result[n] = Assignment(dict(parts))
            elif source is not None and any(source.parts.values()):
                self.result[n] = Assignment(scale_parts(source.parts, macs))
            else:
                self.result[n] = Assignment({Role.OTHER.value: macs})
            assignment = self.result[n]
            if source is not None:
                assignment.block, assignment.kind = source.block, source.kind
            else:
                assignment.block = (forward.meta.get("module") if forward is not None else None) or ""

    # ---------------------------------------------------------------------------------------------
    # pass 1: by op
    def _by_op(self) -> None:
        for n in self.nodes:
            if not self.macs[n]:
                continue
            parts = n.meta.get("multiply_parts")
            op = self.op_names[n]
            if parts:
                self.result[n] = Assignment(dict(parts))
            elif op in CONV_OPS:
                self.result[n] = Assignment({Role.CONV.value: self.macs[n]})

    # ---------------------------------------------------------------------------------------------
    # pass 2: attention
    def _attention(self) -> None:
        for s in self.nodes:
            if s.op == "call_function" and self.packets[s] in SOFTMAX_OPS:
                self._attention_at_softmax(s)
        for n in self.nodes:
            parts = n.meta.get("multiply_parts") or {}
            if "attn_scores" in parts and "q_proj" not in parts:  # an SDPA kernel: q, k, v are its args
                q, k, v = (a if isinstance(a, fx.Node) else None for a in n.args[:3])
                members = {n}
                for operand, role in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")):
                    if operand is not None:
                        members |= self._demand_projections(operand, role)
                output = next((u for u in self.users[n] if u.target is operator.getitem and u.args[1] == 0), n)
                members |= self._demand_out_proj(output)
                self.groups.append(("attention", members))
            elif parts:
                self.groups.append(("attention" if "attn_scores" in parts else "block", {n}))

    def _attention_at_softmax(self, s: fx.Node) -> None:
        scores = [m for m in self._nearest_macs_before(s.args[0], stop_at_softmax=True)
                  if self._is_act_act(m) and m not in self.result]
        if not scores:
            return
        weighted = [m for m in self._nearest_macs_after(s) if self._is_act_act(m) and m not in self.result]
        members: set[fx.Node] = set(scores) | set(weighted)
        for m in scores:
            self.result[m] = Assignment({Role.ATTN_SCORES.value: self.macs[m]})
            a, b = self._operands(m)
            members |= self._demand_projections(a, Role.Q_PROJ.value)
            members |= self._demand_projections(b, Role.K_PROJ.value)
        for m in weighted:
            self.result[m] = Assignment({Role.ATTN_WEIGHTED_SUM.value: self.macs[m]})
            a, b = self._operands(m)
            probs_side = a if self._descends_from(a, s) else b
            value_side = b if probs_side is a else a
            members |= self._demand_projections(value_side, Role.V_PROJ.value)
            members |= self._demand_out_proj(m)
        self.groups.append(("attention", members))

    def _demand_projections(self, operand: fx.Node, role: str) -> set[fx.Node]:
        found = self._projections_of(operand, role)
        for p, target, demanded in found:
            self.demands.setdefault(p, []).append((target, demanded))
        return {p for p, _, _ in found}

    def _demand_out_proj(self, output: fx.Node) -> set[fx.Node]:
        found = set()
        for p in self._nearest_macs_after(output):
            if self._is_weight_matmul(p) and p not in self.result:
                target = self._operand_from(p, output)
                self.demands.setdefault(p, []).append((target, Role.OUT_PROJ.value))
                found.add(p)
        return found

    # ---------------------------------------------------------------------------------------------
    # pass 3: logits
    def _logits(self) -> None:
        """A weight matmul onto the vocabulary: its weight is a token-embedding table (tied) or has its
        shape, and its output has one column per token of that table. Token tables are those looked up
        with indices that come from the inputs (position tables are looked up with ``arange``)."""
        tables: dict[Any, int] = {}  # leaf name or ("shape", shape) -> vocabulary size
        for n in self.nodes:
            if n.op == "call_function" and self.packets[n] in (aten.embedding, aten._embedding_bag, aten.embedding_bag):
                weight, indices = n.args[0], n.args[1] if len(n.args) > 1 else None
                if isinstance(weight, fx.Node) and isinstance(indices, fx.Node) and self.dynamic[indices]:
                    shape = tuple(weight.meta.get("output_shapes", ((),))[0])
                    if len(shape) == 2:
                        tables[self._leaf_name(weight)] = shape[0]
                        tables[("shape", shape)] = shape[0]
                self.result[n] = Assignment({Role.EMBEDDING.value: 0})
        if not tables:
            return
        for n in self.nodes:
            if not self._is_weight_matmul(n) or n in self.result or n in self.demands:
                continue
            columns = (n.meta.get("output_shapes") or ((0,),))[0][-1:]
            leaves = self._leaves_of(self._weight_operand(n))
            keys = {self._leaf_name(x) for x in leaves} | {("shape", tuple(x.meta["output_shapes"][0])) for x in leaves}
            if any(tables[key] in columns for key in keys & tables.keys()):
                self.result[n] = Assignment({Role.LOGITS.value: self.macs[n]})

    # ---------------------------------------------------------------------------------------------
    # pass 4: FFN
    def _ffn(self) -> None:
        for d in self.nodes:
            if not self._is_weight_matmul(d) or d in self.result or d in self.demands:
                continue
            x = self._activation_operand(d)
            gate, up = self._gated_branches(x)
            if gate is not None and up is not None:
                branches = [(gate, Role.FFN_GATE.value), (up, Role.FFN_UP.value)]
            elif self._passes_activation(x):
                branches = [(x, Role.FFN_UP.value)]
            else:
                continue
            found = [self._projections_of(start, role) for start, role in branches]
            if all(found):  # every branch reaches a projection: commit the demands, else leave them all
                for demands in found:
                    for p, target, role in demands:
                        self.demands.setdefault(p, []).append((target, role))
                self.result[d] = Assignment({Role.FFN_DOWN.value: self.macs[d]})
                self.groups.append(("ffn", {d} | {p for demands in found for p, _, _ in demands}))

    def _projections_of(self, start: fx.Node, role: str) -> list[tuple[fx.Node, fx.Node, str]]:
        """(projection, consumer target, role) for the weight matmuls nearest behind ``start``."""
        return [(p, start, role) for p in self._nearest_macs_before(start)
                if self._is_weight_matmul(p) and (p not in self.result or p in self.demands)]

    def _gated_branches(self, x: fx.Node) -> tuple[fx.Node | None, fx.Node | None]:
        """The (activated, plain) inputs of the elementwise product gating an FFN, if there is one."""
        seen: set[fx.Node] = set()
        todo = [x]
        while todo:
            n = todo.pop()
            if n in seen or self.macs[n]:
                continue
            seen.add(n)
            if n.op == "call_function" and self.packets[n] in MUL_OPS:
                a, b = (arg for arg in n.args[:2])
                if isinstance(a, fx.Node) and isinstance(b, fx.Node):
                    macs_a = {m for m in self._nearest_macs_before(a) if self._is_weight_matmul(m)}
                    macs_b = {m for m in self._nearest_macs_before(b) if self._is_weight_matmul(m)}
                    act_a, act_b = self._passes_activation(a), self._passes_activation(b)
                    if macs_a and macs_b and act_a != act_b:
                        separate = macs_a != macs_b or not (
                            _columns(next(iter(macs_a)), a) & _columns(next(iter(macs_a)), b))
                        if separate:
                            return (a, b) if act_a else (b, a)
            todo.extend(n.all_input_nodes)
        return None, None

    # ---------------------------------------------------------------------------------------------
    # settling projection demands (column split for fused projections)
    def _settle_demands(self) -> None:
        for p, wanted in self.demands.items():
            roles = {role for _, role in wanted}
            if len(roles) == 1:
                self.result[p] = Assignment({roles.pop(): self.macs[p]})
                continue
            self.result[p] = Assignment(_split_by_columns(p, wanted, self.macs[p]))
        self.demands = {}

    # ---------------------------------------------------------------------------------------------
    # rules and blocks
    def _apply_rules(self, rules: Iterable[RoleRule], only_unfused: bool) -> None:
        rules = tuple(rules)
        if not rules:
            return
        for n, assignment in self.result.items():
            if only_unfused and (n.meta.get("multiply_parts") or self.op_names[n] in CONV_OPS):
                continue
            if not self.macs[n]:
                continue
            stack = n.meta.get("module_stack") or ()
            op = self.op_names[n]
            for rule in rules:
                if any(rule.matches(frame.path, self.module_types.get(frame.path), op) for frame in stack):
                    assignment.parts = {Role(rule.role).value: self.macs[n]}
                    break

    def _blocks(self) -> None:
        for kind, members in self.groups:
            paths = [str(m.meta["module"]) for m in members if m.meta.get("module") is not None]
            block = _common_path(paths)
            for m in members:
                if m in self.result and self.result[m].block is None:
                    self.result[m].block, self.result[m].kind = block, kind
        for n, assignment in self.result.items():
            if assignment.block is None:
                assignment.block = n.meta.get("module") or ""
                if set(assignment.parts) <= {Role.CONV.value, Role.RECURRENT.value}:
                    assignment.kind = next(iter(assignment.parts), None)

    # ---------------------------------------------------------------------------------------------
    # graph helpers
    def _operands(self, m: fx.Node) -> tuple[fx.Node, fx.Node]:
        i, j = MATMUL_OPERANDS.get(self.op_names[m], (0, 1))
        a, b = m.args[i], m.args[j]
        assert isinstance(a, fx.Node) and isinstance(b, fx.Node)
        return a, b

    def _is_matmul(self, n: fx.Node) -> bool:
        if self.op_names[n] not in MATMUL_OPERANDS or not self.macs[n]:
            return False
        i, j = MATMUL_OPERANDS[self.op_names[n]]
        return len(n.args) > max(i, j) and isinstance(n.args[i], fx.Node) and isinstance(n.args[j], fx.Node)

    def _is_act_act(self, n: fx.Node) -> bool:
        if not self._is_matmul(n):
            return False
        a, b = self._operands(n)
        return self.live[a] and self.live[b]

    def _is_weight_matmul(self, n: fx.Node) -> bool:
        known = self._weight_mm.get(n)
        if known is None:
            known = self._weight_mm[n] = self._check_weight_matmul(n)
        return known

    def _check_weight_matmul(self, n: fx.Node) -> bool:
        if not self._is_matmul(n) or n.meta.get("multiply_parts"):
            return False
        a, b = self._operands(n)
        # x @ W, W @ x, or a learned query: two raw weights, the second one the weight
        return self.raw_weight[b] or (self.raw_weight[a] and self.live[b])

    def _weight_operand(self, n: fx.Node) -> fx.Node:
        a, b = self._operands(n)
        return b if self.raw_weight[b] else a

    def _activation_operand(self, n: fx.Node) -> fx.Node:
        a, b = self._operands(n)
        return a if self.raw_weight[b] else b

    def _operand_from(self, p: fx.Node, source: fx.Node) -> fx.Node:
        a, b = self._operands(p)
        return a if self._descends_from(a, source) else b

    def _leaves_of(self, n: fx.Node) -> list[fx.Node]:
        out, seen, todo = [], set(), [n]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            if x.op == "get_attr":
                out.append(x)
            todo.extend(x.all_input_nodes)
        return out

    @staticmethod
    def _leaf_name(n: fx.Node) -> Any:
        return ("leaf", n.target) if n.op == "get_attr" else ("node", n.name)

    def _nearest_macs_before(self, start: Any, stop_at_softmax: bool = False) -> list[fx.Node]:
        """Multiply nodes reached first walking back from ``start`` through ops without multiplies."""
        if not isinstance(start, fx.Node):
            return []
        if stop_at_softmax:
            return self._frontier([start], lambda n: n.all_input_nodes,
                                  lambda n: n is not start and self.packets[n] in SOFTMAX_OPS)
        if start not in self._before:
            self._before[start] = self._frontier([start], lambda n: n.all_input_nodes, lambda n: False)
        return self._before[start]

    def _nearest_macs_after(self, start: fx.Node) -> list[fx.Node]:
        """Multiply nodes reached first walking forward from ``start`` through ops without multiplies
        (not through another softmax or a normalisation)."""
        return self._frontier(self.users[start], self.users.__getitem__, lambda n: self.packets[n] in SOFTMAX_OPS or (
            n.meta.get("elementwise") or ("",))[0] in ("norm", "reduction"))

    def _frontier(self, starts: list[fx.Node], step: Callable[[fx.Node], list[fx.Node]],
                  blocked: Callable[[fx.Node], bool]) -> list[fx.Node]:
        """The multiply nodes met first from ``starts``, moving by ``step`` through nodes without
        multiplies and never past a ``blocked`` one."""
        found: list[fx.Node] = []
        seen: set[fx.Node] = set()
        todo = list(starts)
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if self.macs[n]:
                found.append(n)
            elif not blocked(n):
                todo.extend(step(n))
        return found

    def _passes_activation(self, start: fx.Node) -> bool:
        known = self._activated.get(start)
        if known is None:
            known = self._activated[start] = self._find_activation(start)
        return known

    def _find_activation(self, start: fx.Node) -> bool:
        seen: set[fx.Node] = set()
        todo = [start]
        while todo:
            n = todo.pop()
            if n in seen or self.macs[n]:
                continue
            seen.add(n)
            if self.packets[n] in ACTIVATION_OPS:
                return True
            todo.extend(n.all_input_nodes)
        return False

    def _descends_from(self, n: fx.Node, ancestor: fx.Node) -> bool:
        seen: set[fx.Node] = set()
        todo = [n]
        while todo:
            x = todo.pop()
            if x is ancestor:
                return True
            if x in seen or (self.macs[x] and x is not n):
                continue
            seen.add(x)
            todo.extend(x.all_input_nodes)
        return False


def scale_parts(parts: Mapping[str, int], total: int) -> dict[str, int]:
    """``parts`` rescaled to sum to ``total`` exactly (largest remainder to the largest part)."""
    whole = sum(parts.values())
    out = {role: macs * total // whole for role, macs in parts.items()}
    out[max(parts, key=parts.__getitem__)] += total - sum(out.values())
    return out


def _common_path(paths: Sequence[str]) -> str:
    """The deepest module path containing every path (``""`` is the root)."""
    if not paths:
        return ""
    split = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


# --------------------------------------------------------------------------------------------------
# column replay
def _columns(p: fx.Node, target: fx.Node) -> set[int]:
    """Which output columns (last dim) of ``p`` reach ``target``: replay the index of each column
    through the ops between them (views, splits, slices, transposes exactly; elementwise ops keep the
    labels of their input from ``p``; anything else keeps the set of labels it received)."""
    shape = tuple(p.meta["output_shapes"][0])
    width = shape[-1]
    between = _between(p, target)
    labels: dict[fx.Node, Labels] = {p: torch.arange(width).expand(shape)}
    for n in between:
        labels[n] = _replay(n, labels)
    return {c for c in _union([labels.get(target, set())]) if c >= 0}


def _between(p: fx.Node, target: fx.Node) -> list[fx.Node]:
    """Nodes on paths from ``p`` to ``target`` (excluding ``p``), in graph order."""
    ancestors: set[fx.Node] = set()
    todo = [target]
    while todo:
        x = todo.pop()
        if x in ancestors or x is p:
            continue
        ancestors.add(x)
        todo.extend(x.all_input_nodes)
    descendants: set[fx.Node] = set()
    todo = list(p.users)
    while todo:
        x = todo.pop()
        if x in descendants or x not in ancestors:
            continue
        descendants.add(x)
        todo.extend(x.users)
    order = {n: i for i, n in enumerate(p.graph.nodes)}
    return sorted(descendants, key=order.__getitem__)


Labels = Any  # a label tensor, a list of them (a multi-output op), or a set of labels


def _replay(n: fx.Node, labels: Mapping[fx.Node, Labels]) -> Labels:
    inputs = [labels[a] for a in n.all_input_nodes if a in labels]
    if n.op != "call_function" or any(isinstance(x, set) for x in inputs):
        return _union(inputs)
    if n.target is operator.getitem:
        source = labels.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
        index = n.args[1]
        return source[index] if isinstance(source, (list, tuple)) and isinstance(index, int) else _union(inputs)
    out_shape = tuple((n.meta.get("output_shapes") or ((),))[0])
    if n.meta.get("cost") == "zero":
        if _packet(n) in IDENTITY_OPS:
            return inputs[0]
        in_place = str(_packet(n)).endswith("_")

        def arg(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if a in labels:
                    return labels[a].clone() if in_place else labels[a]
                if a.meta.get("value") is not None:  # an index tensor with known values
                    return a.meta["value"]
                shapes = a.meta.get("output_shapes") or ((),)
                return torch.full(tuple(shapes[0]), -1, dtype=torch.long)
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            return a

        try:
            target: Any = n.target
            result = target(*arg(n.args), **{k: arg(v) for k, v in n.kwargs.items()})
        except Exception:  # an op that needs real data (an index tensor) or does not take int64
            return _union(inputs)
        if isinstance(result, torch.Tensor) and result.dtype == torch.long and tuple(result.shape) == out_shape:
            return result
        if isinstance(result, (list, tuple)) and all(isinstance(r, torch.Tensor) for r in result):
            return list(result)
        return _union(inputs)
    if n.meta.get("cost") == "elementwise" and isinstance(inputs[0], torch.Tensor):
        first = inputs[0]
        try:
            return first if tuple(first.shape) == out_shape else first.expand(out_shape)
        except RuntimeError:
            return _union(inputs)
    return _union(inputs)


def _union(values: Sequence[Labels]) -> set[int]:
    out: set[int] = set()
    for v in values:
        if isinstance(v, set):
            out |= v
        elif isinstance(v, (list, tuple)):
            out |= _union(v)
        else:
            out |= {int(x) for x in torch.unique(v)}
    return out


def _split_by_columns(p: fx.Node, wanted: Sequence[tuple[fx.Node, str]], macs: int) -> dict[str, int]:
    """Charge each role the MACs of the output columns of ``p`` that reach its consumer."""
    width = int(p.meta["output_shapes"][0][-1])
    owner: dict[int, str] = {}
    for target, role in sorted(wanted, key=lambda tr: ROLE_ORDER.index(tr[1])):
        for c in _columns(p, target):
            owner.setdefault(c, role)
    per_column, remainder = divmod(macs, width)
    parts: dict[str, int] = {}
    for c in range(width):
        role = owner.get(c, Role.OTHER.value)
        parts[role] = parts.get(role, 0) + per_column
    if remainder:
        largest = max(parts, key=parts.__getitem__)
        parts[largest] += remainder
    return parts
