"""Reconciliation rows of an attention block: each projection and the core against
B·n·d·(h·d_k) and B·h·n_q·n_k·d_k, with the useful pairs under masks beside the
executed ones (docs/formulas.md section 7)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from ..attribute.paths import inside
from ..conventions import (
    HEAD_WIDTH,
    HEADS,
    KEY_INPUTS,
    KV_GROUPS,
    KV_HEADS,
    LINEAR_IN,
    MULTI_QUERY,
    QUERY_INPUTS,
    WIDTH,
    Names,
)
from ..role import LINEAR_CORE
from .attention import declared_mask, useful_pairs
from .reconcile_block import ATTENTION_ROLES, TERMS, Block, ReconcileRow, batch_and_length, own_linear_width


@dataclass(frozen=True)
class _Attention:
    d: int  # model width (projection input)
    d_q: int  # h·d_k: query width, also the width of scores and weighted sum
    d_kv: int  # n_kv·d_k: key / value width
    source: str  # "h=8 n_kv=2 d_k=64 (config)" or "(weight shapes)"
    d_k: int | None = None  # head width (None: not declared, only the projection widths are known)


def _core_macs(measured: Mapping[str, int], batch: int, n_q: int, n_k: int,
               hyper: _Attention) -> dict[str, int]:
    """The attention core's MACs for one call: the quadratic form (scores, weighted sum:
    B·h·n_q·n_k·d_k each), or, where the block's core was found in the linear form,
    φ(K)ᵀV (B·n_k·n_kv·d_k·d_v), φ(Q)·state (B·n_q·h·d_k·d_v) and, where there is
    one, the normaliser φ(Q)·Σφ(K) (B·n_q·h·d_k), with d_v = d_k."""
    if not any(role in measured for role in LINEAR_CORE):
        return {"attn_scores": batch * n_q * n_k * hyper.d_q,
                "attn_weighted_sum": batch * n_q * n_k * hyper.d_q}
    if hyper.d_k is None:
        return {}
    core = {"attn_kv_state": batch * n_k * hyper.d_kv * hyper.d_k,
            "attn_readout": batch * n_q * hyper.d_q * hyper.d_k}
    # present or not by the block's design, as the gate of a gated FFN
    if "attn_normaliser" in measured:
        core["attn_normaliser"] = batch * n_q * hyper.d_q
    return core


@dataclass(frozen=True)
class _LatentAttention:
    """Multi-head latent attention (DeepSeek-V2 / V3, Kimi K2; formulas.md section 7.3):
    queries through a low-rank factor of rank ``r_q`` (or one projection where
    ``r_q`` is 0), keys and values expanded from one latent of rank ``r_kv``, each
    head's key ``nope`` columns from the latent and ``rope`` rotary columns shared by
    all heads."""

    h: int
    r_q: int  # 0: no query factor (q_proj: d -> h·(nope + rope))
    r_kv: int
    nope: int
    rope: int
    d_v: int
    source: str

    def macs(self, batch: int, n_q: int, n_k: int, d: int) -> dict[str, int]:
        """Per role, for one call (docs/roles.md section 3.5: the latent and the shared
        rotary key are k_proj)."""
        h, r_q, r_kv, nope, rope, d_v = self.h, self.r_q, self.r_kv, self.nope, self.rope, self.d_v
        query = d * r_q + r_q * h * (nope + rope) if r_q else d * h * (nope + rope)
        return {"q_proj": batch * n_q * query,
                "k_proj": batch * n_k * (d * (r_kv + rope) + r_kv * h * nope),
                "v_proj": batch * n_k * r_kv * h * d_v,
                "attn_scores": batch * h * n_q * n_k * (nope + rope),
                "attn_weighted_sum": batch * h * n_q * n_k * d_v,
                "out_proj": batch * n_q * h * d_v * d}


def _latent_attention(b: Block) -> _LatentAttention | None:
    """The block's latent-attention hyper-parameters, where its module declares them
    (``kv_lora_rank``, ...)."""
    facts, paths = b.facts, [b.path]
    values = {name: facts.declared(Names(module=(name,)), paths, config=False)
              for name in ("num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                           "qk_rope_head_dim",
                           "v_head_dim")}
    needed = ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if any(values[name] is None for name in needed):
        return None
    h, r_kv, nope, rope, d_v = (int(values[name] or 0) for name in needed)
    r_q = int(values["q_lora_rank"] or 0)
    return _LatentAttention(h, r_q, r_kv, nope, rope, d_v,
                            f"latent attention r_q={r_q or '-'} r_kv={r_kv} nope={nope} "
                            f"rope={rope} d_v={d_v}")


def _attention_hyper(b: Block) -> _Attention | None:
    facts, spec = b.facts, b.spec
    paths = inside(facts.types, b.path)
    source = "module attributes"
    d = facts.declared(WIDTH, paths, config=False)
    q_modules = b.role_modules.get("q_proj", set())
    # the query projection's declared input width (a stage's own d)
    if d is None and len(q_modules) == 1:
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
        # no key / value head count declared: the key projection's width says it
        if n_kv is None and d_k:
            k_out = own_linear_width(b, "k_proj")
            if k_out is not None and k_out % d_k == 0 and k_out != h * d_k:
                n_kv, source = k_out // d_k, f"{source}; n_kv from the key projection's width"
        n_kv = n_kv if n_kv is not None else h
        return _Attention(d, h * d_k, n_kv * d_k, f"h={h} n_kv={n_kv} d_k={d_k} ({source})", d_k)
    # no declared head count: the projection weights give the widths (heads only split
    # them)
    q_mods, k_mods = b.role_modules.get("q_proj", set()), b.role_modules.get("k_proj", set())
    if len(q_mods) == 1 and len(k_mods) == 1 and q_mods != k_mods:
        q_mod, k_mod = next(iter(q_mods)), next(iter(k_mods))
        d_in = facts.declared(Names(module=("in_features",)), [q_mod], config=False)
        d_q = facts.declared(Names(module=("out_features",)), [q_mod], config=False)
        d_kv = facts.declared(Names(module=("out_features",)), [k_mod], config=False)
        if d_in is not None and d_q is not None and d_kv is not None:
            return _Attention(d_in, d_q, d_kv, "widths from the projection weights")
    return None


def attention_rows(b: Block) -> list[ReconcileRow]:
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
            q = batch_and_length(shapes, hyper.d, QUERY_INPUTS, seq_first)
            if q is None:
                continue
            batch, n_q = q
            kv_names: tuple[int | str, ...] = (*KEY_INPUTS, 1) if seq_first or facts.attr(block, "kdim") else KEY_INPUTS
            kv = batch_and_length(shapes, facts.attr(block, "kdim") or _key_width(b) or hyper.d,
                                  kv_names, seq_first)
            if kv is None and key_calls is not None and key_calls[i][0] == batch:
                # a context passed by position: the key projection's own input says its
                # tokens
                kv = key_calls[i]
            n_k = kv[1] if kv is not None else n_q
        d, d_q, d_kv = hyper.d, hyper.d_q, hyper.d_kv  # d_q = h·d_k, d_kv = n_kv·d_k
        # nn.MultiheadAttention declares the key / value input widths and keys appended
        # after projection; a cross-attention's key projection declares the width of the
        # context it reads (a UNet's text tokens)
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
    # no call input of the declared width: the block's interface is not the usual one
    if not predicted:
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


def _key_width(b: Block, role: str = "k_proj") -> int | None:
    """The input width the block's one key (or value) projection declares, where it
    differs from the queries': a cross-attention reading a context of another width."""
    keys, queries = b.role_modules.get(role, set()), b.role_modules.get("q_proj", set())
    if len(keys) != 1 or len(queries) != 1:
        return None
    width = b.facts.declared(LINEAR_IN, list(keys), config=False)
    return width if width != b.facts.declared(LINEAR_IN, list(queries), config=False) else None


