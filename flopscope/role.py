"""The role vocabulary: what a multiply does, the group it belongs to and the complexity
term it realises.

One place for every fact about a role. Adding a role is one member of :class:`Role` with
its group and term; the passes that find it live in :mod:`flopscope.attribute.roles`,
the closed form that predicts it in :mod:`flopscope.predict.reconcile` (keyed by group).
Definitions in dataflow terms: ``docs/roles.md``.
"""

from __future__ import annotations

from .enums import StrEnum
from .errors import RoleError


class RoleGroup(StrEnum):
    """The kind of block a role belongs to (reconciliation predicts each group with its
    own closed form)."""

    ATTENTION = "attention"
    MIXING = "mixing"
    FFN = "ffn"
    CONV = "conv"
    RECURRENT = "recurrent"
    LOGITS = "logits"
    EMBEDDING = "embedding"
    OTHER = "other"


class Role(StrEnum):
    """What a multiply does. Compare with plain strings: ``Role.Q_PROJ == "q_proj"``.

    Each member knows its :attr:`group` and the complexity :attr:`term` it realises
    (``n`` tokens, ``d`` width, ``k`` kernel width, ``V`` vocabulary; ``""`` where no
    closed form predicts it). ``token_mixing`` is the work of a Fourier transform (an op
    of family ``OpFamily.TRANSFORM``): FNet's replacement for attention, a 2-D FFT over
    (n, d), ``(B·n·d/2)·log2(n·d)`` MACs for powers of two.

    Attention's core (:attr:`attention_core`) has two forms. The quadratic one (softmax,
    sigmoid, ReLU, LSH, Bernoulli-sampled attention) builds the ``n_q × n_k`` matrix:
    ``attn_scores`` (Q·Kᵀ) and ``attn_weighted_sum`` (weights · V). The linear one
    (φ(Q)(φ(K)ᵀV)) never does: ``attn_kv_state`` is φ(K)ᵀV, a contraction over positions
    into a ``d_k × d_v`` summary per head; ``attn_readout`` is φ(Q)·state, each query
    reading the summary; ``attn_normaliser`` is φ(Q)·Σφ(K), each query's denominator (a
    softmax's is elementwise, no MACs). Definitions in dataflow terms:
    ``docs/roles.md``.
    """

    Q_PROJ = "q_proj"
    K_PROJ = "k_proj"
    V_PROJ = "v_proj"
    OUT_PROJ = "out_proj"
    ATTN_SCORES = "attn_scores"
    ATTN_WEIGHTED_SUM = "attn_weighted_sum"
    ATTN_KV_STATE = "attn_kv_state"
    ATTN_READOUT = "attn_readout"
    ATTN_NORMALISER = "attn_normaliser"
    TOKEN_MIXING = "token_mixing"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    CONV = "conv"
    RECURRENT = "recurrent"
    EMBEDDING = "embedding"
    LOGITS = "logits"
    OTHER = "other"

    @property
    def group(self) -> RoleGroup:
        return _FACTS[self][0]

    @property
    def term(self) -> str:
        """The complexity term of the role's closed form: ``"n·d²"``, ``"n²·d"``,
        ``"n·d"``, ``"n·d·log(n·d)"``, ``"k·n·d²"``, ``"n·d·V"``."""
        return _FACTS[self][1]

    @property
    def per_token(self) -> bool:
        """A projection or FFN matmul: the same weight meets every token (cost linear in
        n)."""
        return self.group in (RoleGroup.ATTENTION, RoleGroup.FFN) and self.term == "n·d²" and not self.attention_core

    @property
    def attention_core(self) -> bool:
        """A product of two activations that mixes positions: scores and weighted sum
        (every (query, key) pair, ``n²·d``), or linear attention's KV state, readout
        and normaliser (``n·d²``, ``n·d``)."""
        return _FACTS[self][2]


