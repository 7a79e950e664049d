"""Command-line targets: build a model from ``package.module:factory``, a Hugging Face
family (``hf:gpt2``, its default config), a model's own ``config.json`` (``hf:ORG/NAME``
from the hub, or a local file or directory; the config only, never weights), a timm
model (``timm:resnet50``) or a torchvision one (``torchvision.models:resnet50``; both
without weights, with the input size their weights were trained at as the default
input), and make inputs from ``1x128``-style shapes."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..conventions import POSITIONS
from ..errors import FlopscopeError, InputError, UsageError
from .settings import parse_settings, settings_text, typed

HF_HEADS = {"": "AutoModel", "causal-lm": "AutoModelForCausalLM",
            "seq2seq-lm": "AutoModelForSeq2SeqLM",
            "masked-lm": "AutoModelForMaskedLM",
            "classification": "AutoModelForSequenceClassification"}


@dataclass
class Target:
    model: nn.Module
    description: str
    token_inputs: bool  # inputs are token ids (their last dim is the sequence)
    vocab_size: int | None = None
    encoder_decoder: bool = False
    # rows of a learned position table: the longest sequence a forward takes
    positions: int | None = None
    positions_key: str = ""  # the config key that declares them (for the hint: --set KEY=...)
    # the default input without --input (an image model's 1x3xHxW)
    input_shape: tuple[int, ...] | None = None

    def check_sequence(self, n: int, what: str = "a sequence") -> None:
        """Refuse a sequence of ``n`` tokens longer than the model's learned position
        table (a real forward would fail looking its positions up); models without one
        (rotary, relative, no positions) take any length. Raises
        :class:`~flopscope.errors.InputError`."""
        if self.positions is not None and n > self.positions:
            raise InputError(f"{what} of {n:,} tokens is longer than {self.description}'s position "
                             f"table ({self.positions:,} rows, config "
                             f"{self.positions_key}={self.positions}): a real forward would fail; "
                             f"give at most {self.positions:,} tokens or --set "
                             f"{self.positions_key}={n}")


def load_target(spec: str, settings: Sequence[str] = (), device: str | None = None) -> Target:
    """``hf:FAMILY[/HEAD]`` (a family's default config), ``hf:ORG/NAME[/HEAD]`` (a
    model's own ``config.json`` from the Hugging Face hub: the config only, never
    weights), a local ``config.json`` or a directory holding one, ``timm:NAME``
    (``timm.create_model(NAME, pretrained=False, **settings)``) or
    ``package.module:factory`` (``factory(**settings)`` returns the module). Hugging
    Face models from a config file are built on ``device="meta"`` in the config's dtype
    unless ``device`` names another: nothing is allocated, so count them in fake mode.
    timm models, and torchvision's classification models (``torchvision.models:NAME``),
    get a default input of one image at the size their weights were trained at (timm:
    ``pretrained_cfg["input_size"]``; torchvision: the crop size of the ``DEFAULT``
    weights' transforms, else 224). ``device``: build the model there (``"meta"``:
    nothing allocated); the modules it needs are imported first, outside that device
    (torch 2.6's ``torch._dynamo``, which transformers imports with a model's module,
    cannot be first imported under ``torch.device("meta")``)."""
    overrides = parse_settings(settings)
    local = Path(spec)
    if local.suffix == ".json" or (local.is_dir() and (local / "config.json").is_file()):
        return _config_file(local if local.suffix == ".json" else local / "config.json", "",
                            overrides, spec, device)
    if spec.startswith("hf:"):
        name, _, head = spec[3:].partition("/")
        # ORG/NAME[/HEAD]: a model on the hub
        if "/" in spec[3:] and head.partition("/")[0] not in HF_HEADS:
            _check_not_a_head(name, head)
            repo, _, head = spec[3:].partition("/")[2].partition("/")
            return _config_file(_hub_config(f"{name}/{repo}"), head, overrides, spec, device)
        return _hugging_face(spec[3:], overrides, device)
    if spec.startswith("timm:"):
        return _timm(spec[5:], overrides, device)
    if ":" not in spec:
        hint = f" (a Python file: write {local.stem}:FACTORY)" if local.suffix == ".py" else ""
        raise FlopscopeError("target must be 'package.module:factory', 'hf:family' or "
                             f"'timm:name'; got {spec!r}{hint}")
    module_name, attr = spec.split(":", 1)
    folder = _current_folder_importable()
    module = _import(module_name, spec, " (looked in the installed packages and the current "
                                        f"folder, {folder}: run from the folder holding "
                                        f"{module_name.split('.')[0]}, or add its folder to "
                                        "PYTHONPATH)")
    try:
        factory = getattr(module, attr)
    except AttributeError as e:
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f" (did you mean {module_name}:{close[0]}?)" if close else ""
        raise FlopscopeError(f"cannot load {spec!r}: {e}{hint}") from e
    if callable(factory) and not isinstance(factory, nn.Module):
        overrides = typed(_defaults(factory), overrides, spec)
    try:
        with _on(device):
            model = factory(**overrides) if callable(factory) and not isinstance(factory, nn.Module) else factory
    except TypeError as e:
        raise FlopscopeError(f"cannot build {spec!r} with {overrides or 'no arguments'}: {e} (pass "
                             "them with --set)"
                             ) from e
    if not isinstance(model, nn.Module):
        raise FlopscopeError(f"{spec!r} did not give a torch.nn.Module (got {type(model).__name__})")
    shape = _torchvision_input(module, attr) if module_name == "torchvision.models" else None
    return Target(model.eval(), spec, token_inputs=False, input_shape=shape)


def _current_folder_importable() -> str:
    """The current folder, made importable as ``python -m`` makes it (first on
    ``sys.path``) where it is not already: a ``module:factory`` target in the folder the
    command runs in loads without ``PYTHONPATH=.`` (the ``flopscope`` script's own
    folder is what Python puts first)."""
    here = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        sys.path.insert(0, here)
        importlib.invalidate_caches()
    return here


def _defaults(factory: Callable[..., Any]) -> dict[str, Any]:
    """The default values of ``factory``'s parameters (``{}`` where Python cannot read
    its signature)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or an extension without a signature
        return {}
    return {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}


