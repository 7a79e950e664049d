"""Sweep every base architecture of Hugging Face transformers and compare flopscope with a reference.

For each ``model_type`` in ``transformers.models.auto.modeling_auto.MODEL_MAPPING_NAMES`` (the base
``AutoModel`` classes), the script

1. instantiates the config class with default arguments and shrinks it generically to a tiny model
   (hidden size 64, 2 layers, 4 heads, intermediate 128, vocabulary 1024, 4 experts, 64x64 images; every
   attribute found on the config or any nested sub-config); if that model cannot be built or cannot run,
   it retries with only the depth shrunk, then with the default config (if it has under
   ``--max-params`` parameters). Nothing is ever downloaded (``HF_HUB_OFFLINE=1``).
2. builds inputs generically from the forward signature and the config (``input_ids`` of 16 tokens,
   ``pixel_values`` from ``image_size``/``num_channels``, ``input_features``/``input_values`` for audio,
   ``decoder_input_ids`` for encoder-decoders, batch 1) and keeps the first candidate that runs a plain
   eager CPU forward; architectures with no such input are skipped with the reason.
3. counts, all on the same weights and inputs:

   - ``flopscope``: ``flopscope.profile(model, mode="auto")`` under ``torch.no_grad()`` with the model
     as built (SDPA attention, grouped-mm experts, oneDNN enabled): MACs, whether it fell back to real
     mode (and the warning's reason), ``unsupported()`` ops, or the flopscope error;
   - ``reference``: ``torch.utils.flop_counter.FlopCounterMode`` with attention forced to ``"eager"``,
     experts to ``"eager"``, ``sdpa_kernel(SDPBackend.MATH)``, ``torch.backends.mkldnn.flags(enabled=False)``
     and grad mode on (so ``nn.MultiheadAttention`` and friends take their unfused paths); reference MACs
     are ``get_total_flops() // 2``;
   - ``flopscope-eager``: ``flopscope.profile`` in that same reference configuration, so
     ``flopscope-eager != reference`` isolates formula differences and ``flopscope != flopscope-eager``
     isolates the handling of fused kernels. It explains differences, so it runs only where flopscope and
     the reference differ (or either failed); ``--eager-always`` runs it for every architecture (a third more
     time: its unsupported ops, fallbacks and errors then appear in the report for the exact ones too).

Each architecture runs in its own process, forked from a warmed-up parent, under ``signal.alarm(--timeout)``
(``zoo_runner.sweep``, shared with ``benchmarks/timm_zoo.py``), so one hang or crash does not stop the sweep.

Usage::

    python benchmarks/zoo.py [--only name1,name2] [--jobs N] [--report PATH] [--json PATH] [--timeout S]
    python benchmarks/zoo.py --roles [--only ...]   # the roles yardstick only (issue 47)

Writes a markdown report (default ``benchmarks/zoo_report.md``) and prints a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import inspect
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the flopscope checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_runner
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import zoo_roles  # after the paths are set
import zoo_runner as runner

from flopscope import conventions  # after the checkout is on sys.path

HIDDEN, LAYERS, HEADS, INTER, VOCAB, EXPERTS, TOKENS, IMAGE = 64, 2, 4, 128, 1024, 4, 16, 64
AUDIO_SAMPLES = 4000


@dataclass(frozen=True)
class Widths:
    """The caps of the widths a level-0 shrink sets beside ``HIDDEN``: every head-width key (``head_dim``,
    ``d_kv``, ``v_head_dim``, ...), every FFN width key and every expert FFN width key."""

    head_dim: int
    inter: int
    expert_inter: int


TINY = Widths(HIDDEN // HEADS, INTER, HIDDEN)
"""The sweep's tiny config: head_dim · heads = hidden, experts as wide as the model."""
DISTINCT = Widths(24, 96, 80)
"""The roles yardstick's tiny config: no two widths coincide (head_dim · heads = 96, d_ff = 96, expert d_ff = 80,
hidden = 64), so that a role read as another one changes a balance (``--roles``)."""

# --------------------------------------------------------------------------------------------------
# config shrinking (generic: attribute names shared by many families)
# --------------------------------------------------------------------------------------------------
# the names families give each hyper-parameter live in flopscope.conventions (one home)
WIDTH_KEYS = conventions.WIDTH.every_config_key
HEAD_KEYS = conventions.HEADS.every_config_key
KV_HEAD_KEYS = conventions.KV_HEADS.every_config_key
HEAD_DIM_KEYS = conventions.HEAD_WIDTH.every_config_key
INTER_KEYS = conventions.FFN_WIDTH.every_config_key
POOLER_KEYS = ("pooler_hidden_size",)  # DeBERTa's sequence-classification pooler: the hidden states' width
SMALL_INTER_KEYS = conventions.EXPERT_FFN_WIDTH.every_config_key
LAYER_KEYS = conventions.LAYERS.every_config_key
LAYER_RE = re.compile(r"^(n|num)_\w*layers$")  # n_input_layers, num_mel_layers, ... (not the ones below)
LAYER_RE_SKIP = ("shared", "nextn", "predict", "dense", "mtp", "adapter", "feat_extract", "conv", "residual")
EXPERT_KEYS = conventions.EXPERTS.every_config_key
ROUTING_KEYS = tuple(k for k in conventions.TOP_K.every_config_key if k != "top_k")  # top_k may be a sampling knob
SMALL_KEYS = {**dict.fromkeys(conventions.TOP_K.every_config_key, 2), "num_expert_group": 1,
              "linear_num_heads": 4, "num_frames": 4, "n_group": 1, "topk_group": 1,
              "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
              "first_k_dense_replace": 1, "num_nextn_predict_layers": 0, "index_n_heads": 2, "index_topk": 8,
              "linear_num_key_heads": 2, "linear_num_value_heads": 4, "max_source_positions": 32,
              "max_target_positions": 64, "num_queries": 16, "num_denoising": 0, "mamba_d_state": 16,
              "state_size": 16, "mamba_n_heads": 8, "mamba_chunk_size": 16, "mamba_d_head": 16,
              "chunk_size": 16, "time_step_rank": 8,
              "num_kv_shared_layers": 0, "sliding_window": 8, "local_attention": 8, "window_size": 4,
              "num_position_embeddings": 64, "image_seq_length": 16, "mm_tokens_per_image": 16}
LIST_SCALE_KEYS = ("hidden_sizes", "embed_dims", "dims", "embed_dim_per_stage", "backbone_channel_list",
                   "neck_hidden_sizes", "conv_dim", "channels_list")
