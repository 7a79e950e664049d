"""The multiply formulas of matrix products, convolutions, recurrent layers and Fourier
transforms, and their backward kernels, one ``@formula`` each, with its op family and
operand positions (the attention kernels': :mod:`flopscope.formulas.attention`). Pure
functions of the arguments' shapes (the calling convention of
:mod:`flopscope.formulas.registry`), in MACs; ``docs/formulas.md`` derives each."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import FormulaError
from .registry import KnownShape, NestedShape, OpFamily, Shape, aten_ops, formula, prod, rows_of

aten = torch.ops.aten

__all__ = [  # every formula of this module; flopscope.formulas re-exports them
    'addmm',
    'addmv',
    'baddbmm',
    'bmm',
    'conv',
    'convolution',
    'convolution_backend',
    'convolution_backward',
    'convolution_transpose_backend',
    'cudnn_rnn',
    'cudnn_rnn_backward',
    'dot',
    'euclidean_dist',
    'fft_along',
    'fft_c2c',
    'fft_c2r',
    'fft_macs',
    'fft_r2c',
    'gemm',
    'grouped_mm',
    'grouped_mm_fallback',
    'linear',
    'matmul',
    'matmul_backward',
    'mkldnn_rnn_layer',
    'mkldnn_rnn_layer_backward',
    'mm',
    'mv',
    'quantized_convolution',
    'quantized_convolution_add',
    'quantized_linear',
    'quantized_linear_unpacked',
    'real_fft_macs',
    'recurrent',
    'scaled_grouped_mm',
    'scaled_mm',
    'triangular_solve',
    'trilinear',
]


# --------------------------------------------------------------------------------------------------
# matrix products
# --------------------------------------------------------------------------------------------------
def gemm(m: int, k: int, n: int, batch: int = 1) -> int:
    """MACs of ``batch`` products ``[m, k] @ [k, n]``."""
    return batch * m * k * n


@formula(aten.mm, aten._int_mm, family=OpFamily.MATMUL, operands=(0, 1))
def mm(a: Shape, b: Shape, **_: Any) -> int:
    """Matrix product; no bias."""
    # [m, n] = mm([m, k], [k, n])
    return gemm(a[0], a[1], b[1])


@formula(aten.addmm, aten._addmm_activation, family=OpFamily.MATMUL, operands=(1, 2))
def addmm(bias: Shape, a: Shape, b: Shape, **_: Any) -> int:
    """``bias + a @ b`` (GPT-2 ``Conv1D``, ``nn.Linear`` on 2-D input); the bias add is
    not a MAC."""
    # [m, n] = addmm([n] | [m, n], [m, k], [k, n])
    return mm(a, b)


@formula(aten._scaled_mm, family=OpFamily.MATMUL, operands=(0, 1))
def scaled_mm(a: Shape, b: Shape, *_: Any, **__: Any) -> int:
    """Low-precision matmul with scales; the scaling is elementwise, not counted."""
    # [m, n] = _scaled_mm([m, k], [k, n], scale_a, scale_b, ...)
    return mm(a, b)


@formula(aten.bmm, family=OpFamily.MATMUL, operands=(0, 1))
def bmm(a: Shape, b: Shape, **_: Any) -> int:
    """Batched matrix product (of nested tensors: each entry's product on its own
    shape)."""
    # [B, m, n] = bmm([B, m, k], [B, k, n])
    if isinstance(a, NestedShape) or isinstance(b, NestedShape):
        return sum(gemm(x[0], x[1], y[1]) for x, y in _entries(a, b))
    return gemm(a[1], a[2], b[2], batch=a[0])


@formula(aten.baddbmm, aten.addbmm, family=OpFamily.MATMUL, operands=(1, 2))
def baddbmm(bias: Shape, a: Shape, b: Shape, **_: Any) -> int:
    """``bias + bmm(a, b)`` (addbmm also sums over the batch: adds, not counted)."""
    # [B, m, n] = baddbmm(bias, [B, m, k], [B, k, n])
    return bmm(a, b)


@formula(aten.mv, family=OpFamily.MATMUL, operands=(0, 1))
def mv(a: Shape, v: Shape, **_: Any) -> int:
    """Matrix-vector product."""
    # [m] = mv([m, k], [k])
    return a[0] * a[1]


@formula(aten.addmv, family=OpFamily.MATMUL, operands=(1, 2))
def addmv(bias: Shape, a: Shape, v: Shape, **_: Any) -> int:
    # [m] = addmv([m], [m, k], [k])
    return mv(a, v)


@formula(aten.dot, aten.vdot, family=OpFamily.MATMUL, operands=(0, 1))
def dot(a: Shape, b: Shape, **_: Any) -> int:
    # [] = dot([k], [k])
    return a[0]


@formula(aten.linear, family=OpFamily.MATMUL, operands=(0, 1))
def linear(x: Shape, weight: Shape, bias: Shape | None = None, **_: Any) -> int:
    """``x @ weight.T``; seen only where ``linear`` is not decomposed (mkldnn tensors,
    some backends)."""
    # [..., n] = linear([..., k], [n, k])
    return rows_of(x) * weight[0] * weight[1]


@formula(aten.matmul, family=OpFamily.MATMUL, operands=(0, 1))
def matmul(a: Shape, b: Shape, **_: Any) -> int:
    """``torch.matmul`` with broadcasting; normally decomposed into mm/bmm before it is
    seen. Seen on nested tensors (their kernel: the math path of SDPA on jagged
    inputs): each entry's product on its own shape."""
    # [*batch, m, n] = matmul([*batch, m, k], [*batch, k, n]); 1-D operands are vectors
    if isinstance(a, NestedShape) or isinstance(b, NestedShape):
        return sum(matmul(x, y) for x, y in _entries(a, b))
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    batch = torch.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2]))
    return gemm(a2[-2], a2[-1], b2[-1], batch=prod(batch))


