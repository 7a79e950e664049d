"""The serving cost model (``flopscope.workloads.cost_model``) against concrete counts of the same computation and
against the closed form, on tiny configs built on meta: a request's MACs per role at sizes inside and outside each
template's domain (a sliding window that binds), a scheduler step as the sum of its requests, and the JSON document
against its schema."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import jsonschema
import pytest
import torch

from flopscope.errors import InputError
from flopscope.predict.polynomial import Polynomial, Polynomial2
from flopscope.workloads import cost_model, profile_generation
from flopscope.workloads.step_cost import COST_SCHEMA, count_request
from flopscope.workloads.symbolic import symbolic_limits, symbolic_sizes_kept

transformers = pytest.importorskip("transformers")
# one symbolic trace per template: a PyTorch that makes symbolic sizes constants refuses them
# (tests/test_symbolic.py checks the refusal)
pytestmark = pytest.mark.skipif(not symbolic_sizes_kept(), reason=str(symbolic_limits()))

from test_generation_templates import FAMILIES, L, V, d, d_ff, h, head, kv, llama  # noqa: E402

SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "cost-1.json"
# (t, c): fresh prompts, decodes, chunks; 1 and small caches below the traced sizes and the window (6)
POINTS = [(5, 0), (12, 0), (1, 9), (1, 3), (1, 1), (3, 5), (7, 11), (2, 2), (6, 20), (4, 1)]


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral_window", "gemma2", "gemma3", "mixtral", "deepseek_v3",
                                    "qwen3_next", "phi3_longrope"])
def test_a_requests_macs_are_those_of_its_concrete_count(family: str) -> None:
    model = FAMILIES[family]()
    cost = cost_model(model, context=8, chunk=4)
    for t, c in POINTS:
        assert cost.request(t, c) == count_request(model, None, (), t, c).by_role, (t, c)


def test_the_chunk_template_is_the_closed_form() -> None:
    """Llama, per request of t new positions on a cache of c, per layer: q and o d·d each, k and v d·(kv·head)
    each, the FFN 3·d·d_ff, per position; the scores and the weighted sum h·head·t·(c + t) each (executed: the
    kernels' whole block); the head d·V for the last position only."""
    cost = cost_model(llama(), context=8, chunk=4)
    chunk = cost.chunk
    assert chunk["q_proj"].polynomial == Polynomial2({(1, 0): Fraction(L * d * d)})
    assert chunk["k_proj"].polynomial == Polynomial2({(1, 0): Fraction(L * d * kv * head)})
    assert chunk["ffn_down"].polynomial == Polynomial2({(1, 0): Fraction(L * d * d_ff)})
    assert chunk["attn_scores"].polynomial == Polynomial2({(2, 0): Fraction(L * h * head),
                                                           (1, 1): Fraction(L * h * head)})
    assert chunk["logits"].polynomial == Polynomial2({(0, 0): Fraction(d * V)})
    assert cost.decode["attn_weighted_sum"].polynomial == Polynomial((Fraction(L * h * head), Fraction(L * h * head)))
    assert cost.prefill["attn_scores"].polynomial == Polynomial((Fraction(0), Fraction(0), Fraction(L * h * head)))


def test_a_scheduler_step_is_the_sum_of_its_requests() -> None:
    """Eight decodes of other contexts and one prefill chunk: the step's MACs per role are the sum of the
    requests' concrete counts."""
    model = FAMILIES["mistral_window"]()
    cost = cost_model(model, context=8, chunk=4)
    requests = [(1, c) for c in (3, 5, 6, 7, 9, 12, 20, 31)] + [(16, 24)]
    expected: dict[str, int] = {}
    for t, c in requests:
        for role, macs in count_request(model, None, (), t, c).by_role.items():
            expected[role] = expected.get(role, 0) + macs
    assert cost.iteration(requests) == {role: v for role, v in expected.items() if v}


def test_the_json_validates_against_its_schema_and_reads_back() -> None:
    """The document a simulator reads: valid against docs/schemas/cost-1.json; its terms give the request's
    MACs without flopscope (exact fractions summed by hand here)."""
    cost = cost_model(FAMILIES["deepseek_v3"](), context=8, chunk=4)
    document = json.loads(json.dumps(cost.to_json()))
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert document["schema"] == COST_SCHEMA
    t, c = 5, 9
    for role, entry in document["templates"]["chunk"]["macs_by_role"].items():
        value = sum(Fraction(k) * t ** i * c ** j for i, j, k in entry["terms"])
        assert value == cost.request(t, c).get(role, 0), role


def test_a_layer_that_pads_its_chunks_is_an_expression_in_the_json() -> None:
    """Qwen3-Next's gated DeltaNet pads the sequence to its chunk size: the prefill's recurrent work is a floor
    division of t, written as a Python expression that evaluates to the concrete count where the conditions
    hold."""
    model = FAMILIES["qwen3_next"]()
    cost = cost_model(model, context=8, chunk=4)
    document = cost.to_json()
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    expressions = {role: entry["expression"] for role, entry in document["templates"]["prefill"]["macs_by_role"].items()
                   if "expression" in entry}
    assert expressions
    # (one chunk of 64: inside the domain the trace at 8 holds for)
    concrete = count_request(model, None, (), 40, 0).by_role
    for role, code in expressions.items():
        assert eval(code, {}, {"t": 40}) == concrete.get(role, 0), role
    assert cost.request(70, 0) == count_request(model, None, (), 70, 0).by_role  # (two chunks: counted concretely)


def test_bad_requests_are_refused_with_the_sizes() -> None:
    cost = cost_model(llama(), context=8, chunk=4)
    with pytest.raises(InputError, match="t = 0, c = 5"):
        cost.request(0, 5)
    with pytest.raises(InputError, match="at least 2"):
        cost_model(llama(), context=1)


def test_the_cost_command_prices_a_step_from_the_closed_form(tmp_path: Path) -> None:
    """``flopscope cost`` on a tiny Llama: the step of two decodes on 9 cached positions and a chunk of 4 on 5,
    written to JSON, is the closed form's sum: per decode L·(layer + 2·h·head·(c + 1)) + d·V, per chunk
    L·(t·layer + 2·h·head·t·(c + t)) + d·V, where a layer's projections and FFN are 2·d·d + 2·d·kv·head +
    3·d·d_ff per position."""
    from flopscope.cli import main

    out = tmp_path / "cost.json"
    settings = {"hidden_size": d, "intermediate_size": d_ff, "num_hidden_layers": L, "num_attention_heads": h,
                "num_key_value_heads": kv, "vocab_size": V}
    argv = ["cost", "hf:llama", *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")],
            "--context", "8", "--chunk", "4", "--step", "1@9x2,4@5", "--json", str(out)]
    assert main(argv) == 0
    layer = 2 * d * d + 2 * d * kv * head + 3 * d * d_ff
    decode = L * (layer + 2 * h * head * (9 + 1)) + d * V
    chunk = L * (4 * layer + 2 * h * head * 4 * (5 + 4)) + d * V
    document = json.loads(out.read_text())
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert document["priced_step"]["macs"] == 2 * decode + chunk


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral_window", "mixtral", "qwen3_next", "phi3_longrope"])
def test_a_requests_bytes_are_those_of_its_concrete_count(family: str) -> None:
    """Bytes as the ops move them (weights included) and the weights' share, inside and outside the domains."""
    model = FAMILIES[family]()
    cost = cost_model(model, context=8, chunk=4)
    for t, c in POINTS:
        counted = count_request(model, None, (), t, c)
        assert cost.request_bytes(t, c) == (counted.bytes, counted.weights), (t, c)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_batch_of_equal_decodes_reads_the_weights_once(family: str) -> None:
    """B decodes on caches of c: the step's bytes are those of one forward of batch B (each activation B times,
    each weight and buffer once)."""
    model = FAMILIES[family]()
    cost = cost_model(model, context=8, chunk=4)
    for batch, c in [(3, 9), (4, 12)]:
        prof = profile_generation(model, torch.zeros(batch, c, dtype=torch.long), 2)
        assert cost.iteration_bytes([(1, c)] * batch) == prof.bytes_by_module(2)[""]


def test_a_step_is_priced_on_a_roofline_as_a_bound() -> None:
    """Eight decodes and a chunk at a given peak and bandwidth: the compute time is the FLOPs over the peak (a
    role's measured efficiency divides it), the memory time the bytes over the bandwidth, the bound the larger."""
    cost = cost_model(llama(), context=8, chunk=4)
    requests = [(1, 9)] * 8 + [(16, 24)]
    flops = 2 * sum(cost.iteration(requests).values())
    moved = cost.iteration_bytes(requests)
    price = cost.price(requests, peak=1e12, bandwidth=1e9)
    assert (price.flops, price.bytes) == (flops, moved)
    assert price.compute_seconds == pytest.approx(flops / 1e12)
    assert price.memory_seconds == pytest.approx(moved / 1e9)
    assert price.bound == "memory" and price.seconds == price.memory_seconds
    ffn = 2 * cost.iteration(requests)["ffn_up"]
    slower = cost.price(requests, peak=1e12, bandwidth=1e9, efficiency={"ffn_up": 0.5})
    assert slower.compute_seconds == pytest.approx((flops + ffn) / 1e12)


def test_the_cost_command_names_each_tools_difference(capsys: pytest.CaptureFixture[str]) -> None:
    """``flopscope cost --tools``: a row per tool and phase, every difference named, none unexplained (d_ff = 3.5 d:
    llm-analysis's loader knows a gated MLP only by that ratio)."""
    from flopscope.cli import main

    settings = {"hidden_size": d, "intermediate_size": 7 * d // 2, "num_hidden_layers": L, "num_attention_heads": h,
                "num_key_value_heads": kv, "vocab_size": V}
    argv = ["cost", "hf:llama", *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")],
            "--context", "8", "--chunk", "4", "--tools", "--prompt", "12", "--decode-at", "20"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("the analytic tools"):]
    assert all(name in table for name in ("vllm", "llm-viewer", "llm-analysis", "nanogpt", "torchtitan", "megatron",
                                          "eleuther"))
    assert "unexplained" not in table
    assert "cache omitted" in table and "not modelled" not in table


def test_a_request_past_a_guard_is_traced_once_more_there() -> None:
    """Mistral traced at a cache of 4, below its window of 6: a decode at 20 falls outside the first piece's
    guards, so the decode template is traced again there; a decode at 25 then reads that piece, with no third
    trace. Both equal their concrete counts, and the JSON lists the second piece."""
    model = FAMILIES["mistral_window"]()
    cost = cost_model(model, context=4, chunk=2)
    assert len(cost.pieces["decode"]) == 1
    for c in (20, 25):
        assert cost.request(1, c) == count_request(model, None, (), 1, c).by_role
    assert len(cost.pieces["decode"]) == 2
    document = cost.to_json()
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert len(document["templates"]["decode"]["pieces"]) == 1


def test_the_decode_sweep_lists_each_contexts_step(capsys: pytest.CaptureFixture[str]) -> None:
    """``--decode-sweep 9,30 --batch 3``: each row is the step of three decodes at that context, its FLOPs and
    bytes those of the API."""
    from flopscope.cli import main

    settings = {"hidden_size": d, "intermediate_size": d_ff, "num_hidden_layers": L, "num_attention_heads": h,
                "num_key_value_heads": kv, "vocab_size": V}
    argv = ["cost", "hf:llama", *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")],
            "--context", "8", "--chunk", "4", "--decode-sweep", "9,30", "--batch", "3", "--dtype", "float32"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    cost = cost_model(llama(), context=8, chunk=4)
    for c in (9, 30):
        step = [(1, c)] * 3
        flops = 2 * sum(cost.iteration(step).values())
        assert f"{c:,}  " in printed and f"{flops:,}" in printed and f"{cost.iteration_bytes(step):,}" in printed


def test_a_prefill_keeps_its_roles_when_a_chunk_follows_it() -> None:
    """Qwen3-Next's gated DeltaNet layers (0 to 2 of 4; layer 3 attends) project q, k, v and z in one fused
    ``in_proj_qkvz``; a chunk after the prefill reads the convolution state the prefill left, the last positions of
    its q, k, v columns. The prefill's projections are charged by what the prefill does with their columns, not by
    the chunk's reading of that state: per layer P·d·(2·16) for q and k and P·d·(4·16) for v (2 key and 4 value
    heads of 16), the attention layer's P·d·(h·head) for q (its gate's half is no query) and P·d·(kv·head) for k
    and v; as in a capture of the prefill alone."""
    from flopscope.workloads import step_cost
    from flopscope.workloads.generation import profile_generation

    model, prompt = FAMILIES["qwen3_next"](), 5
    prefill = step_cost._chunk_profile(model, prompt, 3, None, ()).steps()[0].by_role
    linear, full = 3, 1
    assert {role: prefill[role] for role in ("q_proj", "k_proj", "v_proj")} == {
        "q_proj": linear * prompt * d * 2 * 16 + full * prompt * d * h * head,
        "k_proj": linear * prompt * d * 2 * 16 + full * prompt * d * kv * head,
        "v_proj": linear * prompt * d * 4 * 16 + full * prompt * d * kv * head}
    alone = profile_generation(model, torch.zeros(1, prompt, dtype=torch.long), 1).steps()[0].by_role
    assert prefill == alone


def test_a_decode_step_keeps_its_roles_when_a_chunk_follows_it() -> None:
    """A step's roles are what that step does with its values, whatever steps follow it. In one capture of a
    Qwen3-Next prefill, a decode step and a chunk (the run the cost model traces), the chunk reads the convolution
    state the decode step left (the last positions of its fused q, k, v columns): the decode step is charged as in
    a capture of the prefill and the decode step alone, its attention layer's projections d·(h·head) for q and
    d·(kv·head) for k and v (one position)."""
    from flopscope.workloads import step_cost
    from flopscope.workloads.generation import profile_generation

    model, prompt = FAMILIES["qwen3_next"](), 5
    steps = step_cost._chunk_profile(model, prompt, 3, None, (), decodes=1).steps()
    assert len(steps) == 3
    decode = steps[1].by_role
    full = 1
    assert {role: decode[role] for role in ("q_proj", "k_proj", "v_proj")} == {
        "q_proj": full * d * h * head, "k_proj": full * d * kv * head, "v_proj": full * d * kv * head}
    alone = profile_generation(model, torch.zeros(1, prompt, dtype=torch.long), 2).steps()
    assert decode == alone[1].by_role
    assert steps[0].by_role == alone[0].by_role
