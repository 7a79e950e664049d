"""The command line: the README's demo runs and checks itself against the closed form."""

from __future__ import annotations

import doctest

import flopscope
from flopscope.cli import main


def test_demo_matches_its_closed_form(capsys):
    n, d, h, d_ff = 64, 32, 4, 128
    assert main(["demo", "--n", str(n), "--d", str(d), "--h", str(h), "--d-ff", str(d_ff)]) == 0
    out = capsys.readouterr().out
    assert f"{n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d:,} MACs: matches" in out
    assert "FLOPs" in out and "unsupported ops: none" in out


def test_package_docstring_examples_run():
    assert doctest.testmod(flopscope, raise_on_error=True).attempted > 0