def _entries(*shapes: Shape) -> Iterable[tuple[Shape, ...]]:
    """The operands of each entry of a nested op: a nested operand's own shape for that
    entry, a dense one as it is (nested kernels apply it to every entry)."""
    batch = next(len(s.sizes) for s in shapes if isinstance(s, NestedShape))
    for i in range(batch):
        yield tuple(s.sizes[i] if isinstance(s, NestedShape) else s for s in shapes)


@formula(*aten_ops("_grouped_mm"), family=OpFamily.GROUPED_MATMUL, operands=(0, 1))
def grouped_mm(a: Shape, b: Shape, offs: Shape | None = None, *_: Any, out_shape: Shape | None = None,
               **__: Any) -> int:
    """Grouped matmul (mixture-of-experts experts): ``_grouped_mm(a, b, offs)``.

    ``[M, K] x [G, K, N]``: the rows of ``a`` split into G groups by ``offs``;
    ``[G, M, K] x [K, N]``: the columns of ``b`` split; ``[M, K] x [K, N]``: the shared
    dim K split; ``[G, M, K] x [G, K, N]``: no split. The kernel computes the groups
    only: where the values of ``offs`` are known (a real run, or offsets an input
    gave), the split dim counts up to ``offs[-1]`` (rows after it, such as the routes
    to other ranks' experts under expert parallelism, are left out). Where they are not
    (offsets made from routing on fake tensors), the whole split dim is counted: in
    Hugging Face's MoE layers every route meets one of the layer's experts, so
    ``offs[-1]`` is the split dim.
    """
    used = _covered(offs)
    if len(a) == 2 and len(b) == 2:
        return gemm(a[0], a[1] if used is None else used, b[1])
    if out_shape is None:
        raise FormulaError(f"_grouped_mm of {a} and {b} needs the output shape (out_shape=)")
    if used is None or (len(a) == 3 and len(b) == 3):
        return prod(out_shape) * a[-1]
    # out [M, N]: the split dim is M (a 2-D) or N (b 2-D)
    rows, columns = (used, out_shape[-1]) if len(a) == 2 else (out_shape[0], used)
    return rows * columns * a[-1]


@formula(*aten_ops("_scaled_grouped_mm"), family=OpFamily.GROUPED_MATMUL, operands=(0, 1))
def scaled_grouped_mm(a: Shape, b: Shape, scale_a: Any = None, scale_b: Any = None, offs: Shape | None = None,
                      *_: Any, out_shape: Shape | None = None, **__: Any) -> int:
    """``_scaled_grouped_mm(a, b, scale_a, scale_b, offs)``: as :func:`grouped_mm`
    (scaling multiplies no operands)."""
    return grouped_mm(a, b, offs, out_shape=out_shape)


