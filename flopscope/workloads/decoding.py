"""Greedy decoding with a KV cache, as Hugging Face's ``generate()`` runs it, without
reading a single value: the forwards of ``model.generate(ids, max_new_tokens=N,
min_new_tokens=N, do_sample=False)`` for a count on fake tensors (``generate()``
itself cannot run there: it reads values, such as ``(attention_mask == 1).all()`` and
each step's stopping criteria).

:func:`greedy_decode` runs the model's forward ``N`` times for ``N`` new tokens, with what transformers 5.x's
``generate()`` passes it for a decoder-only model and a prompt without padding (an attention mask of ones):

1. before the first forward: position ids ``0 .. P-1`` for each sequence (``[B, P]``,
   what ``generate()`` derives from the mask of ones), when the forward takes
   ``position_ids``; no attention mask (``generate()`` drops a mask of ones: no
   padding); ``logits_to_keep=1`` when the forward takes it (the head computes the
   logits of the last position only); a ``DynamicCache`` built from the decoder's config
   (its sliding-window layers where the config has them), unless the model makes its own
   cache or its generation config says ``use_cache=False``;
2. the prefill: one forward over the prompt, its inputs made by the model's own
   ``prepare_inputs_for_generation``;
3. ``N - 1`` decode forwards of one token per sequence: the argmax of the last
   position's logits (a fake tensor on fake tensors: only its shape is used) appended to
   the sequences; ``prepare_inputs_for_generation`` keeps the last token,
   ``_update_model_kwargs_for_generation`` takes the grown cache and adds one position
   id per step. The ``N``-th token is drawn from the last forward's logits and never fed
   back: ``N`` new tokens, ``N`` forwards.

What is left out changes no multiply of the model: logits processors and stopping
criteria (exactly ``N`` tokens are generated, as with ``min_new_tokens = max_new_tokens
= N``), the float32 copy of the logits before the argmax.

Not mimicked, refused with a :class:`~flopscope.errors.ConfigurationError` before any
forward: encoder-decoder models, a generation config asking for another cache (static,
offloaded, quantized), a model without ``prepare_inputs_for_generation`` (not a Hugging
Face ``GenerationMixin``).

Units: nothing is counted here. Wrap the call in :class:`flopscope.profiler`
(``mode="fake"``: nothing is computed, a model built on ``device="meta"`` works) and
read :meth:`~flopscope.profile.Profile.steps` (MACs; FLOPs = 2 x MACs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import ConfigurationError, InputError

__all__ = ["check_decoding", "decoding_driver", "greedy_decode", "prefill_then_chunk"]


def greedy_decode(model: nn.Module, input_ids: torch.Tensor, new_tokens: int, *,
                  then: Callable[[dict[str, Any]], None] | None = None) -> torch.Tensor:
    """Run ``model``'s forwards as greedy ``generate()`` would to draw ``new_tokens``
    tokens after ``input_ids`` (``[B, P]`` token ids, no padding): one prefill
    forward, then ``new_tokens - 1`` decode forwards of one token per sequence (see
    the module docstring). Returns the sequences ``[B, P + new_tokens]`` (fake
    tensors when run in a fake-tensor mode). Runs under ``torch.no_grad()``, as
    ``generate()`` does. ``then``: called last, still under ``no_grad``, with the
    keyword arguments the next forward would take (the cache among them)."""
    forward_keys, cache_key = check_decoding(model, input_ids, new_tokens)
    hf: Any = model  # a transformers GenerationMixin (checked): its methods are not submodules
    batch, prompt = input_ids.shape
    kwargs: dict[str, Any] = {"use_cache": _generation_setting(model, "use_cache", True)}
    with torch.no_grad():
        # generate(): the mask of ones' cumsum - 1, one row per sequence
        if "position_ids" in forward_keys:
            kwargs["position_ids"] = torch.arange(prompt, dtype=torch.long,
                                                  device=input_ids.device).expand(batch, prompt).contiguous()
        if "logits_to_keep" in forward_keys:
            kwargs["logits_to_keep"] = 1
        cache = _new_cache(model) if kwargs["use_cache"] else None
        if cache is not None:
            kwargs[cache_key] = cache
        sequences = input_ids
        prepare = hf.prepare_inputs_for_generation
        slicing = _takes_next_sequence_length(type(model), prepare)
        for step in range(new_tokens):
            step_kwargs = dict(kwargs)
            # the positions fed: the prompt (a cache of attention layers), then 1 with a cache, else
            # all
            if slicing:
                step_kwargs["next_sequence_length"] = (
                    (prompt if cache is not None and not all(getattr(cache, "is_linear", [False])) else None)
                    if step == 0 else (1 if kwargs["use_cache"] else None))
            inputs = prepare(sequences, is_first_iteration=step == 0, **step_kwargs)
            outputs = model(**inputs, return_dict=True)
            kwargs = hf._update_model_kwargs_for_generation(outputs, kwargs, is_encoder_decoder=False)
            sequences = torch.cat([sequences, outputs.logits[:, -1].argmax(-1)[:, None]], dim=-1)
        if then is not None:
            then(kwargs)
    return sequences


def _takes_next_sequence_length(cls: type, prepare: Callable[..., Any]) -> bool:
    """Whether ``generate()`` hands a model's ``prepare_inputs_for_generation``
    (``prepare``, of class ``cls``) the positions to feed (``next_sequence_length``):
    its ``GenerationMixin`` takes it, and so does the override, by name or through
    ``**kwargs`` passed on (Phi-3's, which drops the cache at its rope switch;
    Falcon-H1's). Fed without it, a step takes the whole sequence on its cache."""
    base = next((vars(c)["prepare_inputs_for_generation"] for c in cls.__mro__
                 if c.__name__ == "GenerationMixin" and "prepare_inputs_for_generation" in vars(c)), None)
    if base is None or "next_sequence_length" not in inspect.signature(base).parameters:
        return False
    own = inspect.signature(prepare).parameters
    return "next_sequence_length" in own or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own.values())


