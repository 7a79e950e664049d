"""Sweep every model class of diffusers and compare flopscope's counts across modes and with a reference.

For each class exported by ``diffusers`` that subclasses ``diffusers.models.modeling_utils.ModelMixin``
(transformers, UNets, VAEs and other autoencoders, ControlNets, adapters), the script

1. builds a tiny instance from constructor arguments (nothing is ever downloaded: ``HF_HUB_OFFLINE=1``): the
   constructor's defaults, shrunk by generic rules on the argument names (widths such as ``*_dim``,
   ``*_channels``, ``hidden_size`` above 64 to 32, FFN widths to 64, heads to 2 of width 16, layer counts to 2
   and blocks per stage to 1, channel tuples such as ``block_out_channels`` scaled so that the first stage has 32
   channels (the ratios between stages kept, at most 128), group norms to 8 groups, sample sizes to 16,
   vocabularies to 512) and by the constraints diffusers checks (RoPE axes and rotary widths rescaled to the
   head width, lists of layer indices cut to the layers kept, ratios such as
   ``projection_class_embeddings_input_dim / addition_time_embed_dim`` kept, ``None`` defaults a class cannot be
   built with filled, ``Multi*`` wrappers around two tiny models of the class they wrap). ``OVERRIDES`` holds,
   one line per class, what a generic rule cannot know (with the reason). If the tiny model cannot be built or
   run, level 1 retries with only depths, sizes and vocabularies shrunk. A model above ``--max-params`` (50M)
   at the level it builds is skipped. Built on CPU after ``torch.manual_seed(0)``, in eval mode.
2. builds inputs generically from the forward signature and the config: the latent (``hidden_states``,
   ``sample``, ``x``, ...) as an image ``[1, C, 16, 16]``, a video ``[1, C, F, 16, 16]``, ``[1, F, C, 16, 16]``
   or channels-last, packed tokens ``[1, 64, C]`` (with ``img_ids`` / ``txt_ids`` for Flux-like models), video
   tokens with ``num_frames`` / ``height`` / ``width``, or audio ``[1, C, T]`` / ``[1, T, C]`` (C from the config,
   else the first layer's input width); ``timestep`` (scalar, or one per frame); ``encoder_hidden_states`` of 8
   tokens (or the length the config's positional tables need) of the cross / joint attention width;
   ``pooled_projections``; masks (float or bool); ``class_labels``; ``added_cond_kwargs`` for SDXL-style UNets;
   ``controlnet_cond`` (latent-shaped or an 8x image); ... (batch 1). Autoencoders get an image
   ``[1, C, 32, 32]`` (or a short video / audio clip) and run their ``forward`` (encode + decode). Candidates are
   tried in order (the config's layouts first, with the optional arguments the model most likely needs, then
   none, then all it has), at most ``MAX_TRIES`` / ``PROBE_SECONDS``; the first with which a plain CPU forward
   under ``torch.no_grad()`` runs is kept; a class with none is skipped with the most common error.
3. counts, all under ``torch.no_grad()`` on the same weights and inputs:

   - ``real``: ``flopscope.profile(model, mode="real")``; ``fake``: ``mode="fake"``; ``meta``: the same class
     built under ``with torch.device("meta")`` from the same constructor arguments, inputs on meta,
     ``mode="fake"``. For each: ``total()``, ``by_role()`` (and whether it sums to the total), ``unsupported()``;
   - ``reference``: ``torch.utils.flop_counter.FlopCounterMode`` on a real forward with SDPA forced to the math
     kernel and oneDNN off (``zoo_runner.eager_context``, ``zoo_runner.reference``): ``get_total_flops() // 2``;
   - ``reconcile``: ``prof.reconcile()`` of the fake profile: rows, rows exact, rows explained (not exact, with a
     reason), rows unexplained (``rec.unexplained()``).

   Status: ``exact`` (fake total == reference, real == fake == meta totals, roles equal across the three
   modes), ``mismatch`` (which comparison failed), ``error`` (where), ``skip`` (why), ``timeout``, ``crash``.

Each class runs in its own process, forked from a warmed-up parent, under ``signal.alarm(--timeout)``
(``zoo_runner.sweep``, shared with ``benchmarks/zoo.py`` and ``benchmarks/timm_zoo.py``).

Usage::

    python benchmarks/diffusers_zoo.py [--only Class1,Class2] [--jobs N] [--report PATH] [--json PATH]
                                       [--timeout S] [--probe]
    python benchmarks/diffusers_zoo.py --roles [--only ...]   # the roles yardstick only (issue 47)

Writes a markdown report (default ``benchmarks/diffusers_zoo_report.md``) and prints a summary; ``--probe`` only
builds each class and finds its inputs (no counting, no report).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the flopscope checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_runner
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import zoo_roles  # after the paths are set
import zoo_runner as runner

WIDTH, FFN, HEADS, HEAD_DIM, LAYERS = 32, 64, 2, 16, 2  # tiny transformer: 2 heads of 16 = 32 wide
UNET_HEAD_DIM = 8  # a UNet's attention_head_dim (often its head count): divides its 32 / 64 channels
ROLE_HEAD_DIM = 24  # --roles: 2 heads of 24 = 48, not the 32 of the other widths (a role read as another one shows)
CHANNELS = 32  # a channel tuple's first stage (the others keep their ratio to it, up to 4 x)
GROUPS = 8  # group norms
LATENT, IMAGE, TEXT, FRAMES, VOCAB = 16, 32, 8, (5, 4, 2, 9, 1), 512
MAX_TRIES, PROBE_SECONDS = 300, 20  # forward candidates tried per level, and for at most this long

# --------------------------------------------------------------------------------------------------
# per-class overrides: constructor arguments (level 0) a generic rule cannot know, one line per class, with why
# --------------------------------------------------------------------------------------------------
OVERRIDES: dict[str, tuple[dict[str, Any], str]] = {
    "LatteTransformer3DModel": ({"caption_channels": WIDTH}, "the default caption_channels=None cannot be built"),
    "ControlNetUnionModel": ({"addition_time_embed_dim": 8}, "the default addition_time_embed_dim=None cannot be "
                                                              "built"),
    "LongCatAudioDiTVae": ({"latent_dim": 16}, "encoder_latent_dim (32) must be 2 x latent_dim (mean, log-variance)"),
    "EasyAnimateTransformer3DModel": ({"out_channels": 8}, "the default out_channels=None cannot be built"),
    "UniDiffuserModel": ({"sample_size": LATENT, "patch_size": 2, "in_channels": 4, "out_channels": 4},
                         "patched latents: the default sample_size=None cannot be built"),
    "AutoencoderKLHunyuanImage": ({"in_channels": 3, "out_channels": 3, "latent_channels": 16, "layers_per_block": 1,
                                   "block_out_channels": (32, 64, 64, 64), "spatial_compression_ratio": 8,
                                   "sample_size": IMAGE}, "no defaults (required arguments)"),
    "StableAudioProjectionModel": ({"min_value": 0, "max_value": 512}, "required arguments without defaults"),
    "UniDiffuserTextDecoder": ({"prefix_length": 4, "prefix_inner_dim": WIDTH}, "required prefix_length"),
    "PRXTransformer2DModel": ({"axes_dim": [8, 8]}, "the RoPE axes of a 16-wide head (the default None cannot be "
                                                    "built at that width)"),
    "ZImageControlNetModel": ({"control_layers_places": [0], "control_refiner_layers_places": [0],
                               "control_in_dim": 16}, "the default control layer places None cannot be built"),
    "AutoencoderKLKVAEAudio": ({"encoder_dim": 16}, "the encoder doubles its channels at each of 5 stages"),
    "AutoencoderKLMiniMaxH3Audio": ({"encoder_dim": 16, "decoder_dim": 256}, "the encoder doubles its channels at each "
                                    "of 5 stages, the decoder halves them at each of 7"),
    "HiDreamImageTransformer2DModel": ({"caption_channels": [WIDTH, WIDTH], "llama_layers": [0, 1, 2, 3],
                                        "axes_dims_rope": (4, 4)}, "no default caption_channels / llama_layers "
                                                                   "(one LLM layer per block)"),
    "AutoencoderOobleck": ({"decoder_input_channels": 16}, "the latent is half the encoder's width (mean, scale)"),
    "UVit2DModel": ({"micro_cond_embed_dim": 5 * WIDTH}, "5 micro-conditions of micro_cond_encode_dim each"),
    "Kandinsky6Transformer3DModel": ({"visual_cond": False}, "the pipeline concatenates the visual condition"),
    "UNet1DModel": ({"extra_in_channels": 64}, "the default Fourier time embedding adds 64 channels the first block "
                                               "must take"),
}
# classes that are not a model to run on their own
NOT_RUNNABLE: dict[str, str] = {
    "ControlNetXSAdapter": "an adapter with no forward of its own (UNetControlNetXSModel runs it)",
}
# Multi* classes: built around two tiny models of the class they wrap (their constructor's first argument)
WRAPS = {"MultiControlNetModel": ("ControlNetModel", 2), "FluxMultiControlNetModel": ("FluxControlNetModel", 2),
         "HunyuanDiT2DMultiControlNetModel": ("HunyuanDiT2DControlNetModel", 2),
         "QwenImageMultiControlNetModel": ("QwenImageControlNetModel", 1),  # "only supports a single controlnet"
         "SD3MultiControlNetModel": ("SD3ControlNetModel", 2), "MultiAdapter": ("T2IAdapter", 2)}


# --------------------------------------------------------------------------------------------------
# constructor arguments: defaults, shrunk generically
# --------------------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_int(x) for x in v)


def defaults(cls: Any) -> tuple[dict[str, Any], list[str]]:
    """The constructor's defaults and the names of its required arguments."""
    out, required = {}, []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty:
            required.append(p.name)
        else:
            out[p.name] = p.default
    return out, required


