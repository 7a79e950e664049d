"""Sweep every timm model and compare flopscope with a reference.

For each name in ``timm.list_models()`` (no pretrained weights; nothing is downloaded), the script

1. builds the model on the ``meta`` device to read its parameter count and ``pretrained_cfg["input_size"]``;
   a model with at most ``--max-params`` parameters is then built for real on the CPU
   (``timm.create_model(name, pretrained=False)``, default config, ``eval()``), a bigger one is kept on
   ``meta`` (everything below then runs on meta tensors: no weights, no compute);
2. counts, all on the same model and input (``randn(1, *input_size)``):

   - ``flopscope``: ``flopscope.profile(model, x, mode="auto")`` under ``torch.no_grad()`` with the model as
     built (timm's fused attention, i.e. ``F.scaled_dot_product_attention``, and oneDNN enabled): MACs,
     ``by_role()`` (and whether it sums to ``total()``), whether attention was found (``attn_scores`` > 0),
     ``unsupported()`` ops, a fall-back to real mode (and the warning's reason), or the flopscope error;
   - ``reference``: ``torch.utils.flop_counter.FlopCounterMode`` total // 2 on the math / eager path: every
     module's ``fused_attn`` flag set to ``False`` (timm reads ``use_fused_attn()`` once, in ``__init__``, so
     ``timm.layers.set_fused_attn(False)`` would only affect models built after it; the script flips the
     attribute on the built model), ``sdpa_kernel(SDPBackend.MATH)`` for the remaining unconditional SDPA
     calls, ``torch.backends.mkldnn.flags(enabled=False)`` and grad mode on (falls back to ``no_grad`` if the
     model only runs without). If flopscope counted more than ``--max-macs``, the reference runs on a meta
     copy of the model (FlopCounterMode only reads shapes), so that nothing huge is computed on the CPU;
   - ``flopscope-eager`` (only when flopscope and the reference differ): ``flopscope.profile`` in the
     reference configuration, so ``fs-eager != reference`` isolates formula differences and
     ``flopscope != fs-eager`` isolates the handling of fused kernels.

   "Attention ops seen by the reference" means FlopCounterMode counted a ``bmm``, ``baddbmm`` or an SDPA op
   (a product of two batched activations); for those models the report says whether flopscope found
   attention (``attn_scores`` > 0 in ``by_role()``).

Each model runs in its own process, forked from a warmed-up parent, under ``signal.alarm(--timeout)``
(``zoo_runner.sweep``, shared with ``benchmarks/zoo.py``), so one hang or crash does not stop the sweep.

Usage::

    python benchmarks/timm_zoo.py [--only 'vit_*,resnet50'] [--limit N] [--jobs N] [--timeout S]
                                  [--report PATH] [--json PATH] [--quiet]

``--limit N`` takes N names evenly spaced through the sorted list (every k-th name), so that a sample covers
the families. timm imports torchvision; both must be installed. Writes a markdown report (default
``benchmarks/timm_zoo_report.md``) and prints a summary.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the flopscope checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_runner
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import zoo_runner as runner  # after the paths are set

# ops through which FlopCounterMode sees a product of two batched activations (attention, mostly)
REF_ATTENTION_OPS = ("aten.bmm", "aten.baddbmm")
ATTENTION_ROLES = ("q_proj", "k_proj", "v_proj", "out_proj", "attn_scores", "attn_weighted_sum")


def _ref_batched(by_op: dict[str, int]) -> int:
    """MACs of the reference's batched activation products (bmm, baddbmm, SDPA)."""
    return sum(v for op, v in by_op.items() if op in REF_ATTENTION_OPS or "scaled_dot_product" in op)


def _ref_sees_attention(by_op: dict[str, int]) -> bool:
    return _ref_batched(by_op) > 0


