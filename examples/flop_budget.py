"""FLOP budgets: hold a model to its closed form, or to a snapshot that fails naming the
roles that changed.

In a test suite (the pytest plug-in is installed with flopscope, nothing to configure):

    from flopscope.testing import assert_macs

    def test_block_cost():
        assert_macs(block, x, expected=4 * n * d * d + 2 * n * n * d + 2 * n * d * d_ff)

    # the plug-in's fixture: a FlopBudget on __flops__/ beside the test file
    def test_block_budget(flops):
        # against __flops__/test_block_budget.json; pytest --flops-update rewrites it
        flops.check(block, x)

This script is not a test, so it makes the fixture's FlopBudget itself, in a temporary
directory.

    python examples/flop_budget.py
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from flopscope.errors import BudgetError
from flopscope.studies.models import TransformerBlock
from flopscope.testing import FlopBudget, assert_macs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--d", type=int, default=256)
    args = parser.parse_args(argv)
    n, d, h, d_ff = args.n, args.d, 4, 4 * args.d
    block, x = TransformerBlock(d, h, d_ff), torch.randn(1, n, d)

    # the closed form: Q, K, V, O projections, scores and weighted sum, the FFN's two
    # GEMMs
    expected = 4 * n * d * d + 2 * n * n * d + 2 * n * d * d_ff
    prof = assert_macs(block, x, expected=expected,
                       roles={"attn_scores": n * n * d, "ffn_up": n * d * d_ff})
    print(f"closed form holds: {prof.total():,} MACs")

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "__flops__"
        # what the flops fixture is, in test_block_budget
        budget = FlopBudget(directory, "test_block_budget")
        budget.check(block, x)  # no baseline yet: written
        budget.check(block, x)  # unchanged: holds
        wider = TransformerBlock(d, h, 2 * d_ff)  # a config change doubles the FFN
        try:
            budget.check(wider, x)
            failure = ""
        except BudgetError as e:  # an AssertionError too: pytest reports a failed test
            failure = str(e)
            print(failure)
        # pytest --flops-update
        FlopBudget(directory, "test_block_budget", update=True).check(wider, x)
        budget.check(wider, x)  # the new baseline holds
        baseline = (directory / "test_block_budget.json").read_text()
    return {"profile": prof, "failure": failure, "baseline": baseline}


if __name__ == "__main__":
    main()
