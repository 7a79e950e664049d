"""The pytest plug-in (registered by the ``pytest11`` entry point, so installing
flopscope is all it takes).

- the ``flops`` fixture: a :class:`flopscope.testing.FlopBudget` whose snapshots live in
  ``__flops__/`` next to the test file, one JSON file per test (``<test name>.json``);
- ``pytest --flops-update``: rewrite the snapshots from this run's counts instead of
  comparing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .budgets import FlopBudget


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flopscope", "FLOP budgets (flopscope)")
    group.addoption("--flops-update", action="store_true", default=False,
                    help="rewrite the __flops__/*.json snapshots of flops.check() from this run's "
                         "counts")


@pytest.fixture
def flops(request: pytest.FixtureRequest) -> FlopBudget:
    """FLOP budgets for this test: ``flops.check(model, *inputs)`` against
    ``__flops__/<test name>.json``."""
    directory = Path(str(request.path)).parent / "__flops__"
    name = re.sub(r"[^\w.-]+", "_", request.node.name)  # parametrised ids become file-name safe
    return FlopBudget(directory, name, update=bool(request.config.getoption("--flops-update")))
