"""Diffusers pipelines built from their configs alone, on ``device="meta"`` by default:
no weights, nothing allocated.

:func:`pipeline_from_configs` reads a pipeline folder's ``model_index.json`` (a local
folder, or a hub repo of which only the JSON and tokenizer files are fetched, failing
fast offline as ``hf:`` targets do) and builds each component: diffusers models and
transformers models from their ``config.json`` on the device, schedulers from their
``scheduler_config.json``, tokenizers from their files. A tokenizer whose vocabulary
files are missing (a configs-only download, an empty folder) or cannot be read offline
is replaced by a :class:`ShapeTokenizer`: a text encoder's work depends only on how many
tokens it reads, and the pipelines pad prompts to a fixed length (77 for CLIP, 256 or
512 for T5), which the stand-in keeps (``--set tokenizer.model_max_length=N`` sets it).
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import FlopscopeError

CONFIG_PATTERNS = ("model_index.json", "*/config.json", "*/scheduler_config.json",
                   "*/tokenizer_config.json",
                   "*/special_tokens_map.json", "*/tokenizer.json", "*/vocab.json", "*/merges.txt",
                   "*/spiece.model",
                   "*/preprocessor_config.json")
"""The files fetched from the hub for a pipeline built from configs: no weights."""

DEFAULT_TEXT_LENGTH = 77
"""A stand-in tokenizer's length where its ``tokenizer_config.json`` gives none
(CLIP's)."""

UNPADDED_LENGTH = 8
"""Tokens a stand-in tokenizer gives a prompt where a pipeline asks for no padding
(``padding="longest"``)."""


class ShapeTokenizer:
    """A stand-in tokenizer that gives every prompt ``model_max_length`` tokens of id
    ``token`` where a pipeline pads to a length (``padding="max_length"``), and
    :data:`UNPADDED_LENGTH` tokens otherwise; attention masks of ones. Only the
    shapes matter for counting a text encoder; the ids are not a tokenization of the
    prompt."""

    def __init__(self, model_max_length: int = DEFAULT_TEXT_LENGTH, token: int = 0,
                 name: str = "tokenizer") -> None:
        self.model_max_length = model_max_length
        self.token = token
        self.name = name
        self.added_tokens_encoder: dict[str, int] = {}
        self.pad_token_id = token

    def __call__(self, text: str | Sequence[str], padding: bool | str = False,
                 max_length: int | None = None,
                 return_tensors: str | None = None, **kwargs: Any) -> Any:
        from transformers import BatchEncoding

        batch = 1 if isinstance(text, str) else len(text)
        length = (max_length or self.model_max_length) if padding == "max_length" else min(
            UNPADDED_LENGTH, max_length or UNPADDED_LENGTH)
        ids = torch.full((batch, length), self.token, dtype=torch.long)
        return BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return text.split()

    def batch_decode(self, ids: Any, **kwargs: Any) -> list[str]:
        return ["" for _ in range(len(ids))]

    def __repr__(self) -> str:
        return f"ShapeTokenizer({self.name}, model_max_length={self.model_max_length})"


def pipeline_from_configs(source: str | Path, device: str = "meta",
                          overrides: Mapping[str, Any] | None = None
                          ) -> Any:
    """The diffusers pipeline of ``source`` (a folder with ``model_index.json``, or a
    hub repo id) with every component built from its config on ``device`` (default
    ``"meta"``: no weights). ``overrides``: ``{"component.key": value}`` config
    values to change before building (``{"transformer.num_layers": 2}``)."""
    try:
        import diffusers
    except ImportError as e:
        raise FlopscopeError("diffusers: targets need diffusers (pip install "
                             "'torch-flopscope[diffusers]')") from e
    folder = _pipeline_folder(str(source))
    index = json.loads((folder / "model_index.json").read_text())
    name = index.get("_class_name")
    pipeline_class = getattr(diffusers, name, None) if isinstance(name, str) else None
    if pipeline_class is None:
        raise FlopscopeError(f"{folder / 'model_index.json'} names pipeline class {name!r}, which "
                             f"diffusers {diffusers.__version__} does not have")
    wanted = inspect.signature(pipeline_class.__init__).parameters
    changes = _split_overrides(overrides or {}, index)
    components = {}
    for component, entry in index.items():
        if component.startswith("_") or component not in wanted:
            continue
        library, class_name = entry if isinstance(entry, (list, tuple)) and len(entry) == 2 else (None, None)
        components[component] = (None if library is None or class_name is None else
                                 _component(folder / component, component, str(library),
                                            str(class_name), device,
                                            changes.get(component, {})))
    return pipeline_class(**components)


def _pipeline_folder(source: str) -> Path:
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise FlopscopeError(f"{path} has no model_index.json: give a diffusers pipeline "
                                 "folder or hub repo")
        return path
    if source.count("/") != 1 or path.exists():
        raise FlopscopeError(f"{source!r} is neither a pipeline folder nor a hub repo id (ORG/NAME)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise FlopscopeError("diffusers:ORG/NAME targets need huggingface_hub") from e
    offline = any(os.environ.get(v, "").upper() in {"1", "ON", "YES", "TRUE"}
                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    try:
        return Path(snapshot_download(source, allow_patterns=list(CONFIG_PATTERNS),
                                      local_files_only=offline))
    except Exception as e:  # offline without a cached copy, a gated or missing repo, no connection
        raise FlopscopeError(f"cannot fetch the configs of {source!r} ({type(e).__name__}"
                             f"{': HF_HUB_OFFLINE is set and the cache has no copy' if offline else ''}); download "
                             "model_index.json and the components' config files yourself and pass "
                             "the folder") from e


def _split_overrides(overrides: Mapping[str, Any],
                     index: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        component, _, name = key.partition(".")
        if not name or component not in index or component.startswith("_"):
            raise FlopscopeError(f"--set {key}: write COMPONENT.KEY=VALUE with a component of the "
                                 "pipeline "
                                 f"({', '.join(k for k in index if not k.startswith('_'))})")
        out.setdefault(component, {})[name] = value
    return out


def _component(folder: Path, name: str, library: str, class_name: str, device: str,
               changes: Mapping[str, Any]) -> Any:
    try:
        module = __import__(library)
    except ImportError as e:
        raise FlopscopeError(f"component {name!r} is a {library}.{class_name}: install {library}") from e
    cls = getattr(module, class_name, None)
    if cls is None:
        raise FlopscopeError(f"component {name!r}: {library} has no class {class_name!r}")
    if "Tokenizer" in class_name:
        return _tokenizer(folder, name, cls, changes)
    if class_name.endswith(("ImageProcessor", "FeatureExtractor", "Processor")):
        try:
            return cls.from_pretrained(str(folder))
        except Exception:  # (files missing: an image encoder's processor is not needed to count)
            return None
    if library == "diffusers" and hasattr(cls, "from_config") and "Scheduler" in class_name:
        return cls.from_config({**cls.load_config(str(folder)), **changes})
    if library == "diffusers":
        config = {**cls.load_config(str(folder)), **changes}
        with torch.device(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls.from_config(config).eval()
    if library == "transformers":
        import transformers

        config = transformers.AutoConfig.from_pretrained(str(folder), **changes)
        with torch.device(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(config).eval()
    raise FlopscopeError(f"component {name!r}: cannot build a {library}.{class_name} from its "
                         "config")


def _tokenizer(folder: Path, name: str, cls: Any, changes: Mapping[str, Any]) -> Any:
    """The tokenizer from its files, else (none of the vocabulary files its class names,
    such as an empty folder, or files it cannot read) a :class:`ShapeTokenizer` of the
    length its config gives. ``changes``: ``model_max_length`` only (``--set
    tokenizer.model_max_length=77``), the length prompts are padded to. A tokenizer read
    from its files without a ``model_max_length`` (transformers' placeholder, about
    1e30) is a :class:`~flopscope.errors.FlopscopeError` naming the fix: the pipeline
    pads prompts to it."""
    unknown = [key for key in changes if key != "model_max_length"]
    if unknown:
        raise FlopscopeError(f"--set {name}.{unknown[0]}: a tokenizer takes only "
                             f"{name}.model_max_length (the length prompts are padded to)")
    wanted = changes.get("model_max_length")
    if wanted is not None and not (isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > 0):
        raise FlopscopeError(f"--set {name}.model_max_length={wanted!r}: give a positive number of "
                             "tokens (CLIP's is 77, T5's 512)")
    files = [str(file) for file in (getattr(cls, "vocab_files_names", None) or {}).values()]
    tokenizer = None
    if not files or any((folder / file).is_file() for file in files):
        try:
            tokenizer = cls.from_pretrained(str(folder))
        except Exception:  # files it cannot read, or a tokenizer library missing
            tokenizer = None
    if tokenizer is not None:
        if wanted is not None:
            tokenizer.model_max_length = wanted
        length = getattr(tokenizer, "model_max_length", None)
        if not (isinstance(length, int) and 0 < length < _UNSET_LENGTH):
            raise FlopscopeError(f"the tokenizer {name!r} in {folder} has no model_max_length (it "
                                 f"reads {length!r}, transformers' placeholder for none), the "
                                 "length the pipeline pads prompts to: add \"model_max_length\" "
                                 f"to {folder / 'tokenizer_config.json'}, or --set "
                                 f"{name}.model_max_length=N (CLIP's is 77, T5's 512)")
        return tokenizer
    length = DEFAULT_TEXT_LENGTH
    config = folder / "tokenizer_config.json"
    if config.is_file():
        found = json.loads(config.read_text()).get("model_max_length")
        if isinstance(found, int) and 0 < found < _UNSET_LENGTH:
            length = found
    return ShapeTokenizer(wanted or length, name=name)


_UNSET_LENGTH = 1_000_000
"""A tokenizer's ``model_max_length`` from this on is no length: transformers puts about
1e30 where none is set."""
