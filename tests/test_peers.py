"""flopscope.peers: crosscheck against FlopCounterMode / fvcore / thop, and the plug-ins that fix them.

Every expected count is a closed form (tests/closed_forms.py, tests/zoo.py's CASES), never program output.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from flopscope.cli import main
from flopscope.errors import ConfigurationError, FormulaError, RegistryError
from flopscope.formulas.registry import REGISTRY, FormulaRegistry, OpFamily, aten_ops
from flopscope.peers import (
    TOOLS,
    Crosscheck,
    Difference,
    PeerCount,
    crosscheck,
    flop_counter_mapping,
    fvcore_analysis,
    fvcore_handles,
    thop_custom_ops,
)

from closed_forms import add, attention, ffn, rnn, rotary, times, total
from zoo import CASES, MHA, Case, D, H, N
from zoo import hf_case as _hf_case
from zoo import seeded_randn as _randn
from zoo import token_ids as _ids

pytest.importorskip("transformers")
aten = torch.ops.aten
CPU_SDPA = aten._scaled_dot_product_flash_attention_for_cpu
TORCH_COUNTS_CPU_SDPA = CPU_SDPA in flop_registry
"""Newer torch's FlopCounterMode has a formula for the CPU's fused attention; before, it misses the core."""

# ------------------------------------------------------------------------------------------------
# small Hugging Face variants of the zoo's big cases (same architectures, closed forms from the same helpers)
d, h, n, L, d_ff = 128, 4, 32, 2, 512
d_k = d // h
GPT2_SMALL = times(L, add(attention(1, n, n, d, h), ffn(1, n, d, 4 * d)))
BERT_SMALL = add(times(L, add(attention(1, n, n, d, h), ffn(1, n, d, d_ff))), {"other": d * d})  # + pooler
LLAMA_SMALL = add(times(L, add(attention(1, n, n, d, h, n_kv=2), ffn(1, n, d, 344, gated=True))), rotary(n, d // h))
IMG, PATCH, VD = 32, 8, 64
VIT_TOKENS = (IMG // PATCH) ** 2 + 1
VIT_SMALL = add({"conv": VD * (IMG // PATCH) ** 2 * 3 * PATCH * PATCH},
                times(L, add(attention(1, VIT_TOKENS, VIT_TOKENS, VD, h), ffn(1, VIT_TOKENS, VD, 2 * VD))),
                {"other": VD * VD})
BERT_CFG = dict(hidden_size=d, num_hidden_layers=L, num_attention_heads=h, intermediate_size=d_ff, vocab_size=1000,
                max_position_embeddings=64)
LLAMA_CFG = dict(hidden_size=d, intermediate_size=344, num_hidden_layers=L, num_attention_heads=h,
                 num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64, use_cache=False)
GPT2_CFG = dict(n_embd=d, n_layer=L, n_head=h, vocab_size=1000, n_positions=64, use_cache=False)

def _hf(build: Any, roles: dict[str, int], **attributes: Any) -> Case:
    return Case(build, roles, source="huggingface", **attributes)


SMALL: dict[str, Case] = {
    "4a_bert_small_sdpa": _hf(_hf_case("BertModel", "BertConfig", lambda: _ids(1, n, 1000), **BERT_CFG), BERT_SMALL),
    "4b_bert_small_eager": _hf(_hf_case("BertModel", "BertConfig", lambda: _ids(1, n, 1000), "eager", **BERT_CFG),
                                BERT_SMALL),
    "5_gpt2_small": _hf(_hf_case("GPT2Model", "GPT2Config", lambda: _ids(1, n, 1000), **GPT2_CFG), GPT2_SMALL,
                         must_run={"aten._scaled_dot_product_flash_attention_for_cpu"}),
    "6a_llama_small_sdpa": _hf(_hf_case("LlamaModel", "LlamaConfig", lambda: _ids(1, n, 1000), **LLAMA_CFG),
                                LLAMA_SMALL),
    "6b_llama_small_eager": _hf(_hf_case("LlamaModel", "LlamaConfig", lambda: _ids(1, n, 1000), "eager",
                                          **LLAMA_CFG), LLAMA_SMALL),
    "7_vit_small": _hf(_hf_case("ViTModel", "ViTConfig", lambda: _randn(1, 3, IMG, IMG), image_size=IMG,
                                 patch_size=PATCH, hidden_size=VD, num_hidden_layers=L, num_attention_heads=h,
                                 intermediate_size=2 * VD), VIT_SMALL),
}
# the zoo's Hugging Face cases at base size take seconds each: the peers run on the small versions above
ALL: dict[str, Case] = {**{k: v for k, v in CASES.items() if v.source != "huggingface"}, **SMALL}


@functools.lru_cache(maxsize=4)
def built(name: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    return ALL[name].build()


@contextlib.contextmanager
def fastpath(enabled: bool | None) -> Iterator[None]:
    previous = torch.backends.mha.get_fastpath_enabled()
    if enabled is not None:
        torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


THREE = ("FlopCounterMode", "fvcore", "thop")  # the peers tested here (tests/test_peers_counters.py: the others)


def check(name: str, **options: Any) -> Crosscheck:
    pytest.importorskip("fvcore")
    pytest.importorskip("thop")
    model, args, kwargs = built(name)
    options.setdefault("tools", THREE)
    with fastpath(ALL[name].fastpath), torch.no_grad():
        cc = crosscheck(model, *args, **options, **kwargs)
    assert cc.macs == ALL[name].total
    for peer in cc.peers.values():
        assert peer.error is None, peer.error
        assert peer.unexplained == 0, peer.lines()  # every difference is explained, to the MAC
    return cc


def only(cc: Crosscheck, tool: str, kind: str) -> Any:
    found = [diff for diff in cc[tool].differences if diff.kind == kind]
    assert len(found) == 1, cc[tool].lines()
    return found[0]


# ------------------------------------------------------------------------------------------------
# (a) crosscheck shows the known shortfalls, per role, in closed form
def test_hand_written_sdpa_attention_core_is_what_fvcore_and_flop_counter_miss() -> None:
    cc = check("3c_hand_sdpa")
    core = {"attn_scores": 1 * H * N * N * (D // H), "attn_weighted_sum": 1 * H * N * N * (D // H)}
    if TORCH_COUNTS_CPU_SDPA:
        assert cc["FlopCounterMode"].macs == total(MHA) and cc["FlopCounterMode"].differences == ()
        assert cc["FlopCounterMode"].by_op == {"aten.addmm": 4 * N * D * D, str(CPU_SDPA): total(core)}
    else:
        assert cc["FlopCounterMode"].macs == total(MHA) - 2 * 1 * H * N * N * (D // H)
        miss = only(cc, "FlopCounterMode", "missing")
        assert dict(miss.roles) == core and miss.delta == -total(core)
        assert "aten._scaled_dot_product_flash_attention_for_cpu" in miss.reason
        assert miss.line == ("FlopCounterMode: attn_scores and attn_weighted_sum missing (16,777,216 MACs) — "
                             "no formula for aten._scaled_dot_product_flash_attention_for_cpu")
        assert cc["FlopCounterMode"].by_op == {"aten.addmm": 4 * N * D * D}
    miss = only(cc, "fvcore", "missing")
    assert dict(miss.roles) == core and miss.reason == "aten::scaled_dot_product_attention unsupported"
    assert cc["fvcore"].unsupported == {"aten::scaled_dot_product_attention": 1}
    assert cc["thop"].macs == total(MHA) and cc["thop"].differences == ()


def test_mha_fast_path_is_invisible_to_flop_counter_and_fvcore() -> None:
    cc = check("1c_mha_fastpath")
    for tool, reason in (("FlopCounterMode", "no formula for aten._native_multi_head_attention"),
                         ("fvcore", "aten::_native_multi_head_attention unsupported")):
        assert cc[tool].macs == 0
        miss = only(cc, tool, "missing")
        assert dict(miss.roles) == MHA and miss.reason == reason
    # thop's MultiheadAttention rule is right on the MACs and adds softmax: (exp, add, div) per score
    extra = only(cc, "thop", "extra")
    assert extra.delta == 1 * H * N * (N + (N - 1) + N)
    assert cc["thop"].macs == total(MHA) + 1 * H * N * (3 * N - 1)


def test_encoder_layer_fast_path_fvcore_traces_another_path() -> None:
    cc = check("2a_encoder_layer_fastpath")
    layer = add(MHA, ffn(1, N, D, 2048))
    miss = only(cc, "FlopCounterMode", "missing")
    assert dict(miss.roles) == layer and "aten._transformer_encoder_layer_fwd" in miss.reason
    # fvcore's trace leaves the fused layer (its scope hooks) but keeps the fused attention, which it cannot count
    miss = only(cc, "fvcore", "missing")
    assert dict(miss.roles) == MHA and miss.reason == "aten::_native_multi_head_attention unsupported"
    assert only(cc, "fvcore", "extra").delta == 2 * 1 * N * D * 5  # two layer_norms, 5 "flops" per element


def test_gpt2_conv1d_is_missing_from_thop_and_attention_from_the_others() -> None:
    cc = check("5_gpt2_small")
    core = {"attn_scores": L * 1 * h * n * n * d_k, "attn_weighted_sum": L * 1 * h * n * n * d_k}
    for tool in ("fvcore",) if TORCH_COUNTS_CPU_SDPA else ("FlopCounterMode", "fvcore"):
        assert dict(only(cc, tool, "missing").roles) == core
    assert cc["FlopCounterMode"].macs == total(GPT2_SMALL) - (0 if TORCH_COUNTS_CPU_SDPA else 2 * L * h * n * n * d_k)
    norms = (2 * L + 1) * n * d  # elements through LayerNorm: ln_1, ln_2 per block, ln_f
    assert only(cc, "fvcore", "extra").delta == 5 * norms
    miss = only(cc, "thop", "missing")
    projections = {r: v for r, v in GPT2_SMALL.items() if r not in core}
    assert dict(miss.roles) == projections
    assert miss.reason == "no rule for Conv1D (aten.addmm)"
    assert miss.line.startswith("thop: q_proj, k_proj, v_proj, out_proj, ffn_up, ffn_down missing (")
    assert only(cc, "thop", "extra").delta == 4 * norms  # 2 per element, doubled for the affine LayerNorm
    assert cc["thop"].macs == total(core) + 4 * norms
    table = cc.to_table()
    assert "no rule for Conv1D" in table and "0.0" in table


def test_lstm_kernel_is_missing_from_flop_counter_and_fvcore() -> None:
    cc = check("9_lstm")
    recurrent = {"recurrent": rnn(B=1, n=N, gates=4, d_in=512, d_h=512)}
    assert dict(only(cc, "FlopCounterMode", "missing").roles) == recurrent
    assert "aten.mkldnn_rnn_layer" in only(cc, "FlopCounterMode", "missing").reason
    assert only(cc, "fvcore", "missing").line == (
        f"fvcore: recurrent missing ({total(recurrent):,} MACs) — aten::lstm unsupported")


def test_a_peer_that_raises_is_reported_not_raised() -> None:
    pytest.importorskip("fvcore")
    pytest.importorskip("thop")

    class ReturnsAnObject(nn.Module):  # TorchScript tracing (fvcore) accepts tensors, tuples, lists, dicts only
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 8)

        def forward(self, x: torch.Tensor, repeat: int) -> SimpleNamespace:
            for _ in range(repeat):
                x = torch.cat([self.fc(x), self.fc(x)], dim=-1)
            return SimpleNamespace(y=x)

    cc = crosscheck(ReturnsAnObject().eval(), torch.zeros(4, 16), 1, tools=THREE)
    assert cc.macs == 2 * 4 * 16 * 8
    assert cc["FlopCounterMode"].macs == cc.macs
    fv = cc["fvcore"]
    assert fv.macs is None and fv.error is not None and fv.ratio is None
    assert "failed" in cc.to_table() and fv.lines()[0].startswith("fvcore: failed")
    assert cc["thop"].macs == cc.macs
    with pytest.raises(ValueError, match="unknown tool"):
        crosscheck(ReturnsAnObject(), torch.zeros(4, 16), 1, tools=["ptflops"])
    with pytest.raises(ConfigurationError, match="unknown tool 'ptflops'; choose from FlopCounterMode, fvcore, thop, "
                                                 "deepspeed, calflops, torchprofile"):
        crosscheck(ReturnsAnObject(), torch.zeros(4, 16), 1, tools=["ptflops"])
    assert TOOLS[:3] == THREE


# ------------------------------------------------------------------------------------------------
# (b) with the plug-ins each tool counts the zoo exactly
@pytest.mark.parametrize("name", list(ALL))
def test_flop_counter_mode_with_mapping_counts_the_zoo(name: str) -> None:
    model, args, kwargs = built(name)
    counter = FlopCounterMode(display=False, custom_mapping=flop_counter_mapping())
    with fastpath(ALL[name].fastpath), torch.no_grad(), counter:
        model(*args, **kwargs)
    assert counter.get_total_flops() == 2 * ALL[name].total  # FLOPs = 2 x MACs


@pytest.mark.parametrize("name", list(ALL))
def test_fvcore_with_handles_counts_the_zoo(name: str) -> None:
    pytest.importorskip("fvcore")
    model, args, kwargs = built(name)
    assert not kwargs
    with fastpath(ALL[name].fastpath), torch.no_grad():
        analysis = fvcore_analysis(copy.deepcopy(model), args)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        assert analysis.total() == ALL[name].total  # fvcore counts MACs


@pytest.mark.parametrize("name", list(ALL))
def test_thop_with_custom_ops_counts_the_zoo(name: str) -> None:
    thop = pytest.importorskip("thop")
    model, args, _ = built(name)
    with fastpath(ALL[name].fastpath):
        macs, _ = thop.profile(copy.deepcopy(model), args, custom_ops=thop_custom_ops(), verbose=False)
    assert macs == ALL[name].total


def test_thop_gpt2_needs_the_conv1d_rule() -> None:
    thop = pytest.importorskip("thop")
    from transformers.pytorch_utils import Conv1D

    model, args, _ = built("5_gpt2_small")
    rules = thop_custom_ops(elementwise=True)
    assert Conv1D in rules
    norms = (2 * L + 1) * n * d
    macs, _ = thop.profile(copy.deepcopy(model), args, custom_ops=rules, verbose=False)
    assert macs == total(GPT2_SMALL) + 4 * norms  # elementwise=True keeps thop's LayerNorm count


def test_crosscheck_with_plugins_agrees_exactly() -> None:
    for name in ("1c_mha_fastpath", "5_gpt2_small"):
        cc = check(name, plugins=True)
        assert set(cc.peers) == {"FlopCounterMode", "fvcore", "thop"}
        for peer in cc.peers.values():
            assert peer.macs == ALL[name].total and peer.differences == (), peer.lines()
        assert "plug-ins" in cc.to_table()


def test_flop_counter_mapping_fills_exactly_the_ops_torch_lacks() -> None:
    mapping = flop_counter_mapping()
    wanted = {CPU_SDPA, aten._native_multi_head_attention, aten._transformer_encoder_layer_fwd,
              aten.mkldnn_rnn_layer, *aten_ops("_grouped_mm")} - set(flop_registry)  # (torch's own stay)
    assert wanted <= set(mapping)
    assert not set(mapping) & set(flop_registry)
    # FlopCounterMode's convention: shapes (torch.Size) in, FLOPs out. Experts [G, K, N] on [M, K] rows.
    G, M, K, Nout = 4, 64, 32, 16
    for fn in (mapping[op] for op in aten_ops("_grouped_mm") if op in mapping):  # (not in torch 2.6)
        assert fn(torch.Size([M, K]), torch.Size([G, K, Nout]), torch.Size([G]), out_shape=torch.Size([M, Nout])) \
            == 2 * M * K * Nout
    q = torch.Size([2, 8, 10, 16])
    for sdpa in (mapping[op] for op in (CPU_SDPA,) if op in mapping):
        assert sdpa(q, q, q, out_shape=(q, torch.Size([2, 8, 10]))) == 2 * 2 * (2 * 8 * 10 * 10 * 16)


def test_fvcore_handles_cover_what_it_lacks() -> None:
    pytest.importorskip("fvcore")
    handles = fvcore_handles()
    for name in ("aten::scaled_dot_product_attention", "aten::lstm", "aten::gru", "aten::_native_multi_head_attention",
                 "aten::_transformer_encoder_layer_fwd", "aten::baddbmm",
                 *(["aten::_grouped_mm"] if hasattr(aten, "_grouped_mm") else [])):  # (not in torch 2.6)
        assert name in handles
    assert "aten::addmm" not in handles  # fvcore's own GEMM handles stay


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_recurrent_cells_with_plugins(cell: type[nn.Module]) -> None:
    thop = pytest.importorskip("thop")
    pytest.importorskip("fvcore")
    gates = {nn.LSTMCell: 4, nn.GRUCell: 3, nn.RNNCell: 1}[cell]
    model, x = cell(24, 40).eval(), torch.zeros(6, 24)
    expected = rnn(B=6, n=1, gates=gates, d_in=24, d_h=40)
    assert fvcore_analysis(copy.deepcopy(model), (x,)).unsupported_ops_warnings(False).total() == expected
    assert thop.profile(copy.deepcopy(model), (x,), custom_ops=thop_custom_ops(), verbose=False)[0] == expected


# ------------------------------------------------------------------------------------------------
# (c) the user's model is left as it was
def _state(model: nn.Module) -> dict[str, Any]:
    return {
        "keys": list(model.state_dict().keys()),
        "values": {k: v.clone() for k, v in model.state_dict().items()},
        "hooks": [(p, len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
                  for p, m in model.named_modules()],
        "attrs": [(p, sorted(vars(m))) for p, m in model.named_modules()],
        "training": [(p, m.training) for p, m in model.named_modules()],
    }


@pytest.mark.parametrize("name", ["5_gpt2_small", "1c_mha_fastpath", "9_lstm"])
@pytest.mark.parametrize("train", [False, True])
def test_model_unchanged(name: str, train: bool) -> None:
    model, args, _ = ALL[name].build()
    model.train(train)
    before = _state(model)
    inputs = {"input_ids": args[0]} if ALL[name].source == "huggingface" else {}
    positional = () if inputs else args
    with fastpath(ALL[name].fastpath), torch.no_grad():
        cc = crosscheck(model, *positional, **inputs)
    after = _state(model)
    assert after["keys"] == before["keys"]
    assert all(torch.equal(before["values"][k], v) for k, v in after["values"].items())
    assert after["hooks"] == before["hooks"] and after["attrs"] == before["attrs"]
    assert after["training"] == before["training"]
    assert not any(hasattr(m, "total_ops") or hasattr(m, "total_params") or hasattr(m, "__macs__")
                   for m in model.modules())
    crashes = {("1c_mha_fastpath", "torchprofile")}  # its TorchScript handler reads the fused node's missing name
    assert all(peer.error is None for peer in cc.peers.values() if (name, peer.tool) not in crashes), cc.lines()
    assert all(peer.leaks == () for peer in cc.peers.values()), cc.lines()


def test_thop_switching_to_eval_is_a_path_difference() -> None:
    pytest.importorskip("thop")

    class AuxInTraining(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.aux = nn.Linear(16, 8), nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.aux(x) if self.training else self.fc(x)

    model = AuxInTraining().train()
    cc = crosscheck(model, torch.zeros(4, 16), tools=["FlopCounterMode", "thop"])
    assert cc.macs == 2 * 4 * 16 * 8 and cc["FlopCounterMode"].differences == ()
    path = only(cc, "thop", "path")
    assert path.delta == -4 * 16 * 8 and "eval mode" in path.reason
    assert cc["thop"].unexplained == 0 and model.training


def test_unexplained_rest_is_reported() -> None:
    peer = PeerCount("x", 110, 100, differences=(Difference("x", "extra", 4, "norms"),))
    assert peer.unexplained == 6 and peer.difference == 10 and peer.ratio == pytest.approx(1.1)
    assert peer.lines() == ["x: +4 MACs — norms", "x: +6 MACs unexplained"]
    assert PeerCount("y", 7, 7).lines() == ["y: agrees exactly"]
    assert not peer.explained and PeerCount("y", 7, 7).explained
    assert PeerCount("x", 107, 100, differences=(Difference("x", "extra", 7, "norms"),)).explained
    assert not PeerCount("z", None, 100, error="RuntimeError: boom").explained


# ------------------------------------------------------------------------------------------------
# (d) thop's differences come from evidence per module, never from amounts that happen to add up
class MatmulBlock(nn.Module):  # torch.matmul: thop's function hooks count it
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.w)


class AddmmBlock(nn.Module):  # torch.addmm, as transformers' Conv1D: thop has neither a rule nor a function hook
    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.ones(16, 8)), nn.Parameter(torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.b, x, self.w)


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = MatmulBlock(), AddmmBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.first(x) + self.second(x)


def test_thop_gap_is_placed_in_the_module_where_it_is() -> None:
    # two blocks of the same size (4·16·8 MACs each): only the module evidence can tell which one thop misses
    pytest.importorskip("thop")
    cc = crosscheck(TwoBlocks().eval(), torch.zeros(4, 16), tools=["thop"])
    block = 4 * 16 * 8
    assert cc.macs == 2 * block and cc["thop"].macs == block
    miss = only(cc, "thop", "missing")
    assert miss.delta == -block and miss.modules == ("second",)
    assert miss.reason == "no rule for AddmmBlock (aten.addmm)"
    assert miss.line == f"thop: other missing ({block:,} MACs) — no rule for AddmmBlock (aten.addmm), in second"
    assert cc["thop"].by_module == {"first": block}
    assert cc["thop"].by_type == {"(functional)": block} and cc["thop"].unexplained == 0


def test_thop_partly_counting_one_module_is_an_undercount_there() -> None:
    pytest.importorskip("thop")

    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.matmul, self.addmm = MatmulBlock(), AddmmBlock()

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # both products in the root's own code
            return torch.matmul(x, self.matmul.w) + torch.addmm(self.addmm.b, x, self.addmm.w)

    cc = crosscheck(Both().eval(), torch.zeros(4, 16), tools=["thop"])
    block = 4 * 16 * 8
    under = only(cc, "thop", "under")
    assert under.delta == -block and under.modules == ("",) and dict(under.roles) == {"other": 2 * block}
    assert under.reason == f"its function hooks count {block:,} of the {2 * block:,} MACs of Both (aten.addmm, aten.mm)"
    assert cc["thop"].unexplained == 0


def test_a_gap_without_module_evidence_stays_unexplained(monkeypatch: pytest.MonkeyPatch) -> None:
    # without thop's function rules, what its function hooks counted cannot be placed in a module: the gap in the
    # modules without a rule is left unexplained, not matched against amounts that happen to add up
    pytest.importorskip("thop")
    import flopscope.peers.thop as peer

    tables = peer._thop_tables()
    monkeypatch.setattr(peer, "_thop_tables", lambda: tables._replace(functions={}))
    cc = crosscheck(TwoBlocks().eval(), torch.zeros(4, 16), tools=["thop"])
    block = 4 * 16 * 8
    assert cc["thop"].macs == block and cc["thop"].by_type == {"(functional)": block}
    assert cc["thop"].differences == () and cc["thop"].unexplained == -block
    assert cc["thop"].lines() == [f"thop: {-block:+,} MACs unexplained"] and not cc.all_explained


def test_op_families_come_from_the_registry() -> None:
    from flopscope.peers.fvcore import _family

    for op in REGISTRY.ops(family=OpFamily.MATMUL) + REGISTRY.ops(family=OpFamily.GROUPED_MATMUL):
        assert _family(op) == "matrix products", op
    for op in REGISTRY.ops(family=OpFamily.CONV):
        assert _family(op) == "convolution", op
    # the same ops under fvcore's keys, flopscope's record names and TorchScript's composite names
    assert {_family(op) for op in ("addmm", "aten.addmm", "aten::linear", "matmul", "aten::einsum")} \
        == {"matrix products"}
    assert _family("conv") == _family("aten.convolution") == "convolution"
    assert _family("scaled_dot_product_attention") == "scaled_dot_product_attention"
    assert _family("layer_norm") == "layer_norm"


def test_plugins_need_their_formulas_in_the_registry() -> None:
    pytest.importorskip("thop")
    pytest.importorskip("fvcore")
    with pytest.raises(RegistryError, match=r"thop's recurrent rule needs a formula for aten\._cudnn_rnn"):
        thop_custom_ops(registry=FormulaRegistry())
    with pytest.raises(RegistryError, match=r"aten::scaled_dot_product_attention needs a formula for aten\."):
        fvcore_handles(registry=FormulaRegistry())


def test_fvcore_handle_refuses_a_tensor_without_its_shape() -> None:
    from flopscope.peers.fvcore import _jit_value

    graph = torch._C.parse_ir("graph(%x : Tensor):\n  %y : Tensor = aten::relu(%x)\n  return (%y)\n")
    (value,) = list(graph.inputs())
    with pytest.raises(FormulaError, match="complete shape"):
        _jit_value(value)


def test_importing_flopscope_imports_no_peer() -> None:
    peers = {"fvcore", "thop", "transformers", "deepspeed", "calflops", "torchprofile"}
    code = ("import sys, flopscope, flopscope.peers; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {peers!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------------------------
# (e) `flopscope crosscheck` exits 0 when a peer counted and every difference is explained, 1 when one is not or no
#     peer counted
def linear_norm() -> nn.Module:
    """A target for the command line: nn.Linear(16, 8), then nn.LayerNorm(8)."""
    return nn.Sequential(nn.Linear(16, 8), nn.LayerNorm(8))


class ReturnsANamespace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> SimpleNamespace:  # fvcore's tracer takes tensors, tuples, lists, dicts
        return SimpleNamespace(y=self.fc(x))


def _columns(table: str) -> dict[str, list[str]]:
    """``{tool: [MACs, ratio, first word of the explanation]}`` from ``Crosscheck.to_table()``'s rows."""
    rows = [line.split() for line in table.splitlines()[2:] if line and not line[0].isspace()]
    return {row[0]: row[1:4] for row in rows}


