"""Kernels launched from Python outside the dispatcher (Triton kernels, pybind modules),
counted at the boundary their library calls them through: an ``autograd.Function``,
whose ``forward`` and ``backward`` are wrapped on the class while a profile runs (not
a module-level name, which models copy into their own attributes; transformers
resolves ``chunk_gated_delta_rule`` once, at import, through
``use_kernel_func_from_hub_with_fallback``); a Triton launch
(:mod:`flopscope.capture.launches`, for plain functions with no Function around
them); or a pybind extension's function that its library looks up on the extension
module at each call (:data:`ATTRIBUTE`: flash-attn's ``fwd_kvcache``).

Each :class:`Kernel` of :data:`CATALOG` (and of :func:`register`) is one record per
call: its formula's MACs and parts (roles), its arguments' records as inputs, its
outputs produced by it; the ATen ops it runs inside run unrecorded
(:meth:`~flopscope.capture.recorder.Recorder.suspended`), so nothing is counted twice.
On fake tensors and meta, where a Triton kernel cannot run, the kernel is not run:
:attr:`Kernel.outputs` makes its outputs (shapes, dtypes), so the count needs no GPU. A
backward's record is its own formula (:attr:`Kernel.backward`), attributed to the
forward's module.

Only kernels whose library is already imported are wrapped (flopscope imports none of
them), and only in the thread of the run: another thread's calls run the original. What
is not in the catalog stays invisible to the dispatcher; in real mode the buffer such a
kernel fills is found when an op reads it (:mod:`flopscope.capture.undispatched`).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import RunError
from ..formulas.kernels import (
    causal_conv1d,
    causal_conv1d_update,
    flash_kernel,
)
from ..formulas.registry import BNHD, CHUNKED, MacCount, OpFamily, OpSpec
from . import launches
from .kernel_outputs import (
    Named,
    causal_conv_outputs,
    cross_entropy,
    dplr_formula,
    gated_delta_formula,
    gated_delta_outputs,
    gated_rms_norm,
    gla_formula,
    kda_formula,
    kvcache_outputs,
    like,
    linear_cross_entropy_backward,
    linear_cross_entropy_gradients,
    linear_cross_entropy_outputs,
    logits_of,
    no_multiply,
    recurrent_gated_delta,
    rms,
    rms_norm,
    rope,
    selective_scan_formula,
    selective_scan_outputs,
    simple_gla_formula,
    ssd_formula,
    ssd_outputs,
    state_update_formula,
    swiglu,
    twice,
)
from .recorder import Recorder
from .records import BACKWARD
from .scoped_patch import ScopedPatch

ATTRIBUTE = "attribute:"
"""How a catalog entry names a callable that its library looks up on a module at each
call (a pybind extension's function: ``"attribute:flash_attn_2_cuda.fwd_kvcache"``);
wrapped on that module while a profile runs."""


@dataclass(frozen=True, eq=False)
class Kernel:
    """A kernel counted at an ``autograd.Function``, a Triton launch or a module's
    function: ``name`` (``"fla.chunk_gated_delta_rule"``: its records' op),
    ``function`` the Function's import path (or ``"triton:<kernel name>"``,
    :mod:`flopscope.capture.launches`; or :data:`ATTRIBUTE` + ``"<module>.<name>"``),
    ``arguments`` the names of the arguments its records take (tensors in that order;
    the formula gets them as shapes, a tensor's known values where flopscope knows
    them; a launch's or a module function's: its parameters by position), ``formula``
    / ``backward`` the MACs of a forward / backward call (an int or parts by role)
    from those shapes, ``outputs`` its forward's outputs on fake tensors (from the
    call's arguments by name), ``family`` and ``operands`` (positions among
    ``arguments``: an attention kernel's q, k, v) as a registered formula's;
    ``module`` names the parameter whose module's work the call is (Liger's loss
    computes the ``lm_head``'s product without calling it: its records get a call of
    that module), ``gradients`` the MACs of the gradients a forward call computes for
    the backward (booked to the backward phase, whatever call computes them);
    ``reference`` the torch computation the kernel stands for, which a fake run
    records in its place (Liger's SwiGLU: ``silu(a) * b``, so that the FFN pass finds
    its gate and up projections as on the torch path; its products' backward is two
    gradients of each); ``writes`` the arguments a launch or a module function writes
    in place (its outputs)."""

    name: str
    function: str
    arguments: tuple[str, ...]
    formula: Callable[..., MacCount]
    outputs: Callable[[Named], Any]
    backward: Callable[..., MacCount] | None = None
    family: OpFamily = OpFamily.OTHER
    operands: tuple[int, ...] = ()
    layout: str = BNHD
    # the parameter whose module the work is (that module not called)
    module: Callable[[Named], Any] | None = None
    # MACs of gradients its forward computes: booked to the
    gradients: Callable[[Named], MacCount] | None = None
    # backward phase, as gradients of the forward's record
    # on fake tensors, the torch computation it stands for, run and
    reference: Callable[[Named], Any] | None = None
    # recorded in its place (an elementwise kernel: the same ops, so the role passes see
    # the same dataflow)
    writes: tuple[str, ...] = ()  # a launch's or a module function's arguments it writes in place
    _specs: dict[str, OpSpec] = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        return self.name

    @property
    def __name__(self) -> str:  # (as fx prints a call's target)
        return self.name.rpartition(".")[2]

    # (an fx node's target is callable; a record is not run)
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RunError(f"{self.name} is a catalog kernel's record: it is counted, not run again")

    def record(self, recorder: Recorder, named: Named, out: Any,
               differentiated: bool = False) -> Any:
        """One record of a call given ``named`` (its arguments by name) that returned
        ``out``: in the module holding its ``module`` parameter where it has one, its
        ``writes`` written by it (``None`` outside the model's module calls)."""
        owner = self.module(named) if self.module is not None else None
        path = recorder.tracker.holder_of(owner) if isinstance(owner, torch.Tensor) else None
        written = [named[w] for w in self.writes if isinstance(named.get(w), torch.Tensor)]
        return recorder.record_kernel(self, self.spec(),
                                      tuple(named.get(name) for name in self.arguments), out,
                                      differentiated, module=path, writes=written)

    def spec(self, backward: bool = False) -> OpSpec:
        """The formula of a forward (or backward) call as a registered op's: positional
        shapes in ``arguments``' order."""
        key = "backward" if backward else "forward"
        found = self._specs.get(key)
        if found is None:
            formula = (self.backward if backward else None) or self.formula
            names = self.arguments

            def by_position(*shapes: Any, out_shape: Any = None, **_: Any) -> MacCount:
                return formula(**dict(zip(names, shapes, strict=False)))

            found = self._specs[key] = OpSpec(by_position, self.family, self.operands, self.layout)
        return found


def _split_conv1d_scan(named: Named) -> Any:
    """mamba-ssm's fused Mamba-2 layer (``mamba_split_conv1d_scan_combined``,
    transformers' training path) as the steps it fuses, each recorded where the
    unfused path records it: ``zxbcdt`` split into the gate ``z``, ``xBC`` and ``dt``
    (and an MLP's halves ``zx0`` before them, where the layer has one); the causal
    convolution of ``xBC`` (:data:`CAUSAL_CONV`) and its SiLU; the chunked scan
    (:data:`SSD`); the gated RMSNorm by groups (``norm_before_gate=False``: ``y ·
    silu(z)``, then normalised) or the gate ``y · silu(z)`` in the scan; the output
    projection in ``out_proj``'s module."""
    zxbcdt, weight, A, D = named["zxbcdt"], named["conv1d_weight"], named["A"], named["D"]
    heads = A.shape[0]
    head_width = D.shape[1] if D.dim() == 2 else named["headdim"]
    groups, width = named.get("ngroups") or 1, heads * head_width
    state = (weight.shape[0] - width) // groups // 2
    mlp = (zxbcdt.shape[-1] - 2 * width - 2 * groups * state - heads) // 2
    zx0, z, xbc, dt = torch.split(zxbcdt, [2 * mlp, width, width + 2 * groups * state, heads],
                                  dim=-1)
    conv = _recorded(CAUSAL_CONV,
                     {"x": xbc.transpose(1, 2), "weight": weight, "bias": named.get("conv1d_bias")})
    if named.get("activation") in ("silu", "swish"):
        conv = torch.nn.functional.silu(conv)
    x, b, c = torch.split(conv.transpose(1, 2), [width, groups * state, groups * state], dim=-1)
    batch, length = x.shape[:2]
    norm = named.get("rmsnorm_weight")
    gate = z.reshape(batch, length, heads, head_width) if norm is None else None
    scanned = _function(SSD).apply(
        x.reshape(batch, length, heads, head_width), dt, A, b.reshape(batch, length, groups, state),
        c.reshape(batch, length, groups, state), named["chunk_size"], D, gate, named["dt_bias"],
        named.get("initial_states"), named.get("seq_idx"), None, True,
        named.get("dt_limit", (0.0, float("inf"))),
        bool(named.get("return_final_states")), False)
    y, final = scanned if isinstance(scanned, tuple) else (scanned, None)
    y = y.reshape(batch, length, width)
    if norm is not None:
        y = gated_rms_norm(y, z, norm, named.get("rmsnorm_eps", 1e-6), width // groups,
                            named.get("norm_before_gate", True))
    if mlp:
        a, g = zx0.chunk(2, dim=-1)
        y = torch.cat((torch.nn.functional.silu(a) * g, y), dim=-1)
    projection = named.get("outproj_weight")
    if projection is not None:
        y = _in_module(projection, torch.nn.functional.linear, y, projection,
                       named.get("outproj_bias"))
    return y if final is None else (y, final)


def _mamba_inner(named: Named) -> torch.Tensor:
    """mamba-ssm's fused Mamba layer (``mamba_inner_fn``, transformers' training path)
    as the steps it fuses, each recorded where the unfused path records it: ``xz``
    halved into x and the gate z; the causal convolution of x (:data:`CAUSAL_CONV`)
    and its SiLU; ``x_proj`` (in its module) split into the time step, B and C (each
    RMS-normalised where weights are given); the time step's projection by
    ``dt_proj``'s weight (in the layer, as the unfused path multiplies by the weight
    itself); the selective scan (:data:`SELECTIVE_SCAN`); ``out_proj`` (in its
    module)."""
    xz, weight, a = named["xz"], named["conv1d_weight"], named["A"]
    x, z = xz.chunk(2, dim=1)
    conv = torch.nn.functional.silu(_recorded(CAUSAL_CONV, {"x": x, "weight": weight.squeeze(1),
                                                            "bias": named.get("conv1d_bias")}))
    rank, state = named["delta_proj_weight"].shape[1], a.shape[-1]
    projected = _in_module(named["x_proj_weight"], torch.nn.functional.linear, conv.transpose(1, 2),
                           named["x_proj_weight"])
    dt, b, c = torch.split(projected, [rank, state, state], dim=-1)
    eps = named.get("b_c_dt_rms_eps", 1e-6)
    b, c, dt = (x if w is None else rms(x, w, eps) for x, w in ((b, named.get("b_rms_weight")),
                                                                 (c, named.get("c_rms_weight")),
                                                                 (dt, named.get("dt_rms_weight"))))
    delta = named["delta_proj_weight"] @ dt.transpose(1, 2)
    given_b, given_c = named.get("B"), named.get("C")
    y = _function(SELECTIVE_SCAN).apply(
        conv, delta, a, b.transpose(1, 2) if given_b is None else given_b,
        c.transpose(1, 2) if given_c is None else given_c, named.get("D"), z,
        named.get("delta_bias"),
        bool(named.get("delta_softplus", True)), False)
    return _in_module(named["out_proj_weight"], torch.nn.functional.linear, y.transpose(1, 2),
                      named["out_proj_weight"], named.get("out_proj_bias"))


def _in_module(weight: torch.Tensor, function: Callable[..., torch.Tensor],
               *args: Any) -> torch.Tensor:
    """``function(*args)`` recorded in a call of the module holding ``weight`` (a fused
    layer computing a projection with its module's weight, never calling the module)."""
    recorder = _recorder()
    if recorder is None:
        return function(*args)
    with recorder.tracker.inside(recorder.tracker.holder_of(weight)):
        return function(*args)


def _recorded(kernel: Kernel, named: Named) -> Any:
    """``kernel``'s outputs on fake tensors, one record of it (in the module holding its
    ``module`` parameter, as a catalog entry's call): a step of a fused kernel that
    its library also calls on its own."""
    recorder = _recorder()
    if recorder is None:
        raise RunError(f"{kernel.name} is recorded only inside a profile")
    with recorder.suspended():
        out = kernel.outputs(named)
    kernel.record(recorder, named, out)
    return out


CAUSAL_CONV = Kernel("causal_conv1d.causal_conv1d_fn",
                     "causal_conv1d.causal_conv1d_interface.CausalConv1dFn",
                     ("x", "weight"), causal_conv1d, causal_conv_outputs,
                     backward=twice(causal_conv1d),
                     family=OpFamily.CONV)
"""causal-conv1d's depthwise causal convolution before 1.5.2 (a Function over a pybind
module; from 1.5.2 on it calls the ``DaoAILab`` ops, :mod:`flopscope.formulas.kernels`),
in the calling module (transformers' mixers call it with their ``conv1d``'s weight, as
their torch path calls ``F.conv1d``)."""

SSD = Kernel("mamba_ssm.mamba_chunk_scan_combined",
             "mamba_ssm.ops.triton.ssd_combined.MambaChunkScanCombinedFn",
             ("x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias", "initial_states"),
             ssd_formula,
             ssd_outputs, backward=twice(ssd_formula), family=OpFamily.ATTENTION,
             operands=(4, 3, 0),
             layout=CHUNKED)
"""mamba-ssm's chunked scan of Mamba-2 (state space duality), priced as transformers'
torch path computes it."""


SELECTIVE_SCAN = Kernel("mamba_ssm.selective_scan_fn",
                        "mamba_ssm.ops.selective_scan_interface.SelectiveScanFn",
                        ("u", "delta", "A", "B", "C"), selective_scan_formula,
                        selective_scan_outputs,
                        backward=twice(selective_scan_formula))
"""mamba-ssm's selective scan of Mamba (a CUDA extension), priced as transformers' torch
path computes it."""


def _function(kernel: Kernel) -> Any:
    """The Function class of ``kernel`` (imported already: the fused layer calling it is
    of the same library)."""
    module, _, name = kernel.function.rpartition(".")
    return getattr(importlib.import_module(module), name)


CATALOG: list[Kernel] = [
    SSD,
    # a pybind function its library looks up on its extension module at each call
    Kernel("flash_attn.fwd_kvcache", ATTRIBUTE + "flash_attn_2_cuda.fwd_kvcache",
           ("q", "kcache", "vcache", "k", "v", "seqlens_k", "rotary_cos", "rotary_sin",
            "cache_batch_idx",
            "leftpad_k", "block_table", "alibi_slopes", "out", "softmax_scale", "is_causal",
            "window_size_left",
            "window_size_right", "softcap", "is_rotary_interleaved", "num_splits"),
           lambda **named: flash_kernel(named), kvcache_outputs, family=OpFamily.ATTENTION,
           operands=(0, 1, 2),
           writes=("kcache", "vcache")),
    Kernel("causal_conv1d.causal_conv1d_update",
           ATTRIBUTE + "causal_conv1d_cuda.causal_conv1d_update",
           ("x", "conv_state", "weight", "bias", "silu_activation", "cache_seqlens"),
           lambda x, conv_state, weight, **_: causal_conv1d_update(x, conv_state, weight),
           like("x"),
           # (before 1.5.2; from 1.5.2 on, its DaoAILab op)
           family=OpFamily.CONV, writes=("conv_state",)),
    # Triton kernels launched from plain functions (flopscope.capture.launches), by the
    # @triton.jit function's name
    Kernel("mamba_ssm.selective_state_update", launches.PREFIX + "_selective_scan_update_kernel",
           ("x_ptr", "B_ptr", "C_ptr", "batch", "nheads", "dim", "dstate"), state_update_formula,
           like("x_ptr"),
           writes=("state_ptr", "out_ptr")),
    Kernel("fla.fused_recurrent_kda", launches.PREFIX + "fused_recurrent_kda_fwd_kernel",
           ("q", "k", "v", "g", "beta"),
           no_multiply, like("v"), writes=("o", "ht")),
    Kernel("mamba_ssm.mamba_split_conv1d_scan_combined",
           "mamba_ssm.ops.triton.ssd_combined.MambaSplitConv1dScanCombinedFn", (), no_multiply,
           like("zxbcdt"),
           reference=_split_conv1d_scan),
    CAUSAL_CONV,
    SELECTIVE_SCAN,
    Kernel("mamba_ssm.mamba_inner_fn", "mamba_ssm.ops.selective_scan_interface.MambaInnerFn", (),
           no_multiply,
           like("xz"), reference=_mamba_inner),
    Kernel("fla.chunk_gated_delta_rule",
           "fla.ops.gated_delta_rule.chunk.ChunkGatedDeltaRuleFunction",
           ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "chunk_size"),
           gated_delta_formula,
           gated_delta_outputs, backward=twice(gated_delta_formula), family=OpFamily.ATTENTION,
           operands=(0, 1, 2),
           layout=CHUNKED),
    Kernel("fla.chunk_kda", "fla.ops.kda.chunk.ChunkKDAFunction",
           ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "chunk_size"), kda_formula,
           gated_delta_outputs, backward=twice(kda_formula), family=OpFamily.ATTENTION,
           operands=(0, 1, 2),
           layout=CHUNKED),
    Kernel("fla.chunk_dplr_delta_rule",
           "fla.ops.generalized_delta_rule.dplr.chunk.ChunkDPLRDeltaRuleFunction",
           ("q", "k", "v", "a", "b", "gk", "initial_state", "cu_seqlens", "lower_bound", "chunk_size"), dplr_formula,
           gated_delta_outputs, backward=twice(dplr_formula), family=OpFamily.ATTENTION,
           operands=(0, 1, 2),
           layout=CHUNKED),
    Kernel("fla.chunk_gla", "fla.ops.gla.chunk.ChunkGLAFunction",
           ("q", "k", "v", "g", "initial_state", "cu_seqlens"),
           gla_formula, gated_delta_outputs, backward=twice(gla_formula), family=OpFamily.ATTENTION,
           operands=(0, 1, 2), layout=CHUNKED),
    Kernel("fla.chunk_simple_gla", "fla.ops.simple_gla.chunk.ChunkSimpleGLAFunction",
           ("q", "k", "v", "g", "initial_state", "cu_seqlens", "chunk_size"), simple_gla_formula,
           gated_delta_outputs, backward=twice(simple_gla_formula), family=OpFamily.ATTENTION,
           operands=(0, 1, 2),
           layout=CHUNKED),
    Kernel("liger.fused_linear_cross_entropy",
           "liger_kernel.ops.fused_linear_cross_entropy.LigerFusedLinearCrossEntropyFunction",
           ("_input", "weight", "reduction"), logits_of, linear_cross_entropy_outputs,
           backward=linear_cross_entropy_backward, module=lambda named: named["weight"],
           gradients=linear_cross_entropy_gradients),
    Kernel("fla.fused_recurrent_gated_delta_rule",
           "fla.ops.gated_delta_rule.fused_recurrent.FusedRecurrentFunction",
           ("q", "k", "v", "g", "beta", "initial_state"), no_multiply, like("v"),
           reference=recurrent_gated_delta),
    # Liger's elementwise kernels (Triton): no multiply; on fake tensors, the torch
    # computation each stands for
    Kernel("liger.rms_norm", "liger_kernel.ops.rms_norm.LigerRMSNormFunction", ("X", "W"),
           no_multiply,
           like("X"), reference=rms_norm),
    Kernel("liger.swiglu", "liger_kernel.ops.swiglu.LigerSiLUMulFunction", ("a", "b"), no_multiply,
           like("a"),
           reference=swiglu),
    Kernel("liger.rope", "liger_kernel.ops.rope.LigerRopeFunction", ("q", "k", "cos", "sin"),
           no_multiply,
           like("q", "k"), reference=rope),
    Kernel("liger.cross_entropy", "liger_kernel.ops.cross_entropy.LigerCrossEntropyFunction",
           ("_input", "target"),
           no_multiply, linear_cross_entropy_outputs, reference=cross_entropy),
]
"""The kernels counted at their ``autograd.Function`` (``docs/conventions.md``: the
production kernels)."""

