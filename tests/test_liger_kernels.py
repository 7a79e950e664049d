"""Liger's fused linear cross-entropy (``use_liger_kernel=True`` in TRL and the Hugging Face Trainer), counted at its
``autograd.Function`` (``flopscope.capture.catalog``) on a CPU, where its Triton kernels cannot run: the lm_head's
product in the forward phase at the ``lm_head`` module, which the fused loss never calls, and the two gradients its
forward computes booked to the backward phase, as gradients of that product. A training step then counts as the
same step without Liger, per phase, per module and per role.

Runs where liger-kernel is installed: the matrix's ``kernels`` cell (``tools/matrix.py kernels``, part of
``.ci/run``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import flopscope

liger = pytest.importorskip("liger_kernel", reason="liger-kernel is installed in the matrix's kernels cell")
from liger_kernel.transformers import apply_liger_kernel_to_llama  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

B, T, D, V = 2, 16, 64, 1000


@pytest.fixture
def liger_loss():
    """Liger's loss on LlamaForCausalLM (its ``forward`` replaced on the class), the class put back afterwards; yields
    the class's own ``forward``."""
    forward = modeling_llama.LlamaForCausalLM.forward
    apply_liger_kernel_to_llama(rope=False, swiglu=False, rms_norm=False, cross_entropy=False,
                                fused_linear_cross_entropy=True)
    try:
        yield forward
    finally:
        modeling_llama.LlamaForCausalLM.forward = forward


def step() -> flopscope.Profile:
    """A training step of a tiny Llama on fake tensors (in training mode: Liger's loss does not make the logits)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).train()
    batch = torch.randint(0, V, (B, T))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(model, input_ids=batch, labels=batch, mode="fake", backward=True)


def test_liger_fused_linear_cross_entropy_counts_as_the_lm_head_it_replaces(liger_loss):
    fused = step()
    # the forward call's product, the gradients it computes (booked to the backward), its backward call (a scaling)
    records = [op for op in fused._ops if op.op_name == "liger.fused_linear_cross_entropy"]
    assert [(op.phase, op.module, op.macs) for op in records] == [
        ("forward", "lm_head", B * T * D * V), ("backward", "lm_head", 2 * B * T * D * V), ("backward", "lm_head", 0)]
    modeling_llama.LlamaForCausalLM.forward = liger_loss  # (transformers' own lm_head and loss)
    plain = step()
    for phase in ("forward", "backward"):
        assert fused.total(phase=phase) == plain.total(phase=phase), phase
        assert fused.by_role(phase=phase) == plain.by_role(phase=phase), phase
    assert fused.by_module()["lm_head"] == plain.by_module()["lm_head"] == 3 * B * T * D * V



@pytest.fixture
def liger_everything():
    """Every Liger kernel transformers' Llama takes (RoPE, SwiGLU, RMSNorm and the fused loss), put back afterwards;
    yields the classes' and functions' own (the module attributes Liger replaces)."""
    saved = {name: getattr(modeling_llama, name) for name in ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")}
    forward = modeling_llama.LlamaForCausalLM.forward
    apply_liger_kernel_to_llama()
    try:
        yield forward, saved
    finally:
        modeling_llama.LlamaForCausalLM.forward = forward
        for name, value in saved.items():
            setattr(modeling_llama, name, value)


def test_a_llama_with_every_liger_kernel_counts_as_without(liger_everything):
    """Liger's norms, SwiGLU and RoPE are elementwise (no multiply on either path); on fake tensors they run as the
    torch computations they stand for, so the step counts as the plain model's, per phase and role (the FFN's gate
    and up projections found through SwiGLU, the key projection through RoPE)."""
    fused = step()
    assert {op.op_name for op in fused._ops if op.op_name.startswith("liger.")} == {"liger.fused_linear_cross_entropy"}
    # (the elementwise kernels are recorded as the torch ops they stand for)
    forward, saved = liger_everything
    modeling_llama.LlamaForCausalLM.forward = forward
    for name, value in saved.items():
        setattr(modeling_llama, name, value)
    plain = step()
    for phase in ("forward", "backward"):
        assert fused.total(phase=phase) == plain.total(phase=phase), phase
        assert fused.by_role(phase=phase) == plain.by_role(phase=phase), phase
