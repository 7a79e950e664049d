"""The roles yardstick of the zoo sweeps (issue 47): the roles that must balance in every standard layer and head
(:func:`flopscope.testing.invariants.role_balance`), checked per architecture without a closed form, the exceptions, and
the report.

- :func:`balance_record`: one model's profile (``mode="auto"``, ``no_grad``) and what it breaks: its heads
  (:func:`~flopscope.testing.invariants.head_paths`), its imbalances (layer or head path, rule, the MACs that do
  not balance) and its roles;
- :data:`EXCEPTIONS`: every architecture where a rule truly does not apply, with the reason read from the model's
  code (one place for the Hugging Face, timm and diffusers zoos). An imbalance that no exception covers is a
  misreading: a bug of the roles, never an entry here;
- :func:`report_lines`: the consistent share (base models, and with their heads), the misreadings by family with
  the measured numbers, the exceptions that were used.

Units: MACs. A run is one model class (the base ``AutoModel`` class or a head class: ``*ForCausalLM``,
``*ForSequenceClassification``, ``*ForImageClassification``); its record's ``kind`` says which.
"""

from __future__ import annotations

import re
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BASE = "base"
"""The ``kind`` of a base model's run (the head runs are named by their mapping: ``causal-lm``, ...)."""


# --------------------------------------------------------------------------------------------------
# one model
# --------------------------------------------------------------------------------------------------
def balance_record(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], kind: str) -> dict[str, Any]:
    """Profile ``model(*args, **kwargs)`` (``mode="auto"``, ``no_grad``) and check :func:`role_balance` on it with
    its heads: ``{"kind", "class", "prefix" (the base model's attribute in a head class), "macs", "heads",
    "imbalances": [[where, rule, detail], ...], "by_role"}``, or ``"error"`` (and ``"traceback"`` when the error
    is not flopscope's)."""
    import torch

    import flopscope
    from flopscope.testing.invariants import head_paths, role_balance

    out: dict[str, Any] = {"kind": kind, "class": type(model).__name__,
                           "prefix": getattr(model, "base_model_prefix", "") or ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                prof = flopscope.profile(model, *args, mode="auto", forward_kwargs=kwargs)
            heads = head_paths(prof)
            found = role_balance(prof, heads)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if not isinstance(e, flopscope.FlopscopeError):
                out["traceback"] = traceback.format_exc()[-1500:]
            return out
    out.update(macs=prof.total(), heads=heads, imbalances=[[i.where, i.rule, i.detail] for i in found],
               parts={i.where: _parts(prof, i.where) for i in found},
               by_role={k: v for k, v in prof.by_role().items() if v})
    return out


def _parts(prof: Any, where: str) -> list[str]:
    """The submodules of ``where`` that ran multiplies with a role, as ``name:Class`` (``self_attn:LlamaAttention``,
    ``mixer:NemotronHMamba2Mixer``): what an exception may name where a layer holds several kinds of block."""
    prefix = where + "." if where else ""
    names = {prefix + r.module[len(prefix):].split(".")[0] for r in prof.records
             if r.roles and r.module.startswith(prefix) and len(r.module) > len(prefix)}
    types = prof.facts.types
    return sorted(f"{name[len(prefix):]}:{getattr(types.get(name), '__name__', '?')}" for name in names)


# --------------------------------------------------------------------------------------------------
# the exceptions: where a rule truly does not apply (read in the model's code), never a misreading
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleException:
    """``label``: ``rule`` (of :data:`~flopscope.testing.invariants.BALANCE_RULES`) does not apply in ``names``
    (model types, timm models, diffusers classes), for ``reason``. Narrowed by regular expressions searched in the
    layer or head path (``where``), in what does not balance (``detail``: ``"^k_proj"`` for the k/v check of the
    attention rule) and in the layer's parts (``parts``: ``name:Class`` of its submodules, ``"linear_attn:"``); ""
    matches anything. ``checker``: the imbalance comes from what ``role_balance`` takes for a layer, not from the
    model (listed apart, until the reading is fixed)."""

    label: str
    rule: str
    names: tuple[str, ...]
    reason: str
    where: str = ""
    detail: str = ""
    parts: str = ""
    checker: bool = False  # not the model's: role_balance's own reading of what a layer is (reported, to be fixed)

    def covers(self, name: str, imbalance: list[str], parts: list[str]) -> bool:
        where, rule, detail = imbalance
        return (rule == self.rule and name in self.names and re.search(self.where, where) is not None
                and re.search(self.detail, detail) is not None and re.search(self.parts, " ".join(parts)) is not None)


MLA = ("axk1", "axk2", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa",
       "glm5_next", "glm5_next_text", "hy_v4", "hy_v4_vl", "hy_v4_vl_text", "kimi_k25", "kimi_linear",
       "longcat_flash", "minicpm3", "mistral4", "sarvam_mla", "youtu")
RELATIVE = ("canary", "cohere_asr", "deberta", "deberta-v2", "sew-d", "fastspeech2_conformer",
            "fastspeech2_conformer_with_hifigan", "funnel",
            "gemma4_audio", "nemotron3_5_asr", "nemotron3_5_transcribe_audio", "nemotron_asr_streaming",
            "nemotron_asr_streaming_encoder", "parakeet_ctc", "parakeet_encoder", "parakeet_rnnt", "parakeet_tdt",
            "wav2vec2-conformer", "xlnet")
GATED_DELTANET = ("lara_mini", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7", "olmo_hybrid", "qwen3_5", "qwen3_5_moe",
                  "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next")

EXCEPTIONS: tuple[RoleException, ...] = (
    RoleException(
        "MLA", "attention", MLA, detail="^k_proj", reason=(
            "multi-head latent attention: kv_a_proj_with_mqa makes a latent shared by k and v (split by kv_b_proj) "
            "and a rope key shared by every head; the shared part is charged to k_proj (it cannot be split between "
            "k and v), so k_proj / v_proj = (d·(r + d_rope) + r·h·d_nope) / (r·h·d_v), not d_qk / d_v")),
    RoleException(
        "factored projection", "attention", ("deepseek_v4", "glm5_next", "glm5_next_text", "timesformer"),
        detail="^q_proj", reason=(
            "a projection factored through a low rank or a second Linear (q_a_proj → q_b_proj through q_lora_rank "
            "with no rope part; DeepSeek-V4's grouped o_a_proj → o_b_proj; TimeSformer's temporal_dense after the "
            "temporal attention's output projection): n·r·(d_in + d_out) MACs, no multiple of n·d_in·d_out, so "
            "q_proj / out_proj is no ratio of head widths (DeepSeek-V3's factored q balances only because "
            "r·(d + h·d_qk) = d·h·d_qk at the yardstick's widths)")),
    RoleException(
        "per-layer embeddings", "gate", ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "embedding_gemma2",
                                         "embedding_gemma2_text"), reason=(
            "Gemma 3n's and Gemma 4's per-layer embeddings: each layer gates its per-layer input, "
            "act(per_layer_input_gate(h)) · per_layer_input, then per_layer_projection back to d (ffn_gate, "
            "ffn_down); the per-layer input's up projection is one per_layer_model_projection of the input "
            "embeddings for every layer, before the first (ffn_up outside the layers): model-wide ffn_up = ffn_gate "
            "= ffn_down, per layer the gate and down have no up of their own")),
    RoleException(
        "per-layer embeddings", "ffn", ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "embedding_gemma2",
                                        "embedding_gemma2_text"), reason=(
            "as above: a layer's ffn_down includes per_layer_projection, whose ffn_up is the model's one "
            "per_layer_model_projection before the first layer")),
    RoleException(
        "relative position", "attention", RELATIVE, reason=(
            "relative-position attention (Transformer-XL, Conformer, Funnel, XLNet, DeBERTa): beside q·kᵀ a second "
            "score product q·(W_pos p)ᵀ over the 2n − 1 relative positions (attn_scores, its position projection "
            "k_proj; DeBERTa adds a third, position to content, K·(W_q p)ᵀ); the weighted sum is one n × n product, "
            "so scores / weighted sum exceeds d_qk / d_v")),
    RoleException(
        "sliding chunks", "attention", ("led", "longformer"), reason=(
            "sliding-chunk attention (LongformerSelfAttention._sliding_chunks_*): the scores multiply overlapping "
            "2w × 2w chunks, the weighted sum w × 3w diagonalised chunks of the padded values (1.5 times the MACs); "
            "global attention adds its own projections: scores / weighted sum is no ratio of widths")),
    RoleException(
        "gated DeltaNet", "attention", GATED_DELTANET, parts="linear_attn:", reason=(
            "gated DeltaNet: q and k have linear_num_key_heads heads, v and the output linear_num_value_heads (more), "
            "each q/k head serving several value heads; the chunked core runs per value head, so q_proj / out_proj = "
            "h_k·d_k / (h_v·d_v), and k_proj / v_proj too, while scores / weighted sum = d_k / d_v")),
    RoleException(
        "Mamba-2", "attention", ("falcon_h1", "nemo_speechlm", "nemotron_h"), parts="(?i)mamba", reason=(
            "Mamba-2 (SSD) in its dual, attention-like form: C (q_proj) and B (k_proj) have n_groups·d_state columns "
            "shared by every head, x (v_proj) and out_proj heads·head_dim; scores and weighted sum run per head over "
            "d_state and head_dim, so the projections do not balance with the core")),
    RoleException(
        "query pooling", "attention", ("hiera", "sam2", "sam2_hiera_det_model", "sam2_vision_model", "sam2_video",
                                       "edgetam", "edgetam_video"), detail="^q_proj", reason=(
            "query pooling after the projection (HieraMaskUnitAttention, Sam2MultiScaleAttention with "
            "query_stride, each stage's first block): qkv runs on every token, the output projection on the pooled "
            "queries (a quarter, twice as wide), so q_proj / out_proj = 2 where scores / weighted sum = 1")),
    RoleException(
        "width-changing attention", "attention", ("levit",), reason=(
            "an attention that changes the width (LevitAttentionSubsample): q reads the stage's width, the output "
            "projection writes the next stage's, on the subsampled queries; its keys are narrower than its values "
            "(key_dim < attention_ratio·key_dim), so neither q/out nor k/v is d_qk / d_v")),
    RoleException(
        "grouped projections", "attention", ("squeezebert",), detail="^q_proj", reason=(
            "grouped projections: q, k and v are 1×1 convolutions in q_groups = k_groups = v_groups = 4 groups (a "
            "quarter of a dense projection's MACs), the output projection in post_attention_groups = 1")),
    RoleException(
        "two input widths", "attention", ("mobilebert",), reason=(
            "projections from two widths: q and k read the bottleneck (true_hidden_size; key_query_shared_bottleneck: "
            "one Linear, bottleneck.attention, feeds both and is charged to q_proj), v reads the layer's input "
            "(hidden_size, use_bottleneck_attention off)")),
    RoleException(
        "bidirectional fusion", "attention", ("grounding-dino", "mm-grounding-dino"), where=r"encoder\.layers\.",
        reason=(
            "Grounding DINO's fusion layer (GroundingDinoBiMultiHeadAttention) attends text to vision and vision to "
            "text over one score matrix: one scores product, two weighted sums, each side's projection charged once "
            "(q_proj for the first softmax's queries, k_proj for the other side), both values and both outputs, so "
            "q/out and k/v are no ratio of head widths; its other attentions (the text enhancer's, the deformable "
            "layer's, elementwise) balance on their own (tests/test_role_families.py)")),
    RoleException(
        "one projection for keys and values", "attention", ("deepseek_v4",), detail="^k_proj", reason=(
            "DeepSeek-V4's kv_proj makes one latent head that serves as both keys and values (num_key_value_heads=1, "
            "the same tensor on both sides of the core): charged to k_proj, the first in role order, v_proj 0")),
    RoleException(
        "shared QK", "attention", ("reformer",), detail="^k_proj 0 ", reason=(
            "shared query-key attention (LSHSelfAttention): one Linear, query_key, makes both q and k (q_proj); "
            "there is no k projection")),
    RoleException(
        "queries and keys mixed", "attention", ("zaya",), detail="^(q_proj|k_proj)", reason=(
            "compressed convolutional attention (ZayaCCAProjection): the queries are conv(cat[q, k])'s query "
            "channels + (q + repeat(k)) / 2, the keys its key channels + the mean of that over each group: both "
            "projections reach both sides of q·kᵀ, so both are charged to q_proj, the side they reach first "
            "(k_proj 0); the values are half current, half the previous token's (v_proj_current, v_proj_delayed, "
            "which also runs on one zero row per sequence)")),
    RoleException(
        "attention-pooling head", "head", ("aimv2", "aimv2_vision_model", "siglip", "siglip_vision_model",
                                           "siglip2", "siglip2_vision_model"), where=r"(^|\.)head$", reason=(
            "an attention-pooling head (a learned probe or class token attends over the patch tokens; SigLIP's adds "
            "an MLP): attention by design, in the head")),
    RoleException(
        "head with blocks", "head", ("sam3", "sam3_lite_text"), where=r"^(mask_decoder|dot_product_scoring)$",
        reason=(
            "a head built of transformer blocks: SAM 3's mask decoder cross-attends from the queries to the prompt "
            "(Sam3MaskDecoder.prompt_cross_attn, q/k/v/out and a softmax core) before its pixel decoder; its "
            "dot-product scoring runs an FFN block with residual and norm over the prompt tokens (text_mlp, "
            "Sam3DecoderMLP) before the two projections it scores with")),
    # diffusers
    RoleException(
        "context_pre_only", "attention", ("MochiTransformer3DModel", "SD3Transformer2DModel"), detail="^q_proj",
        reason=(
            "a joint (MMDiT) block that ends the context stream (context_pre_only, the last block): the context "
            "tokens' queries are projected (add_q_proj) and attend, but their output is never projected (no "
            "to_add_out), so q_proj exceeds out_proj by the context's share")),
    RoleException(
        "differential attention", "attention", ("AutoencoderSAME", "StableAudio3DiTModel"), reason=(
            "differential attention (use_differential: to_qkv makes [q1 | q2 | k1 | k2 | v]): two score maps over one "
            "v, so q_proj / out_proj = k_proj / v_proj = 2 while scores / weighted sum = 1")),
    RoleException(
        "projector shared by k and v", "attention", ("NucleusMoEImageTransformer2DModel",), detail="^k_proj", reason=(
            "a projector of the context between widths (encoder_proj: joint_attention_dim → dim) whose output feeds "
            "both add_k_proj and add_v_proj, charged to k_proj")),
    RoleException(
        "skip joined before the FFN", "ffn", ("StableCascadeUNet",), where=r"^up_blocks\.", reason=(
            "Stable Cascade's decoder ResBlocks (SDCascadeResBlock with c_skip) concatenate the encoder's skip "
            "features to the depthwise-convolved input before the channel MLP: its up projection reads c + c_skip "
            "channels, its down projection writes c back to the residual, so ffn_up / ffn_down = (c + c_skip) / c")),
    RoleException(
        "quantization bottleneck", "head", ("AceStepAudioTokenizer",), where=r"^quantizer$", reason=(
            "a finite scalar quantizer (_AceStepResidualFSQ: project_in d → levels, tanh, rounding to the levels, "
            "project_out back to d) as the tokenizer's last module, taken for a head by head_paths: by dataflow an "
            "MLP back to its width that writes back to nothing, as a bare MLP model is (ffn_up, ffn_down), on "
            "every token, not a head on pooled vectors")),
    RoleException(
        "projector between widths", "head", ("granite_docling_vision", "nemotron3_5_asr"),
        where=r"(connector|prompt_projector)$", reason=(
            "a projector into the language model's width (pixel shuffle → Linear → GELU → Linear; an audio prompt "
            "projector), per token: the last module of a tower-only class, so head_paths takes it for a head; an "
            "MLP between widths, its up and down of different sizes")),
)
"""Every documented exception, for every zoo: where an invariant truly does not apply (read in the model's code),
never a misreading."""