def _attention_coverage(r: dict[str, Any]) -> float | None:
    """flopscope's attn_scores + attn_weighted_sum over the reference's bmm / baddbmm / SDPA MACs."""
    fs, ref = r.get("fs", {}), r.get("ref", {})
    if "macs" not in fs or "by_op" not in ref or not _ref_batched(ref["by_op"]):
        return None
    core = sum(fs.get("by_role", {}).get(k, 0) for k in ("attn_scores", "attn_weighted_sum"))
    return core / _ref_batched(ref["by_op"])


# --------------------------------------------------------------------------------------------------
# one model (runs in its own process)
# --------------------------------------------------------------------------------------------------
def _unfuse(model: Any) -> int:
    """Set every ``fused_attn`` flag of the model to ``False``; the number of modules changed."""
    n = 0
    for m in model.modules():
        if getattr(m, "fused_attn", None) is True:
            m.fused_attn = False
            n += 1
    return n


def _create(name: str, meta: bool) -> Any:
    import timm
    import torch
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False).eval()
    return timm.create_model(name, pretrained=False).eval()


def run_model(name: str, family: str, timeout: int, max_params: int, max_macs: int,
              invariant_macs: int = 0) -> dict[str, Any]:
    res: dict[str, Any] = {"model": name, "family": family, "status": "skip"}

    def timeout_reason(r: dict[str, Any]) -> str:
        macs = r.get("fs", {}).get("macs")
        return f"over {timeout} s in stage {r.get('stage')}" + (
            f" (flopscope total {macs:,} MACs)" if isinstance(macs, int) else "")

    with runner.guarded(res, timeout, timeout_reason):
        _count(res, name, max_params, max_macs, invariant_macs)
    return res


def _count(res: dict[str, Any], name: str, max_params: int, max_macs: int, invariant_macs: int) -> None:
    import torch
    res["stage"] = "build"
    try:
        meta = _create(name, meta=True)
    except Exception as e:
        res["reason"] = f"build (meta): {runner.short(e, 250)}"
        return
    res["params"] = n = sum(p.numel() for p in meta.parameters())
    cfg = getattr(meta, "pretrained_cfg", None) or {}
    size = tuple(cfg.get("input_size") or (3, 224, 224))
    res["input"] = [1, *size]
    if n > max_params:
        model, device = meta, "meta"
        res["device"] = "meta"
        res["device_reason"] = f"{n / 1e6:.0f}M parameters > {max_params / 1e6:.0f}M"
    else:
        del meta
        try:
            model = _create(name, meta=False)
        except Exception as e:
            res["reason"] = f"build: {runner.short(e, 250)}"
            return
        device = "cpu"
        res["device"] = "cpu"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, *size, generator=gen).to(device)
    # 1. flopscope, model as built (fused attention), inference
    with torch.no_grad():
        fs = runner.profile_record(model, (x,), {}, False, res, "fs")
        if device == "cpu" and isinstance(fs.get("macs"), int) and fs["macs"] <= invariant_macs:
            runner.invariants_record(model, (x,), {}, res)  # (several real runs: small models only)
    # 2. reference: unfused attention, math SDPA, no oneDNN, grad on
    ref_model, ref_x = model, x
    res["unfused_modules"] = _unfuse(model)
    if device == "cpu" and isinstance(fs.get("macs"), int) and fs["macs"] > max_macs:
        res["ref_device"] = "meta"
        res["ref_device_reason"] = f"{fs['macs'] / 1e9:.0f} GMACs > {max_macs / 1e9:.0f}G"
        try:
            ref_model = _create(name, meta=True)
            _unfuse(ref_model)
            ref_x = x.to("meta")
        except Exception as e:
            res["ref"] = {"error": f"meta copy: {runner.short(e, 250)}"}
    else:
        res["ref_device"] = device
    res["stage"] = "reference"
    with runner.eager_context():
        if "ref" not in res:
            try:
                res["ref"] = runner.reference(ref_model, (ref_x,), {})
            except Exception as e:
                res["ref"] = {"error": runner.short(e, 300)}
        res["status"] = classify(res)
        # 3. flopscope on the reference configuration, to tell formula from fused-kernel differences
        if res["status"] == "mismatch":
            runner.profile_record(model, (x,), {}, True, res, "fs_eager")
    if res["status"] == "skip":
        res["reason"] = f"forward fails (flopscope and reference): {res['ref']['error']}"


