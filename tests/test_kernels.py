"""Fused kernels are charged exactly what their unfused computation costs, and both equal the closed form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope

from closed_forms import conv_out, rnn


def count(model: nn.Module, *args, mode: str = "real", **kwargs) -> flopscope.Profile:
    with torch.no_grad():
        return flopscope.profile(model.eval(), *args, mode=mode, **kwargs)


# --------------------------------------------------------------------------------------------------
# recurrent layers: the oneDNN kernel (mkldnn_rnn_layer) against the unfused loop of matmuls
RNN_CASES = [
    # (cell, gates, kwargs)
    ("LSTM", 4, dict()),
    ("LSTM", 4, dict(num_layers=2, bidirectional=True)),
    ("LSTM", 4, dict(batch_first=True)),
    ("GRU", 3, dict(num_layers=2, bidirectional=True)),
    ("RNN", 1, dict(nonlinearity="tanh")),
    ("RNN", 1, dict(nonlinearity="relu", bidirectional=True)),
]


def rnn_closed_form(gates: int, steps: int, batch: int, d_in: int, d_h: int, num_layers: int = 1,
                    bidirectional: bool = False, **_) -> int:
    dirs = 2 if bidirectional else 1
    first = dirs * rnn(batch, steps, gates, d_in, d_h)
    rest = (num_layers - 1) * dirs * rnn(batch, steps, gates, dirs * d_h, d_h)
    return first + rest


@pytest.mark.parametrize(("cell", "gates", "kwargs"), RNN_CASES)
@pytest.mark.parametrize("mode", ["fake", "real"])
def test_recurrent_fused_and_unfused_equal_closed_form(cell, gates, kwargs, mode):
    T, B, d_in, d_h = 7, 3, 12, 16
    torch.manual_seed(0)
    model = getattr(nn, cell)(d_in, d_h, **kwargs)
    x = torch.randn((B, T, d_in) if kwargs.get("batch_first") else (T, B, d_in))
    expected = rnn_closed_form(gates, T, B, d_in, d_h, **kwargs)
    fused = count(model, x, mode=mode)
    with torch.backends.mkldnn.flags(enabled=False):
        unfused = count(model, x, mode=mode)
    assert fused.total() == unfused.total() == expected
    if cell == "LSTM":
        assert "aten.mkldnn_rnn_layer" in fused.by_op()
        assert "aten.mkldnn_rnn_layer" not in unfused.by_op()


def test_lstm_with_projection_and_packed_sequences():
    T, B, d_in, d_h, P = 6, 3, 10, 16, 8
    model = nn.LSTM(d_in, d_h, proj_size=P)
    prof = count(model, torch.randn(T, B, d_in))
    assert prof.total() == T * B * (4 * d_h * (d_in + P) + P * d_h)
    lengths = [6, 4, 2]
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(T, B, d_in), lengths)
    prof = count(nn.LSTM(d_in, d_h), packed)
    assert prof.total() == sum(lengths) * 4 * d_h * (d_in + d_h)


@pytest.mark.parametrize(("make", "gates"), [(nn.LSTMCell, 4), (nn.GRUCell, 3), (nn.RNNCell, 1)])
def test_cells(make, gates):
    B, d_in, d_h = 5, 12, 16
    assert count(make(d_in, d_h), torch.randn(B, d_in)).total() == rnn(B, 1, gates, d_in, d_h)


# --------------------------------------------------------------------------------------------------
# attention kernels
class Core(nn.Module):
    """Attention core on given q, k, v, through SDPA or written out."""

    def __init__(self, how: str, **sdpa_kwargs):
        super().__init__()
        self.how, self.kwargs = how, sdpa_kwargs

    def forward(self, q, k, v):
        if self.how == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, **self.kwargs)
        if k.shape[-3] != q.shape[-3]:  # grouped-query: repeat K/V heads
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        if self.how == "einsum":
            s = torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)
            return torch.einsum("bhqk,bhkd->bhqd", s, v)
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v


@pytest.mark.parametrize("sdpa_kwargs", [dict(), dict(is_causal=True), dict(enable_gqa=True)])
@pytest.mark.parametrize("mode", ["fake", "real"])
def test_sdpa_equals_written_out_attention(sdpa_kwargs, mode):
    B, h, n_q, n_k, d_k = 2, 8, 5, 9, 16
    n_kv = 2 if sdpa_kwargs.get("enable_gqa") else h
    if sdpa_kwargs.get("is_causal"):
        n_k = n_q
    q, k, v = torch.randn(B, h, n_q, d_k), torch.randn(B, n_kv, n_k, d_k), torch.randn(B, n_kv, n_k, d_k)
    expected = 2 * B * h * n_q * n_k * d_k  # scores + weighted sum, dense (a causal mask is executed densely)
    fused = count(Core("sdpa", **sdpa_kwargs), q, k, v, mode=mode)
    assert fused.total() == expected
    assert count(Core("matmul"), q, k, v, mode=mode).total() == expected
    assert count(Core("einsum"), q, k, v, mode=mode).total() == expected


def test_sdpa_with_a_mask_on_the_math_kernel():
    B, h, n, d_k = 1, 4, 6, 8
    q = k = v = torch.randn(B, h, n, d_k)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math = count(Core("sdpa", attn_mask=mask), q, k, v)
    assert math.total() == 2 * B * h * n * n * d_k
    assert set(math.by_op()) == {"aten.bmm"}


def test_multihead_attention_cross_attention_and_kdim():
    """nn.MultiheadAttention with kdim/vdim != embed_dim (separate projections), n_q != n_k."""
    E, h, kd, vd, n_q, n_k, B = 32, 4, 24, 20, 3, 11, 2

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(E, h, kdim=kd, vdim=vd, batch_first=True)

        def forward(self, q, kv_k, kv_v):
            return self.mha(q, kv_k, kv_v, need_weights=False)[0]

    prof = count(Cross(), torch.randn(B, n_q, E), torch.randn(B, n_k, kd), torch.randn(B, n_k, vd))
    expected = B * (n_q * E * E + n_k * kd * E + n_k * vd * E + 2 * n_q * n_k * E + n_q * E * E)
    assert prof.total() == expected


def test_native_mha_fast_path_equals_slow_path_with_a_padding_mask():
    E, h, n, B = 32, 4, 10, 2
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, h, batch_first=True).eval()

    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    x = torch.randn(B, n, E)
    fast = count(Self(), x)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        slow = count(Self(), x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert "aten._native_multi_head_attention" in fast.by_op()
    assert "aten._native_multi_head_attention" not in slow.by_op()
    assert fast.total() == slow.total() == B * (4 * n * E * E + 2 * n * n * E)


def test_fused_encoder_layer_equals_slow_path_for_a_stack():
    E, h, F_, n, B, L = 32, 4, 64, 10, 2, 3
    torch.manual_seed(0)
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, h, F_, batch_first=True), L,
                                  enable_nested_tensor=False).eval()
    x = torch.randn(B, n, E)
    fast = count(stack, x)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        slow = count(stack, x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert fast.op_calls().get("aten._transformer_encoder_layer_fwd") == L
    assert fast.total() == slow.total() == L * B * (4 * n * E * E + 2 * n * n * E + 2 * n * E * F_)
    assert fast.by_module()["layers.1"] == B * (4 * n * E * E + 2 * n * n * E + 2 * n * E * F_)


# --------------------------------------------------------------------------------------------------
# convolutions: every output position is charged (C_in / g) * prod(kernel) taps; transposed by input
CONV_CASES = [
    # (module, input shape, expected MACs)
    (lambda: nn.Conv1d(6, 8, 5, stride=2, padding=1, dilation=2, groups=2), (2, 6, 31),
     2 * 8 * conv_out(31, 5, 2, 1, 2) * (6 // 2) * 5),
    (lambda: nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2)), (2, 3, 17, 12),
     2 * 16 * conv_out(17, 3, 2, 1) * conv_out(12, 5, 1, 2) * 3 * 3 * 5),
    (lambda: nn.Conv2d(16, 16, 3, padding=1, groups=16), (1, 16, 9, 9), 16 * 9 * 9 * 1 * 3 * 3),  # depthwise
    (lambda: nn.Conv3d(4, 6, 3, padding=1, stride=2), (1, 4, 8, 8, 8), 6 * conv_out(8, 3, 2, 1) ** 3 * 4 * 27),
    (lambda: nn.ConvTranspose1d(6, 4, 3, stride=2, groups=2), (2, 6, 10), 2 * 10 * 6 * (4 // 2) * 3),
    (lambda: nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), (1, 8, 7, 7), 7 * 7 * 8 * 4 * 4 * 4),
]


@pytest.mark.parametrize(("make", "shape", "expected"), CONV_CASES)
@pytest.mark.parametrize("mode", ["fake", "real"])
def test_convolutions(make, shape, expected, mode):
    torch.manual_seed(0)
    prof = count(make(), torch.randn(*shape), mode=mode)
    assert prof.total() == expected
    assert set(prof.by_op()) == {"aten.convolution"}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensor_fast_path_counts_only_real_tokens():
    """nn.TransformerEncoder in eval with a padding mask runs on nested tensors: no work on padding."""
    E, h, F_, L = 32, 4, 64, 2
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, h, F_, batch_first=True), L).eval()
    lengths = (6, 4)
    mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.no_grad():  # (torch warns once per process that nested tensors are a prototype)
        prof = flopscope.profile(encoder, torch.randn(2, 6, E), src_key_padding_mask=mask, mode="real")
    assert prof.op_calls()["aten._transformer_encoder_layer_fwd"] == L
    assert prof.total() == L * sum(n * (4 * E * E + 2 * E * F_) + 2 * n * n * E for n in lengths)
    assert prof.by_role()["attn_scores"] == L * sum(n * n * E for n in lengths)
    assert prof.unsupported() == {}
