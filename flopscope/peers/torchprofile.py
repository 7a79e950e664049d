"""torchprofile (``torchprofile.profile_macs``): its runner for
:func:`~.common.crosscheck`.

torchprofile counts **MACs** on a TorchScript trace (``torch.jit._get_trace_graph``): a
handler per TorchScript op (``aten::linear``, ``aten::matmul``, ``aten::bmm``,
``aten::_convolution``, ``aten::scaled_dot_product_attention``, ``aten::lstm``, ...),
and it warns ``No handlers found`` for an op it does not know (counted 0). Its handlers
also count elementwise products (``aten::mul``: one MAC per output element), means and
poolings, and norms. Its trace takes no keyword arguments (bound into a copy's
``forward`` here) and no ``FakeTensorMode``. Its nodes carry no module scope, so the
evidence is per op: its count per op group (matrix products, convolution, attention,
recurrent, else the op) against flopscope's records of the caller's run (flopscope
cannot follow a traced run: sizes are traced values there).
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from typing import Any, cast

from torch import nn

from ..formulas.registry import OpFamily
from ..profile import OpRecord, Profile
from .common import Difference, PeerCount, copy_for, ordered, sum_roles
from .fvcore import op_family, torchscript_name

TOOL = "torchprofile"
_GROUPS = {OpFamily.MATMUL: "matrix products", OpFamily.GROUPED_MATMUL: "matrix products",
           OpFamily.CONV: "convolution", OpFamily.ATTENTION: "attention",
           OpFamily.RECURRENT: "recurrent"}
_NO_HANDLER = re.compile(r'No handlers found: "([^"]+)"')


def _group(op: str) -> str:
    """``"aten::linear"`` / ``"aten.mm"`` -> ``"matrix products"``; an SDPA op of either
    naming -> ``"attention"``; an op of no such family -> its TorchScript name
    (``"aten::mul"``)."""
    family = op_family(op)
    return _GROUPS[family] if family in _GROUPS else torchscript_name(op)


def _run_torchprofile(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                      prof: Profile,
                      plugins: bool) -> PeerCount:
    """``profile_macs(copy, args, reduction=None)`` with flopscope counting the traced
    run; per op group, its MACs against flopscope's (module docstring). ``plugins``:
    it has none."""
    from torchprofile import profile_macs

    twin = copy_for(model, kwargs)
    # flopscope does not follow this run: under TorchScript tracing sizes are traced
    # values and torch's dispatch of the trace differs (a convolution is not recorded),
    # so the comparison is with the caller's run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # reduction=None: per node
        nodes = cast(dict[Any, int], profile_macs(twin, args, reduction=None))
    unsupported = Counter(m.group(1) for w in caught if (m := _NO_HANDLER.search(str(w.message))))
    by_op: Counter[str] = Counter()
    for node, macs in nodes.items():
        by_op[node.operator] += int(macs)
    total = sum(by_op.values())

    theirs: Counter[str] = Counter()
    names: dict[str, set[str]] = {}
    for op, macs in by_op.items():
        theirs[_group(op)] += macs
        names.setdefault(_group(op), set()).add(op)
    mine: dict[str, list[OpRecord]] = {}
    for record in prof.records:
        mine.setdefault(_group(record.op), []).append(record)
        names.setdefault(_group(record.op), set()).add(record.op)
    for op in unsupported:
        names.setdefault(_group(op), set()).add(op)

    differences: list[Difference] = []
    for group in [*mine, *(g for g in theirs if g not in mine)]:
        records = mine.get(group, [])
        counted, executed = theirs.get(group, 0), sum(r.multiplies for r in records)
        if counted == executed:
            continue
        ops = ", ".join(sorted(names[group]))
        missed = sorted(op for op in unsupported if _group(op) == group)
        no_handler = f"no handler for {', '.join(missed)}" if missed else ""
        if executed == 0:
            differences.append(Difference(TOOL, "extra", counted,
                                          f"{ops}: counted as MACs, elementwise work "
                                          "that is not multiply-accumulates"))
        elif counted == 0:
            differences.append(Difference(TOOL, "missing", -executed,
                                          no_handler or f"it counts none of {ops}",
                                          sum_roles(records)))
        else:
            reason = f"its handlers give {counted:,} MACs of {group}, flopscope's formulas {executed:,} ({ops})"
            differences.append(Difference(TOOL, "under" if counted < executed else "over",
                                          counted - executed,
                                          reason + (f"; {no_handler}" if no_handler else ""),
                                          sum_roles(records)))
    return PeerCount(TOOL, total, prof.total(), by_op=dict(by_op), differences=ordered(differences),
                     unsupported=dict(unsupported) or None)
