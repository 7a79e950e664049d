"""Fake tensors never outlive a profile, a real run never counts around one, and the caller's own fake tensors
count as FlopCounterMode counts them (issue 22, items 1-3)."""

from __future__ import annotations

import collections
import functools
import types
import warnings
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import flopscope
from flopscope.capture.fake import tensors_in
from flopscope.capture.model_caches import fake_tensors_held
from flopscope.errors import FakeTensorError, ForwardError

from closed_forms import add, attention, ffn, rotary, times

N, D = 8, 16  # tokens, width of the cached-embedding models


# --- models whose code keeps tensors between forwards, each in a place of its own ---------------------------
@functools.lru_cache(maxsize=4)
def sine_table(n: int, d: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A position table cached on (shape, device, dtype), as transformers' SAM 3 does."""
    position = torch.arange(n, device=device, dtype=dtype)[:, None]
    return torch.sin(position / 10_000 ** (torch.arange(d, device=device, dtype=dtype) / d))


def cached_in_a_closure(maxsize: int) -> Any:
    """transformers' ``compile_compatible_method_lru_cache``: the lru_cache hides in the wrapper's closure."""

    def decorator(func: Any) -> Any:
        cached = functools.lru_cache(maxsize=maxsize)(func)

        @functools.wraps(func)
        def wrapper(*args: Any) -> Any:
            return cached(*args)

        return wrapper

    return decorator


_TABLES: dict[tuple[Any, ...], torch.Tensor] = {}


class Settings:
    """A plain object the model's modules hold (as a config): a fake run's shadow shares it."""

    def __init__(self) -> None:
        self.scale = 1.0
        self.tables: dict[tuple[Any, ...], torch.Tensor] = {}
        self.holder = types.SimpleNamespace(tables={})  # (a plain object inside it, holding a table)


class CachedPositions(nn.Module):
    """Two linear layers around a cached position table; ``where`` says where the table is kept, ``needs_data``
    adds a branch on a value (fake tensors cannot run it, so ``mode="auto"`` runs the model for real)."""

    def __init__(self, where: str, needs_data: bool = False) -> None:
        super().__init__()
        self.where, self.needs_data = where, needs_data
        self.settings = Settings()
        self.up, self.down = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)

    @staticmethod
    @cached_in_a_closure(maxsize=2)
    def closure_table(n: int, d: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return sine_table.__wrapped__(n, d, device, dtype)

    def table(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.shape[1], x.shape[2], x.device, x.dtype)
        if self.where == "lru_cache":
            return sine_table(*key)
        if self.where == "closure":
            return self.closure_table(*key)
        if self.where == "dict":
            if key not in _TABLES:
                _TABLES[key] = sine_table.__wrapped__(*key)
            return _TABLES[key]
        if self.where in ("config-dict", "holder-dict"):  # a dict a shared object holds, or an object inside it
            tables = self.settings.tables if self.where == "config-dict" else self.settings.holder.tables
            if key not in tables:
                tables[key] = sine_table.__wrapped__(*key)
            return tables[key]
        cached = getattr(self.settings, "table", None)  # "config": an attribute set on a shared object
        if cached is None:
            cached = self.settings.table = sine_table.__wrapped__(*key)
        return cached

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x + self.table(x))
        if self.needs_data and bool((h > 1e9).any()):  # never true; reading it needs real data
            h = h * 0
        return self.down(h)


EXPECTED = 2 * N * D * D  # two D x D projections of N tokens, batch 1 (the table is elementwise work)
WHERE = ["lru_cache", "closure", "dict", "config", "config-dict", "holder-dict"]
ORDERS = [("auto", "fake", "real"), ("real", "fake", "auto")]


def _clear_caches() -> None:
    sine_table.cache_clear()
    _TABLES.clear()


def _is_real(output: Any) -> bool:
    return not any(isinstance(t, FakeTensor) for t in tensors_in(output))


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
@pytest.mark.parametrize("needs_data", [False, True], ids=["fake-ok", "needs-data"])
@pytest.mark.parametrize("where", WHERE)
def test_a_cache_in_the_models_code_holds_no_fake_tensor_after_a_profile(where: str, needs_data: bool,
                                                                         order: tuple[str, ...]) -> None:
    """At 3bbe37a the fake run cached fake tables; the real runs after it counted around them (the recorder skipped
    ops on fake tensors) and the user's own forward returned fake tensors."""
    _clear_caches()
    torch.manual_seed(0)
    model = CachedPositions(where, needs_data)
    x = torch.randn(1, N, D)
    for mode in order:
        if mode == "fake" and needs_data:
            with pytest.raises(FakeTensorError, match="needs real data"):
                flopscope.profile(model, x, mode=mode)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # auto's note that it fell back
                prof = flopscope.profile(model, x, mode=mode)
            assert prof.total() == EXPECTED, mode
            assert prof.mode == ("real" if mode == "real" or (mode == "auto" and needs_data) else "fake")
            if prof.mode == "real":
                assert _is_real(prof.output)
        assert fake_tensors_held(model) == []  # (a bounded lru_cache cannot show its entries: the forward below)
    output = model(x)
    assert _is_real(output)
    assert not isinstance(getattr(model.settings, "table", None), FakeTensor)
    torch.testing.assert_close(output, model.down(model.up(x + sine_table.__wrapped__(N, D, x.device, x.dtype))))


