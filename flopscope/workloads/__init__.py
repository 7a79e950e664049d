"""Layer 9, ways of running a model, each counted through :func:`flopscope.profile` or
its engine.

- ``training``: steps of a training loop, MFU and HFU; ``generation`` and ``decoding``:
  prefill and decode steps; ``generation_templates``: generation of any length from a
  prefill and a decode step traced with a symbolic cache length; ``step_cost``: a serving
  step's MACs per request in its new tokens and cached context;
- ``pipeline`` (with ``pipeline_configs``): diffusion pipelines, per image and per
  video; ``resolution``: their costs against the image size;
- ``scaling`` and ``symbolic``: counts as exact polynomials in the sequence length;
- ``distributed``: sharded models, per rank; ``roofline``: a profile's time bound on a
  device.

May import: the entry point (``flopscope.api``), the façade and every layer below.
"""

import importlib
from typing import Any

_PUBLIC = {
    "training": ("BatchPricer", "Throughput", "flops_per_batch", "measure_flops"),
    "generation": ("Step", "profile_generation", "steps_table"),
    "generation_templates": ("GenerationCount", "count_generation"),
    "step_cost": ("StepCost", "cost_model"),
    "rank_cost": ("rank_cost_model",),
    "pipeline": ("DenoisingStep", "PipelineProfile", "Workload", "WorkloadTerm",
                 "profile_pipeline"),
    "resolution": ("ResolutionScaling", "resolution_scaling"),
    "roofline": ("Roofline", "roofline"),
    "distributed": ("fake_world", "profile_world", "tensor_parallel"),
}
"""What the front door names, by module; each module is imported when one of its names
is first used, so that ``import flopscope`` stays as light as the profiling core
(``benchmarks/import_time.py``)."""
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'flopscope.workloads' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # (the next access is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})
