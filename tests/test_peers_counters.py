"""flopscope.crosscheck against DeepSpeed's flops profiler, calflops and torchprofile: the real packages (no
stand-ins), each on a few cases whose counts are closed forms (tests/closed_forms.py, tests/zoo.py's CASES), and
the isolation that keeps what one peer leaves behind from reaching the next.

DeepSpeed's import takes seconds: its cases share the module-scoped cross-checks below.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopscope.cli import main
from flopscope.peers import TOOLS, Crosscheck, crosscheck
from flopscope.peers.isolation import Functions, hook_count, isolated, track_copy

from closed_forms import add, attention, ffn, rnn, total
from zoo import CASES, MHA, D, H, N, fastpath

PATCHING = ("deepspeed", "calflops")
CORE = {"attn_scores": H * N * N * (D // H), "attn_weighted_sum": H * N * N * (D // H)}


def need(tool: str) -> None:
    pytest.importorskip({"deepspeed": "deepspeed.profiling.flops_profiler"}.get(tool, tool),
                        reason=f"{tool} is not installed (pip install 'torch-flopscope[crosscheck]')")


@functools.cache
def checked(name: str, tools: tuple[str, ...]) -> Crosscheck:
    """The zoo case ``name`` cross-checked against ``tools`` (once per module)."""
    model, args, kwargs = CASES[name].build()
    with fastpath(CASES[name].fastpath), torch.no_grad():
        return crosscheck(model, *args, tools=list(tools), **kwargs)


def run(name: str, tool: str) -> Crosscheck:
    need(tool)
    cc = checked(name, (tool,))
    assert cc.macs == CASES[name].total  # flopscope itself: the closed form
    peer = cc[tool]
    assert peer.unexplained == 0 and peer.leaks == (), peer.lines()
    return cc


def only(cc: Crosscheck, tool: str) -> Any:
    assert len(cc[tool].differences) == 1, cc[tool].lines()
    return cc[tool].differences[0]


def test_the_tools() -> None:
    assert TOOLS == ("FlopCounterMode", "fvcore", "thop", "deepspeed", "calflops", "torchprofile")


# ------------------------------------------------------------------------------------------------
# DeepSpeed and calflops: what their patched functions do not reach
@pytest.mark.parametrize("tool", PATCHING)
def test_the_fused_mha_fast_path_is_reached_through_no_patched_function(tool: str) -> None:
    cc = run("1c_mha_fastpath", tool)
    assert cc[tool].macs == 0 and cc[tool].error is None
    miss = only(cc, tool)
    assert (miss.kind, dict(miss.roles), miss.modules) == ("missing", MHA, ("mha",))
    assert miss.reason == ("aten._native_multi_head_attention in MultiheadAttention: not counted (reached through "
                           "torch._native_multi_head_attention, which it does not patch)")


@pytest.mark.parametrize("tool", PATCHING)
def test_their_lstm_rule_counts_flops_and_no_macs(tool: str) -> None:
    cc = run("9_lstm", tool)
    d = h = 512
    recurrent = rnn(B=1, n=N, gates=4, d_in=d, d_h=h)
    miss = only(cc, tool)
    assert (miss.kind, dict(miss.roles), cc[tool].macs) == ("missing", {"recurrent": recurrent}, 0)
    # their rule, in FLOPs: both gate GEMMs as 2·rows·cols - rows, the LSTM's gate adds and products (4h + 3h + 3h),
    # both biases (8h); per (batch, step) as it reads them off a batch-first input: here [n, 1, d], so n "batches"
    per_step = (2 * 4 * h * d - 4 * h) + (2 * 4 * h * h - 4 * h) + 4 * h + 3 * h + 3 * h + 2 * 4 * h
    assert miss.reason == f"its LSTM rule counts {N * per_step:,} FLOPs and 0 MACs"


@pytest.mark.parametrize("tool", PATCHING)
def test_their_hooks_switch_the_encoder_layer_fast_path_off(tool: str) -> None:
    cc = run("2a_encoder_layer_fastpath", tool)
    path, miss = cc[tool].differences
    assert (path.kind, path.delta) == ("path", 0)
    assert path.reason.startswith("its module hooks change what runs, with the same MACs: "
                                  "aten._transformer_encoder_layer_fwd in the caller's run, ")
    assert "aten._native_multi_head_attention" in path.reason  # their run: the unfused layer around the fused MHA
    assert (miss.kind, dict(miss.roles), miss.modules) == ("missing", MHA, ("self_attn",))
    assert cc[tool].macs == total(ffn(1, N, D, 2048))  # the feed-forward's two Linears only


def test_calflops_misses_the_at_operator_and_sdpa_deepspeed_counts_both() -> None:
    for name, reason in (("3b_hand_at", "aten.bmm in HandAttention: not counted (it does not patch "
                                        "Tensor.__matmul__, torch.bmm or Tensor.bmm)"),
                         ("3c_hand_sdpa", "aten._scaled_dot_product_flash_attention_for_cpu in HandAttention: not "
                                          "counted (reached through F.scaled_dot_product_attention, which it does "
                                          "not patch)")):
        cc = run(name, "calflops")
        miss = only(cc, "calflops")
        assert (miss.kind, dict(miss.roles), miss.reason) == ("missing", CORE, reason)
        assert cc["calflops"].macs == total(MHA) - total(CORE)
        assert cc["calflops"].by_module == {p: N * D * D for p in ("q", "k", "v", "o")}  # each Linear: n·d² MACs
        deepspeed = run(name, "deepspeed")["deepspeed"]
        assert deepspeed.macs == total(MHA) and deepspeed.differences == ()


# ------------------------------------------------------------------------------------------------
# torchprofile: per op
def test_torchprofile_counts_elementwise_products_and_norms_as_macs() -> None:
    need("torchprofile")
    cc = run("2b_encoder_layer_nofastpath", "torchprofile")
    layer = add(MHA, ffn(1, N, D, 2048))
    extras = {d.reason.split(": ")[0]: d.delta for d in cc["torchprofile"].differences}
    assert all(d.kind == "extra" for d in cc["torchprofile"].differences)
    assert extras["aten::layer_norm"] == 2 * N * D  # two LayerNorms, one "MAC" per element
    assert cc["torchprofile"].macs == total(layer) + sum(extras.values())
    assert cc["torchprofile"].by_op["aten::layer_norm"] == 2 * N * D


def test_torchprofile_has_no_handler_for_the_fused_encoder_layer_and_fails_on_the_fused_mha() -> None:
    need("torchprofile")
    cc = run("2a_encoder_layer_fastpath", "torchprofile")
    miss = only(cc, "torchprofile")
    assert (miss.kind, dict(miss.roles)) == ("missing", add(MHA, ffn(1, N, D, 2048)))
    assert miss.reason == "no handler for aten::_transformer_encoder_layer_fwd"
    assert cc["torchprofile"].unsupported == {"aten::_transformer_encoder_layer_fwd": 1}
    failed = checked("1c_mha_fastpath", ("torchprofile",))["torchprofile"]
    assert failed.macs is None and failed.error is not None and not failed.explained
    exact = run("9_lstm", "torchprofile")["torchprofile"]  # the only peer exact on the CPU LSTM
    assert exact.macs == rnn(B=1, n=N, gates=4, d_in=512, d_h=512) and exact.differences == ()


# ------------------------------------------------------------------------------------------------
# a Hugging Face model: GPT-2, keyword inputs, all three
def test_gpt2_with_keyword_inputs() -> None:
    transformers = pytest.importorskip("transformers")
    for tool in (*PATCHING, "torchprofile"):
        need(tool)
    L, d, h, n = 2, 64, 4, 16
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_embd=d, n_layer=L, n_head=h, vocab_size=100,
                                                           n_positions=32, use_cache=False)).eval()
    closed = total(add(*[add(attention(1, n, n, d, h), ffn(1, n, d, 4 * d)) for _ in range(L)]))
    core = {"attn_scores": L * h * n * n * (d // h), "attn_weighted_sum": L * h * n * n * (d // h)}
    with torch.no_grad():
        cc = crosscheck(model, tools=[*PATCHING, "torchprofile"], input_ids=torch.zeros(1, n, dtype=torch.long))
    assert cc.macs == closed
    assert cc["deepspeed"].macs == closed and cc["deepspeed"].differences == ()  # addmm and SDPA both patched
    miss = only(cc, "calflops")
    assert (dict(miss.roles), miss.modules) == (core, ("h.0.attn", "h.1.attn"))
    assert cc["calflops"].macs == closed - total(core)
    # torchprofile: + one "MAC" per element of gelu_new's four products ([n, 4d] each) and of the 2L + 1 LayerNorms
    extras = {diff.reason.split(": ")[0]: diff.delta for diff in cc["torchprofile"].differences}
    assert extras == {"aten::mul": L * 4 * n * 4 * d, "aten::layer_norm": (2 * L + 1) * n * d}
    assert cc["torchprofile"].macs == closed + sum(extras.values())
    assert all(peer.explained and peer.leaks == () for peer in cc.peers.values()), cc.lines()


def test_cli_crosscheck_with_deepspeed_and_calflops(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    for tool in PATCHING:
        need(tool)
    L, d, h, n = 2, 64, 4, 16
    assert main(["crosscheck", "hf:gpt2", "--set", f"n_layer={L}", "--set", f"n_embd={d}", "--set", f"n_head={h}",
                 "--set", "vocab_size=100", "--input", f"1x{n}", "--tools", "deepspeed,calflops"]) == 0
    rows = {line.split()[0]: line.split()[1:3] for line in capsys.readouterr().out.splitlines()[2:]
            if line and not line[0].isspace()}
    closed = total(add(*[add(attention(1, n, n, d, h), ffn(1, n, d, 4 * d)) for _ in range(L)]))
    calflops = closed - 2 * L * h * n * n * (d // h)
    assert rows == {"flopscope": [f"{closed:,}", "1.0000"], "deepspeed": [f"{closed:,}", "1.0000"],
                    "calflops": [f"{calflops:,}", f"{calflops / closed:.4f}"]}


# ------------------------------------------------------------------------------------------------
# isolation: what a peer leaves behind is undone before the next one runs
class RefusesHooks(nn.Module):
    """Raises once its linear layer has run, when a counter hooked it (flopscope's own tracking adds no hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self._forward_pre_hooks or self.fc._forward_pre_hooks:
            raise RuntimeError("this model refuses hooks")
        return y


@pytest.mark.parametrize("tool", PATCHING)
def test_a_forward_that_raises_leaves_nothing_patched_for_the_next(tool: str) -> None:
    need(tool)
    originals = (F.linear, torch.matmul, torch.Tensor.matmul, torch.addmm)
    model = RefusesHooks().eval()
    before = hook_count(model)
    with torch.no_grad():
        cc = crosscheck(model, torch.zeros(4, 16), tools=[tool])
    peer = cc[tool]
    assert peer.macs is None and "this model refuses hooks" in (peer.error or "")
    patched = peer.leaks[0]  # the tool ends its profile only after a forward that returns
    assert patched.startswith("left ") and patched.endswith(" patched (restored)")
    assert {"F.linear", "torch.matmul", "Tensor.matmul", "torch.addmm"} <= set(patched[5:-19].split(", "))
    # per module of the copy (the model and its Linear): calflops a pre- and a post-hook, DeepSpeed those and a
    # timing pre- and post-hook
    hooks = 2 * {"calflops": 2, "deepspeed": 4}[tool]
    assert peer.leaks[1:] == (f"left {hooks} hooks on its copy of the model (discarded)",)
    assert (F.linear, torch.matmul, torch.Tensor.matmul, torch.addmm) == originals
    assert hook_count(model) == before
    # the next run counts once, not through a wrapper of a wrapper
    with torch.no_grad():
        again = crosscheck(nn.Linear(16, 8), torch.zeros(4, 16), tools=[tool])
    assert again[tool].macs == 4 * 16 * 8 and again[tool].leaks == ()


def test_isolation_restores_patches_and_removes_hooks() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    original, global_hooks = F.linear, dict(torch.nn.modules.module._global_forward_hooks)
    with isolated(model) as isolation:
        twin = nn.Sequential(nn.Linear(4, 4))
        track_copy(twin, model)  # the peer's copy, made before it runs
        F.linear = lambda *a, **k: original(*a, **k)  # a counter's wrapper, never put back
        model[0].register_forward_hook(lambda *a: None)
        twin.register_forward_pre_hook(lambda *a: None)
        torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
        assert Functions.snapshot().patched() == []  # a snapshot taken now sees the wrapper as the original
    assert F.linear is original and hook_count(model) == 0
    assert torch.nn.modules.module._global_forward_hooks == global_hooks
    assert isolation.leaks == ["left F.linear patched (restored)", "left 1 global module hook (removed)",
                               "added 1 hook to the model itself (removed)",
                               "left 1 hook on its copy of the model (discarded)"]
