"""flopscope.workloads.decoding.greedy_decode: on fake tensors, the forwards Hugging Face's greedy ``generate()`` runs.

Each family's count is held against a real ``model.generate(...)`` under ``flopscope.profiler(mode="real")``: the same
number of steps and, step by step, the same shape (batch, new tokens, context), the same MACs by role and the same
bytes. Llama (rotary positions, grouped KV heads), GPT-2 (a learned position table, a fused ``c_attn``), Mistral
with a sliding window shorter than the sequence (the cache generate() builds from the config keeps only the
window), Llama without a cache (``use_cache=False``: every step runs over the whole sequence), Phi-3 with LongRoPE
(its own prepare_inputs_for_generation: the cache dropped once, where the rope switches) and Falcon-H1 (attention
beside Mamba-2). Then a decode step and the prefill against closed forms written here.
"""

from __future__ import annotations

import pytest
import torch
from test_block_replay import Wrapped
from test_replay import assert_same_capture
from torch import nn

import flopscope
from flopscope.workloads.decoding import greedy_decode
from flopscope.workloads.generation import DECODE, PREFILL

from closed_forms import add, rotary

transformers = pytest.importorskip("transformers")
TRANSFORMERS = tuple(int(part) for part in transformers.__version__.split(".")[:2])
POSITIONS_READ = TRANSFORMERS < (5, 24)
"""Measured on transformers 5.15: LongRoPE's frequency update reads ``torch.max(position_ids)`` into Python where
fake tensors hold no values (5.24's do: its positions are known values), so the fake count is refused, naming the op
(``FakeTensorError``)."""
MASK_READS_VALUES = TRANSFORMERS < (5, 24)
"""Measured on transformers 5.15: its mask code checks whether the attention mask is all ones on real tensors
(``_to_copy``, ``sum``, ``eq`` and ``.item()`` in the model: 118 bytes at batch 2 x 5, no multiply), which fake tensors
cannot answer: the bytes of the prefill differ by those, the MACs not. 5.24 reads no values there."""
B, PROMPT, NEW = 2, 5, 4
d, h, n_kv, d_ff, L, V = 32, 4, 2, 64, 2, 64
d_k = d // h
WINDOW = 6  # Mistral's sliding window: shorter than PROMPT + NEW - 1 = 8


def llama(use_cache: bool = True) -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.use_cache = use_cache
    return model


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_embd=d, n_layer=L, n_head=h, vocab_size=V, n_positions=64, bos_token_id=0,
                                     eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def mistral() -> nn.Module:
    config = transformers.MistralConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                        num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V,
                                        sliding_window=WINDOW)
    return transformers.MistralForCausalLM(config).eval()


ROPE_SWITCH = 6  # Phi-3's original context: at PROMPT + 2 = 7 positions generate() drops the cache and feeds them all