LAYER_NAME = re.compile(r"(layers|blocks|depths?|^n_layer)$")
LAYER_NAME_SKIP = re.compile(r"(ids|indices|idx|index|types|_dim|channels|skip|every|_ratio|temporal_|spatial_|"
                             r"_block_out|_scaling|_downsample|_upsample|compress|inject|scales?)")
PER_STAGE = re.compile(r"(per_block|res_blocks|per_stage|per_down_block|per_up_block|per_mid_block)$")
HEADS_NAME = re.compile(r"(heads|^n_head)$")
KV_HEADS_NAME = re.compile(r"(kv_heads|key_value_heads)$")
HEAD_DIM_NAME = re.compile(r"(head_dim|dim_head|dim_heads|head_channels)$")
FFN_NAME = re.compile(r"(intermediate_size|ffn_dim|ff_dim|mlp_dim|ff_inner_dim|ffn_hidden_size|mlp_hidden_dim|"
                      r"ff_hidden_dim|inner_dim_ff|^n_inner)$")
WIDTH_NAME = re.compile(r"(dim|dims|_channels|channels|hidden_size|hidden_size_t5|_width|features|^ch|_ch|_size_t5|"
                        r"embed_dim|model_dim|dim_t5|^n_embd|_channel)$")
WIDTH_SKIP = re.compile(r"(^sample_|patch|vocab|codebook|max_|kernel|window|pool_|_len|length|base_width|"
                        r"base_height|image_size|input_size|^num_(?!.*_channel$)|_groups|theta|head|freq_dim$|rope|axes)")
CHANNEL_TUPLE = re.compile(r"(out_channels|_channels|^channels|channels_list|hidden_dims|channel_list|_dims)$")
MULT_TUPLE = re.compile(r"(mult|mults|multiples|multipliers)$")
GROUPS_NAME = re.compile(r"(num_groups|resnet_groups|norm_groups|^groups)$")


def _default_head_dim(d: dict[str, Any]) -> int | None:
    for k in ("attention_head_dim", "head_dim", "dim_head"):
        if _is_int(d.get(k)):
            return d[k]
    width = next((d[k] for k in ("hidden_size", "dim", "inner_dim", "model_dim") if _is_int(d.get(k))), None)
    heads = next((d[k] for k in ("num_attention_heads", "num_heads", "n_heads") if _is_int(d.get(k))), None)
    return width // heads if width and heads else None


