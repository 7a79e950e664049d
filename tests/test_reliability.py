"""What production users do to a profiler: deep models, wrapped modules (TorchScript, DataParallel), inputs that
need gradients, forwards that change state, and profiling the same process many times."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import flopscope
from flopscope.studies.models import TransformerBlock


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


MLP_MACS = 2 * 8 * 16 + 2 * 16 * 4  # two rows through Linear(8, 16) and Linear(16, 4)


def test_profiles_leave_torchs_global_hook_tables_as_they_were() -> None:
    from torch.nn.modules import module as nn_module

    tables = {name: getattr(nn_module, name) for name in dir(nn_module) if name.startswith("_global_")
              and isinstance(getattr(nn_module, name), dict)}
    before = {name: dict(table) for name, table in tables.items()}
    model, x = TransformerBlock(32, 4, 64), torch.randn(1, 8, 32)
    for mode in ("fake", "real"):
        for _ in range(50):
            flopscope.profile(model, x, mode=mode)
    with flopscope.profiler(model):
        model(x)
    assert {name: dict(table) for name, table in tables.items()} == before


def test_a_model_as_deep_as_a_plain_forward_can_run_is_counted_and_deeper_fails_cleanly() -> None:
    """Depth 248 is the deepest nn.Sequential nesting a plain forward runs at Python's default recursion limit
    (1,000); FlopCounterMode reaches 194. A failure at 400 is a ForwardError, and the process carries on."""
    script = textwrap.dedent("""
        import sys, warnings, torch, flopscope
        from torch import nn
        warnings.simplefilter("ignore")
        sys.setrecursionlimit(1000)

        def nested(depth):
            m = nn.Linear(4, 4)
            for _ in range(depth):
                m = nn.Sequential(m)
            return m

        for mode in ("fake", "real"):
            try:
                flopscope.profile(nested(400), torch.randn(2, 4), mode=mode)
                print("no error at 400")
            except flopscope.ForwardError as error:
                assert "RecursionError" in str(error)
            print(mode, flopscope.profile(nested(248), torch.randn(2, 4), mode=mode).total())
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["fake", str(2 * 4 * 4), "real", str(2 * 4 * 4)]


@pytest.mark.parametrize("mode", ["fake", "real", "auto"])
@pytest.mark.parametrize("compile_with", ["script", "trace"])
def test_torchscript_modules_are_counted_at_the_root(mode: str, compile_with: str) -> None:
    module = _mlp()
    compiled = torch.jit.script(module) if compile_with == "script" else torch.jit.trace(module, torch.randn(2, 8))
    prof = flopscope.profile(compiled, torch.randn(2, 8), mode=mode)
    assert prof.total() == MLP_MACS and prof.by_module()[""] == MLP_MACS  # submodule paths are not visible


@pytest.mark.parametrize("mode", ["fake", "real", "auto"])
def test_data_parallel_is_counted_through_the_wrapper(mode: str) -> None:
    model = nn.DataParallel(_mlp())
    prof = flopscope.profile(model, torch.randn(2, 8), mode=mode)
    assert prof.total() == MLP_MACS and prof.by_module()["module.0"] == 2 * 8 * 16
    assert prof.unsupported() == {}


