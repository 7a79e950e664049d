"""Generation step by step (prefill vs decode) and bytes moved, against closed forms."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
from torch import nn

import flopscope
from flopscope.workloads.generation import DECODE, PREFILL

from closed_forms import add, rotary

transformers = pytest.importorskip("transformers")
d, h, n_kv, d_ff, L, V = 64, 4, 2, 128, 2, 100
d_k = d // h
B, PROMPT, NEW = 2, 7, 5


def llama() -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def decode_roles(c: int) -> dict[str, int]:
    """One new token per sequence attending to c positions: per layer, projections d·(h·d_k) for Q,
    2·d·(h_kv·d_k) for K and V, (h·d_k)·d for the output, the gated FFN 3·d·d_ff, scores and weighted sum
    h·c·d_k each; then the LM head d·V; times the batch."""
    layer = {"q_proj": d * h * d_k, "k_proj": d * n_kv * d_k, "v_proj": d * n_kv * d_k, "out_proj": h * d_k * d,
             "attn_scores": h * c * d_k, "attn_weighted_sum": h * c * d_k,
             "ffn_up": d * d_ff, "ffn_gate": d * d_ff, "ffn_down": d_ff * d}
    return add({role: B * L * macs for role, macs in layer.items()}, {"logits": B * d * V}, rotary(1, d_k, rows=B))


@pytest.fixture(scope="module")
def generated() -> tuple[nn.Module, torch.Tensor, flopscope.Profile]:
    model = llama()
    ids = torch.randint(1, V, (B, PROMPT))
    with flopscope.profiler(model, mode="real") as prof:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                       do_sample=False, pad_token_id=0)
    return model, ids, prof.result


def test_generate_is_one_prefill_then_one_decode_step_per_new_token(generated) -> None:
    model, ids, prof = generated
    steps = prof.steps()
    assert [s.phase for s in steps] == [PREFILL] + [DECODE] * (NEW - 1)
    assert [(s.batch, s.tokens, s.context) for s in steps] == \
        [(B, PROMPT, PROMPT)] + [(B, 1, PROMPT + i) for i in range(1, NEW)]
    # the prefill is a plain forward of the prompt (generate keeps the logits of the last position only)
    plain = flopscope.profile(model, ids, logits_to_keep=1).by_role()
    # (generate passes position ids for each sequence: transformers < 5.19 makes the rotary angles of each)
    assert steps[0].by_role == add({role: macs for role, macs in plain.items() if macs}, rotary(PROMPT, d_k, B - 1))
    for step in steps[1:]:
        assert dict(step.by_role) == decode_roles(step.context)
        assert step.kv_macs == 2 * B * L * h * step.context * d_k
        assert step.seconds is not None and step.seconds > 0
    assert sum(s.macs for s in steps) == prof.total()
    assert sum(s.bytes for s in steps) == prof.total_bytes()


def test_decode_flops_per_token_is_the_exact_polynomial_in_the_context(generated) -> None:
    _, _, prof = generated
    scaling = prof.decode_scaling()
    assert scaling.lengths == tuple(PROMPT + i for i in range(1, NEW))
    per_sequence = {role: macs // B for role, macs in decode_roles(0).items()}  # the constant terms
    for role, poly in scaling.polynomials.items():
        assert poly is not None
        slope = L * h * d_k if role in ("attn_scores", "attn_weighted_sum") else 0
        assert (poly.coefficient(0), poly.coefficient(1), poly.degree) == (per_sequence[role], slope, int(bool(slope)))


def test_decode_scaling_needs_three_decode_steps() -> None:
    model = llama()
    with flopscope.profiler(model, mode="real") as prof:
        model.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False,
                       pad_token_id=0)
    with pytest.raises(flopscope.FlopscopeError, match="3 or more distinct contexts"):
        prof.result.decode_scaling()


def test_bytes_are_operand_and_result_sizes() -> None:
    x = torch.randn(3, 5, 8)
    lin = nn.Linear(8, 16)
    prof = flopscope.profile(lin, x, mode="real")
    # addmm reads x [15, 8], Wᵀ [8, 16] (a view: 0 bytes to make) and the bias [16]; writes [15, 16]; fp32
    assert prof.total_bytes() == 4 * (15 * 8 + 8 * 16 + 16 + 15 * 16)
    assert prof.bytes_by_role() == {"other": prof.total_bytes()}
    half = flopscope.profile(nn.Linear(8, 16, bias=False).to(torch.bfloat16), x.to(torch.bfloat16))
    assert half.total_bytes() == 2 * (15 * 8 + 8 * 16 + 15 * 16)  # mm: no bias; 2 bytes per element


def test_a_lookup_reads_its_rows_not_the_table() -> None:
    table = nn.Embedding(1000, 32)
    ids = torch.randint(0, 1000, (2, 6))
    prof = flopscope.profile(table, ids)
    assert prof.total_bytes() == 8 * 2 * 6 + 2 * 4 * 2 * 6 * 32  # int64 ids; 12 rows read and written
    assert prof.bytes_by_role() == {"no_multiply": prof.total_bytes()}


def test_bytes_by_role_and_module_add_up(generated) -> None:
    _, _, prof = generated
    assert sum(prof.bytes_by_role().values()) == prof.total_bytes() == prof.bytes_by_module()[""]
    decode = prof.steps()[-1]
    # the KV cache read by a decode step: K and V of every layer, [B, h_kv, c, d_k] each, fp32
    assert decode.kv_bytes >= L * 2 * B * n_kv * decode.context * d_k * 4


def test_roofline_of_a_7b_shape_decode_is_memory_bound_and_its_prefill_compute_bound() -> None:
    from flopscope.workloads.roofline import COMPUTE, MEMORY, roofline

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):  # nothing allocated: a 7B shape in bf16
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
        cache = model(torch.zeros(1, 2048, dtype=torch.long), use_cache=True).past_key_values
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in 5.x
    decode = flopscope.profile(model, torch.zeros(1, 1, dtype=torch.long), mode="fake", **{key: cache})
    assert cache.get_seq_length() == 2048  # the profile ran on a copy: the user's cache did not grow
    prefill = flopscope.profile(model, torch.zeros(1, 2048, dtype=torch.long), mode="fake")
    h100 = {"device": "H100 SXM", "dtype": torch.bfloat16}
    assert roofline(decode, **h100).ridge == pytest.approx(989.4e12 / 3.35e12)  # about 295 FLOPs per byte
    projections = ("q_proj", "k_proj", "v_proj", "out_proj", "ffn_up", "ffn_gate", "ffn_down", "logits")
    at_decode = {p.name: p for p in roofline(decode, **h100).roles}
    for role in projections:  # each weight element (2 bytes) is read for one multiply-add (2 FLOPs)
        assert at_decode[role].bound == MEMORY
        assert at_decode[role].intensity == pytest.approx(1.0, rel=1e-3)
    weights = 2 * 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 2 * 4096 * 32000
    assert decode.total_bytes() > weights  # a decode step reads at least every weight once
    at_prefill = {p.name: p for p in roofline(prefill, **h100).roles}
    for role in projections:  # 2,048 tokens share each weight read
        assert at_prefill[role].bound == COMPUTE
    # q_proj: 2·n·d² FLOPs over 2 bytes × (input n·d + weight d² + output n·d)
    q_flops, q_bytes = 2 * 2048 * 4096 * 4096, 2 * (2 * 2048 * 4096 + 4096 * 4096)
    assert at_prefill["q_proj"].intensity == pytest.approx(q_flops / q_bytes)
    step = roofline(decode, **h100)
    assert sum(p.bytes for p in step.roles) == decode.total_bytes()


def test_a_device_without_a_bandwidth_keeps_the_counts_and_warns() -> None:
    from flopscope.workloads.roofline import roofline

    prof = flopscope.profile(nn.Linear(64, 64), torch.randn(8, 64))
    with pytest.warns(flopscope.FlopscopeWarning, match="bandwidth"):
        result = roofline(prof, device="NVIDIA A100 80GB", dtype=torch.float32)  # PCIe or SXM: not said
    assert result.bandwidth is None and result.ridge is None
    assert [(p.name, p.flops, p.bound) for p in result.roles] == [("other", 2 * 8 * 64 * 64, None)]


def test_roofline_in_real_mode_measures_time_mfu_and_mbu(generated, tmp_path) -> None:
    from flopscope.workloads.roofline import roofline

    _, _, prof = generated
    result = roofline(prof, peak=1e11, bandwidth=1e10)
    assert result.ridge == 10.0
    assert len(result.steps) == NEW
    for point, step in zip(result.steps, prof.steps(), strict=True):
        assert point.measured_seconds == step.seconds
        mfu, mbu = result.utilisation(point)
        assert mfu == pytest.approx(step.flops / step.seconds / 1e11)
        assert mbu == pytest.approx(step.bytes / step.seconds / 1e10)
    assert all(p.measured_seconds is not None for p in result.roles)
    assert result.plot(tmp_path / "roofline.png").stat().st_size > 0




def test_roofline_labels_do_not_overlap(generated, tmp_path) -> None:
    """The roofline's labels were drawn each beside its point, on top of one another where points bunch (the
    projections of a layer at one intensity, the decode steps at another). Laid out, no two labels' boxes (as
    matplotlib's renderer measures them) intersect, each is inside the axes, and every point is named; points at
    one place share a label (the equal projections; decode steps 3–5 at 0.73–0.74 FLOPs/byte as one range)."""
    pytest.importorskip("matplotlib")
    from flopscope.render.plots import text_box
    from flopscope.workloads.roofline import RooflinePoint, roofline, roofline_figure

    _, _, prof = generated
    measured = roofline(prof, peak=1e11, bandwidth=1e10)
    # and points near one another but not at one place: 12 roles 2 % apart in intensity, 6 steps 1 % apart
    crowded = replace(measured, roles=tuple(RooflinePoint(f"role_{i}", 1000 + 20 * i, 1000, "memory", None)
                                            for i in range(12)),
                      steps=tuple(RooflinePoint(f"step {i} (decode)", 1500 + 15 * i, 1000, "memory", None)
                                  for i in range(1, 7)))
    for result in (measured, crowded):
        fig, labels = roofline_figure(result)
        renderer = fig.canvas.get_renderer()
        boxes = [text_box(label, renderer) for label in labels]  # (the text, not its line to its point)
        area = fig.axes[0].get_window_extent(renderer)
        for i, box in enumerate(boxes):
            assert area.x0 <= box.x0 and box.x1 <= area.x1 and area.y0 <= box.y0 and box.y1 <= area.y1
            assert not any(box.overlaps(other) for other in boxes[i + 1:]), labels[i].get_text()
        text = "\n".join(label.get_text() for label in labels)
        for point in (*result.roles, *result.steps):
            name = point.name
            assert not point.intensity or name in text or (name.startswith("step ") and "steps " in text), name
        fig.clf()
    labels = [label.get_text() for label in roofline_figure(measured)[1]]
    at = {}
    for point in measured.roles:  # equal work and traffic: one place, one label
        if point.intensity:
            at.setdefault((point.flops, point.bytes), []).append(point.name)
    assert any(len(names) > 1 for names in at.values())
    for names in at.values():
        assert any(all(name in label for name in names) for label in labels), names
    assert any("steps " in label for label in labels)
    assert measured.plot(tmp_path / "roofline.png").stat().st_size > 0

@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_static_cache_attends_over_its_whole_buffer_at_every_step(attention) -> None:
    model = llama()
    model.config._attn_implementation = attention
    ids = torch.randint(1, V, (B, PROMPT))
    with flopscope.profiler(model, mode="real") as prof:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                       do_sample=False, pad_token_id=0, cache_implementation="static")
    steps = prof.result.steps()
    buffer = PROMPT + NEW - 1  # the static cache holds every position generate will attend to
    assert [s.phase for s in steps] == [PREFILL] + [DECODE] * (NEW - 1)
    for step in steps[1:]:  # executed work: the masked positions of the buffer are computed too
        assert (step.tokens, step.context) == (1, buffer)
        assert dict(step.by_role) == decode_roles(buffer)
    with pytest.raises(flopscope.FlopscopeError, match="static cache"):
        prof.result.decode_scaling()


def test_a_projection_read_by_every_later_steps_cache_has_its_columns_replayed_once(monkeypatch) -> None:
    """A key projection's output is concatenated into the cache, which every later decoding step reads: its columns
    reach one consumer per later step, all wanting ``k_proj``. Replaying them to each consumer costs time and memory
    quadratic in the steps (the labels grow with the cache; the Llama-7B shape's 64 steps took more than 24 GiB); the
    first consumer takes every column, so it is replayed there alone. The roles stay the closed form's."""
    import flopscope.attribute.columns as columns

    replayed: list[object] = []
    label = columns._column_labels
    monkeypatch.setattr(columns, "_column_labels", lambda p, target: replayed.append(p) or label(p, target))
    steps = 6
    prof = flopscope.profile_generation(llama(), torch.zeros(B, PROMPT, dtype=torch.long), steps)
    roles = prof.by_role()
    assert replayed, "no projection was split by columns: the test no longer exercises the cache's consumers"
    assert max(replayed.count(p) for p in replayed) == 1
    # each step's K and V projections, charged whole: d·(h_kv·d_k) per token per layer
    tokens = B * (PROMPT + steps - 1)
    assert roles["k_proj"] == roles["v_proj"] == tokens * L * d * n_kv * d_k
