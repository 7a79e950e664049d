"""Count sharded jobs on one machine: a fake world of N ranks, and a device mesh over
it.

torch ships a fake process group (``torch.testing._internal.distributed.fake_pg``,
backend ``"fake"``): every collective returns at once and moves nothing, so a model can
be sharded for any world size in one process and counted as the rank it plays would run
it (local shapes: what its kernels execute). A profile of a sharded model (DTensor
tensor / sequence parallel, FSDP2, functional collectives) reports that rank's MACs and
its collectives (:meth:`flopscope.Profile.collectives`), whether the world is fake or
real (``torchrun`` with gloo / NCCL). In a real world, :func:`gather` brings every
rank's summary to one rank and :func:`rank_table` sets them side by side (the job's
total is their sum: exact, also when ranks differ). DDP's backward cannot run on torch's
fake process group (its reducer needs a real one); profile it in a real world.

    with flopscope.distributed.fake_world(8) as mesh:          # 8 ranks; this process is rank 0
        parallelize_module(model, mesh, plan)
        prof = flopscope.profile(model, ids)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from tabulate import tabulate
from torch import nn

from ..api import profile
from ..errors import ConfigurationError
from ..predict.communication import ALL_GATHER, ALL_REDUCE, CollectiveRow, PredictedCollective, fsdp, megatron

if TYPE_CHECKING:
    from ..profile import Profile

__all__ = ["check_tensor_parallel", "collective_table", "communication_per_mac", "fake_world",
           "fsdp_table",
           "fsdp_units", "gather", "hf_plan", "predicted_collectives", "profile_world",
           "rank_table", "role_table",
           "shard_bytes", "tensor_parallel"]


@contextmanager
def fake_world(world_size: int, *, rank: int = 0, mesh_shape: Sequence[int] | None = None,
               mesh_dim_names: Sequence[str] | None = None) -> Iterator[Any]:
    """A fake world of ``world_size`` ranks in which this process is ``rank``; yields a
    CPU ``DeviceMesh`` of ``mesh_shape`` (default: one dimension of ``world_size``),
    named ``mesh_dim_names``.

    The default process group is created on entry and destroyed on exit. If one exists
    already (the user's), nothing is created or destroyed: a
    :class:`~flopscope.errors.ConfigurationError` says so, since a fake world cannot
    share the process with a real one."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigurationError("this torch build has no torch.distributed")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigurationError(f"world_size must be an int >= 1; got {world_size!r}")
    if not 0 <= rank < world_size:
        raise ConfigurationError(f"rank must be in [0, {world_size}); got {rank}")
    shape = tuple(mesh_shape) if mesh_shape is not None else (world_size,)
    if _product(shape) != world_size:
        raise ConfigurationError(f"mesh_shape {list(shape)} has {_product(shape)} ranks, not the "
                                 f"world's {world_size}")
    if dist.is_initialized():
        raise ConfigurationError("a process group is already initialised (backend "
                                 f"{dist.get_backend()}, world size {dist.get_world_size()}); "
                                 "profile within it, or destroy it before a fake world")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        yield init_device_mesh("cpu", shape, mesh_dim_names=names)
    finally:
        dist.destroy_process_group()


def profile_world(make_model: Callable[[Any], nn.Module], *args: Any, world_size: int,
                  mesh_shape: Sequence[int] | None = None,
                  mesh_dim_names: Sequence[str] | None = None,
                  ranks: Sequence[int] | None = None, **profile_kwargs: Any) -> list[Profile]:
    """Profile every rank (or ``ranks``) of a sharded job on fake worlds, one rank after
    another: for each, ``make_model(mesh)`` builds and shards the model as that rank
    would, and ``flopscope.profile(model, *args, **profile_kwargs)`` counts it. The
    job's total is the sum of the ranks' (:func:`rank_table` of their :func:`summary`),
    exact also when ranks differ (uneven shards, pipeline stages)."""
    chosen = list(ranks) if ranks is not None else list(range(world_size))
    profiles = []
    for rank in chosen:
        with fake_world(world_size, rank=rank, mesh_shape=mesh_shape, mesh_dim_names=mesh_dim_names) as mesh:
            profiles.append(profile(make_model(mesh), *args, **profile_kwargs))
    return profiles


def _product(shape: Sequence[int]) -> int:
    out = 1
    for size in shape:
        out *= int(size)
    return out



def summary(prof: Profile, *, rank: int | None = None, world: int | None = None) -> dict[str, Any]:
    """What one rank reports (also of a profile taken on a fake world, when the group is
    gone: pass ``rank`` and ``world``): its rank and world size, MACs (total and by
    role), bytes moved, and its collectives (:meth:`flopscope.CollectiveRow.row`)."""
    import torch.distributed as dist

    ready = dist.is_available() and dist.is_initialized()
    return {"rank": rank if rank is not None else dist.get_rank() if ready else 0,
            "world": world if world is not None else dist.get_world_size() if ready else 1,
            "macs": prof.total(), "by_role": prof.by_role(), "bytes": prof.total_bytes(),
            "collectives": [row.row() for row in prof.collectives()]}


def gather(prof: Profile, *, dst: int = 0, group: Any = None) -> list[dict[str, Any]] | None:
    """Every rank's :func:`summary` of its profile, on rank ``dst`` (in rank order);
    ``None`` on the others. Call it on every rank of ``group`` (default: the world),
    as any collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigurationError("gather needs an initialised process group (call it on every rank "
                                 "of the job)")
    mine = summary(prof)
    gathered: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(mine, gathered, dst=dst, group=group)
    return None if gathered is None else sorted(gathered, key=lambda s: s["rank"])


def rank_table(summaries: Sequence[dict[str, Any]], tablefmt: str = "simple") -> str:
    """Per rank: MACs, FLOPs, collective calls and bytes; then the job's total (their
    sum) and the imbalance (the busiest rank's MACs over the mean)."""
    rows = [[s["rank"], f"{s['macs']:,}", f"{2 * s['macs']:,}",
             sum(c["calls"] for c in s["collectives"]),
             f"{sum(c['bytes'] for c in s['collectives']):,}"] for s in summaries]
    total = sum(s["macs"] for s in summaries)
    mean = total / len(summaries) if summaries else 0
    imbalance = max(s["macs"] for s in summaries) / mean if mean else 1.0
    table = tabulate(rows, headers=["rank", "MACs", "FLOPs", "collectives", "collective bytes"],
                     tablefmt=tablefmt,
                     disable_numparse=True)
    return f"{table}\njob: {total:,} MACs over {len(summaries)} ranks; imbalance (max / mean) {imbalance:.3f}"


# ------------------------------------------------------------------------------------------------ tensor parallel
_HEADS_AND_WIDTHS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def _styles() -> dict[str, Callable[[], Any] | None]:
    """Hugging Face's tensor-parallel style names
    (``transformers.distributed.tensor_parallel``) that have a DTensor equivalent,
    and a maker of that style (``None``: the module stays as it is, replicated)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def gather_output() -> Any:
        return ColwiseParallel(output_layouts=Replicate())

    def split_input() -> Any:
        return RowwiseParallel(input_layouts=Replicate())

    return {
        # weight Shard(0): heads / FFN columns split, output left sharded
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,  # weight Shard(1): sharded input, partial outputs all-reduced
        # ... and the output all-gathered (the LM head's logits)
        "colwise_gather_output": gather_output,
        "colwise_rep": gather_output,
        "rowwise_split_input": split_input,  # a replicated input split locally (no collective)
        "rowwise_rep": split_input,
        # vocabulary-parallel embedding: partial lookups all-reduced
        "embedding_rowwise": split_input,
        "replicate": None,
    }


def hf_plan(model: nn.Module) -> dict[str, str]:
    """The tensor-parallel plan a Hugging Face model declares, keyed by module paths
    from ``model`` (``*`` for a layer index): its ``tp_plan`` where transformers
    merges one (transformers 5: the config's ``base_model_tp_plan`` under the base
    model's prefix, the head's ``_tp_plan``, and a vocabulary-parallel
    ``embed_tokens``), else the config's ``base_model_tp_plan`` under the base
    model's prefix and the head class's ``_tp_plan``. Raises
    :class:`~flopscope.errors.ConfigurationError` if the model declares none."""
    merged = getattr(model, "tp_plan", None)
    if isinstance(merged, dict) and merged:
        return {str(k): str(v) for k, v in merged.items()}
    base_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    base = getattr(model, "base_model", model)
    prefix = next((name for name, module in model.named_modules() if module is base), "")
    plan = {f"{prefix}.{key}" if prefix else key: value for key, value in base_plan.items()}
    plan.update(getattr(type(model), "_tp_plan", None) or {})
    if not plan:
        raise ConfigurationError(f"{type(model).__name__} declares no tensor-parallel plan (no "
                                 "config base_model_tp_plan, no _tp_plan); pass plan={module path: "
                                 "style} to tensor_parallel")
    return plan


def _ep_plan(model: nn.Module) -> dict[str, str]:
    """The expert-parallel plan a Hugging Face model's config declares
    (``base_model_ep_plan``; empty where none)."""
    return dict(getattr(getattr(model, "config", None), "base_model_ep_plan", None) or {})


def tensor_parallel(model: nn.Module, mesh: Any,
                    plan: Mapping[str, Any] | None = None, *, experts: bool = False) -> nn.Module:
    """Shard ``model`` for tensor parallelism over ``mesh`` (its ``"tp"`` dimension if
    it has several) with ``torch.distributed.tensor.parallel.parallelize_module``,
    and return it.

    ``plan`` maps module paths (``*`` matches one path component, a layer index) to a
    DTensor ``ParallelStyle`` or a Hugging Face style name: ``"colwise"``
    (``ColwiseParallel()``), ``"rowwise"`` (``RowwiseParallel()``),
    ``"colwise_gather_output"`` / ``"colwise_rep"``
    (``ColwiseParallel(output_layouts=Replicate())``), ``"rowwise_split_input"`` /
    ``"rowwise_rep"`` / ``"embedding_rowwise"``
    (``RowwiseParallel(input_layouts=Replicate())``; on an embedding:
    vocabulary-parallel), ``"replicate"`` (left as is). Default: the model's own plan
    (:func:`hf_plan`); where it names styles of transformers' own without a DTensor
    equivalent here (the mixture-of-experts ones, ``"packed_colwise"`` and
    ``"moe_tp_experts"``, among them) and the mesh spans the world, transformers applies
    it with its own code, as when it loads the model with ``DistributedConfig(tp_size=...)``
    (transformers 5.2x; older ones: refused as below).

    ``experts``: also split each mixture-of-experts layer's experts over the mesh's
    ranks, as transformers' expert parallelism does (``ep_size`` = ``tp_size`` = the
    mesh's size: each rank holds its share of the experts whole and runs them on the
    batch the group shares, the routes to other ranks' experts skipped; its own plans,
    applied by its own code, as above; the count of such a rank on fake tensors is an
    upper bound: :meth:`~flopscope.profile.Profile.unrouted`).

    Refused with a :class:`~flopscope.errors.ConfigurationError`: a mesh size that does
    not divide the config's query or key/value heads or its FFN width, a style without a
    DTensor equivalent (naming module and style), a pattern of a given ``plan`` that
    matches no module, ``experts`` with a ``plan`` or where transformers cannot shard a
    built model or declares no expert-parallel plan for it. A model built on ``device="meta"`` stays there and counts in
    ``mode="fake"`` (its meta shards become fake ones for the count)."""
    from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

    tp_mesh = _tp_mesh(mesh)
    size = tp_mesh.size()
    check_tensor_parallel(model, size)
    given = plan is not None
    check_experts_plan(plan, experts)
    if experts:
        if not _ep_plan(model):
            raise ConfigurationError(f"{type(model).__name__} declares no expert-parallel plan (no config "
                                     "base_model_ep_plan): no experts to split over the ranks")
        if not _sharded_by_transformers(model, tp_mesh, experts=True):
            raise ConfigurationError("expert parallelism is applied by transformers' own code: this "
                                     "transformers cannot shard a built model (5.2x can), or the mesh is not a "
                                     "1-D mesh spanning the world")
        return model
    patterns = dict(plan) if plan is not None else hf_plan(model)
    styles = _styles()
    if not given and any(isinstance(style, str) and style not in styles for style in patterns.values()) and \
            _sharded_by_transformers(model, tp_mesh):
        return model
    names = [name for name, _ in model.named_modules()]
    expanded: dict[str, Any] = {}
    for pattern, style in patterns.items():
        regex = re.compile(r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in pattern.split(".")))
        matched = [name for name in names if regex.fullmatch(name)]
        if not matched and given:
            raise ConfigurationError(f"tensor-parallel plan entry {pattern!r} matches no module of "
                                     f"{type(model).__name__}")
        for name in matched:
            if isinstance(style, ParallelStyle):
                expanded[name] = style
            elif isinstance(style, str) and style in styles:
                maker = styles[style]
                if maker is not None:
                    expanded[name] = maker()
            else:
                known = ", ".join(sorted(styles))
                raise ConfigurationError(f"module '{name}': tensor-parallel style {style!r} has no "
                                         f"DTensor equivalent here (known: {known}); pass plan= "
                                         "with a ParallelStyle for it (the model's own plan is applied "
                                         "by transformers where it can shard a built model and the "
                                         "mesh spans the world)")
    parallelize_module(model, tp_mesh, expanded)
    return model


def check_experts_plan(plan: Mapping[str, Any] | None, experts: bool) -> None:
    """Refuse a ``plan`` given with ``experts`` (:func:`tensor_parallel`): the experts
    are split by the model's own plans."""
    if experts and plan is not None:
        raise ConfigurationError("experts=True shards by the model's own plans (transformers' tensor- and "
                                 "expert-parallel plans); pass no plan=")


