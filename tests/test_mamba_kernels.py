"""mamba-ssm's kernels (Mamba and Mamba-2 on a GPU: transformers binds them once mamba-ssm imports), counted at their
``autograd.Function`` s (``flopscope.capture.catalog``) on a CPU: their Triton kernels cannot launch here, and on fake
tensors and meta they are not run. One price for the algorithm: a model with mamba-ssm counts what it counts on
transformers' torch reference path, total, roles and modules, each the closed form; the one documented difference is
the causal convolution, whose kernel computes the L outputs that the torch path's ``Conv1d(padding=W-1)`` computes
L + W - 1 of (``docs/conventions.md``).

Runs where mamba-ssm is installed: the matrix's ``kernels`` cell builds it without its CUDA extension
(``MAMBA_SKIP_CUDA_BUILD``, ``tools/matrix.py``). ``mamba_ssm`` imports that extension, ``selective_scan_cuda``, at
its top; it cannot be built without a CUDA toolkit, so an empty module stands in for it here. Nothing calls it: the
catalog's records stand in for the calls of ``SelectiveScanFn`` and ``MambaInnerFn``, which are the only callers."""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings

import pytest
import torch

import flopscope

if importlib.util.find_spec("mamba_ssm") is None:
    pytest.skip("mamba-ssm is installed in the matrix's kernels cell", allow_module_level=True)
if importlib.util.find_spec("selective_scan_cuda") is None:  # (its CUDA extension, never built on a CPU)
    sys.modules["selective_scan_cuda"] = types.ModuleType("selective_scan_cuda")

from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
from torch import nn
from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2

B, T, H, P, G, N, CHUNK = 2, 20, 8, 16, 2, 16, 8  # batch, tokens, heads, head width, groups, state, chunk


class Call(nn.Module):
    def __init__(self, function, **kwargs) -> None:
        super().__init__()
        self.function, self.kwargs = function, kwargs

    def forward(self, *args):
        return self.function(*args, **self.kwargs)


def profile(model, *args, **kwargs) -> flopscope.Profile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(model, *args, **kwargs)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_chunked_scan_is_one_record_priced_as_the_chunked_algorithm(device):
    """Mamba-2's scan over 20 tokens in chunks of 8 (padded to 24: 3 chunks): the in-chunk scores C·Bᵀ and their
    product with x per head, the chunk states Bᵀ·x, the passing of the 4 states (initial and 3 chunks') between
    chunks and their read C·S; its outputs are the kernel's (out like x, the final states [B, H, P, N] in float32)."""
    x, dt = torch.randn(B, T, H, P, device=device), torch.rand(B, T, H, device=device)
    b, c = torch.randn(B, T, G, N, device=device), torch.randn(B, T, G, N, device=device)
    with torch.no_grad():
        prof = profile(Call(mamba_chunk_scan_combined, return_final_states=True), x, dt,
                       -torch.rand(H, device=device), b, c, CHUNK)
    padded, chunks = 24, 3
    assert prof.total() == (B * H * padded * CHUNK * N + B * H * padded * CHUNK * P
                            + B * H * P * N * (2 * padded + (chunks + 1) ** 2))
    assert [op.op_name for op in prof._ops if op.macs] == ["mamba_ssm.mamba_chunk_scan_combined"]
    out, state = prof.output
    assert tuple(out.shape) == (B, T, H, P) and tuple(state.shape) == (B, H, P, N)
    assert state.dtype == torch.float32


def test_the_selective_scan_is_one_record():
    """Mamba's scan: each of the B·D·L outputs reads its N-wide state (u [B, D, L], A [D, N])."""
    d, length, state = 64, 10, 4
    u, delta = torch.randn(B, d, length), torch.rand(B, d, length)
    bc = torch.randn(B, state, length)
    with torch.no_grad():
        prof = profile(Call(selective_scan_fn, return_last_state=True), u, delta, -torch.rand(d, state), bc, bc)
    assert prof.total() == B * d * length * state
    out, last = prof.output
    assert tuple(out.shape) == (B, d, length) and tuple(last.shape) == (B, d, state)


MAMBA2 = dict(hidden_size=64, num_heads=H, head_dim=P, state_size=N, n_groups=G, num_hidden_layers=1, vocab_size=100,
              chunk_size=CHUNK, expand=2, conv_kernel=4)
MAMBA = dict(hidden_size=32, state_size=4, num_hidden_layers=1, vocab_size=64, expand=2, conv_kernel=4,
             time_step_rank=4)


