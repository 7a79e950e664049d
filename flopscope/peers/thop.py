"""thop (``ultralytics-thop``, ``thop.profile``): its runner for
:func:`~.common.crosscheck`, and :func:`thop_custom_ops`, the plug-in that gives it
flopscope's formulas.

thop counts with a rule per module type (a forward hook adding to ``module.total_ops``)
and, outside every module with a counting rule, with rules per torch function
(``torch.matmul``, ``F.linear``, ``F.scaled_dot_product_attention``, ...). Its
``total_ops`` are MACs for its GEMM and convolution rules and elementwise operation
counts for its norm / softmax / pooling rules. thop itself is imported inside the
functions only.

How the runner explains a difference, from evidence per module only:

- thop's ``ret_layer_info`` tree gives its rules' count per module path;
- what its function hooks count is reported only inside its total, so the runner watches
  the same run and applies thop's own function rules per module path; it uses that split
  only when it sums to exactly what thop's total holds beyond its tree;
- flopscope counts the very run thop makes, and each of its records belongs to the
  innermost module on its stack that has a thop rule (that rule should count it), or
  else to its own module (thop's function hooks may count it there);
- per module path, thop's count is compared with flopscope's records there, and the
  paths that differ are reported per module type. A gap no module-level evidence shows
  stays ``unexplained``.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..capture.module_tracker import ModuleTracker
from ..formulas.registry import REGISTRY, FormulaRegistry, Shape, total_of
from ..profile import OpRecord, Profile
from .common import (
    Difference,
    PeerCount,
    copy_for,
    inner_profile,
    ordered,
    path_difference,
    quiet,
    required_formula,
    sum_roles,
)

TOOL = "thop"
aten = torch.ops.aten

# (module, inputs, output), adds to module.total_ops
ThopRule = Callable[[Any, tuple[Any, ...], Any], None]
# (args, kwargs, output) -> ops
FunctionRule = Callable[[tuple[Any, ...], dict[str, Any], Any], float]

_MAC_RULE_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
                                                nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear,
                                                nn.Bilinear,
                                                nn.Embedding)
"""Module types whose thop rules count multiply-accumulates only (an embedding: 0), so
the plug-in keeps them; the recurrent and attention rules are replaced, and every other
rule counts elementwise work."""


class _ThopTables(NamedTuple):
    rules: Mapping[type, ThopRule]  # thop's default rule per module type (custom_ops override them)
    # its rule per torch function ({} where thop has no function hooks)
    functions: Mapping[Any, FunctionRule]
    # its rule that counts nothing (a module with it does not stop the function hooks)
    zero_ops: ThopRule


def _thop_tables() -> _ThopTables:
    """The one place that reads private details of thop: ``thop.profile.register_hooks``
    (its default rule per module type: the plug-in replaces some of them, and the
    runner resolves each module's rule as ``thop.profile`` does) and
    ``thop.profile.functional_hooks`` (its rule per torch function: thop reports
    their count only inside its total, so the runner needs them to place that count
    per module). thop has no public way to read either. ``zero_ops`` is its public
    no-count rule."""
    # the module; ``thop.profile`` the attribute is a function
    module = importlib.import_module("thop.profile")
    from thop.vision.basic_hooks import zero_ops

    return _ThopTables(module.register_hooks, getattr(module, "functional_hooks", {}), zero_ops)


def _rule_resolver(custom_ops: Mapping[type, ThopRule],
                   tables: _ThopTables) -> Callable[[type], ThopRule | None]:
    """thop's rule resolution: the first class of the MRO with a rule, ``custom_ops``
    first at each level; ``None`` where it has none."""

    def rule(module_type: type) -> ThopRule | None:
        for t in module_type.__mro__:
            if t in custom_ops:
                return custom_ops[t]
            if t in tables.rules:
                return tables.rules[t]
        return None

    return rule


# --------------------------------------------------------------------------------------------------
# runner
# --------------------------------------------------------------------------------------------------
class _FunctionCounts(TorchFunctionMode):
    """thop's function rules applied to the same run, per module path: each call of a
    torch function thop has a rule for, made while no module with a counting rule
    runs (as thop counts it), adds the rule's count to the innermost module running
    it."""

    def __init__(self, model: nn.Module, ruled: set[str],
                 functions: Mapping[Any, FunctionRule]) -> None:
        super().__init__()
        self.tracker = ModuleTracker(model)
        self.ruled, self.functions = ruled, functions
        self.by_path: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rule = self.functions.get(func)
        stack = self.tracker.stack
        if rule is not None and stack and not any(frame.path in self.ruled for frame in stack):
            self.by_path[stack[-1].path] += round(rule(args, kwargs, out))
        return out


@contextlib.contextmanager
def _function_counts(model: nn.Module, ruled: set[str], functions: Mapping[Any, FunctionRule]
                     ) -> Iterator[Counter[str]]:
    watch = _FunctionCounts(model, ruled, functions)
    if not functions:
        yield watch.by_path
        return
    with watch.tracker, watch:
        yield watch.by_path


def _layer_tree(tree: Mapping[str, Any], prefix: str, modules: Mapping[str, nn.Module],
                seen: set[int],
                own: dict[str, float]) -> float:
    """Own ops per module path from thop's ``ret_layer_info`` tree (inclusive counts per
    child)."""
    children = 0.0
    for name, (ops, _, sub) in tree.items():
        path = f"{prefix}{name}"
        inner = _layer_tree(sub, f"{path}.", modules, seen, own)
        module = modules.get(path)
        if module is not None and id(module) in seen:
            continue
        if module is not None:
            seen.add(id(module))
        own[path] = float(ops) - inner
        children += float(ops)
    return children


def _run_thop(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
              plugins: bool) -> PeerCount:
    """``thop.profile`` on a copy of ``model``, with flopscope counting the same run;
    per module path, thop's count against flopscope's records executed there (module
    docstring)."""
    import thop

    tables = _thop_tables()
    custom = thop_custom_ops() if plugins else {}
    twin = copy_for(model, kwargs)
    modules = dict(twin.named_modules(remove_duplicate=False))
    rule_of = _rule_resolver(custom, tables)
    ruled = {path for path, module in modules.items()
             if (rule := rule_of(type(module))) is not None and rule is not tables.zero_ops}
    with quiet(), inner_profile(twin) as followed, _function_counts(twin, ruled, tables.functions) as functional:
        total_f, _, tree = thop.profile(twin, args, custom_ops=dict(custom), verbose=False,
                                        ret_layer_info=True)
    total = round(total_f)

    own: dict[str, float] = {}
    below_root = _layer_tree(tree, "", modules, set(), own)
    # a rule on the root: every function call runs under it, so the function hooks count
    # nothing
    if "" in ruled:
        own[""] = total_f - below_root
    # what thop's function hooks counted
    outside_tree = 0 if "" in ruled else round(total_f - below_root)
    by_type: Counter[str] = Counter()
    for path, ops in own.items():
        if path in modules and round(ops):
            by_type[type(modules[path]).__name__] += round(ops)
    if outside_tree:
        by_type["(functional)"] += outside_tree

    # thop's count per module path: its rule there, plus its function hooks' count in
    # that module's own code (placed per path only when the split sums to what thop's
    # total holds beyond its tree)
    placed = sum(functional.values()) == outside_tree
    theirs: Counter[str] = Counter({path: round(ops) for path, ops in own.items() if round(ops)})
    if placed:
        theirs.update(functional)
    # flopscope's records of the run thop made, per module path: the innermost module
    # with a rule, else their own
    mine: dict[str, list[OpRecord]] = {}
    for record in (followed.profile or prof).records:
        owner = next((p for p in reversed(record.module_stack) if p in ruled), record.module)
        mine.setdefault(owner, []).append(record)

    differences = path_difference(TOOL, "it runs the model in eval mode under no_grad",
                                  followed.profile, prof)
    groups: dict[tuple[str, str, bool], list[str]] = {}  # (module type, kind, by a rule) -> paths
    for path in [*mine, *(p for p in theirs if p not in mine)]:
        by_rule = path in ruled
        if not by_rule and not placed:
            # what thop's function hooks counted here is unknown: the gap stays
            # unexplained
            continue
        counted, executed = theirs.get(path, 0), sum(r.multiplies for r in mine.get(path, ()))
        if counted != executed:
            type_name = type(modules[path]).__name__ if path in modules else "?"
            groups.setdefault((type_name, _kind(counted, executed, by_rule), by_rule), []).append(path)
    for (type_name, kind, by_rule), paths in groups.items():
        concerned = [r for path in paths for r in mine.get(path, ())]
        counted, executed = sum(theirs.get(path, 0) for path in paths), sum(r.multiplies for r in concerned)
        op_names = ", ".join(sorted({r.op for r in concerned}))
        reason = _reason(type_name, kind, by_rule, counted, executed, op_names)
        differences.append(Difference(TOOL, kind, counted - executed, reason,
                                      {} if kind == "extra" else sum_roles(concerned),
                                      tuple(paths)))
    by_module = {path: theirs.get(path, 0) for path in modules if path in theirs}
    return PeerCount(TOOL, total, prof.total(), by_type=dict(by_type),
                     differences=ordered(differences),
                     by_module=by_module)


def _kind(counted: int, executed: int, by_rule: bool) -> str:
    if counted > executed:
        return "extra" if by_rule or executed == 0 else "over"
    return "missing" if counted == 0 else "under"


def _reason(type_name: str, kind: str, by_rule: bool, counted: int, executed: int, ops: str) -> str:
    """Why thop's count in the modules of one type differs, from what counted there (its
    rule, or its function hooks) and the kind of difference (:func:`_kind`)."""
    if by_rule:
        if kind == "extra":
            return f"its {type_name} rule counts elementwise work " + (
                f"on top of the {executed:,} MACs" if executed else "(not MACs)")
        return f"its {type_name} rule counts 0" if kind == "missing" else f"its {type_name} rule counts {counted:,}"
    if kind == "missing":
        return f"no rule for {type_name} ({ops})"
    if kind == "under":
        return f"its function hooks count {counted:,} of the {executed:,} MACs of {type_name} ({ops})"
    if kind == "over":
        return f"its function hooks count {counted:,} MACs in {type_name}, flopscope's formulas {executed:,}"
    return f"its function hooks count {counted:,} in {type_name}, where flopscope counts no multiply-accumulates"


# --------------------------------------------------------------------------------------------------
# plug-in
# --------------------------------------------------------------------------------------------------
def _shape(t: torch.Tensor) -> Shape:
    return tuple(int(s) for s in t.shape)


def _thop_conv1d(registry: FormulaRegistry) -> ThopRule:
    addmm = required_formula(registry, aten.addmm, "thop's Conv1D rule")

    def count_conv1d(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """transformers' ``Conv1D``: ``addmm(bias, x.view(-1, nx), weight[nx, nf])``."""
        inp = x[0]
        rows = math.prod(int(s) for s in inp.shape[:-1])
        m.total_ops += total_of(addmm(_shape(m.bias), (rows, int(inp.shape[-1])), _shape(m.weight)))

    return count_conv1d