LIST_ONES_KEYS = ("depths", "blocks_per_stage", "num_layers_per_stage")
TOKEN_ID_RE = re.compile(r"(token_id|token_index|token_ids|_start_id|_end_id|_id)$")


def _sub_configs(cfg: Any) -> list[Any]:
    """``cfg`` and every config nested in it (``text_config``, ``vision_config``, ...), depth first."""
    from transformers import PretrainedConfig
    out, todo, seen = [], [cfg], set()
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        for v in list(vars(c).values()):
            if isinstance(v, PretrainedConfig):
                todo.append(v)
            elif isinstance(v, dict):
                todo.extend(x for x in v.values() if isinstance(x, PretrainedConfig))
    return out


def _set(c: Any, key: str, value: Any) -> None:
    with contextlib.suppress(Exception):  # read-only property on some configs
        setattr(c, key, value)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shrink_config(cfg: Any, level: int, uses_mrope: bool = False, widths: Widths = TINY) -> Any:
    """Level 0: tiny everything (the head, FFN and expert widths capped at ``widths``); level 1: only depth, experts
    and vocabulary; level 2: unchanged."""
    _repair(cfg)
    if level >= 2:
        return cfg
    for c in _sub_configs(cfg):
        attrs = vars(c)
        _shrink_depth(c)
        for k in LIST_ONES_KEYS:
            if isinstance(attrs.get(k), (list, tuple)) and all(_is_int(x) for x in attrs[k]):
                _set(c, k, type(attrs[k])([1] * len(attrs[k])))
        for k in EXPERT_KEYS:
            if _is_int(attrs.get(k)) and attrs[k] > EXPERTS:
                _set(c, k, EXPERTS)
        for k in (*ROUTING_KEYS, "n_group", "topk_group", "num_expert_group", "num_queries"):
            if _is_int(attrs.get(k)) and attrs[k] > SMALL_KEYS[k]:
                _set(c, k, SMALL_KEYS[k])
        if _is_int(attrs.get("vocab_size")) and attrs["vocab_size"] > VOCAB:
            _set(c, "vocab_size", VOCAB)
        if level == 0:
            _shrink_widths(c, widths)
    _fix_token_ids(cfg)
    _repair(cfg)
    if level == 0:
        _fix_mrope(cfg, uses_mrope)
    return cfg


INDEX_LIST_KEYS = ("mlp_only_layers", "global_attn_indexes", "global_attention_blocks", "full_attn_idxs",
                   "attn_layer_indices", "no_rope_layers_idx", "sliding_window_layers", "cross_attention_layers")


def _shrink_depth(c: Any) -> None:
    """``LAYERS`` layers; per-layer lists (``layer_types``, ``mlp_layer_types``, layer-index lists) keep
    the layers that cover the most distinct kinds, so hybrid models keep an attention and an MoE layer."""
    attrs = vars(c)
    stages = {len(v) for k, v in attrs.items() if k in LIST_ONES_KEYS and isinstance(v, (list, tuple))}
    keys = [k for k, v in attrs.items() if _is_int(v) and v > LAYERS and v not in stages and (
        k in LAYER_KEYS or (LAYER_RE.match(k) and not any(x in k for x in LAYER_RE_SKIP)))]
    old = {attrs[k] for k in keys}
    if not old:
        return
    n_old = max(old)
    for k in keys:
        _set(c, k, LAYERS)
    per_layer = {k: v for k, v in attrs.items()
                 if isinstance(v, (list, tuple)) and len(v) in old
                 and k not in LIST_SCALE_KEYS and not k.startswith("_")}
    index_lists = {k: v for k, v in attrs.items() if k in INDEX_LIST_KEYS and isinstance(v, (list, tuple))
                   and v and all(_is_int(x) for x in v)}
    features: dict[int, set[tuple[str, str]]] = {}
    for i in range(n_old):
        f = {(k, repr(v[i])) for k, v in per_layer.items() if len(v) == n_old}
        f |= {(k, str(i in v)) for k, v in index_lists.items()}
        features[i] = f
    chosen: list[int] = []
    covered: set[tuple[str, str]] = set()
    while len(chosen) < min(LAYERS, n_old):
        best = max((i for i in range(n_old) if i not in chosen), key=lambda i: (len(features[i] - covered), -i))
        chosen.append(best)
        covered |= features[best]
    chosen.sort()
    for k, v in per_layer.items():
        pick = chosen if len(v) == n_old else list(range(LAYERS))
        _set(c, k, type(v)(v[i] for i in pick if i < len(v)))
    for k, v in index_lists.items():
        _set(c, k, type(v)(pos for pos, i in enumerate(chosen) if i in v))
    # periodic layer patterns (Jamba: attention every 8th layer from the 4th)
    for k, v in list(attrs.items()):
        if not _is_int(v):
            continue
        if k.endswith(("_period", "_interval", "_freq")) and "layer" in k and v > LAYERS:
            _set(c, k, LAYERS)
        elif k.endswith(("_offset", "_end_index")) and "layer" in k and v >= LAYERS:
            _set(c, k, LAYERS - 1)
        elif k in ("first_k_dense_replace", "num_dense_layers", "first_dense_layers") and v >= LAYERS:
            _set(c, k, 1)