def exception_for(name: str, imbalance: list[str], parts: list[str]) -> RoleException | None:
    return next((e for e in EXCEPTIONS if e.covers(name, imbalance, parts)), None)


# --------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------
CONSISTENT, COVERED, MISREAD = "consistent", "covered", "misread"
CHECKER = "checker"  # covered, by an exception that is role_balance's own reading (counted beside COVERED)


def classified(name: str, run: dict[str, Any], items: list[list[str]] | None = None) -> list[
        tuple[str, str, str, RoleException | None]]:
    """``(where, rule, detail, exception or None)`` for each of ``items`` (default: every imbalance of ``run``)."""
    parts = run.get("parts", {})
    return [(where, rule, detail, exception_for(name, [where, rule, detail], parts.get(where, [])))
            for where, rule, detail in (run.get("imbalances", []) if items is None else items)]


def _verdict(name: str, runs: list[dict[str, Any]]) -> str | None:
    """``consistent`` (no imbalance), ``covered`` (each one by an exception) or ``misread``; None if nothing ran."""
    ran = [run for run in runs if "imbalances" in run]
    if not ran:
        return None
    found = [row for run in ran for row in classified(name, run)]
    if not found:
        return CONSISTENT
    if not all(exc for *_, exc in found):
        return MISREAD
    return CHECKER if any(exc and exc.checker for *_, exc in found) else COVERED