def phi3_longrope() -> nn.Module:
    """Phi-3 with LongRoPE: its prepare_inputs_for_generation (no ``next_sequence_length`` of its own, passed on
    through ``**kwargs``) feeds one token a step, except where the sequence first passes its original context: there
    it drops the cache and feeds the whole sequence again, with the long factors."""
    config = transformers.Phi3Config(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=n_kv,
        vocab_size=V, max_position_embeddings=32, original_max_position_embeddings=ROPE_SWITCH, pad_token_id=0,
        bos_token_id=0, eos_token_id=0,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * (d_k // 2), "long_factor": [2.0] * (d_k // 2)})
    return transformers.Phi3ForCausalLM(config).eval()


def falcon_h1() -> nn.Module:
    """Falcon-H1: attention and Mamba-2 mixers side by side in each layer, a prepare_inputs_for_generation of its
    own."""
    config = transformers.FalconH1Config(
        hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=n_kv,
        vocab_size=V, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_n_groups=1,
        mamba_chunk_size=4, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return transformers.FalconH1ForCausalLM(config).eval()


FAMILIES = {"llama": llama, "gpt2": gpt2, "mistral-sliding": mistral, "llama-no-cache": lambda: llama(False),
            "phi3-longrope": phi3_longrope, "falcon-h1": falcon_h1}


def prompt_ids() -> torch.Tensor:
    return torch.randint(1, V, (B, PROMPT), generator=torch.Generator().manual_seed(0))


def hf_generate(model: nn.Module, ids: torch.Tensor) -> flopscope.Profile:
    """What the CLI's --mode real runs: HF's generate(), greedy, exactly NEW tokens, counted for real."""
    with flopscope.profiler(model, mode="real") as prof:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                       do_sample=False, pad_token_id=0)
    return prof.result


def decoded(model: nn.Module, ids: torch.Tensor) -> tuple[flopscope.Profile, torch.Tensor]:
    with flopscope.profiler(model, mode="fake") as prof:
        out = greedy_decode(model, ids, NEW)
    return prof.result, out


def refused_on_fake(family: str) -> bool:
    """Where fake tensors cannot answer the forward (:data:`POSITIONS_READ`), the count is refused naming the op, and
    the family has nothing more to compare on fake tensors."""
    if not (family == "phi3-longrope" and POSITIONS_READ):
        return False
    with pytest.raises(flopscope.FakeTensorError, match=r"_local_scalar_dense in module 'model\.rotary_emb'"):
        flopscope.profile_generation(FAMILIES[family](), prompt_ids(), NEW)
    return True


def shape_and_work(prof: flopscope.Profile, moved: bool = True) -> list[tuple]:
    """Each step's shape, MACs by role and (``moved``) bytes."""
    return [(s.phase, s.batch, s.tokens, s.context, s.macs, dict(s.by_role), s.kv_macs,
             *((s.bytes, s.kv_bytes) if moved else ())) for s in prof.steps()]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decode_runs_the_forwards_hf_generate_runs(family: str) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family]()
    ids = prompt_ids()
    real = hf_generate(model, ids)
    if refused_on_fake(family):
        return
    # (a fresh model: the first forward a model runs may set a plain attribute once, as LongRoPE's long factors)
    torch.manual_seed(0)
    fake, out = decoded(FAMILIES[family](), ids)
    assert fake.mode == "fake" and real.mode == "real"
    assert len(real.steps()) == NEW  # one forward per new token: the last one is never fed back
    # bytes too, except without a cache: there transformers' mask code looks for packed sequences in the position
    # ids (masking_utils.find_packed_sequence_indices), which it cannot read on fake tensors, so it builds an explicit
    # causal mask (SDPA then repeats the KV heads) where on real tensors it finds none and runs SDPA is_causal: the
    # same MACs, other bytes. It is the same on one forward: flopscope.profile(model, ids, use_cache=False)
    moved = family != "llama-no-cache" and not MASK_READS_VALUES
    assert shape_and_work(fake, moved) == shape_and_work(real, moved)
    assert fake.by_module() == real.by_module()
    assert tuple(out.shape) == (B, PROMPT + NEW)
    assert all(s.seconds is None for s in fake.steps())  # nothing ran: no wall time
    with torch.device("meta"):  # what the command line counts: the model built on meta, nothing allocated
        torch.manual_seed(0)
        on_meta = FAMILIES[family]()
    assert shape_and_work(decoded(on_meta, ids)[0], moved) == shape_and_work(real, moved)


def test_the_cache_and_the_window_shape_the_steps() -> None:
    """The two variants' steps differ from plain Llama's where they should: without a cache every step runs over
    the whole sequence; Mistral's window caps the context of each decode step at WINDOW positions."""
    ids = prompt_ids()
    no_cache = decoded(llama(use_cache=False), ids)[0].steps()
    assert [(s.tokens, s.context) for s in no_cache] == [(PROMPT + i, PROMPT + i) for i in range(NEW)]
    assert {s.phase for s in no_cache} == {PREFILL}  # each brings several new positions
    sliding = decoded(mistral(), ids)[0].steps()
    assert [(s.tokens, s.context) for s in sliding] == \
        [(PROMPT, PROMPT)] + [(1, min(PROMPT + i, WINDOW)) for i in range(1, NEW)]


def test_a_model_with_its_own_prepare_inputs_is_fed_as_generate_feeds_it() -> None:
    """Phi-3 (LongRoPE) hands ``generate()``'s positions to feed on through ``**kwargs``: the driver feeds it as a
    real ``generate()`` does (before the fix every step fed the whole sequence on a cache that kept growing:
    contexts 5, 11, 18, ...). On transformers 5.24 and 5.25: one token a step on the cache, the whole sequence once
    where it first passes its original context, one token again after. (Transformers 5.15's generate() drops the
    cache there and feeds one token: measured, and mimicked.)"""
    model, ids = phi3_longrope(), prompt_ids()
    with flopscope.profiler(model, mode="real") as prof:  # (the driver's steps, on any transformers)
        greedy_decode(model, ids, NEW)
    steps = [(s.tokens, s.context) for s in prof.result.steps()]
    assert steps == [(s.tokens, s.context) for s in hf_generate(model, ids).steps()]
    if TRANSFORMERS in ((5, 24), (5, 25)):  # (measured on these: another may switch otherwise, as 5.15 does)
        switch = ROPE_SWITCH + 1
        assert steps == [(PROMPT, PROMPT), (1, PROMPT + 1), (switch, switch), (1, switch + 1)]


def llama_decode_step(c: int) -> dict[str, int]:
    """One new token per sequence attending to c positions (B sequences): per layer Q d·(h·d_k), K and V
    d·(n_kv·d_k) each, the output (h·d_k)·d, the gated FFN 3·d·d_ff, scores and weighted sum h·c·d_k each; then
    the LM head d·V for the one position; rotary angles where this transformers makes them with a matmul."""
    layer = {"q_proj": d * h * d_k, "k_proj": d * n_kv * d_k, "v_proj": d * n_kv * d_k, "out_proj": h * d_k * d,
             "attn_scores": h * c * d_k, "attn_weighted_sum": h * c * d_k,
             "ffn_up": d * d_ff, "ffn_gate": d * d_ff, "ffn_down": d_ff * d}
    return add({role: B * L * macs for role, macs in layer.items()}, {"logits": B * d * V}, rotary(1, d_k, rows=B))


def test_llama_steps_against_the_closed_form() -> None:
    steps = decoded(llama(), prompt_ids())[0].steps()
    assert [s.phase for s in steps] == [PREFILL] + [DECODE] * (NEW - 1)
    for step in steps[1:]:
        assert step.context is not None
        assert dict(step.by_role) == llama_decode_step(step.context)
    c = PROMPT + 1  # the first decode step, written out: B·L·(Q 1,024 + K, V 2·512 + out 1,024 + FFN 3·2,048
    # + scores and weighted sum 2·4·6·8) + B·(head 32·64) = 4·9,600 + 2·2,048
    assert steps[1].macs == B * L * (d * d + 2 * d * n_kv * d_k + d * d + 3 * d * d_ff + 2 * h * c * d_k) + \
        B * d * V + sum(rotary(1, d_k, rows=B).values()) == 42_496 + sum(rotary(1, d_k, rows=B).values())
    # the prefill: every projection and the FFN on P positions, the attention core over P x P (executed: SDPA
    # computes the masked half too), the LM head on the last position only (generate's logits_to_keep=1)
    n = PROMPT
    prefill = B * L * (n * (2 * d * d + 2 * d * n_kv * d_k + 3 * d * d_ff) + 2 * h * n * n * d_k) + B * d * V
    assert steps[0].macs == prefill + sum(rotary(n, d_k, rows=B).values())
    assert steps[0].by_role["logits"] == B * d * V


def test_gpt2_decode_step_against_the_closed_form() -> None:
    """GPT-2 per layer and new token: c_attn d·3d, c_proj d·d, the MLP d·4d twice, scores and weighted sum c·d
    each; the tied LM head d·V; B sequences."""
    steps = decoded(gpt2(), prompt_ids())[0].steps()
    for step in steps[1:]:
        c = step.context
        assert c is not None
        assert step.macs == B * (L * (3 * d * d + d * d + 8 * d * d + 2 * c * d) + d * V)


def counted_t5() -> tuple[nn.Module, list[int]]:
    """A T5 (an encoder-decoder, which greedy_decode does not mimic) and the list its forward calls append to."""
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=V)).eval()
    calls: list[int] = []
    t5.register_forward_pre_hook(lambda *_: calls.append(1))
    return t5, calls