def _import(module_name: str, spec: str, hint: str = "") -> Any:
    """``importlib.import_module``, any failure a :class:`FlopscopeError` (a package
    built for another torch, such as a torchvision wheel whose compiled ops do not load,
    fails with a ``RuntimeError``, not an ``ImportError``). ``hint`` follows the message
    where ``module_name`` itself (or a package above it) is not found, not a module it
    imports."""
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None)
        itself = isinstance(e, ModuleNotFoundError) and (missing is None or f"{module_name}.".startswith(f"{missing}."))
        raise FlopscopeError(f"cannot load {spec!r}: {e}{hint if itself else ''}") from e
    except Exception as e:
        raise FlopscopeError(f"cannot load {spec!r}: importing {module_name} failed with torch "
                             f"{torch.__version__} ({type(e).__name__}: {e}); is it built for this "
                             "torch? (torchvision: install the "
                             "release made for this torch, from the same index)") from e


def _on(device: str | None) -> Any:
    """``torch.device(device)`` as a context, or none."""
    return torch.device(device) if device is not None else contextlib.nullcontext()


def _import_model_of(builder: Any, config: Any) -> None:
    """Import the module of the class an auto class (``AutoModelForCausalLM``) builds
    for ``config`` (transformers imports it on first use), so that it is not first
    imported where the model is built."""
    mapping = getattr(builder, "_model_mapping", None)
    # a config the auto class does not know: its own error, from from_config
    with contextlib.suppress(KeyError):
        _ = mapping[type(config)] if mapping is not None else None


def _timm(name: str, overrides: dict[str, Any], device: str | None = None) -> Target:
    """A timm model without weights, its default input one image of
    ``pretrained_cfg["input_size"]``."""
    timm = _import("timm", f"timm:{name}", " (pip install 'torch-flopscope[vision]')")
    if not timm.is_model(name):
        names = timm.list_models()
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "no model has a similar name"
        raise FlopscopeError(f"unknown timm model {name!r}; {hint}. All {len(names)}: "
                             "python -c \"import timm; print(*timm.list_models())\"")
    torch.manual_seed(0)
    try:
        with _on(device):
            model = timm.create_model(name, pretrained=False, **overrides)
    except TypeError as e:
        raise FlopscopeError(f"cannot build timm:{name} with {overrides}: {e}") from e
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    return Target(model.eval(), f"timm:{name}", token_inputs=False,
                  input_shape=(1, *(int(s) for s in size)))


def _torchvision_input(models: Any, name: str) -> tuple[int, ...]:
    """One image at the crop size of the ``DEFAULT`` weights' transforms of
    torchvision's model ``name`` (what those weights were trained and evaluated at: 299
    for Inception v3, 518 for ViT-H/14), else 224."""
    size = 224
    try:
        crop = models.get_model_weights(name).DEFAULT.transforms().crop_size
        size = int(crop[0])
    except Exception:  # no weights for this builder, or transforms without a crop: the usual 224
        pass
    return (1, 3, size, size)