def _thop_mha(registry: FormulaRegistry) -> ThopRule:
    mm = required_formula(registry, aten.mm, "thop's MultiheadAttention rule")
    sdpa = required_formula(registry, aten._scaled_dot_product_attention_math,
                            "thop's MultiheadAttention rule")

    def count_mha(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """``nn.MultiheadAttention``: the Q/K/V/out projections and the attention core,
        MACs only."""
        query, key = x[0], x[1] if len(x) > 1 else x[0]
        E, h = int(m.embed_dim), int(m.num_heads)
        first = bool(getattr(m, "batch_first", False))
        if query.dim() == 3:
            B, n_q, n_k = query.shape[0 if first else 1], query.shape[1 if first else 0], key.shape[1 if first else 0]
        else:
            B, n_q, n_k = 1, query.shape[0], key.shape[0]
        B, n_q, n_k = int(B), int(n_q), int(n_k)
        kdim, vdim = int(m.kdim), int(m.vdim)
        attended = n_k + (m.bias_k is not None) + int(m.add_zero_attn)
        macs = 2 * total_of(mm((B * n_q, E), (E, E)))  # q and out projections
        macs += total_of(mm((B * n_k, kdim), (kdim, E))) + total_of(mm((B * n_k, vdim), (vdim, E)))
        macs += total_of(sdpa((B, h, n_q, E // h), (B, h, attended, E // h),
                              (B, h, attended, E // h)))
        m.total_ops += macs

    return count_mha


def _thop_rnn(registry: FormulaRegistry) -> ThopRule:
    rnn = required_formula(registry, aten._cudnn_rnn, "thop's recurrent rule")

    def count_rnn(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """``nn.LSTM`` / ``GRU`` / ``RNN``: every 2-D weight of every layer and
        direction once per token."""
        inp = x[0]
        data = inp.data if isinstance(inp, nn.utils.rnn.PackedSequence) else inp
        m.total_ops += total_of(rnn(_shape(data), [_shape(w) for w in m._flat_weights]))

    return count_rnn


def _thop_rnn_cell(registry: FormulaRegistry) -> ThopRule:
    layer = required_formula(registry, aten.mkldnn_rnn_layer, "thop's recurrent cell rule")

    def count_rnn_cell(m: Any, x: tuple[Any, ...], y: Any) -> None:
        """``nn.LSTMCell`` / ``GRUCell`` / ``RNNCell``: ``W_ih x`` and ``W_hh h`` once
        per batch row."""
        m.total_ops += total_of(layer(_shape(x[0]), _shape(m.weight_ih), _shape(m.weight_hh)))

    return count_rnn_cell


def thop_custom_ops(elementwise: bool = False,
                    registry: FormulaRegistry | None = None) -> dict[type, ThopRule]:
    """``custom_ops`` for ``thop.profile(model, inputs, custom_ops=...)``, from
    flopscope's formulas.

    - transformers' ``Conv1D`` (GPT-2 and relatives: ``addmm``, which thop has no rule
      for; it counts 0);
    - ``nn.MultiheadAttention``, ``nn.LSTM`` / ``GRU`` / ``RNN`` and their cells: MACs
      only (thop's own rules add softmax, gate and bias operations);
    - with ``elementwise=False`` (default), thop's norm / softmax / pooling / upsampling
      / PReLU rules (every rule but those of convolutions, ``nn.Linear``,
      ``nn.Bilinear`` and ``nn.Embedding``) are replaced by its ``zero_ops``, so thop
      counts multiply-accumulates only, as flopscope's ``total()``.

    Each rule adds **MACs** to ``module.total_ops``, as thop's own rules do. A registry
    without a formula these rules build on is a
    :class:`~flopscope.errors.RegistryError`.
    """
    tables = _thop_tables()
    registry = registry if registry is not None else REGISTRY
    rnn, cell, mha = _thop_rnn(registry), _thop_rnn_cell(registry), _thop_mha(registry)
    rules: dict[type, ThopRule] = {}
    for module_type in tables.rules:
        if issubclass(module_type, nn.RNNBase):
            rules[module_type] = rnn
        elif issubclass(module_type, nn.RNNCellBase):
            rules[module_type] = cell
        elif issubclass(module_type, nn.MultiheadAttention):
            rules[module_type] = mha
        elif not elementwise and not issubclass(module_type, _MAC_RULE_TYPES):
            rules[module_type] = tables.zero_ops
    rules.setdefault(nn.MultiheadAttention, mha)  # thop registers it only on torch >= 2.0
    with contextlib.suppress(ImportError):
        from transformers.pytorch_utils import Conv1D

        rules[Conv1D] = _thop_conv1d(registry)
    return rules
