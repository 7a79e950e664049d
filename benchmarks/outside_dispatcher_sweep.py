"""Real-mode profiles of every Hugging Face base architecture, listing what
``flopscope.capture.undispatched`` flags as work
outside the ATen dispatcher (docs/guarantees.md section 8): a false positive, unless the model really computes
outside it. Models and inputs are ``benchmarks/zoo.py``'s (tiny configs, generic inputs, nothing downloaded).

    python benchmarks/outside_dispatcher_sweep.py results.jsonl [--only bert,gpt2] [--timeout 30]

Writes one JSON line per architecture (status ``ok`` with ``outside`` / ``notes``, ``no-build``, ``timeout`` or
``error``) and prints the counts and every architecture with a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


class _TimeoutError(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _TimeoutError


def _one(model_type: str, class_name: str) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import flopscope
    from flopscope.capture.undispatched import OUTSIDE

    import zoo

    cls = getattr(transformers, class_name, None)
    if cls is None:
        return {"arch": model_type, "status": "no-build"}
    for level in (0, 1, 2):
        try:
            model = zoo._build(cls, zoo.shrink_config(CONFIG_MAPPING[model_type](), level), level, 150_000_000)
        except Exception:
            continue
        for inputs in zoo.input_candidates(model, model.config):
            try:
                torch.manual_seed(0)
                with torch.no_grad():
                    model(**inputs)
            except Exception:
                continue
            torch.manual_seed(0)
            prof = flopscope.profile(model, mode="real", **inputs)
            return {"arch": model_type, "status": "ok",
                    "outside": {k: v for k, v in prof.unsupported().items() if k.startswith(OUTSIDE)},
                    "notes": [note for note in prof.notes if "outside the ATen dispatcher" in note]}
    return {"arch": model_type, "status": "no-build"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="JSON lines, one per architecture")
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--timeout", type=int, default=30, help="seconds per architecture (default 30)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import zoo

    wanted = set(args.only.split(",")) if args.only else None
    signal.signal(signal.SIGALRM, _alarm)
    results = []
    with args.output.open("w") as out:
        for model_type, class_name in zoo.architectures():
            if wanted is not None and model_type not in wanted:
                continue
            signal.alarm(args.timeout)
            try:
                result = _one(model_type, class_name)
            except _TimeoutError:
                result = {"arch": model_type, "status": "timeout"}
            except Exception as error:
                result = {"arch": model_type, "status": "error", "error": str(error)[:300]}
            finally:
                signal.alarm(0)
            results.append(result)
            out.write(json.dumps(result) + "\n")
            out.flush()
    print(dict(Counter(r["status"] for r in results)))
    flagged = [r for r in results if r.get("outside")]
    for r in flagged:
        print(r["arch"], r["outside"], *r["notes"], sep="\n  ")
    print(f"{len(flagged)} architecture(s) with work outside the dispatcher")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
