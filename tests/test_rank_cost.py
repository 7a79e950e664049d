"""One rank's serving cost model under tensor parallelism (``flopscope.workloads.rank_cost_model``): polynomials
fitted through concrete counts of the rank's shards, against concrete counts of the same shards at sizes outside the
fitted ones and against the closed form of a rank's share, on tiny configs built on meta in a fake world."""

from __future__ import annotations

import copy
import json
import re
from fractions import Fraction

import jsonschema
import pytest
import torch

import flopscope
from flopscope.workloads import cost_model, rank_cost_model
from flopscope.workloads.distributed import fake_world, hf_plan, tensor_parallel
from flopscope.workloads.step_cost import count_request
from flopscope.workloads.symbolic import symbolic_limits, symbolic_sizes_kept

transformers = pytest.importorskip("transformers")
# (the unsharded templates are symbolic traces: a PyTorch that makes symbolic sizes constants refuses them)
pytestmark = pytest.mark.skipif(not symbolic_sizes_kept(), reason=str(symbolic_limits()))

from test_generation_templates import FAMILIES, L, V, d, d_ff, h, head, kv, llama  # noqa: E402
from test_step_cost import SCHEMA  # noqa: E402

from zoo import transformers_distributes  # noqa: E402

TP = 2
# (t, c) of fresh prompts, decodes and chunks, none of them among the sizes the fit counted (2 to 5)
POINTS = [(40, 0), (1, 300), (9, 70), (33, 6)]


def sharded_counts(model: torch.nn.Module, points: list[tuple[int, int]]) -> dict:
    with fake_world(TP) as mesh:
        shard = tensor_parallel(copy.deepcopy(model), mesh)
        return {point: count_request(shard, None, (), *point) for point in points}


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_a_ranks_requests_are_the_concrete_counts_of_its_shards(family: str) -> None:
    """MACs per role, bytes and the weights read, at sizes far from those fitted, equal a concrete count of the
    sharded model there. Gemma 2's first pieces hold from a cache of its window (6) on, where they were traced:
    fitted there, not at the smallest sizes."""
    model = FAMILIES[family]()
    rank = rank_cost_model(model, TP, context=8, chunk=4)
    for point, counted in sharded_counts(model, POINTS).items():
        assert rank.request(*point) == counted.by_role, point
        assert rank.request_bytes(*point) == (counted.bytes, counted.weights), point


