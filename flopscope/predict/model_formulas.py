"""Model-level FLOP formulas against the measured forward: Kaplan, Chinchilla,
Megatron-LM, PaLM.

Every formula is turned into multiply-accumulates *per token* of one forward pass (paper
FLOPs / 2, GEMM terms only), split into the same parts as the measurement (QKV
projections, attention core, output projection, FFN, logits, embeddings), so that the
difference is explained part by part. Sources and exact forms: ``docs/formulas.md``
sections 2-5.

- Kaplan et al. 2020, eq. 2.2: C_forward = 2N + 2·L·n_ctx·d_attn FLOPs/token, N =
  2·d·L·(2·d_attn + d_ff); its attention term is the causal half of the dense core; the
  de-embedding (logits) is left out.
- Hoffmann et al. 2022 (Chinchilla), App. F: embeddings 2·n·V·d, QKV 2·3·n·d·d_attn, QKᵀ
  and AV 2·n²·d_attn each (dense), output 2·n·d_attn·d, dense block 2·n·2·d·d_ff, logits
  2·n·d·V per sequence; its softmax (3·h·n²) is elementwise and not a MAC.
- Narayanan et al. 2021 (Megatron-LM), appendix: 24·B·s·h² + 4·B·s²·h per layer plus
  2·B·s·h·V (assumes d_ff = 4h, d_attn = h, multi-head attention).
- Chowdhery et al. 2022 (PaLM), App. B: 6N + 12·L·H·Q·T per token for a training step,
  the forward a third: 2N + 4·L·H·Q·T, N = all parameters but position embeddings
  (nanoGPT's convention).

The measured side counts the attention core by a convention (``attention``:
``"executed"``, the default, every pair the kernels compute; ``"causal"``, the causal
half; ``"mask"``, the pairs the mask allows; see :mod:`flopscope.predict.attention`).
The formulas keep their own: Kaplan's core is the causal half (so under ``"causal"`` its
attention term matches a causal model's), Chinchilla, Megatron-LM and PaLM charge it
dense.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from tabulate import tabulate

from ..capture.facts import ModelFacts
from ..capture.module_tracker import ModuleCall
from ..conventions import (
    EXPERTS,
    FFN_WIDTH,
    HEAD_WIDTH,
    HEADS,
    KV_HEADS,
    LAYERS,
    POSITIONS,
    TOKEN_INPUTS,
    TOP_K,
    VOCAB,
    WIDTH,
)
from ..errors import FlopscopeError
from ..formulas.registry import prod
from ..role import Role, RoleGroup
from .attention import EXECUTED, check_attention

PARTS = ("qkv", "attention core", "output projection", "ffn", "logits", "embeddings",
         "parameters not in GEMMs",
         "inactive experts", "weights not used once per token", "other")
WHY = {
    "qkv": "QKV projections",
    "attention core": "attention core (scores + weighted sum)",
    "output projection": "output projection",
    "ffn": "FFN",
    "logits": "logits (de-embedding)",
    "embeddings": "embedding lookups (gathers: 0 MACs measured)",
    "parameters not in GEMMs": "biases and norm weights counted as MACs",
    "inactive experts": "routed experts' weights a token does not meet (each token meets top_k of "
                        "them)",
    "weights not used once per token": "weights not used once per token (a pooler runs once per "
                                       "sequence; rotary angles made by a matmul, once per forward)",
    "other": "other multiplies (pooler, router, rotary, ...)",
}
"""What each part of a difference is: the label of a term, ``measured - predicted`` of
that part. A formula that counts a part the measurement has no role for (PaLM's N counts
every weight once per token: the experts a token does not meet, a pooler's weights)
gives it a part of its own, so no difference is labelled by another's name."""


@dataclass(frozen=True)
class FormulaRow:
    name: str  # "Kaplan et al. 2020"
    predicted: Fraction  # forward MACs per token
    measured: Fraction  # forward MACs per token
    # (part: measured - predicted, MACs per token), nonzero only
    terms: tuple[tuple[str, Fraction], ...]
    notes: str = ""

    @property
    def difference_percent(self) -> float:
        return float(100 * (self.measured - self.predicted) / self.predicted) if self.predicted else float("nan")

    @property
    def residual(self) -> Fraction:
        """The part of the difference no term explains (0 when the parts account for all
        of it)."""
        return self.measured - self.predicted - sum((v for _, v in self.terms), Fraction(0))


@dataclass(frozen=True)
class ModelFormulas:
    rows: tuple[FormulaRow, ...]
    hyper: Mapping[str, int]
    # the convention of the measured attention core (flopscope.predict.attention)
    attention: str = EXECUTED

    @property
    def measured(self) -> Fraction:
        """Measured forward MACs per token (the attention core under :attr:`attention`)."""
        return self.rows[0].measured if self.rows else Fraction(0)

    HEADERS = ("formula", "predicted", "measured", "difference", "explained by (MACs/token)")

    def cells(self) -> list[list[str]]:
        """One row of text per formula, under :attr:`HEADERS` (what the table and the
        HTML report show)."""
        table = []
        for r in self.rows:
            why = "; ".join(f"{WHY[part]} {_signed(v)}" for part, v in r.terms)
            table.append([r.name, f"{float(r.predicted):,.0f}", f"{float(r.measured):,.0f}",
                          f"{r.difference_percent:+.2f}%",
                          why + (f" ({r.notes})" if r.notes else "")])
        return table

    def caption(self) -> str:
        hyper = " ".join(f"{k}={v:,}" for k, v in self.hyper.items())
        return f"forward MACs per token (1 MAC = 2 FLOPs; measured attention core: {self.attention}); {hyper}"

    def to_table(self, tablefmt: str = "simple") -> str:
        return (self.caption() + "\n" + tabulate(self.cells(), headers=list(self.HEADERS),
                                                 tablefmt=tablefmt,
                                                 colalign=("left", "right", "right", "right",
                                                           "left")))


def _signed(v: Fraction) -> str:
    return f"{'+' if v > 0 else '-'}{abs(float(v)):,.0f}"


def model_formulas(facts: ModelFacts, forward_roles: Mapping[str, int],
                   module_inputs: Mapping[ModuleCall,
                                          tuple[tuple[int | str, tuple[int, ...]], ...]],
                   attention: str = EXECUTED) -> ModelFormulas:
    """Measured forward MACs per token (``forward_roles``: MACs per role of the forward
    pass, its attention core counted by the convention ``attention`` names) against
    the four model-level formulas (see the module docstring); hyper-parameters from
    the model's config."""
    check_attention(attention)
    L, d, h = facts.declared(LAYERS), facts.declared(WIDTH), facts.declared(HEADS)
    if L is None or d is None or h is None:
        raise FlopscopeError("model-level formulas need a language-model config with "
                             "num_hidden_layers, hidden_size and num_attention_heads")
    d_k = facts.declared(HEAD_WIDTH) or d // h
    n_kv = facts.declared(KV_HEADS) or h
    d_ff = facts.declared(FFN_WIDTH) or 4 * d
    V = facts.declared(VOCAB) or 0
    tokens, n = _token_count(module_inputs)
    d_attn = h * d_k
    per_token = {part: Fraction(macs, tokens) for part, macs in _measured_parts(forward_roles).items()}
    measured = sum(per_token.values(), Fraction(0))
    dense_core = Fraction(2 * L * n * d_attn)  # scores + weighted sum per token, every pair
    gemm_ffn = 2 * d * d_ff
    params_not_gemm = Fraction(_non_gemm_params(facts))
    position = _position_embedding_params(facts)
    token_embedding = facts.embedding_params - position

    def row(name: str, predicted: Mapping[str, Fraction], notes: str = "") -> FormulaRow:
        total = sum(predicted.values(), Fraction(0))
        terms = tuple((part, per_token.get(part, Fraction(0)) - predicted.get(part, Fraction(0))) for part in PARTS)
        return FormulaRow(name, total, measured, tuple((p, v) for p, v in terms if v != 0), notes)

    qkv, out = Fraction(L * 3 * d * d_attn), Fraction(L * d_attn * d)
    kaplan = row("Kaplan et al. 2020 (2N + 2·L·n·d_attn)", {
        "qkv": qkv, "attention core": dense_core / 2, "output projection": out,
        "ffn": Fraction(L * gemm_ffn)},
        "attention term is the causal half; no logits")
    chinchilla = row("Hoffmann et al. 2022 (Chinchilla App. F)", {
        "qkv": qkv, "attention core": dense_core, "output projection": out,
        "ffn": Fraction(L * gemm_ffn),
        "logits": Fraction(d * V), "embeddings": Fraction(d * V)},
                     "its softmax is elementwise, not MACs")
    megatron = row("Narayanan et al. 2021 (Megatron-LM)", {
        "qkv": Fraction(L * 3 * d * d), "attention core": Fraction(2 * L * n * d),
        "output projection": Fraction(L * d * d), "ffn": Fraction(L * 8 * d * d),
        "logits": Fraction(d * V)},
        "assumes d_ff = 4d and multi-head attention")
    # PaLM: N MACs per token (every parameter but position embeddings, each used once) +
    # 2·L·H·Q·T
    tied = facts.tied_embedding and bool(per_token.get("logits"))
    weights = Fraction(facts.params - position - token_embedding) - params_not_gemm  # 2-D weights
    palm_parts: dict[str, Fraction] = {p: per_token[p] for p in ("qkv", "output projection", "ffn",
                                                                 "other")
                                       if p in per_token}
    if not tied and "logits" in per_token:
        palm_parts["logits"] = per_token["logits"]
    # the weights not used once per token: the routed experts a token does not meet (it
    # meets top_k of E; its share of them is measured in "ffn"), then what is left (a
    # pooler runs once per sequence, a weight shared by several layers is used more than
    # once)
    routed, top_k, count = _routed_expert_weights(facts)
    notes = "N counts every parameter once"
    if routed and top_k is not None and 0 < top_k <= count:
        palm_parts["inactive experts"] = Fraction(routed * (count - top_k), count)
        notes += f"; each token meets {top_k} of {count} routed experts"
    unused = weights - sum(palm_parts.values(), Fraction(0))
    if unused:
        palm_parts["weights not used once per token"] = unused
    palm_parts.update({"attention core": dense_core, "parameters not in GEMMs": params_not_gemm})
    palm_parts["logits" if tied else "embeddings"] = Fraction(token_embedding)
    palm = row("Chowdhery et al. 2022 (PaLM: N + 2·L·H·Q·T)", palm_parts, notes)
    hyper = {"L": L, "d": d, "h": h, "n_kv": n_kv, "d_k": d_k, "d_ff": d_ff, "V": V, "n": n,
             "tokens": tokens}
    return ModelFormulas((kaplan, chinchilla, megatron, palm), hyper, attention)


def part_of(role: Role) -> str:
    """The formula part a role's MACs belong to (by its group: a new role always lands
    in one)."""
    if role is Role.OUT_PROJ:
        return "output projection"
    if role.attention_core:
        return "attention core"
    return {RoleGroup.ATTENTION: "qkv", RoleGroup.FFN: "ffn", RoleGroup.LOGITS: "logits"}.get(role.group, "other")


def _measured_parts(roles: Mapping[str, int]) -> dict[str, int]:
    parts: dict[str, int] = {}
    for role, macs in roles.items():
        part = part_of(Role(role))
        parts[part] = parts.get(part, 0) + macs
    return {k: v for k, v in parts.items() if v}


def _token_count(module_inputs: Mapping[ModuleCall, tuple[tuple[int | str, tuple[int, ...]], ...]]
                 ) -> tuple[int, int]:
    """(B·n, n) from the root call's token ids (or embeddings)."""
    for call, shapes in module_inputs.items():
        if call.path == "":
            for key, shape in shapes:
                if key in TOKEN_INPUTS and len(shape) >= 2:
                    ids = shape[:-1] if key == "inputs_embeds" else shape  # token ids: [*batch, n]
                    return prod(ids), ids[-1]
    raise FlopscopeError("model-level formulas need token ids (or inputs_embeds) as the model's "
                         "input")


def _non_gemm_params(facts: ModelFacts) -> int:
    """Parameters that are not matmul weights: biases, norm weights (1-D parameters, and
    one vector per expert stacked beside the experts' weights: ``gate_up_proj_bias
    [E, 2·d_ff]``)."""
    return sum(prod(shape) for path, shapes in facts.param_shapes.items() for shape in shapes.values()
               if len(shape) <= 1 or (len(shape) == 2 and shape[0] == _stacked_experts(facts, path)))


def _stacked_experts(facts: ModelFacts, path: str) -> int | None:
    """E when the module at ``path`` declares E routed experts and holds their weights
    stacked (a parameter of at least 3 dimensions, E first); else ``None`` (a
    router's ``[E, d]`` weight is a matmul weight)."""
    experts = facts.declared(EXPERTS, [path], config=False)
    if not experts:
        return None
    stacked = any(len(shape) >= 3 and shape[0] == experts for shape in facts.param_shapes.get(path, {}).values())
    return experts if stacked else None


def _routed_expert_weights(facts: ModelFacts) -> tuple[int, int | None, int]:
    """(weights of the routed experts, experts a token meets, experts per block): the
    parameters of every module that declares its routed experts E (``num_experts``,
    ...: :data:`flopscope.conventions.EXPERTS`) stacked over them (at least 3-D, E
    first: ``gate_up_proj [E, 2·d_ff, d]``; a router's ``[E, d]`` meets every token),
    and the weights of its submodules in a list of E (``experts.0`` ...
    ``experts.{E-1}``); ``top_k`` from the config."""
    children: dict[str, list[str]] = {}
    for path in facts.types:
        if path:
            children.setdefault(path.rsplit(".", 1)[0] if "." in path else "", []).append(path)
    total, count = 0, 0
    members: set[str] = set()
    for path in facts.types:
        experts = facts.declared(EXPERTS, [path], config=False)
        if not experts:
            continue
        for shape in facts.param_shapes.get(path, {}).values():
            # (a vector per expert beside them is not a weight)
            if len(shape) >= 3 and shape[0] == experts:
                total, count = total + prod(shape), experts
        for child in children.get(path, []):
            names = [p.rsplit(".", 1)[-1] for p in children.get(child, [])]
            # a list of exactly E modules
            if sorted(names) == sorted(str(i) for i in range(experts)):
                members.update(children[child])
                count = experts
    if members:
        for path, shapes in facts.param_shapes.items():
            parts = path.split(".")
            if any(".".join(parts[:i]) in members for i in range(1, len(parts) + 1)):
                total += sum(prod(shape) for shape in shapes.values() if len(shape) >= 2)
    return total, facts.declared(TOP_K), count


def _position_embedding_params(facts: ModelFacts) -> int:
    positions = facts.declared(POSITIONS)
    total = 0
    for path, shapes in facts.param_shapes.items():
        weight = shapes.get("weight")
        if weight is not None and facts.attr(path, "num_embeddings") == positions and len(weight) == 2:
            total += prod(weight)
    return total
