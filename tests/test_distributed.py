"""Sharded models on a fake world: per-rank MACs and collectives against Megatron's closed forms."""

from __future__ import annotations

import gc
import warnings
from fractions import Fraction
from typing import Any

import pytest
import torch

import flopscope
from flopscope.predict.communication import compare, fsdp, megatron
from flopscope.workloads.distributed import fake_world

from closed_forms import add, attention, ffn, rotary, times
from zoo import hf_plan_shards_the_embedding, transformers_distributes

dist = pytest.importorskip("torch.distributed")
transformers = pytest.importorskip("transformers")
tp = pytest.importorskip("torch.distributed.tensor.parallel")
d, h, d_ff, L, V, B, n = 64, 8, 128, 2, 128, 2, 10
SHARDED = ("q_proj", "k_proj", "v_proj", "out_proj", "attn_scores", "attn_weighted_sum", "ffn_up", "ffn_gate",
           "ffn_down")


def tensor_parallel_llama(mesh) -> torch.nn.Module:
    """Megatron-style: Q, K, V, gate and up split by columns (heads / FFN width), output and down by rows."""
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=h, vocab_size=V)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    shard_layers(model, mesh)
    return model


def shard_layers(model: torch.nn.Module, mesh) -> None:
    """Megatron's plan on every decoder layer: Q, K, V, gate and up by columns, output and down by rows."""
    plan = {"self_attn.q_proj": tp.ColwiseParallel(), "self_attn.k_proj": tp.ColwiseParallel(),
            "self_attn.v_proj": tp.ColwiseParallel(), "self_attn.o_proj": tp.RowwiseParallel(),
            "mlp.gate_proj": tp.ColwiseParallel(), "mlp.up_proj": tp.ColwiseParallel(),
            "mlp.down_proj": tp.RowwiseParallel()}
    for layer in model.model.layers:
        tp.parallelize_module(layer, mesh, plan)


