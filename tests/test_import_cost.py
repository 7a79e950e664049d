"""``import flopscope`` costs little on top of ``import torch``: the heavy modules (DTensor, symbolic shapes with
sympy, dynamo, transformers, matplotlib, lightning, the peers fvcore, thop, DeepSpeed, calflops, torchprofile) are
imported only when a model, an option or a command needs them. ``benchmarks/import_time.py`` measures the time;
this checks which modules, in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

HEAVY = ("torch.distributed.tensor", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "sympy",
         "transformers", "matplotlib", "lightning", "fvcore", "thop", "deepspeed", "calflops", "torchprofile", "einops")


def _imported_by(code: str) -> list[str]:
    """The modules of HEAVY that ``code`` imports beyond ``import torch``, in a fresh interpreter."""
    script = (f"import json, sys, torch\nbefore = set(sys.modules)\n{code}\n"
              f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules and m not in before]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_import_flopscope_imports_none_of_the_heavy_modules() -> None:
    assert _imported_by("import flopscope, flopscope.cli, flopscope.testing.pytest_plugin") == []


def test_a_profile_imports_no_more_than_torch_does_for_any_dispatch_mode() -> None:
    """torch itself imports dynamo (and with it symbolic shapes, FSDP, DTensor) the first time a module runs under
    a dispatch mode, and FakeTensorMode imports dynamo's config: a profile adds nothing to that."""
    plain = ("from torch.utils._python_dispatch import TorchDispatchMode as T\n"
             "class M(T):\n    def __torch_dispatch__(self, f, types, args=(), kwargs=None):\n"
             "        return f(*args, **kwargs)\n"
             "m = torch.nn.Linear(8, 8)\nwith M(): m(torch.zeros(2, 8)).sum().backward()\n"
             "from torch._subclasses.fake_tensor import FakeTensorMode; FakeTensorMode()")
    counted = ("import flopscope; m = torch.nn.Linear(8, 8)\n"
               "for mode in ('real', 'fake'): flopscope.profile(m, torch.zeros(2, 8), mode=mode, backward=True)")
    assert set(_imported_by(counted)) <= set(_imported_by(plain))


def test_what_needs_them_imports_them() -> None:
    """A symbolic scaling needs symbolic shapes (and sympy); a DTensor model has imported DTensor itself."""
    code = ("import flopscope; from flopscope.studies.models import TransformerBlock; "
            "flopscope.scaling(TransformerBlock(16, 2, 32), lambda n: torch.zeros(1, n, 16), lengths=(8, 16, 32, 64), "
            "method='auto')")
    assert {"torch.fx.experimental.symbolic_shapes", "sympy"} <= set(_imported_by(code))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="a torch build without torch.distributed")
def test_a_dtensor_is_recognised_once_its_module_is_imported() -> None:
    from torch.distributed.tensor import DTensor

    from flopscope.capture.fake import loaded_dtensor

    assert loaded_dtensor() is DTensor
