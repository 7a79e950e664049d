"""Reconciliation: measured multiplies per block and role against exact closed-form predictions.

Predictions use what the model *declares* (:class:`~flopscope.capture.facts.ModelFacts`: module attributes,
parameter shapes, the Hugging Face config) and the shapes of each block's inputs (its token counts), never
the shapes of the ops that ran inside it; a user can state the hyper-parameters instead with a
:class:`TransformerSpec`. Hyper-parameter names: :mod:`flopscope.conventions`. Closed forms are those
of ``docs/formulas.md`` sections 6 and 7 (MACs):

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

``token_mixing`` is FNet's Fourier sublayer, a 2-D FFT over (n, d) of the block's input, with F(N) the MACs
of one length-N complex FFT (:func:`~flopscope.formulas.registry.fft_macs`, ``docs/formulas.md`` section 12).

For attention the *useful* work is reported beside the executed work: a causal mask executed by a dense
kernel runs ``n_q·n_k`` pairs but needs ``n_q·n_k − n_q(n_q−1)/2``; a sliding window W needs
``W·n − W(W−1)/2`` (restricted attention, ``r·n·d``). ``total()`` and ``by_role()`` stay executed work.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from tabulate import tabulate

from ..attribute.paths import inside
from ..attribute.roles import Assignment
from ..capture.facts import ModelFacts
from ..capture.module_tracker import ModuleCall
from ..capture.records import FORWARD, CapturedOp
from ..conventions import (
    EXPERT_FFN_WIDTH,
    EXPERTS,
    FFN_WIDTH,
    HEAD_WIDTH,
    HEADS,
    KEY_INPUTS,
    KV_GROUPS,
    KV_HEADS,
    LINEAR_IN,
    LINEAR_OUT,
    MULTI_QUERY,
    QUERY_INPUTS,
    TOP_K,
    VOCAB,
    WIDTH,
    Names,
)
from ..formulas.linear_algebra import fft_macs
from ..formulas.registry import OpFamily, prod
from ..role import LINEAR_CORE, ROLE_ORDER, Role, RoleGroup, roles_in
from .attention import declared_mask, kernel_is_causal, useful_pairs

ATTENTION_ROLES = tuple(sorted(roles_in(RoleGroup.ATTENTION), key=lambda r: r == Role.OUT_PROJ))
"""Attention rows in the order data flows through a block: projections, scores, weighted sum, output."""
FFN_ROLES = roles_in(RoleGroup.FFN)
TERMS = {r.value: r.term for r in Role if r.term}


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
"""Each role's closed form (the module docstring's table) and the hyper-parameters of a reconciliation row's
``basis`` it depends on: what explains a change of the role between two models (:mod:`flopscope.diff`)."""


@dataclass(frozen=True)
class TransformerSpec:
    """Hyper-parameters stated by the user (they win over what the model declares).

    n: tokens per sequence (queries; keys too unless ``n_k``); d: model width; h: query heads;
    d_ff: FFN width; n_kv: key/value heads (default h); d_k: head width (default d / h);
    batch: sequences; causal / window: the attention mask, for the useful-work column.
    """

    n: int | None = None
    d: int | None = None
    h: int | None = None
    d_ff: int | None = None
    n_kv: int | None = None
    d_k: int | None = None
    n_k: int | None = None
    batch: int | None = None
    gated: bool | None = None
    causal: bool | None = None
    window: int | None = None


@dataclass(frozen=True)
class ReconcileRow:
    block: str  # module path of the block instance ("" is the root)
    role: str
    measured: int  # MACs executed
    predicted: int | None  # MACs of the closed form (None: no prediction for this role)
    term: str  # the complexity term it realises: "n·d²", "n²·d", "k·n·d²", "r·n·d"
    useful: int | None = None  # MACs the mask leaves useful (attention core; None: same as executed)
    reason: str = ""  # why measured != predicted, when it is not
    basis: str = ""  # the hyper-parameters behind the prediction and where they came from

    @property
    def ratio(self) -> Fraction | None:
        """measured / predicted, exactly (``None`` without a prediction)."""
        if self.predicted is None:
            return None
        if self.predicted == 0:
            return Fraction(1) if self.measured == 0 else None
        return Fraction(self.measured, self.predicted)

    @property
    def exact(self) -> bool:
        return self.ratio == 1


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
            rows.append([r.block or "(model)", r.role, f"{r.measured:,}", predicted, ratio, r.term, useful, r.reason])
        return tabulate(rows, headers=["block", "role", "measured MACs", "predicted MACs", "ratio", "term",
                                       "useful MACs", "reason"], tablefmt=tablefmt,
                        colalign=("left", "left", "right", "right", "right", "left", "right", "left"))


# --------------------------------------------------------------------------------------------------
def reconcile(assignments: Mapping[CapturedOp, Assignment], facts: ModelFacts,
              module_inputs: Mapping[ModuleCall, InputShapes], spec: TransformerSpec | None = None) -> Reconciliation:
    """Per block and role: measured against predicted MACs (see the module docstring). ``assignments``
    are a profile's role assignments by record (forward ops are reconciled), ``module_inputs`` the shapes of each
    module call's inputs (:meth:`flopscope.Profile.module_inputs`)."""
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
    calls = _calls_by_path(module_inputs)
    rows: list[ReconcileRow] = []
    for block, roles in measured.items():
        context = _Block(block, roles, facts, calls.get(block, []), spec, block in causal_kernels,
                         role_modules[block], calls, block_ops[block], frozenset(factor_modules[block]))
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