def test_caches_of_real_runs_are_kept() -> None:
    """Only what a fake run left is removed: a real run's cache entries and a real table on the config stay."""
    _clear_caches()
    model = CachedPositions("config")
    x = torch.randn(1, N, D)
    model(x)
    table = model.settings.table
    sine_table(N, D, x.device, x.dtype)
    flopscope.profile(model, x, mode="fake")
    assert model.settings.table is table
    flopscope.profile(model, x, mode="real")
    assert model.settings.table is table


class HiddenCache(nn.Module):
    """Keeps its table where no guard looks (a dict reached only through a tensor attribute's attribute)."""

    store: ClassVar[dict[str, torch.Tensor]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        holder = HiddenCache.__dict__["store"]  # (found by the guard: a dict class attribute)
        if "t" not in holder:
            holder["t"] = torch.ones_like(x)
        return self.proj(x * holder["t"])


def test_a_real_run_that_meets_a_fake_tensor_stops_and_says_where_it_is() -> None:
    """Whatever left it there, a real run never counts around a fake tensor (3bbe37a skipped such ops silently)."""
    model = HiddenCache()
    x = torch.randn(1, N, D)
    with FakeTensorMode():
        HiddenCache.store["t"] = torch.ones(1, N, D)  # as if a fake run the guard does not know had cached it
    try:
        with pytest.raises(ForwardError) as raised:
            flopscope.profile(model, x, mode="real")
        message = str(raised.value)
        assert "aten.mul" in message and "module ''" in message and "[1, 8, 16]" in message
        assert "got a fake tensor" in message and "FakeTensorMode of the caller's" in message
        assert flopscope.profile(model, x, mode="auto").total() == N * D * D  # on fake tensors: it can run
        assert isinstance(HiddenCache.store["t"], FakeTensor)  # the guard removes only what a fake run put there
    finally:
        HiddenCache.store.clear()


def test_the_error_names_the_cache_a_fake_run_of_flopscope_filled() -> None:
    _clear_caches()
    model = CachedPositions("lru_cache")
    x = torch.randn(1, N, D)
    from flopscope.capture import fake_converter

    convert = fake_converter()
    with convert.mode:  # a fake table in the cache, made by flopscope's own fake mode, under the real key
        sine_table(N, D, torch.device("cpu"), torch.float32)
    try:
        with pytest.raises(ForwardError) as raised:
            flopscope.profile(model, x, mode="real")
        assert "earlier fake run of flopscope" in str(raised.value)
        assert "sine_table" in str(raised.value)
    finally:
        _clear_caches()


# --- SAM 3: the model where it was found -------------------------------------------------------------------
def _sam3() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Sam3Model"):
        pytest.skip("this transformers has no SAM 3")
    small = dict(num_attention_heads=4, intermediate_size=128)
    config = transformers.Sam3Config(
        vision_config=dict(backbone_config=dict(model_type="sam3_vit_model", hidden_size=64, num_hidden_layers=2,
                                                image_size=64, patch_size=16, window_size=4, global_attn_indexes=[1],
                                                **small), fpn_hidden_size=64),
        text_config=dict(vocab_size=1024, hidden_size=64, projection_dim=64, num_hidden_layers=2, bos_token_id=1023,
                         eos_token_id=1022, **small),
        geometry_encoder_config=dict(hidden_size=64, num_layers=2, **small),
        detr_encoder_config=dict(hidden_size=64, num_layers=2, **small),
        detr_decoder_config=dict(hidden_size=64, num_layers=2, num_queries=16, **small),
        mask_decoder_config=dict(hidden_size=64, num_attention_heads=4))
    torch.manual_seed(0)
    model = transformers.Sam3Model(config).eval()
    inputs = {"input_ids": torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0)),
              "pixel_values": torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))}
    return model, inputs


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_sam3_counts_the_same_in_every_mode_and_order(order: tuple[str, ...]) -> None:
    """SAM 3 caches its sine position embedding in an lru_cache (keyed on shape, device, dtype). At 3bbe37a auto
    counted 18,278,528 of 35,662,208 MACs and the user's forward returned fake tensors afterwards: its DETR decoder
    read a value (``arange(0, height)`` of a tensor), the fake run failed there after filling the cache, and the
    real fall-back met the cached fake tables. Now that value is known on fake tensors (it is computed from
    constants), so every mode runs and the cache is filled by fake and real runs alike."""
    model, inputs = _sam3()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # the reference counts the math path's bmm's
        with FlopCounterMode(display=False) as reference:
            before = model(**inputs)
        for cache in _sam3_caches(model):
            cache.cache_clear()  # a fresh process's state: nothing cached yet
        for mode in order:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prof = flopscope.profile(model, **inputs, mode=mode)
            assert prof.mode == ("real" if mode == "real" else "fake")  # its decoder's value reads are known values
            assert prof.total() == reference.get_total_flops() // 2, mode
            if mode == "real":
                assert _is_real(prof.output)
        after = model(**inputs)
    assert _is_real(after)
    torch.testing.assert_close(after.pred_masks, before.pred_masks)


