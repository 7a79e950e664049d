"""Reconciliation rows of the other blocks: FFN (x top-k experts), convolution,
recurrent layers, logits and FNet's Fourier mixing, each against its closed form
(docs/formulas.md sections 6 and 7)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..attribute.paths import inside
from ..conventions import (
    EXPERT_FFN_WIDTH,
    EXPERTS,
    FFN_WIDTH,
    LINEAR_IN,
    LINEAR_OUT,
    QUERY_INPUTS,
    TOP_K,
    VOCAB,
    WIDTH,
    Names,
)
from ..formulas.linear_algebra import fft_macs
from ..formulas.registry import OpFamily, prod
from .reconcile_block import FFN_ROLES, TERMS, Block, InputShapes, ReconcileRow, batch_and_length, own_linear_width


def ffn_rows(b: Block) -> list[ReconcileRow]:
    block, measured, facts, calls, spec = b.path, b.measured, b.facts, b.calls, b.spec
    gated = ("ffn_gate" in measured) if spec is None or spec.gated is None else spec.gated
    d, d_ff, source = _ffn_widths(b, gated)
    experts = facts.declared(TOP_K)
    if spec is not None:
        d, d_ff, source = spec.d or d, spec.d_ff or d_ff, "TransformerSpec"
    present = [r for r in FFN_ROLES if r in measured]
    fused = {m for role in ("q_proj", "k_proj", "v_proj") for m in b.role_modules.get(role, set())}
    shared = {m for m in fused & b.role_modules.get("ffn_up", set())
              # a linear layer whose width would be read
              if facts.declared(LINEAR_IN, [m], config=False) is not None}
    if shared and spec is None and source == "weight shapes":
        return b.unrecognised(present, f"the up projection {sorted(shared)[0]} is fused with "
                                       "attention's projections: its declared width is not the "
                                       "FFN's (a TransformerSpec says d_ff)")
    if d is None or d_ff is None:
        return b.unrecognised(present)
    # routed experts: each token meets top_k of them; a shared expert (or a dense FFN)
    # sees every token once
    routed = facts.declared(EXPERTS, inside(facts.types, block), config=False)
    top_k = experts if experts is not None and routed else 1
    tokens = tokens_of(calls, d)
    ups = b.linear_calls("ffn_up")
    up_tokens = sum(batch * n for m in ups for batch, n in m.calls) if ups is not None else 0
    source_of_tokens = ""
    if up_tokens and top_k == 1 and up_tokens != tokens:
        # the hidden layer runs on other tokens than the block's query input (a
        # container never called, a parallel block over cat([text, image]) made inside
        # it): the up projection's own input says them
        tokens, source_of_tokens = up_tokens, ", tokens of the up projection's input"
    if spec is not None and spec.n is not None:
        tokens = (spec.batch or 1) * spec.n
    if not tokens:
        return b.unrecognised(present, f"no input of width d={d} among its call's inputs")
    # the width the down projection writes: an MLP that changes the width (a timestep
    # embedder's 256 → d → d)
    d_out = own_linear_width(b, "ffn_down") if spec is None else None
    predicted = {"ffn_up": tokens * top_k * d * d_ff,
                 "ffn_down": tokens * top_k * d_ff * (d_out or d)}
    if gated:
        predicted["ffn_gate"] = tokens * top_k * d * d_ff
    moe = f" top_k={top_k} experts per token" if top_k > 1 else ""
    out = f" d_out={d_out}" if d_out not in (None, d) else ""
    basis = f"tokens={tokens} d={d} d_ff={d_ff}{out}{' gated' if gated else ''}{moe} ({source}{source_of_tokens})"
    rows = []
    for role in FFN_ROLES:
        if role in measured or role in predicted:
            row = ReconcileRow(block, role, measured.get(role, 0), predicted.get(role), TERMS[role],
                               basis=basis)
            if not row.exact and row.ratio is not None and row.ratio.denominator == 1 and row.ratio > 1:
                row = replace(row, reason=f"executed on {row.ratio}x the tokens of the block input")
            rows.append(row)
    return rows


def tokens_of(calls: list[InputShapes], width: int) -> int:
    """Tokens (batch x length) of the block's query inputs of this width, summed over
    its calls."""
    found = (batch_and_length(shapes, width, QUERY_INPUTS) for shapes in calls)
    return sum(t[0] * t[1] for t in found if t is not None)


def _ffn_widths(b: Block, gated: bool) -> tuple[int | None, int | None, str]:
    """(d, d_ff): from the up projection's declared weight (nn.Linear / GPT-2 Conv1D),
    else the config."""
    facts = b.facts
    ups = b.role_modules.get("ffn_up", set())
    if len(ups) == 1:
        up = next(iter(ups))
        d_in = facts.declared(LINEAR_IN, [up], config=False)
        width = facts.declared(LINEAR_OUT, [up], config=False)
        if d_in is not None and width is not None:
            # one gate_up projection, split in two
            fused = gated and b.role_modules.get("ffn_gate") == ups
            return d_in, width // 2 if fused else width, "weight shapes"
    d = facts.declared(WIDTH)
    moe = facts.declared(TOP_K) is not None
    d_ff = (facts.declared(EXPERT_FFN_WIDTH) if moe else None) or facts.declared(FFN_WIDTH)
    if d is not None and d_ff is not None:
        return d, d_ff, "config"
    # a fused kernel (the encoder-layer fast path): the block's own linear layers
    # declare the widths
    linears = [p for p in inside(facts.types, b.path) if (p != b.path or not p) and facts.attr(p, "in_features")]
    ins = [facts.attr(p, "in_features") for p in linears]
    outs = [facts.attr(p, "out_features") for p in linears]
    if ins and outs:
        return min(ins), max(outs), "weight shapes"
    return None, None, "unknown"


def conv_rows(b: Block) -> list[ReconcileRow]:
    block, got, calls = b.path, b.measured.get("conv", 0), b.calls
    a = b.facts.attributes.get(block, {})
    needed = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
              "groups")
    if not all(k in a for k in needed) or not calls:
        return b.unrecognised(["conv"])
    kernel = tuple(a["kernel_size"])
    predicted = sum(_conv_macs(a, shape, a["padding"]) for shape in (dict(shapes).get(0) for shapes in calls)
                    if shape is not None)
    basis = f"C_in={a['in_channels']} C_out={a['out_channels']} k={kernel} groups={a['groups']}"
    row = ReconcileRow(block, "conv", got, predicted, TERMS["conv"], basis=basis)
    if row.exact:
        return [row]
    # a module that pads its input in its forward (a causal convolution's time padding)
    # runs the declared convolution on a larger input than it was given: the closed form
    # on the input the convolution ran on says so
    ran = [op for op in b.ops if op.spec is not None and op.spec.family is OpFamily.CONV and op.input_shapes
           and len(op.args) > 4 and isinstance(op.args[4], (list, tuple))]
    given = [dict(shapes).get(0) for shapes in calls]
    if ran and sum(_conv_macs(a, op.input_shapes[0], tuple(op.args[4])) for op in ran) == got and any(
            tuple(op.input_shapes[0]) not in given for op in ran):
        sizes = (", ".join(sorted({str(tuple(g)) for g in given if g is not None})) + " -> "
                 + ", ".join(sorted({str(tuple(op.input_shapes[0])) for op in ran})))
        row = replace(row, reason="the module pads its input in its forward before the "
                                  f"convolution ({sizes}): on the padded input the declared "
                                  "convolution is exact")
    return [row]


def _conv_macs(a: Mapping[str, Any], shape: Sequence[int], padding: Any) -> int:
    """B·C_out·Π(L_out)·(C_in/g)·Π(k) of a convolution with the declared attributes
    ``a`` on an input of ``shape`` (``padding``: the declared one, or what the
    convolution was called with)."""
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


def recurrent_rows(b: Block) -> list[ReconcileRow]:
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
    return [ReconcileRow(block, "recurrent", got, tokens * per_token, TERMS["recurrent"],
                         basis=basis)]


def logits_rows(b: Block) -> list[ReconcileRow]:
    block, got, facts = b.path, b.measured.get("logits", 0), b.facts
    d = facts.declared(WIDTH) or facts.declared(Names(module=("in_features",)), [block])
    vocab = facts.declared(VOCAB) or facts.declared(Names(module=("out_features",)), [block])
    tokens = tokens_of(b.calls, d) if d is not None else 0
    if d is None or vocab is None or not tokens:
        return b.unrecognised(["logits"])
    # B and n as the closed form names them (what a diff says moved), when every call
    # has the same; else tokens
    shapes = {batch_and_length(call, d, QUERY_INPUTS) for call in b.calls}
    only = next(iter(shapes)) if len(shapes) == 1 else None
    sizes = f"B={only[0]} n={only[1]}" if only is not None else f"tokens={tokens}"
    return [ReconcileRow(block, "logits", got, tokens * d * vocab, TERMS["logits"],
                         basis=f"{sizes} d={d} V={vocab}")]


def mixing_rows(b: Block) -> list[ReconcileRow]:
    """FNet's Fourier mixing (Lee-Thorp et al. 2021, ``Re(F_seq(F_hidden(x)))``): a
    complex 2-D FFT over (n, d) of each ``[B, n, d]`` input of the declared width,
    i.e. B·(d·F(n) + n·F(d)) MACs."""
    spec, got = b.spec, b.measured.get("token_mixing", 0)
    d, source = (spec.d, "TransformerSpec") if spec is not None and spec.d else (b.facts.declared(WIDTH), "config")
    if spec is not None and spec.n is not None:
        shapes = [(spec.batch or 1, spec.n)]
    else:
        shapes = [s for s in (batch_and_length(call, d, QUERY_INPUTS) for call in b.calls) if s] if d else []
    if d is None or not shapes:
        return b.unrecognised(["token_mixing"], "no declared width d or no [B, n, d] input")
    predicted = sum(batch * (d * fft_macs(n) + n * fft_macs(d)) for batch, n in shapes)
    row = ReconcileRow(b.path, "token_mixing", got, predicted, TERMS["token_mixing"],
                       basis=f"2-D FFT over (n, d) d={d} ({source})")
    return [row if row.exact else replace(row, reason="not FNet's 2-D FFT over (n, d) of the block "
                                                      "input: no closed form for this transform")]