def prefill_then_chunk(model: nn.Module, input_ids: torch.Tensor, chunk: Callable[[], torch.Tensor],
                       decodes: int = 0) -> None:
    """The prefill :func:`greedy_decode` runs over ``input_ids`` (``[B, c]``) and its
    next ``decodes`` decode steps, then one forward of ``chunk()``'s token ids (``[B,
    t]``) on the cache they filled: a chunk of a chunked prefill, as a serving engine
    schedules it (``t`` new positions attending to the ``c + decodes`` cached ones and
    to each other). Positions continue from the cache's length (the model derives
    them); only the last position's logits are computed, where the forward takes
    ``logits_to_keep``. Units: nothing is counted here."""
    forward_keys, _ = check_decoding(model, input_ids, 1)

    def forward_chunk(kwargs: dict[str, Any]) -> None:
        given = {key: value for key, value in kwargs.items() if key not in ("position_ids", "attention_mask")}
        if "logits_to_keep" in forward_keys:
            given["logits_to_keep"] = 1
        model(input_ids=chunk(), **given, return_dict=True)

    greedy_decode(model, input_ids, 1 + decodes, then=forward_chunk)


def decoding_driver(new_tokens: int, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> torch.Tensor:
    """A capture's driver (:class:`~flopscope.capture.CapturePlan`, bound to ``new_tokens``
    with :func:`functools.partial`): :func:`greedy_decode` of ``model`` (the fake run's
    copy) on the run's token ids."""
    return greedy_decode(model, args[0], new_tokens)


def check_decoding(model: nn.Module, input_ids: Any, new_tokens: Any) -> tuple[set[str], str]:
    """The names the forward of ``model`` takes and the name of its cache argument; an
    :class:`~flopscope.errors.InputError` for ids that are no ``[batch, prompt]`` tensor or a count of new tokens that
    is no positive integer, a :class:`~flopscope.errors.ConfigurationError` for a model :func:`greedy_decode` does not
    mimic ``generate()`` for."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise InputError(f"input_ids must be a [batch, prompt] tensor of token ids; got {_shape(input_ids)}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise InputError(f"new_tokens must be a positive integer; got {new_tokens!r}")
    name = type(model).__name__
    config = getattr(model, "config", None)
    if not callable(getattr(model, "prepare_inputs_for_generation", None)) or config is None or \
            not callable(getattr(model, "_update_model_kwargs_for_generation", None)):
        raise ConfigurationError(f"{name} is not a Hugging Face model that generates (no "
                                 "prepare_inputs_for_generation): its generate() can only run for real")
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigurationError(f"{name} is an encoder-decoder: greedy_decode mimics generate() for decoder-only "
                                 "models; run generate() for real")
    implementation = _generation_setting(model, "cache_implementation", None)
    if implementation not in (None, "dynamic"):
        raise ConfigurationError(f"{name}'s generation config asks for a {implementation!r} cache, which greedy_decode "
                                 "does not build (it builds generate()'s default DynamicCache); run generate() for "
                                 "real")
    keys = set(inspect.signature(model.forward).parameters)
    return keys, "cache" if "cache" in keys else "past_key_values"  # (renamed in transformers 5.x)


def _new_cache(model: nn.Module) -> Any:
    """The cache ``generate()`` gives the model: none when the model makes its own, else
    a ``DynamicCache`` of its decoder's config."""
    supports: Any = getattr(model, "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        return None  # (Mamba-like models: prepare_inputs_for_generation makes theirs)
    # (the model is a transformers model: transformers is installed)
    from transformers import DynamicCache

    config: Any = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    try:
        return DynamicCache(config=text)
    except TypeError:  # a DynamicCache that takes no config
        return DynamicCache()


def _generation_setting(model: nn.Module, key: str, default: Any) -> Any:
    value = getattr(getattr(model, "generation_config", None), key, default)
    return default if value is None and default is not None else value


def _shape(value: Any) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