def test_a_ranks_share_is_the_closed_form() -> None:
    """Llama's plan splits heads and the FFN's width over the ranks and the LM head's vocabulary: per rank, per
    layer q and o d·d/TP, k and v d·(kv·head)/TP, the FFN 3·d·d_ff/TP, scores and weighted sum (h/TP)·head·t·(t+c)
    for a chunk; the head d·V/TP for the one position kept."""
    rank = rank_cost_model(llama(), TP, context=8, chunk=4)
    layers = L
    t, c = 9, 70
    per_layer = {"q_proj": t * d * d // TP, "k_proj": t * d * kv * head // TP, "v_proj": t * d * kv * head // TP,
                 "out_proj": t * d * d // TP, "attn_scores": (h // TP) * head * t * (t + c),
                 "attn_weighted_sum": (h // TP) * head * t * (t + c), "ffn_up": t * d * d_ff // TP,
                 "ffn_gate": t * d * d_ff // TP, "ffn_down": t * d_ff * d // TP}
    expected = {role: layers * macs for role, macs in per_layer.items()} | {"logits": d * V // TP}
    assert rank.request(t, c) == expected
    whole = cost_model(llama(), context=8, chunk=4)
    assert sum(rank.request(t, c).values()) * TP == sum(whole.request(t, c).values())


def test_a_mixture_of_experts_rank_under_transformers_plan() -> None:
    """Mixtral's plan (transformers 5.24) shards its experts with styles of transformers' own (packed_colwise gate and
    up, moe_tp_experts), so transformers applies it, as when it loads the model with DistributedConfig(tp_size=2):
    each of the top-2 routes of every token meets its expert's share of the FFN width, d_ff/TP. From 5.25 the plan
    leaves the experts to expert parallelism: whole on every rank. The router (d x E) is whole on every rank. Per
    rank, a chunk of t on a cache of c, against the closed form and a concrete count of the shards."""
    if not transformers_distributes():
        pytest.skip("this transformers shards a model only while loading its weights")
    model = FAMILIES["mixtral"]()
    experts, top_k = model.config.num_local_experts, model.config.num_experts_per_tok
    split = TP if any(".experts" in pattern for pattern in hf_plan(model)) else 1
    rank = rank_cost_model(model, TP, context=8, chunk=4)
    t, c = 9, 70
    per_layer = {"q_proj": t * d * d // TP, "k_proj": t * d * kv * head // TP, "v_proj": t * d * kv * head // TP,
                 "out_proj": t * d * d // TP, "attn_scores": (h // TP) * head * t * (t + c),
                 "attn_weighted_sum": (h // TP) * head * t * (t + c), "ffn_up": t * top_k * d * d_ff // split,
                 "ffn_gate": t * top_k * d * d_ff // split, "ffn_down": t * top_k * d_ff * d // split,
                 "other": t * d * experts}
    assert rank.request(t, c) == {role: L * macs for role, macs in per_layer.items()} | {"logits": d * V // TP}
    for point, counted in sharded_counts(model, POINTS).items():
        assert rank.request(*point) == counted.by_role, point
        assert rank.request_bytes(*point) == (counted.bytes, counted.weights), point


@pytest.mark.parametrize("routing", ["balanced", "upper"])
def test_an_expert_parallel_rank_under_a_stated_routing(routing: str) -> None:
    """experts=True splits Mixtral's experts over the ranks too, as transformers' expert parallelism (ep_size =
    tp_size): rank 0 holds experts 0 and 1 of 4, whole, and runs them on the batch the group shares. Which routes
    reach them is data: under balanced routing each expert gets as many of the t·top_k routes as any other, so the
    rank's two experts get half of them (each route through d x d_ff up, gate and down); under "upper" every route
    meets them. Attention is split by heads, the router (d x E) whole. Per rank, a chunk of t on a cache of c, against
    the closed form and against concrete counts of the shards at sizes outside the fitted ones; the bytes are the same
    under both routings (those of the tensors the grouped matmuls are given)."""
    if not transformers_distributes():
        pytest.skip("this transformers shards a model only while loading its weights")
    model = FAMILIES["mixtral"]()
    experts, top_k = model.config.num_local_experts, model.config.num_experts_per_tok
    whole = cost_model(model, context=8, chunk=4)
    rank = rank_cost_model(model, TP, experts=True, routing=routing, unsharded=whole)
    routes = {"balanced": Fraction(1, TP), "upper": 1}[routing]
    t, c = 9, 70
    per_layer = {"q_proj": t * d * d // TP, "k_proj": t * d * kv * head // TP, "v_proj": t * d * kv * head // TP,
                 "out_proj": t * d * d // TP, "attn_scores": (h // TP) * head * t * (t + c),
                 "attn_weighted_sum": (h // TP) * head * t * (t + c), "ffn_up": t * top_k * routes * d * d_ff,
                 "ffn_gate": t * top_k * routes * d * d_ff, "ffn_down": t * top_k * routes * d_ff * d,
                 "other": t * d * experts}
    assert rank.request(t, c) == {role: L * macs for role, macs in per_layer.items()} | {"logits": d * V // TP}
    with fake_world(TP) as mesh:
        shard = tensor_parallel(copy.deepcopy(model), mesh, experts=True)
        counted = {point: count_request(shard, None, (), *point, balanced=routing == "balanced") for point in POINTS}
    for point, found in counted.items():
        assert rank.request(*point) == found.by_role, point
        assert rank.request_bytes(*point) == (found.bytes, found.weights), point
    other = rank_cost_model(model, TP, experts=True, routing={"balanced": "upper", "upper": "balanced"}[routing],
                            unsharded=whole)
    assert all(rank.request_bytes(*point) == other.request_bytes(*point) for point in POINTS)
    said = {"balanced": "get the share of the routes that they are of the experts", "upper": "an upper bound"}
    assert any(said[routing] in note for note in rank.notes)


def test_expert_parallelism_is_refused_where_no_experts_are_split() -> None:
    """A model without an expert-parallel plan (Llama), a routing that is not a convention: refused, saying why."""
    with pytest.raises(flopscope.ConfigurationError, match="routing="):
        rank_cost_model(llama(), TP, experts=True, routing="uniform", context=8, chunk=4)
    if transformers_distributes():
        with pytest.raises(flopscope.ConfigurationError, match="no expert-parallel plan"):
            rank_cost_model(llama(), TP, experts=True, context=8, chunk=4)


def test_the_users_model_is_not_sharded() -> None:
    model = llama()
    rank_cost_model(model, TP, context=8, chunk=4)
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())
    assert flopscope.profile(model, torch.zeros(1, 8, dtype=torch.long)).total() > 0  # (still a plain model)


def test_a_request_outside_the_fitted_pieces_is_fitted_where_it_falls() -> None:
    """Phi-3 with LongRoPE switches its rope where a sequence passes its original context (8): fitted at 16, its
    first pieces hold from 9 on (its first chunk runs on the cache of 17 that the first decode step leaves). A
    prompt of 5, a decode on a cache of 4 and a chunk of 3 on 4 each take the unsharded piece below the switch,
    fitted anew on a copy sharded in a fake world of its own; a cache of one position (a size the symbolic shapes
    keep constant) is counted concretely on the shards. Each equals a concrete count of the shards, and the
    user's model stays unsharded."""
    model = FAMILIES["phi3_longrope"]()
    rank = rank_cost_model(model, TP, context=16, chunk=4)
    points = [(5, 0), (1, 4), (3, 4), (1, 1), (40, 0)]
    for point, counted in sharded_counts(model, points).items():
        assert rank.request(*point) == counted.by_role, point
        assert rank.request_bytes(*point) == (counted.bytes, counted.weights), point
    assert {kind: [piece.at for piece in pieces] for kind, pieces in rank.pieces.items()} == \
        {"prefill": [(16, 0), (5, 0)], "decode": [(1, 16), (1, 5)], "chunk": [(4, 17), (3, 4)]}
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())


def test_a_piece_too_narrow_to_fit_has_its_requests_counted_on_the_shards() -> None:
    """Gemma 2 below its window (6): a prompt of 5 is a piece of that one length (its guards hold at 5 alone), a
    decode on a cache of 3 one of lengths 2 and 3, too few to fit and check a polynomial through: counted concretely
    on the shards, and said so."""
    model = FAMILIES["gemma2"]()
    rank = rank_cost_model(model, TP, context=8, chunk=4)
    for point, counted in sharded_counts(model, [(5, 0), (1, 3)]).items():
        assert rank.request(*point) == counted.by_role, point
    assert [len(pieces) for pieces in rank.pieces.values()] == [1, 1, 1]
    assert sum("too narrow to fit" in note for note in rank.notes) == 2


def test_tensor_parallel_on_the_command_line(capsys, tmp_path) -> None:
    """``flopscope cost CONFIG --tp 2`` prints rank 0's polynomials: q_proj L·d·d/2 per new position."""
    from flopscope.cli import main

    config = llama().config
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(tmp_path)
    assert main(["cost", str(tmp_path / "config.json"), "--tp", "2", "--context", "8", "--chunk", "4"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 of 2, tensor parallel" in out
    assert re.search(rf"prefill\s+q_proj\s+{L * d * d // TP:,}·t\n", out), out


def test_expert_parallelism_on_the_command_line(capsys, tmp_path) -> None:
    """``flopscope cost CONFIG --tp 2 --ep`` prints rank 0's polynomials with its experts split over the ranks under
    balanced routing: each new position's top_k routes through d x d_ff, half of them on this rank's experts; its
    JSON says which rank of how many, and the routing (valid against the schema). --ep without --tp is refused, by
    ``cost`` and by ``profile``, and with one rank or a data-parallel mesh; --routing without --ep too."""
    from flopscope.cli import main


    if not transformers_distributes():
        pytest.skip("this transformers shards a model only while loading its weights")
    model = FAMILIES["mixtral"]()
    top_k = model.config.num_experts_per_tok
    config = model.config
    config.architectures = ["MixtralForCausalLM"]
    config.save_pretrained(tmp_path)
    path = str(tmp_path / "config.json")
    written = tmp_path / "cost.json"
    assert main(["cost", path, "--tp", "2", "--ep", "--context", "8", "--chunk", "4", "--json", str(written)]) == 0
    out = capsys.readouterr().out
    document = json.loads(written.read_text())
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert document["parallel"] == {"tp": 2, "rank": 0, "experts_split": True, "routing": "balanced"}
    assert "experts split over the ranks, balanced routing" in out
    assert re.search(rf"prefill\s+q_proj.*\n(.*\n)*?\s+ffn_up\s+{L * top_k * d * d_ff // TP:,}·t\n", out), out
    for command in (["cost", path, "--ep"], ["cost", path, "--tp", "1", "--ep"], ["profile", path, "--ep"],
                    ["profile", path, "--tp", "1", "--ep"], ["profile", path, "--tp", "2", "--dp", "2", "--ep"]):
        assert main(command) == 2, command
        assert "--ep splits the experts over the --tp ranks" in capsys.readouterr().err
    assert main(["cost", path, "--tp", "2", "--routing", "upper"]) == 2
    assert "--routing says how the routes reach the experts --ep splits" in capsys.readouterr().err
