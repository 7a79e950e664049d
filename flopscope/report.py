"""Pure renderers: a profile in, text out (never printing). Units are always named."""

from __future__ import annotations

from tabulate import tabulate

from .profile import Profile

PREFIXES = ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K"))


def human(value: int, unit: str) -> str:
    """``1234567890, "MAC"`` -> ``"1.23 GMAC"``."""
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value} {unit}"


def module_table(prof: Profile, depth: int = 2, tablefmt: str = "simple") -> str:
    """Inclusive MACs and FLOPs per module, down to ``depth`` levels below the root."""
    total = prof.total() or 1
    rows = []
    for path, macs in prof.by_module().items():
        level = 0 if path == "" else path.count(".") + 1
        if level > depth:
            continue
        name = "(model)" if path == "" else "· " * level + path.rsplit(".", 1)[-1]
        rows.append([name, f"{macs:,}", human(2 * macs, "FLOP"), f"{100 * macs / total:.1f}%"])
    return tabulate(rows, headers=["module", "MACs", "FLOPs", "share"], tablefmt=tablefmt,
                    colalign=("left", "right", "right", "right"))


def op_table(prof: Profile, tablefmt: str = "simple") -> str:
    """MACs per ATen op, largest first, with the number of calls."""
    total = prof.total() or 1
    calls = prof.op_calls()
    rows = [[op, calls[op], f"{macs:,}", human(2 * macs, "FLOP"), f"{100 * macs / total:.1f}%"]
            for op, macs in sorted(prof.by_op().items(), key=lambda kv: -kv[1])]
    return tabulate(rows, headers=["ATen op", "calls", "MACs", "FLOPs", "share"], tablefmt=tablefmt,
                    colalign=("left", "right", "right", "right", "right"))


def where(paths: list[str], limit: int = 3) -> str:
    """Module paths summarised as patterns: ``layers.0.attn``, ``layers.1.attn`` -> ``layers.*.attn (x2)``."""
    patterns: dict[str, int] = {}
    for path in paths:
        pattern = ".".join("*" if part.isdigit() else part for part in path.split(".")) if path else "(model)"
        patterns[pattern] = patterns.get(pattern, 0) + 1
    shown = [f"{p} (x{n})" if n > 1 else p for p, n in list(patterns.items())[:limit]]
    more = len(patterns) - limit
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def role_table(prof: Profile, tablefmt: str = "simple") -> str:
    """Role | MACs | FLOPs | share of total | where (the blocks it occurs in)."""
    total = prof.total() or 1
    blocks: dict[str, list[str]] = {}
    for block, roles in prof.by_block().items():
        for role, macs in roles.items():
            if macs:
                blocks.setdefault(role, []).append(block)
    rows = [[role, f"{macs:,}", human(2 * macs, "FLOP"), f"{100 * macs / total:.1f}%", where(blocks.get(role, []))]
            for role, macs in prof.by_role().items()]
    return tabulate(rows, headers=["role", "MACs", "FLOPs", "share", "where"], tablefmt=tablefmt,
                    colalign=("left", "right", "right", "right", "left"))


def summary(prof: Profile, depth: int = 2, tablefmt: str = "simple") -> str:
    """Totals, the module table, the op table, elementwise work and unsupported ops."""
    lines = [
        f"total: {prof.total():,} MACs = {prof.total_flops():,} FLOPs ({human(prof.total_flops(), 'FLOP')}; "
        f"1 MAC = 2 FLOPs), counted in {prof.mode} mode",
        "",
        role_table(prof, tablefmt),
        "",
        module_table(prof, depth, tablefmt),
        "",
        op_table(prof, tablefmt),
    ]
    elementwise = prof.elementwise()
    if elementwise:
        parts = ", ".join(f"{k} {v:,}" for k, v in sorted(elementwise.items()))
        lines += ["", f"elementwise ops (not MACs, not in the total): {parts}"]
    unsupported = prof.unsupported()
    lines += ["", "unsupported ops: " + (", ".join(f"{op} x{n}" for op, n in sorted(unsupported.items()))
                                         if unsupported else "none")]
    lines += [f"note: {note}" for note in prof.notes]
    return "\n".join(lines)