def _strip(where: str, prefix: str) -> str:
    return where[len(prefix) + 1:] if prefix and where.startswith(prefix + ".") else where


def new_in_head(base: dict[str, Any] | None, run: dict[str, Any]) -> list[list[str]]:
    """The imbalances of a head class's run that its base model does not have (the same rule and numbers at the
    same path under the head class's base-model attribute, or one ending the other, are the base's:
    ``model.layers.1`` of ``Qwen3_5ForCausalLM`` is ``language_model.layers.1`` of ``Qwen3_5Model``)."""
    known = [(w, r, d) for w, r, d in (base or {}).get("imbalances", [])]

    def the_base_s(where: str, rule: str, detail: str) -> bool:
        mine = _strip(where, run.get("prefix", ""))
        return any(r == rule and d == detail and (w == mine or w.endswith("." + mine) or mine.endswith("." + w))
                   for w, r, d in known)
    return [[w, r, d] for w, r, d in run.get("imbalances", []) if not the_base_s(w, r, d)]


def _collapsed(rows: list[tuple[str, str, str, RoleException | None]]) -> list[
        tuple[str, str, str, RoleException | None]]:
    """The layers of one list that break a rule with the same numbers (and the same verdict) on one row
    (``encoder.layer.{0,1}``)."""
    groups: dict[tuple[str, str, str, RoleException | None], list[str]] = defaultdict(list)
    for where, rule, detail, exc in rows:
        m = re.match(r"^(.*?)(\d+)$", where)
        stem, index = (m.group(1), m.group(2)) if m else (where, "")
        groups[(stem, rule, detail, exc)].append(index)
    out = []
    for (stem, rule, detail, exc), indices in groups.items():
        where = stem if indices == [""] else stem + (indices[0] if len(indices) == 1 else "{" + ",".join(indices) + "}")
        out.append((where, rule, detail, exc))
    return out


