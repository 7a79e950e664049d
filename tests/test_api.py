"""The contract of profile() / profiler(): inputs, outputs, attribution, errors, and doing no harm."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import flopscope
from flopscope.render.text import module_tree

from closed_forms import add, attention, ffn, times
from zoo import HandAttention


class TwoLayer(nn.Module):
    def __init__(self, d: int = 8, d_ff: int = 16):
        super().__init__()
        self.up = nn.Linear(d, d_ff)
        self.down = nn.Linear(d_ff, d)

    def forward(self, x, *, scale: float = 1.0):
        return self.down(torch.relu(self.up(x))) * scale


def state_of(model: nn.Module) -> dict:
    """Everything the profile must leave as it was."""
    return {
        "values": {k: v.clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "devices": [p.device for p in model.parameters()],
        "attrs": [sorted(vars(m)) for m in model.modules()],
        "hooks": [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()],
        "global_hooks": (len(nn_module._global_forward_hooks), len(nn_module._global_forward_pre_hooks)),
    }


def assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key == "values":
            assert before[key].keys() == after[key].keys()
            for name in before[key]:
                assert torch.equal(before[key][name], after[key][name]), name
        else:
            assert before[key] == after[key], key


# --------------------------------------------------------------------------------------------------
# inputs and outputs
@pytest.mark.parametrize("mode", ["auto", "fake", "real"])
def test_keyword_arguments_and_totals(mode):
    prof = flopscope.profile(TwoLayer(), torch.randn(3, 5, 8), mode=mode, scale=2.0)
    expected = 3 * 5 * 8 * 16 + 3 * 5 * 16 * 8
    assert prof.total() == expected
    assert prof.total_flops() == 2 * expected
    assert prof.by_module() == {"": expected, "up": 3 * 5 * 8 * 16, "down": 3 * 5 * 16 * 8}
    assert prof.total("up") == 3 * 5 * 8 * 16
    assert prof.uncalled_modules() == set()
    assert prof.output.shape == (3, 5, 8)
    if mode == "real":
        assert isinstance(prof.output, torch.Tensor) and torch.isfinite(prof.output).all()


@dataclasses.dataclass
class Batch:
    tokens: torch.Tensor
    extra: dict


@dataclasses.dataclass
class Result:
    hidden: torch.Tensor
    parts: tuple


class Structured(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6, bias=False)
        self.b = nn.Linear(4, 6, bias=False)

    def forward(self, batch: Batch, mapping: dict):
        x = self.a(batch.tokens) + self.b(mapping["other"]) + self.b(batch.extra["more"][0])
        if x.shape[0] > 2:  # Python control flow is fine: the trace executes it
            x = self.a(x[..., :4])
        return Result(hidden=x, parts=(x, {"y": x}))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_dataclass_dict_tuple_inputs_and_outputs(mode):
    t = torch.randn(3, 4)
    prof = flopscope.profile(Structured(), Batch(t, {"more": [t]}), {"other": t}, mode=mode)
    assert prof.total() == 3 * 3 * 4 * 6 + 3 * 4 * 6
    assert isinstance(prof.output, Result)
    assert prof.by_module()["b"] == 2 * 3 * 4 * 6
    assert prof.module_calls() == {"": 1, "a": 2, "b": 2}


def test_a_module_called_twice_is_attributed_per_call():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8, bias=False)

        def forward(self, x):
            return self.proj(self.proj(x)[:2])

    prof = flopscope.profile(Shared(), torch.randn(5, 8))
    calls = [(r.module, r.call, r.multiplies) for r in prof.records]
    assert calls == [("proj", 1, 5 * 8 * 8), ("proj", 2, 2 * 8 * 8)]
    assert prof.by_module()["proj"] == 7 * 8 * 8


class Stacked(nn.Module):
    """Two layers in a ``ModuleList`` (never called itself) inside an ``nn.ModuleDict``; a head outside both."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.groups = nn.ModuleDict({"body": nn.ModuleList(TwoLayer(d) for _ in range(2))})
        self.head = nn.Linear(d, 3, bias=False)

    def forward(self, x):
        for layer in self.groups["body"]:
            x = layer(x)
        return self.head(x)


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_container_never_called_sums_what_its_submodules_ran(mode):
    """``layers ModuleList 0 MACs 0.0 %`` was shown under a model whose layers did all the work: a container is
    never called, so no op's call stack held it. By structure, it holds its submodules' MACs: in ``by_module``,
    ``total(module)``, ``bytes_by_module``, the text tree (with its share and dominant role) and the JSON report."""
    tokens, d = 5, 8
    layer = 2 * tokens * d * 16
    head = tokens * d * 3
    prof = flopscope.profile(Stacked(d), torch.randn(tokens, d), mode=mode)
    by_module = prof.by_module()
    assert by_module["groups"] == by_module["groups.body"] == 2 * layer
    assert by_module["groups.body.0"] == layer and by_module[""] == 2 * layer + head == prof.total()
    assert prof.total("groups.body") == prof.total("groups.body", attention="causal") == 2 * layer
    assert prof.bytes_by_module()["groups.body"] == prof.total_bytes("groups.body") > 0
    assert prof.uncalled_modules() == {"groups", "groups.body"}
    tree = module_tree(prof, depth=3)
    body = next(line for line in tree.splitlines() if line.split()[:3] == ["·", "·", "body"])
    assert f"{2 * layer:,}" in body and f"{100 * 2 * layer / (2 * layer + head):.1f}%" in body and "ffn_up" in body