def test_cli_crosscheck_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fvcore")
    pytest.importorskip("thop")
    rows, elements = 4, 4 * 8  # --input 4x16: 4 rows into the Linear, 4 x 8 elements through the LayerNorm
    linear = rows * 16 * 8
    assert main(["crosscheck", f"{__name__}:linear_norm", "--input", "4x16"]) == 0
    table = capsys.readouterr().out
    columns = _columns(table)
    assert columns["flopscope"][0] == f"{linear:,}"
    assert columns["FlopCounterMode"] == [f"{linear:,}", "1.0000", "agrees"]
    assert columns["fvcore"][0] == f"{linear + 5 * elements:,}"  # + 5 per element of the affine LayerNorm
    assert columns["thop"][0] == f"{linear + 4 * elements:,}"  # + 2 per element, doubled for the affine one
    assert "unexplained" not in table

    # a peer that fails is reported with why and the way out; the others still count: exit 0
    assert main(["crosscheck", f"{__name__}:ReturnsANamespace", "--input", "4x16"]) == 0
    table = capsys.readouterr().out
    columns = _columns(table)
    assert columns["FlopCounterMode"][0] == columns["thop"][0] == f"{linear:,}"
    assert columns["fvcore"] == ["-", "-", "failed"]
    assert ("its TorchScript trace takes tensors, tuples, lists and dicts only, and the forward gave it a "
            "types.SimpleNamespace (RuntimeError); return tensors, tuples or dicts from the forward") in " ".join(
                table.split())
    # no peer counted: exit 1, said
    assert main(["crosscheck", f"{__name__}:ReturnsANamespace", "--input", "4x16", "--tools", "fvcore"]) == 1
    assert "no peer counted" in capsys.readouterr().err


def test_cli_crosscheck_exits_1_on_an_unexplained_difference(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("thop")
    import flopscope.peers.thop as peer

    target = f"{__name__}:TwoBlocks"
    assert main(["crosscheck", target, "--input", "4x16"]) == 0  # thop's gap is placed in `second`, explained
    assert "no rule for AddmmBlock" in capsys.readouterr().out
    tables = peer._thop_tables()
    monkeypatch.setattr(peer, "_thop_tables", lambda: tables._replace(functions={}))  # as above: no evidence
    assert main(["crosscheck", target, "--input", "4x16"]) == 1
    assert f"{-4 * 16 * 8:+,} MACs unexplained" in capsys.readouterr().out