InputShapes = tuple[tuple[int | str, tuple[int, ...]], ...]


def _calls_by_path(inputs: Mapping[Any, InputShapes]) -> dict[str, list[InputShapes]]:
    out: dict[str, list[InputShapes]] = defaultdict(list)
    for call, shapes in inputs.items():
        out[call.path].append(shapes)
    return out


@dataclass(frozen=True)
class _Block:
    """What a row builder knows of one block: its path, measured MACs per role, the model's facts, the
    input shapes of each call of the block, the user's spec, and which modules ran each role."""

    path: str
    measured: Mapping[str, int]
    facts: ModelFacts
    calls: list[InputShapes]
    spec: TransformerSpec | None
    causal_kernel: bool
    role_modules: Mapping[str, set[str]]
    module_calls: Mapping[str, list[InputShapes]]  # every module's calls (a projection's own inputs)
    ops: Sequence[CapturedOp] = ()  # the block's forward ops with multiplies (what ran: for the reasons only)
    factors: frozenset[str] = frozenset()  # modules that are factors of the projections they feed (roles 3.5)

    def linear_calls(self, role: str) -> list[_LinearCalls] | None:
        """Each module that ran ``role`` in this block, as a linear layer with its declared widths and the
        (batch, tokens) of each of its calls; ``None`` unless every one declares its widths and was called on inputs
        of its declared width."""
        found = []
        for path in sorted(self.role_modules.get(role, set())):
            width_in = self.facts.declared(LINEAR_IN, [path], config=False)
            width_out = self.facts.declared(LINEAR_OUT, [path], config=False)
            calls = [_batch_and_length(shapes, width_in, (0, *QUERY_INPUTS)) if width_in else None
                     for shapes in self.module_calls.get(path, [])]
            if width_in is None or width_out is None or not calls or any(c is None for c in calls):
                return None
            found.append(_LinearCalls(path, width_in, width_out, [c for c in calls if c is not None]))
        return found or None

    def unrecognised(self, roles: Sequence[str], why: str = "") -> list[ReconcileRow]:
        """Rows without a prediction, saying why."""
        reason = "unrecognised block" + (f": {why}" if why else "")
        return [ReconcileRow(self.path, r, self.measured.get(r, 0), None, TERMS[r], reason=reason) for r in roles]


@dataclass(frozen=True)
class _LinearCalls:
    """A linear layer that ran one role: its declared widths and the (batch, tokens) of each call's input."""

    path: str
    width_in: int
    width_out: int
    calls: list[tuple[int, int]]

    def macs(self, width_in: int | None = None) -> int:
        """B·n·in·out summed over its calls (``width_in``: the rows that belong to the role, where its input is a
        concatenation)."""
        return sum(batch * n for batch, n in self.calls) * (width_in or self.width_in) * self.width_out


# --------------------------------------------------------------------------------------------------
# attention
@dataclass(frozen=True)
class _Attention:
    d: int  # model width (projection input)
    d_q: int  # h·d_k: query width, also the width of scores and weighted sum
    d_kv: int  # n_kv·d_k: key / value width
    source: str  # "h=8 n_kv=2 d_k=64 (config)" or "(weight shapes)"
    d_k: int | None = None  # head width (None: not declared, only the projection widths are known)


def _own_linear_width(b: _Block, role: str) -> int | None:
    """The declared output width of the one linear layer that ran ``role`` in this block, where it runs that role
    alone (not a fused q/k/v projection)."""
    modules = b.role_modules.get(role, set())
    if len(modules) != 1 or any(modules == b.role_modules.get(other) for other in ("q_proj", "k_proj", "v_proj")
                                if other != role):
        return None
    return b.facts.declared(LINEAR_OUT, list(modules), config=False)