def _hugging_face(family: str, overrides: dict[str, Any], device: str | None = None) -> Target:
    try:
        import transformers
    except ImportError as e:
        raise FlopscopeError("hf: targets need transformers (pip install 'torch-flopscope[hf]')") from e
    family, _, head = family.partition("/")
    if head not in HF_HEADS:
        raise FlopscopeError(_unknown_head(head))
    if family not in transformers.CONFIG_MAPPING:
        raise FlopscopeError(_unknown_family(family, sorted(transformers.CONFIG_MAPPING.keys())))
    overrides = _check_overrides(transformers.AutoConfig.for_model(family), overrides,
                                 f"hf:{family}")
    try:
        config = transformers.AutoConfig.for_model(family, **overrides)
    # transformers' own validation of the values (a head count that does not divide,
    # ...)
    except Exception as e:
        raise UsageError(f"the config of hf:{family} refuses {settings_text(overrides)}: "
                         f"{type(e).__name__}: "
                         f"{e}") from e
    torch.manual_seed(0)
    builder = getattr(transformers, HF_HEADS[head])
    _import_model_of(builder, config)
    with _on(device):
        model = builder.from_config(config).eval()
    return _target(model, config, f"hf:{family}{'/' + head if head else ''}")


HUB_PROBE_SECONDS = 5.0
"""How long :func:`_hub_config` waits for the hub's endpoint to answer before it says
the hub cannot be reached."""


def _hub_config(repo: str) -> Path:
    """The ``config.json`` of a hub model (downloaded once into the Hugging Face cache;
    no weights).

    Offline it fails at once instead of after the hub client's retries (five, about 25
    s): with ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set, or when the endpoint
    (``HF_ENDPOINT``, default ``https://huggingface.co``) does not answer one request
    within :data:`HUB_PROBE_SECONDS`, the cached ``config.json`` is used if there is one
    (unreachable: with a warning), and otherwise the error says what to do. Both
    variables are read when the target is loaded, so a change after ``huggingface_hub``
    was imported counts."""
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError as e:
        raise FlopscopeError("hf:ORG/NAME targets need huggingface_hub (pip install "
                             "'torch-flopscope[hf]')") from e
    what = f"the config.json of {repo!r}"
    instead = "download it yourself and pass its path (flopscope profile path/to/config.json)"
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    offline = _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE") or constants.is_offline_mode()
    unreachable = None if offline else _unreachable(endpoint)
    if offline or unreachable:
        try:
            path = Path(hf_hub_download(repo, "config.json", local_files_only=True))
        # not in the cache (LocalEntryNotFoundError), or a cache that cannot be read
        except Exception as e:
            why = ("HF_HUB_OFFLINE is set" if offline else
                   f"the Hugging Face hub at {endpoint} cannot be reached ({unreachable})")
            raise FlopscopeError(f"cannot fetch {what}: {why}, and the Hugging Face cache has no "
                                 f"copy ({type(e).__name__}); {instead}"
                                 + ("" if offline else ", or check the connection, HF_ENDPOINT and "
                                                       "the proxy "
                                    "settings")) from e
        if unreachable:
            warnings.warn(f"the Hugging Face hub at {endpoint} cannot be reached ({unreachable}): "
                          "using the cached "
                          f"copy of {what}", stacklevel=3)
        return path
    try:
        return Path(hf_hub_download(repo, "config.json", endpoint=endpoint))
    # a gated or missing repo, or a connection lost after the probe: say which
    except Exception as e:
        raise FlopscopeError(f"cannot fetch {what} from the Hugging Face hub at {endpoint} "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                             f"{instead}") from e


def _env_true(name: str) -> bool:
    # huggingface_hub's reading of a boolean variable ("1", "ON", "YES", "TRUE", any
    # case)
    return os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}