def summary(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Per architecture, the verdict of its base run and of its head runs; the counts."""
    base_verdicts, head_verdicts = {}, {}
    for r in results:
        runs = r.get("roles", {}).get("runs", [])
        base = [run for run in runs if run["kind"] == BASE]
        heads = [run for run in runs if run["kind"] != BASE]
        v = _verdict(r[name], base)
        if v:
            base_verdicts[r[name]] = v
        v = _verdict(r[name], heads)
        if v:
            head_verdicts[r[name]] = v
    def counts(verdicts: dict[str, str]) -> Counter[str]:
        c = Counter(v if v != CHECKER else COVERED for v in verdicts.values())
        c[CHECKER] = sum(v == CHECKER for v in verdicts.values())
        return c
    return {"base": base_verdicts, "heads": head_verdicts,
            "base_counts": counts(base_verdicts), "head_counts": counts(head_verdicts)}


def _share(counts: Counter[str], what: str) -> str:
    checked = counts[CONSISTENT] + counts[COVERED] + counts[MISREAD]
    checker = f" ({counts[CHECKER]} of them by role_balance's own reading of a layer)" if counts[CHECKER] else ""
    return (f"**{counts[CONSISTENT]} of {checked} {what} consistent**, {counts[COVERED]} covered by documented "
            f"exceptions{checker}, {counts[MISREAD]} misread")


def share_lines(s: dict[str, Any], what: str = "architectures") -> list[str]:
    lines = [f"- base models: {_share(s['base_counts'], what)}"]
    if s["heads"]:
        lines.append(f"- with their heads (`*ForCausalLM`, `*ForSequenceClassification`, `*ForImageClassification`): "
                     f"{_share(s['head_counts'], what + ' with a head class')}")
    return lines


def _violation_rows(results: list[dict[str, Any]], name: str, heads: bool,
                    cell: Callable[[Any], str]) -> tuple[list[str], list[str], Counter[str]]:
    """Markdown rows of the misreadings and of the covered imbalances (base runs, or what the head runs add), and
    how many imbalances (collapsed rows) of each kind."""
    misread, covered, counts = [], [], Counter[str]()
    for r in results:
        runs = r.get("roles", {}).get("runs", [])
        base = next((run for run in runs if run["kind"] == BASE), None)
        for run in runs:
            if (run["kind"] == BASE) == heads or "imbalances" not in run:
                continue
            items = new_in_head(base, run) if heads else None
            for where, rule, detail, exc in _collapsed(classified(r[name], run, items)):
                row = f"| {r[name]} |" + (f" {run['class']} |" if heads else "") + f" {cell(where)} | {rule} | " \
                      f"{cell(detail)} |"
                if exc:
                    covered.append(f"{row} {exc.label}{' (role_balance)' if exc.checker else ''} |")
                    counts[COVERED] += 1
                else:
                    misread.append(row)
                    counts[MISREAD] += 1
    return misread, covered, counts


def report_lines(results: list[dict[str, Any]], name: str, cell: Callable[[Any], str],
                 what: str = "architectures") -> list[str]:
    """The report's body: the consistent share, the misreadings (base, then new with the heads), the covered
    imbalances, the exceptions table."""
    s = summary(results, name)
    lines = ["## Summary", "", *share_lines(s, what), ""]
    sections = [(False, "Base models")] + ([(True, "With heads: what the head classes add")] if s["heads"] else [])
    for heads, title in sections:
        misread, covered, counts = _violation_rows(results, name, heads, cell)
        header = f"| {name} |" + (" class |" if heads else "") + " layer / head | rule | measured (MACs) |"
        sep = "|---|" + ("---|" if heads else "") + "---|---|---|"
        lines += [f"## {title}", "",
                  f"{counts[MISREAD]} misread, {counts[COVERED]} covered by exceptions (layers of one list with the "
                  "same numbers on one row).", "", "### Misreadings", ""]
        lines += [header, sep, *misread] if misread else ["(none)"]
        lines += ["", "### Covered by documented exceptions", ""]
        lines += [header + " exception |", sep + "---|", *covered] if covered else ["(none)"]
        lines.append("")
    used = Counter(exc for r in results for run in r.get("roles", {}).get("runs", [])
                   for *_, exc in classified(r[name], run) if exc)
    lines += ["## Documented exceptions", "", "`benchmarks/zoo_roles.py`, `EXCEPTIONS`: where an invariant does not "
              "apply, read in the model's code (a misreading is never one); those marked role_balance are its own "
              "reading of what a layer is, reported to be fixed.", "",
              "| exception | rule | narrowed to | architectures | reason | imbalances covered |",
              "|---|---|---|---|---|---|"]
    for e in EXCEPTIONS:
        narrowed = "; ".join(f"{k} `{v}`" for k, v in (("where", e.where), ("detail", e.detail), ("parts", e.parts))
                             if v) or "–"
        label = e.label + (" (role_balance)" if e.checker else "")
        lines.append(f"| {label} | {e.rule} | {cell(narrowed)} | {', '.join(e.names)} | {cell(e.reason)} | "
                     f"{used[e]} |")
    return [*lines, ""]