def kernels_and_torch(module: types.ModuleType, model: nn.Module, ids: torch.Tensor, train: bool,
                      names: tuple[str, ...], monkeypatch) -> tuple[flopscope.Profile, flopscope.Profile]:
    """The model counted with mamba-ssm's kernels, then with transformers' torch path (the same functions unbound
    from mamba-ssm: the reference each wraps)."""
    model.train(train)
    with torch.set_grad_enabled(train):
        kernels = profile(model, ids, mode="fake", backward=train)
        assert any(op.op_name.startswith("mamba_ssm.") for op in kernels._ops)  # (transformers bound mamba-ssm)
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name).__wrapped__)
        reference = profile(model, ids, mode="fake", backward=train)
    assert not any(op.op_name.startswith("mamba_ssm.") for op in reference._ops)
    return kernels, reference


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_mamba2_with_mamba_ssm_counts_as_on_the_torch_path(train, monkeypatch):
    """A Mamba-2 layer over 20 tokens (chunks of 8). Inference runs mamba-ssm's chunked scan; training its fused layer
    (the convolution, the scan, the gated norm and out_proj in one Function), recorded as the steps it fuses. Both
    count as the torch path by role, by module and by phase, but for the convolution in training: the kernel's
    L outputs per channel against the torch path's L + W - 1, in the forward and the two gradients. Every role is its
    closed form."""
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(Mamba2Config(**MAMBA2))
    ids = torch.randint(0, 100, (B, T))
    kernels, reference = kernels_and_torch(modeling_mamba2, model, ids, train,
                                           ("mamba2_chunk_scan", "mamba2_split_conv1d_scan_combined"), monkeypatch)
    d, inner, width, kernel = 64, H * P, 2 * 64 + 2 * G * N, 4  # model, inner width, conv channels, conv taps
    passes = 3 if train else 1
    padded, chunks = 24, 3
    expected = {
        "q_proj": B * T * d * G * N, "k_proj": B * T * d * G * N, "v_proj": B * T * d * inner,
        "out_proj": B * T * inner * d, "attn_scores": B * H * padded * CHUNK * N,
        "attn_weighted_sum": B * H * padded * CHUNK * P, "logits": B * T * d * 100,
        "other": B * T * d * (inner + H) + B * H * P * N * (2 * padded + (chunks + 1) ** 2),
    }
    kernel_conv = B * width * T * kernel
    torch_conv = B * width * (T + kernel - 1) * kernel
    expected = {role: passes * macs for role, macs in expected.items()}
    mixer = "backbone.layers.0.mixer"
    assert kernels.by_role() == {**expected, "conv": passes * (kernel_conv if train else torch_conv), "embedding": 0}
    assert reference.by_role() == {**expected, "conv": passes * torch_conv, "embedding": 0}
    for name in (f"{mixer}.in_proj", f"{mixer}.out_proj", "lm_head"):
        assert kernels.by_module()[name] == reference.by_module()[name]
    assert kernels.by_module()[f"{mixer}.out_proj"] == passes * B * T * inner * d


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_mamba_with_mamba_ssm_counts_as_on_the_torch_path(train, monkeypatch):
    """A Mamba layer over 10 tokens: inference runs mamba-ssm's selective scan; training its fused layer
    (``mamba_inner_fn``: the convolution, x_proj, dt_proj's product, the scan and out_proj), recorded as the steps it
    fuses. By module and phase as the torch path, the training convolution aside (as above)."""
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(**MAMBA))
    length = 10
    ids = torch.randint(0, 64, (B, length))
    kernels, reference = kernels_and_torch(modeling_mamba, model, ids, train,
                                           ("mamba_selective_scan", "mamba_inner_fn"), monkeypatch)
    d, inner, state, rank, kernel = 32, 64, 4, 4, 4
    passes = 3 if train else 1
    mixer = "backbone.layers.0.mixer"
    expected = {f"{mixer}.in_proj": B * length * d * 2 * inner,
                f"{mixer}.x_proj": B * length * inner * (rank + 2 * state),
                f"{mixer}.out_proj": B * length * inner * d, "lm_head": B * length * d * 64}
    for name, macs in expected.items():
        assert kernels.by_module()[name] == reference.by_module()[name] == passes * macs
    scan_and_dt = B * length * inner * state + B * length * rank * inner
    torch_conv = B * inner * (length + kernel - 1) * kernel
    kernel_conv = B * inner * length * kernel if train else torch_conv
    assert reference.total() == passes * (sum(expected.values()) + scan_and_dt + torch_conv)
    assert kernels.total() == passes * (sum(expected.values()) + scan_and_dt + kernel_conv)