@pytest.mark.parametrize("mode", ["fake", "real", "auto"])
def test_backward_through_an_input_that_is_not_a_leaf(mode: str) -> None:
    class Square(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.mm(x, x)

    x = torch.randn(10, 10, requires_grad=True).clone()  # requires grad, has a history outside the model
    prof = flopscope.profile(Square(), x, mode=mode, backward=True)
    # forward 10·10·10; backward: the gradient for each operand, 10·10·10 each
    assert prof.by_phase() == {"forward": 10 * 10 * 10, "backward": 2 * 10 * 10 * 10}


def test_a_generator_forward_is_an_error_not_zero() -> None:
    class Stream(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
            yield self.fc(x)

    with pytest.raises(flopscope.ForwardError, match="generator"):
        flopscope.profile(Stream(), torch.randn(2, 4))


def test_a_real_forward_that_changes_a_parameter_in_place_is_reported_by_name() -> None:
    class Doubling(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.fc.weight.mul_(2)
            return self.fc(x)

    with pytest.warns(flopscope.FlopscopeWarning, match=r"changed parameters in place \(fc.weight\)"):
        flopscope.profile(Doubling(), torch.randn(2, 4), mode="real")


@pytest.mark.parametrize("mode", ["fake", "auto"])
def test_no_fake_tensor_outlives_a_profile_in_the_users_containers(mode: str) -> None:
    class Caching(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.cache: list[torch.Tensor] = []
            self.seen: dict[str, torch.Tensor] = {}

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            self.cache.append(y)
            self.seen["last"] = y
            return y

    model = Caching()
    model.cache.append(torch.ones(1))
    assert flopscope.profile(model, torch.randn(2, 4), mode=mode).total() == 2 * 4 * 4
    assert len(model.cache) == 1 and torch.equal(model.cache[0], torch.ones(1)) and model.seen == {}
    assert not any(isinstance(t, FakeTensor) for t in [*model.cache, *model.parameters()])


@pytest.mark.parametrize("mode", ["fake", "auto"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.float64])
def test_inputs_a_real_kernel_refuses_are_refused_on_fake_tensors_too(mode: str, dtype: torch.dtype) -> None:
    with pytest.raises(flopscope.ForwardError, match=r"aten.addmm.*different dtypes") as caught:
        flopscope.profile(_mlp(), torch.ones(2, 8, dtype=dtype), mode=mode)
    assert "module '0'" in str(caught.value) and "[2, 8]" in str(caught.value)
    with pytest.raises(flopscope.ForwardError, match="same dtype"):  # what the real kernel says
        flopscope.profile(_mlp(), torch.ones(2, 8, dtype=dtype), mode="real")


def _gpt2(vocab: int, positions: int) -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=vocab, n_positions=positions, bos_token_id=0,
                        eos_token_id=0)
    return GPT2Model(config).eval()


@pytest.mark.parametrize("mode", ["fake", "auto"])
def test_token_ids_and_positions_are_checked_against_their_tables(mode: str) -> None:
    model = _gpt2(vocab=100, positions=32)
    with pytest.raises(flopscope.ForwardError, match="index 150 is out of range for an embedding table of 100 rows"):
        flopscope.profile(model, torch.full((1, 8), 150), mode=mode)
    with pytest.raises(flopscope.ForwardError, match=r"'wpe'.*index 39 is out of range for an embedding table of 32"):
        flopscope.profile(model, torch.zeros(1, 40, dtype=torch.long), mode=mode)
    prof = flopscope.profile(model, torch.zeros(1, 16, dtype=torch.long), mode=mode)
    assert prof.notes == [] and prof.by_role()["attn_scores"] == 16 * 16 * 32  # B·n_q·n_k·(h·d_k)


def test_a_lookup_whose_ids_are_not_known_on_fake_tensors_is_said_in_the_notes() -> None:
    class Hashed(nn.Module):
        """Ids computed from a float input: their values exist only in a real run."""

        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Embedding(10, 4)
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.table((x.abs() * 1000).long() % 10))

    prof = flopscope.profile(Hashed(), torch.randn(3, 5), mode="fake")
    assert prof.total() == 3 * 5 * 4 * 4
    assert any("1 embedding lookup(s) were not known" in note for note in prof.notes)


class _BranchOnData(nn.Module):
    """A projection, then a branch on a value: fake tensors cannot take it, so mode="auto" runs it for real."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.sum().item() > 0 else y


def test_a_fall_back_that_would_need_too_much_memory_is_refused_before_it_runs() -> None:
    rows = 200_000  # the projection's output alone: rows · 64 · 4 bytes = 51.2 MB
    x = torch.zeros(1, 64).expand(rows, 64)  # a real input that takes no memory of its own
    with pytest.raises(flopscope.FakeTensorError, match=r"at least 0\.05 GiB.*above the limit of 0\.01 GiB") as caught:
        flopscope.profile(_BranchOnData(), x, fallback_limit_bytes=10 * 2**20)
    assert "aten._local_scalar_dense" in str(caught.value)
    with pytest.warns(flopscope.FlopscopeWarning, match="counted in real mode"):
        small = flopscope.profile(_BranchOnData(), torch.randn(4, 64), fallback_limit_bytes=10 * 2**20)
    assert small.total() == 4 * 64 * 64


class _BranchInBackward(torch.autograd.Function):
    """Identity forward; its backward branches on a value, which fake tensors cannot give."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * 2 if x.sum().item() > 0 else grad


class _MixedDtypeBackward(torch.autograd.Function):
    """Identity forward; its backward multiplies float32 by float64, which a real kernel refuses too."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad @ torch.eye(grad.shape[-1], dtype=torch.float64)


class _ProjectThen(nn.Module):
    """A projection, then ``function`` (an autograd function of one tensor)."""

    def __init__(self, function: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(self.fc(x))


def test_a_backward_that_cannot_run_on_fake_tensors_falls_back_to_a_real_run() -> None:
    """As a forward does: mode="auto" counts it for real (PyTorch's fake cuDNN RNN backward is one such case)."""
    model, x = _ProjectThen(_BranchInBackward), torch.randn(2, 8)
    with pytest.raises(flopscope.FakeTensorError, match=r"cannot be counted on fake tensors.*needs real data"):
        flopscope.profile(model, x, mode="fake", backward=True)
    with pytest.warns(flopscope.FlopscopeWarning, match="counted in real mode"):
        prof = flopscope.profile(model, x, backward=True)
    assert prof.by_phase() == {"forward": 2 * 8 * 4, "backward": 2 * 8 * 4}  # the weight's gradient only
    assert prof.mode == "real" and all(p.grad is None for p in model.parameters())


def test_a_backward_a_real_kernel_would_refuse_is_not_run_again_for_real() -> None:
    model, x = _ProjectThen(_MixedDtypeBackward), torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)  # no fall-back (it would warn)
        with pytest.raises(flopscope.ForwardError, match=r"backward pass of .* cannot run at op aten\.mm.*dtypes"):
            flopscope.profile(model, x, backward=True)


def test_the_default_fall_back_limit_is_half_the_free_memory_of_the_host(monkeypatch) -> None:
    """A CPU model's fall-back allocates in the host's memory (a CUDA model's on its GPU: tests/test_cuda.py)."""
    from flopscope.capture.plan import default_fallback_limit
    from flopscope.hardware import memory

    monkeypatch.setattr(memory, "system_available", lambda: 6 * 2**30)
    assert default_fallback_limit(()) == default_fallback_limit({torch.device("cpu")}) == 3 * 2**30
    monkeypatch.setattr(memory, "system_available", lambda: None)  # no /proc/meminfo: no limit
    assert default_fallback_limit({torch.device("cpu")}) is None


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_parametrized_modules_are_counted(mode: str) -> None:
    """Weight norm as a parametrization (HuBERT, EnCodec): the weight is computed from its parametrization's
    own parameters, and the module cannot be pickled."""
    model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 4))
    assert flopscope.profile(model, torch.randn(2, 8), mode=mode).total() == MLP_MACS


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_modules_reached_through_patched_forwards_and_bound_methods_run_as_their_shadow() -> None:
    """accelerate's hooks replace forward with a functools.partial; some models keep bound methods: in fake mode
    those must reach the shadow's modules (attribution, and no write to the user's weights)."""
    import functools

    model = _Block()
    for module in (model.up, model.down):
        original = module.forward
        module.forward = functools.partial(lambda m, fwd, x: fwd(x), module, original)
    model.step = model.up.forward  # a bound attribute
    before = model.up.weight.detach().clone()
    real = flopscope.profile(model, torch.randn(2, 8), mode="real").by_module()
    fake = flopscope.profile(model, torch.randn(2, 8), mode="fake").by_module()
    assert fake == real == {"": 2 * 8 * 16 * 2, "up": 2 * 8 * 16, "down": 2 * 16 * 8}
    assert torch.equal(model.up.weight, before) and not isinstance(model.up.weight, FakeTensor)