def _rescale_axes(v: Any, total: int) -> Any:
    """A RoPE axes split (sums to the head width) rescaled to sum to ``total``, each part even and >= 2."""
    old = sum(v)
    parts = [max(2, (x * total // old) // 2 * 2) if x else 0 for x in v]
    nonzero = [i for i, x in enumerate(parts) if x]
    while sum(parts) > total and nonzero:
        i = max(nonzero, key=lambda j: parts[j])
        parts[i] -= 2
    parts[nonzero[-1] if nonzero else -1] += total - sum(parts)
    return type(v)(parts)


def shrink(cls: Any, level: int, head_width: int = HEAD_DIM) -> dict[str, Any]:
    """Constructor arguments. Level 0: tiny everything (heads ``head_width`` wide); level 1: only depths, sizes and
    vocabularies."""
    d, required = defaults(cls)
    base = dict(d)
    head_dim = _default_head_dim(d)
    unet = _ints(d.get("block_out_channels")) or "UNet" in cls.__name__
    for k, v in list(d.items()):
        if v is None:
            _fill_none(d, k, cls.__name__)
            continue
        if isinstance(v, bool):
            continue
        # depth
        if _is_int(v) and v > 1 and LAYER_NAME.search(k) and not LAYER_NAME_SKIP.search(k):
            d[k] = min(v, 1 if PER_STAGE.search(k) or "refiner" in k else LAYERS)
        elif _ints(v) and "layers" in k and list(v) == sorted(set(v)) and v[0] == 0 and len(v) > 1:
            d[k] = type(v)(x for x in v if x < LAYERS)  # indices of layers
        elif _ints(v) and ((LAYER_NAME.search(k) and not LAYER_NAME_SKIP.search(k)) or PER_STAGE.search(k)):
            d[k] = type(v)(min(x, 1) for x in v)
        elif _is_int(v) and PER_STAGE.search(k):
            d[k] = min(v, 1)
        # sizes and vocabularies
        elif k in ("sample_size", "sample_height", "sample_width") and _is_int(v) and v > LATENT:
            d[k] = LATENT
        elif k == "sample_size" and _ints(v) and len(v) == 2:
            d[k] = type(v)([min(x, LATENT) for x in v])
        elif k in ("vocab_size", "codebook_size") and _is_int(v) and v > VOCAB:
            d[k] = VOCAB
        elif k.endswith("token_id") and _is_int(v) and v >= VOCAB:
            d[k] = VOCAB - 1  # a special token inside the shrunk vocabulary
        if level > 0 or d[k] is not v:
            continue
        # widths (level 0 only)
        if _is_int(v) and KV_HEADS_NAME.search(k):
            d[k] = min(v, HEADS)
        elif HEADS_NAME.search(k) and (_is_int(v) or _ints(v)):
            d[k] = HEADS if _is_int(v) else type(v)([HEADS] * len(v))
        elif k == "attention_head_dim" and unet and (_is_int(v) or _ints(v)):
            d[k] = UNET_HEAD_DIM if _is_int(v) else type(v)([UNET_HEAD_DIM] * len(v))
        elif HEAD_DIM_NAME.search(k) and (_is_int(v) or _ints(v)):
            d[k] = head_width if _is_int(v) else type(v)([head_width] * len(v))
        elif _is_int(v) and FFN_NAME.search(k):
            d[k] = min(v, FFN)
        elif _is_int(v) and v > 64 and WIDTH_NAME.search(k) and not WIDTH_SKIP.search(k):
            d[k] = WIDTH
        elif _ints(v) and CHANNEL_TUPLE.search(k) and not WIDTH_SKIP.search(k) and max(v) > 64:
            f = max(1, v[0] // CHANNELS)  # the first stage to 32 channels, the ratios between stages kept
            d[k] = type(v)(min(4 * CHANNELS, max(8, x // f // 8 * 8)) if x else 0 for x in v)  # at most 128
        elif _ints(v) and MULT_TUPLE.search(k):
            d[k] = type(v)(min(x, 2) for x in v)
        elif _is_int(v) and GROUPS_NAME.search(k) and v > GROUPS:
            d[k] = GROUPS
        elif _is_int(v) and ("rotary" in k or "rope" in k) and k.endswith("dim") and head_dim and v <= head_dim:
            d[k] = max(2, v * head_width // head_dim // 2 * 2)  # the rotated part of a head keeps its share
        elif _ints(v) and len(v) > 1 and ((head_dim and sum(v) == head_dim and ("axes" in k or "rope" in k))
                                          or (not head_dim and "axes_dim" in k)):
            d[k] = _rescale_axes(v, head_width)
    if level == 0:
        _keep_ratios(d, base)
    for k in required:  # widths without a default
        if WIDTH_NAME.search(k) or k.endswith("_dim"):
            d[k] = WIDTH
    if level == 0:
        d.update(OVERRIDES.get(cls.__name__, ({}, ""))[0])
    return d


def _fill_none(d: dict[str, Any], k: str, cls_name: str) -> None:
    """Arguments whose default ``None`` some classes cannot be built with."""
    if k == "in_channels":
        d[k] = 8  # a latent's channels (divides by the group norms' 8 groups)
    elif k == "patch_size" and d.get("sample_size", 0) is not None and not AUTOENCODER_HINT.search(cls_name):
        d[k] = 2  # patched latents (not Transformer2DModel's unpatched path, which has no sample_size)
    elif KV_HEADS_NAME.search(k):
        d[k] = HEADS


def _keep_ratios(d: dict[str, Any], base: dict[str, Any]) -> None:
    """Derived widths that diffusers checks against others: keep the default's ratio."""
    t, p = base.get("addition_time_embed_dim"), base.get("projection_class_embeddings_input_dim")
    if _is_int(t) and _is_int(p) and p % t == 0:
        d["addition_time_embed_dim"] = 8
        d["projection_class_embeddings_input_dim"] = 8 * (p // t)
    # a UNet's cross-attention width given per block
    if _ints(base.get("cross_attention_dim")):
        d["cross_attention_dim"] = type(base["cross_attention_dim"])([WIDTH] * len(base["cross_attention_dim"]))


# --------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------
LATENT_NAMES = ("hidden_states", "sample", "x", "latents", "z", "z_latent", "mel", "inputs_embeds", "xs",
                "controls_latents", "latent_image_embeds", "local_latents")
TIME_NAMES = ("timestep", "timesteps", "t", "timestep_r", "r_timestep", "timestep_ratio", "decoder_noise_time",
              "timestep_img", "timestep_text", "bb_ca_time", "local_latents_time", "audio_timestep")
CHANNEL_KEYS = ("in_channels", "io_channels", "in_visual_dim", "latent_channels", "in_dim", "input_channels",
                "num_channels",
                "audio_channels", "in_chans", "channels")
TEXT_KEYS = ("encoder_hid_dim", "joint_attention_dim", "text_embed_dim", "caption_channels", "text_dim",
             "cap_feat_dim", "context_in_dim", "in_text_dim", "text_hidden_dim", "text_encoder_dim",
             "encoder_hidden_size", "cross_attention_dim", "context_dim", "condition_dim")
TEXT_WIDTH = {"encoder_hidden_states_t5": ("cross_attention_dim_t5", "text_embed_2_dim", "caption_channels"),
              "hidden_states_1": ("text_encoder_1_dim",), "prompt_embeds": ("text_dim",),
              "encoder_hidden_states_2": ("text_embed_2_dim", "in_text_dim2"),
              "audio_encoder_hidden_states": ("audio_cross_attention_dim",), "cap_feats": ("cap_feat_dim",)}
TEXT_NAMES = ("encoder_hidden_states", "cap_feats", "prompt_embeds", "text_hidden_states", "clip_text",
              "hidden_states_1",
              "encoder_hidden_states_t5", "encoder_hidden_states_2", "audio_encoder_hidden_states", "text_bth",
              "encodings")
POOLED_NAMES = ("pooled_projections", "pooled_embeds", "pooled_text_emb", "clip_text_pooled", "global_hidden_states",
                "proj_embedding", "image_embeds", "image_embeddings")
POOLED_KEYS = ("pooled_projection_dim", "clip_img_dim", "text_embed_2_dim", "embedding_proj_dim", "in_text_dim2",
               "global_states_input_dim",
               "projection_dim", "clip_embed_dim", "embedding_dim", "c_clip_text_pooled")
OPTIONAL_WANTED = ("timestep", "timesteps", "t", *TEXT_NAMES[:1], "pooled_projections", "img_ids", "txt_ids")
VIDEO_HINT = re.compile(r"(3D|Video|Motion|Temporal|I2V|Animate|ChronoEdit|SkyReels|Latte|Allegro|Mochi|Wan|Cosmos|"
                        r"Magvit|Framepack|Helios|Sana(WM|Video)|LTX|Kandinsky5|Kandinsky6|JoyImage|MiniMaxH3)")
AUDIO_HINT = re.compile(r"(1D|Audio|Music|Oobleck|Vocoder|MMAudio|AceStep|LongCatAudio|StableAudio|T5Film)")
AUTOENCODER_HINT = re.compile(r"(Autoencoder|VAE|Vae|VQModel|Tokenizer$)")


def _first(cfg: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    for k in keys:
        v = cfg.get(k)
        if _is_int(v) and v > 0:
            return v
        if _ints(v) and k in ("cross_attention_dim",):
            return v[0]
    return default


def _size(cfg: dict[str, Any], autoencoder: bool) -> int:
    if autoencoder:
        return IMAGE
    s = cfg.get("sample_size")
    s = s[0] if _ints(s) else s
    return s if _is_int(s) and 4 <= s <= 64 else LATENT


def first_layer_width(model: Any) -> int | None:
    """The input width of the model's first convolution or linear layer (registration order)."""
    import torch
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            return m.in_features
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            return m.in_channels
    return None


def _layouts(cls_name: str, cfg: dict[str, Any], params: Any, first: int | None) -> list[dict[str, Any]]:
    """The latent's shapes to try, most likely first: ``kind`` and the tensor's shape; then the same with the
    first layer's input width as the channels, and plain feature vectors of that width."""
    auto = bool(AUTOENCODER_HINT.search(cls_name))
    c = _first(cfg, CHANNEL_KEYS, 3 if auto else 4)
    order = _layouts_for(cls_name, cfg, params, c, auto)
    for alt in dict.fromkeys(x for x in (first, 3, 1) if x and x != c):  # the first layout of each kind
        kinds: dict[str, dict[str, Any]] = {}
        for lay in _layouts_for(cls_name, cfg, params, alt, auto):
            kinds.setdefault(lay["kind"], {**lay, "alt": 1})
        order += list(kinds.values())
    if first:
        order += [{"kind": "features", "shape": (1, first), "C": first, "alt": 1},
                  {"kind": "features", "shape": (1, TEXT, first), "C": first, "alt": 1}]
    return order


def _frames(cfg: dict[str, Any]) -> tuple[int, ...]:
    """Frame counts to try: the one the config names (a temporal positional table), then FRAMES."""
    named = [cfg[k] for k in ("video_length", "num_frames", "sample_frames", "frames") if _is_int(cfg.get(k))
             and 1 < cfg[k] <= 16]
    return tuple(dict.fromkeys([*named, *FRAMES]))


def _layouts_for(cls_name: str, cfg: dict[str, Any], params: Any, c: int, auto: bool) -> list[dict[str, Any]]:
    s = _size(cfg, auto)
    n = (s // 2) ** 2
    frames_ = _frames(cfg)
    image = [{"kind": "image", "shape": (1, c, s, s), "S": s}]
    # adapters and autoencoders that downsample 16x and more
    large = [{"kind": "image", "shape": (1, c, 64, 64), "S": 64, "alt": 1}]
    video = [{"kind": "video", "shape": (1, c, f, s, s), "S": s, "F": f} for f in frames_]
    if auto:
        large += [{"kind": "video", "shape": (1, c, f, 64, 64), "S": 64, "F": f, "alt": 1} for f in (9, 17)]
    video_f = [{"kind": "video_fc", "shape": (1, f, c, s, s), "S": s, "F": f} for f in frames_[:3]]
    video_cl = [{"kind": "video_cl", "shape": (1, f, s, s, c), "S": s, "F": f} for f in (2, 1)]
    frames = [{"kind": "frames", "shape": (f, c, s, s), "S": s, "F": f} for f in (2, 1)
              ] if "num_frames" in params else []
    tokens = [{"kind": "tokens", "shape": (1, n, c), "S": s, "N": n}]
    if "height" in params and "width" in params:  # tokens of a video whose sizes are passed (LTX)
        tokens += [{"kind": "video_tokens", "shape": (1, f * s * s, c), "S": s, "F": f, "N": f * s * s}
                   for f in (2, 1)]
    t_len = 1
    for k in ("downsampling_ratios", "encoder_rates", "downsample_factors", "strides"):
        if _ints(cfg.get(k)):
            t_len = max(t_len, math.prod(cfg[k]))
    lengths = sorted({64, 2 * t_len if t_len > 1 else 256, 1024, 16 * t_len if t_len > 1 else 64})
    audio = [{"kind": "audio", "shape": (1, c, t), "T": t} for t in lengths]
    audio_t = [{"kind": "audio_tc", "shape": (1, t, c), "T": t} for t in lengths[:2]]
    if any(p in params for p in ("img_ids", "img_shapes")):
        order = tokens + image + video + audio_t
    elif AUDIO_HINT.search(cls_name):
        order = audio + audio_t + image + tokens
    elif VIDEO_HINT.search(cls_name) or any(k in cfg for k in ("patch_size_t", "temporal_compression_ratio")):
        order = frames + video + video_f + video_cl + image + tokens
    else:
        order = image + frames + video + video_f + tokens + audio + audio_t
    order += large
    for lay in order:
        lay["C"] = c
    return order


TEXT_LENGTH_KEYS = {"encoder_hidden_states_t5": ("text_len_t5",), "prompt_embeds": ("num_text_tokens",)}


def _text_length(cfg: dict[str, Any], name: str, lay: dict[str, Any], mode: int) -> int | None:
    """The length of the text argument ``name``: 8 (mode 0), the length the config names for it (mode 1; the
    positional tables of CogVideoX, HunyuanDiT's pooler), the audio's length (mode 2), None where the mode has
    none."""
    if mode == 0:
        return TEXT
    if mode == 1:
        keys = TEXT_LENGTH_KEYS.get(name, ("text_len", "max_text_seq_length", "text_seq_len", "max_sequence_length",
                                           "text_length", "num_embeddings"))
        return next((cfg[k] for k in keys if _is_int(cfg.get(k)) and TEXT < cfg[k] <= 512), TEXT)
    return lay.get("T")


def _controlnet_cond(lay: dict[str, Any], cfg: dict[str, Any], gen: Any) -> list[Any]:
    import torch
    cc = _first(cfg, ("conditioning_channels", "conditioning_in_channels"), 3)
    out = [torch.randn(*lay["shape"], generator=gen)]
    if lay["kind"] == "image":
        s = lay["S"]
        out.append(torch.randn(1, cc, 8 * s, 8 * s, generator=gen))
    if lay["kind"] == "video":
        s = lay["S"]
        out.append(torch.randn(1, cc, lay["F"], 8 * s, 8 * s, generator=gen))
    return out


def _added_cond_kwargs(cfg: dict[str, Any], lay: dict[str, Any], gen: Any) -> list[Any]:
    import torch
    kind = cfg.get("addition_embed_type")
    if kind == "text_time":
        t, p = cfg.get("addition_time_embed_dim"), cfg.get("projection_class_embeddings_input_dim")
        if _is_int(t) and _is_int(p):
            return [{"text_embeds": torch.randn(1, p - 6 * t, generator=gen), "time_ids": torch.ones(1, 6) * 64}]
    if kind in ("text", "text_image", "image", "image_hint"):
        w = _first(cfg, ("encoder_hid_dim", "cross_attention_dim"), WIDTH)
        d = {"image_embeds": torch.randn(1, w, generator=gen), "text_embeds": torch.randn(1, w, generator=gen)}
        if kind == "image_hint":
            d["hint"] = torch.randn(1, 3, 8 * lay.get("S", LATENT), 8 * lay.get("S", LATENT), generator=gen)
        return [d]
    if cfg.get("use_additional_conditions") or cfg.get("sample_size") == 128:
        s = 8 * lay.get("S", LATENT)
        return [{"resolution": torch.tensor([[s, s]], dtype=torch.float32),
                 "aspect_ratio": torch.tensor([[1.0]])}, {"resolution": None, "aspect_ratio": None}]
    return []


def _makers(cls_name: str, cfg: dict[str, Any], lay: dict[str, Any], gen: Any, multi: int,
            knobs: tuple[int, int, int]) -> dict[str, list[Any]]:
    """For each forward argument this module can make: the values to try. ``knobs`` choose what must agree
    across arguments: the timestep's form (scalar float, scalar int, one per frame), the text length (8, a
    length the config names, the audio's length) and the masks' dtype (float, bool)."""
    import torch
    time_mode, text_mode, mask_mode = knobs
    s, f = lay.get("S", LATENT), lay.get("F", 1)
    tw = _first(cfg, TEXT_KEYS, WIDTH)
    latent = torch.randn(*lay["shape"], generator=gen)
    m: dict[str, list[Any]] = {n: [latent] for n in LATENT_NAMES}
    m["image_latents"] = m["control_hidden_states"] = [torch.randn(*lay["shape"], generator=gen)]
    if lay["kind"] == "video" and _is_int(cfg.get("vace_in_channels")):
        m["control_hidden_states"] = [torch.randn(1, cfg["vace_in_channels"], *lay["shape"][2:], generator=gen)]
    time = [torch.tensor([500.0]), torch.tensor([500]),
            torch.full((1, f), 500.0) if lay["kind"] in ("video", "video_fc") else None][time_mode]
    if time is None:
        return {}
    for n in TIME_NAMES:
        m[n] = [time]
    m["seconds"] = [torch.tensor([3.0])]
    for n in TEXT_NAMES:
        length = _text_length(cfg, n, lay, text_mode)
        if length is None:
            return {}
        w = _first(cfg, TEXT_WIDTH.get(n, ()), tw)
        m[n] = [torch.randn(1, length, w, generator=gen)]
    pw = _first(cfg, POOLED_KEYS, tw)
    for n in POOLED_NAMES:
        m[n] = [torch.randn(1, pw, generator=gen), torch.randn(1, 1, pw, generator=gen)]
    dtype = (torch.float32, torch.bool)[mask_mode]
    for n, text in MASKS.items():
        m[n] = [torch.ones(1, m[text][0].shape[1], dtype=dtype)]
    n_axes = next((len(cfg[k]) for k in ("axes_dims_rope", "axes_dims", "rope_axes_dim") if _ints(cfg.get(k))), 3)
    if lay["kind"] == "tokens":
        side = math.isqrt(lay["N"])
        ids = torch.zeros(side, side, n_axes)
        ids[..., -2] = torch.arange(side)[:, None]
        ids[..., -1] = torch.arange(side)[None, :]
        m["img_ids"] = [ids.reshape(-1, n_axes), ids.reshape(1, -1, n_axes)]
        m["img_shapes"] = [[(1, side, side)], [[(1, side, side)]]]
    n_text = m["encoder_hidden_states"][0].shape[1]
    m["txt_ids"] = [torch.zeros(n_text, n_axes), torch.zeros(1, n_text, n_axes)]
    if cfg.get("guidance_embeds") or cfg.get("guidance_embed"):
        m["guidance"] = [torch.tensor([3.5])]
    if any(cfg.get(k) is not None for k in ("num_class_embeds", "class_embed_type")) or \
            (cfg.get("num_embeds_ada_norm") is not None and "DiT" in cls_name):
        m["class_labels"] = [torch.tensor([1])]
    if cfg.get("time_cond_proj_dim"):
        m["timestep_cond"] = [torch.randn(1, cfg["time_cond_proj_dim"], generator=gen)]
    added = _added_cond_kwargs(cfg, lay, gen)
    if added:
        m["added_cond_kwargs"] = added
    conds = _controlnet_cond(lay, cfg, gen)
    m["controlnet_cond"] = [[c] * multi for c in conds] if multi else conds
    m["conditioning_mask"] = [torch.ones(1, 1, *c.shape[2:]) for c in conds]
    m["conditioning_scale"] = [[1.0] * multi] if multi else [1.0]
    m["controlnet_mode"] = [[torch.tensor([0])] * multi, [None] * multi] if multi else [None]
    if multi:  # MultiAdapter: one input per adapter, stacked
        m["xs"] = [torch.randn(multi, *lay["shape"], generator=gen)]
    if cfg.get("num_control_type"):  # ControlNetUnion
        m["control_type"] = [torch.nn.functional.one_hot(torch.tensor([0]), cfg["num_control_type"]).float()]
        m["control_type_idx"] = [[0]]
        m["controlnet_cond"] = [[c] for c in conds]
    size = torch.tensor([[8.0 * s, 8.0 * s]])
    m["original_size"], m["target_size"], m["crop_coords"] = [size], [size.clone()], [torch.zeros(1, 2)]
    m["fps"] = [torch.tensor([8]), 8]
    m["image_meta_size"] = [torch.tensor([[8.0 * s, 8.0 * s, 8.0 * s, 8.0 * s, 0.0, 0.0]])]
    m["style"] = [torch.tensor([0])]
    if lay["kind"] == "frames":
        m["num_frames"] = [f]
    if lay["kind"] == "video_tokens":
        m["num_frames"], m["height"], m["width"] = [f], [s], [s]
    vocab = next((min(cfg[k], VOCAB) for k in ("vocab_size", "codebook_size") if _is_int(cfg.get(k))), VOCAB)
    for n in ("input_ids", "target_input_ids", "decoder_input_tokens"):
        m[n] = [torch.randint(0, vocab, (1, TEXT), generator=gen)]
    if lay["kind"] == "image":  # image tokens (UVit2D)
        m["input_ids"].append(torch.randint(0, vocab, (1, s, s), generator=gen))
    m["micro_conds"] = [torch.tensor([[8.0 * s, 8.0 * s, 0.0, 0.0, 6.0]])]  # size, crop, aesthetic score
    n_text = m["encoder_hidden_states"][0].shape[1]
    p = cfg["patch_size"] if _is_int(cfg.get("patch_size")) else 2
    n_img = lay.get("N") or (s // p) ** 2
    m["position_ids"] = [torch.zeros(n_text + n_img, 3, dtype=torch.long)]  # (text + image tokens, (t, h, w))
    m["img_mask"] = [torch.zeros(1, n_text, dtype=torch.bool)]  # no image slots in the text
    if lay["kind"] in ("image", "video"):
        m.setdefault("img_shapes", [[[(1, s // p, s // p)]], [(1, s // p, s // p)]])
    if _is_int(cfg.get("audio_in_channels")):  # audio tokens beside the video (LTX-2)
        m["audio_hidden_states"] = [torch.randn(1, TEXT, cfg["audio_in_channels"], generator=gen)]
        m["audio_num_frames"] = [TEXT]
    if _ints(cfg.get("llama_layers")):  # HiDream: one LLM layer's states per block
        m["encoder_hidden_states_llama3"] = [torch.randn(max(cfg["llama_layers"]) + 1, 1, n_text, tw, generator=gen)]
    if _is_int(cfg.get("prefix_length")):
        m["prefix_embeds"] = [torch.randn(1, cfg["prefix_length"], cfg.get("prefix_inner_dim") or WIDTH,
                                          generator=gen)]
    m["start_seconds"], m["end_seconds"] = [torch.tensor([0.0])], [torch.tensor([4.0])]
    m["text_lens"] = [torch.tensor([m["text_bth"][0].shape[1]])]
    m["context_latents"] = [torch.randn(*lay["shape"], generator=gen)]
    m["indices_latents"] = [torch.arange(f)[None]]
    m["scale"] = [2]
    if lay["kind"] == "video_cl":  # Kandinsky: RoPE positions of the patched video and of the text
        pt, ph, pw = cfg["patch_size"] if _ints(cfg.get("patch_size")) and len(cfg["patch_size"]) == 3 else (1, 2, 2)
        m["visual_rope_pos"] = [[torch.arange(f // pt), torch.arange(s // ph), torch.arange(s // pw)]]
        m["text_rope_pos"] = [torch.arange(m["encoder_hidden_states"][0].shape[1])]
    t, p = cfg.get("addition_time_embed_dim"), cfg.get("projection_class_embeddings_input_dim")
    if _is_int(t) and _is_int(p):
        m["added_time_ids"] = [torch.ones(1, p // t)]
    return m


# masks: the text argument whose length they take
MASKS = {"encoder_attention_mask": "encoder_hidden_states", "encoder_mask": "encoder_hidden_states",
         "text_embedding_mask": "encoder_hidden_states", "encoder_hidden_states_mask": "encoder_hidden_states",
         "text_attention_mask": "text_hidden_states", "text_embedding_mask_t5": "encoder_hidden_states_t5",
         "encoder_attention_mask_2": "encoder_hidden_states_2"}
KNOBS = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (2, 0, 0), (0, 2, 0), (1, 1, 0), (2, 1, 0), (0, 1, 1), (1, 0, 1)]


def input_candidates(model: Any, cls_name: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Candidate inputs (most likely first) and the required forward arguments no rule can make."""
    import itertools

    import torch
    cfg = dict(getattr(model, "config", None) or {})
    inner = next(iter(getattr(model, "nets", None) or getattr(model, "adapters", None) or []), None)
    if inner is not None:  # a Multi* wrapper: the wrapped model's config
        cfg = {**dict(getattr(inner, "config", None) or {}), **cfg}
    try:
        sig = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        sig = {}
    params = {n: p for n, p in sig.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    required = [n for n, p in params.items() if p.default is p.empty]
    multi = len(getattr(model, "nets", None) or getattr(model, "adapters", None) or []) if inner is not None else 0
    gen = torch.Generator().manual_seed(0)
    out, missing = [], []
    for lay in _layouts(cls_name, cfg, params, first_layer_width(model)):
        for knob_rank, knobs in enumerate(KNOBS):
            makers = _makers(cls_name, cfg, lay, gen, multi, knobs)
            if not makers:
                continue
            if required and required[0] not in makers and required[0] not in missing:  # the first: the latent
                makers[required[0]] = makers["hidden_states"]
            lacking = [n for n in required if n not in makers]
            if lacking:
                missing = lacking
                break
            wanted = [n for n in params if n in makers and (n in required or n in OPTIONAL_WANTED or n in ALWAYS
                                                            or n == next(iter(params), None))]
            bare = [n for n in params if n in makers and (n in required or n in OPTIONAL_WANTED[:3] or n in ALWAYS)]
            every = [n for n in params if n in makers and (n in required or n not in TIME_NAMES[3:])]
            for set_rank, chosen in enumerate((wanted, bare, every)):
                combos = itertools.islice(itertools.product(*(makers[n] for n in chosen)), 4)
                for combo_rank, combo in enumerate(combos):
                    rank = (min(knob_rank + combo_rank, 1), lay.get("alt", 0), set_rank, len(out))
                    out.append((rank, dict(zip(chosen, combo, strict=True))))
    # the config's layouts with each argument set, then the other layouts, then the other values
    return _interleave([c for _, c in sorted(out, key=lambda x: x[0])]), missing


# optional arguments passed whenever a maker has them (the config says the model needs them)
ALWAYS = ("guidance", "class_labels", "added_cond_kwargs", "num_frames", "timestep_cond", "conditioning_scale",
          "controlnet_mode")


def _interleave(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Candidates deduplicated by their shapes, in order."""
    seen, out = set(), []
    for c in cands:
        key = tuple((k, _shape_key(v)) for k, v in c.items())
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _shape_key(v: Any) -> Any:
    import torch
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), str(v.dtype))
    if isinstance(v, (list, tuple)):
        return tuple(_shape_key(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _shape_key(x)) for k, x in v.items())
    return repr(v)


def describe(inputs: dict[str, Any]) -> dict[str, Any]:
    """Shapes of the inputs, for the report."""
    import torch

    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return list(v.shape)
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        return v
    return {k: one(v) for k, v in inputs.items()}


# --------------------------------------------------------------------------------------------------
# one class (runs in its own process)
# --------------------------------------------------------------------------------------------------
def constructor(cls_name: str, level: int, head_width: int = HEAD_DIM) -> tuple[Any, dict[str, Any]]:
    """The class and its constructor arguments at ``level`` (a ``Multi*`` wrapper's list holds the arguments of
    the model it wraps, as ``("__wrapped__", class name, arguments)``)."""
    import diffusers
    cls = getattr(diffusers, cls_name)
    kwargs = shrink(cls, level, head_width)
    if cls_name in WRAPS:
        first = defaults(cls)[1][0]
        inner, count = WRAPS[cls_name]
        kwargs[first] = [("__wrapped__", inner, shrink(getattr(diffusers, inner), level, head_width))] * count
    return cls, kwargs


def instantiate(cls: Any, kwargs: dict[str, Any], device: str = "cpu") -> Any:
    """``cls(**kwargs)`` on ``device`` after ``torch.manual_seed(0)``, in eval mode."""
    import diffusers
    import torch
    torch.manual_seed(0)
    with torch.device(device):
        real = {}
        for k, v in kwargs.items():
            if isinstance(v, list) and v and isinstance(v[0], tuple) and v[0][:1] == ("__wrapped__",):
                real[k] = [getattr(diffusers, name)(**kw) for _, name, kw in v]
            else:
                real[k] = v
        model = cls(**real)
    return model.eval()


def changed(cls: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments that differ from the defaults (for the report)."""
    d, _ = defaults(cls)
    out = {}
    for k, v in kwargs.items():
        if k not in d or d[k] != v:
            out[k] = [f"{x[1]}(tiny)" for x in v] if isinstance(v, list) and v and isinstance(v[0], tuple) \
                and v[0][:1] == ("__wrapped__",) else v
    return out


def _to_meta(x: Any) -> Any:
    import torch
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, list):
        return [_to_meta(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_meta(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    return x


def _params_on_meta(cls: Any, kwargs: dict[str, Any]) -> int:
    meta = instantiate(cls, kwargs, "meta")
    return sum(p.numel() for p in meta.parameters())


LEVELS = ((0, HEAD_DIM), (1, HEAD_DIM))
"""What the sweep tries, in order, as ``(shrink level, head width)``."""
ROLE_LEVELS = ((0, ROLE_HEAD_DIM), *LEVELS)
"""The same for ``--roles``: heads whose total width is not the model's first."""


def probe(res: dict[str, Any], cls_name: str, max_params: int,
          levels: tuple[tuple[int, int], ...] = LEVELS) -> tuple[Any, Any, dict[str, Any]] | None:
    """Build the class (each of ``levels`` in turn) and find inputs it runs on: (class, constructor arguments,
    inputs) or None with ``res["reason"]`` set."""
    import torch
    if cls_name in NOT_RUNNABLE:
        res["reason"] = NOT_RUNNABLE[cls_name]
        return None
    attempts = []
    for level, head_width in levels:
        res["stage"] = f"L{level} build"
        try:
            cls, kwargs = constructor(cls_name, level, head_width)
            n = _params_on_meta(cls, kwargs)
        except Exception as e:
            attempts.append(f"L{level} build: {runner.short(e, 240)}")
            if os.environ.get("ZOO_DEBUG"):
                traceback.print_exc()
            continue
        if n > max_params:
            attempts.append(f"L{level}: {n / 1e6:.0f}M parameters (limit {max_params / 1e6:.0f}M)")
            continue
        try:
            model = instantiate(cls, kwargs)
        except Exception as e:
            attempts.append(f"L{level} build: {runner.short(e, 240)}")
            continue
        res["stage"] = f"L{level} inputs"
        cands, missing = input_candidates(model, cls_name)
        if not cands:
            attempts.append(f"L{level} inputs: no generic value for required forward argument(s) {', '.join(missing)}")
            break  # the forward signature does not change with the level or the widths
        errors = []
        t0 = time.time()
        for cand in cands[:MAX_TRIES]:
            if time.time() - t0 > PROBE_SECONDS:
                errors.append(f"(probe stopped after {PROBE_SECONDS} s)")
                break
            try:
                torch.manual_seed(0)
                with torch.no_grad():
                    model(**cand)
            except Exception as e:
                errors.append(runner.short(e, 240))
                if os.environ.get("ZOO_DEBUG"):
                    traceback.print_exc()
                continue
            res.update(level=level, head_width=head_width, params=sum(p.numel() for p in model.parameters()),
                       tries=len(errors) + 1, inputs=describe(cand), config=changed(cls, kwargs))
            res["attempts"] = attempts
            return cls, kwargs, {"model": model, "inputs": cand}
        attempts.append(f"L{level} forward ({len(errors)} candidates): " + Counter(errors).most_common(1)[0][0]
                        if errors else f"L{level} forward: no candidate")
        res.setdefault("first_errors", {})[f"L{level}"] = errors[:3]
    res["attempts"] = attempts
    res["reason"] = attempts[0] if attempts else "no attempt"
    return None


def _profile(model: Any, inputs: dict[str, Any], mode: str, res: dict[str, Any], key: str) -> Any:
    """``flopscope.profile(model, mode=mode)`` under ``no_grad``, filled into ``res[key]``: MACs, by op, by role,
    whether the roles sum to the total, unsupported ops, notes, or the error. Returns the profile or None."""
    import torch

    import flopscope
    res[key] = out = {}
    res["stage"] = f"{key}: profile"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                prof = flopscope.profile(model, mode=mode, forward_kwargs=inputs)
        except flopscope.FlopscopeError as e:
            out["error"] = runner.short(e, 300)
            cause = e.__cause__
            if cause is not None:
                out["error_cause"] = runner.short(cause, 200)
            return None
        except Exception as e:  # not a FlopscopeError: the model's or flopscope's bug
            out["error"] = "non-flopscope " + runner.short(e, 300)
            out["traceback"] = traceback.format_exc()[-1500:]
            return None
    out["macs"] = prof.total()
    out["by_op"] = prof.by_op()
    res["stage"] = f"{key}: by_role"
    by_role = prof.by_role()
    out["by_role"] = by_role
    out["roles_sum_ok"] = sum(by_role.values()) == out["macs"]
    out["unsupported"] = prof.unsupported()
    out["notes"] = list(prof.notes)
    return prof


def _reconcile(prof: Any, res: dict[str, Any]) -> None:
    res["stage"] = "reconcile"
    try:
        rec = prof.reconcile()
    except Exception as e:
        res["reconcile"] = {"error": runner.short(e, 300), "traceback": traceback.format_exc()[-1500:]}
        return
    rows = rec.rows
    unexplained = rec.unexplained()
    res["reconcile"] = {
        "rows": len(rows), "exact": sum(1 for r in rows if r.exact),
        "explained": sum(1 for r in rows if not r.exact and r.reason), "unexplained": len(unexplained),
        "unexplained_rows": [f"{r.block or '(model)'} {r.role} {r.measured:,} vs "
                             f"{'-' if r.predicted is None else format(r.predicted, ',')}" for r in unexplained[:6]],
        "reasons": dict(Counter(runner.norm(r.reason) for r in rows if not r.exact and r.reason).most_common(6))}


def run_class(cls_name: str, kind: str, timeout: int, max_params: int, probe_only: bool = False,
              invariants: bool = False) -> dict[str, Any]:
    res: dict[str, Any] = {"class": cls_name, "kind": kind, "status": "skip"}
    with runner.guarded(res, timeout, lambda r: f"over {timeout} s (stage reached: {r.get('stage', 'build/probe')})"):
        _count(res, cls_name, max_params, probe_only, invariants)
    res.pop("traceback", None) if res["status"] != "crash" else None
    return res


def _count(res: dict[str, Any], cls_name: str, max_params: int, probe_only: bool, invariants: bool) -> None:
    import torch
    found = probe(res, cls_name, max_params)
    if found is None:
        return
    cls, kwargs, built = found
    model, inputs = built["model"], built["inputs"]
    if probe_only:
        res["status"] = "ran"
        return
    _profile(model, inputs, "real", res, "real")
    fake = _profile(model, inputs, "fake", res, "fake")
    res["stage"] = "meta: build"
    try:
        meta_model = instantiate(cls, kwargs, "meta")
    except Exception as e:
        res["meta"] = {"error": "build on meta: " + runner.short(e, 300)}
    else:
        _profile(meta_model, _to_meta(inputs), "fake", res, "meta")
        del meta_model
    with runner.eager_context():
        res["stage"] = "reference"
        try:
            res["ref"] = runner.reference(model, (), inputs)
        except Exception as e:
            res["ref"] = {"error": runner.short(e, 300)}
    if fake is not None:
        _reconcile(fake, res)
    if invariants:
        with torch.no_grad():
            runner.invariants_record(model, (), inputs, res)
    res["stage"] = "done"
    res["status"], res["reason"] = classify(res)


def run_roles(cls_name: str, kind: str, timeout: int, max_params: int) -> dict[str, Any]:
    """The roles yardstick of one class (``--roles``): ``zoo_roles.balance_record`` on the first config that builds
    and runs, heads of ``ROLE_HEAD_DIM`` first, in ``res["roles"]["runs"]``."""
    res: dict[str, Any] = {"class": cls_name, "kind": kind, "status": "skip"}
    with runner.guarded(res, timeout, lambda r: f"over {timeout} s (stage reached: {r.get('stage', 'build/probe')})"):
        found = probe(res, cls_name, max_params, ROLE_LEVELS)
        if found is not None:
            built = found[2]
            res["stage"] = "roles"
            res["roles"] = {"runs": [zoo_roles.balance_record(built["model"], (), built["inputs"], zoo_roles.BASE)]}
            res["status"] = "checked" if "imbalances" in res["roles"]["runs"][0] else "error"
    res.pop("traceback", None) if res["status"] != "crash" else None
    return res


MODES = ("real", "fake", "meta")


def classify(res: dict[str, Any]) -> tuple[str, str]:
    """exact / mismatch / error, and what differs or failed."""
    errors = [f"{k}: {res[k]['error']}" for k in (*MODES, "ref") if "error" in res.get(k, {})]
    if errors:
        return "error", "; ".join(errors)
    ref, fake = res["ref"]["macs"], res["fake"]["macs"]
    diffs = []
    if fake != ref:
        blind = blind_ops(res["fake"])
        if blind and fake - ref == sum(blind.values()):
            diffs.append(f"fake {fake:,} vs reference {ref:,}: above it only by ops FlopCounterMode has no formula "
                         "for (" + ", ".join(f"{op} {macs:,}" for op, macs in blind.items()) + ")")
        else:
            diffs.append(f"fake {fake:,} vs reference {ref:,} ({runner.by_op_diff(res['fake'], res['ref'])})")
    for m in ("real", "meta"):
        if res[m]["macs"] != fake:
            diffs.append(f"{m} {res[m]['macs']:,} vs fake {fake:,}")
    bad_roles = roles_differ(res)
    if bad_roles:
        diffs.append("roles differ across modes: " + bad_roles)
    return ("mismatch", "; ".join(diffs)) if diffs else ("exact", "")


def blind_ops(count: dict[str, Any]) -> dict[str, int]:
    """``{op: MACs}`` of the ops in a flopscope count that ``FlopCounterMode`` has no formula for (it counts 0);
    not SDPA's CPU kernel, which the reference counts through its math decomposition (``bmm``)."""
    from torch.utils.flop_counter import flop_registry
    known = {str(op) for op in flop_registry}
    return {op: macs for op, macs in count.get("by_op", {}).items()
            if macs and op not in known and "scaled_dot_product" not in op}


def roles_differ(res: dict[str, Any]) -> str:
    """The roles whose MACs differ between real, fake and meta (where each ran), "" if none."""
    counted = {m: res[m]["by_role"] for m in MODES if "by_role" in res.get(m, {})}
    roles = sorted({r for v in counted.values() for r in v})
    out = []
    for r in roles:
        vals = {m: v.get(r, 0) for m, v in counted.items()}
        if len(set(vals.values())) > 1:
            out.append(f"{r} " + " / ".join(f"{m} {x:,}" for m, x in vals.items()))
    return "; ".join(out)


def _warm_up(timeout: int, max_params: int, probe_only: bool) -> None:
    """One small class through every step in the sweep's parent: imports and first calls paid once."""
    run_class("DiTTransformer2DModel", "transformer", timeout, max_params, probe_only)


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def kind_of(name: str) -> str:
    if "ControlNet" in name:
        return "controlnet"
    if "Adapter" in name:
        return "adapter"
    if AUTOENCODER_HINT.search(name):
        return "autoencoder"
    if "UNet" in name:
        return "unet"
    if "Transformer" in name or "DiT" in name:
        return "transformer"
    return "other"


def classes() -> list[tuple[str, str]]:
    import diffusers
    from diffusers.models.modeling_utils import ModelMixin
    out = []
    for name in sorted(dir(diffusers)):
        try:
            c = getattr(diffusers, name)
        except Exception:
            continue
        if inspect.isclass(c) and issubclass(c, ModelMixin) and c is not ModelMixin:
            out.append((name, kind_of(name)))
    return out


def _progress(res: dict[str, Any]) -> str:
    return (f"{res['class']:<42} {res['status']:<9} {res.get('seconds', 0):6.1f}s  "
            f"{res.get('reason', '') if res['status'] != 'exact' else ''}")[:200]


def sweep(tasks: list[tuple[str, str]], jobs: int, timeout: int, max_params: int, progress: bool = True,
          probe_only: bool = False, invariants: bool = False) -> list[dict[str, Any]]:
    return runner.sweep(tasks, jobs, functools.partial(run_class, timeout=timeout, max_params=max_params,
                                                       probe_only=probe_only, invariants=invariants),
                        timeout, ("class", "kind"), _progress if progress else None,
                        functools.partial(_warm_up, timeout, max_params, probe_only))


def _roles_progress(res: dict[str, Any]) -> str:
    runs = res.get("roles", {}).get("runs", [])
    what = f"{sum(len(run.get('imbalances', [])) for run in runs)} imbalances" if runs else res.get("reason", "")
    return f"{res['class']:<42} {res['status']:<9} {res.get('seconds', 0):6.1f}s  {what}"[:200]


def sweep_roles(tasks: list[tuple[str, str]], jobs: int, timeout: int, max_params: int,
                progress: bool = True) -> list[dict[str, Any]]:
    return runner.sweep(tasks, jobs, functools.partial(run_roles, timeout=timeout, max_params=max_params),
                        timeout, ("class", "kind"), _roles_progress if progress else None,
                        functools.partial(run_roles, "DiTTransformer2DModel", "transformer", timeout, max_params))


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------
def write_roles_report(results: list[dict[str, Any]], path: Path, elapsed: float, args: argparse.Namespace) -> None:
    """The roles yardstick's report (``--roles``): ``zoo_roles.report_lines`` and each class's run."""
    checked = [r for r in results if r.get("roles")]
    distinct = sum(r.get("level") == 0 and r.get("head_width") == ROLE_HEAD_DIM for r in checked)
    lines = ["# flopscope roles yardstick: the roles that must balance, over the diffusers zoo", "",
             f"{len(results)} model classes of diffusers {__import__('diffusers').__version__}, torch "
             f"{__import__('torch').__version__}; {args.jobs} job(s), {elapsed / 60:.1f} min. Per class, one profile "
             "(`mode='auto'`, `no_grad`) checked with `role_balance(prof, head_paths(prof))`: "
             "per layer (an item of a module list) `ffn_up == ffn_down`, `ffn_gate` 0 or `ffn_up`, q/out = k/v = "
             "scores/weighted-sum, projections with an attention core; nothing of attention or FFN in a head.", "",
             f"Tiny models whose heads are {HEADS} of {ROLE_HEAD_DIM} (not the {WIDTH} of the other widths; FFN "
             f"{FFN}) ran for {distinct} of {len(checked)} checked classes; the others the sweep's tiny model "
             f"({HEADS} heads of {HEAD_DIM}) or level 1 (depths, sizes and vocabularies only). A transformer whose "
             "width is heads × head width (DiT, Flux, ...) has no other width to differ from: there q/out = 1 by "
             "construction. Exceptions: `benchmarks/zoo_roles.py`, `EXCEPTIONS`.", ""]
    lines += zoo_roles.report_lines(results, "class", runner.cell, "classes")
    lines += ["## Not checked", "", "```"]
    lines += runner.group_lines(runner.summarize(results, "class")["skips"]) or ["(none)"]
    lines += ["```", "", "## Runs", "", "| class | kind | status | config | imbalances (or error) |",
              "|---|---|---|---|---|"]
    for r in results:
        run = (r.get("roles", {}).get("runs") or [{}])[0]
        config = f"L{r['level']}, heads of {r.get('head_width')}" if "level" in r and run else "–"
        text = str(len(run["imbalances"])) if "imbalances" in run else run.get("error", r.get("reason", ""))
        lines.append(f"| {r['class']} | {r['kind']} | {r['status']} | {config} | {runner.cell(text)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def compact(n: Any) -> str:
    if not isinstance(n, int):
        return "–"
    for unit, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def role_split(by_role: dict[str, int]) -> str:
    total = sum(by_role.values())
    if not total:
        return "–"
    return ", ".join(f"{r} {100 * v / total:.1f}%" for r, v in sorted(by_role.items(), key=lambda kv: -kv[1]) if v)


def inputs_text(inputs: dict[str, Any]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, list) and all(isinstance(x, int) for x in v):
            return "×".join(map(str, v)) if v else "scalar"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return str(v)
    return "; ".join(f"{k} {one(v)}" for k, v in inputs.items())


def totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per status, reconcile rows summed, the classes whose roles differ between modes or do not sum."""
    rec = Counter()
    for r in results:
        for k in ("rows", "exact", "explained", "unexplained"):
            rec[k] += r.get("reconcile", {}).get(k, 0)
    counted = [r for r in results if any("by_role" in r.get(m, {}) for m in MODES)]
    return {"status": Counter(r["status"] for r in results), "reconcile": rec,
            "reconciled": sum(1 for r in results if "rows" in r.get("reconcile", {})),
            "roles_differ": [r["class"] for r in counted if roles_differ(r)],
            "roles_equal": sum(1 for r in counted
                               if not roles_differ(r) and all("by_role" in r.get(m, {}) for m in MODES)),
            "roles_sum_bad": [r["class"] for r in counted if any(not r[m].get("roles_sum_ok", True)
                                                                 for m in MODES if "macs" in r.get(m, {}))],
            "unsupported": _unsupported(results)}


def _unsupported(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    """``{op: classes}`` of the ops some mode's ``unsupported()`` lists."""
    out: dict[str, set[str]] = {}
    for r in results:
        for m in MODES:
            for op in r.get(m, {}).get("unsupported", {}):
                out.setdefault(op, set()).add(r["class"])
    return {op: sorted(classes) for op, classes in sorted(out.items())}


def not_running(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for r in results:
        if r["status"] in ("skip", "timeout", "crash", "error"):
            groups.setdefault(f"{r['status']}: {runner.norm(r.get('reason', '?'))}", []).append(r["class"])
    return groups


def _checkout(root: Path) -> str:
    """The flopscope checkout: its path, commit and the files of flopscope/ with uncommitted changes."""
    import subprocess
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "flopscope"],
                               capture_output=True, text=True, timeout=10).stdout.split()[1::2]
    except Exception:
        return str(root)
    return f"{root}` at `{head}" + (f" + uncommitted changes to {', '.join(dirty)}" if dirty else "")


def write_report(results: list[dict[str, Any]], path: Path, elapsed: float, args: argparse.Namespace) -> None:
    import diffusers
    import torch
    t = totals(results)
    st, rec = t["status"], t["reconcile"]
    lines = ["# flopscope diffusers zoo sweep", "",
             f"{len(results)} model classes of diffusers {diffusers.__version__} (subclasses of `ModelMixin` "
             f"exported by `diffusers`), torch {torch.__version__}; {args.jobs} job(s), {elapsed / 60:.1f} min, "
             f"{args.timeout} s per class. Tiny models (widths {WIDTH}, FFN {FFN}, {HEADS} heads of {HEAD_DIM}, "
             f"{LAYERS} layers, 1 block per stage, first stage {CHANNELS} channels, latents {LATENT}x{LATENT}, images "
             f"{IMAGE}x{IMAGE}, {TEXT} text tokens, batch 1), at most {args.max_params / 1e6:.0f}M parameters. "
             f"flopscope from `{args.checkout}` (when the sweep started).", "",
             "- **real / fake / meta**: `flopscope.profile(model, mode=...)` under `no_grad`; meta is the class "
             "built under `torch.device('meta')` from the same arguments, inputs on meta, `mode='fake'`.",
             "- **reference**: `FlopCounterMode` total // 2 on a real forward, SDPA math kernel, oneDNN off.",
             "- **reconcile**: `prof.reconcile()` of the fake profile: rows exact / explained (a reason) / "
             "unexplained.",
             "- **exact**: fake total = reference, real = fake = meta totals, `by_role()` equal in the three modes.",
             "- **level**: 0 = fully shrunk, 1 = only depths and sizes shrunk.", "",
             "## Summary", "", "| status | classes |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(st.items(), key=lambda kv: -kv[1])]
    lines += ["", f"- ran (counted): {st.get('exact', 0) + st.get('mismatch', 0) + st.get('error', 0)} of "
              f"{len(results)}",
              f"- reconcile rows over {t['reconciled']} classes: {rec['rows']} rows, {rec['exact']} exact, "
              f"{rec['explained']} explained, {rec['unexplained']} unexplained",
              f"- `by_role()` equal in real / fake / meta: {t['roles_equal']} classes; differ: "
              f"{len(t['roles_differ'])}" + (f" ({', '.join(t['roles_differ'])})" if t["roles_differ"] else ""),
              f"- `sum(by_role()) != total()`: {len(t['roles_sum_bad'])}"
              + (f" ({', '.join(t['roles_sum_bad'])})" if t["roles_sum_bad"] else ""),
              "- unsupported ops: " + ("; ".join(f"{op} ({', '.join(c)})" for op, c in t["unsupported"].items())
                                        or "none"), ""]
    lines += ["## Not counted (grouped)", "", "```"] + (runner.group_lines(not_running(results), limit=8)
                                                     or ["(none)"]) + ["```", ""]
    if any(r.get("invariants") for r in results):  # --invariants
        lines += runner.invariant_lines(results, "class")
    mism = [r for r in results if r["status"] == "mismatch"]
    lines += ["## Mismatches", ""]
    lines += [f"- **{r['class']}**: {runner.cell(r['reason'])}" for r in mism] or ["(none)"]
    lines += ["", "## Unexplained reconcile rows", ""]
    unexp = [r for r in results if r.get("reconcile", {}).get("unexplained")]
    lines += [f"- **{r['class']}** ({r['reconcile']['unexplained']}): "
              + runner.cell("; ".join(r["reconcile"]["unexplained_rows"])) for r in unexp] or ["(none)"]
    lines += ["", "## Results", "",
              "| class | kind | status | level | params | inputs | flopscope MACs (fake) | reference MACs | "
              "roles (share of MACs) | reconcile exact/total (explained) | reason |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fake, ref, rc = r.get("fake", {}), r.get("ref", {}), r.get("reconcile", {})
        rct = f"{rc['exact']}/{rc['rows']} ({rc['explained']})" if "rows" in rc else rc.get("error", "–")
        reason = r.get("reason", "") if r["status"] != "exact" else ""
        lines.append(f"| {r['class']} | {r['kind']} | {r['status']} | {r.get('level', '–')} | "
                     f"{compact(r.get('params'))} | {runner.cell(inputs_text(r.get('inputs', {})))} | "
                     f"{runner.fmt(fake.get('macs'))} | {runner.fmt(ref.get('macs'))} | "
                     f"{runner.cell(role_split(fake.get('by_role', {})))} | {runner.cell(rct)} | "
                     f"{runner.cell(reason)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def print_summary(results: list[dict[str, Any]], elapsed: float) -> None:
    t = totals(results)
    st, rec = t["status"], t["reconcile"]
    print(f"\n{len(results)} classes in {elapsed / 60:.1f} min: "
          + ", ".join(f"{k} {v}" for k, v in sorted(st.items(), key=lambda kv: -kv[1])))
    print(f"reconcile ({t['reconciled']} classes): {rec['rows']} rows, {rec['exact']} exact, "
          f"{rec['explained']} explained, {rec['unexplained']} unexplained")
    print(f"roles equal in real/fake/meta: {t['roles_equal']}; differ: {len(t['roles_differ'])} {t['roles_differ']}")
    print(f"roles do not sum to the total: {len(t['roles_sum_bad'])} {t['roles_sum_bad']}")
    print("\nnot counted:")
    for line in runner.group_lines(not_running(results)) or ["   (none)"]:
        print(line)
    mism = [r for r in results if r["status"] == "mismatch"]
    if mism:
        print("\nmismatches:")
        for r in mism:
            print(f"  {r['class']}: {r['reason']}"[:300])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated class names (e.g. FluxTransformer2DModel,AutoencoderKL)")
    runner.add_common_arguments(ap, str(Path(__file__).with_name("diffusers_zoo_report.md")), 60, "class")
    ap.add_argument("--max-params", type=float, default=50e6, help="skip models above this size (default 50M)")
    ap.add_argument("--probe", action="store_true", help="only build each class and find its inputs")
    ap.add_argument("--invariants", action="store_true",
                    help="also run flopscope.testing.invariants.check_invariants on each class (more time)")
    ap.add_argument("--roles", action="store_true",
                    help="the roles yardstick only (issue 47): role_balance on each class, heads "
                         f"{ROLE_HEAD_DIM} wide (report default: benchmarks/diffusers_zoo_roles_report.md)")
    args = ap.parse_args(argv)

    tasks = runner.only(classes(), args.only, "classes")
    import flopscope
    args.checkout = _checkout(Path(flopscope.__file__).resolve().parent.parent)
    t0 = time.time()
    if args.roles:
        if args.report == ap.get_default("report"):
            args.report = str(Path(__file__).with_name("diffusers_zoo_roles_report.md"))
        results = sweep_roles(tasks, max(1, args.jobs), args.timeout, int(args.max_params), progress=not args.quiet)
        elapsed = time.time() - t0
        write_roles_report(results, Path(args.report), elapsed, args)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        print(f"\n{runner.status_line(results, runner.summarize(results, 'class'), 'classes', elapsed)}")
        print("\n".join(zoo_roles.share_lines(zoo_roles.summary(results, "class"), "classes")).replace("**", ""))
        print(f"\nreport: {args.report}")
        return 0
    results = sweep(tasks, max(1, args.jobs), args.timeout, int(args.max_params), progress=not args.quiet,
                    probe_only=args.probe, invariants=args.invariants)
    elapsed = time.time() - t0
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.probe:
        print(f"\n{len(results)} classes probed in {elapsed / 60:.1f} min: "
              + ", ".join(f"{k} {v}" for k, v in Counter(r["status"] for r in results).most_common()))
        for line in runner.group_lines(not_running(results)):
            print(line)
        return 0
    write_report(results, Path(args.report), elapsed, args)
    print_summary(results, elapsed)
    print(f"\nreport: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