@formula("transformers::grouped_mm_fallback", family=OpFamily.GROUPED_MATMUL, operands=(0, 1))
def grouped_mm_fallback(x: Shape, weight: Shape, offs: Shape | None = None, *_: Any, **__: Any) -> int:
    """transformers' opaque fallback for grouped matmul, a loop over the groups of rows
    ``offs`` bounds: as :func:`grouped_mm`, the rows up to ``offs[-1]`` where its
    values are known, else every row of ``x``."""
    # [S, N] = grouped_mm_fallback([S, K], [E, K, N], offs[E])
    used = _covered(offs)
    return gemm(x[0] if used is None else used, x[1], weight[2])


def _covered(offs: Shape | None) -> int | None:
    """Where a grouped matmul's groups end, ``offs[-1]``, if its values are known."""
    return offs.values[-1] if isinstance(offs, KnownShape) and offs.values else None


@formula(aten._trilinear)
def trilinear(i1: Shape, i2: Shape, i3: Shape, expand1: Sequence[int], expand2: Sequence[int],
              expand3: Sequence[int], sumdim: Sequence[int], *_: Any, **__: Any) -> int:
    """``nn.Bilinear`` / ``F.bilinear``: every point of the broadcast (batch, out, in1,
    in2) space is one multiply-add of ``x1_i · W_oij · x2_j``, so B·out·in1·in2 MACs,
    as fvcore and thop count it."""
    # [B, out] = _trilinear([B, in1], [out, in1, in2], [B, in2], expand1, expand2,
    # expand3, sumdim=[in1, in2])
    full = [_expanded(shape, expand) for shape, expand in ((i1, expand1), (i2, expand2),
                                                           (i3, expand3))]
    return prod(max(sizes) for sizes in zip(*full, strict=True))


def _expanded(shape: Shape, inserted: Sequence[int]) -> list[int]:
    out = list(shape)
    for dim in sorted(inserted):
        out.insert(dim, 1)
    return out


@formula("quantized::linear_dynamic", "quantized::linear", "quantized::linear_relu_dynamic",
         "quantized::linear_relu", "quantized::linear_dynamic_fp16",
         "quantized::linear_relu_dynamic_fp16",
         "quantized::linear_tanh", "quantized::linear_leaky_relu")
def quantized_linear(x: Shape, *_: Any, out_shape: Shape, **__: Any) -> int:
    """Quantized linear layers: rows x in_features x out_features, like the float
    ``nn.Linear``.

    Family ``OTHER``, not ``MATMUL``: the weight arrives packed (a
    ``LinearPackedParamsBase`` script object, not a tensor), so there is no weight
    operand in the graph for a role pass to follow."""
    # [..., out] = quantized::linear_dynamic([..., in], packed_params)
    return prod(x[:-1]) * x[-1] * out_shape[-1]


@formula("quantized::linear_dynamic_fp16_unpacked_weight", family=OpFamily.MATMUL, operands=(0, 1))
def quantized_linear_unpacked(x: Shape, weight: Shape, *_: Any, **__: Any) -> int:
    """The fp16 dynamic linear with its weight as a tensor ``[out, in]``: as
    :func:`linear`."""
    # [..., out] = linear_dynamic_fp16_unpacked_weight([..., in], [out, in], bias)
    return linear(x, weight)


@formula(aten.linalg_solve_triangular, aten.triangular_solve)
def triangular_solve(a: Shape, b: Shape, *_: Any, out_shape: Shape, **__: Any) -> int:
    """Substitution with a triangular ``[*, n, n]`` matrix: each of the k right-hand
    sides takes n(n-1)/2 multiply-adds (the divisions by the diagonal are
    elementwise)."""
    # [*, n, k] = linalg_solve_triangular([*, n, n], [*, n, k]); triangular_solve(B, A)
    # has B first
    n = a[-1] if a[-1] == a[-2] else b[-1]
    return prod(out_shape) // n * (n * (n - 1) // 2)


@formula(aten._euclidean_dist)
def euclidean_dist(x1: Shape, x2: Shape, **_: Any) -> int:
    """``cdist`` by matmul: PyTorch appends the squared norms and a column of ones to
    both operands and multiplies ``[n, d + 2] @ [d + 2, m]``."""
    # [*, n, m] = _euclidean_dist([*, n, d], [*, m, d])
    return prod(x1[:-2]) * x1[-2] * x2[-2] * (x1[-1] + 2)


# --------------------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------------------
def conv(x: Shape, weight: Shape, out_shape: Shape, transposed: bool) -> int:
    """Convolution in any dimension, any groups/stride/padding/dilation (these act
    through the shapes).

    Forward: every output element is a dot product of ``(C_in / g) * prod(kernel)``
    taps, zero padding included: ``out.numel() * weight[1] * prod(weight[2:])``.
    Transposed (weight ``[C_in, C_out/g, *k]``): every input element is scattered
    through ``(C_out / g) * prod(kernel)`` taps: ``x.numel() * weight[1] *
    prod(weight[2:])``.
    """
    taps = weight[1] * prod(weight[2:])
    return prod(x if transposed else out_shape) * taps