def test_what_greedy_decode_does_not_mimic_is_refused_before_any_forward() -> None:
    t5, calls = counted_t5()
    with pytest.raises(flopscope.ConfigurationError, match="encoder-decoder"):
        greedy_decode(t5, prompt_ids(), NEW)
    with pytest.raises(flopscope.ConfigurationError, match="not a Hugging Face model that generates"):
        greedy_decode(nn.Linear(4, 4), prompt_ids(), NEW)
    static = llama()
    static.generation_config.cache_implementation = "static"
    with pytest.raises(flopscope.ConfigurationError, match="'static' cache"):
        greedy_decode(static, prompt_ids(), NEW)
    for new in (0, 2.0, True):
        with pytest.raises(flopscope.InputError, match="new_tokens must be a positive integer"):
            greedy_decode(llama(), prompt_ids(), new)  # type: ignore[arg-type]
    with pytest.raises(flopscope.InputError, match=r"\[batch, prompt\]"):
        greedy_decode(llama(), torch.zeros(PROMPT, dtype=torch.long), NEW)
    assert calls == []


@pytest.mark.parametrize("family", FAMILIES)
def test_profile_generation_is_the_profilers_count_with_layers_replayed(family: str) -> None:
    """``flopscope.profile_generation`` runs greedy_decode's forwards on the fake run's copy of the model: the same
    steps, MACs by role, bytes and modules as greedy_decode under ``profiler(mode="fake")``, and with layers replayed
    the capture is the one of ``reuse=False``, record by record. Llama with a cache: in each of the NEW steps layer 1
    is replayed from layer 0 (layer 0 of a decode step is counted: its cache is one position longer than the step
    before's); without a cache every step is captured too (another length each step, and the same layers)."""
    if refused_on_fake(family):
        return
    torch.manual_seed(0)
    model, ids = FAMILIES[family](), prompt_ids()
    counted = flopscope.profile_generation(model, ids, NEW)
    captured = flopscope.profile_generation(model, ids, NEW, reuse=False)
    assert_same_capture(Wrapped(counted), Wrapped(captured))
    blocked, _ = decoded(model, ids)
    assert shape_and_work(counted) == shape_and_work(blocked)
    assert counted.by_module() == blocked.by_module()
    assert tuple(counted.output.shape) == (B, PROMPT + NEW) and counted.mode == "fake"
    replayed = [note for note in counted.notes if "replayed" in note]
    if family == "llama":
        assert replayed == [f"model.layers: {NEW} of {L * NEW} block calls replayed from an earlier call of a block "
                            "of the same structure on the same inputs' shapes (fake tensors: the same records)"]
    with torch.device("meta"):  # built on meta: counted on fake tensors all the same (not on meta kernels, whose
        torch.manual_seed(0)  # attention writes the scores), the same steps and bytes
        on_meta = FAMILIES[family]()
    assert shape_and_work(flopscope.profile_generation(on_meta, ids, NEW)) == shape_and_work(counted)