@pytest.mark.parametrize("mode", ["fake", "real"])
@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_rank_does_its_share_and_megatrons_all_reduces(t, mode) -> None:
    with fake_world(t) as mesh:
        model = tensor_parallel_llama(mesh)
        prof = flopscope.profile(model, torch.randint(0, V, (B, n)), mode=mode, backward=True)
    unsharded = add(times(L, add(attention(B, n, n, d, h), ffn(B, n, d, d_ff, gated=True))),
                    {"logits": B * n * d * V}, rotary(n, d // h))
    forward = {role: macs for role, macs in prof.by_role(phase="forward").items() if macs}
    # heads and FFN columns split t ways; the LM head (and transformers < 5.19's rotary matmul) replicated
    assert forward == {role: macs // t if role in SHARDED else macs for role, macs in unsharded.items()}
    activation = B * n * d * 4  # fp32 bytes of one [B, n, d] activation
    rows = prof.collectives()
    assert all(row.kind == "all_reduce" and row.group == t for row in rows)
    # forward: Megatron's g operator, one all-reduce after each row-parallel GEMM (attention output, FFN down)
    ahead = [(row.module, row.role, row.calls, row.bytes) for row in rows if row.phase == "forward"]
    assert ahead == [(f"model.layers.{i}.{m}", role, 1, activation) for i in range(L)
                     for m, role in (("self_attn.o_proj", "out_proj"), ("mlp.down_proj", "ffn_down"))]
    # backward: Megatron's f operator all-reduces the input gradient of each column-parallel block once (its
    # GEMMs are fused); DTensor's plan makes each of Q, K, V, gate and up its own module, so each sends its own
    behind = [row for row in prof.collectives() if row.phase == "backward"]
    assert sorted(row.module.rsplit(".", 1)[-1] for row in behind) == sorted(["q_proj", "k_proj", "v_proj",
                                                                              "gate_proj", "up_proj"] * L)
    assert all((row.calls, row.bytes) == (1, activation) for row in behind)
    assert sum(row.bytes for row in prof.collectives()) == (2 + 5) * L * activation
    assert not dist.is_initialized()  # the fake world is gone
    predicted = megatron(B, n, d, L, element_bytes=4, backward=True)
    table = compare(rows, predicted)
    assert [line.split()[6] for line in table.splitlines()[2:]] == ["yes", "NO"]  # forward agrees, backward not


def test_fake_world_creates_and_destroys_only_its_own_group() -> None:
    with fake_world(4, mesh_shape=(2, 2), mesh_dim_names=("dp", "tp")) as mesh:
        assert dist.get_world_size() == 4 and mesh.shape == (2, 2) and mesh.mesh_dim_names == ("dp", "tp")
    assert not dist.is_initialized()
    with pytest.raises(flopscope.ConfigurationError, match="mesh_shape"), fake_world(4, mesh_shape=(3,)):
        pass
    with fake_world(2):
        with pytest.raises(flopscope.ConfigurationError, match="already initialised"), fake_world(2):
            pass
        assert dist.is_initialized()  # the refused inner world did not destroy the outer one
    assert not dist.is_initialized()


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=h, vocab_size=V)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _fsdp2_runs_on_the_cpu() -> bool:
    """torch 2.6's FSDP2 stops on the CPU ("'Stream' object has no attribute 'record_event'"); later torch runs."""
    from torch.distributed.fsdp import fully_shard

    with fake_world(2) as mesh:
        model = torch.nn.Linear(4, 4)
        fully_shard(model, mesh=mesh)
        try:
            model(torch.zeros(1, 4))
        except AttributeError:
            return False
    return True


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_gathers_every_parameter_per_forward_and_reduce_scatters_every_gradient(world) -> None:
    from torch.distributed.fsdp import fully_shard

    if not _fsdp2_runs_on_the_cpu():
        pytest.skip("this torch's FSDP2 does not run on the CPU")
    ids = torch.randint(0, V, (B, n))
    plain = flopscope.profile(llama(), ids, mode="real", backward=True)
    with fake_world(world) as mesh:
        model = llama()
        layer_bytes = 4 * sum(p.numel() for p in model.model.layers[0].parameters())  # fp32, unsharded
        every_bytes = 4 * sum(p.numel() for p in model.parameters())
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with pytest.raises(flopscope.FakeTensorError, match="FSDP2"):
            flopscope.profile(model, ids, mode="fake")
        with pytest.warns(flopscope.FlopscopeWarning, match="real mode"):
            prof = flopscope.profile(model, ids, mode="auto", backward=True)
    assert prof.by_role() == plain.by_role()  # FSDP shards memory, not work: each rank runs the whole model
    rows = prof.collectives()
    assert all(row.group == world for row in rows)

    def total(kind: str, phase: str) -> tuple[int, int]:
        chosen = [row for row in rows if row.kind == kind and row.phase == phase]
        return sum(row.calls for row in chosen), sum(row.bytes for row in chosen)

    # forward: one all-gather per FSDP unit (the root's own parameters, then each layer): every parameter once
    assert total("all_gather", "forward") == (1 + L, every_bytes)
    # backward: the layers were resharded after the forward, so each is gathered again; the root was not
    assert total("all_gather", "backward") == (L, L * layer_bytes)
    # and every gradient is reduce-scattered once, one call per unit
    assert total("reduce_scatter", "backward") == (1 + L, every_bytes)
    root_bytes = every_bytes - L * layer_bytes
    table = compare(rows, fsdp([root_bytes] + [layer_bytes] * L))
    assert [line.split()[6] for line in table.splitlines()[2:]] == ["yes"] * 3


D_IN, D_HIDDEN, ROWS = 64, 256, 8
EXPERTS, TOKENS = 4, 24


class ExpertParallelMoE(torch.nn.Module):
    """Top-1 mixture of experts with the experts split across ranks (expert parallelism): each rank routes its
    tokens, sends each to the rank holding its expert (``all_to_all_single``, split sizes from the routing), runs
    its own experts on what it received, and sends the results back."""

    def __init__(self, world: int) -> None:
        super().__init__()
        self.world, self.local = world, EXPERTS // world
        self.router = torch.nn.Linear(D_IN, EXPERTS, bias=False)
        self.up = torch.nn.ModuleList(torch.nn.Linear(D_IN, D_HIDDEN, bias=False) for _ in range(self.local))
        self.down = torch.nn.ModuleList(torch.nn.Linear(D_HIDDEN, D_IN, bias=False) for _ in range(self.local))
        self.routed: list[int] = []  # tokens this rank sent to each expert, as the forward routed them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = self.router(x).argmax(-1)
        order = expert.argsort()
        counts = torch.bincount(expert, minlength=EXPERTS)
        self.routed[:] = counts.tolist()  # in place: a profile puts the module's attributes back afterwards
        send = counts.view(self.world, self.local).sum(1)
        receive = torch.empty_like(send)
        dist.all_to_all_single(receive, send)  # how many tokens each rank will send here
        arrived = x.new_empty(int(receive.sum()), D_IN)
        dist.all_to_all_single(arrived, x[order], receive.tolist(), send.tolist())
        local_counts = torch.empty(self.world * self.local, dtype=torch.long)
        dist.all_to_all_single(local_counts, counts)  # per sender, per local expert
        per_expert = local_counts.view(self.world, self.local)
        out = torch.empty_like(arrived)
        start = 0
        for sender in range(self.world):  # arrived rows: by sender, then by that sender's expert order
            for e in range(self.local):
                rows = int(per_expert[sender, e])
                piece = arrived[start:start + rows]
                out[start:start + rows] = self.down[e](torch.relu(self.up[e](piece)))
                start += rows
        back = x.new_empty(x.shape[0], D_IN)
        dist.all_to_all_single(back, out, send.tolist(), receive.tolist())
        return back[order.argsort()]


def _rank_work(rank: int, world: int, store: str, out: str) -> None:
    """One rank of a real gloo job: a tensor-parallel MLP and a DDP one, each profiled, gathered on rank 0."""
    import json
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    from flopscope.workloads.distributed import gather

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(D_HIDDEN, D_IN))
        tp.parallelize_module(mlp, mesh, {"0": tp.ColwiseParallel(), "2": tp.RowwiseParallel()})
        sharded = gather(flopscope.profile(mlp, torch.randn(ROWS, D_IN), mode="real"))
        plain = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(D_HIDDEN, D_IN))
        replicated = gather(flopscope.profile(DistributedDataParallel(plain), torch.randn(ROWS, D_IN), mode="real",
                                              backward=True))
        torch.manual_seed(1)
        moe = ExpertParallelMoE(world)
        moe.router.weight.data = torch.randn(EXPERTS, D_IN, generator=torch.Generator().manual_seed(7))
        torch.manual_seed(100 + rank)  # each rank its own tokens, so each routes differently
        experts = gather(flopscope.profile(moe, torch.randn(TOKENS, D_IN), mode="real"))
        routing: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(moe.routed, routing, dst=0)  # what the model routed (not what flopscope saw)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"tensor_parallel": sharded, "ddp": replicated, "experts": experts, "routing": routing}, f)
        dist.barrier()  # no rank tears its group down while another still talks to it
    finally:
        # DDP's reducer sits in reference cycles: freed now, while its process group lives (freed at exit, after
        # destroy_process_group, it aborted a rank once in a while: "terminate called without an active exception")
        gc.collect()
        dist.destroy_process_group()