def _sharded_by_transformers(model: nn.Module, mesh: Any, *, experts: bool = False) -> bool:
    """Shard ``model`` over the 1-D ``mesh`` as transformers does when it loads one with
    ``DistributedConfig(tp_size=...)`` (its own plan, applied by its own code: the
    mixture-of-experts styles among those without a DTensor equivalent here; with
    ``experts``, ``ep_size=tp_size`` too: its expert-parallel plan), where this
    transformers can shard a built model and ``mesh`` spans the world (transformers'
    meshes span it: made here on ``mesh``'s device type); whether it did."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    distribute = getattr(type(model), "maybe_distribute_model", None)
    if distribute is None or mesh.ndim != 1 or not dist.is_initialized() or dist.get_world_size() != mesh.size():
        return False
    try:
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.utils import TransformersDeviceMesh
    except ImportError:
        return False
    size = mesh.size()
    ep = size if experts else 1
    config = DistributedConfig(tp_size=size, ep_size=ep)
    # (the dense layers' view of the ranks and the experts': with no expert parallelism
    # the experts' FSDP axis spans them)
    meshes = TransformersDeviceMesh(
        init_device_mesh(mesh.device_type, (1, 1, 1, size), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp")),
        init_device_mesh(mesh.device_type, (1, 1, size // ep, ep), mesh_dim_names=("pp", "dp_replicate", "efsdp",
                                                                                   "ep")))
    if distribute(model, config, meshes) is not model:
        raise ConfigurationError(f"transformers sharded {type(model).__name__} into another module (pipeline "
                                 "stages?); shard it yourself and profile what it returns")
    return True


def _tp_mesh(mesh: Any) -> Any:
    if mesh.ndim == 1:
        return mesh
    names = tuple(mesh.mesh_dim_names or ())
    if "tp" in names:
        return mesh["tp"]
    raise ConfigurationError(f"a {mesh.ndim}-dimensional mesh needs a dimension named 'tp' for "
                             f"tensor parallelism; its dimensions are {list(names) or 'unnamed'}")


def check_tensor_parallel(model: nn.Module, size: int) -> None:
    """Refuse (:class:`~flopscope.errors.ConfigurationError`, naming the config key, its
    value and the mesh size) a tensor-parallel mesh of ``size`` ranks that does not
    divide the config's query heads, key/value heads or FFN width: each rank holds
    whole heads and an equal share of the FFN columns."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    config = text() if callable(text) else config
    for key in _HEADS_AND_WIDTHS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value % size:
            raise ConfigurationError(f"a tensor-parallel mesh of size {size} does not divide "
                                     f"config {key}={value} of {type(model).__name__}: each rank "
                                     "must hold whole heads and an equal share of the FFN width; "
                                     f"use a mesh size that divides {key}")