@formula(aten.convolution, aten._convolution, aten.convolution_overrideable, family=OpFamily.CONV)
def convolution(x: Shape, weight: Shape, bias: Any, stride: Any, padding: Any, dilation: Any,
                transposed: bool,
                *_: Any, out_shape: Shape, **__: Any) -> int:
    # [B, C_out, *L_out] = convolution([B, C_in, *L_in], [C_out, C_in/g, *k], ...)
    return conv(x, weight, out_shape, bool(transposed))


@formula(aten.mkldnn_convolution, aten.cudnn_convolution, aten._slow_conv2d_forward,
         aten.slow_conv3d_forward,
         aten.slow_conv_dilated2d, aten.slow_conv_dilated3d, aten._conv_depthwise2d,
         aten.conv_depthwise3d,
         aten.miopen_convolution, aten.miopen_depthwise_convolution,
         aten._nnpack_spatial_convolution,
         family=OpFamily.CONV)
def convolution_backend(x: Shape, weight: Shape, *_: Any, out_shape: Shape, **__: Any) -> int:
    """Backend-specific forward convolutions (non-transposed)."""
    return conv(x, weight, out_shape, transposed=False)


@formula(aten.cudnn_convolution_transpose, aten.slow_conv_transpose2d, aten.slow_conv_transpose3d,
         aten.miopen_convolution_transpose, family=OpFamily.CONV)
def convolution_transpose_backend(x: Shape, weight: Shape, *_: Any, out_shape: Shape,
                                  **__: Any) -> int:
    """Backend-specific transposed convolutions."""
    return conv(x, weight, out_shape, transposed=True)


_QUANTIZED_CONVS = tuple(f"quantized::{kind}{dims}d{suffix}" for dims in (1, 2, 3)
                         for kind, suffix in (("conv", ""), ("conv", "_relu"), ("conv", "_dynamic"),
                                              ("conv_transpose", ""),
                                              ("conv_transpose", "_dynamic")))


@formula(*_QUANTIZED_CONVS, family=OpFamily.CONV)
def quantized_convolution(x: Shape, packed: Any, *_: Any, out_shape: Shape, **__: Any) -> int:
    """Quantized convolutions (``torch.ao.nn.quantized.Conv{1,2,3}d``,
    ``ConvTranspose*``, the fused ``ConvReLU*``, the dynamic ones): the multiplies of
    the float convolution. Weight shape (groups act through it) and direction come
    from the packed parameters; stride, padding and dilation through ``out_shape``. A
    1-D convolution's packed weight is ``[C_out, C_in/g, 1, k]``: the 1 changes
    nothing."""
    # [B, C_out, *L_out] = quantized::conv2d([B, C_in, *L_in], packed [C_out,
    # C_in/g, *k], scale, zero_point)
    weight, transposed = _packed_conv(packed)
    return conv(x, weight, out_shape, transposed)


@formula("quantized::conv2d_add", "quantized::conv2d_add_relu", family=OpFamily.CONV)
def quantized_convolution_add(x: Shape, accumulator: Shape, packed: Any, *_: Any, out_shape: Shape,
                              **__: Any) -> int:
    """A quantized convolution whose output is added to ``accumulator`` (a residual; the
    add is not a MAC)."""
    # [B, C_out, *L_out] = quantized::conv2d_add([B, C_in, *L_in], [B, C_out, *L_out],
    # packed, scale, zero_point)
    return quantized_convolution(x, packed, out_shape=out_shape)


def _packed_conv(packed: Any) -> tuple[Shape, bool]:
    """(weight shape, transposed) of a ``Conv{2,3}dPackedParamsBase``; read outside
    every dispatch mode (it is metadata of the model, not an op of it), so that no
    fake or recording mode sees the read."""
    with _disable_current_modes():
        return tuple(packed.weight().shape), bool(packed.transpose())


