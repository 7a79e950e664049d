"""CUDA kernels: the attention, recurrent and convolution kernels a GPU runs are counted as their closed forms.

The CPU suite exercises these formulas through the CPU kernels (``_scaled_dot_product_flash_attention_for_cpu``,
``mkldnn_rnn_layer``, ``mkldnn_convolution``); on a GPU the dispatcher picks others (flash, memory-efficient and
cuDNN attention, ``_cudnn_rnn``, ``cudnn_convolution``, the fused ``nn.MultiheadAttention`` kernels), each with
its own schema. Skipped where no CUDA device is present. Expected numbers are closed forms (``closed_forms``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import flopscope

from closed_forms import add, attention, conv_out, ffn, rnn, times

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
transformers = pytest.importorskip("transformers")

d, h, d_ff, L, V, B, n = 128, 4, 256, 2, 100, 2, 16
CORE = B * h * n * n * (d // h)  # one layer's scores (or weighted sum) multiplies
BACKENDS = {
    SDPBackend.FLASH_ATTENTION: "aten._scaled_dot_product_flash_attention",
    SDPBackend.EFFICIENT_ATTENTION: "aten._scaled_dot_product_efficient_attention",
    SDPBackend.CUDNN_ATTENTION: "aten._scaled_dot_product_cudnn_attention",
    SDPBackend.MATH: None,  # two bmm's around a softmax
}


def nonzero(parts: dict[str, int]) -> dict[str, int]:
    return {role: macs for role, macs in parts.items() if macs}


def llama() -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=h, vocab_size=V)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)


def needs_backend(backend: SDPBackend) -> None:
    """Skip when this GPU has no such kernel for the test's shapes (flash needs sm80+, cuDNN a recent cuDNN)."""
    q = torch.randn(B, h, n, d // h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    try:
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    except RuntimeError as error:
        pytest.skip(f"{backend.name} is not available on {torch.cuda.get_device_name()}: {error}")


@pytest.mark.parametrize("backend", list(BACKENDS), ids=lambda b: b.name)
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_llama_training_step_on_each_attention_kernel(backend, mode):
    needs_backend(backend)
    model = llama()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    with sdpa_kernel(backend):
        prof = flopscope.profile(model, torch.randint(0, V, (B, n), device="cuda"), mode=mode, backward=True)
    expected = add(times(L, add(attention(B, n, n, d, h), ffn(B, n, d, d_ff, gated=True))), {"logits": B * n * d * V})
    forward = nonzero(prof.by_role(phase="forward"))
    # transformers before 5.19 computes the rotary angles as a product of the frequencies and the positions
    assert forward.pop("other", 0) in (0, (d // h // 2) * n)
    assert forward == expected
    kernel = BACKENDS[backend]
    backward = prof.by_role(phase="backward")
    if kernel is None:  # the math path: each bmm's two gradient products
        assert "aten.bmm" in prof.by_op()
        assert backward["attn_scores"] == backward["attn_weighted_sum"] == L * 2 * CORE
    else:  # a fused kernel recomputes the scores: QKᵀ, dQ, dK; and dV, dP
        assert prof.op_calls()[kernel] == L  # (its backward is another op)
        assert (backward["attn_scores"], backward["attn_weighted_sum"]) == (L * 3 * CORE, L * 2 * CORE)
    assert backward["q_proj"] == 2 * L * B * n * d * d
    assert prof.unsupported() == {}
    assert all(torch.equal(p, weights[name]) and p.is_cuda for name, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("cell", "gates"), [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_cudnn_recurrent_kernels(cell, gates):
    T, batch, d_in, d_h, layers = 7, 3, 12, 16, 2
    torch.manual_seed(0)
    model = getattr(nn, cell)(d_in, d_h, num_layers=layers, bidirectional=True).cuda()
    x = torch.randn(T, batch, d_in, device="cuda", requires_grad=True)
    forward = 2 * rnn(batch, T, gates, d_in, d_h) + 2 * rnn(batch, T, gates, 2 * d_h, d_h)
    prof = flopscope.profile(model, x, mode="real", backward=True)
    assert prof.op_calls()["aten._cudnn_rnn"] == 1
    assert prof.by_phase() == {"forward": forward, "backward": 2 * forward}
    assert nonzero(prof.by_role(phase="forward")) == {"recurrent": forward}
    assert flopscope.profile(model, x, mode="fake").by_phase() == {"forward": forward}
    # the backward of a fake cuDNN RNN has no flat weight buffer to take: "auto" runs it for real, and says so
    with pytest.warns(flopscope.FlopscopeWarning, match="real mode"):
        auto = flopscope.profile(model, x, backward=True)
    assert auto.by_phase() == {"forward": forward, "backward": 2 * forward}


CONV_CASES = [
    # (module, input shape, expected MACs): every output position is charged (C_in / g) * prod(kernel) taps
    (lambda: nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2)), (2, 3, 17, 12),
     2 * 16 * conv_out(17, 3, 2, 1) * conv_out(12, 5, 1, 2) * 3 * 3 * 5),
    (lambda: nn.Conv2d(16, 16, 3, padding=1, groups=16), (1, 16, 9, 9), 16 * 9 * 9 * 1 * 3 * 3),  # depthwise
    (lambda: nn.Conv3d(4, 6, 3, padding=1, stride=2), (1, 4, 8, 8, 8), 6 * conv_out(8, 3, 2, 1) ** 3 * 4 * 27),
    (lambda: nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), (1, 8, 7, 7), 7 * 7 * 8 * 4 * 4 * 4),
]


@pytest.mark.parametrize(("make", "shape", "expected"), CONV_CASES)
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_cudnn_convolutions(make, shape, expected, mode):
    torch.manual_seed(0)
    prof = flopscope.profile(make().cuda(), torch.randn(*shape, device="cuda", requires_grad=True), mode=mode,
                             backward=True)
    assert prof.by_phase() == {"forward": expected, "backward": 2 * expected}  # input and weight gradients
    assert nonzero(prof.by_role(phase="forward")) == {"conv": expected}


def test_fused_multihead_attention_and_encoder_layer_kernels():
    E, heads, F_, n_tok, batch, layers = 64, 4, 128, 10, 2, 2
    torch.manual_seed(0)
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, heads, F_, batch_first=True), layers,
                                  enable_nested_tensor=False).cuda().eval()
    x = torch.randn(batch, n_tok, E, device="cuda")
    with torch.no_grad():
        prof = flopscope.profile(stack, x, mode="real")
    assert prof.op_calls()["aten._transformer_encoder_layer_fwd"] == layers
    per_layer = batch * (4 * n_tok * E * E + 2 * n_tok * n_tok * E + 2 * n_tok * E * F_)
    assert prof.total() == layers * per_layer
    mha = nn.MultiheadAttention(E, heads, batch_first=True).cuda().eval()

    class Self(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mha(x, x, x, need_weights=False)[0]

    with torch.no_grad():
        prof = flopscope.profile(Self(), x, mode="real")
    assert "aten._native_multi_head_attention" in prof.by_op()
    assert nonzero(prof.by_role()) == attention(batch, n_tok, n_tok, E, heads)


def test_a_fall_back_is_limited_by_the_gpus_free_memory():
    """mode="auto" runs a model for real when fake tensors cannot; for a CUDA model that run allocates on the GPU,
    so the default limit is half the GPU's free memory, not the host's."""
    from flopscope.capture.plan import default_fallback_limit

    device = torch.device("cuda", torch.cuda.current_device())
    cached = torch.empty(2**28, dtype=torch.uint8, device=device)  # 256 MiB, then kept by the caching allocator
    del cached
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    # (another process on a shared GPU may allocate between the two reads: a margin of 64 MiB)
    assert abs(default_fallback_limit({device}) - free // 2) <= 2**26
    assert default_fallback_limit({device}) >= 2**27  # the 256 MiB the allocator holds unused count as available
    model = nn.Linear(1024, 1024).cuda()
    with pytest.warns(flopscope.FlopscopeWarning, match="real mode"):
        prof = flopscope.profile(_ReadsAValue(model), torch.randn(4, 1024, device="cuda"))
    assert prof.total() == 4 * 1024 * 1024
    with pytest.raises(flopscope.FakeTensorError, match="above the limit"):
        flopscope.profile(_ReadsAValue(model), torch.randn(4, 1024, device="cuda"), fallback_limit_bytes=1)


class _ReadsAValue(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return y if y.sum().item() > 0 else -y  # a value read: fake tensors cannot say which branch


# --------------------------------------------------------------------------------------------------
# the kernels production GPUs run (issue 32): a real run on the GPU counts what a fake run on the CPU counts


def gpu_and_cpu(make: Callable[[], nn.Module], ids: torch.Tensor, backward: bool = False, labels: bool = False
                ) -> tuple[flopscope.Profile, flopscope.Profile]:
    """The model counted by a real run on the GPU (the production kernels launched) and on fake tensors on the CPU
    (the same kernels, recorded without running); ``labels``: the ids are the labels too (the model's loss)."""
    torch.manual_seed(0)
    model = make()
    profiles = []
    for device, dtype, mode in (("cuda", torch.bfloat16, "real"), ("cpu", torch.float32, "fake")):
        batch = ids.to(device)
        with torch.set_grad_enabled(backward):
            profiles.append(flopscope.profile(model.to(device, dtype), input_ids=batch, mode=mode, backward=backward,
                                              **({"labels": batch} if labels else {})))
    gpu, cpu = profiles
    assert gpu.unsupported() == {} and cpu.unsupported() == {}
    return gpu, cpu


@pytest.mark.parametrize("backward", [False, True], ids=["inference", "training"])
def test_llama_with_flash_attention_2_counts_as_with_sdpa(backward):
    pytest.importorskip("flash_attn")

    def make() -> nn.Module:
        model = llama()
        model.config._attn_implementation = "flash_attention_2"
        return model.train(backward)

    gpu, cpu = gpu_and_cpu(make, torch.randint(0, V, (B, n)), backward)
    assert any(name.startswith("flash_attn") for name in gpu.by_op())
    expected = add(times(L, add(attention(B, n, n, d, h), ffn(B, n, d, d_ff, gated=True))), {"logits": B * n * d * V})
    assert nonzero(gpu.by_role(phase="forward")) == expected
    assert gpu.by_role() == cpu.by_role()


def test_qwen3_next_with_fla_counts_on_the_gpu_as_on_the_cpu():
    pytest.importorskip("fla")
    config = transformers.Qwen3NextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=32, linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        vocab_size=100)
    gpu, cpu = gpu_and_cpu(lambda: transformers.Qwen3NextForCausalLM(config).eval(), torch.randint(0, 100, (B, 100)))
    assert gpu.op_calls().get("fla.chunk_gated_delta_rule") == 1
    assert gpu.by_block() == cpu.by_block()


@pytest.mark.parametrize("backward", [False, True], ids=["inference", "training"])
def test_mamba2_with_mamba_ssm_counts_on_the_gpu_as_on_the_cpu(backward):
    pytest.importorskip("mamba_ssm")
    config = transformers.Mamba2Config(hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=2,
                                       num_hidden_layers=1, vocab_size=100, chunk_size=8, expand=2)
    gpu, cpu = gpu_and_cpu(lambda: transformers.Mamba2ForCausalLM(config).train(backward),
                           torch.randint(0, 100, (B, 20)), backward)
    assert any(name.startswith("mamba_ssm.") for name in gpu.op_calls())
    assert gpu.by_role() == cpu.by_role() and gpu.by_phase() == cpu.by_phase()


def test_a_liger_training_step_counts_on_the_gpu_as_on_the_cpu(monkeypatch):
    """Liger's fused linear cross-entropy on a Llama: the lm_head's product and its two gradients (3·N·d·V at
    ``lm_head``), the same per phase and role on the GPU as on the CPU."""
    liger = pytest.importorskip("liger_kernel.transformers")
    from transformers.models.llama import modeling_llama

    llama_class = modeling_llama.LlamaForCausalLM
    monkeypatch.setattr(llama_class, "forward", llama_class.forward)  # (put back after the test)
    liger.apply_liger_kernel_to_llama(rope=False, swiglu=False, rms_norm=False, cross_entropy=False,
                                      fused_linear_cross_entropy=True)
    gpu, cpu = gpu_and_cpu(lambda: llama().train(), torch.randint(0, V, (B, n)), backward=True, labels=True)
    assert gpu.op_calls().get("liger.fused_linear_cross_entropy")
    assert gpu.by_phase() == cpu.by_phase() and gpu.by_role() == cpu.by_role()
    assert gpu.by_module()["lm_head"] == 3 * B * n * d * V


def test_mamba2_decoding_with_mamba_ssm_counts_each_step_at_its_launch():
    """mamba-ssm's ``selective_state_update`` (a plain function launching a Triton kernel, bound by transformers):
    one record per decoding step at the launch, B·H·P·N (the state's read by C), nothing unpriced."""
    pytest.importorskip("mamba_ssm")
    from flopscope.workloads.decoding import greedy_decode

    config = transformers.Mamba2Config(hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=2,
                                       num_hidden_layers=1, vocab_size=100, chunk_size=8, expand=2)
    model = transformers.Mamba2ForCausalLM(config).to("cuda", torch.bfloat16).eval()
    with torch.no_grad(), flopscope.profiler(model, mode="real") as recording:
        greedy_decode(model, torch.randint(0, 100, (B, 20), device="cuda"), 3)
    prof = recording.result
    steps = [op for op in prof._ops if op.op_name == "mamba_ssm.selective_state_update"]
    assert [op.macs for op in steps] == [B * 8 * 16 * 16] * 2
    assert prof.unsupported() == {}