def test_profile_generation_refuses_what_greedy_decode_does_not_mimic_before_any_forward() -> None:
    t5, calls = counted_t5()
    with pytest.raises(flopscope.ConfigurationError, match="encoder-decoder"):
        flopscope.profile_generation(t5, prompt_ids(), NEW)
    with pytest.raises(flopscope.InputError, match="new_tokens must be a positive integer"):
        flopscope.profile_generation(llama(), prompt_ids(), 0)
    assert calls == []


def test_profile_generation_in_real_mode_is_hf_generate() -> None:
    """``mode="real"`` runs greedy_decode's forwards on the model's own weights: the steps of a real ``generate()``,
    shape, MACs by role and bytes (before transformers 5.24: without the bytes of the mask check that generate()'s
    mask of ones makes and greedy_decode's absent mask does not), and the sequences it draws (greedy on the same
    weights: the same tokens)."""
    torch.manual_seed(0)
    model, ids = llama(), prompt_ids()
    counted = flopscope.profile_generation(model, ids, NEW, mode="real")
    assert counted.mode == "real"
    moved = not MASK_READS_VALUES
    assert shape_and_work(counted, moved) == shape_and_work(hf_generate(model, ids), moved)
    drawn = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                           do_sample=False, pad_token_id=0)
    assert torch.equal(counted.output, drawn)