def _core_macs(measured: Mapping[str, int], batch: int, n_q: int, n_k: int, hyper: _Attention) -> dict[str, int]:
    """The attention core's MACs for one call: the quadratic form (scores, weighted sum: B·h·n_q·n_k·d_k
    each), or, where the block's core was found in the linear form, φ(K)ᵀV (B·n_k·n_kv·d_k·d_v), φ(Q)·state
    (B·n_q·h·d_k·d_v) and, where there is one, the normaliser φ(Q)·Σφ(K) (B·n_q·h·d_k), with d_v = d_k."""
    if not any(role in measured for role in LINEAR_CORE):
        return {"attn_scores": batch * n_q * n_k * hyper.d_q, "attn_weighted_sum": batch * n_q * n_k * hyper.d_q}
    if hyper.d_k is None:
        return {}
    core = {"attn_kv_state": batch * n_k * hyper.d_kv * hyper.d_k, "attn_readout": batch * n_q * hyper.d_q * hyper.d_k}
    if "attn_normaliser" in measured:  # present or not by the block's design, as the gate of a gated FFN
        core["attn_normaliser"] = batch * n_q * hyper.d_q
    return core


@dataclass(frozen=True)
class _LatentAttention:
    """Multi-head latent attention (DeepSeek-V2 / V3, Kimi K2; formulas.md section 7.3): queries through a low-rank
    factor of rank ``r_q`` (or one projection where ``r_q`` is 0), keys and values expanded from one latent of rank
    ``r_kv``, each head's key ``nope`` columns from the latent and ``rope`` rotary columns shared by all heads."""

    h: int
    r_q: int  # 0: no query factor (q_proj: d -> h·(nope + rope))
    r_kv: int
    nope: int
    rope: int
    d_v: int
    source: str

    def macs(self, batch: int, n_q: int, n_k: int, d: int) -> dict[str, int]:
        """Per role, for one call (docs/roles.md section 3.5: the latent and the shared rotary key are k_proj)."""
        h, r_q, r_kv, nope, rope, d_v = self.h, self.r_q, self.r_kv, self.nope, self.rope, self.d_v
        query = d * r_q + r_q * h * (nope + rope) if r_q else d * h * (nope + rope)
        return {"q_proj": batch * n_q * query,
                "k_proj": batch * n_k * (d * (r_kv + rope) + r_kv * h * nope),
                "v_proj": batch * n_k * r_kv * h * d_v,
                "attn_scores": batch * h * n_q * n_k * (nope + rope),
                "attn_weighted_sum": batch * h * n_q * n_k * d_v,
                "out_proj": batch * n_q * h * d_v * d}


