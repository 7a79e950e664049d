"""Validators for the arguments of flopscope's own functions: one function per rule, each raising a
:class:`~flopscope.errors.ConfigurationError` that names the argument and its value."""

from __future__ import annotations

from .errors import ConfigurationError


def check_positive(**values: int) -> None:
    """Every named value is an integer >= 1 (``check_positive(n=n, d=d)``)."""
    for name, value in values.items():
        if value < 1:
            raise ConfigurationError(f"{name} must be >= 1; got {value}")


def check_heads(d: int, h: int) -> None:
    """``h`` heads split the width ``d`` evenly (each head is ``d / h`` wide)."""
    check_positive(d=d, h=h)
    if d % h:
        raise ConfigurationError(f"d={d} must be divisible by h={h} (heads split the width)")