# Function class -> its original forward, backward (while wrapped)
_wrapped: dict[Any, tuple[Any, Any]] = {}


# (module, name) -> the original callable (while wrapped)
_attributes: dict[tuple[Any, str], Any] = {}


def _wrap_loaded() -> None:
    for kernel in list(CATALOG):
        if kernel.function.startswith(ATTRIBUTE):
            _wrap_attribute(kernel)
            continue
        cls = None if kernel.function.startswith(launches.PREFIX) else _loaded(kernel.function)
        if cls is not None and cls not in _wrapped:
            _wrap(cls, kernel)
    launches.install(_launch_entry, _recorder)


def _unwrap() -> None:
    for cls, (forward, backward) in _wrapped.items():
        cls.forward, cls.backward = forward, backward
    _wrapped.clear()
    for (module, name), original in _attributes.items():
        setattr(module, name, original)
    _attributes.clear()
    launches.uninstall()


def _wrap_attribute(kernel: Kernel) -> None:
    """Wrap the module attribute ``kernel.function`` names (if its module is imported):
    a call inside the model's module calls is one record, its ``arguments`` its
    positional parameters by name; on fake tensors and meta not run
    (``kernel.outputs`` makes its outputs)."""
    module_name, _, name = kernel.function.removeprefix(ATTRIBUTE).rpartition(".")
    module = sys.modules.get(module_name)
    original = getattr(module, name, None) if module is not None else None
    if original is None or (module, name) in _attributes:
        return
    _attributes[(module, name)] = original

    def counted(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder()
        if recorder is None or not recorder.recording:
            return original(*args, **kwargs)
        named = {**dict(zip(kernel.arguments, args, strict=False)), **kwargs}
        with recorder.suspended():
            out = kernel.outputs(named) if recorder.fake else original(*args, **kwargs)
        kernel.record(recorder, named, out)
        return out

    setattr(module, name, counted)


def _launch_entry(name: str) -> Kernel | None:
    """The catalog's entry for the Triton kernel ``name`` (the last registered)."""
    function = launches.PREFIX + name
    return next((kernel for kernel in reversed(CATALOG) if kernel.function == function), None)


_PATCH = ScopedPatch(_wrap_loaded, _unwrap)


def register(kernel: Kernel) -> None:
    """Add ``kernel`` to the catalog (its Function is wrapped from the next profile on)."""
    CATALOG.append(kernel)


def counting_kernels(recorder: Recorder) -> AbstractContextManager[None]:
    """For the block, in this thread, calls of the catalog's kernels (whose libraries
    are imported) are counted by ``recorder``: one record each, their insides
    unrecorded."""
    return _PATCH.scope(recorder)


def _loaded(path: str) -> type | None:
    """The class at ``path`` if its module is imported already (flopscope imports no
    kernel library)."""
    module, _, name = path.rpartition(".")
    if module not in sys.modules:
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception:  # (a library that fails to import is one not in use)
        return None
    return found if isinstance(found, type) and issubclass(found, torch.autograd.Function) else None


def _wrap(cls: Any, kernel: Kernel) -> None:
    forward, backward = cls.__dict__.get("forward"), cls.__dict__.get("backward")
    # (a forward of a base class, or one without ctx: a
    if forward is None or "setup_context" in cls.__dict__:
        # layout this wrapper does not know; the kernel stays uncounted, and its buffers
        # flagged in real mode)
        return
    original_forward = forward.__func__ if isinstance(forward, staticmethod) else forward
    original_backward = backward.__func__ if isinstance(backward, staticmethod) else backward
    signature = inspect.signature(original_forward)
    _wrapped[cls] = (forward, backward)

    def counted_forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _recorder()
        if recorder is None or not recorder.tracker.stack:
            return original_forward(ctx, *args, **kwargs)
        bound = signature.bind(ctx, *args, **kwargs)
        bound.apply_defaults()
        named = dict(list(bound.arguments.items())[1:])
        if recorder.fake and kernel.reference is not None:
            start = len(recorder.ops)
            out = kernel.reference(named)  # (recorded op by op, as the torch path it stands for)
            ctx._flopscope_call = ((), args, True, [op for op in recorder.ops[start:] if op.macs])
            return out
        with recorder.suspended():
            out = kernel.outputs(named) if recorder.fake else original_forward(ctx, *args, **kwargs)
        differentiated = any(getattr(ctx, "needs_input_grad", ()))
        arguments = tuple(named.get(name) for name in kernel.arguments)
        ctx._flopscope_call = (arguments, args, recorder.fake, None)
        op = kernel.record(recorder, named, out, differentiated)
        gradients = kernel.gradients(named) if kernel.gradients is not None and op is not None else 0
        if gradients:
            recorder.record_kernel(kernel, _constant(gradients, kernel), arguments, None,
                                   phase=BACKWARD, forward=op)
        return out

    def counted_backward(ctx: Any, *grads: Any) -> Any:
        recorder = _recorder()
        call = getattr(ctx, "_flopscope_call", None)
        if recorder is None or call is None:
            return original_backward(ctx, *grads)
        arguments, args, fake, products = call
        with recorder.suspended():
            # (the forward did not run: a gradient of each input's shape, none for the
            # rest)
            if fake:
                result = tuple(a.new_empty(a.shape) if isinstance(a, torch.Tensor) and a.requires_grad else None
                               for a in args)
            else:
                result = original_backward(ctx, *grads)
        # (a reference's products: two gradients of each, docs/conventions.md section 7)
        if products is not None:
            for op in products:
                twice = {part: 2 * macs for part, macs in op.parts.items()} if op.parts else 2 * op.macs
                recorder.record_kernel(kernel, _constant(twice, kernel), (), None, phase=BACKWARD,
                                       forward=op)
        elif kernel.backward is not None:
            recorder.record_kernel(kernel, kernel.spec(backward=True), tuple(arguments), result)
        return result

    cls.forward = staticmethod(counted_forward)
    if original_backward is not None:
        cls.backward = staticmethod(counted_backward)


def _constant(macs: MacCount, kernel: Kernel) -> OpSpec:
    """A spec whose formula is ``macs`` (work decided by more than shapes: which
    arguments require grad)."""
    return OpSpec(lambda *_, **__: macs, kernel.family, kernel.operands, kernel.layout)


def _recorder() -> Recorder | None:
    recorders = _PATCH.values()
    return recorders[-1] if recorders else None