def _repair(cfg: Any) -> None:
    """Derived attributes some default configs leave as ``None`` (the model would fail on them)."""
    for c in _sub_configs(cfg):
        attrs = vars(c)
        heads = next((attrs[k] for k in HEAD_KEYS if _is_int(attrs.get(k))), None)
        for k in KV_HEAD_KEYS:
            if k in attrs and attrs[k] is None and heads:
                _set(c, k, heads)
        if "num_experts_per_tok" in attrs and attrs["num_experts_per_tok"] is None \
                and any(_is_int(attrs.get(k)) for k in EXPERT_KEYS):
            _set(c, "num_experts_per_tok", 2)
        if "head_dim" in attrs and attrs["head_dim"] is None:
            hidden = next((attrs[k] for k in WIDTH_KEYS if _is_int(attrs.get(k))), None)
            heads = next((attrs[k] for k in HEAD_KEYS if _is_int(attrs.get(k))), None)
            if hidden and heads:
                _set(c, "head_dim", hidden // heads)


def _uses_mrope(cls: Any, cfg: Any) -> bool:
    """Whether the model (or the model of one of its sub-configs) reads ``mrope_section``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    classes = [cls]
    for c in _sub_configs(cfg):
        name = MODEL_MAPPING_NAMES.get(getattr(c, "model_type", ""), None)
        name = name[0] if isinstance(name, (list, tuple)) else name
        if name and getattr(transformers, name, None) is not None:
            classes.append(getattr(transformers, name))
    for k in classes:
        try:
            if "mrope_section" in inspect.getsource(sys.modules[k.__module__]):
                return True
        except Exception:
            pass
    return False


def _fix_mrope(cfg: Any, uses_mrope: bool) -> None:
    """Multimodal RoPE splits the rotary half-dimension into sections (t, h, w); rescale them."""
    for c in _sub_configs(cfg):
        rp = vars(c).get("rope_parameters")
        if not isinstance(rp, dict) or not (uses_mrope or "mrope_section" in rp):
            continue
        hidden = next((vars(c)[k] for k in WIDTH_KEYS if _is_int(vars(c).get(k))), None)
        heads = next((vars(c)[k] for k in HEAD_KEYS if _is_int(vars(c).get(k))), None)
        head_dim = vars(c).get("head_dim")
        if not _is_int(head_dim):
            head_dim = hidden // heads if hidden and heads else None
        if not head_dim or (hidden is None and "mrope_section" not in rp):
            continue
        factor = rp.get("partial_rotary_factor", vars(c).get("partial_rotary_factor", 1.0)) or 1.0
        target = int(head_dim * factor) // 2
        section = list(rp.get("mrope_section") or [8, 12, 12])
        if sum(section) == target:
            continue
        scaled = [max(1, x * target // sum(section)) for x in section]
        scaled[-1] += target - sum(scaled)
        if scaled[-1] >= 1:
            rp["mrope_section"] = scaled


def _cap(c: Any, attrs: dict[str, Any], keys: Any, cap: int) -> None:
    """Lower every integer config field in ``keys`` that exceeds ``cap`` to ``cap``."""
    for k in keys:
        if _is_int(attrs.get(k)) and attrs[k] > cap:
            _set(c, k, cap)


def _shrink_widths(c: Any, widths: Widths) -> None:
    attrs = vars(c)
    heads = next((attrs[k] for k in HEAD_KEYS if _is_int(attrs.get(k))), None)
    rope_is_head_dim = _is_int(attrs.get("head_dim")) and attrs.get("head_dim") == attrs.get("qk_rope_head_dim")
    kv = next((attrs[k] for k in KV_HEAD_KEYS if _is_int(attrs.get(k))), None)
    for keys, cap in [((*WIDTH_KEYS, *POOLER_KEYS), HIDDEN), (HEAD_KEYS, HEADS)]:
        _cap(c, attrs, keys, cap)
    for k in KV_HEAD_KEYS:
        if _is_int(attrs.get(k)):
            _set(c, k, HEADS if heads is None or kv == heads else (1 if kv == 1 else 2))
    for keys, cap in [(HEAD_DIM_KEYS, widths.head_dim), (INTER_KEYS, widths.inter),
                      (SMALL_INTER_KEYS, widths.expert_inter)]:
        _cap(c, attrs, keys, cap)
    for k, v in SMALL_KEYS.items():
        _cap(c, attrs, (k,), v)
    for k in LIST_SCALE_KEYS:
        v = attrs.get(k)
        if isinstance(v, (list, tuple)) and v and all(_is_int(x) for x in v) and max(v) > HIDDEN:
            _set(c, k, type(v)(max(8, (x * HIDDEN * 2 // max(v)) // 8 * 8) for x in v))
    if _is_int(attrs.get("rotary_dim")) and attrs["rotary_dim"] > HIDDEN // HEADS // 2:
        _set(c, "rotary_dim", HIDDEN // HEADS // 2)
    # multi-head latent attention: keep head_dim / qk_head_dim consistent with the rope / nope split
    if rope_is_head_dim:
        _set(c, "head_dim", attrs["qk_rope_head_dim"])
    if all(_is_int(attrs.get(k)) for k in ("qk_head_dim", "qk_rope_head_dim", "qk_nope_head_dim")):
        _set(c, "qk_head_dim", attrs["qk_rope_head_dim"] + attrs["qk_nope_head_dim"])
    # list-valued head counts (Swin-style stages): keep them dividing the stage widths
    for k in ("num_heads", "num_attention_heads", "num_attention_heads_per_stage"):
        v = attrs.get(k)
        if isinstance(v, list) and v and all(_is_int(x) for x in v):
            _set(c, k, [1 << min(i, 3) for i in range(len(v))])
    # images: 64x64, patches that divide it
    size = attrs.get("image_size")
    if _is_int(size) and size > IMAGE:
        _set(c, "image_size", IMAGE)
    elif isinstance(size, (list, tuple)) and len(size) == 2 and all(_is_int(s) and s > IMAGE for s in size):
        _set(c, "image_size", type(size)([IMAGE, IMAGE]))
    patch = attrs.get("patch_size")
    if _is_int(patch) and patch > 1 and IMAGE % patch:
        _set(c, "patch_size", 16)
    # state-space models: heads * head_dim must equal expand * hidden
    if _is_int(attrs.get("expand")) and _is_int(attrs.get("num_heads")) and _is_int(attrs.get("head_dim")) \
            and _is_int(attrs.get("hidden_size")):
        _set(c, "num_heads", attrs["expand"] * attrs["hidden_size"] // attrs["head_dim"])
    if _is_int(attrs.get("mamba_expand")) and _is_int(attrs.get("mamba_n_heads")) and _is_int(attrs.get("hidden_size")):
        _set(c, "mamba_d_head", attrs["mamba_expand"] * attrs["hidden_size"] // attrs["mamba_n_heads"])
        if _is_int(attrs.get("mamba_d_ssm")):
            _set(c, "mamba_d_ssm", attrs["mamba_expand"] * attrs["hidden_size"])


def _fix_token_ids(cfg: Any) -> None:
    """Move special-token ids that no longer fit the (shrunk) vocabulary into its top rows."""
    vocab = min((vars(c)["vocab_size"] for c in _sub_configs(cfg) if _is_int(vars(c).get("vocab_size"))), default=None)
    if vocab is None:
        return
    remap: dict[int, int] = {}

    def fix(x: Any) -> Any:
        if _is_int(x) and x >= vocab:
            return remap.setdefault(x, vocab - 1 - len(remap) % 64)
        return x

    for c in _sub_configs(cfg):
        for k, v in list(vars(c).items()):
            if not TOKEN_ID_RE.search(k) or k in ("vocab_size",):
                continue
            if _is_int(v):
                _set(c, k, fix(v))
            elif isinstance(v, list) and all(_is_int(x) for x in v):
                _set(c, k, [fix(x) for x in v])


def special_ids(cfg: Any) -> set[int]:
    ids: set[int] = set()
    for c in _sub_configs(cfg):
        for k, v in vars(c).items():
            if TOKEN_ID_RE.search(k):
                if _is_int(v):
                    ids.add(v)
                elif isinstance(v, list):
                    ids.update(x for x in v if _is_int(x))
    return ids


# --------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------
def _find(cfg: Any, *keys: str, prefer: str = "") -> Any:
    """The first value of ``keys`` on the config or a sub-config (sub-configs named ``prefer`` first)."""
    subs = _sub_configs(cfg)
    if prefer:
        subs = sorted(subs, key=lambda c: prefer not in type(c).__name__.lower())
    for k in keys:
        for c in subs:
            v = vars(c).get(k, getattr(c, k, None) if k in dir(type(c)) else None)
            if v is not None and not isinstance(v, bool):
                return v
    return None


def input_candidates(model: Any, cfg: Any) -> list[dict[str, Any]]:
    import torch
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    main = getattr(model, "main_input_name", "input_ids")
    if isinstance(main, (list, tuple)):
        main = main[0] if main else "input_ids"
    gen = torch.Generator().manual_seed(0)
    vocab = min((vars(c)["vocab_size"] for c in _sub_configs(cfg) if _is_int(vars(c).get("vocab_size"))
                 and vars(c)["vocab_size"] > 16), default=VOCAB)
    banned = special_ids(cfg)
    allowed = [i for i in range(min(int(vocab), VOCAB)) if i not in banned and i > 3] or list(range(int(vocab)))

    def ids(n: int = TOKENS) -> torch.Tensor:
        pick = torch.randint(0, len(allowed), (1, n), generator=gen)
        return torch.tensor(allowed)[pick]

    text = {"input_ids": ids()}
    text_dec = {"decoder_input_ids": ids()} if "decoder_input_ids" in params else {}
    size = _find(cfg, "image_size", "img_size", prefer="vision") or IMAGE
    size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
    channels = _find(cfg, "num_channels", "in_channels", "in_chans", prefer="vision")
    channels = channels if _is_int(channels) else 3
    pixels = {"pixel_values": torch.randn(1, channels, *size[-2:], generator=gen)}
    frames_v = _find(cfg, "num_frames", prefer="vision")
    videos = [{"pixel_values": torch.randn(1, frames_v, channels, *size[-2:], generator=gen)}] \
        if _is_int(frames_v) and frames_v > 0 else []
    mel = _find(cfg, "num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", "num_mel_filters",
                prefer="audio")
    mel = mel if _is_int(mel) and mel > 0 else 80
    src = _find(cfg, "max_source_positions", prefer="audio")
    frames = [2 * src] if _is_int(src) and src < 4096 else []
    frames += [64, 128]
    feats = [{"input_features": torch.randn(1, mel, t, generator=gen)} for t in frames]
    feats += [{"input_features": torch.randn(1, t, mel, generator=gen)} for t in frames[-2:]]
    achan = _find(cfg, "audio_channels", "num_input_channels", prefer="audio")
    values = [{"input_values": torch.randn(1, AUDIO_SAMPLES, generator=gen)},
              {"input_values": torch.randn(1, achan if _is_int(achan) else 1, AUDIO_SAMPLES, generator=gen)}]
    max_len = _find(cfg, "max_length", prefer="audio")
    if _is_int(max_len) and 0 < max_len <= 2048:  # spectrogram patches (AST)
        values.append({"input_values": torch.randn(1, max_len, mel, generator=gen)})
    # already-embedded inputs: [1, T, width] for the widths the config names
    widths = []
    for c in _sub_configs(cfg):
        for k, v in vars(c).items():
            if _is_int(v) and 0 < v <= 4096 and (k == "hidden_size" or k.endswith("input_dim")) and v not in widths:
                widths.append(v)
    for w in widths[:3]:
        feats.append({"input_features": torch.randn(1, 64, w, generator=gen)})
        values.append({"input_values": torch.randn(1, 64, w, generator=gen)})

    by_name: dict[str, list[dict[str, Any]]] = {"input_ids": [text], "pixel_values": [pixels, *videos],
                                                "input_features": feats, "input_values": values}
    out: list[dict[str, Any]] = []
    for first in by_name.get(main, [text]):
        out.append({**first, **text_dec})
    if main == "input_ids" and "attention_mask" in params:
        out.append({**text, "attention_mask": torch.ones_like(text["input_ids"]), **text_dec})
    both = {}  # multi-modal models that need every modality (CLIP, CLAP, ...)
    for name in ("input_ids", "pixel_values", "input_features", "input_values"):
        if name in params:
            both.update(by_name[name][0])
    if len(both) >= 2:
        out.append({**both, **text_dec})
    if main != "input_ids" and "input_ids" in params:
        out.append({**text, **text_dec})
    for name in ("pixel_values", "input_features", "input_values"):
        if name in params and name != main:
            out.extend({**x, **text_dec} for x in by_name[name])
    unique, seen = [], set()
    for c in out:
        key = tuple((k, tuple(v.shape)) for k, v in c.items())
        if key not in seen and all(k in params or any(p.kind == p.VAR_KEYWORD for p in params.values()) for k in c):
            seen.add(key)
            unique.append(c)
    return unique


# --------------------------------------------------------------------------------------------------
# one architecture (runs in its own process)
# --------------------------------------------------------------------------------------------------
def _set_eager(model: Any) -> list[str]:
    """Attention and experts in eager mode; returns what could not be set."""
    problems = []
    try:
        model.set_attn_implementation("eager")
    except Exception as e:  # older or unusual classes: set the config field everywhere
        problems.append(f"set_attn_implementation: {runner.short(e, 120)}")
        for c in _sub_configs(model.config):
            _set(c, "_attn_implementation", "eager")
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:
            problems.append(f"set_experts_implementation: {runner.short(e, 120)}")
            for c in _sub_configs(model.config):
                if hasattr(c, "_experts_implementation"):
                    _set(c, "_experts_implementation", "eager")
    return problems


def _build(cls: Any, cfg: Any, level: int, max_params: int) -> Any:
    import torch
    if level >= 1:  # check the size on the meta device first
        with torch.device("meta"):
            meta = cls._from_config(copy.deepcopy(cfg), dtype=torch.float32)
        n = sum(p.numel() for p in meta.parameters())
        del meta
        if n > max_params:
            raise MemoryError(f"{n / 1e6:.0f}M parameters at shrink level {level} (limit {max_params / 1e6:.0f}M)")
    torch.manual_seed(0)
    model = cls._from_config(cfg, dtype=torch.float32)
    return model.eval()


def run_arch(model_type: str, class_name: str, timeout: int, max_params: int,
             eager_always: bool = False, invariants: bool = True) -> dict[str, Any]:
    res: dict[str, Any] = {"arch": model_type, "class": class_name, "status": "skip"}
    with runner.guarded(res, timeout, lambda r: f"over {timeout} s (stage reached: {r.get('stage', 'build/probe')})"):
        _count(res, model_type, class_name, max_params, eager_always, invariants)
    return res


LEVELS = ((0, TINY), (1, TINY), (2, TINY))
"""The configs the sweep tries, in order, as ``(shrink level, widths)``: the first that builds and runs is kept."""
ROLE_LEVELS = ((0, DISTINCT), *LEVELS)
"""The same for the roles yardstick: the widths that do not coincide first."""


def _forward_inputs(model: Any, candidates: list[dict[str, Any]], errors: list[str]) -> dict[str, Any] | None:
    """The first of ``candidates`` on which a plain ``no_grad`` forward of ``model`` runs (the errors of the others
    appended to ``errors``)."""
    import torch
    for cand in candidates:
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                model(**cand)
            return cand
        except Exception as e:
            errors.append(runner.short(e, 200))
            if os.environ.get("ZOO_DEBUG"):
                traceback.print_exc()
    return None


def _probe(res: dict[str, Any], model_type: str, cls: Any, max_params: int,
           levels: tuple[tuple[int, Widths], ...], settings: dict[str, Any] | None = None
           ) -> tuple[Any, dict[str, Any], Any] | None:
    """The first of ``levels`` whose config (the default one with ``settings`` set) builds ``cls`` and runs a plain
    forward on generated inputs: ``(model, inputs, config)`` (the config as shrunk, before the build), with
    ``res["level"]`` and ``res["widths"]``; or None, with ``res["reason"]``. ``res["attempts"]`` says what failed
    before."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    attempts = []
    try:
        uses_mrope = _uses_mrope(cls, CONFIG_MAPPING[model_type]())
    except Exception:
        uses_mrope = False
    found = None
    for level, widths in levels:
        tag = f"L{level}" + ("" if widths == TINY else f" {_widths_name(widths)}")
        try:
            cfg = shrink_config(CONFIG_MAPPING[model_type](**(settings or {})), level, uses_mrope, widths)
        except Exception as e:
            attempts.append(f"{tag} config: {runner.short(e, 200)}")
            continue
        shrunk = copy.deepcopy(cfg)
        try:
            model = _build(cls, cfg, level, max_params)
        except Exception as e:
            attempts.append(f"{tag} build: {runner.short(e, 200)}")
            if os.environ.get("ZOO_DEBUG"):
                traceback.print_exc()
            if isinstance(e, MemoryError):
                break
            continue
        errors: list[str] = []
        inputs = _forward_inputs(model, input_candidates(model, model.config), errors)
        if inputs is not None:
            res["level"], res["widths"] = level, _widths_name(widths)
            found = model, inputs, shrunk
            break
        attempts.append(f"{tag} forward: " + (errors[0] if errors else "no known input in forward signature"))
    res["attempts"] = attempts
    if found is None:
        res["reason"] = attempts[0] if attempts else "no attempt"
    return found


def _widths_name(widths: Widths) -> str:
    return "distinct" if widths == DISTINCT else "tiny"


def _count(res: dict[str, Any], model_type: str, class_name: str, max_params: int, eager_always: bool,
           invariants: bool) -> None:
    import transformers
    cls = getattr(transformers, class_name, None)
    if cls is None:
        res["reason"] = f"class {class_name} not importable (missing dependency?)"
        return
    probed = _probe(res, model_type, cls, max_params, LEVELS)
    if probed is None:
        return
    model, inputs, _ = probed
    res["params"] = sum(p.numel() for p in model.parameters())
    res["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
    # 1. flopscope, model as built, inference
    runner.profile_record(model, (), inputs, False, res, "fs")
    if invariants:
        runner.invariants_record(model, (), inputs, res)
    # 2. reference and 3. flopscope on the eager configuration
    res["eager_problems"] = _set_eager(model)
    with runner.eager_context():
        res["stage"] = "reference"
        try:
            res["ref"] = runner.reference(model, (), inputs)
        except Exception as e:
            res["ref"] = {"error": runner.short(e, 300)}
        if eager_always or res["fs"].get("macs") is None or res["fs"].get("macs") != res["ref"].get("macs"):
            runner.profile_record(model, (), inputs, True, res, "fs_eager")  # explains a difference
    res["status"] = classify(res)


def _build_head(cls: Any, kind: str, cfg: Any, level: int, max_params: int) -> Any:
    """A head class on the base model's config (a causal LM with ``is_decoder`` set, where the config has it), or
    on its text config where the head class takes that one (``Qwen3_5ForCausalLM``); the build error if neither
    builds."""
    error = ""
    for config in (cfg, cfg.get_text_config()):
        config = copy.deepcopy(config)
        if kind == "causal-lm" and hasattr(config, "is_decoder"):
            _set(config, "is_decoder", True)
        try:
            return _build(cls, config, level, max_params)
        except Exception as e:
            error = error or runner.short(e, 200)
    return error


def _with_eos(inputs: dict[str, Any], cfg: Any) -> list[dict[str, Any]]:
    """``inputs`` with the last token of ``input_ids`` the end-of-sequence token (the sequence classifiers of
    encoder-decoders pool at it and refuse inputs without one), if the config names one."""
    eos = next((v for c in _sub_configs(cfg) if _is_int(v := vars(c).get("eos_token_id"))), None)
    if eos is None or "input_ids" not in inputs:
        return []
    ids = inputs["input_ids"].clone()
    ids[..., -1] = eos
    return [{**inputs, "input_ids": ids}]


AS_RELEASED = {
    "deberta": {"relative_attention": True, "pos_att_type": ["c2p", "p2c"], "max_relative_positions": -1,
                "position_biased_input": False},
    "deberta-v2": {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "max_relative_positions": -1,
                   "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                   "position_biased_input": False},
}
"""Config settings of the released checkpoints where the default config leaves a feature off that changes the
roles (``--roles``): DeBERTa's disentangled relative attention (deberta-base, deberta-v3-base's config.json)."""


HEAD_MAPPINGS = (("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
                 ("seq-cls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
                 ("image-cls", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"))
"""The head classes the roles yardstick checks beside the base model: ``(kind, auto mapping of transformers)``."""


def head_classes(model_type: str) -> list[tuple[str, str]]:
    """``(kind, class name)`` of every head class the auto mappings give ``model_type`` (all of a tuple's)."""
    from transformers.models.auto import modeling_auto
    out = []
    for kind, mapping in HEAD_MAPPINGS:
        names = getattr(modeling_auto, mapping, {}).get(model_type, ())
        out += [(kind, n) for n in ((names,) if isinstance(names, str) else names)]
    return out


def run_roles(model_type: str, class_name: str, timeout: int, max_params: int) -> dict[str, Any]:
    """The roles yardstick of one architecture (``--roles``): its base class and each head class on the first
    config that builds and runs, the widths that do not coincide (:data:`DISTINCT`) first; per class,
    ``zoo_roles.balance_record``, in ``res["roles"]["runs"]`` (a class that does not build or run: its error)."""
    res: dict[str, Any] = {"arch": model_type, "class": class_name, "status": "skip"}
    with runner.guarded(res, timeout, lambda r: f"over {timeout} s (stage reached: {r.get('stage', 'build/probe')})"):
        _roles(res, model_type, class_name, max_params)
    return res


def _roles(res: dict[str, Any], model_type: str, class_name: str, max_params: int) -> None:
    import transformers
    cls = getattr(transformers, class_name, None)
    if cls is None:
        res["reason"] = f"class {class_name} not importable (missing dependency?)"
        return
    res["stage"] = "probe"
    res["settings"] = AS_RELEASED.get(model_type, {})
    probed = _probe(res, model_type, cls, max_params, ROLE_LEVELS, res["settings"])
    if probed is None:
        return
    model, inputs, cfg = probed
    res["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
    res["roles"] = {"runs": []}
    runs = res["roles"]["runs"]
    res["stage"] = "roles: base"
    runs.append(zoo_roles.balance_record(model, (), inputs, zoo_roles.BASE))
    res["status"] = "checked" if "imbalances" in runs[0] else "error"
    del model
    for kind, name in head_classes(model_type):
        res["stage"] = f"roles: {name}"
        head_cls = getattr(transformers, name, None)
        if head_cls is None:
            runs.append({"kind": kind, "class": name, "error": "not importable (missing dependency?)"})
            continue
        head = _build_head(head_cls, kind, cfg, res["level"], max_params)
        if isinstance(head, str):
            runs.append({"kind": kind, "class": name, "error": f"build: {head}"})
            continue
        errors: list[str] = []
        head_inputs = _forward_inputs(head, [inputs, *_with_eos(inputs, head.config),
                                             *input_candidates(head, head.config)], errors)
        if head_inputs is None:
            runs.append({"kind": kind, "class": name, "error": f"forward: {errors[0] if errors else 'no input'}"})
            continue
        runs.append(zoo_roles.balance_record(head, (), head_inputs, kind))


def classify(res: dict[str, Any]) -> str:
    fs, ref = res.get("fs", {}), res.get("ref", {})
    if "error" in fs:
        return "error"
    if "error" in ref:
        return "ref-error"
    return "exact" if fs["macs"] == ref["macs"] else "mismatch"


def _warm_up(timeout: int, max_params: int) -> None:
    """One small architecture through every step, in the sweep's parent: the imports and first-call costs
    that every architecture shares are paid once."""
    with contextlib.suppress(Exception):
        import transformers
        transformers.logging.set_verbosity_error()
    run_arch("bert", "BertModel", timeout, max_params)


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def architectures() -> list[tuple[str, str]]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    out = []
    for model_type, names in MODEL_MAPPING_NAMES.items():
        if model_type not in CONFIG_MAPPING_NAMES:
            continue
        name = names[0] if isinstance(names, (list, tuple)) else names
        out.append((model_type, name))
    return out


def _progress(res: dict[str, Any]) -> str:
    return (f"{res['arch']:<40} {res['status']:<9} {res.get('seconds', 0):6.1f}s"
            f"  {res.get('reason', '') if res['status'] in ('skip', 'timeout', 'crash') else ''}")[:188]


def sweep(archs: list[tuple[str, str]], jobs: int, timeout: int, max_params: int,
          progress: bool = True, eager_always: bool = False, invariants: bool = True) -> list[dict[str, Any]]:
    return runner.sweep(archs, jobs, functools.partial(run_arch, timeout=timeout, max_params=max_params,
                                                       eager_always=eager_always, invariants=invariants),
                            timeout, ("arch", "class"), _progress if progress else None,
                            functools.partial(_warm_up, timeout, max_params))


def _roles_progress(res: dict[str, Any]) -> str:
    runs = res.get("roles", {}).get("runs", [])
    found = sum(len(run.get("imbalances", [])) for run in runs)
    ran = sum("imbalances" in run for run in runs)
    what = f"{ran}/{len(runs)} classes, {found} imbalances" if runs else res.get("reason", "")
    return f"{res['arch']:<40} {res['status']:<9} {res.get('seconds', 0):6.1f}s  {what}"[:188]


def sweep_roles(archs: list[tuple[str, str]], jobs: int, timeout: int, max_params: int,
                progress: bool = True) -> list[dict[str, Any]]:
    return runner.sweep(archs, jobs, functools.partial(run_roles, timeout=timeout, max_params=max_params),
                        timeout, ("arch", "class"), _roles_progress if progress else None,
                        functools.partial(run_roles, "bert", "BertModel", timeout, max_params))


# --------------------------------------------------------------------------------------------------
# grouping and report
# --------------------------------------------------------------------------------------------------
SECTIONS = (("Unsupported ops (architectures hitting each)", "unsupported"),
            ("Fake-mode fallbacks to real mode", "fallbacks"), ("flopscope errors", "errors"),
            ("Skipped / timed out / crashed", "skips"))
PRINTED_SECTIONS = (("unsupported ops", "unsupported"), ("fake-mode fallback reasons", "fallbacks"),
                    ("flopscope errors", "errors"), ("skip reasons", "skips"))


# the architectures issue 13 names, shown with all their roles: token mixing that is not softmax attention
MIXING_VARIANTS = (("Fourier transform (token_mixing)", ("fnet", "wavtokenizer", "autoformer", "neucodec")),
                   ("attention without a softmax op", ("reformer", "yoso", "rwkv", "mobilevitv2", "swiftformer")))


def above_only_by_blind_ops(r: dict[str, Any]) -> dict[str, int] | None:
    """For a mismatch: ``{op: MACs}`` when flopscope is above the reference only by ops the reference cannot
    count (``runner.reference_blind`` on fs-eager, and the totals differ by exactly those MACs); else None."""
    fs, fe, ref = r.get("fs", {}), r.get("fs_eager", {}), r.get("ref", {})
    if r["status"] != "mismatch" or "macs" not in fe:
        return None
    blind = runner.reference_blind(fe, ref)
    return blind if blind is not None and fs["macs"] - ref["macs"] == sum(blind.values()) else None


def mixing_roles(fs: dict[str, Any]) -> str:
    """The attention-core and token-mixing roles of a count with their MACs (``Role.attention_core``, the
    mixing group)."""
    from flopscope import Role
    from flopscope.role import RoleGroup

    def shown(role: str) -> bool:
        try:
            return Role(role).attention_core or Role(role).group is RoleGroup.MIXING
        except ValueError:
            return False
    return "; ".join(f"{k} {v:,}" for k, v in fs.get("by_role", {}).items() if v and shown(k))


def _all_roles(fs: dict[str, Any]) -> str:
    return "; ".join(f"{k} {v:,}" for k, v in fs.get("by_role", {}).items() if v)


def _summary_lines(results: list[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    st = s["status"]
    counted = st.get("exact", 0) + st.get("mismatch", 0)
    blind = {r["arch"]: above_only_by_blind_ops(r) for r in results if above_only_by_blind_ops(r)}
    other = [r["arch"] for r in results if r["status"] == "mismatch" and r["arch"] not in blind]
    ops: dict[str, list[str]] = {}
    for arch, d in blind.items():
        for op in d:
            ops.setdefault(op, []).append(arch)
    lines = [f"Counted by both: {counted}. **Equal to the reference, or above it only by ops the reference cannot "
             f"count: {st.get('exact', 0) + len(blind)} of {counted}** ({st.get('exact', 0)} equal; {len(blind)} "
             "above only by ops `FlopCounterMode` has no formula for and counts as 0"
             + (": " + "; ".join(f"{op} in {', '.join(a)}" for op, a in sorted(ops.items())) if ops else "") + "). "
             f"Other mismatches: {len(other)}" + (f" ({', '.join(other)})" if other else "") + ".", "",
             f"fs-eager ≠ reference (formula differences): {len(s['formula_mismatch'])}; "
             f"flopscope ≠ fs-eager (fused-kernel handling): {len(s['fused_mismatch'])}; "
             f"`sum(by_role()) == total()` fails for {len(s['roles_bad'])}"
             + (f" ({', '.join(s['roles_bad'])})" if s["roles_bad"] else "") + ".", ""]
    return lines


def _mismatch_lines(results: list[dict[str, Any]]) -> list[str]:
    mism = [r for r in results if r["status"] == "mismatch"]
    lines = ["## Mismatches", ""]
    if not mism:
        return [*lines, "(none)", ""]
    lines += ["| architecture | flopscope MACs | reference MACs | ratio | difference | fs-eager vs reference (by op) | "
              "flopscope vs fs-eager (by op) |", "|---|---|---|---|---|---|---|"]
    for r in mism:
        fs, fe, ref = r.get("fs", {}), r.get("fs_eager", {}), r.get("ref", {})
        kind = "above only by ops the reference cannot count" if above_only_by_blind_ops(r) else "**differs**"
        fused = runner.by_op_diff(fs, fe) if fs.get("macs") != fe.get("macs") else "equal total"
        lines.append(f"| {r['arch']} | {runner.fmt(fs.get('macs'))} | {runner.fmt(ref.get('macs'))} | "
                     f"{runner.ratio(r)} | {kind} | {runner.cell(runner.by_op_diff(fe, ref) or 'equal')} | "
                     f"{runner.cell(fused)} |")
    return [*lines, ""]


def _variant_lines(results: list[dict[str, Any]]) -> list[str]:
    by_arch = {r["arch"]: r for r in results}
    lines = ["## Token mixing that is not softmax attention: roles", "",
             "| architecture | mixing | status | flopscope MACs | reference MACs | roles (MACs) |",
             "|---|---|---|---|---|---|"]
    for kind, archs in MIXING_VARIANTS:
        for a in archs:
            r = by_arch.get(a)
            if r is None:
                continue
            fs, ref = r.get("fs", {}), r.get("ref", {})
            roles = _all_roles(fs) or r.get("reason", "–")
            lines.append(f"| {a} | {kind} | {r['status']} | {runner.fmt(fs.get('macs'))} | "
                         f"{runner.fmt(ref.get('macs'))} | {runner.cell(roles)} |")
    return [*lines, ""]


def write_report(results: list[dict[str, Any]], path: Path, elapsed: float, args: argparse.Namespace) -> None:
    s = runner.summarize(results, "arch")
    lines = ["# flopscope model zoo sweep", "",
             f"{len(results)} base architectures of transformers "
             f"{__import__('transformers').__version__}, torch {__import__('torch').__version__}; "
             f"{args.jobs} job(s), {elapsed / 60:.1f} min. Tiny configs (hidden {HIDDEN}, {LAYERS} layers, "
             f"{HEADS} heads, intermediate {INTER}, vocab {VOCAB}, {TOKENS} tokens, "
             f"images {IMAGE}x{IMAGE}, batch 1).", "",
             "- **flopscope**: `flopscope.profile(model, mode='auto')` under `no_grad`, model as built (SDPA, "
             "grouped-mm experts, oneDNN on).",
             "- **reference**: `FlopCounterMode` total // 2 with eager attention, eager experts, SDPA math kernel, "
             "oneDNN off, grad on.",
             "- **fs-eager**: flopscope on that same reference configuration"
             f"{' (every architecture)' if args.eager_always else ' (only where flopscope and the reference differ)'}.",
             "- **level**: 0 = fully shrunk config, 1 = only depth/experts/vocab shrunk, 2 = default config.", "",
             "## Summary", "", "| status | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(s["status"].items(), key=lambda kv: -kv[1])]
    lines += ["", *_summary_lines(results, s)]
    lines += runner.group_sections(s, SECTIONS)
    lines += runner.invariant_lines(results, "arch")
    lines += _mismatch_lines(results) + _variant_lines(results)
    lines += ["## Results", "",
              "| architecture | status | level | flopscope MACs | reference MACs | ratio | fs-eager MACs | "
              "attention core / token mixing (MACs by role) | real-mode fallback (reason) | unsupported ops | notes |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fs, fe, ref = r.get("fs", {}), r.get("fs_eager", {}), r.get("ref", {})
        fb = []
        for tag, p in (("", fs), ("eager: ", fe)):
            if p.get("fallback"):
                fb.append(tag + runner.fallback_key(p["fallback"], normalize=False))
        uns = sorted(set(fs.get("unsupported", {})) | set(fe.get("unsupported", {})))
        notes = []
        if r["status"] in ("skip", "timeout", "crash"):
            notes.append(r.get("reason", ""))
        for tag, p in (("flopscope", fs), ("fs-eager", fe)):
            if p.get("error"):
                notes.append(f"{tag}: {p['error']}")
        if ref.get("error"):
            notes.append(f"reference: {ref['error']}")
        if "macs" in fe and "macs" in ref and fe["macs"] != ref["macs"]:
            notes.append("fs-eager vs ref: " + runner.by_op_diff(fe, ref))
        if "macs" in fs and "macs" in fe and fs["macs"] != fe["macs"]:
            notes.append("flopscope vs fs-eager: " + runner.by_op_diff(fs, fe))
        lines.append(f"| {r['arch']} | {r['status']} | {r.get('level', '–')} | {runner.fmt(fs.get('macs'))} | "
                     f"{runner.fmt(ref.get('macs'))} | {runner.ratio(r)} | {runner.fmt(fe.get('macs'))} | "
                     f"{runner.cell(mixing_roles(fs))} | {runner.cell('; '.join(fb)) or 'no'} | "
                     f"{runner.cell(', '.join(uns))} | {runner.cell(' / '.join(notes))} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def write_roles_report(results: list[dict[str, Any]], path: Path, elapsed: float, args: argparse.Namespace) -> None:
    """The roles yardstick's report (``--roles``): ``zoo_roles.report_lines`` and each architecture's runs."""
    checked = [r for r in results if r.get("roles")]
    distinct = sum(r.get("widths") == "distinct" for r in checked)
    lines = ["# flopscope roles yardstick: the roles that must balance, over the Hugging Face zoo", "",
             f"{len(results)} base architectures of transformers {__import__('transformers').__version__}, torch "
             f"{__import__('torch').__version__}; {args.jobs} job(s), {elapsed / 60:.1f} min. Per architecture, the "
             "base class and its head classes (the auto mappings of `*ForCausalLM`, `*ForSequenceClassification`, "
             "`*ForImageClassification`), profiled (`mode='auto'`, `no_grad`) and checked with "
             "`role_balance(prof, head_paths(prof))`: per layer (an item of a module list) "
             "`ffn_up == ffn_down`, `ffn_gate` 0 or `ffn_up`, q/out = k/v = scores/weighted-sum, projections with an "
             "attention core; nothing of attention or FFN in a head.", "",
             f"Configs whose widths do not coincide (hidden {HIDDEN}, {HEADS} heads, every head-width key "
             f"{DISTINCT.head_dim}, FFN width {DISTINCT.inter}, expert FFN width {DISTINCT.expert_inter}, {LAYERS} "
             f"layers, vocab {VOCAB}, {TOKENS} tokens, images {IMAGE}x{IMAGE}, batch 1) ran for {distinct} of "
             f"{len(checked)} checked architectures; the others ran the sweep's tiny config (head_dim · heads = "
             f"hidden, experts {TINY.expert_inter} wide) or a less shrunk one (level 1: depth, experts and "
             "vocabulary only; 2: the default config), the first that builds and runs. Exceptions: "
             "`benchmarks/zoo_roles.py`, `EXCEPTIONS` (each with its reason, read in the model's code).", ""]
    lines += zoo_roles.report_lines(results, "arch", runner.cell)
    s = runner.summarize(results, "arch")
    lines += ["## Not checked", "", "```"]
    lines += runner.group_lines(s["skips"]) or ["(none)"]
    lines += ["```", "", "## Runs", "", "| architecture | status | config | class: imbalances (or error) |",
              "|---|---|---|---|"]
    for r in results:
        runs = r.get("roles", {}).get("runs", [])
        config = f"L{r['level']} {r.get('widths', '')}" if "level" in r and runs else "–"
        text = "; ".join(f"{run['class']}: " + (str(len(run["imbalances"])) if "imbalances" in run
                                                 else run.get("error", "?")) for run in runs)
        lines.append(f"| {r['arch']} | {r['status']} | {config} | {runner.cell(text or r.get('reason', ''))} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def print_roles_summary(results: list[dict[str, Any]], elapsed: float) -> None:
    s = runner.summarize(results, "arch")
    print()
    print(runner.status_line(results, s, "architectures", elapsed))
    print("\n".join(zoo_roles.share_lines(zoo_roles.summary(results, "arch"))).replace("**", ""))


def print_summary(results: list[dict[str, Any]], elapsed: float) -> None:
    s = runner.summarize(results, "arch")
    st = s["status"]
    print()
    print(runner.status_line(results, s, "architectures", elapsed))
    print(f"exact {st.get('exact', 0)}, mismatched {st.get('mismatch', 0)}, errored {st.get('error', 0)} "
          f"(reference errored {st.get('ref-error', 0)}; skipped {st.get('skip', 0)}, "
          f"timeout {st.get('timeout', 0)}, crash {st.get('crash', 0)})")
    blind = [r["arch"] for r in results if above_only_by_blind_ops(r)]
    print(f"mismatches above the reference only by ops it cannot count: {len(blind)} {blind}")
    print(f"fs-eager != reference: {len(s['formula_mismatch'])}; flopscope != fs-eager: {len(s['fused_mismatch'])}")
    runner.print_groups(s, PRINTED_SECTIONS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated model types (e.g. bert,gpt2,whisper)")
    runner.add_common_arguments(ap, str(Path(__file__).with_name("zoo_report.md")), 60, "architecture")
    ap.add_argument("--max-params", type=float, default=150e6,
                    help="skip configs that are not shrunk enough and have more parameters (default 150M)")
    ap.add_argument("--eager-always", action="store_true",
                    help="run fs-eager for every architecture, not only where flopscope and the reference differ")
    ap.add_argument("--no-invariants", action="store_true", help="skip the invariants (a third of the time)")
    ap.add_argument("--roles", action="store_true",
                    help="the roles yardstick only (issue 47): role_balance on each base class "
                         "and its head classes, on configs whose widths do not coincide; no reference, no invariants "
                         "(report default: benchmarks/zoo_roles_report.md)")
    runner.add_against_argument(ap)
    args = ap.parse_args(argv)

    archs = runner.only(architectures(), args.only, "model types")
    t0 = time.time()
    if args.roles:
        if args.report == ap.get_default("report"):
            args.report = str(Path(__file__).with_name("zoo_roles_report.md"))
        results = sweep_roles(archs, max(1, args.jobs), args.timeout, int(args.max_params), progress=not args.quiet)
        elapsed = time.time() - t0
        write_roles_report(results, Path(args.report), elapsed, args)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        print_roles_summary(results, elapsed)
        print(f"\nreport: {args.report}")
        return 0
    results = sweep(archs, max(1, args.jobs), args.timeout, int(args.max_params), progress=not args.quiet,
                    eager_always=args.eager_always, invariants=not args.no_invariants)
    elapsed = time.time() - t0
    runner.compare_runs(results, args.against, "arch")
    write_report(results, Path(args.report), elapsed, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print_summary(results, elapsed)
    print(f"\nreport: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