def _sam3_caches(model: nn.Module) -> list[Any]:
    from flopscope.capture.model_caches import CacheGuard

    guard = CacheGuard(model)
    return [cache for cache, _, _ in guard._caches.values()]


# --- the caller's own fake tensors ---------------------------------------------------------------------------
LLAMA = dict(d=64, d_ff=128, L=2, h=4, kv=2, vocab=1000, n=16)


def _llama_under(mode: Any) -> tuple[nn.Module, torch.Tensor]:
    """A small Llama and token ids made under ``mode`` (a FakeTensorMode, or a device)."""
    transformers = pytest.importorskip("transformers")
    c = LLAMA
    config = transformers.LlamaConfig(hidden_size=c["d"], intermediate_size=c["d_ff"], num_hidden_layers=c["L"],
                                      num_attention_heads=c["h"], num_key_value_heads=c["kv"], vocab_size=c["vocab"])
    with mode:
        model = transformers.LlamaForCausalLM(config).eval()
        ids = torch.randint(0, c["vocab"], (1, c["n"]))
    return model, ids


def _llama_expected() -> int:
    c = LLAMA
    layer = add(attention(1, c["n"], c["n"], c["d"], c["h"], n_kv=c["kv"]), ffn(1, c["n"], c["d"], c["d_ff"],
                                                                               gated=True))
    angles = sum(rotary(c["n"], c["d"] // c["h"]).values())  # (transformers before 5.19)
    return sum(times(c["L"], layer).values()) + c["n"] * c["d"] * c["vocab"] + angles  # + the logits


@pytest.mark.parametrize("entered", [True, False], ids=["inside-the-mode", "outside-the-mode"])
@pytest.mark.parametrize("mode", ["auto", "fake"])
def test_a_model_built_under_the_callers_fake_mode_counts_exactly(mode: str, entered: bool) -> None:
    """At 3bbe37a: 0 MACs with a warning inside the mode, a ForwardError outside it."""
    fake_mode = FakeTensorMode()
    model, ids = _llama_under(fake_mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fall-back, no note of one
        if entered:
            with fake_mode:
                prof = flopscope.profile(model, ids, mode=mode)
        else:
            prof = flopscope.profile(model, ids, mode=mode)
    assert prof.mode == "fake"
    assert prof.total() == _llama_expected()
    assert prof.by_role()["q_proj"] == LLAMA["L"] * LLAMA["n"] * LLAMA["d"] ** 2
    assert all(isinstance(p, FakeTensor) and p.fake_mode is fake_mode for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())


def test_the_callers_fake_model_counts_its_backward_and_refuses_a_real_run() -> None:
    fake_mode = FakeTensorMode()
    model, ids = _llama_under(fake_mode)
    forward = flopscope.profile(model, ids).total()
    both = flopscope.profile(model, ids, backward=True)
    assert forward == _llama_expected()
    assert both.total(phase="forward") == forward
    real_model, real_ids = _llama_under(torch.device("cpu"))  # the same shapes, made for real
    assert both.by_role() == flopscope.profile(real_model, real_ids, backward=True).by_role()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(FakeTensorError, match=r"cannot run for real.*mode='fake'"):
        flopscope.profile(model, ids, mode="real")
    with pytest.raises(FakeTensorError, match="mode='fake'"), flopscope.profiler(model, mode="real"):
        model(ids)
    with flopscope.profiler(model, mode="fake") as prof:
        model(ids)
    assert prof.total() == forward


def test_a_meta_model_with_fake_inputs_counts_exactly() -> None:
    model, _ = _llama_under(torch.device("meta"))
    with FakeTensorMode():
        ids = torch.randint(0, LLAMA["vocab"], (1, LLAMA["n"]))
    assert flopscope.profile(model, ids).total() == _llama_expected()


def test_fake_tensors_of_two_modes_are_refused() -> None:
    model, _ = _llama_under(FakeTensorMode())
    with FakeTensorMode():
        ids = torch.randint(0, LLAMA["vocab"], (1, LLAMA["n"]))
    with pytest.raises(FakeTensorError, match="2 different FakeTensorModes"):
        flopscope.profile(model, ids)


def test_the_7b_shape_built_under_a_fake_mode_counts_exactly() -> None:
    """Exact until 8e49bd7 (the first distributed commit), 0 since, until the caller's mode was reused."""
    transformers = pytest.importorskip("transformers")
    from zoo import LLAMA_7B

    c = LLAMA_7B
    config = transformers.LlamaConfig(hidden_size=c["d"], intermediate_size=c["d_ff"], num_hidden_layers=c["L"],
                                      num_attention_heads=c["h"], num_key_value_heads=c["h"], vocab_size=c["vocab"],
                                      max_position_embeddings=4096)
    with FakeTensorMode():
        model = transformers.LlamaModel(config).eval()
        ids = torch.randint(0, c["vocab"], (1, c["n"]))
    layer = add(attention(1, c["n"], c["n"], c["d"], c["h"]), ffn(1, c["n"], c["d"], c["d_ff"], gated=True))
    angles = sum(rotary(c["n"], c["d"] // c["h"]).values())  # (transformers before 5.19)
    assert flopscope.profile(model, ids).total() == sum(times(c["L"], layer).values()) + angles


class KeepsATable(nn.Module):
    """Keeps a table it makes from its integer buffer on itself, at its first forward (a lazily built rope or mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("positions", torch.arange(4))
        self.proj = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "table"):
            self.table = self.positions.float()
        return self.proj(x) + self.table[None, :, None]


class TablePipeline:
    """A pipeline of one :class:`KeepsATable`."""

    def __init__(self) -> None:
        self.net = KeepsATable()
        self.components = {"net": self.net}
        self.scheduler = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize("how", ["profiler", "pipeline"])
def test_a_table_a_module_keeps_on_itself_in_a_fake_block_is_not_left_there(how: str) -> None:
    """A ``profiler(mode="fake")`` block and a pipeline count run the user's own modules: an attribute a forward set
    on one of them to a fake tensor is taken away afterwards (the next forward makes it again), so the user's next
    real forward computes for real: 2 x 4 x 8 x 8 MACs and a real output. (It was left there: that forward returned a
    fake tensor.)"""
    x = torch.randn(2, 4, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "profiler":
            net = KeepsATable()
            with flopscope.profiler(net, mode="fake"):
                net(x)
        else:
            pipe = TablePipeline()
            flopscope.profile_pipeline(pipe, x=x)
            net = pipe.net
        assert not isinstance(getattr(net, "table", None), FakeTensor)
        out = net(x)
        assert type(out) is torch.Tensor
        assert flopscope.profile(net, x, mode="real").total() == 2 * 4 * 8 * 8


class BuildsOnLookup(collections.OrderedDict):
    """transformers' ``ClassInstantier`` (its ``ACT2FN``): ``table[name]`` builds a new object each time; building
    one may warn (xIELU's "CUDA-fused xIELU not available")."""

    built = 0

    def __getitem__(self, key: str) -> nn.Module:
        type(self).built += 1
        return super().__getitem__(key)()


ACTIVATIONS = BuildsOnLookup(relu=nn.ReLU, gelu=nn.GELU, silu=nn.SiLU)


class ActivationsByName(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act = nn.Linear(D, D, bias=False), ACTIVATIONS["silu"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.up(x))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_snapshotting_the_caches_builds_nothing_from_a_table_that_builds_on_lookup(mode: str) -> None:
    """The cache guard copies a module-level dict the model's code reaches as a plain dict: a subclass whose
    ``__getitem__`` builds an object (transformers' activation table) builds none. (Each count built every entry of
    transformers' ``ACT2FN``, which printed its xIELU warning.)"""
    model, x = ActivationsByName(), torch.randn(1, N, D)
    built = BuildsOnLookup.built
    assert flopscope.profile(model, x, mode=mode).total() == N * D * D
    assert fake_tensors_held(model) == []
    assert BuildsOnLookup.built == built


def test_a_hugging_face_count_builds_no_activation_of_transformers_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count of a Llama looks up no entry of transformers' ``ACT2FN`` (each lookup builds a module; the xIELU one
    warns "CUDA-fused xIELU not available"). The lookups are counted by a spy around the real ``__getitem__``."""
    model, ids = _llama_under(torch.device("cpu"))  # (skips without transformers)
    from transformers import activations

    looked_up: list[str] = []
    lookup = activations.ClassInstantier.__getitem__

    def spy(self: Any, key: str) -> Any:
        looked_up.append(key)
        return lookup(self, key)

    monkeypatch.setattr(activations.ClassInstantier, "__getitem__", spy)
    with torch.no_grad():
        assert flopscope.profile(model, ids, mode="fake").total() == _llama_expected()
    assert looked_up == []