# --------------------------------------------------------------------------------------------------
# recurrent layers
# --------------------------------------------------------------------------------------------------
def recurrent(x: Shape, weights: Iterable[Shape | None]) -> dict[str, int]:
    """Each time step of each sequence multiplies every 2-D weight once (``W_ih x``,
    ``W_hh h``, and ``W_hr h`` for a projected LSTM), so MACs = tokens * sum(numel of
    the 2-D weights).

    ``x`` is ``[T, B, d_in]``, ``[B, T, d_in]`` or packed ``[sum(batch_sizes), d_in]``:
    tokens is the product of all but the last dim either way.
    """
    per_token = sum(prod(w) for w in weights if w is not None and len(w) == 2)
    return {"recurrent": prod(x[:-1]) * per_token}


@formula(aten.mkldnn_rnn_layer, family=OpFamily.RECURRENT)
def mkldnn_rnn_layer(x: Shape, w_ih: Shape, w_hh: Shape, *_: Any, **__: Any) -> dict[str, int]:
    """The CPU (oneDNN) kernel: one layer, one direction per call; LSTM/GRU/RNN set by
    the weight rows."""
    # [T, B, H] = mkldnn_rnn_layer([T, B, d_in], [G*H, d_in], [G*H, H], b_ih, b_hh, hx,
    # cx, ...)
    return recurrent(x, (w_ih, w_hh))


@formula(aten._cudnn_rnn, aten.miopen_rnn, family=OpFamily.RECURRENT)
def cudnn_rnn(x: Shape, weights: Sequence[Shape], *_: Any, **__: Any) -> dict[str, int]:
    """GPU kernels: all layers and directions in one call; ``weights`` lists every
    layer's matrices."""
    # [T, B, D*H] = _cudnn_rnn([T, B, d_in], [w_ih, w_hh, (b_ih, b_hh), (w_hr)] *
    # layers * dirs, ...)
    return recurrent(x, weights)


# --------------------------------------------------------------------------------------------------
# Fourier transforms
# --------------------------------------------------------------------------------------------------
# Convention (docs/conventions.md section 2.3; closed forms: docs/formulas.md section 12). A complex FFT of
# length N is counted as the radix-2 decimation-in-time FFT (Cooley & Tukey 1965): log2 N stages of N/2
# butterflies, each one complex multiply by a twiddle factor and two complex adds, so (N/2)·log2 N complex
# multiplies (Oppenheim & Schafer, Discrete-Time Signal Processing, §9.3). One MAC is one multiply-add in
# the operands' dtype (a complex one: 4 real multiplies), and a butterfly's adds ride along as the adds of a
# dot product do: (N/2)·log2 N MACs. Any other N takes the same count with both factors rounded up,
# ⌈N/2⌉·⌈log2 N⌉: an exact integer convention, not the mixed-radix / Bluestein algorithm the library runs.
# A real-input (r2c) or real-output (c2r) transform of length N uses the half-length trick (Numerical
# Recipes §12.3, ``realft``): a complex FFT of ⌈N/2⌉ points and a split pass of ⌊N/4⌋ twiddle multiplies,
# exactly half the complex count when N is a power of two >= 4, the ratio of FFTW's benchmark convention
# (5·N·log2 N real flops for a complex transform, 2.5·N·log2 N for a real one; 10 flops per butterfly).
# Normalisation (1/N, 1/√N) is elementwise scaling, not counted.
def fft_macs(n: int) -> int:
    """Complex MACs of one complex FFT of length ``n``: ``⌈n/2⌉`` butterflies in each of
    ``⌈log2 n⌉`` stages (``(n/2)·log2 n`` for a power of two; 0 for ``n <= 1``)."""
    return (n + 1) // 2 * (n - 1).bit_length() if n > 1 else 0


