"""Work that is not a multiply-accumulate: elementwise arithmetic, and ops known to do
none.

Elementwise work is counted in *elementwise ops*, its own unit, and never folded into
MACs. The per-element conventions (documented here, used by every report):

============  ===============================================================  ======================
category      ops                                                              ops per element
============  ===============================================================  ======================
pointwise     every ATen op tagged ``pointwise`` (add, mul, gelu, exp, where,   1 per output element
              masked_fill, comparisons, ...)
softmax       ``_softmax``, ``_log_softmax``, ``_safe_softmax``                  3 per element (max-subtract, exp,
                                                                               normalise; Chinchilla App. F)
norm          ``native_layer_norm``, ``native_group_norm``, batch norms          5 per element (mean, variance,
                                                                               centre, scale, affine)
norm          ``_fused_rms_norm``                                                4 per element (square, mean,
                                                                               scale, affine)
reduction     ops tagged ``reduction`` (sum, mean, amax, ...), cumsum, topk,    1 per input element
              sort, logsumexp
dropout       ``native_dropout``                                                1 per element
scatter       ``scatter_add``, ``index_add``, ``scatter_reduce``, ``index_put``  1 per input element
recurrent     fused RNN cell ops (``_thnn_fused_lstm_cell``, ...) on precomputed 1 per input element
cell          gates
============  ===============================================================  ======================

"Input element" is the first tensor argument; "output element" the first tensor output.
The same table, with what the code adds to it: ``docs/conventions.md`` section 3.

Ops in :data:`ZERO_COST` (and every view op, and every op of a namespace in
:data:`ZERO_COST_NAMESPACES`) do no arithmetic: data movement, allocation, indexing,
embedding lookups (a gather: 0 multiplies, as PyTorch and fvcore count it), profiler
bookkeeping.

Every table here is written by functional op (``aten.relu``). An in-place variant
(``aten.relu_``) and an ``out=`` overload (``aten.relu.out``) inherit the class of their
functional op by rule (:func:`flopscope.formulas.registry.functional_overload`): its
explicit rule, its tags, its place in the zero-cost set. :data:`ACTIVATION_OPS` and
:data:`PRODUCT_OPS` hold the in-place twins by the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .registry import aten_ops, functional_overload, with_inplace

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class ElementwiseRule:
    """How many elementwise ops an op does: ``per_element`` times the numel of its input
    or output."""

    category: str
    per_element: int
    basis: str  # "input" (first tensor argument) or "output" (first tensor output)
    gradient: bool = False  # the backward kernel of an op of this category (same convention)

    def of_gradient(self) -> ElementwiseRule:
        """The same rule for the backward kernel of such an op."""
        return ElementwiseRule(self.category, self.per_element, self.basis, gradient=True)


_SOFTMAX = ElementwiseRule("softmax", 3, "input")
_NORM = ElementwiseRule("norm", 5, "input")
_RMS_NORM = ElementwiseRule("norm", 4, "input")
_REDUCTION = ElementwiseRule("reduction", 1, "input")
_POINTWISE = ElementwiseRule("pointwise", 1, "output")
_DROPOUT = ElementwiseRule("dropout", 1, "input")
_SCATTER = ElementwiseRule("scatter", 1, "input")
_CELL = ElementwiseRule("recurrent cell", 1, "input")

RULES: dict[Any, ElementwiseRule] = {
    **dict.fromkeys([aten._softmax, aten._log_softmax, aten._safe_softmax, aten.softmax], _SOFTMAX),
    **dict.fromkeys([aten.native_layer_norm, aten.native_group_norm, aten.native_batch_norm,
                     aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
                     aten.cudnn_batch_norm, aten.miopen_batch_norm], _NORM),
    **dict.fromkeys(aten_ops("_fused_rms_norm"), _RMS_NORM),
    aten._weight_norm_interface: _RMS_NORM,  # w = g · v / ||v||: square, sum, scale, multiply
    **dict.fromkeys([aten.cumsum, aten.cumprod, aten.topk, aten.sort, aten.argsort, aten.logsumexp,
                     aten.max,
                     aten.min, aten.median, aten.kthvalue, aten.mode, aten.var_mean, aten.std_mean,
                     aten.linalg_vector_norm, aten.histc, aten.bincount, aten._cdist_forward,
                     aten.avg_pool1d, aten.avg_pool2d, aten.avg_pool3d,
                     aten.max_pool2d_with_indices,
                     aten.max_pool3d_with_indices, aten.adaptive_avg_pool2d,
                     aten._adaptive_avg_pool2d,
                     aten._adaptive_avg_pool3d, aten.adaptive_max_pool2d, aten.adaptive_max_pool3d,
                     aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
                     aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_bicubic2d,
                     aten.upsample_trilinear3d, aten._upsample_nearest_exact1d,
                     aten._upsample_nearest_exact2d,
                     aten._upsample_bilinear2d_aa, aten.grid_sampler_2d, aten.mkldnn_max_pool2d,
                     aten.max_pool2d, aten.max_pool1d, aten.multinomial, aten.cummax, aten.cummin,
                     aten.isin], _REDUCTION),
    **dict.fromkeys([aten.native_dropout, aten.bernoulli], _DROPOUT),
    # losses (only their backward is recorded: the loss runs outside the model's
    # modules)
    **dict.fromkeys([aten.nll_loss_forward, aten.nll_loss2d_forward, aten.mse_loss,
                     aten.binary_cross_entropy,
                     aten.binary_cross_entropy_with_logits, aten.smooth_l1_loss, aten.huber_loss],
                    _REDUCTION),
    **dict.fromkeys([aten.nll_loss_backward, aten.nll_loss2d_backward, aten.mse_loss_backward,
                     aten.binary_cross_entropy_backward, aten.smooth_l1_loss_backward,
                     aten.huber_loss_backward], _SCATTER),
    **dict.fromkeys([aten.scatter_add, aten.index_add, aten.scatter_reduce, aten.index_put,
                     aten._index_put_impl,
                     aten.embedding_dense_backward], _SCATTER),
    **dict.fromkeys([aten._thnn_fused_lstm_cell, aten._thnn_fused_gru_cell], _CELL),
    # backward kernels of elementwise work, under the forward op's convention
    **dict.fromkeys([aten._softmax_backward_data, aten._log_softmax_backward_data],
                    _SOFTMAX.of_gradient()),
    **dict.fromkeys([aten.native_layer_norm_backward, aten.native_group_norm_backward,
                     aten.native_batch_norm_backward, aten.cudnn_batch_norm_backward],
                    _NORM.of_gradient()),
    **dict.fromkeys(aten_ops("_fused_rms_norm_backward"), _RMS_NORM.of_gradient()),
    **dict.fromkeys([aten.max_pool2d_with_indices_backward, aten.avg_pool2d_backward,
                     aten._adaptive_avg_pool2d_backward, aten.upsample_nearest2d_backward,
                     aten.upsample_bilinear2d_backward], _REDUCTION.of_gradient()),
    **dict.fromkeys([aten._thnn_fused_lstm_cell_backward_impl, aten._thnn_fused_gru_cell_backward],
                    _CELL.of_gradient()),
    # pointwise ops that lack the `pointwise` tag
    **dict.fromkeys([aten.floor_divide, aten.remainder, aten.fmod, aten.true_divide, aten.clamp_min,
                     aten.clamp_max, aten.clamp, aten.masked_fill, aten.lerp, aten.addcmul,
                     aten.addcdiv,
                     aten.hardtanh, aten.threshold, aten.prelu, aten._prelu_kernel,
                     aten.rrelu_with_noise,
                     aten.glu, aten.logit, aten.polar, aten.complex, aten.heaviside,
                     aten.mish_backward,
                     aten.hardswish_backward, aten.elu_backward, aten.leaky_relu_backward,
                     aten.softplus_backward,
                     aten.hardsigmoid_backward, aten.hardtanh_backward, aten.glu_backward,
                     aten.hardswish,
                     aten.log_sigmoid_forward, aten.log_sigmoid_backward], _POINTWISE),
    # quantization: scale, round, shift and clamp each element (the quantized kernels
    # themselves have formulas)
    **dict.fromkeys([aten.quantize_per_tensor, aten.quantize_per_tensor_dynamic,
                     aten.quantize_per_channel,
                     aten.dequantize], _POINTWISE),
}

ZERO_COST: frozenset[Any] = frozenset([
    # allocation and creation
    aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty, aten.new_empty_strided,
    aten.zeros,
    aten.zeros_like, aten.new_zeros, aten.ones, aten.ones_like, aten.new_ones, aten.full,
    aten.full_like,
    aten.new_full, aten.scalar_tensor, aten.arange, aten.linspace, aten.logspace, aten.eye,
    aten.rand,
    aten.rand_like, aten.randn, aten.randn_like, aten.randint, aten.randint_like, aten.randperm,
    aten.normal,
    aten.uniform, aten.fill, aten.zero, aten.lift_fresh, aten.lift_fresh_copy, aten.lift,
    aten.resize, aten.set,
    aten.tril_indices, aten.triu_indices,
    # copies and data movement
    aten.clone, aten._to_copy, aten.copy, aten.contiguous, aten._unsafe_view, aten.cat, aten.stack,
    aten.split, aten.split_with_sizes, aten.unsafe_split, aten.unsafe_split_with_sizes, aten.unbind,
    aten.chunk,
    aten.unsafe_chunk, aten.repeat, aten.repeat_interleave, aten.flip, aten.roll,
    aten.constant_pad_nd,
    aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d, aten.replication_pad1d,
    aten.replication_pad2d, aten.replication_pad3d, aten.tril, aten.triu,
    aten.masked_scatter, aten.masked_select, aten.index, aten.index_select, aten.gather, aten.take,
    aten.scatter, aten.index_copy, aten.index_fill,
    aten.embedding, aten._embedding_bag, aten.embedding_bag, aten.one_hot, aten.nonzero,
    aten.nonzero_static, aten.argwhere, aten.unique_consecutive, aten._unique2, aten.unique_dim,
    aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter,
    aten.im2col, aten.col2im, aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle,
    aten.native_channel_shuffle, aten.alias_copy, aten.detach_copy, aten.view_copy,
    aten.expand_copy,
    aten.permute_copy, aten.t_copy, aten.transpose_copy, aten.slice_copy, aten.select_copy,
    aten.unsqueeze_copy, aten.squeeze_copy, aten.split_copy, aten.split_with_sizes_copy,
    aten.unbind_copy,
    aten._pad_packed_sequence, aten._pack_padded_sequence, aten._reshape_alias,
    # nn.LSTM / GRU / RNN on CUDA copy their weights into one cuDNN buffer
    aten._cudnn_rnn_flatten_weight,
    aten._nested_tensor_from_mask, aten._nested_tensor_from_tensor_list, aten.to_padded_tensor,
    aten._local_scalar_dense, aten.item, aten.is_nonzero, aten.equal, aten.allclose,
    aten._assert_async, aten._assert_scalar, aten.sym_constrain_range, aten._assert_tensor_metadata,
    aten.sym_constrain_range_for_size, aten._functional_sym_constrain_range, aten.bucketize,
    aten.searchsorted, aten._make_dep_token, aten.record_stream,
    # backward of views and indexing: zeros, then a copy into place
    aten.slice_backward, aten.select_backward, aten.unfold_backward, aten.diagonal_backward,
    aten.index_select_backward, aten.embedding_backward, aten.as_strided_scatter,
    # checks
    aten._is_all_true, aten._is_any_true, aten._nested_tensor_from_mask_left_aligned,
])
"""Ops that do no arithmetic (beyond what is already counted by a formula or rule).
In-place variants of these ops and of views (``aten.fill_``, ``aten.squeeze_``) and
their ``out=`` overloads are zero-cost by rule."""

ZERO_COST_NAMESPACES: frozenset[str] = frozenset({"profiler"})
"""Namespaces whose ops do no arithmetic: ``profiler::_record_function_enter_new`` /
``_record_function_exit`` are the bookkeeping of ``torch.profiler.record_function``
blocks (``nn.DataParallel.forward`` opens one)."""

# Metadata queries dispatched while a tensor is inspected; they are not ops of the
# model.
METADATA_OPS: frozenset[Any] = frozenset([
    *(op.default for op in aten_ops("sym_is_contiguous")), aten.is_contiguous.default,
    aten.is_contiguous.memory_format, aten.is_strides_like_format.default,
    aten.is_non_overlapping_and_dense.default,
    aten.size.default, aten.sym_size.default, aten.stride.default, aten.sym_stride.default,
    aten.storage_offset.default,
    aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
    torch.ops.prim.layout.default, torch.ops.prim.device.default, aten._nested_tensor_size.default,
    aten._nested_tensor_strides.default, aten._nested_tensor_storage_offsets.default,
    aten.is_same_size.default,
])


def ops_in_category(category: str) -> frozenset[Any]:
    """The forward op packets whose explicit rule is of ``category`` (``"softmax"``: the
    ops that normalise attention scores; their backward kernels are left out, as a
    forward may differentiate inside itself)."""
    return frozenset(op for op, rule in RULES.items() if rule.category == category and not rule.gradient)


SOFTMAX_OPS = ops_in_category("softmax")
"""The ops that normalise attention scores (softmax, log-softmax, SDPA's safe softmax)."""
VALUE_COPIES = frozenset({aten._to_copy, aten.clone, aten.contiguous, aten.detach, aten.alias,
                          aten.lift_fresh,
                          aten.lift_fresh_copy})
"""Ops whose output holds their first argument's values unchanged (copies, aliases,
dtype and layout changes)."""
EMBEDDING_LOOKUPS = frozenset({aten.embedding, aten._embedding_bag, aten.embedding_bag})
"""Table lookups by index: no multiply (a row copied per index), the token tables the
logits pass and the index checks look for."""

ACTIVATION_OPS: frozenset[Any] = with_inplace({
    aten.relu, aten.gelu, aten.silu, aten.sigmoid, aten.tanh, aten.elu, aten.leaky_relu,
    aten.hardswish,
    aten.hardsigmoid, aten.mish, aten.softplus, aten.glu, aten.celu, aten.selu, aten.hardtanh,
    aten.erf,
    aten.prelu, aten._prelu_kernel, aten.log_sigmoid_forward, aten.rrelu_with_noise, aten.threshold,
    aten.sin,
    aten.expm1,  # (ELU's family written out: xIELU's torch.expm1(torch.min(x, eps)), Apertus' MLP)
})
"""Pointwise nonlinearities (counted as ``pointwise`` work), with their in-place twins
(``aten.relu_``): the FFN pass looks for one between two weight matmuls."""

PRODUCT_OPS: frozenset[Any] = with_inplace({aten.mul})
"""Elementwise products (counted as ``pointwise`` work), in-place too: a gated FFN
multiplies its two branches."""


TAGGED_REDUCTIONS = ("all", "amax", "amin", "aminmax", "any", "argmax", "argmin", "count_nonzero",
                     "linalg__powsum",
                     "mean", "nansum", "norm", "prod", "std", "sum", "var")
"""The ops that torch tags ``reduction`` (2.10 and later) and :data:`RULES` does not
list; a torch without that tag gives them the reduction rule by name."""
_REDUCTION_TAG = getattr(torch.Tag, "reduction", None)
if _REDUCTION_TAG is None:
    RULES.update(dict.fromkeys(aten_ops(*TAGGED_REDUCTIONS), _REDUCTION))


def rule_for(func: Any) -> ElementwiseRule | None:
    """The elementwise rule of an op overload: explicit rules first, then the op's ATen
    tags; an in-place or ``out=`` overload inherits those of its functional op."""
    ops = _with_functional(func)
    for op in ops:
        rule = RULES.get(op.overloadpacket)
        if rule is not None:
            return rule
    tags = {tag for op in ops for tag in op.tags}
    if torch.Tag.pointwise in tags:
        return _POINTWISE
    if _REDUCTION_TAG in tags:
        return _REDUCTION
    return None


def is_zero_cost(func: Any) -> bool:
    """True for views, the ops of :data:`ZERO_COST` and of :data:`ZERO_COST_NAMESPACES`,
    and the in-place and ``out=`` variants of all of these."""
    if func.namespace in ZERO_COST_NAMESPACES:
        return True
    return any(op.is_view or op.overloadpacket in ZERO_COST for op in _with_functional(func))


def _with_functional(func: Any) -> tuple[Any, ...]:
    """``func``, then the functional overload it inherits from, if it is an in-place or
    ``out=`` variant."""
    functional = functional_overload(func)
    return (func,) if functional is func else (func, functional)


def elementwise_ops(rule: ElementwiseRule, args: Sequence[Any], out: Any) -> int:
    """Elementwise ops of one call under ``rule`` (see the table in the module
    docstring)."""
    source = args if rule.basis == "input" else (out if isinstance(out, (tuple, list)) else (out,))
    for x in source:
        if isinstance(x, torch.Tensor):
            return rule.per_element * x.numel()
    return 0