def test_a_real_gloo_job_each_rank_counts_its_share_and_rank_0_gathers_them(tmp_path) -> None:
    import json

    import torch.multiprocessing as mp

    from flopscope.workloads.distributed import rank_table

    world = 2
    out = tmp_path / "ranks.json"
    mp.spawn(_rank_work, args=(world, str(tmp_path / "store"), str(out)), nprocs=world)
    ranks = json.loads(out.read_text())
    sharded, replicated = ranks["tensor_parallel"], ranks["ddp"]
    assert [s["rank"] for s in sharded] == [0, 1] and all(s["world"] == world for s in sharded)
    # expert parallel: the work and the all-to-all traffic follow the routing actually taken
    routing, local = ranks["routing"], EXPERTS // world  # routing[r][e]: tokens rank r sent to expert e
    for rank, s in enumerate(ranks["experts"]):
        mine = range(rank * local, (rank + 1) * local)
        received = sum(routing[sender][e] for sender in range(world) for e in mine)
        assert s["by_role"]["ffn_up"] == s["by_role"]["ffn_down"] == received * D_IN * D_HIDDEN  # its experts
        assert s["macs"] == TOKENS * D_IN * EXPERTS + 2 * received * D_IN * D_HIDDEN  # and the router
        to_all = [c for c in s["collectives"] if c["kind"] == "all_to_all"]
        # counts (int64), tokens out, per-expert counts, results back: each message the larger of sent and received
        tokens = max(TOKENS, received) * D_IN * 4
        assert sum(c["calls"] for c in to_all) == 4
        assert sum(c["bytes"] for c in to_all) == 8 * world + tokens + 8 * world * local + tokens
    # each rank runs half of each GEMM (columns of the first, rows of the second), then one all-reduce of the output
    assert [s["macs"] for s in sharded] == [2 * ROWS * D_IN * D_HIDDEN // world] * world
    for s in sharded:
        assert [(c["kind"], c["group"], c["calls"], c["bytes"]) for c in s["collectives"]] == \
            [("all_reduce", world, 1, 4 * ROWS * D_IN)]
    assert "imbalance (max / mean) 1.000" in rank_table(sharded)
    # DDP: every rank runs the whole model and all-reduces every gradient once (one bucket here)
    parameters = D_IN * D_HIDDEN + D_HIDDEN + D_HIDDEN * D_IN + D_IN
    for s in replicated:
        gemm = ROWS * D_IN * D_HIDDEN  # MACs of either Linear
        # forward, both weight gradients, and the input gradient of the second only (the input needs none)
        assert s["macs"] == 2 * gemm + 2 * gemm + gemm
        assert [(c["kind"], c["phase"], c["bytes"]) for c in s["collectives"]] == \
            [("all_reduce", "backward", 4 * parameters)]


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # heads as -1: a rank holds h / t of them
        q, k, v = (p(x).view(b, t, -1, d // h).transpose(1, 2) for p in (self.q, self.k, self.v))
        core = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o(core.transpose(1, 2).reshape(b, t, -1))


class _Block(torch.nn.Module):
    """Pre-norm attention and FFN, as Megatron's sequence-parallel layer is drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = _Attention()
        self.up, self.down = torch.nn.Linear(d, d_ff, bias=False), torch.nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_sequence_parallel_turns_each_all_reduce_into_an_all_gather_and_a_reduce_scatter(mode) -> None:
    from torch.distributed.tensor import Replicate, Shard

    t, seq = 4, 16
    with fake_world(t) as mesh:
        block = _Block()
        gather_sequence = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
        tp.parallelize_module(block, mesh, {
            "norm1": tp.SequenceParallel(), "norm2": tp.SequenceParallel(),
            "attn": tp.PrepareModuleInput(**gather_sequence), "attn.q": tp.ColwiseParallel(),
            "attn.k": tp.ColwiseParallel(), "attn.v": tp.ColwiseParallel(),
            "attn.o": tp.RowwiseParallel(output_layouts=Shard(1)),
            "up": tp.ColwiseParallel(input_layouts=Shard(1)),  # gathers its sequence-sharded input itself
            "down": tp.RowwiseParallel(output_layouts=Shard(1))})
        prof = flopscope.profile(block, torch.randn(B, seq // t, d), mode=mode, backward=True)  # a sequence shard
    unsharded = add(attention(B, seq, seq, d, h), {"ffn_up": B * seq * d * d_ff, "ffn_down": B * seq * d_ff * d})
    forward = {role: macs for role, macs in prof.by_role(phase="forward").items() if macs}
    assert forward == {role: macs // t for role, macs in unsharded.items()}  # whole sequence, a quarter of the heads
    activation = B * seq * d * 4  # the whole [B, n, d] activation in fp32: Megatron's volume
    ahead = [(row.kind, row.role, row.calls, row.bytes) for row in prof.collectives() if row.phase == "forward"]
    # Megatron (Korthikanti et al. 2022, §4.2.2): g becomes an all-gather, ḡ a reduce-scatter, before and after each
    assert ahead == [("all_gather", "", 1, activation), ("reduce_scatter", "out_proj", 1, activation),
                     ("all_gather", "", 1, activation), ("reduce_scatter", "ffn_down", 1, activation)]
    behind = [row for row in prof.collectives() if row.phase == "backward"]
    calls = {kind: sum(row.calls for row in behind if row.kind == kind) for kind in ("all_gather", "reduce_scatter")}
    assert calls == {"all_gather": 2, "reduce_scatter": 2}  # the same in reverse
    assert sum(row.bytes for row in behind) == 4 * activation
    table = compare(prof.collectives(), megatron(B, seq, d, 1, element_bytes=4, backward=True, sequence_parallel=True))
    assert [line.split()[6] for line in table.splitlines()[2:]] == ["yes"] * 4


def test_a_sharded_model_outside_its_world_is_refused_by_name() -> None:
    with fake_world(2) as mesh:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        tp.parallelize_module(model, mesh, {"0": tp.ColwiseParallel()})
    with pytest.raises(flopscope.ConfigurationError, match=r"parameter '0.weight'.*no process group is initialised"):
        flopscope.profile(model, torch.randn(2, 8))


# ------------------------------------------------------------------------------------- tensor_parallel (the HF plan)
V_HF = 160  # not the FFN width: a token table shaped like an FFN weight would be taken for the LM head's


def hf_llama(kv: int, device: str = "cpu", d_ff_: int = d_ff) -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff_, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=kv, vocab_size=V_HF)
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(config)


def _layer_rows(prof) -> list[tuple]:
    return [(row.kind, row.group, row.module, row.role, row.phase, row.calls, row.bytes) for row in prof.collectives()
            if row.module.startswith("model.layers.")]


@pytest.mark.parametrize(("kv", "t", "device"), [(h, 2, "cpu"), (h, 8, "cpu"), (2, 2, "cpu"), (2, 2, "meta")])
def test_tensor_parallel_applies_the_models_own_plan(kv, t, device) -> None:
    from flopscope.workloads.distributed import fsdp_units, hf_plan, predicted_collectives, tensor_parallel

    ids = torch.randint(0, V_HF, (B, n))
    model = hf_llama(kv, device)
    plan = hf_plan(model)
    if not hf_plan_shards_the_embedding():
        pytest.skip("this transformers' tensor-parallel plan for Llama leaves the token embedding whole")
    assert plan["lm_head"] == "colwise_gather_output" and plan["model.layers.*.self_attn.q_proj"] == "colwise"
    with fake_world(t) as mesh:
        tensor_parallel(model, mesh)
        prof = flopscope.profile(model, ids, mode="fake", backward=True)
        predicted = predicted_collectives(model, B, n, backward=True)
        units = fsdp_units(model)
        if kv == h:  # the hand-written Megatron plan of the first test, on the same world
            by_hand = flopscope.profile(tensor_parallel_llama(mesh), torch.randint(0, V, (B, n)), mode="fake",
                                        backward=True)
    assert not dist.is_initialized()
    unsharded = add(times(L, add(attention(B, n, n, d, h, kv), ffn(B, n, d, d_ff, gated=True))),
                    {"logits": B * n * d * V_HF})
    forward = {role: macs for role, macs in prof.by_role(phase="forward").items() if macs}
    # every projection and the attention core split t ways; the LM head too (colwise_gather_output)
    assert forward == {role: macs // t for role, macs in unsharded.items()}
    activation, logits = B * n * d * 4, B * n * V_HF * 4  # fp32 [B, n, d] and [B, n, V]
    rows = prof.collectives()
    assert all(row.group == t for row in rows)
    ahead = [(row.kind, row.module, row.role, row.calls, row.bytes) for row in rows if row.phase == "forward"]
    # the vocabulary-parallel embedding sums its ranks' partial lookups (no multiply: attributed where it ran);
    # Megatron's two all-reduces per layer; the LM head's sharded logits all-gathered
    assert ahead == [("all_reduce", "model", "", 1, activation)] + [
        ("all_reduce", f"model.layers.{i}.{m}", role, 1, activation) for i in range(L)
        for m, role in (("self_attn.o_proj", "out_proj"), ("mlp.down_proj", "ffn_down"))] + [
        ("all_gather", "lm_head", "logits", 1, logits)]
    behind = [(row.kind, row.module.rsplit(".", 1)[-1], row.calls, row.bytes) for row in rows
              if row.phase == "backward"]
    # the input gradient of each column-parallel module (the LM head among them) all-reduced once
    assert sorted(behind) == sorted([("all_reduce", "lm_head", 1, activation)] + [
        ("all_reduce", m, 1, activation) for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")] * L)
    if kv == h:  # the layers' collectives and every role but the LM head's as with the plan written by hand
        assert _layer_rows(prof) == _layer_rows(by_hand)
        mine, theirs = prof.by_role(), by_hand.by_role()
        assert {r: m for r, m in mine.items() if r != "logits"} == {r: m for r, m in theirs.items() if r != "logits"}
    table = compare(rows, predicted)
    assert [line.split()[6] for line in table.splitlines()[2:]] == ["yes", "NO", "yes"]  # DTensor's backward: 5 / layer
    # FSDP units: the root (embedding and LM head shards, the final norm), then each layer's shard and its norms
    layer = 4 * ((2 * d * d + 2 * d * (kv * d // h) + 3 * d * d_ff) // t + 2 * d)
    assert units == [("", 4 * (2 * V_HF * d // t + d))] + [(f"model.layers.{i}", layer) for i in range(L)]


def test_tensor_parallel_refuses_what_it_cannot_shard() -> None:
    from flopscope.workloads.distributed import tensor_parallel

    cases = [(3, hf_llama(h), {}, "mesh of size 3 does not divide config num_attention_heads=8"),
             (4, hf_llama(2), {}, "size 4 does not divide config num_key_value_heads=2"),
             (8, hf_llama(h, d_ff_=100), {}, "size 8 does not divide config intermediate_size=100"),
             (2, hf_llama(h), {"plan": {"model.layers.*.mlp.up_proj": "packed_colwise"}},
              r"module 'model.layers.0.mlp.up_proj': tensor-parallel style 'packed_colwise'"),
             (2, hf_llama(h), {"plan": {"model.decoder.*": "colwise"}}, "'model.decoder.\\*' matches no module")]
    for world, model, kwargs, message in cases:
        with fake_world(world) as mesh, pytest.raises(flopscope.ConfigurationError, match=message):
            tensor_parallel(model, mesh, **kwargs)
        assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())  # untouched
    with fake_world(4, mesh_shape=(2, 2), mesh_dim_names=("dp", "cp")) as mesh, \
            pytest.raises(flopscope.ConfigurationError, match="named 'tp'"):
        tensor_parallel(hf_llama(h), mesh)
    assert not dist.is_initialized()


def test_a_model_sharded_on_meta_counts_on_fake_tensors_and_stays_on_meta() -> None:
    vocab = 160  # not the FFN width
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=h, vocab_size=vocab)
    t = 4
    with fake_world(t) as mesh:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
        shard_layers(model, mesh)
        prof = flopscope.profile(model, torch.zeros(B, n, dtype=torch.long), mode="fake")
    unsharded = add(times(L, add(attention(B, n, n, d, h), ffn(B, n, d, d_ff, gated=True))),
                    {"logits": B * n * d * vocab}, rotary(n, d // h))
    assert {role: macs for role, macs in prof.by_role().items() if macs} == \
        {role: macs // t if role in SHARDED else macs for role, macs in unsharded.items()}
    assert model.model.layers[0].self_attn.q_proj.weight.to_local().is_meta  # the user's shards are untouched


def test_the_job_total_is_the_sum_of_its_ranks_also_when_they_differ() -> None:
    from flopscope.workloads.distributed import profile_world, rank_table, summary

    widths = [64, 256, 512, 256, 64]  # four Linear layers, split unevenly over two pipeline stages
    stages = {0: range(0, 3), 1: range(3, 4)}

    def build(mesh) -> torch.nn.Module:
        rank = mesh.get_local_rank()
        return torch.nn.Sequential(*(torch.nn.Linear(widths[i], widths[i + 1]) for i in stages[rank]))

    def stage_input(rank: int) -> torch.Tensor:
        return torch.zeros(ROWS, widths[stages[rank][0]])

    ranks = [profile_world(build, stage_input(r), world_size=2, ranks=[r], mode="fake")[0] for r in (0, 1)]
    per_rank = [prof.total() for prof in ranks]
    assert per_rank == [sum(ROWS * widths[i] * widths[i + 1] for i in stages[r]) for r in (0, 1)]
    assert per_rank[0] != per_rank[1]
    assert sum(per_rank) == ROWS * (64 * 256 + 256 * 512 + 512 * 256 + 256 * 64)  # the whole model, once
    table = rank_table([summary(prof, rank=r, world=2) for r, prof in enumerate(ranks)])
    assert f"job: {sum(per_rank):,} MACs over 2 ranks" in table
    assert f"imbalance (max / mean) {max(per_rank) / (sum(per_rank) / 2):.3f}" in table
    assert not dist.is_initialized()


def transformers_sharded(model: torch.nn.Module, tp_size: int, ep_size: int = 1) -> torch.nn.Module:
    """``model`` sharded as transformers shards it when loaded with ``DistributedConfig(tp_size=..., ep_size=...)``:
    its own plans applied by its own code (layers wrapped in forwards that swap their shards in), in the world that is
    open."""
    from transformers.distributed.configuration_utils import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    config = DistributedConfig(tp_size=tp_size, ep_size=ep_size)
    _, meshes = initialize_distributed_mesh(config)
    return type(model).maybe_distribute_model(model, config, meshes)


def test_a_model_sharded_by_transformers_keeps_its_roles() -> None:
    """transformers' own tensor parallelism wraps each sharded layer's forward in a closure over the module it was
    given, which swaps the local shards of that module's parameters in for the call: in a fake count, code reaching
    the user's module (not the shadow holding the fake state) reads the user's shards, and they are parameters too.
    Every projection's role is kept, each split t ways (before: all in "other")."""
    if not transformers_distributes():
        pytest.skip("this transformers shards a model only while loading its weights")
    t, kv = 2, 2
    with torch.device("meta"):
        model = hf_llama(kv, "meta")
    with fake_world(t):
        transformers_sharded(model, t)
        prof = flopscope.profile(model, torch.zeros(B, n, dtype=torch.long), mode="fake")
        assert model.model.layers[0].self_attn.q_proj.weight.to_local().is_meta  # the user's shards untouched
    unsharded = add(times(L, add(attention(B, n, n, d, h, kv), ffn(B, n, d, d_ff, gated=True))),
                    {"logits": B * n * d * V_HF})
    roles = {role: macs for role, macs in prof.by_role().items() if macs}
    assert {role: roles.get(role) for role in unsharded} == {role: macs // t for role, macs in unsharded.items()}


def test_expert_parallel_counts_the_routes_that_reach_this_ranks_experts() -> None:
    """transformers' expert parallelism at inference (ep_size == tp_size: every rank runs its own experts on the
    batch the group shares; the routes to other ranks' experts are masked to an id past its own, sorted after the
    last group and skipped by the grouped matmul). A real count charges this rank's experts the routes that picked
    them (read from the router's choice in the same run); a fake count, where routing is not known, charges every
    route and says that it is an upper bound."""
    if not transformers_distributes():
        pytest.skip("this transformers shards a model only while loading its weights")
    experts, top_k, d_ff_moe, tokens, t = 4, 2, 32, 16, 2
    config = transformers.MixtralConfig(hidden_size=d, intermediate_size=d_ff_moe, num_hidden_layers=1,
                                        num_attention_heads=h, num_key_value_heads=2, vocab_size=V,
                                        num_local_experts=experts, num_experts_per_tok=top_k)
    torch.manual_seed(0)
    ids = torch.randint(0, V, (1, tokens))
    chosen = []
    with fake_world(t):
        model = transformers_sharded(transformers.MixtralForCausalLM(config).eval(), t, ep_size=t)
        router = model.model.layers[0].mlp.gate
        handle = router.register_forward_hook(lambda module, args, out: chosen.append(out[2]))
        with torch.no_grad():
            real = flopscope.profile(model, ids, mode="real")
            fake = flopscope.profile(model, ids, mode="fake")
        handle.remove()
    # rank 0 holds experts 0 and 1; the routes that picked them, in the real run
    routes = int((chosen[0] < experts // t).sum())
    assert 0 < routes < tokens * top_k
    for role in ("ffn_up", "ffn_gate", "ffn_down"):
        assert real.by_role()[role] == routes * d * d_ff_moe, role
        assert fake.by_role()[role] == tokens * top_k * d * d_ff_moe, role
    assert any("upper bound under expert parallelism" in note for note in fake.notes)
    assert not any("expert parallelism" in note for note in real.notes)
    # (its two grouped matmuls, gate and up fused, then down: this rank holds half of the experts)
    assert list(fake.unrouted().values()) == [Fraction(1, t)] * 2 and not real.unrouted()
    assert fake.by_role()["q_proj"] == real.by_role()["q_proj"] == tokens * d * d // t


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_an_expert_parallel_modules_grouped_matmul_is_an_upper_bound_only_where_its_offsets_are_not_known() -> None:
    """On fake tensors, offsets computed from an input's values are known (the count stops at offs[-1]: exact, no
    note), offsets from routing on the data are not (every row counted, and the notes say it is an upper bound); an
    offset written over after it was computed is not known either."""
    rows, k, n = 16, 8, 4

    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, k, n))
            self._is_expert_parallel = True  # (as transformers' MoEParamShard marks experts split over ranks)

        def forward(self, x, counts, routed: bool, written: bool):
            if routed:
                counts = torch.histc(x[:, 0], bins=3, min=-1.0, max=1.0).int()
            offs = counts.cumsum(0).int()
            if written:
                offs.copy_(x[:3, 0].int())
            return torch._grouped_mm(x, self.w, offs)

    x, counts = torch.randn(rows, k), torch.tensor([3, 4, 5])
    for routed, written, macs, noted in ((False, False, 12 * k * n, False), (True, False, rows * k * n, True),
                                         (False, True, rows * k * n, True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = flopscope.profile(Experts(), x, counts, routed, written, mode="fake")
        assert prof.total() == macs, (routed, written)
        assert any("upper bound under expert parallelism" in note for note in prof.notes) is noted, (routed, written)
        # (its parameters are no shards: which share of the experts it holds is not said)
        assert list(prof.unrouted().values()) == ([None] if noted else [])