def test_a_caught_submodule_error_leaves_attribution_intact():
    class Fragile(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            self.lin(x)
            raise RuntimeError("fast path unavailable")

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fast, self.slow, self.head = Fragile(), nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            try:
                y = self.fast(x)
            except RuntimeError:
                y = self.slow(x)
            return self.head(y)

    for mode in ("fake", "real"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prof = flopscope.profile(Parent(), torch.randn(3, 8), mode=mode)
        assert prof.by_module() == {"": 3 * 8 * 8 * 2 + 3 * 8 * 4, "fast": 3 * 8 * 8, "fast.lin": 3 * 8 * 8,
                                    "slow": 3 * 8 * 8, "head": 3 * 8 * 4}


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_hugging_face_defaults_with_cache_objects(mode):
    """GPT-2 with its default use_cache=True returns a cache object; the LM head is the logits GEMM."""
    transformers = pytest.importorskip("transformers")
    d, L, h, V, n = 64, 2, 4, 1000, 12
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=d, n_layer=L, n_head=h, vocab_size=V)).eval()
    ids = torch.randint(0, V, (2, n))
    prof = flopscope.profile(model, input_ids=ids, mode=mode)
    expected = times(L, add(attention(2, n, n, d, h), ffn(2, n, d, 4 * d)))
    assert prof.total() == sum(expected.values()) + 2 * n * d * V
    assert prof.total("lm_head") == 2 * n * d * V
    assert prof.output.past_key_values is not None


