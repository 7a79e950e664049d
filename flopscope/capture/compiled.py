"""Compiled and exported models: what a profile counts for ``torch.compile(model)`` and
a ``torch.export`` ``ExportedProgram``.

- ``torch.compile(model)`` (an ``OptimizedModule``) is counted through the eager module
  it wraps (``_orig_mod``): the ATen ops of the eager forward, which are the work of the
  graph Dynamo captures (its graph holds the same torch calls; AOTAutograd lowers them
  to the same ATen ops), not Inductor's generated kernels (which fuse the elementwise
  work around the same GEMMs and attention: the MACs do not change, and fused kernels
  have no ATen op to count). The compiled wrapper is never called, so a profile neither
  recompiles it nor leaves it to run eagerly afterwards (Dynamo guards see nothing of
  the profile), and module paths are the model's own (``attention.q_proj``, not
  ``_orig_mod.attention.q_proj``).
- An ``ExportedProgram`` is counted through ``torch.export.unflatten(ep)``: the exported
  graph's ATen ops (the program's own IR), run on the arguments the program takes, each
  in the module of the original model that ran it (unflatten rebuilds the hierarchy from
  the graph's module stacks). Where unflatten fails, through ``ep.module()``, whose
  graph is flat: every op is then the root module's (``prof.notes`` says which).

A module *inside* a model that is itself compiled (``model.block =
torch.compile(block)``) is left as it is: Dynamo runs it eagerly while a dispatch mode
is active, and its paths keep the ``_orig_mod`` step.

Imports nothing of Dynamo or export: a compiled or exported model has imported them
already.
"""

from __future__ import annotations

import sys
from typing import Any

COMPILED_NOTE = ("torch.compile'd model: counted the ATen ops of the eager module it wraps (the "
                 "work of the graph Dynamo captures, not Inductor's fused kernels); the compiled "
                 "module itself was not called")
EXPORTED_NOTE = "ExportedProgram: counted the ATen ops of its graph, in the modules torch.export.unflatten rebuilds"
FLAT_NOTE = ("ExportedProgram: counted the ATen ops of its graph (ep.module(): every op in the "
             "root module; torch.export.unflatten failed: {error})")


BLOCK_WARNING = ("a torch.compile'd module called inside a flopscope.profiler block runs eagerly "
                 "there (Dynamo does not compile under a dispatch mode) and its forward's code is "
                 "then not compiled again in this process (until torch._dynamo.reset()); count it "
                 "with flopscope.profile(compiled, ...), which never calls it")


def is_compiled(model: Any) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper (an ``OptimizedModule``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(model, eval_frame.OptimizedModule)


def eager_module(model: Any) -> tuple[Any, str | None]:
    """``(what to count, the note saying so)``: a ``torch.compile`` wrapper's eager
    module, an ``ExportedProgram``'s unflattened module, else ``(model, None)``."""
    # loaded by whoever made an ExportedProgram
    exported = sys.modules.get("torch.export.exported_program")
    if exported is not None and isinstance(model, exported.ExportedProgram):
        from torch.export import unflatten  # loaded with the program

        try:
            return unflatten(model), EXPORTED_NOTE
        # a program unflatten cannot rebuild: its flat module still runs every op
        except Exception as error:
            return model.module(), FLAT_NOTE.format(error=f"{type(error).__name__}: {error}"[:200])
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # loaded by torch.compile
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        while isinstance(model, eval_frame.OptimizedModule):  # torch.compile(torch.compile(m))
            model = model._orig_mod
        return model, COMPILED_NOTE
    return model, None