# ------------------------------------------------------------------------------------------------ reporting
def shard_bytes(module: nn.Module) -> int:
    """Bytes of this rank's parameters of ``module``: a DTensor's local shard, any other
    parameter whole (each parameter once)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for param in module.parameters():
        local = param._local_tensor if isinstance(param, DTensor) else param
        seen[id(param)] = local.numel() * local.element_size()
    return sum(seen.values())


def fsdp_units(model: nn.Module, units: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """``(module path, bytes)`` per FSDP unit, as :func:`flopscope.communication.fsdp`
    takes them: the root first (``""``: every parameter no other unit holds), then
    each unit, with this rank's bytes (:func:`shard_bytes`: a tensor-parallel shard
    is what FSDP shards further). ``units`` default: the modules of the classes a
    Hugging Face model names in ``_no_split_modules`` (its decoder layers, what FSDP
    wraps one by one)."""
    modules = dict(model.named_modules())
    if units is None:
        kinds = set(getattr(model, "_no_split_modules", None) or ())
        units = [name for name, module in modules.items() if name and type(module).__name__ in kinds]
    missing = [name for name in units if name not in modules]
    if missing:
        raise ConfigurationError(f"no module {missing[0]!r} in {type(model).__name__}")
    inside = {id(p) for name in units for p in modules[name].parameters()}
    root = sum(_param_bytes(model).values()) - sum(_param_bytes(model, inside).values())
    return [("", root)] + [(name, shard_bytes(modules[name])) for name in units]


def _param_bytes(model: nn.Module, only: set[int] | None = None) -> dict[int, int]:
    from torch.distributed.tensor import DTensor

    out = {}
    for param in model.parameters():
        if only is None or id(param) in only:
            local = param._local_tensor if isinstance(param, DTensor) else param
            out[id(param)] = local.numel() * local.element_size()
    return out


def predicted_collectives(model: nn.Module, batch: int, tokens: int, *,
                          backward: bool = False) -> list[PredictedCollective]:
    """What Megatron-LM's closed form says a tensor-parallel rank of a Hugging Face
    decoder sends (:func:`flopscope.communication.megatron`, the config's width and
    layers, the parameters' element size), and, where the model's embedding or LM
    head is sharded: the vocabulary-parallel embedding's forward all-reduce of its
    ``[batch, tokens, width]`` output (Megatron-LM shards it so too), and the LM
    head's all-gather of the ``[batch, tokens, vocab]`` logits
    (``colwise_gather_output``) with, in the backward pass, the all-reduce of its
    input gradient. Nothing when the model is not sharded, or on a mesh of one rank."""
    from torch.distributed.tensor import DTensor

    if next((p.device_mesh.size() for p in model.parameters() if isinstance(p, DTensor)), 1) == 1:
        return []
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    config = text() if callable(text) else config
    width, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    if not isinstance(width, int) or not isinstance(layers, int):
        raise ConfigurationError(f"{type(model).__name__} has no config hidden_size / "
                                 "num_hidden_layers")
    element = next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4)
    out = megatron(batch, tokens, width, layers, element_bytes=element, backward=backward)
    activation = batch * tokens * width * element
    embeddings = getattr(model, "get_input_embeddings", None)
    table = embeddings() if callable(embeddings) else None
    if isinstance(getattr(table, "weight", None), DTensor):
        out.append(PredictedCollective(ALL_REDUCE, "forward", 1, activation,
                                       "vocabulary-parallel embedding"))
    head_of = getattr(model, "get_output_embeddings", None)
    head = head_of() if callable(head_of) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, DTensor):
        logits = batch * tokens * weight.shape[0] * element
        out.append(PredictedCollective(ALL_GATHER, "forward", 1, logits,
                                       "LM head: logits gathered"))
        if backward:
            out.append(PredictedCollective(ALL_REDUCE, "backward", 1, activation,
                                           "LM head: input gradient all-reduced"))
    return out


def role_table(sharded: Profile, unsharded: Profile, *, phase: str | None = None,
               tablefmt: str = "simple") -> str:
    """Per role: the unsharded model's MACs, this rank's, and this rank's share (exact:
    ``1/8``; ``1``: replicated, every rank computes all of it), then the totals."""
    mine, whole = sharded.by_role(phase=phase), unsharded.by_role(phase=phase)
    rows = []
    for role in dict.fromkeys([*whole, *mine]):
        a, b = whole.get(role, 0), mine.get(role, 0)
        if a or b:
            rows.append([role, f"{a:,}", f"{b:,}", _share(b, a)])
    a, b = unsharded.total(phase=phase), sharded.total(phase=phase)
    rows.append(["total", f"{a:,}", f"{b:,}", _share(b, a)])
    return tabulate(rows, headers=["role", "unsharded MACs", "this rank's MACs", "share"],
                    tablefmt=tablefmt,
                    disable_numparse=True)


def _share(part: int, whole: int) -> str:
    if not whole:
        return "-"
    share = Fraction(part, whole)
    return str(share) if share.denominator <= 1024 else f"{float(share):.4f}"


def collective_table(rows: Sequence[CollectiveRow], tablefmt: str = "simple") -> str:
    """:class:`~flopscope.communication.CollectiveRow` s with layer indices folded
    (``model.layers.*.mlp``): calls and message bytes of every layer together."""
    calls: Counter[tuple[str, int | None, str, str, str]] = Counter()
    sizes: Counter[tuple[str, int | None, str, str, str]] = Counter()
    for row in rows:
        key = (row.kind, row.group, re.sub(r"(?<=\.)\d+(?=\.|$)", "*", row.module) or "(root)",
               row.role, row.phase)
        calls[key] += row.calls
        sizes[key] += row.bytes
    table = [[kind, group, module, role or "-", phase, calls[key], f"{sizes[key]:,}"]
             for key in calls for kind, group, module, role, phase in [key]]
    return tabulate(table, headers=["collective", "group", "module", "role", "phase", "calls",
                                    "bytes"],
                    tablefmt=tablefmt, disable_numparse=True)


def communication_per_mac(prof: Profile, units: Sequence[tuple[str, int]], *,
                          fsdp_backward: bool | None = None,
                          tablefmt: str = "simple") -> str:
    """Per unit (:func:`fsdp_units`: the root, then each decoder layer): this rank's
    MACs, the bytes of the collectives it issued there (measured), and, if
    ``fsdp_backward`` is not ``None``, what FSDP would add
    (:func:`flopscope.communication.fsdp` per unit, predicted), and the collective
    bytes per MAC. Consecutive units with the same numbers are one row
    (``model.layers.0..79``, each)."""
    paths = [path for path, _ in units if path]
    measured: Counter[str] = Counter()
    for row in prof.collectives():
        owner = next((p for p in paths if row.module == p or row.module.startswith(p + ".")), "")
        measured[owner] += row.bytes
    macs = {path: prof.total(module=path) for path in paths}
    macs[""] = prof.total() - sum(macs.values())
    lines: list[tuple[str, int, int, int | None]] = []
    for path, size in units:
        extra = None
        if fsdp_backward is not None:
            resharded = [bool(path)]  # FSDP2 keeps the root unsharded after its forward
            extra = sum(p.bytes for p in fsdp([size], resharded=resharded, backward=fsdp_backward))
        lines.append((path, macs[path], measured[path], extra))
    rows: list[list[Any]] = []
    start = 0
    while start < len(lines):
        end = start
        while end + 1 < len(lines) and lines[end + 1][1:] == lines[start][1:] and lines[start][0]:
            end += 1
        name = lines[start][0] or "(root: outside the layers)"
        if end > start:
            name = f"{name}..{lines[end][0].rsplit('.', 1)[-1]} (each)"
        path, mac, tp_bytes, extra = lines[start]
        total = tp_bytes + (extra or 0)
        cells = [name, f"{mac:,}", f"{tp_bytes:,}"] + ([f"{extra:,}"] if fsdp_backward is not None else [])
        rows.append([*cells, f"{total / mac:.4f}" if mac else "-"])
        start = end + 1
    headers = ["unit", "MACs (this rank)", "TP bytes (measured)"]
    if fsdp_backward is not None:
        headers.append("FSDP bytes (predicted)")
    return tabulate(rows, headers=[*headers, "bytes per MAC"], tablefmt=tablefmt,
                    disable_numparse=True)


def fsdp_table(units: Sequence[tuple[str, int]], group: int, *, backward: bool = True,
               tablefmt: str = "simple") -> str:
    """FSDP's predicted collectives (:func:`flopscope.communication.fsdp`) for ``units``
    (:func:`fsdp_units`) on a data-parallel group of ``group`` ranks: calls, message
    bytes, and the bytes each rank holds per unit."""
    sizes = [size for _, size in units]
    rows = [[p.kind, group, p.phase, p.calls, f"{p.bytes:,}", p.basis]
            for p in fsdp(sizes, backward=backward)]
    held = sum(-(-size // group) for size in sizes)
    table = tabulate(rows, headers=["collective", "group", "phase", "calls", "bytes", "basis"],
                     tablefmt=tablefmt,
                     disable_numparse=True)
    return (f"{table}\n{len(units)} units (the root and {len(units) - 1} decoder layers), "
            f"{sum(sizes):,} parameter bytes of this rank's tensor-parallel shard; FSDP over "
            f"{group} ranks leaves {held:,} on each")
