"""Reconciliation: measured multiplies per block and role against exact closed-form
predictions.

Predictions use what the model *declares* (:class:`~flopscope.capture.facts.ModelFacts`:
module attributes, parameter shapes, the Hugging Face config) and the shapes of each
block's inputs (its token counts), never the shapes of the ops that ran inside it; a
user can state the hyper-parameters instead with a :class:`TransformerSpec`.
Hyper-parameter names: :mod:`flopscope.conventions`. Closed forms are those of
``docs/formulas.md`` sections 6 and 7 (MACs):

=================  ==============================  ============
role               prediction                      term
=================  ==============================  ============
q_proj             B·n_q·d·(h·d_k)                 n·d²
k_proj / v_proj    B·n_k·d·(n_kv·d_k)              n·d²
attn_scores / AV   B·h·n_q·n_k·d_k                 n²·d
out_proj           B·n_q·(h·d_k)·d                 n·d²
token_mixing       B·(d·F(n) + n·F(d))             n·d·log(n·d)
ffn_up/gate/down   B·n·d·d_ff  (x top_k experts)   n·d²
conv               B·C_out·L_out·(C_in/g)·k        k·n·d²
recurrent          B·T·gates·d_h·(d_in + d_h) ...  n·d²
logits             B·n·d·V                         n·d·V
=================  ==============================  ============

``token_mixing`` is FNet's Fourier sublayer, a 2-D FFT over (n, d) of the block's input,
with F(N) the MACs of one length-N complex FFT
(:func:`~flopscope.formulas.registry.fft_macs`, ``docs/formulas.md`` section 12).

For attention the *useful* work is reported beside the executed work: a causal mask
executed by a dense kernel runs ``n_q·n_k`` pairs but needs ``n_q·n_k − n_q(n_q−1)/2``;
a sliding window W needs ``W·n − W(W−1)/2`` (restricted attention, ``r·n·d``).
``total()`` and ``by_role()`` stay executed work.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from tabulate import tabulate

from ..attribute.roles import Assignment
from ..capture.facts import ModelFacts
from ..capture.module_tracker import ModuleCall
from ..capture.records import FORWARD, CapturedOp
from ..role import ROLE_ORDER, Role, RoleGroup
from ._attention_rows import attention_rows
from ._layer_rows import conv_rows, ffn_rows, logits_rows, mixing_rows, recurrent_rows
from .attention import kernel_is_causal
from .reconcile_block import (
    Block,
    InputShapes,
    ReconcileRow,
    TransformerSpec,
    calls_by_path,
)

__all__ = ["ROLE_FORMS", "ReconcileRow", "Reconciliation", "TransformerSpec", "reconcile"]

ROLE_FORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "q_proj": ("B·n_q·d·(h·d_k)", ("B", "n_q", "d", "h", "d_k")),
    "k_proj": ("B·n_k·d·(n_kv·d_k)", ("B", "n_k", "d", "n_kv", "d_k")),
    "v_proj": ("B·n_k·d·(n_kv·d_k)", ("B", "n_k", "d", "n_kv", "d_k")),
    "attn_scores": ("B·h·n_q·n_k·d_k", ("B", "h", "n_q", "n_k", "d_k")),
    "attn_weighted_sum": ("B·h·n_q·n_k·d_k", ("B", "h", "n_q", "n_k", "d_k")),
    "out_proj": ("B·n_q·(h·d_k)·d", ("B", "n_q", "h", "d_k", "d")),
    "ffn_up": ("tokens·d·d_ff (× top_k experts)", ("tokens", "d", "d_ff", "top_k")),
    "ffn_gate": ("tokens·d·d_ff (× top_k experts)", ("tokens", "d", "d_ff", "top_k")),
    "ffn_down": ("tokens·d·d_ff (× top_k experts)", ("tokens", "d", "d_ff", "top_k")),
    "logits": ("B·n·d·V", ("B", "n", "tokens", "d", "V")),
}
"""Each role's closed form (the module docstring's table) and the hyper-parameters of a
reconciliation row's ``basis`` it depends on: what explains a change of the role between
two models (:mod:`flopscope.diff`)."""


@dataclass(frozen=True)
class Reconciliation:
    rows: tuple[ReconcileRow, ...]

    def all_exact(self) -> bool:
        return all(row.exact for row in self.rows)

    def unexplained(self) -> list[ReconcileRow]:
        """Rows whose ratio is not 1 and for which no reason was found."""
        return [r for r in self.rows if not r.exact and not r.reason]

    def by_block(self) -> dict[str, list[ReconcileRow]]:
        out: dict[str, list[ReconcileRow]] = defaultdict(list)
        for row in self.rows:
            out[row.block].append(row)
        return dict(out)

    def to_table(self, tablefmt: str = "simple") -> str:
        rows = []
        for r in self.rows:
            ratio = "-" if r.ratio is None else (str(r.ratio) if r.ratio.denominator != 1 else f"{r.ratio}")
            useful = "" if r.useful is None else f"{r.useful:,}"
            predicted = "-" if r.predicted is None else f"{r.predicted:,}"
            rows.append([r.block or "(model)", r.role, f"{r.measured:,}", predicted, ratio, r.term,
                         useful, r.reason])
        return tabulate(rows, headers=["block", "role", "measured MACs", "predicted MACs", "ratio",
                                       "term",
                                       "useful MACs", "reason"], tablefmt=tablefmt,
                        colalign=("left", "left", "right", "right", "right", "left", "right",
                                  "left"))


def reconcile(assignments: Mapping[CapturedOp, Assignment], facts: ModelFacts,
              module_inputs: Mapping[ModuleCall, InputShapes],
              spec: TransformerSpec | None = None) -> Reconciliation:
    """Per block and role: measured against predicted MACs (see the module docstring).
    ``assignments`` are a profile's role assignments by record (forward ops are
    reconciled), ``module_inputs`` the shapes of each module call's inputs
    (:meth:`flopscope.Profile.module_inputs`)."""
    measured: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    role_modules: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    factor_modules: dict[str, set[str]] = defaultdict(set)
    kernels: dict[str, set[str]] = defaultdict(set)
    causal_kernels: set[str] = set()
    block_ops: dict[str, list[CapturedOp]] = defaultdict(list)
    for op, assignment in assignments.items():
        if op.phase != FORWARD:
            continue
        block = assignment.block
        block_ops[block].append(op)
        for role, macs in assignment.parts.items():
            measured[block][role] += macs
            role_modules[block][role].add(op.module or "")
        if assignment.factor:
            factor_modules[block].add(op.module or "")
        if op.parts:
            kernels[block].add(str(op.target))
            if kernel_is_causal(op):
                causal_kernels.add(block)
    calls = calls_by_path(module_inputs)
    rows: list[ReconcileRow] = []
    for block, roles in measured.items():
        context = Block(block, roles, facts, calls.get(block, []), spec, block in causal_kernels,
                         role_modules[block], calls, block_ops[block],
                        frozenset(factor_modules[block]))
        found: list[ReconcileRow] = []
        for group in dict.fromkeys(Role(r).group for r in ROLE_ORDER if r in roles):
            predict = ROW_BUILDERS.get(group)
            if predict is not None:
                found += predict(context)
        if kernels.get(block):  # a fused kernel ran this block (SDPA, a fast path): say which
            fused = "fused kernel " + ", ".join(sorted(kernels[block]))
            found = [replace(r, basis=f"{r.basis}; {fused}" if r.basis else fused) for r in found]
        rows += found
    return Reconciliation(tuple(rows))


ROW_BUILDERS: dict[RoleGroup, Callable[[Block], list[ReconcileRow]]] = {
    RoleGroup.ATTENTION: attention_rows,
    RoleGroup.MIXING: mixing_rows,
    RoleGroup.FFN: ffn_rows,
    RoleGroup.CONV: conv_rows,
    RoleGroup.RECURRENT: recurrent_rows,
    RoleGroup.LOGITS: logits_rows,
}
"""The closed form of each role group: a new group's prediction is one builder here."""