def test_written_index_tensors_are_never_taken_for_known_ids() -> None:
    """A table lookup whose ids were filled in place (idx[0] = ...) may not be refused with stale values."""

    class Scatter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table, self.score = nn.Embedding(10, 4), nn.Linear(4, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = self.score(x)
            idx = torch.full((2, x.shape[0]), -1)
            idx[0] = s.argmax(-1)
            idx[1] = s.argmin(-1)
            return self.table(idx)

    for mode in ("real", "fake", "auto"):
        assert flopscope.profile(Scatter(), torch.randn(6, 4), mode=mode).total() == 6 * 4 * 10

    class Sampling(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Embedding(10, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.table(torch.randint(0, 10, (x.shape[0],)))

    model, x = Sampling(), torch.randn(3, 4)
    before = torch.get_rng_state()
    flopscope.profile(model, x, mode="fake")
    assert torch.equal(torch.get_rng_state(), before)  # a fake profile draws no random numbers for real


def test_a_model_built_under_inference_mode_is_counted() -> None:
    with torch.inference_mode():
        model = _mlp()
    for mode in ("real", "fake", "auto"):
        with torch.no_grad():  # inference tensors cannot be saved for backward, with or without flopscope
            assert flopscope.profile(model, torch.randn(2, 8), mode=mode).total() == MLP_MACS


def test_a_kv_cache_passed_in_is_left_as_it_was() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, vocab_size=100)).eval()
    ids = torch.randint(0, 100, (1, 10))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        flopscope.profile(model, ids[:, -1:], past_key_values=cache)  # default mode: fake tensors
        assert cache.get_seq_length() == 10
        assert not isinstance(model(ids[:, -1:], past_key_values=cache).logits, FakeTensor)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_hooks_and_tensor_attributes_a_forward_changes_are_put_back(mode: str) -> None:
    class Hooking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.calls = torch.zeros(())  # a plain tensor attribute, not a buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.fc.register_forward_hook(lambda *args: None)
            self.calls.add_(1)
            return self.fc(x)

    model = Hooking()
    for _ in range(3):
        flopscope.profile(model, torch.randn(2, 4), mode=mode)
    assert len(model.fc._forward_hooks) == 0
    assert float(model.calls) == (3.0 if mode == "real" else 0.0)  # a real forward's own work stays


def test_real_profiles_of_one_model_from_several_threads_leave_its_buffers_as_they_were() -> None:
    import threading

    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    before = {name: b.clone() for name, b in model.named_buffers()}
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                assert flopscope.profile(model, torch.randn(4, 8), mode="real").total() == 4 * 8 * 8
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert all(torch.equal(b, before[name]) for name, b in model.named_buffers())


_GENERATIONS = """
import gc, sys
import torch
from torch import nn
import flopscope

model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
x = torch.randn(2, 8)
gc.set_threshold(10**9)  # no young collection moves an object meanwhile
kept = [[i] for i in range(100)]  # (a pre-fork server's objects, frozen)
if sys.argv[1] == "frozen":
    gc.freeze()
prof = flopscope.profile(model, x, mode=sys.argv[2])
oldest = {id(o) for o in gc.get_objects(generation=2)}
thawed = {id(o) for o in gc.get_objects()}  # (every generation's, not the frozen)
print(sum(id(op) in oldest for op in prof._capture.ops), len(prof._capture.ops),
      sum(id(k) in thawed for k in kept), gc.isenabled())
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
@pytest.mark.parametrize("frozen", ["none", "frozen"])
def test_a_fake_count_leaves_its_records_in_the_oldest_generation_and_frozen_objects_frozen(mode, frozen) -> None:
    """A fake count's records (alive as long as the profile) go to the oldest generation at once, not through the
    young ones (each traverses them: 0.4-0.5 s of a Flux pipeline's count), unless the process froze objects, which
    stay frozen; a real count's stay young (its cycles may hold real tensors: collected by the next young
    collection). The collector is on afterwards in each case."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_GENERATIONS), frozen, mode], capture_output=True,
                         text=True, check=True).stdout.split()
    oldest, records, thawed, enabled = int(out[0]), int(out[1]), int(out[2]), out[3]
    assert records >= 3  # (two products and a GELU)
    assert thawed == (0 if frozen == "frozen" else 100)
    assert oldest == (records if mode == "fake" and frozen == "none" else 0)
    assert enabled == "True"


def test_the_role_passes_leave_the_collector_as_they_found_it() -> None:
    """The role passes pause the collector as a capture does; afterwards it is on where it was on and off where the
    user had turned it off, and the roles are the same either way."""
    import gc

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(2, 8)
    was = gc.isenabled()
    try:
        found = []
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            found.append(flopscope.profile(model, x, mode="fake").by_role())
            assert gc.isenabled() is enabled
        assert found[0] == found[1] == {"ffn_up": 2 * 8 * 16, "ffn_down": 2 * 16 * 8}
    finally:
        (gc.enable if was else gc.disable)()
