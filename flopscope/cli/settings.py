"""``--set KEY=VALUE`` settings: a value parsed as a person writes it
(:func:`parse_value`), a list of them as a dict (:func:`parse_settings`), checked
against the types of the values they override (:func:`typed`) and written back as the
command line spells them (:func:`settings_text`)."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import UsageError

__all__ = ["parse_setting", "parse_settings", "parse_value", "settings_text", "typed", "written"]

_TRUE = frozenset({"true", "yes", "on"})
_FALSE = frozenset({"false", "no", "off"})
_NONE = frozenset({"none", "null"})


def parse_value(text: str) -> Any:
    """A ``--set`` value as a person writes it: ``true`` / ``yes`` / ``on`` and
    ``false`` / ``no`` / ``off`` (any case) are booleans, ``none`` / ``null`` is
    ``None``, ``2`` an int, ``0.1`` / ``1e-5`` a float, a Python literal (``[1, 2]``,
    ``'text'``) that literal, anything else the text itself (``gelu``)."""
    text = text.strip()
    lowered = text.lower()
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    if lowered in _NONE:
        return None
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def parse_setting(item: str) -> tuple[str, Any]:
    """``"n_layer=2"`` -> ``("n_layer", 2)`` (:func:`parse_value`); an item that is not
    ``KEY=VALUE`` is a :class:`~flopscope.errors.UsageError` naming it and the form."""
    key, equals, value = item.partition("=")
    if not equals or not key.strip():
        raise UsageError(f"--set takes KEY=VALUE (e.g. --set num_hidden_layers=2); got {item!r}")
    return key.strip(), parse_value(value)


def parse_settings(settings: Sequence[str]) -> dict[str, Any]:
    """``["n_layer=2", "use_cache=false"]`` -> ``{"n_layer": 2, "use_cache": False}``
    (:func:`parse_setting`)."""
    return dict(parse_setting(item) for item in settings)


def _type_name(value: Any) -> str:
    """The type a setting's value must have, as the error names it."""
    return ("a boolean (true or false)" if isinstance(value, bool) else "an integer" if isinstance(value, int)
            else "a number" if isinstance(value, float) else f"a {type(value).__name__}")


def typed(current: Mapping[str, Any], overrides: Mapping[str, Any], what: str,
          source: str = "its default"
           ) -> dict[str, Any]:
    """``overrides`` checked against the type of each key's current value (a config's, a
    factory's default) where that is a boolean, an integer or a float: a value of
    another type is a :class:`~flopscope.errors.UsageError` naming the key, the value
    and the type expected; an integer for a float key becomes that float (``1`` for
    ``rms_norm_eps``). ``source``: what the current values are, as the error names
    them."""
    out = dict(overrides)
    for key, value in overrides.items():
        # None: the key's "unset" (its own error, if any, from the config)
        if key not in current or value is None:
            continue
        old = current[key]
        if isinstance(old, bool):
            ok = isinstance(value, bool)
        elif isinstance(old, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(old, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok:
                out[key] = float(value)
        else:
            continue
        if not ok:
            raise UsageError(f"--set {key}={written(value)}: {key} of {what} takes "
                             f"{_type_name(old)}, not {value!r} (e.g. --set {key}={written(old)}, "
                             f"{source})")
    return out


def settings_text(overrides: Mapping[str, Any]) -> str:
    """``--set a=1 --set b=true``."""
    return " ".join(f"--set {key}={written(value)}" for key, value in overrides.items())


def written(value: Any) -> str:
    """A value as it is written on the command line (``true``, ``2``, ``1e-05``,
    ``none``)."""
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
