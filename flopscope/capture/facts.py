"""What a model declares about itself, read before it runs (never from the executed op
shapes).

Reconciliation predicts each role's multiplies from these facts: module types and their
plain attributes (``embed_dim``, ``num_heads``, ``kernel_size``, ``hidden_size`` of an
LSTM, ...), parameter shapes, and the Hugging Face config when the model has one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..conventions import CONFIG_ALIASED, Names
from ..errors import FlopscopeError

Shape = tuple[int, ...]
_PLAIN = (bool, int, float, str)


@dataclass(frozen=True)
class ModelFacts:
    types: Mapping[str, type]  # module path -> class
    # module path -> plain attributes (numbers, strings, tuples)
    attributes: Mapping[str, Mapping[str, Any]]
    param_shapes: Mapping[str, Mapping[str, Shape]]  # module path -> {local parameter name: shape}
    config: Mapping[str, Any] | None = None  # the Hugging Face config as a dict, if any
    params: int = 0  # unique parameters of the model
    embedding_params: int = 0  # parameters of nn.Embedding tables (token and position embeddings)
    # an embedding table is also used as a weight elsewhere (tied LM head)
    tied_embedding: bool = False
    # other name of a shared module -> its path in `types`
    aliases: Mapping[str, str] = field(default_factory=dict)

    def attr(self, path: str, *names: str) -> Any:
        """The first of ``names`` set on the module at ``path`` (``None`` if none is)."""
        values = self.attributes.get(path, {})
        for name in names:
            if values.get(name) is not None:
                return values[name]
        return None

    def declared(self, names: Names, paths: Sequence[str] = (), *,
                 config: bool = True) -> int | None:
        """The first integer a module at ``paths`` declares under ``names.module``
        (paths in order), else (with ``config``) the first the config declares under
        ``names.config`` (see :mod:`flopscope.conventions`)."""
        for path in paths:
            for name in names.module:
                value = self.attributes.get(path, {}).get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
        value = self.config_value(*names.config) if config else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def config_value(self, *names: str) -> Any:
        """The first of ``names`` in the Hugging Face config (or its ``text_config``)."""
        for config in (self.config, (self.config or {}).get("text_config")):
            if isinstance(config, Mapping):
                for name in names:
                    if config.get(name) is not None:
                        return config[name]
        return None


def read_facts(model: nn.Module) -> ModelFacts:
    """The model's facts, read in one walk over its modules (a profile's fixed cost)."""
    types: dict[str, type] = {}
    attributes: dict[str, dict[str, Any]] = {}
    param_shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    unique: dict[int, nn.Parameter] = {}
    lazy: list[str] = []
    embedding: dict[int, int] = {}  # id(table) -> its size (a table two modules share counts once)
    for path, module in model.named_modules():
        types[path] = type(module)
        attributes[path] = {k: v for k, v in vars(module).items() if k[0] != "_" and _is_plain(v)}
        shapes = param_shapes[path] = {}
        for name, p in module._parameters.items():
            if p is None:
                continue
            if isinstance(p, nn.parameter.UninitializedParameter):
                lazy.append(f"{path}.{name}" if path else name)
                continue
            shapes[name] = tuple(p.shape)
            unique[id(p)] = p
        if isinstance(module, nn.Embedding):
            embedding[id(module.weight)] = module.weight.numel()
    if lazy:
        raise FlopscopeError(f"{type(model).__name__} has uninitialized (lazy) parameters "
                             f"({', '.join(lazy[:3])}): run one forward to materialise them, then "
                             "profile")
    return ModelFacts(types=types, attributes=attributes, param_shapes=param_shapes,
                      config=_config(model),
                      params=sum(p.numel() for p in unique.values()),
                      embedding_params=sum(embedding.values()),
                      tied_embedding=_shares_embedding(model), aliases=_aliases(model, len(types)))


def _aliases(model: nn.Module, unique: int) -> dict[str, str]:
    """``{other name: path}`` for every other name a module registered in several places
    has (what ``named_modules(remove_duplicate=False)`` lists: ``submod2.submod`` of
    a module first found as ``submod1.submod``, and its submodules' names under it),
    the path being its first name in that walk, the one ``named_modules()`` gives and
    profiles attribute its calls to (fvcore's canonical name). ``unique``: how many
    modules ``named_modules()`` lists; where each module is registered once
    (registrations = modules - 1), nothing is walked again. A module registered
    inside itself (a child holding its parent) is named there, not walked again."""
    registrations = sum(1 for m in model.modules() for child in m._modules.values() if child is not None)
    if registrations == unique - 1:
        return {}
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    todo: list[tuple[nn.Module, str, frozenset[int]]] = [(model, "", frozenset())]
    # depth first, each module before its children, in order: named_modules' order and
    # first names
    while todo:
        module, path, above = todo.pop()  # above: the modules this path goes through
        canonical = first.setdefault(id(module), path)
        if canonical != path:
            aliases[path] = canonical
        if id(module) in above:  # a module inside itself: named, not walked again
            continue
        inside = above | {id(module)}
        todo.extend(reversed([(child, f"{path}.{name}" if path else name, inside)
                              for name, child in module._modules.items() if child is not None]))
    return aliases


def _shares_embedding(model: nn.Module) -> bool:
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if not tables:
        return False
    owners: dict[int, int] = {}
    # older modules() has no remove_duplicate
    for _, m in model.named_modules(remove_duplicate=False):
        for p in m._parameters.values():
            if p is not None and id(p) in tables:
                owners[id(p)] = owners.get(id(p), 0) + 1
    return any(count > 1 for count in owners.values())


def _config(model: nn.Module) -> dict[str, Any] | None:
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        values = dict(to_dict())
    except Exception:  # a config that cannot serialise itself: keep its plain attributes
        values = {k: v for k, v in vars(config).items() if _is_plain(v)}
    for name in CONFIG_ALIASED:
        # attribute_map aliases (GPT-2's n_embd) are not dict keys
        with contextlib.suppress(AttributeError):
            values.setdefault(name, getattr(config, name))
    return values


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN) or value is None:
        return True
    return isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)
