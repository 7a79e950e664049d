"""What every analytic tool of this package is: its formula as a function of the
config's sizes, the phase and the fixes applied to it, and the causes that can part it
from flopscope's count.

A tool's formula is written once, with a switch per known departure from what the
model executes (its ``chain`` of causes). With no switch set it is the tool's own
arithmetic; with all of them set it is what flopscope counts for the Hugging Face code.
:func:`~flopscope.predict.serving_tools.explain.explain` walks the chain one switch at a
time, so each cause gets the FLOPs its switch moves. Units: FLOPs (2 x MACs) throughout,
except where a tool's own term is in MACs (then the cause says so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from ._dims import Dims, read

__all__ = ["CAUSES", "PHASES", "Rows", "Tool", "ToolCount"]

PHASES = ("prefill", "decode")

CAUSAL_HALVING = "causal halving"
CACHE_OMITTED = "cache omitted"
NEW_KEY_OMITTED = "new position's key omitted"
TOP_K = "experts not multiplied by top-k"
ROUTER = "router not counted"
WINDOW_CLAMP = "window clamp"
LOGITS_EVERY_POSITION = "logits at every prefill position"
MLA_AS_GQA = "MLA modelled as GQA"
MLA_CACHE_EXPANDED = "MLA cache re-expanded"
LM_HEAD_MACS = "lm_head in MACs"
HEAD_DIM = "head_dim assumed hidden/heads"
TWO_MATRICES = "MLP with 2 matrices instead of 3"
EMBEDDING_MATMUL = "embedding counted as a matmul"
NORM_WEIGHTS = "norm weights counted as a matmul"
ELEMENTWISE = "elementwise ops counted"
EMBEDDING_FLOPS = "embedding lookup charged FLOPs"
VOCAB_PADDED = "vocabulary padded"
FFN_WIDTH = "MLP width not the config's"
UNEXPLAINED = "unexplained"

CAUSES: Mapping[str, str] = {
    CAUSAL_HALVING: "the tool halves the attention core for the causal mask; flopscope counts "
                    "what the kernels execute, the whole t x (c + t) block",
    CACHE_OMITTED: "the tool's decode step attends to the new position only, not to the cache",
    NEW_KEY_OMITTED: "the tool's decode step attends to the c cached keys; the step attends to "
                     "c + 1 (the new position's own key too)",
    TOP_K: "the routed experts are charged for another count than top-k per token (one expert, "
           "or all of them)",
    ROUTER: "the router's d x experts matmul per token is not in the tool's terms",
    WINDOW_CLAMP: "the tool clamps a prefill's keys to the sliding window; the kernels execute "
                  "the whole block and mask it",
    LOGITS_EVERY_POSITION: "the tool computes the logits of every prompt position; generate() "
                           "and the engines compute the last one's (logits_to_keep=1)",
    MLA_AS_GQA: "the tool prices multi-head latent attention as grouped-query attention",
    MLA_CACHE_EXPANDED: "the Hugging Face code caches MLA's latents and applies kv_b_proj to "
                        "every cached position at each step; the tool charges it per new token "
                        "(vLLM's kernels absorb it instead)",
    LM_HEAD_MACS: "the tool's lm_head term is in MACs (x1) where its other terms are FLOPs (x2)",
    HEAD_DIM: "the tool takes head_dim = hidden / heads, not the config's head dimensions",
    TWO_MATRICES: "the tool's MLP has 2 matrices; a gated MLP has 3",
    EMBEDDING_MATMUL: "the tool charges the embedding lookup as a d x vocab matmul per token",
    NORM_WEIGHTS: "the tool charges every parameter 2 FLOPs per token, RMSNorm weights too",
    ELEMENTWISE: "the tool counts softmax, norms, activations and residual adds; flopscope "
                 "counts the multiplies of products (MACs)",
    EMBEDDING_FLOPS: "the tool charges the embedding lookup 4 x d FLOPs per token; a lookup "
                     "multiplies nothing",
    VOCAB_PADDED: "the tool's logits are over the vocabulary padded to a multiple of 128 "
                  "(make_vocab_size_divisible_by); the Hugging Face lm_head has vocab_size "
                  "rows",
    FFN_WIDTH: "the tool's MLP width is an integer multiple of hidden (4 by default); the "
               "config's intermediate size is not one, and the option for it is not "
               "used",
    UNEXPLAINED: "a difference no cause of the tool's chain accounts for",
}
"""The named causes of a difference between a tool and flopscope, with what each means."""


@dataclass(frozen=True)
class ToolCount:
    """One tool's FLOPs for a prefill of ``prompt`` tokens and a decode step on a cache
    of ``context`` tokens (batch 1), each a dict of the tool's own terms; ``decode`` is
    None for a tool with no inference mode."""

    tool: str
    prefill: dict[str, int]
    decode: dict[str, int] | None
    source: str

    @property
    def prefill_total(self) -> int:
        return sum(self.prefill.values())

    @property
    def decode_total(self) -> int | None:
        return None if self.decode is None else sum(self.decode.values())


Terms = Callable[[Dims, str, int, int, frozenset[str]], dict[str, int]]
Rows = tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]


@dataclass(frozen=True)
class Tool:
    """A tool's formula (``terms(dims, phase, prompt, context, fixed)``, FLOPs by its
    own term names), its ``chain`` of causes (the switches ``terms`` knows, applied in
    this order by the explanation), its ``rows`` for a config (row name, its terms,
    flopscope's roles it covers) and ``source`` (repository, file and commit read)."""

    name: str
    source: str
    terms: Terms
    chain: tuple[str, ...]
    rows: Callable[[Dims], Rows]
    phases: tuple[str, ...] = PHASES

    def count(self, config: Mapping[str, Any], *, prompt: int, context: int) -> ToolCount:
        """The tool's FLOPs for ``config`` (a ``config.json`` as a dict): a prefill of
        ``prompt`` tokens and one decode step on a cache of ``context`` tokens."""
        if prompt < 1 or context < 1:
            raise ConfigurationError(f"prompt and context are at least 1; got {prompt}, {context}")
        dims = read(config)
        none: frozenset[str] = frozenset()
        decode = self.terms(dims, "decode", prompt, context, none) if "decode" in self.phases else None
        return ToolCount(self.name, self.terms(dims, "prefill", prompt, context, none), decode, self.source)
