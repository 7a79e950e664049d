"""Fourier transforms: the FFT convention of docs/conventions.md section 2.3, the role ``token_mixing`` and
FNet reconciled (docs/formulas.md section 12).

Every expected value is arithmetic from the documented convention, written out here:

- a complex FFT of length N is ⌈N/2⌉ butterflies in each of ⌈log2 N⌉ stages, one complex MAC each
  ((N/2)·log2 N for a power of two): ``F(N)`` below;
- a real-input / real-output FFT of length N is a complex FFT of ⌈N/2⌉ points plus ⌊N/4⌋ twiddle
  multiplies: ``R(N)``;
- a transform along several dims is, for each dim, one 1-D transform per element of the other dims (for
  r2c / c2r the dims other than the last one run over the half spectrum, N // 2 + 1 bins).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from flopscope.formulas.registry import REGISTRY, OpFamily
from flopscope.role import Role, RoleGroup

from closed_forms import attention, ffn

aten = torch.ops.aten


def F(N: int) -> int:  # noqa: N802, N803 the notation of docs/formulas.md section 12
    """MACs of one complex FFT of length N, as written in docs/conventions.md section 2.3."""
    stages = 0
    while 2**stages < N:  # ⌈log2 N⌉, counted the slow way
        stages += 1
    return (N + 1) // 2 * stages


def R(N: int) -> int:  # noqa: N802, N803
    """MACs of one real-input (or real-output) FFT of length N: F(⌈N/2⌉) + ⌊N/4⌋."""
    return F((N + 1) // 2) + N // 4 if N > 1 else 0


class Apply(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def count(fn, x: torch.Tensor, mode: str = "fake") -> flopscope.Profile:
    prof = flopscope.profile(Apply(fn), x, mode=mode)
    assert prof.unsupported() == {}
    assert sum(prof.by_role().values()) == prof.total()
    return prof


# --------------------------------------------------------------------------------------------------
# the convention, op by op
def test_the_fft_kernels_are_registered_as_transforms():
    for op in (aten._fft_c2c, aten._fft_r2c, aten._fft_c2r):
        spec = REGISTRY.spec(op)
        assert spec is not None and spec.family is OpFamily.TRANSFORM and spec.operands == ()
    assert Role.TOKEN_MIXING.group is RoleGroup.MIXING and Role.TOKEN_MIXING.term == "n·d·log(n·d)"
    assert not Role.TOKEN_MIXING.per_token and not Role.TOKEN_MIXING.attention_core


def test_convention_values_by_hand():
    assert F(1) == 0 and F(2) == 1 and F(4) == 2 * 2 and F(64) == 32 * 6 and F(1000) == 500 * 10
    assert R(64) == F(32) + 16 == 16 * 5 + 16 == F(64) // 2  # half the complex count for a power of two
    assert R(1000) == F(500) + 250 == 250 * 9 + 250


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_complex_fft_of_a_power_of_two(mode):
    x = torch.randn(3, 64, dtype=torch.complex64)
    prof = count(lambda t: torch.fft.fft(t), x, mode)
    assert prof.total() == 3 * (64 // 2) * 6  # 3 transforms, 6 stages of 32 butterflies
    assert prof.by_role() == {"token_mixing": 3 * 32 * 6}
    assert prof.by_op() == {"aten._fft_c2c": 3 * 32 * 6}


def test_inverse_fft_counts_as_the_forward_one():
    x = torch.randn(64, dtype=torch.complex64)
    assert count(torch.fft.ifft, x).total() == 32 * 6  # the 1/N normalisation is elementwise


def test_complex_fft_of_a_length_that_is_not_a_power_of_two():
    x = torch.randn(2, 1000, dtype=torch.complex64)
    # ⌈log2 1000⌉ = 10 stages (2⁹ = 512 < 1000 <= 1024) of 500 butterflies
    assert count(torch.fft.fft, x).total() == 2 * 500 * 10
    odd = torch.randn(999, dtype=torch.complex128)
    assert count(torch.fft.fft, odd).total() == 500 * 10  # ⌈999/2⌉ = 500


def test_real_to_complex_on_a_batch():
    x = torch.randn(2, 3, 64)
    prof = count(torch.fft.rfft, x)  # 6 signals, each a 32-point complex FFT plus 16 twiddles
    assert prof.total() == 2 * 3 * ((32 // 2) * 5 + 64 // 4)
    assert prof.by_op() == {"aten._fft_r2c": 6 * 96}
    # rfft of length 1000: a 500-point complex FFT (9 stages of 250 butterflies) plus 250 twiddles
    assert count(torch.fft.rfft, torch.randn(4, 1000)).total() == 4 * (250 * 9 + 250)


def test_fft_of_a_real_signal_is_a_real_transform():
    # torch.fft.fft of a real 1-D tensor runs _fft_r2c two-sided: the half spectrum, mirrored (not counted)
    prof = count(torch.fft.fft, torch.randn(64))
    assert prof.by_op() == {"aten._fft_r2c": 16 * 5 + 16}


def test_complex_to_real():
    x = torch.randn(4, 33, dtype=torch.complex64)  # the half spectrum of 64 points
    prof = count(lambda t: torch.fft.irfft(t, n=64), x)
    assert prof.by_op() == {"aten._fft_c2r": 4 * (16 * 5 + 16)}


def test_fft2_counts_each_dimension_over_the_others():
    x = torch.randn(3, 8, 16, dtype=torch.complex64)
    # along dim 1 (N = 8): 3·16 transforms of 4 butterflies x 3 stages; along dim 2 (N = 16): 3·8 of 8 x 4
    expected = 3 * 16 * (4 * 3) + 3 * 8 * (8 * 4)
    assert count(torch.fft.fft2, x).total() == expected
    assert count(torch.fft.fft2, torch.randn(3, 8, 16)).total() == expected  # real input: cast, then c2c
    assert count(lambda t: torch.fft.fftn(t, dim=(2, 1)), x).total() == expected


def test_multi_dimensional_real_transforms_run_the_half_spectrum():
    x = torch.randn(3, 8, 16)
    # rfft2: real transforms of 16 along the last dim (3·8 of them), then complex transforms of 8 along
    # dim 1 over the 16 // 2 + 1 = 9 bins (3·9 of them)
    r2c = 3 * 8 * ((8 // 2) * 3 + 16 // 4) + 3 * 9 * (4 * 3)
    assert count(torch.fft.rfft2, x).total() == r2c
    # irfft2 of the [3, 8, 9] half spectrum back to [3, 8, 16]: the same transforms in reverse order
    assert count(lambda t: torch.fft.irfft2(t, s=(8, 16)), torch.randn(3, 8, 9, dtype=torch.complex64)).total() == r2c


def test_backward_counts_what_autograd_runs_and_keeps_the_role():
    class Filter(nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = nn.Linear(64, 64, bias=False)

        def forward(self, x):
            return torch.fft.irfft(torch.fft.rfft(self.mix(x)), n=64)

    rows = 4
    prof = flopscope.profile(Filter(), torch.randn(rows, 64), backward=True)
    forward = prof.by_role(phase="forward")
    assert forward["token_mixing"] == rows * R(64) + rows * R(64)  # rfft, then irfft
    # irfft's gradient is an rfft (R(64)); rfft's gradient is a full complex FFT of the padded spectrum (F(64))
    assert prof.by_role(phase="backward")["token_mixing"] == rows * (R(64) + F(64))
    assert prof.unsupported() == {}


# --------------------------------------------------------------------------------------------------
# FNet: the Fourier sublayer is its token mixing
transformers = pytest.importorskip("transformers")
d, d_ff, L, V = 32, 64, 2, 100


def fnet() -> nn.Module:
    config = transformers.FNetConfig(vocab_size=V, hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                     max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.FNetModel(config).eval()


def fourier_mixing(B: int, n: int) -> int:  # noqa: N803
    """FNet's sublayer Re(F_seq(F_hidden(x))) (Lee-Thorp et al. 2021, eq. 3): a complex 2-D FFT over (n, d),
    i.e. d transforms of length n plus n transforms of length d per sequence (docs/formulas.md section 12)."""
    return B * (d * F(n) + n * F(d))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_fnet_by_role(mode):
    B, n = 2, 16
    prof = flopscope.profile(fnet(), torch.randint(0, V, (B, n)), mode=mode)
    assert prof.unsupported() == {}
    expected = {
        "token_mixing": L * B * (d * (8 * 4) + n * (16 * 5)),  # F(16) = 8·4, F(32) = 16·5
        "ffn_up": L * ffn(B, n, d, d_ff)["ffn_up"],
        "ffn_down": L * ffn(B, n, d, d_ff)["ffn_down"],
        "embedding": 0,
        "other": B * n * d * d + B * d * d,  # the embedding projection d -> d on every token, the pooler on one
    }
    assert expected["token_mixing"] == L * fourier_mixing(B, n)
    assert prof.by_role() == expected
    assert prof.total() == sum(expected.values())
    for i in range(L):
        assert prof.by_block()[f"encoder.layer.{i}.fourier.self"] == {"token_mixing": fourier_mixing(B, n)}


def test_fnet_reconciles_exactly():
    B, n = 2, 16
    rec = flopscope.profile(fnet(), torch.randint(0, V, (B, n))).reconcile()
    mixing = [row for row in rec.rows if row.role == "token_mixing"]
    assert [row.block for row in mixing] == [f"encoder.layer.{i}.fourier.self" for i in range(L)]
    assert all(row.predicted == fourier_mixing(B, n) and row.term == "n·d·log(n·d)" for row in mixing)
    assert rec.all_exact() and not rec.unexplained()


def test_fnet_scaling_is_n_log_n_and_cheaper_than_attention_at_512():
    lengths = (32, 64, 128, 256, 512)
    s = flopscope.scaling(fnet(), lambda n: torch.randint(0, V, (1, n)), lengths=lengths)
    # F(n) = (n/2)·log2 n: n·log n is no polynomial, so no polynomial of degree <= len(lengths) - 2 passes
    # through the counts; scaling() reports None (measured and predicted alike) instead of fitting one.
    # The counts themselves are checked exactly, length by length, against the formula.
    assert s.polynomials["token_mixing"] is None and s.predicted["token_mixing"] is None
    assert s.measured["token_mixing"] == tuple(L * (d * (n // 2) * k + n * (16 * 5))
                                               for n, k in zip(lengths, (5, 6, 7, 8, 9), strict=True))
    assert s.matches("ffn_up") and s.matches("ffn_down")  # the per-token roles stay polynomials (linear in n)
    assert s.total() is None
    # at n = 512, one Fourier sublayer (O(n·d·log n)) against one softmax attention layer of the same width
    # (O(n²·d) core + O(n·d²) projections; 4 heads of 8), both from closed forms
    n = 512
    mixing = fourier_mixing(1, n)
    assert mixing == d * 256 * 9 + n * 16 * 5 == 114_688
    softmax_attention = attention(1, n, n, d, 4)
    core = softmax_attention["attn_scores"] + softmax_attention["attn_weighted_sum"]
    assert core == 2 * n * n * d == 16_777_216
    assert s.measured["token_mixing"][-1] == L * mixing < core < sum(softmax_attention.values())