def real_fft_macs(n: int) -> int:
    """MACs of one real-input (r2c) or real-output (c2r) FFT of length ``n``: a complex
    FFT of ``⌈n/2⌉`` points plus the split pass's ``⌊n/4⌋`` twiddle multiplies (half
    of :func:`fft_macs` for a power of two >= 4)."""
    return fft_macs((n + 1) // 2) + n // 4 if n > 1 else 0


def fft_along(shape: Sequence[int], dim: int, macs_per_transform: int) -> int:
    """MACs of the 1-D transforms along ``dim`` of a tensor of ``shape``: one per
    element of the other dims (the batch), ``macs_per_transform`` each."""
    return prod(s for i, s in enumerate(shape) if i != dim) * macs_per_transform


def _dims(shape: Sequence[int], dims: Sequence[int]) -> list[int]:
    return [int(d) % len(shape) for d in dims] if shape else []


@formula(aten._fft_c2c, family=OpFamily.TRANSFORM)
def fft_c2c(x: Shape, dim: Sequence[int], *_: Any, **__: Any) -> int:
    """Complex-to-complex FFT (``fft``, ``ifft``, ``fftn`` / ``fft2``, and ``fft`` of a
    real tensor cast to complex): a length-``N_d`` transform along each dim of
    ``dim`` for every element of the other dims."""
    # [*] = _fft_c2c([*], dim, normalization, forward)
    return sum(fft_along(x, d, fft_macs(x[d])) for d in _dims(x, dim))


@formula(aten._fft_r2c, family=OpFamily.TRANSFORM)
def fft_r2c(x: Shape, dim: Sequence[int], *_: Any, **__: Any) -> int:
    """Real-to-complex FFT (``rfft``, ``rfftn``, ``ihfft``, ``stft``, ``fft`` of a real
    1-D signal): a real transform along the last dim of ``dim``, then complex
    transforms along the others over the half spectrum (``N // 2 + 1`` bins), as
    pocketfft and MKL run it. A two-sided output (``onesided=False``) is the half
    spectrum mirrored (data movement, not counted)."""
    # [..., N // 2 + 1] (or [..., N] two-sided) = _fft_r2c([..., N], dim, normalization,
    # onesided)
    dims = _dims(x, dim)
    if not dims:
        return 0
    last = dims[-1]
    half = tuple(s // 2 + 1 if i == last else s for i, s in enumerate(x))
    return fft_along(x, last, real_fft_macs(x[last])) + sum(fft_along(half, d, fft_macs(half[d])) for d in dims[:-1])


@formula(aten._fft_c2r, family=OpFamily.TRANSFORM)
def fft_c2r(x: Shape, dim: Sequence[int], normalization: int, last_dim_size: int, *_: Any,
            **__: Any) -> int:
    """Complex-to-real FFT (``irfft``, ``irfftn``, ``hfft``, ``istft``): complex
    transforms along all but the last dim of ``dim`` over the half spectrum ``x``,
    then a real-output transform of length ``last_dim_size`` along the last."""
    # [..., last_dim_size] = _fft_c2r([..., last_dim_size // 2 + 1], dim, normalization,
    # last_dim_size)
    dims = _dims(x, dim)
    if not dims:
        return 0
    complex_part = sum(fft_along(x, d, fft_macs(x[d])) for d in dims[:-1])
    return complex_part + fft_along(x, dims[-1], real_fft_macs(int(last_dim_size)))


# --------------------------------------------------------------------------------------------------
# backward kernels (counted when profiling with backward=True)
@formula(aten.matmul_backward, family=OpFamily.MATMUL, operands=(1, 2))
def matmul_backward(grad: Shape, a: Shape, b: Shape, mask: Sequence[bool], **_: Any) -> int:
    """The gradients of ``torch.matmul`` where it is a kernel of its own (nested
    tensors): each gradient asked for in ``mask`` (of ``a``: grad·bᵀ, of ``b``:
    aᵀ·grad) is one product of the forward's size."""
    # (d_a, d_b) = matmul_backward(grad [*, m, n], a [*, m, k], b [*, k, n], [a needs
    # grad, b needs grad])
    return matmul(a, b) * sum(bool(wanted) for wanted in mask)


@formula(aten.convolution_backward, family=OpFamily.CONV)
def convolution_backward(grad_out: Shape, x: Shape, weight: Shape, bias_sizes: Any, stride: Any,
                         padding: Any,
                         dilation: Any, transposed: bool, output_padding: Any, groups: int,
                         output_mask: Sequence[bool],
                         **_: Any) -> int:
    """Gradient of the input and of the weight each cost one forward convolution (bias:
    adds only)."""
    forward = conv(x, weight, grad_out, bool(transposed))
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


@formula(aten.mkldnn_rnn_layer_backward, family=OpFamily.RECURRENT)
def mkldnn_rnn_layer_backward(x: Shape, w_ih: Shape, w_hh: Shape, *_: Any,
                              **__: Any) -> dict[str, int]:
    """Per step, the gradients of the input and hidden state and of both weights: twice
    the forward GEMMs."""
    return {"recurrent": 2 * recurrent(x, (w_ih, w_hh))["recurrent"]}


@formula(aten._cudnn_rnn_backward, family=OpFamily.RECURRENT)
def cudnn_rnn_backward(x: Shape, weights: Sequence[Shape], *_: Any, **__: Any) -> dict[str, int]:
    return {"recurrent": 2 * recurrent(x, weights)["recurrent"]}