def _unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` gives no HTTP answer within :data:`HUB_PROBE_SECONDS` (one
    request, no retries, through the hub client's own session: its proxies and headers),
    or ``None`` if it answers (any status)."""
    # lazy: only hf:ORG/NAME targets need the hub client
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_PROBE_SECONDS)
    except Exception as e:  # connection refused, no DNS, a timeout: no answer at all
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no answer'}"
    return None


def _config_file(path: Path, head: str, overrides: dict[str, Any], description: str,
                 device: str | None = None
                 ) -> Target:
    """A model built from a ``config.json`` on ``device`` (default ``"meta"``): the
    class its ``architectures`` names (or the ``head``'s auto class), in the config's
    dtype."""
    try:
        import transformers
    except ImportError as e:
        raise FlopscopeError("config targets need transformers (pip install 'torch-flopscope[hf]')") from e
    if not path.is_file():
        raise FlopscopeError(f"no config file at {path}")
    if head not in HF_HEADS:
        raise FlopscopeError(_unknown_head(head))
    _check_config_file(path, transformers)
    try:
        config = transformers.AutoConfig.from_pretrained(str(path.parent) if path.name == "config.json" else
                                                         str(path))
    except Exception as e:
        raise FlopscopeError(f"{path} is not a Hugging Face config transformers can read: {e}") from e
    overrides = _check_overrides(config, overrides, description)
    try:
        for key, value in overrides.items():
            setattr(config, key, value)
    except Exception as e:  # transformers' own validation of the values
        raise UsageError(f"the config of {description} refuses {settings_text(overrides)}: "
                         f"{type(e).__name__}: {e}") from e
    named = [name for name in (getattr(config, "architectures", None) or []) if hasattr(transformers, name)]
    builder = getattr(transformers, named[0]) if named and not head else getattr(transformers, HF_HEADS[head])
    _import_model_of(builder, config)
    with torch.device(device or "meta"):
        model = (builder._from_config(config) if hasattr(builder, "_from_config") else
                 builder.from_config(config)).eval()
    return _target(model, config, description)


def _check_config_file(path: Path, transformers: Any) -> None:
    """A config file is a JSON object with a ``model_type`` (transformers picks the
    config class by it): say what is wrong, and for a missing ``model_type`` the one its
    ``architectures`` imply."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FlopscopeError(f"{path} is not a JSON config file ({type(e).__name__}: {e})") from e
    if not isinstance(doc, dict):
        raise FlopscopeError(f"{path} is not a model config: a JSON object of settings was "
                             f"expected, got a {type(doc).__name__}")
    if doc.get("model_type"):
        return
    implied: dict[str, str] = {}
    for name in doc.get("architectures") or []:
        try:
            model_type = getattr(getattr(transformers, str(name)).config_class, "model_type", None)
        except Exception:  # not a class transformers has, or one without a config class
            continue
        if isinstance(model_type, str) and model_type:
            implied[str(name)] = model_type
    if implied:
        which = ", ".join(f"{name} is {model_type!r}" for name, model_type in implied.items())
        hint = f"; its architectures say which ({which}): add \"model_type\": \"{next(iter(implied.values()))}\""
    else:
        hint = ("; add the model_type of the model it configures (\"llama\", \"mistral\", ...: the "
                "config.json on its model card has it)")
    raise FlopscopeError(f"{path} has no \"model_type\": transformers cannot tell which model it "
                         f"configures{hint}")


def _check_overrides(config: Any, overrides: dict[str, Any], what: str) -> dict[str, Any]:
    """``overrides`` for ``config``: each key one the config has (else the nearest one
    is suggested), each value of the type of its current value
    (:func:`~.settings.typed`)."""
    known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    for key in overrides:
        if key not in known and not hasattr(config, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise FlopscopeError(f"{what} config has no {key!r}{hint}")
    return typed({key: getattr(config, key) for key in overrides if hasattr(config, key)},
                 overrides, what,
                  "the config's")


def _target(model: nn.Module, config: Any, description: str) -> Target:
    text = getattr(model, "main_input_name", "input_ids") == "input_ids"
    positions_key, positions = _position_table(model, config) if text else ("", None)
    return Target(model, description, token_inputs=text,
                  vocab_size=getattr(config, "vocab_size", None),
                  encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
                  positions=positions, positions_key=positions_key)


def _close_head(text: str) -> str | None:
    """The head of :data:`HF_HEADS` that ``text`` is a slip of (``causal_lm``,
    ``Causal-LM``, ``causallm``), or ``None``."""
    written = text.strip().lower().replace("_", "-").replace(" ", "-")
    if written in HF_HEADS and written:
        return written
    close = difflib.get_close_matches(written, [h for h in HF_HEADS if h], n=1, cutoff=0.75)
    return close[0] if close else None


def _unknown_head(head: str) -> str:
    close = _close_head(head)
    hint = f" (did you mean {close!r}?)" if close else ""
    return f"unknown head {head!r}{hint}; one of: {', '.join(h or '(none)' for h in HF_HEADS)}"


def _check_not_a_head(family: str, text: str) -> None:
    """``hf:FAMILY/TEXT`` where TEXT is close to a head's name (``hf:llama/causal_lm``)
    is a slip, not a hub repository ``FAMILY/TEXT``: a
    :class:`~flopscope.errors.FlopscopeError` saying what was meant, before the hub is
    asked."""
    close = _close_head(text.partition("/")[0])
    if close is None:
        return
    try:
        import transformers
    except ImportError:  # no families to know FAMILY by: a hub repository, as written
        return
    if family.lower() in transformers.CONFIG_MAPPING:
        raise FlopscopeError(f"unknown head {text!r} of hf:{family}: did you mean "
                             f"hf:{family.lower()}/{close}? (heads: "
                             f"{', '.join(h for h in HF_HEADS if h)}; hf:ORG/NAME is a model on "
                             "the Hugging Face hub)")


def _unknown_family(family: str, families: Sequence[str]) -> str:
    """The closest few family names, and how to list them all (there are hundreds)."""
    close = difflib.get_close_matches(family.lower(), families, n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else "no family has a similar name"
    return (f"unknown Hugging Face family {family!r}; {hint}. All {len(families)}: "
            "python -c \"import transformers; print(*sorted(transformers.CONFIG_MAPPING))\"")


def _position_table(model: nn.Module, config: Any) -> tuple[str, int | None]:
    """``(config key, rows)`` of the model's learned position table: the config declares
    a position count under a :data:`~flopscope.conventions.POSITIONS` name and an
    ``nn.Embedding`` other than the token table has that many rows (after its
    ``offset``: OPT and BART keep two extra rows). Models whose config declares
    positions but that have no such table (rotary, relative) give ``("", None)``: any
    length runs."""
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


def _check_form(target: Target, shapes: Sequence[tuple[int, ...]], tokens: bool) -> None:
    """Each shape of the form ``target`` takes, else a
    :class:`~flopscope.errors.UsageError` naming that form: token ids are
    ``BATCHxSEQUENCE`` (a Hugging Face model flattens the leading dims of more, without
    a word); an image model with a default input (timm, torchvision) takes that many
    dims and channels."""
    for shape in shapes:
        text = "x".join(map(str, shape))
        if tokens and len(shape) != 2:
            example = "x".join(map(str, shape[:2] if len(shape) > 2 else (1, *shape)))
            raise UsageError(f"--input {text}: {target.description} takes token ids of 2 dims, "
                             f"BATCHxSEQUENCE (e.g. --input {example}), not {len(shape)}")
        form = target.input_shape
        if not tokens and form is not None and (len(shape) != len(form) or (len(form) > 1 and shape[1] != form[1])):
            same_rank = len(shape) == len(form)
            example = "x".join(map(str, (shape[0], form[1], *shape[2:]) if same_rank else form))
            what = "BATCHxCHANNELSxHEIGHTxWIDTH" if len(form) == 4 else f"{len(form)} dims"
            raise UsageError(f"--input {text}: {target.description} takes {what} with {form[1]} "
                             "channels (e.g. --input "
                             f"{example}{'' if same_rank else ', the size its weights were trained at'})")


def make_inputs(target: Target, shapes: Sequence[tuple[int, ...]], dtype: str | None = None
                ) -> Callable[[int | None], tuple[tuple[Any, ...], dict[str, Any]]]:
    """A function of the sequence length (``None``: as given) returning ``(args,
    kwargs)``. The sequence is the last dim of token ids, dim 1 of float inputs. Token
    ids are drawn below the vocabulary size; a sequence of token ids longer than the
    model's learned position table is refused (an :class:`~flopscope.errors.InputError`)
    here for the given shapes and by the returned function for ``n``, before any input
    is built (see :meth:`Target.check_sequence`)."""
    if not shapes:
        shapes = [(1, 128)] if target.token_inputs else [target.input_shape] if target.input_shape else []
    if not shapes:
        raise FlopscopeError("give the input shape with --input (e.g. --input 1x128x512)")
    tokens = target.token_inputs if dtype is None else dtype in ("long", "int64", "int")
    torch_dtype = torch.long if tokens else getattr(torch, dtype or "float32", None)
    if not isinstance(torch_dtype, torch.dtype):
        raise FlopscopeError(f"unknown --dtype {dtype!r}")
    _check_form(target, shapes, tokens)
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