def classify(res: dict[str, Any]) -> str:
    fs, ref = res.get("fs", {}), res.get("ref", {})
    if "error" in fs and "error" in ref:
        return "skip"  # the model does not run on this input: not flopscope's business
    if "error" in fs:
        return "error"
    if "error" in ref:
        return "ref-error"
    return "exact" if fs["macs"] == ref["macs"] else "mismatch"


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def models() -> list[tuple[str, str]]:
    """``(name, family)`` for every ``timm.list_models()`` name; the family is its timm module."""
    import timm
    family = {}
    for module in timm.list_modules():
        for name in timm.list_models(module=module):
            family[name] = module
    return [(name, family.get(name, "?")) for name in timm.list_models()]


def _progress(res: dict[str, Any]) -> str:
    fs, ref = res.get("fs", {}), res.get("ref", {})
    extra = res.get("reason", "") if res["status"] in ("skip", "timeout", "crash") else \
        f"fs {runner.fmt(fs.get('macs'))} ref {runner.fmt(ref.get('macs'))}"
    return f"{res['model']:<48} {res['status']:<9} {res.get('seconds', 0):6.1f}s  {extra}"[:208]


def sweep(tasks: list[tuple[str, str]], jobs: int, timeout: int, max_params: int, max_macs: int,
          progress: bool = True, invariant_macs: int = 0) -> list[dict[str, Any]]:
    run = functools.partial(run_model, timeout=timeout, max_params=max_params, max_macs=max_macs,
                            invariant_macs=invariant_macs)
    warm_up = functools.partial(run, "vit_tiny_patch16_224", "vision_transformer")  # imports, first calls: once
    return runner.sweep(tasks, jobs, run, timeout, ("model", "family"), _progress if progress else None, warm_up)


def select(all_models: list[tuple[str, str]], only: str | None, limit: int | None) -> list[tuple[str, str]]:
    chosen = all_models
    if only:
        patterns = [p.strip() for p in only.split(",") if p.strip()]
        chosen = [(n, f) for n, f in all_models if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        missing = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n, _ in all_models)]
        if missing:
            print(f"no timm model matches: {', '.join(missing)}", file=sys.stderr)
    if limit and limit < len(chosen):
        step = len(chosen) / limit  # evenly spaced through the sorted list: every family gets its share
        chosen = [chosen[int(i * step)] for i in range(limit)]
    return chosen


# --------------------------------------------------------------------------------------------------
# grouping and report
# --------------------------------------------------------------------------------------------------
SECTIONS = (("Unsupported ops (models hitting each)", "unsupported"),
            ("Fake-mode fallbacks to real mode", "fallbacks"), ("flopscope errors", "errors"),
            ("Reference errors", "ref_errors"), ("Skipped / timed out / crashed", "skips"))
PRINTED_SECTIONS = (("unsupported ops", "unsupported"), ("fake-mode fallback reasons", "fallbacks"),
                    ("flopscope errors", "errors"), ("reference errors", "ref_errors"), ("skip reasons", "skips"))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    s = runner.summarize(results, "model", errors_of_skips=False)
    ref_errors: dict[str, list[str]] = defaultdict(list)
    attn_yes, attn_no, attn_extra, attn_partial = [], [], [], []
    meta_models, meta_refs = [], []
    for r in results:
        a = r["model"]
        if r.get("device") == "meta":
            meta_models.append(a)
        elif r.get("ref_device") == "meta":
            meta_refs.append(a)
        fs, ref = r.get("fs", {}), r.get("ref", {})
        if r["status"] == "ref-error":
            ref_errors[runner.norm(ref.get("error", "?"))].append(a)
        if "macs" in fs and "by_op" in ref:
            if _ref_sees_attention(ref["by_op"]):
                (attn_yes if fs.get("attention") else attn_no).append(a)
                cov = _attention_coverage(r)
                if fs.get("attention") and cov is not None and cov < 0.999:
                    attn_partial.append(a)
            elif fs.get("attention"):
                attn_extra.append(a)
    return {**s, "ref_errors": ref_errors, "attn_yes": attn_yes, "attn_no": attn_no, "attn_extra": attn_extra,
            "attn_partial": attn_partial, "meta_models": meta_models, "meta_refs": meta_refs}


