"""Command-line targets: build a model from ``package.module:factory`` or a Hugging Face family
(``hf:gpt2``, built from its config, never downloaded), and make inputs from ``1x128``-style shapes."""

from __future__ import annotations

import ast
import difflib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .conventions import POSITIONS
from .errors import FlopscopeError, InputError

HF_HEADS = {"": "AutoModel", "causal-lm": "AutoModelForCausalLM", "seq2seq-lm": "AutoModelForSeq2SeqLM",
            "masked-lm": "AutoModelForMaskedLM", "classification": "AutoModelForSequenceClassification"}


@dataclass
class Target:
    model: nn.Module
    description: str
    token_inputs: bool  # inputs are token ids (their last dim is the sequence)
    vocab_size: int | None = None
    encoder_decoder: bool = False
    positions: int | None = None  # rows of a learned position table: the longest sequence a forward takes
    positions_key: str = ""  # the config key that declares them (for the hint: --set KEY=...)

    def check_sequence(self, n: int, what: str = "a sequence") -> None:
        """Refuse a sequence of ``n`` tokens longer than the model's learned position table (a real forward
        would fail looking its positions up); models without one (rotary, relative, no positions) take any
        length. Raises :class:`~flopscope.errors.InputError`."""
        if self.positions is not None and n > self.positions:
            raise InputError(f"{what} of {n:,} tokens is longer than {self.description}'s position table "
                             f"({self.positions:,} rows, config {self.positions_key}={self.positions}): a real "
                             f"forward would fail; give at most {self.positions:,} tokens or "
                             f"--set {self.positions_key}={n}")