# role -> (group, complexity term, attention core)
_FACTS: dict[Role, tuple[RoleGroup, str, bool]] = {
    Role.Q_PROJ: (RoleGroup.ATTENTION, "n·d²", False),
    Role.K_PROJ: (RoleGroup.ATTENTION, "n·d²", False),
    Role.V_PROJ: (RoleGroup.ATTENTION, "n·d²", False),
    Role.OUT_PROJ: (RoleGroup.ATTENTION, "n·d²", False),
    Role.ATTN_SCORES: (RoleGroup.ATTENTION, "n²·d", True),
    Role.ATTN_WEIGHTED_SUM: (RoleGroup.ATTENTION, "n²·d", True),
    # linear attention: φ(K)ᵀV, B·n_k·n_kv·d_k·d_v
    Role.ATTN_KV_STATE: (RoleGroup.ATTENTION, "n·d²", True),
    # linear attention: φ(Q)·state, B·n_q·h·d_k·d_v
    Role.ATTN_READOUT: (RoleGroup.ATTENTION, "n·d²", True),
    # linear attention: φ(Q)·Σφ(K), B·n_q·h·d_k
    Role.ATTN_NORMALISER: (RoleGroup.ATTENTION, "n·d", True),
    # a Fourier transform: FNet's mixing sublayer
    Role.TOKEN_MIXING: (RoleGroup.MIXING, "n·d·log(n·d)", False),
    Role.FFN_UP: (RoleGroup.FFN, "n·d²", False),
    Role.FFN_GATE: (RoleGroup.FFN, "n·d²", False),
    Role.FFN_DOWN: (RoleGroup.FFN, "n·d²", False),
    Role.CONV: (RoleGroup.CONV, "k·n·d²", False),
    Role.RECURRENT: (RoleGroup.RECURRENT, "n·d²", False),
    Role.EMBEDDING: (RoleGroup.EMBEDDING, "", False),
    Role.LOGITS: (RoleGroup.LOGITS, "n·d·V", False),
    Role.OTHER: (RoleGroup.OTHER, "", False),
}
# a new member without its row fails at import, not in the middle of a report
if set(_FACTS) != set(Role):
    raise RoleError("roles without group and term in flopscope/role.py: "
                    f"{sorted(set(Role) - set(_FACTS))}")

ROLE_ORDER: tuple[str, ...] = tuple(r.value for r in Role)
"""Role names in the canonical order of every report."""
ATTENTION_CORE: tuple[str, ...] = tuple(r.value for r in Role if r.attention_core)
"""Attention's core, both forms (:attr:`Role.attention_core`)."""
PAIR_ROLES: tuple[str, ...] = tuple(r.value for r in Role if r.attention_core and r.term == "n²·d")
"""The quadratic core: the products over (query, key) pairs (scores and weighted sum),
what an attention convention prices (``docs/conventions.md``)."""
LINEAR_CORE: tuple[str, ...] = tuple(r for r in ATTENTION_CORE if r not in PAIR_ROLES)
"""Linear attention's core: KV state, readout, normaliser."""
PER_TOKEN: tuple[str, ...] = tuple(r.value for r in Role if r.per_token)
"""Projections and FFN matmuls (:attr:`Role.per_token`)."""
NO_MULTIPLY = "no_multiply"
"""The key, beside the roles, of what ops that do not multiply took (bytes, time):
:meth:`Profile.bytes_by_role`, :meth:`Profile.timing`, the trace's tracks."""


def roles_in(group: RoleGroup) -> tuple[str, ...]:
    """Role names of one group, in the canonical order."""
    return tuple(r.value for r in Role if r.group is group)


def parse_role(name: str | Role) -> Role:
    """``"q_proj"`` -> ``Role.Q_PROJ``; an unknown name is a
    :class:`~flopscope.errors.RoleError`."""
    try:
        return Role(name)
    except ValueError:
        raise RoleError(f"unknown role {name!r}; roles: {', '.join(ROLE_ORDER)}") from None