# --------------------------------------------------------------------------------------------------
# the graph
def test_graph_nodes_carry_module_paths_shapes_and_dataflow():
    d, n = 32, 6
    prof = flopscope.profile(HandAttention(d=d, h=4, kind="matmul"), torch.randn(1, n, d))
    nodes = [node for node in prof.graph.nodes if node.meta.get("multiplies")]
    scores = next(node for node in nodes if node.target == torch.ops.aten.bmm.default)
    assert scores.meta["module"] == ""
    assert scores.meta["multiplies"] == 4 * n * n * (d // 4)

    def ancestors(node):
        seen, todo = set(), [node]
        while todo:
            for parent in todo.pop().all_input_nodes:
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    sources = {node.meta["module"] for node in ancestors(scores) if node.meta.get("multiplies")}
    assert sources == {"q", "k"}  # the scores matmul descends from the q and k projections only
    params = {node.target for node in ancestors(scores) if node.op == "get_attr"}
    assert params == {"q.weight", "q.bias", "k.weight", "k.bias"}
    assert any(node.op == "placeholder" and node.target == "x" for node in prof.graph.nodes)


# --------------------------------------------------------------------------------------------------
# work outside total()
def test_elementwise_work_is_counted_apart():
    class Soft(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1) + 1

    prof = flopscope.profile(Soft(), torch.randn(4, 10))
    assert prof.total() == 0
    assert prof.elementwise() == {"softmax": 3 * 40, "pointwise": 40}
    assert prof.unsupported() == {}


def test_unsupported_ops_are_listed_and_warned_once():
    class Spectral(nn.Module):
        def forward(self, x):
            return torch.linalg.qr(x).Q.abs() + torch.linalg.qr(x).Q.abs()

    with pytest.warns(flopscope.FlopscopeWarning, match="aten.linalg_qr x2") as record:
        prof = flopscope.profile(Spectral(), torch.randn(4, 16))
    assert len([w for w in record if issubclass(w.category, flopscope.FlopscopeWarning)]) == 1
    assert prof.unsupported() == {"aten.linalg_qr": 2}


# --------------------------------------------------------------------------------------------------
# modes
class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        if y.abs().sum().item() > 0:  # needs real data
            y = self.proj(y)
        return y


def test_auto_mode_runs_for_real_only_when_needed_and_says_so():
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flopscope.profile(TwoLayer(), torch.randn(2, 8)).mode == "fake"
    with pytest.warns(flopscope.FlopscopeWarning, match=r"aten._local_scalar_dense in module ''.*real mode"):
        prof = flopscope.profile(DataDependent(), x)
    assert prof.mode == "real"
    assert prof.total() == 2 * 2 * 8 * 8
    assert "real mode" in prof.notes[0]


def test_fake_mode_never_executes():
    with pytest.raises(flopscope.FakeTensorError, match="mode='real'") as info:
        flopscope.profile(DataDependent(), torch.randn(2, 8), mode="fake")
    assert isinstance(info.value, RuntimeError)
    assert "aten._local_scalar_dense" in str(info.value)


def test_meta_models_count_in_fake_mode_and_explain_when_they_cannot():
    with torch.device("meta"):
        model = TwoLayer(64, 256)
    assert flopscope.profile(model, torch.empty(10, 64, device="meta")).total() == 2 * 10 * 64 * 256
    with torch.device("meta"):
        dd = DataDependent()
    with pytest.raises(flopscope.FakeTensorError, match="meta"):
        flopscope.profile(dd, torch.randn(2, 8))


# --------------------------------------------------------------------------------------------------
# profiler(): a block of forwards
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_profiler_counts_every_forward_in_the_block(mode):
    model = TwoLayer()
    before = state_of(model)
    with flopscope.profiler(model, mode=mode) as prof:
        with pytest.raises(flopscope.FlopscopeError, match="still recording"):
            prof.total()
        model(torch.randn(4, 8))
        torch.randn(100, 100) @ torch.randn(100, 100)  # outside the model: not counted
        model(torch.randn(6, 8))
    assert prof.total() == (4 + 6) * 2 * 8 * 16
    assert prof.module_calls() == {"": 2, "up": 2, "down": 2}
    assert_same_state(before, state_of(model))


def test_fake_profiler_does_not_touch_real_buffers():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    with flopscope.profiler(model, mode="fake") as prof:
        model(torch.randn(4, 8))
    assert prof.total() == 4 * 8 * 8
    assert model[1].num_batches_tracked.item() == 0
    assert torch.equal(model[1].running_mean, torch.zeros(8))


# --------------------------------------------------------------------------------------------------
# no harm
class Mutating(nn.Module):
    """Adds an attribute during forward, has a train-mode BatchNorm, a frozen layer."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        self.cache = x
        return self.frozen(self.norm(x))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_model_left_exactly_as_it_was(mode):
    model = Mutating().train()
    model.frozen.eval()
    before = state_of(model)
    first = flopscope.profile(model, torch.randn(5, 8), mode=mode)
    assert_same_state(before, state_of(model))
    second = flopscope.profile(model, torch.randn(5, 8), mode=mode)
    assert first.total() == second.total() == 5 * 8 * 8
    assert first.by_module() == second.by_module()
    assert_same_state(before, state_of(model))
    assert not hasattr(model, "cache")


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = TwoLayer()
        self.head = nn.Linear(7, 3)

    def forward(self, x):
        self.cache = x
        return self.head(self.block(x))  # 8 features into a 7-feature Linear


@pytest.mark.parametrize("mode", ["fake", "real", "auto"])
def test_a_raising_forward_is_explained_and_leaves_the_model_intact(mode):
    model = Broken()
    before = state_of(model)
    with pytest.raises(flopscope.ForwardError) as info:
        flopscope.profile(model, torch.randn(4, 8), mode=mode)
    message = str(info.value)
    assert "module 'head'" in message and "aten.addmm" in message and "[4, 8]" in message and "[7, 3]" in message
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert_same_state(before, state_of(model))


def test_bad_arguments():
    with pytest.raises(flopscope.NotAModuleError, match="got function") as info:
        flopscope.profile(lambda x: x, torch.randn(2))
    assert isinstance(info.value, TypeError)
    with pytest.raises(flopscope.InputError, match=r"TwoLayer.forward.*Tensor\[2, 8\]") as info2:
        flopscope.profile(TwoLayer(), torch.randn(2, 8), torch.randn(2, 8))
    assert isinstance(info2.value, TypeError)
    with pytest.raises(flopscope.FlopscopeError, match="mode must be one of"):
        flopscope.profile(TwoLayer(), torch.randn(2, 8), mode="symbolic")


def test_forward_kwargs_named_like_profile_options():
    class Moded(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4, bias=False)

        def forward(self, x, mode: str = "a"):
            return self.lin(x) if mode == "a" else self.lin(self.lin(x))

    prof = flopscope.profile(Moded(), torch.randn(3, 4), forward_kwargs={"mode": "b"})
    assert prof.total() == 2 * 3 * 4 * 4