def parse_settings(settings: Sequence[str]) -> dict[str, Any]:
    """``["n_layer=2", "use_cache=False"]`` -> ``{"n_layer": 2, "use_cache": False}`` (Python literals)."""
    out: dict[str, Any] = {}
    for item in settings:
        if "=" not in item:
            raise FlopscopeError(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def load_target(spec: str, settings: Sequence[str] = ()) -> Target:
    """``hf:FAMILY[/HEAD]`` or ``package.module:factory`` (``factory(**settings)`` returns the module)."""
    overrides = parse_settings(settings)
    if spec.startswith("hf:"):
        return _hugging_face(spec[3:], overrides)
    if ":" not in spec:
        raise FlopscopeError(f"target must be 'package.module:factory' or 'hf:family'; got {spec!r}")
    module_name, attr = spec.split(":", 1)
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise FlopscopeError(f"cannot load {spec!r}: {e}") from e
    try:
        model = factory(**overrides) if callable(factory) and not isinstance(factory, nn.Module) else factory
    except TypeError as e:
        raise FlopscopeError(f"cannot build {spec!r} with {overrides or 'no arguments'}: {e} (pass them with --set)"
                             ) from e
    if not isinstance(model, nn.Module):
        raise FlopscopeError(f"{spec!r} did not give a torch.nn.Module (got {type(model).__name__})")
    return Target(model.eval(), spec, token_inputs=False)


def _hugging_face(family: str, overrides: dict[str, Any]) -> Target:
    try:
        import transformers
    except ImportError as e:
        raise FlopscopeError("hf: targets need transformers (pip install 'flopscope[hf]')") from e
    family, _, head = family.partition("/")
    if head not in HF_HEADS:
        raise FlopscopeError(f"unknown head {head!r}; one of: {', '.join(h or '(none)' for h in HF_HEADS)}")
    if family not in transformers.CONFIG_MAPPING:
        raise FlopscopeError(_unknown_family(family, sorted(transformers.CONFIG_MAPPING.keys())))
    default = transformers.AutoConfig.for_model(family)
    known = set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
    for key in overrides:
        if key not in known and not hasattr(default, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise FlopscopeError(f"{family} config has no {key!r}{hint}")
    config = transformers.AutoConfig.for_model(family, **overrides)
    torch.manual_seed(0)
    model = getattr(transformers, HF_HEADS[head]).from_config(config).eval()
    text = getattr(model, "main_input_name", "input_ids") == "input_ids"
    positions_key, positions = _position_table(model, config) if text else ("", None)
    return Target(model, f"hf:{family}{'/' + head if head else ''}", token_inputs=text,
                  vocab_size=getattr(config, "vocab_size", None),
                  encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
                  positions=positions, positions_key=positions_key)


def _unknown_family(family: str, families: Sequence[str]) -> str:
    """The closest few family names, and how to list them all (there are hundreds)."""
    close = difflib.get_close_matches(family.lower(), families, n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else "no family has a similar name"
    return (f"unknown Hugging Face family {family!r}; {hint}. All {len(families)}: "
            "python -c \"import transformers; print(*sorted(transformers.CONFIG_MAPPING))\"")


def _position_table(model: nn.Module, config: Any) -> tuple[str, int | None]:
    """``(config key, rows)`` of the model's learned position table: the config declares a position count
    under a :data:`~flopscope.conventions.POSITIONS` name and an ``nn.Embedding`` other than the token
    table has that many rows (after its ``offset``: OPT and BART keep two extra rows). Models whose config
    declares positions but that have no such table (rotary, relative) give ``("", None)``: any length runs."""
    declared = config.to_dict()
    for key in POSITIONS.config:
        value = declared.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            break
    else:
        return "", None
    get_tokens = getattr(model, "get_input_embeddings", None)
    tokens = get_tokens() if callable(get_tokens) else None
    token_weight = getattr(tokens, "weight", None)
    for module in model.modules():
        if (isinstance(module, nn.Embedding) and module is not tokens and module.weight is not token_weight
                and module.num_embeddings - int(getattr(module, "offset", 0) or 0) == value):
            return key, value
    return "", None


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError as e:
        raise FlopscopeError(f"--input takes shapes like 1x128 or 1x3x224x224; got {text!r}") from e
    if not shape or any(s <= 0 for s in shape):
        raise FlopscopeError(f"--input shape must be positive; got {text!r}")
    return shape


def make_inputs(target: Target, shapes: Sequence[tuple[int, ...]], dtype: str | None = None
                ) -> Callable[[int | None], tuple[tuple[Any, ...], dict[str, Any]]]:
    """A function of the sequence length (``None``: as given) returning ``(args, kwargs)``. The sequence
    is the last dim of token ids, dim 1 of float inputs. Token ids are drawn below the vocabulary size; a
    sequence of token ids longer than the model's learned position table is refused (an
    :class:`~flopscope.errors.InputError`) here for the given shapes and by the returned function for
    ``n``, before any input is built (see :meth:`Target.check_sequence`)."""
    if not shapes:
        shapes = [(1, 128)] if target.token_inputs else []
    if not shapes:
        raise FlopscopeError("give the input shape with --input (e.g. --input 1x128x512)")
    tokens = target.token_inputs if dtype is None else dtype in ("long", "int64", "int")
    torch_dtype = torch.long if tokens else getattr(torch, dtype or "float32", None)
    if not isinstance(torch_dtype, torch.dtype):
        raise FlopscopeError(f"unknown --dtype {dtype!r}")
    if tokens:
        for shape in shapes:
            target.check_sequence(shape[-1], f"--input {'x'.join(map(str, shape))}: a sequence")

    def build(n: int | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if tokens and n is not None:
            target.check_sequence(n)
        generator = torch.Generator().manual_seed(0)
        tensors = []
        for shape in shapes:
            if n is not None:
                index = len(shape) - 1 if tokens else min(1, len(shape) - 1)
                shape = (*shape[:index], n, *shape[index + 1:])
            if tokens:
                tensors.append(torch.randint(0, target.vocab_size or 2, shape, generator=generator))
            else:
                tensors.append(torch.randn(shape, generator=generator, dtype=torch_dtype))
        if target.encoder_decoder and tokens and len(tensors) == 1:
            return (), {"input_ids": tensors[0], "decoder_input_ids": tensors[0]}
        return tuple(tensors), {}

    return build
