"""Counting inside training loops: measure_flops (Lightning's drop-in), flops_per_batch, Throughput."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import flop_registry

import flopscope
from flopscope.studies.models import TransformerBlock
from flopscope.workloads.training import Throughput, flops_per_batch, measure_flops

from closed_forms import rotary

D, H, D_FF = 64, 4, 128


def _block_macs(n: int, batch: int = 1) -> int:
    """TransformerBlock forward: n·(4·d² + 2·d·d_ff) + 2·n²·d per sequence."""
    return batch * (n * (4 * D * D + 2 * D * D_FF) + 2 * n * n * D)


class SdpaBlock(nn.Module):
    """Self-attention through F.scaled_dot_product_attention (the CPU flash kernel FlopCounterMode misses)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, n, _ = x.shape
        q, k, v = (t.view(B, n, H, D // H).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, n, D))


def test_measure_flops_equals_lightning_where_flop_counter_mode_is_right() -> None:
    from lightning.fabric.utilities.throughput import measure_flops as lightning_measure_flops

    with torch.device("meta"):  # as Lightning's docs build it: nothing allocated
        model, x = TransformerBlock(D, H, D_FF), torch.randn(2, 16, D)
    ours = measure_flops(model, lambda: model(x))
    assert ours == 2 * _block_macs(16, batch=2) == lightning_measure_flops(model, lambda: model(x))
    with_backward = measure_flops(model, lambda: model(x), lambda y: y.sum())
    assert with_backward == lightning_measure_flops(model, lambda: model(x), lambda y: y.sum())
    # every GEMM's backward computes its weight's gradient and its input's, but for Q, K and V: x needs no gradient
    assert with_backward == 3 * ours - 2 * 3 * (2 * 16 * D * D)


def test_measure_flops_exceeds_lightning_by_exactly_the_attention_it_misses() -> None:
    from lightning.fabric.utilities.throughput import measure_flops as lightning_measure_flops

    model, x = SdpaBlock().eval(), torch.randn(2, 16, D)
    with torch.no_grad():
        ours = measure_flops(model, lambda: model(x))
        theirs = lightning_measure_flops(model, lambda: model(x))
    B, n = 2, 16
    projections = B * n * D * 3 * D + B * n * D * D
    core = 2 * B * n * n * D  # scores and weighted sum: B·h·n²·d_k each
    assert ours == 2 * (projections + core)
    # lightning counts with FlopCounterMode: newer torch's has a formula for the CPU's fused attention
    cpu_sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    assert ours - theirs == (0 if cpu_sdpa in flop_registry else 2 * core)


def test_measure_flops_leaves_gradients_alone_and_refuses_bad_callables() -> None:
    model, x = TransformerBlock(D, H, D_FF), torch.randn(1, 8, D)
    measure_flops(model, lambda: model(x), lambda y: y.sum())
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(flopscope.InputError, match="no tensor"):
        measure_flops(model, lambda: None)
    with pytest.raises(flopscope.InputError, match="scalar"):
        measure_flops(model, lambda: model(x), lambda y: y)


def test_flops_per_batch_prices_padded_packed_and_ragged_batches_exactly() -> None:
    pricer = flops_per_batch(TransformerBlock(D, H, D_FF), lambda n: torch.zeros(1, n, D), backward=False)
    per_token = 4 * D * D + 2 * D * D_FF
    ids = torch.zeros(3, 40, dtype=torch.long)
    assert pricer(ids) == 2 * _block_macs(40, batch=3)  # padded: every row executes all 40 positions
    assert pricer({"input_ids": ids, "attention_mask": torch.ones(3, 40)}) == 2 * _block_macs(40, batch=3)
    assert pricer([10, 25, 40]) == 2 * sum(_block_macs(n) for n in (10, 25, 40))
    packed = {"position_ids": torch.tensor([list(range(10)) + list(range(25)) + list(range(5))])}
    assert pricer(packed) == 2 * (40 * per_token + 2 * D * (10**2 + 25**2 + 5**2))  # Σ Lᵢ² attention
    assert pricer({"cu_seqlens": torch.tensor([0, 10, 35, 40])}) == pricer(packed)
    assert pricer.flops_by_role([8])["attn_scores"] == 2 * 8 * 8 * D
    with pytest.raises(flopscope.InputError):
        pricer({"labels": ids})


def test_flops_per_batch_with_backward_matches_a_profile_of_the_same_batch() -> None:
    model = TransformerBlock(D, H, D_FF)
    pricer = flops_per_batch(model, lambda n: torch.zeros(1, n, D), backward=True)
    assert pricer([24]) == flopscope.profile(model, torch.zeros(1, 24, D), mode="fake", backward=True).total_flops()


def test_throughput_reports_mfu_with_its_denominator() -> None:
    pricer = flops_per_batch(TransformerBlock(D, H, D_FF), lambda n: torch.zeros(1, n, D), backward=False)
    meter = Throughput(pricer, peak=1e12)
    step = meter.update(torch.zeros(2, 32, dtype=torch.long), seconds=0.5)
    flops = 2 * _block_macs(32, batch=2)
    assert step["flops"] == flops and step["peak"] == 1e12
    assert step["mfu"] == pytest.approx(flops / 0.5 / 1e12) and step["tokens_per_sec"] == 2 * 32 / 0.5
    assert sum(step["flops_by_role"].values()) == flops
    meter.update([16], seconds=0.25)
    assert meter.summary()["flops"] == flops + 2 * _block_macs(16)
    with pytest.raises(flopscope.ConfigurationError):
        meter.update([16], seconds=0.0)
    with pytest.raises(flopscope.ConfigurationError):
        Throughput(pricer, peak=-1.0)


def test_activation_checkpointing_counts_in_hfu_but_not_in_mfu() -> None:
    transformers = pytest.importorskip("transformers")
    d, h, d_ff, layers, vocab, n = 32, 4, 64, 2, 50, 12

    def llama(checkpointing: bool) -> nn.Module:
        config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=layers,
                                          num_attention_heads=h, num_key_value_heads=h, vocab_size=vocab)
        config._attn_implementation = "eager"
        model = transformers.LlamaForCausalLM(config).train()
        if checkpointing:  # reentrant: every layer's forward runs again in the backward pass
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        return model

    def ids(n: int) -> torch.Tensor:
        return torch.zeros(1, n, dtype=torch.long)

    plain, checkpointed = llama(False), llama(True)
    batch = torch.zeros(3, n, dtype=torch.long)
    # model FLOPs are what the model computes, whatever the memory strategy
    assert measure_flops(checkpointed, lambda: checkpointed(batch).logits, lambda y: y.sum()) == \
        measure_flops(plain, lambda: plain(batch).logits, lambda y: y.sum())
    pricer = flops_per_batch(checkpointed, ids, lengths=(4, 8, 16, 32, 64))
    assert pricer(batch) == flops_per_batch(plain, ids, lengths=(4, 8, 16, 32, 64))(batch)
    layer_forward = n * (4 * d * d + 3 * d * d_ff) + 2 * n * n * d  # projections, gated FFN, scores + weighted sum
    assert pricer.recompute_flops(batch) == 2 * 3 * layers * layer_forward
    assert flops_per_batch(plain, ids, lengths=(4, 8, 16, 32, 64)).recompute_flops(batch) == 0
    step = Throughput(pricer, peak=1e12).update(batch, seconds=0.5)
    assert step["recomputed_flops"] == pricer.recompute_flops(batch)
    assert step["hfu"] == pytest.approx(step["mfu"] * (pricer(batch) + pricer.recompute_flops(batch)) / pricer(batch))


def test_a_batched_make_inputs_is_priced_per_sequence() -> None:
    """At 3bbe37a make_inputs(n) = [2, n] ids priced a (2, 77) batch at twice its FLOPs (the batch counted twice)."""
    transformers = pytest.importorskip("transformers")
    d, d_ff, layers, h, vocab = 32, 64, 2, 4, 100
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=layers,
                                      num_attention_heads=h, num_key_value_heads=h, vocab_size=vocab)
    model = transformers.LlamaForCausalLM(config).eval()

    def forward_macs(n: int) -> int:  # one sequence: projections, gated FFN, scores + weighted sum, logits
        return layers * (n * (4 * d * d + 3 * d * d_ff) + 2 * n * n * d) + n * d * vocab

    batch = torch.randint(0, vocab, (2, 77))
    # transformers before 5.19 makes the rotary angles once for a whole batch: each of the `rows` sequences of
    # make_inputs is priced a `rows`-th of them
    angles = sum(rotary(77, d // h).values())
    for rows in (1, 2, 3):
        pricer = flops_per_batch(model, lambda n, rows=rows: torch.randint(0, vocab, (rows, n)), backward=False)
        if angles % rows:  # no whole count per sequence: refused
            with pytest.raises(flopscope.FlopscopeError, match="fractional count"):
                pricer(batch)
            continue
        assert pricer(batch) == 2 * (2 * forward_macs(77) + Fraction(2 * angles, rows))
        measured = measure_flops(model, lambda: model(batch).logits)
        assert pricer(batch) == measured + 2 * Fraction(angles * (2 - rows), rows)
    embeds = flops_per_batch(TransformerBlock(D, H, D_FF), lambda n: torch.zeros(4, n, D), backward=False)
    assert embeds(torch.zeros(3, 40, D)) == 2 * _block_macs(40, batch=3)  # hidden states, read as make_inputs was
    assert embeds(torch.zeros(3, 40, dtype=torch.long)) == 2 * _block_macs(40, batch=3)  # token ids


def test_batches_whose_tokens_cannot_be_read_are_refused() -> None:
    block = TransformerBlock(D, H, D_FF)
    pricer = flops_per_batch(block, lambda n: torch.zeros(1, n, D), backward=False)
    with pytest.raises(flopscope.InputError, match=r"float tensor of shape \[3, 40\]"):
        pricer(torch.zeros(3, 40))  # hidden states of another rank: the tokens' dimension is not known
    with pytest.raises(flopscope.InputError, match="no dimension of make_inputs"):
        flops_per_batch(block, lambda n: torch.zeros(1, 16, D), backward=False)  # n does not reach the inputs
    with pytest.raises(flopscope.InputError, match="last dimension may be a width"):
        flopscope.BatchPricer(pricer.polynomials, backward=False)(torch.zeros(3, 40, D))


def test_peak_none_means_unknown_and_auto_looks_it_up() -> None:
    """``Throughput(peak=None)`` measured this CPU's GEMM peak, where the docs say ``None`` means unknown. ``None``
    is unknown now: no MFU or HFU, and ``peak_source`` says why; ``"auto"`` (the default) looks the peak up (this
    CPU's measured figure here, as :func:`flopscope.hardware.peaks.peak_flops` gives it); a number is taken as it is."""
    from flopscope.hardware.peaks import peak_flops

    pricer = flops_per_batch(TransformerBlock(D, H, D_FF), lambda n: torch.zeros(1, n, D), backward=False)
    batch = torch.zeros(2, 32, dtype=torch.long)
    unknown = Throughput(pricer, peak=None, device="cpu")
    step = unknown.update(batch, seconds=0.5)
    assert unknown.peak is None and step["peak"] is None and step["mfu"] is None and step["hfu"] is None
    assert "unknown (peak=None)" in step["peak_source"] and "not computed" in step["peak_source"]
    assert step["flops_per_sec"] == 2 * _block_macs(32, batch=2) / 0.5  # the rest is as with a peak
    looked_up = Throughput(pricer, device="cpu", dtype=torch.float32)
    assert looked_up.peak == peak_flops("cpu", torch.float32) > 0
    assert looked_up.peak_source.startswith("looked up: measured on this CPU")
    assert Throughput(pricer, peak="auto", device="cpu").peak == looked_up.peak
    assert Throughput(pricer, peak=2e12).update(batch, seconds=0.5)["peak_source"] == "given"
    with pytest.raises(flopscope.ConfigurationError, match="'auto'"):
        Throughput(pricer, peak="measure")