def _attn_cell(r: dict[str, Any]) -> str:
    fs, ref = r.get("fs", {}), r.get("ref", {})
    if "macs" not in fs or "by_op" not in ref:
        return "–"
    sees = _ref_sees_attention(ref["by_op"])
    if sees:
        return "yes" if fs.get("attention") else "**no**"
    return "yes (ref: no bmm)" if fs.get("attention") else "n/a"


def _other_share(fs: dict[str, Any]) -> str:
    if not fs.get("macs") or "by_role" not in fs:
        return "–"
    return f"{100 * fs.get('by_role', {}).get('other', 0) / fs['macs']:.1f}%"


def write_report(results: list[dict[str, Any]], path: Path, elapsed: float, args: argparse.Namespace,
                 n_all: int, sampled: bool) -> None:
    import timm
    import torch
    s = summarize(results)
    st = s["status"]
    built = len(results) - sum(1 for r in results if r["status"] == "skip"
                               and str(r.get("reason", "")).startswith("build"))
    counted = st.get("exact", 0) + st.get("mismatch", 0)
    scope = (f"**A sample of {len(results)} of the {n_all} models** of `timm.list_models()` "
             f"({'every k-th name of the sorted list' if args.limit else 'selected with --only'}); "
             f"to run all of them: `python benchmarks/timm_zoo.py --jobs 2 --json timm_zoo.json`."
             if sampled else f"All {n_all} models of `timm.list_models()`.")
    cmd = "python benchmarks/timm_zoo.py " + " ".join(
        a if " " not in a else repr(a) for a in (args.argv or []))
    lines = ["# flopscope timm zoo sweep", "", scope, "",
             f"timm {timm.__version__}, torch {torch.__version__}; {args.jobs} job(s), {elapsed / 60:.1f} min, "
             f"timeout {args.timeout} s per model; command: `{cmd.strip()}`. Batch 1 at each model's "
             f"`pretrained_cfg['input_size']`, default config, random init (`pretrained=False`).", "",
             "- **flopscope**: `flopscope.profile(model, x, mode='auto')` under `no_grad`, model as built "
             "(timm's fused attention = SDPA, oneDNN on).",
             "- **reference**: `FlopCounterMode` total // 2 with every `fused_attn` flag set to False, SDPA math "
             "kernel, oneDNN off, grad on.",
             "- **fs-eager** (mismatches only): flopscope on that same reference configuration.",
             f"- **device**: models over {args.max_params / 1e6:.0f}M parameters are built and counted on "
             f"`meta` (both counters; {len(s['meta_models'])} here); models counted above "
             f"{args.max_macs / 1e9:.0f} GMACs get their reference on a meta copy ({len(s['meta_refs'])} here).",
             "- **attention**: for models whose reference counts a `bmm` / `baddbmm` / SDPA op, whether flopscope's "
             "`by_role()` has `attn_scores` > 0.", "",
             "## Summary", "", "| | count |", "|---|---|",
             f"| models in this run | {len(results)} |", f"| built | {built} |",
             f"| counted by both (exact + mismatch) | {counted} |",
             f"| exact | {st.get('exact', 0)} |", f"| mismatch | {st.get('mismatch', 0)} |",
             f"| flopscope error | {st.get('error', 0)} |", f"| reference error | {st.get('ref-error', 0)} |",
             f"| skip (build fails / forward fails) | {st.get('skip', 0)} |",
             f"| timeout | {st.get('timeout', 0)} |", f"| crash | {st.get('crash', 0)} |", ""]
    if counted:
        lines += [f"Exact: {st.get('exact', 0)} of {counted} counted "
                  f"({100 * st.get('exact', 0) / counted:.1f}%). "
                  f"fs-eager ≠ reference (formula differences): {len(s['formula_mismatch'])}; "
                  f"flopscope ≠ fs-eager (fused-kernel handling): {len(s['fused_mismatch'])}.", ""]
    n_attn = len(s["attn_yes"]) + len(s["attn_no"])
    lines += [f"`sum(by_role()) == total()`: fails for {len(s['roles_bad'])} model(s)"
              + (f" ({', '.join(s['roles_bad'])})" if s["roles_bad"] else "") + ".", "",
              f"Attention: the reference counts a batched activation product in {n_attn} model(s); flopscope "
              f"found `attn_scores` in {len(s['attn_yes'])}, not in {len(s['attn_no'])}"
              + (f" ({', '.join(s['attn_no'])})" if s["attn_no"] else "") + ". Of the models where it found "
              f"attention, {len(s['attn_partial'])} have fewer `attn_scores` + `attn_weighted_sum` MACs than the "
              "reference's bmm / baddbmm / SDPA MACs (some batched products not seen as attention; listed below). "
              f"flopscope found attention in {len(s['attn_extra'])} more model(s) where the reference counts "
              "no bmm.", ""]
    shortfalls = [r for r in results if r["model"] in set(s["attn_no"]) | set(s["attn_partial"])]
    if shortfalls:
        lines += ["### Batched activation products not (all) seen as attention", "",
                  "| model | family | ref bmm/baddbmm/SDPA MACs | flopscope attn_scores + attn_weighted_sum | "
                  "coverage | flopscope roles (share of total) |", "|---|---|---|---|---|---|"]
        for r in shortfalls:
            fs, ref = r["fs"], r["ref"]
            core = sum(fs["by_role"].get(k, 0) for k in ("attn_scores", "attn_weighted_sum"))
            shares = ", ".join(f"{k} {100 * v / fs['macs']:.1f}%" for k, v in fs["by_role"].items() if v)
            lines.append(f"| {r['model']} | {r.get('family', '?')} | {runner.fmt(_ref_batched(ref['by_op']))} | "
                         f"{runner.fmt(core)} | {_attention_coverage(r):.3f} | {shares} |")
        lines.append("")
    # per family
    fam: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        c = fam[r.get("family", "?")]
        c["models"] += 1
        c[r["status"]] += 1
        found = _attn_cell(r)
        if found == "yes":
            c["attn_yes"] += 1
        elif found == "**no**":
            c["attn_no"] += 1
    lines += ["## Per family (timm module)", "",
              "| family | models | exact | mismatch | error | other status | attention found / ref sees bmm |",
              "|---|---|---|---|---|---|---|"]
    for f in sorted(fam):
        c = fam[f]
        rest = c["models"] - c["exact"] - c["mismatch"] - c["error"]
        seen = c["attn_yes"] + c["attn_no"]
        attn = f"{c['attn_yes']}/{seen}" if seen else ""
        lines.append(f"| {f} | {c['models']} | {c['exact']} | {c['mismatch']} | {c['error']} | {rest or ''} | "
                     f"{attn} |")
    lines.append("")
    lines += runner.group_sections(s, SECTIONS)
    lines += runner.invariant_lines(results, "model")
    mism = [r for r in results if r["status"] == "mismatch"]
    lines += ["## Mismatches", ""]
    if mism:
        lines += ["| model | flopscope MACs | reference MACs | ratio | fs-eager MACs | fs-eager vs ref (by op) | "
                  "flopscope vs fs-eager (by op) |", "|---|---|---|---|---|---|---|"]
        for r in mism:
            fs, fe, ref = r.get("fs", {}), r.get("fs_eager", {}), r.get("ref", {})
            d1 = (runner.by_op_diff(fe, ref) or "equal") if "macs" in fe \
                else fe.get("error", "")
            d2 = runner.by_op_diff(fs, fe) if "macs" in fe else ""
            lines.append(f"| {r['model']} | {runner.fmt(fs.get('macs'))} | {runner.fmt(ref.get('macs'))} | "
                         f"{runner.ratio(r)} | {runner.fmt(fe.get('macs'))} | {runner.cell(d1)} | {runner.cell(d2)} |")
    else:
        lines.append("(none)")
    lines += ["", "## Results", "",
              "| model | family | status | device | params | input | flopscope MACs | reference MACs | ratio | "
              "attention | attn coverage | roles sum | other % | unsupported ops | notes |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fs, ref = r.get("fs", {}), r.get("ref", {})
        notes = []
        if r["status"] in ("skip", "timeout", "crash"):
            notes.append(r.get("reason", ""))
        if fs.get("error") and r["status"] != "skip":
            notes.append(f"flopscope: {fs['error']}")
        if ref.get("error") and r["status"] != "skip":
            notes.append(f"reference: {ref['error']}")
        if ref.get("note"):
            notes.append(f"reference {ref['note']}")
        if fs.get("fallback"):
            notes.append("real mode: " + runner.fallback_key(fs["fallback"], normalize=False))
        if r.get("ref_device") == "meta" and r.get("device") != "meta":
            notes.append(f"reference on meta ({r.get('ref_device_reason')})")
        device = r.get("device", "–")
        c = _attention_coverage(r)
        cov = "–" if c is None else f"{c:.3f}"
        roles = "–" if "by_role" not in fs else ("ok" if fs.get("roles_sum_ok") else "**no**")
        params = f"{r['params'] / 1e6:.1f}M" if isinstance(r.get("params"), int) else "–"
        inp = "x".join(str(v) for v in r.get("input", [])[1:]) or "–"
        unsupported = ", ".join(sorted(fs.get("unsupported", {})))
        lines.append(f"| {r['model']} | {r.get('family', '?')} | {r['status']} | {device} | {params} | {inp} | "
                     f"{runner.fmt(fs.get('macs'))} | {runner.fmt(ref.get('macs'))} | {runner.ratio(r)} | "
                     f"{_attn_cell(r)} | {cov} | {roles} | {_other_share(fs)} | "
                     f"{runner.cell(unsupported)} | {runner.cell(' / '.join(notes))} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def print_summary(results: list[dict[str, Any]], elapsed: float) -> None:
    s = summarize(results)
    print()
    print(runner.status_line(results, s, "models", elapsed))
    print(f"fs-eager != reference: {len(s['formula_mismatch'])}; flopscope != fs-eager: {len(s['fused_mismatch'])}")
    print(f"roles not summing to total: {len(s['roles_bad'])}; attention found {len(s['attn_yes'])}, "
          f"not found {len(s['attn_no'])} {s['attn_no'][:20]}")
    runner.print_groups(s, PRINTED_SECTIONS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated model names or fnmatch patterns (e.g. 'vit_*,resnet50')")
    ap.add_argument("--limit", type=int, help="at most N models, evenly spaced through the (selected) list")
    runner.add_common_arguments(ap, str(Path(__file__).with_name("timm_zoo_report.md")), 300, "model")
    ap.add_argument("--max-params", type=float, default=300e6,
                    help="models with more parameters are built and counted on the meta device (default 300M)")
    ap.add_argument("--max-macs", type=float, default=100e9,
                    help="models flopscope counts above this get their reference on a meta copy (default 100G)")
    ap.add_argument("--invariant-macs", type=float, default=2e9,
                    help="check the invariants on CPU models counted at or below this (default 2G; 0: none)")
    runner.add_against_argument(ap)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)

    warnings.filterwarnings("ignore")
    all_models = models()
    tasks = select(all_models, args.only, args.limit)
    t0 = time.time()
    results = sweep(tasks, max(1, args.jobs), args.timeout, int(args.max_params), int(args.max_macs),
                    progress=not args.quiet, invariant_macs=int(args.invariant_macs))
    elapsed = time.time() - t0
    runner.compare_runs(results, args.against, "model")
    write_report(results, Path(args.report), elapsed, args, len(all_models), len(tasks) < len(all_models))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print_summary(results, elapsed)
    print(f"\nreport: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