def _latent_attention(b: _Block) -> _LatentAttention | None:
    """The block's latent-attention hyper-parameters, where its module declares them (``kv_lora_rank``, ...)."""
    facts, paths = b.facts, [b.path]
    values = {name: facts.declared(Names(module=(name,)), paths, config=False)
              for name in ("num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                           "v_head_dim")}
    needed = ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if any(values[name] is None for name in needed):
        return None
    h, r_kv, nope, rope, d_v = (int(values[name] or 0) for name in needed)
    r_q = int(values["q_lora_rank"] or 0)
    return _LatentAttention(h, r_q, r_kv, nope, rope, d_v,
                            f"latent attention r_q={r_q or '-'} r_kv={r_kv} nope={nope} rope={rope} d_v={d_v}")


def _attention_hyper(b: _Block) -> _Attention | None:
    facts, spec = b.facts, b.spec
    paths = inside(facts.types, b.path)
    source = "module attributes"
    d = facts.declared(WIDTH, paths, config=False)
    q_modules = b.role_modules.get("q_proj", set())
    if d is None and len(q_modules) == 1:  # the query projection's declared input width (a stage's own d)
        d = facts.declared(LINEAR_IN, [next(iter(q_modules))], config=False)
    h = facts.declared(HEADS, paths, config=False)
    n_kv = facts.declared(KV_HEADS, paths, config=False)
    groups = facts.declared(KV_GROUPS, paths, config=False)
    d_k = facts.declared(HEAD_WIDTH, paths, config=False)
    if facts.config is not None:
        d = facts.declared(WIDTH) if d is None else d
        h = facts.declared(HEADS) if h is None else h
        if n_kv is None and groups is None:
            n_kv = facts.declared(KV_HEADS)
            if n_kv is None and facts.config_value(*MULTI_QUERY.config):
                n_kv = 1
        d_k = facts.declared(HEAD_WIDTH) if d_k is None else d_k
        source = "module attributes and config"
    if spec is not None:
        d, h = spec.d or d, spec.h or h
        n_kv, d_k = spec.n_kv or n_kv, spec.d_k or d_k
        source = "TransformerSpec"
    if d is not None and h is not None and h > 0:
        if n_kv is None and groups is not None and groups > 0:
            n_kv = h // groups
        d_k = d_k if d_k is not None else d // h
        if n_kv is None and d_k:  # no key / value head count declared: the key projection's width says it
            k_out = _own_linear_width(b, "k_proj")
            if k_out is not None and k_out % d_k == 0 and k_out != h * d_k:
                n_kv, source = k_out // d_k, f"{source}; n_kv from the key projection's width"
        n_kv = n_kv if n_kv is not None else h
        return _Attention(d, h * d_k, n_kv * d_k, f"h={h} n_kv={n_kv} d_k={d_k} ({source})", d_k)
    # no declared head count: the projection weights give the widths (heads only split them)
    q_mods, k_mods = b.role_modules.get("q_proj", set()), b.role_modules.get("k_proj", set())
    if len(q_mods) == 1 and len(k_mods) == 1 and q_mods != k_mods:
        q_mod, k_mod = next(iter(q_mods)), next(iter(k_mods))
        d_in = facts.declared(Names(module=("in_features",)), [q_mod], config=False)
        d_q = facts.declared(Names(module=("out_features",)), [q_mod], config=False)
        d_kv = facts.declared(Names(module=("out_features",)), [k_mod], config=False)
        if d_in is not None and d_q is not None and d_kv is not None:
            return _Attention(d_in, d_q, d_kv, "widths from the projection weights")
    return None


def _batch_and_length(shapes: InputShapes, width: int, names: Sequence[int | str], seq_first: bool = False
                      ) -> tuple[int, int] | None:
    """(batch, length) of the first named input whose last dim is ``width``."""
    by_key = dict(shapes)
    for name in names:
        shape = by_key.get(name)
        if shape is not None and len(shape) >= 2 and shape[-1] == width:
            if seq_first and len(shape) == 3:
                return shape[1], shape[0]
            return prod(shape[:-2]), shape[-2]
        if shape is not None and len(shape) == 1 and shape[-1] == width:
            return 1, 1
    return None


def _attention_rows(b: _Block) -> list[ReconcileRow]:
    block, measured, facts, calls, spec = b.path, b.measured, b.facts, b.calls, b.spec
    hyper = _attention_hyper(b)
    present = [r for r in ATTENTION_ROLES if r in measured]
    streams = _stream_attention_rows(b) if spec is None and _latent_attention(b) is None else None
    if streams is not None:  # (latent attention has its own closed form, below)
        return streams
    if hyper is None or (not calls and (spec is None or spec.n is None)):
        return b.unrecognised(present, "no declared width / heads or no recorded input")
    seq_first = facts.attr(block, "batch_first") is False
    predicted: dict[str, int] = defaultdict(int)
    useful: dict[str, int] = defaultdict(int)
    declared_causal, window = declared_mask(block, facts)  # one source: flopscope.predict.attention
    causal = b.causal_kernel or declared_causal
    if spec is not None:
        causal = spec.causal if spec.causal is not None else causal
        window = spec.window if spec.window is not None else window
    basis = ""
    latent = _latent_attention(b)
    if latent is not None:
        hyper = replace(hyper, source=f"{latent.source} (module attributes)")
    keys = b.linear_calls("k_proj") if spec is None else None
    key_calls = keys[0].calls if keys is not None and len(keys) == 1 and len(keys[0].calls) == len(calls) else None
    for i, shapes in enumerate(calls or [()]):
        if spec is not None and spec.n is not None:
            batch, n_q = spec.batch or 1, spec.n
            n_k = spec.n_k or spec.n
        else:
            q = _batch_and_length(shapes, hyper.d, QUERY_INPUTS, seq_first)
            if q is None:
                continue
            batch, n_q = q
            kv_names: tuple[int | str, ...] = (*KEY_INPUTS, 1) if seq_first or facts.attr(block, "kdim") else KEY_INPUTS
            kv = _batch_and_length(shapes, facts.attr(block, "kdim") or _key_width(b) or hyper.d, kv_names, seq_first)
            if kv is None and key_calls is not None and key_calls[i][0] == batch:
                kv = key_calls[i]  # a context passed by position: the key projection's own input says its tokens
            n_k = kv[1] if kv is not None else n_q
        d, d_q, d_kv = hyper.d, hyper.d_q, hyper.d_kv  # d_q = h·d_k, d_kv = n_kv·d_k
        # nn.MultiheadAttention declares the key / value input widths and keys appended after projection; a
        # cross-attention's key projection declares the width of the context it reads (a UNet's text tokens)
        k_in = facts.attr(block, "kdim") or _key_width(b) or d
        v_in = facts.attr(block, "vdim") or _key_width(b, "v_proj") or d
        appended = int("bias_k" in facts.param_shapes.get(block, {})) + int(bool(facts.attr(block, "add_zero_attn")))
        if latent is not None:  # multi-head latent attention: its own closed form
            for role, macs in latent.macs(batch, n_q, n_k, d).items():
                predicted[role] += macs
        else:
            predicted["q_proj"] += batch * n_q * d * d_q
            predicted["k_proj"] += batch * n_k * k_in * d_kv
            predicted["v_proj"] += batch * n_k * v_in * d_kv
            n_k += appended
            for role, macs in _core_macs(measured, batch, n_q, n_k, hyper).items():
                predicted[role] += macs
            predicted["out_proj"] += batch * n_q * d_q * d
        pairs = useful_pairs(n_q, n_k, causal and n_k >= n_q, window)
        useful["attn_scores"] += batch * pairs * d_q
        useful["attn_weighted_sum"] += batch * pairs * d_q
        basis = (f"B={batch} n_q={n_q} n_k={n_k} d={d} {hyper.source}"
                 f"{' causal' if causal else ''}{f' window={window}' if window else ''}")
    if not predicted:  # no call input of the declared width: the block's interface is not the usual one
        return b.unrecognised(present, f"no input of width d={hyper.d} among its call's inputs")
    rows = []
    for role in ATTENTION_ROLES:
        if role not in measured and not predicted.get(role):
            continue
        got = measured.get(role, 0)
        row = ReconcileRow(block, role, got, predicted.get(role), TERMS[role],
                           useful=useful.get(role) if useful.get(role) != predicted.get(role) else None,
                           basis=basis)
        rows.append(replace(row, reason=_attention_reason(row, hyper)) if not row.exact else row)
    return rows


def _key_width(b: _Block, role: str = "k_proj") -> int | None:
    """The input width the block's one key (or value) projection declares, where it differs from the queries': a
    cross-attention reading a context of another width."""
    keys, queries = b.role_modules.get(role, set()), b.role_modules.get("q_proj", set())
    if len(keys) != 1 or len(queries) != 1:
        return None
    width = b.facts.declared(LINEAR_IN, list(keys), config=False)
    return width if width != b.facts.declared(LINEAR_IN, list(queries), config=False) else None


def _stream_attention_rows(b: _Block) -> list[ReconcileRow] | None:
    """Attention over the concatenation of token streams, each with its own projections: joint attention (SD3,
    Flux's double-stream blocks, HunyuanVideo: image tokens through ``to_q`` / ``to_k`` / ``to_v``, text tokens
    through ``add_q_proj`` / ...) and a single-stream block whose attention runs on ``cat([text, image])`` made inside
    the block. Each projection's MACs are B·n·in·out from its declared widths and the tokens of its own input; the
    core runs over n_q = Σ of the query projections' tokens and n_k = Σ of the key projections', B·n_q·n_k·(h·d_k)
    each for scores and weighted sum. Used where the block's own inputs do not say the attention's tokens: several
    projections per role, or a query projection that sees other tokens than the block's query input. ``None``
    otherwise, or where a projection is no declared linear layer."""
    linears = {role: b.linear_calls(role) for role in ("q_proj", "k_proj", "v_proj", "out_proj")}
    if any(linears[role] is None for role in ("q_proj", "k_proj", "v_proj")) \
            or any(role in b.measured for role in LINEAR_CORE):
        return None
    # a fused projection (one qkv linear per stream) gives each of its roles an equal share of its output columns
    shares = Counter(m.path for role in ("q_proj", "k_proj", "v_proj") for m in linears[role] or [])
    for role in ("q_proj", "k_proj", "v_proj"):
        linears[role] = [replace(m, width_out=m.width_out // shares[m.path]) for m in linears[role] or []]
    every = {role: linears[role] or [] for role in ("q_proj", "k_proj", "v_proj")}
    # the streams: the projections that write the core's queries, keys and values (a factor before one of them,
    # NucleusMoE's encoder_proj before add_k_proj / add_v_proj, is no stream of its own: its tokens are theirs)
    q, k, v = ([m for m in every[role] if m.path not in b.factors] or every[role]
               for role in ("q_proj", "k_proj", "v_proj"))
    query_input = next((t for t in (_batch_and_length(shapes, q[0].width_in, QUERY_INPUTS) for shapes in b.calls)
                        if t is not None), None)
    joint = len(q) > 1 or len(k) > 1
    if not joint and query_input is not None and query_input == q[0].calls[0]:
        return None  # the block's input says the tokens: the declared closed form applies
    calls = len(q[0].calls)
    if any(len(m.calls) != calls for m in (*q, *k)) or len({m.width_out for m in q}) != 1:
        return None
    d_q, d_v = q[0].width_out, v[0].width_out
    predicted = {role: sum(m.macs() for m in every[role]) for role in every}
    scores = weighted = 0
    for i in range(calls):
        batch = q[0].calls[i][0]
        n_q, n_k = sum(m.calls[i][1] for m in q), sum(m.calls[i][1] for m in k)
        scores += batch * n_q * n_k * d_q
        weighted += batch * n_q * n_k * d_v
    predicted |= {"attn_scores": scores, "attn_weighted_sum": weighted}
    outs = linears["out_proj"]
    if outs is not None:  # an output projection reading a concatenation is out_proj for the attention's rows only
        predicted["out_proj"] = sum(m.macs(min(m.width_in, d_v)) for m in outs)
    names = ", ".join(dict.fromkeys(
        f"{m.path.rsplit('.', 1)[-1]} {m.width_in}->{m.width_out * shares[m.path]}"
        f"{f' (fused: {m.width_out} per role)' if shares[m.path] > 1 else ''} n={m.calls[0][1]}"
        for m in (*every["q_proj"], *every["k_proj"], *every["v_proj"])))
    basis = (f"{'joint' if joint else 'single-stream'} attention over n_q={sum(m.calls[0][1] for m in q)} "
             f"n_k={sum(m.calls[0][1] for m in k)} tokens, h·d_k={d_q}; per-stream projections ({names}; "
             "widths declared, tokens of each projection's input)")
    rows = []
    for role in ATTENTION_ROLES:
        if role in b.measured or predicted.get(role):
            rows.append(ReconcileRow(b.path, role, b.measured.get(role, 0), predicted.get(role), TERMS[role],
                                     basis=basis))
    return rows


def _attention_reason(row: ReconcileRow, hyper: _Attention) -> str:
    ratio = row.ratio
    if row.measured == 0:
        return "role not found in this block: its multiplies are attributed elsewhere (see by_block())"
    if ratio is None:
        return ""
    if row.role in ("attn_scores", "attn_weighted_sum") and ratio > 1 and ratio.denominator == 1:
        return f"keys include cached tokens: each query meets {ratio}x the keys of its input (KV cache)"
    if row.role in LINEAR_CORE and hyper.d_k and ratio == Fraction(hyper.d_k + 1, hyper.d_k):
        return ("values padded with a row of ones: the normaliser φ(Q)·Σφ(K) computed inside the state (d_v + 1 "
                "per head, Sana)")
    if row.role in ("k_proj", "v_proj") and ratio == Fraction(hyper.d_q, hyper.d_kv):
        return "grouped-query attention: K/V projected for the query heads, not n_kv heads"
    if ratio.denominator == 1 and ratio > 1:
        return f"executed on {ratio}x the tokens of the block input (padding or repeated calls)"
    return ""


# --------------------------------------------------------------------------------------------------
# FFN, conv, recurrent, logits
def _ffn_rows(b: _Block) -> list[ReconcileRow]:
    block, measured, facts, calls, spec = b.path, b.measured, b.facts, b.calls, b.spec
    gated = ("ffn_gate" in measured) if spec is None or spec.gated is None else spec.gated
    d, d_ff, source = _ffn_widths(b, gated)
    experts = facts.declared(TOP_K)
    if spec is not None:
        d, d_ff, source = spec.d or d, spec.d_ff or d_ff, "TransformerSpec"
    present = [r for r in FFN_ROLES if r in measured]
    fused = {m for role in ("q_proj", "k_proj", "v_proj") for m in b.role_modules.get(role, set())}
    shared = {m for m in fused & b.role_modules.get("ffn_up", set())
              if facts.declared(LINEAR_IN, [m], config=False) is not None}  # a linear layer whose width would be read
    if shared and spec is None and source == "weight shapes":
        return b.unrecognised(present, f"the up projection {sorted(shared)[0]} is fused with attention's "
                                       "projections: its declared width is not the FFN's (a TransformerSpec says d_ff)")
    if d is None or d_ff is None:
        return b.unrecognised(present)
    # routed experts: each token meets top_k of them; a shared expert (or a dense FFN) sees every token once
    routed = facts.declared(EXPERTS, inside(facts.types, block), config=False)
    top_k = experts if experts is not None and routed else 1
    tokens = _tokens_of(calls, d)
    ups = b.linear_calls("ffn_up")
    up_tokens = sum(batch * n for m in ups for batch, n in m.calls) if ups is not None else 0
    source_of_tokens = ""
    if up_tokens and top_k == 1 and up_tokens != tokens:
        # the hidden layer runs on other tokens than the block's query input (a container never called, a parallel
        # block over cat([text, image]) made inside it): the up projection's own input says them
        tokens, source_of_tokens = up_tokens, ", tokens of the up projection's input"
    if spec is not None and spec.n is not None:
        tokens = (spec.batch or 1) * spec.n
    if not tokens:
        return b.unrecognised(present, f"no input of width d={d} among its call's inputs")
    # the width the down projection writes: an MLP that changes the width (a timestep embedder's 256 → d → d)
    d_out = _own_linear_width(b, "ffn_down") if spec is None else None
    predicted = {"ffn_up": tokens * top_k * d * d_ff, "ffn_down": tokens * top_k * d_ff * (d_out or d)}
    if gated:
        predicted["ffn_gate"] = tokens * top_k * d * d_ff
    moe = f" top_k={top_k} experts per token" if top_k > 1 else ""
    out = f" d_out={d_out}" if d_out not in (None, d) else ""
    basis = f"tokens={tokens} d={d} d_ff={d_ff}{out}{' gated' if gated else ''}{moe} ({source}{source_of_tokens})"
    rows = []
    for role in FFN_ROLES:
        if role in measured or role in predicted:
            row = ReconcileRow(block, role, measured.get(role, 0), predicted.get(role), TERMS[role], basis=basis)
            if not row.exact and row.ratio is not None and row.ratio.denominator == 1 and row.ratio > 1:
                row = replace(row, reason=f"executed on {row.ratio}x the tokens of the block input")
            rows.append(row)
    return rows


def _tokens_of(calls: list[InputShapes], width: int) -> int:
    """Tokens (batch x length) of the block's query inputs of this width, summed over its calls."""
    found = (_batch_and_length(shapes, width, QUERY_INPUTS) for shapes in calls)
    return sum(t[0] * t[1] for t in found if t is not None)


def _ffn_widths(b: _Block, gated: bool) -> tuple[int | None, int | None, str]:
    """(d, d_ff): from the up projection's declared weight (nn.Linear / GPT-2 Conv1D), else the config."""
    facts = b.facts
    ups = b.role_modules.get("ffn_up", set())
    if len(ups) == 1:
        up = next(iter(ups))
        d_in = facts.declared(LINEAR_IN, [up], config=False)
        width = facts.declared(LINEAR_OUT, [up], config=False)
        if d_in is not None and width is not None:
            fused = gated and b.role_modules.get("ffn_gate") == ups  # one gate_up projection, split in two
            return d_in, width // 2 if fused else width, "weight shapes"
    d = facts.declared(WIDTH)
    moe = facts.declared(TOP_K) is not None
    d_ff = (facts.declared(EXPERT_FFN_WIDTH) if moe else None) or facts.declared(FFN_WIDTH)
    if d is not None and d_ff is not None:
        return d, d_ff, "config"
    # a fused kernel (the encoder-layer fast path): the block's own linear layers declare the widths
    linears = [p for p in inside(facts.types, b.path) if (p != b.path or not p) and facts.attr(p, "in_features")]
    ins = [facts.attr(p, "in_features") for p in linears]
    outs = [facts.attr(p, "out_features") for p in linears]
    if ins and outs:
        return min(ins), max(outs), "weight shapes"
    return None, None, "unknown"


def _conv_rows(b: _Block) -> list[ReconcileRow]:
    block, got, calls = b.path, b.measured.get("conv", 0), b.calls
    a = b.facts.attributes.get(block, {})
    needed = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups")
    if not all(k in a for k in needed) or not calls:
        return b.unrecognised(["conv"])
    kernel = tuple(a["kernel_size"])
    predicted = sum(_conv_macs(a, shape, a["padding"]) for shape in (dict(shapes).get(0) for shapes in calls)
                    if shape is not None)
    basis = f"C_in={a['in_channels']} C_out={a['out_channels']} k={kernel} groups={a['groups']}"
    row = ReconcileRow(block, "conv", got, predicted, TERMS["conv"], basis=basis)
    if row.exact:
        return [row]
    # a module that pads its input in its forward (a causal convolution's time padding) runs the declared convolution
    # on a larger input than it was given: the closed form on the input the convolution ran on says so
    ran = [op for op in b.ops if op.spec is not None and op.spec.family is OpFamily.CONV and op.input_shapes
           and len(op.args) > 4 and isinstance(op.args[4], (list, tuple))]
    given = [dict(shapes).get(0) for shapes in calls]
    if ran and sum(_conv_macs(a, op.input_shapes[0], tuple(op.args[4])) for op in ran) == got and any(
            tuple(op.input_shapes[0]) not in given for op in ran):
        sizes = (", ".join(sorted({str(tuple(g)) for g in given if g is not None})) + " -> "
                 + ", ".join(sorted({str(tuple(op.input_shapes[0])) for op in ran})))
        row = replace(row, reason=f"the module pads its input in its forward before the convolution ({sizes}): "
                                  "on the padded input the declared convolution is exact")
    return [row]


def _conv_macs(a: Mapping[str, Any], shape: Sequence[int], padding: Any) -> int:
    """B·C_out·Π(L_out)·(C_in/g)·Π(k) of a convolution with the declared attributes ``a`` on an input of ``shape``
    (``padding``: the declared one, or what the convolution was called with)."""
    kernel = tuple(a["kernel_size"])
    dims = len(kernel)
    spatial = tuple(shape[-dims:])
    batch = prod(shape[:-dims - 1]) if len(shape) > dims + 1 else 1
    if a.get("transposed"):
        return batch * prod(spatial) * a["in_channels"] * (a["out_channels"] // a["groups"]) * prod(kernel)
    if padding == "same":
        out = spatial
    else:
        pad = (0,) * dims if padding == "valid" else tuple(padding)
        out = tuple((s + 2 * pad[i] - a["dilation"][i] * (kernel[i] - 1) - 1) // a["stride"][i] + 1
                    for i, s in enumerate(spatial))
    return batch * a["out_channels"] * prod(out) * (a["in_channels"] // a["groups"]) * prod(kernel)


def _recurrent_rows(b: _Block) -> list[ReconcileRow]:
    block, got, calls = b.path, b.measured.get("recurrent", 0), b.calls
    a = b.facts.attributes.get(block, {})
    gates = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}.get(str(a.get("mode")))
    if gates is None or not calls:
        return b.unrecognised(["recurrent"])
    d_in, d_h, layers = a["input_size"], a["hidden_size"], a["num_layers"]
    dirs, p = (2 if a["bidirectional"] else 1), a.get("proj_size") or 0
    out = p or d_h
    per_token = 0
    for layer in range(layers):
        width = d_in if layer == 0 else dirs * out
        per_token += dirs * (gates * d_h * (width + out) + p * d_h)
    tokens = 0
    for shapes in calls:
        shape = dict(shapes).get(0)
        if shape is not None:
            tokens += prod(shape[:-1])
    basis = f"d_in={d_in} d_h={d_h} gates={gates} layers={layers} directions={dirs}"
    return [ReconcileRow(block, "recurrent", got, tokens * per_token, TERMS["recurrent"], basis=basis)]


def _logits_rows(b: _Block) -> list[ReconcileRow]:
    block, got, facts = b.path, b.measured.get("logits", 0), b.facts
    d = facts.declared(WIDTH) or facts.declared(Names(module=("in_features",)), [block])
    vocab = facts.declared(VOCAB) or facts.declared(Names(module=("out_features",)), [block])
    tokens = _tokens_of(b.calls, d) if d is not None else 0
    if d is None or vocab is None or not tokens:
        return b.unrecognised(["logits"])
    # B and n as the closed form names them (what a diff says moved), when every call has the same; else tokens
    shapes = {_batch_and_length(call, d, QUERY_INPUTS) for call in b.calls}
    only = next(iter(shapes)) if len(shapes) == 1 else None
    sizes = f"B={only[0]} n={only[1]}" if only is not None else f"tokens={tokens}"
    return [ReconcileRow(block, "logits", got, tokens * d * vocab, TERMS["logits"],
                         basis=f"{sizes} d={d} V={vocab}")]


def _mixing_rows(b: _Block) -> list[ReconcileRow]:
    """FNet's Fourier mixing (Lee-Thorp et al. 2021, ``Re(F_seq(F_hidden(x)))``): a complex 2-D FFT
    over (n, d) of each ``[B, n, d]`` input of the declared width, i.e. B·(d·F(n) + n·F(d)) MACs."""
    spec, got = b.spec, b.measured.get("token_mixing", 0)
    d, source = (spec.d, "TransformerSpec") if spec is not None and spec.d else (b.facts.declared(WIDTH), "config")
    if spec is not None and spec.n is not None:
        shapes = [(spec.batch or 1, spec.n)]
    else:
        shapes = [s for s in (_batch_and_length(call, d, QUERY_INPUTS) for call in b.calls) if s] if d else []
    if d is None or not shapes:
        return b.unrecognised(["token_mixing"], "no declared width d or no [B, n, d] input")
    predicted = sum(batch * (d * fft_macs(n) + n * fft_macs(d)) for batch, n in shapes)
    row = ReconcileRow(b.path, "token_mixing", got, predicted, TERMS["token_mixing"],
                       basis=f"2-D FFT over (n, d) d={d} ({source})")
    return [row if row.exact else replace(row, reason="not FNet's 2-D FFT over (n, d) of the block input: "
                                                      "no closed form for this transform")]


ROW_BUILDERS: dict[RoleGroup, Callable[[_Block], list[ReconcileRow]]] = {
    RoleGroup.ATTENTION: _attention_rows,
    RoleGroup.MIXING: _mixing_rows,
    RoleGroup.FFN: _ffn_rows,
    RoleGroup.CONV: _conv_rows,
    RoleGroup.RECURRENT: _recurrent_rows,
    RoleGroup.LOGITS: _logits_rows,
}
"""The closed form of each role group: a new group's prediction is one builder here."""
