"""Models built on ``device="meta"``: counted on PyTorch's meta kernels directly (no fake-tensor mode), with the
same multiplies and roles as a CPU build, and counted on fake CPU tensors when meta kernels cannot run them."""

from __future__ import annotations

import torch
from torch import nn

import flopscope
from flopscope.capture.engine import META_ATTENTION_NOTE

from closed_forms import add, attention, ffn, rotary, times
from zoo import CPU_FUSED_GQA

B, N, D, H, KV, FF, L, V = 2, 16, 64, 4, 2, 128, 2, 100


def _llama_config():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
                       num_key_value_heads=KV, vocab_size=V)


def _expected() -> dict[str, int]:
    return add(times(L, add(attention(B, N, N, D, H, KV), ffn(B, N, D, FF, gated=True))), {"logits": B * N * D * V},
               rotary(N, D // H))


def test_a_meta_llama_runs_on_meta_kernels_with_the_closed_form_roles() -> None:
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(_llama_config())
    ids = torch.randint(0, V, (B, N))
    prof = flopscope.profile(model, ids, mode="fake")
    assert prof.output.logits.is_meta  # meta kernels ran it: no fake CPU tensor came out
    roles = {role: macs for role, macs in prof.by_role().items() if macs}
    assert roles == _expected()
    on_cpu = flopscope.profile(LlamaForCausalLM(_llama_config()), ids, mode="fake")
    assert not on_cpu.output.logits.is_meta and on_cpu.by_role() == prof.by_role()
    # the math path of scaled_dot_product_attention: its bytes are not a fused kernel's, and the note says so
    assert META_ATTENTION_NOTE in prof.notes and META_ATTENTION_NOTE not in on_cpu.notes


def test_a_meta_llama_with_its_backward_pass_counts_as_on_the_cpu() -> None:
    """The CPU's fused attention computes the scores again in its backward (QKᵀ forward, then QKᵀ, dS·K, dSᵀ·Q,
    Pᵀ·dO and dO·Vᵀ: 4 score-sized and 3 weighted-sum-sized products); the math path would not recompute."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(_llama_config())
    prof = flopscope.profile(model, torch.randint(0, V, (B, N)), mode="fake", backward=True)
    assert not prof.output.logits.is_meta  # counted on fake CPU tensors
    core = attention(B, N, N, D, H, KV)
    # (torch <= 2.8 runs grouped-query SDPA on the CPU as the math path: QKᵀ, dS·K, dSᵀ·Q)
    assert prof.by_role()["attn_scores"] == (4 if CPU_FUSED_GQA else 3) * L * core["attn_scores"]
    assert prof.by_role()["attn_weighted_sum"] == 3 * L * core["attn_weighted_sum"]


def test_the_meta_run_still_refuses_ids_outside_the_table() -> None:
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(_llama_config())
    try:
        flopscope.profile(model, torch.full((B, N), V), mode="fake")
    except flopscope.FlopscopeError as error:
        assert f"index {V} is out of range" in str(error)
    else:
        raise AssertionError("an id equal to vocab_size was accepted")


class _ReadsAValue(nn.Module):
    """Reads the value of a tensor made from data: a meta tensor has none (fake tensors keep small constants)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * torch.tensor(2.0).item()


class _MakesTensorsOnTheCpu(nn.Module):
    """Makes tensors with ``device="cpu"`` and from data (``torch.tensor``)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * torch.tensor(2.0) + torch.rand(D, device="cpu")


def test_a_meta_run_makes_the_tensors_the_forward_makes_on_meta() -> None:
    """A tensor the forward makes (on the CPU by name, or from data) is made on meta in a meta run: the count stays
    on meta kernels, allocates nothing and draws nothing from the CPU's random generator."""
    with torch.device("meta"):
        model = _MakesTensorsOnTheCpu()
    state = torch.get_rng_state()
    prof = flopscope.profile(model, torch.zeros(B, N, D), mode="fake")
    assert prof.total() == B * N * D * D and prof.output.is_meta
    assert torch.equal(torch.get_rng_state(), state)


def test_a_meta_model_that_meta_kernels_cannot_run_is_counted_on_fake_cpu_tensors() -> None:
    with torch.device("meta"):
        model = _ReadsAValue()
    prof = flopscope.profile(model, torch.zeros(B, N, D), mode="fake")
    assert prof.total() == B * N * D * D
    assert not prof.output.is_meta  # the fake CPU run's output
    assert all(p.is_meta for p in model.parameters()) and not any(p.grad is not None for p in model.parameters())


class _DrawsNoise(nn.Module):
    """Makes tensors without a device (noise, a mask) and counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        noise = torch.randn(x.shape).to(x.device)
        return self.proj(x + noise) * torch.ones(N, N).tril().to(x.device)[: x.shape[1], :1]


def test_the_meta_run_makes_device_less_tensors_on_meta_and_draws_no_random_numbers() -> None:
    with torch.device("meta"):
        model = _DrawsNoise()
    state = torch.get_rng_state()
    prof = flopscope.profile(model, torch.zeros(B, N, D), mode="fake")
    assert prof.total() == B * N * D * D and prof.output.is_meta  # counted on meta, nothing made for real
    assert torch.equal(torch.get_rng_state(), state)  # the user's random stream is where it was


class _Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.transpose(-1, -2))  # [B, D, N] @ a D x D weight: N != D, a shape error


def test_a_meta_models_own_error_is_raised_after_one_run() -> None:
    """Not retried on fake CPU tensors (they would meet it too): the forward and its hooks run once."""
    with torch.device("meta"):
        model = _Fails()
    runs: list[str] = []
    model.register_forward_pre_hook(lambda module, args: runs.append("forward"))
    try:
        flopscope.profile(model, torch.zeros(B, N, D), mode="fake")
    except flopscope.ForwardError as error:
        assert "module 'proj'" in str(error)
    else:
        raise AssertionError("a shape error was not raised")
    assert runs == ["forward"]


class _ChecksItsParameters(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.w, nn.Parameter):
            raise TypeError("w is not a parameter")
        return x @ self.w


def test_fake_parameters_are_still_parameters() -> None:
    assert flopscope.profile(_ChecksItsParameters(), torch.zeros(B, N, D), mode="fake").total() == B * N * D * D