def _stream_attention_rows(b: Block) -> list[ReconcileRow] | None:
    """Attention over the concatenation of token streams, each with its own projections:
    joint attention (SD3, Flux's double-stream blocks, HunyuanVideo: image tokens
    through ``to_q`` / ``to_k`` / ``to_v``, text tokens through ``add_q_proj`` / ...)
    and a single-stream block whose attention runs on ``cat([text, image])`` made
    inside the block. Each projection's MACs are B·n·in·out from its declared widths
    and the tokens of its own input; the core runs over n_q = Σ of the query
    projections' tokens and n_k = Σ of the key projections', B·n_q·n_k·(h·d_k) each
    for scores and weighted sum. Used where the block's own inputs do not say the
    attention's tokens: several projections per role, or a query projection that sees
    other tokens than the block's query input. ``None`` otherwise, or where a
    projection is no declared linear layer."""
    linears = {role: b.linear_calls(role) for role in ("q_proj", "k_proj", "v_proj", "out_proj")}
    if any(linears[role] is None for role in ("q_proj", "k_proj", "v_proj")) \
            or any(role in b.measured for role in LINEAR_CORE):
        return None
    # a fused projection (one qkv linear per stream) gives each of its roles an equal
    # share of its output columns
    shares = Counter(m.path for role in ("q_proj", "k_proj", "v_proj") for m in linears[role] or [])
    for role in ("q_proj", "k_proj", "v_proj"):
        linears[role] = [replace(m, width_out=m.width_out // shares[m.path]) for m in linears[role] or []]
    every = {role: linears[role] or [] for role in ("q_proj", "k_proj", "v_proj")}
    # the streams: the projections that write the core's queries, keys and values (a
    # factor before one of them, NucleusMoE's encoder_proj before add_k_proj /
    # add_v_proj, is no stream of its own: its tokens are theirs)
    q, k, v = ([m for m in every[role] if m.path not in b.factors] or every[role]
               for role in ("q_proj", "k_proj", "v_proj"))
    query_input = next((t for t in (batch_and_length(shapes, q[0].width_in, QUERY_INPUTS) for shapes in b.calls)
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
    # an output projection reading a concatenation is out_proj for the attention's rows
    # only
    if outs is not None:
        predicted["out_proj"] = sum(m.macs(min(m.width_in, d_v)) for m in outs)
    names = ", ".join(dict.fromkeys(
        f"{m.path.rsplit('.', 1)[-1]} {m.width_in}->{m.width_out * shares[m.path]}"
        f"{f' (fused: {m.width_out} per role)' if shares[m.path] > 1 else ''} n={m.calls[0][1]}"
        for m in (*every["q_proj"], *every["k_proj"], *every["v_proj"])))
    basis = (f"{'joint' if joint else 'single-stream'} attention over "
             f"n_q={sum(m.calls[0][1] for m in q)} n_k={sum(m.calls[0][1] for m in k)} tokens, "
             f"h·d_k={d_q}; per-stream projections ({names}; widths declared, tokens of each "
             "projection's input)")
    rows = []
    for role in ATTENTION_ROLES:
        if role in b.measured or predicted.get(role):
            rows.append(ReconcileRow(b.path, role, b.measured.get(role, 0), predicted.get(role),
                                     TERMS[role],
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
        return ("values padded with a row of ones: the normaliser φ(Q)·Σφ(K) computed inside the "
                "state (d_v + 1 per head, Sana)")
    if row.role in ("k_proj", "v_proj") and ratio == Fraction(hyper.d_q, hyper.d_kv):
        return "grouped-query attention: K/V projected for the query heads, not n_kv heads"
    if ratio.denominator == 1 and ratio > 1:
        return f"executed on {ratio}x the tokens of the block input (padding or repeated calls)"
    return ""
