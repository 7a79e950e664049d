"""Repeated blocks counted once in ``flopscope.profile`` (fake mode, ``reuse=True``, the default): a block of a layer
list whose records are provably an earlier block's (the same structure and plain attributes, the same input shapes and
plain arguments, no value read, nothing outside it written) is replayed from them (``flopscope.capture.replay``). The
capture is the one every block run makes: each test compares reuse with ``reuse=False`` record by record, with its
dataflow, roles, module calls and counts, on models where it applies, and shows it refused where a call depends on
data or on the block."""

from __future__ import annotations

import collections
import logging
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from test_replay import assert_same_capture
from torch import nn

import flopscope

from closed_forms import rotary, total

D = 16


def profile(model: nn.Module, *args, reuse: bool = True, **kwargs) -> flopscope.Profile:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(model.eval(), *args, mode="fake", reuse=reuse, **kwargs)


def both(model: nn.Module, *args, **kwargs) -> tuple[flopscope.Profile, flopscope.Profile]:
    """The count with reuse and without, checked equal in everything (the pipeline's check: a profile is its
    ``profile``)."""
    reused, captured = (profile(model, *args, reuse=reuse, **kwargs) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    return reused, captured


class Wrapped(SimpleNamespace):
    """A profile as the pipeline check reads one (``.profile``, and its queries)."""

    def __init__(self, prof: flopscope.Profile) -> None:
        super().__init__(profile=prof)

    def __getattr__(self, name: str):
        return getattr(self.profile, name)


class Block(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(D, 2 * D), nn.Linear(2 * D, D), nn.LayerNorm(D)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x)))) * self.scale


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_blocks_of_one_structure_are_counted_once_and_the_capture_is_the_same():
    """Six blocks, the fourth with another scale (a plain attribute: its own key): blocks 1, 2, 4 and 5 replayed. Each
    block is up and down at 2·8 positions."""
    reused, _ = both(Stack([Block(), Block(), Block(), Block(scale=2.0), Block(), Block()]), torch.randn(2, 8, D))
    assert reused.total() == 6 * 2 * 8 * (D * 2 * D + 2 * D * D)
    assert [note for note in reused.notes if "replayed" in note] == [
        "blocks: 4 of 6 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]


class ValueBlock(Block):
    """A block whose work depends on a value it reads: it runs its MLP ``int(repeats)`` times (routing, early exits
    read values the same way)."""

    def forward(self, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        for _ in range(int(repeats)):
            x = super().forward(x)
        return x


class ValueStack(Stack):
    def forward(self, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        for block, n in zip(self.blocks, repeats, strict=True):
            x = block(x, n)
        return x


def test_a_block_that_reads_a_value_is_captured_every_time():
    """Three blocks given 1, 2 and 3 repeats (the same shapes, other values): each block captured, 1 + 2 + 3 MLPs; the
    notes say why (before: a list none of whose blocks was replayed had no note)."""
    reused, _ = both(ValueStack([ValueBlock() for _ in range(3)]), torch.randn(2, 8, D), torch.tensor([1, 2, 3]))
    assert [note for note in reused.notes if "replayed" in note] == [
        "blocks: not replayed, each of its 3 block calls captured: it read the values of tensors 1 time(s) (what "
        "runs may depend on them)"]
    assert reused.total() == 6 * 2 * 8 * (D * 2 * D + 2 * D * D)


def test_grad_mode_replays_as_it_captures_and_backward_captures_every_block():
    """With grad mode on and no backward (the autograd graph is never used) block 2 is replayed from block 1 (block 0's
    input requires no grad, block 1's does: another key): the same capture as ``reuse=False``, and the output requires
    grad as a run's does. ``backward=True`` counts as
    without reuse (a replay builds no graph to differentiate)."""
    model, x = Stack([Block() for _ in range(3)]), torch.randn(2, 8, D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graded, captured = (flopscope.profile(model, x, mode="fake", reuse=reuse) for reuse in (True, False))
        trained = flopscope.profile(model, x, mode="fake", backward=True)
    assert_same_capture(Wrapped(graded), Wrapped(captured))
    assert [note for note in graded.notes if "replayed" in note] == [
        "blocks: 1 of 3 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]
    assert graded.output.requires_grad and captured.output.requires_grad
    assert graded.total() == 3 * 2 * 8 * (D * 2 * D + 2 * D * D)
    assert trained.total(phase="backward") == 2 * 3 * 2 * 8 * (D * 2 * D + 2 * D * D)
    assert not [note for note in trained.notes if "replayed" in note]


class IndexedBlock(Block):
    """A block holding its own index (as a Hugging Face layer holds ``layer_idx``), which it reads only when given a
    cache; with ``doubles_first`` the first block (by its index) doubles its input first, with one more product."""

    def __init__(self, index: int, doubles_first: bool = False) -> None:
        super().__init__()
        self.index, self.doubles_first = index, doubles_first

    def forward(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        if self.doubles_first and self.index == 0:
            x = self.down(self.up(x))
        if cache is not None:
            cache.append(self.index)
        return super().forward(x)


class IndexedStack(Stack):
    def forward(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, cache)
        return x


def test_a_block_is_keyed_on_the_attributes_its_call_reads():
    """Four blocks, each with its own index: read by none (no cache), blocks 1 to 3 are replayed from block 0; read
    by every block (a cache), each is captured (a replay would put block 0's index in the cache); read by a branch
    that runs the first block's extra product, each is captured too (each read its own index)."""
    x, block = torch.randn(2, 8, D), 2 * 8 * (D * 2 * D + 2 * D * D)
    unread, _ = both(IndexedStack([IndexedBlock(i) for i in range(4)]), x)
    assert unread.total() == 4 * block
    assert [note for note in unread.notes if "replayed" in note] == [
        "blocks: 3 of 4 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]
    cache: list[int] = []
    read, _ = both(IndexedStack([IndexedBlock(i) for i in range(4)]), x, cache)
    assert read.total() == 4 * block and [note for note in read.notes if "replayed" in note] == [
        "blocks: not replayed, each of its 4 block calls captured: a block was given arguments of another structure "
        "than the first block"]  # (the list each block appends to is one longer)
    branched, _ = both(IndexedStack([IndexedBlock(i, doubles_first=True) for i in range(4)]), x)
    assert branched.total() == 5 * block and not [note for note in branched.notes if "replayed from" in note]


class Doubling(nn.Module):
    """A function as a module of its own (what kernels' ``use_kernel_forward_from_hub`` makes of a function such as
    ``apply_rotary_pos_emb``); ``weighted``: it holds a parameter."""

    def __init__(self, weighted: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((D,), 2.0)) if weighted else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (2 if self.weight is None else self.weight)


class FunctionsBlock(Block):
    """A block holding its own :class:`Doubling` in a dict of plain attributes, not as a submodule, and calling it
    (transformers 5.25 with kernels installed: each attention module's ``_kernel_funcs``, ``use_kernelized_func``)."""

    def __init__(self, weighted: bool = False) -> None:
        super().__init__()
        self.funcs = {"double": Doubling(weighted)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.funcs["double"](x))


def test_a_module_held_as_a_plain_attribute_is_keyed_by_its_structure():
    """Each block's own parameterless module in a dict: blocks 1 to 3 replayed from block 0 (before: the module was
    keyed by identity, each block captured, and nothing said why: transformers 5.25 replayed no Llama layer). One
    holding a parameter stays keyed by identity (a replay would read block 0's), and the parameter, no part of the
    model's state, appears in the call: the notes say so."""
    x, block = torch.randn(2, 8, D), 2 * 8 * (D * 2 * D + 2 * D * D)
    plain, _ = both(Stack([FunctionsBlock() for _ in range(4)]), x)
    assert plain.total() == 4 * block
    assert [note for note in plain.notes if "replayed" in note] == [
        "blocks: 3 of 4 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]
    weighted, _ = both(Stack([FunctionsBlock(weighted=True) for _ in range(4)]), x)
    assert weighted.total() == 4 * block
    assert [note for note in weighted.notes if "replayed" in note] == [
        "blocks: not replayed, each of its 4 block calls captured: parameters appeared during the call"]


class CountingBlock(Block):
    """A block that counts its calls in an attribute and, from its second call on, runs its MLP twice."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(super().forward(x) if self.calls > 1 else x)


class TwoPasses(Stack):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(super().forward(x))


def test_a_block_that_sets_its_attributes_is_captured_every_time():
    """Three blocks run twice: each second call runs the MLP twice, 9 MLPs in all. A replay does not set ``calls``
    (before: blocks 1 and 2 were replayed in the first pass, kept ``calls == 0`` and were replayed again in the
    second, counting 7 MLPs); now a call that changes an attribute of its modules is no template."""
    reused, _ = both(TwoPasses([CountingBlock() for _ in range(3)]), torch.randn(2, 8, D))
    assert reused.total() == 9 * 2 * 8 * (D * 2 * D + 2 * D * D)
    assert [note for note in reused.notes if "replayed" in note] == [
        "blocks: not replayed, each of its 6 block calls captured: it changed attributes of its modules "
        "((module).calls): state a replay would not change"]


class Holes(Stack):
    """A layer list holding ``None`` where a stage has no block (AutoencoderKLCosmos's lists do)."""

    def __init__(self) -> None:
        super().__init__([Block(), Block()])
        self.stages = nn.ModuleList([None, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.stages[0] is None else x


def test_a_list_holding_none_is_no_list_of_blocks():
    """A list of ``None`` s is left as it is (before: an AttributeError of flopscope's, on every fake count of such a
    model); the blocks are replayed."""
    reused, _ = both(Holes(), torch.randn(2, 8, D))
    assert reused.total() == 2 * 2 * 8 * (D * 2 * D + 2 * D * D)


def test_the_users_modules_are_left_as_they_were():
    """The replay wraps the blocks of the fake run's shadow of the model, never the user's modules."""
    model = Stack([Block() for _ in range(3)])
    forwards = [vars(block).get("forward") for block in model.blocks]
    profile(model, torch.randn(2, 8, D))
    assert [vars(block).get("forward") for block in model.blocks] == forwards == [None] * 3
    assert all(type(block) is Block for block in model.blocks)  # (the shadow's classes were swapped while watched)


class ToyCache:
    """A cache of the states each block leaves, by the block's index (the calling convention of a KV cache's
    ``update(states, layer_idx)``)."""

    def __init__(self, filled: dict[int, int] | None = None) -> None:
        self.entries = {i: torch.randn(2, n, D) for i, n in (filled or {}).items()}

    def update(self, states: torch.Tensor, index: int) -> torch.Tensor:
        held = self.entries.get(index)
        self.entries[index] = states * 1.0 if held is None else torch.cat([held, states], dim=1)
        return self.entries[index]


class CachingBlock(Block):
    """Attends its input's projection over what its cache entry holds (``how``: ``"update"`` hands its index to the
    cache; ``"peek"`` also reads the cache's entries; ``"offset"`` hands it ``index + 1``, a use of the number;
    ``"histc"`` also hands ``bins``, which differs between blocks, to a torch function taking an ``int``)."""

    def __init__(self, index: int, how: str = "update") -> None:
        super().__init__()
        self.index, self.how, self.bins = index, how, index + 2

    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        if self.how == "peek" and len(cache.entries) > 8:
            x = x * 2
        if self.how == "histc":
            x = x + torch.histc(x, bins=self.bins).sum()
        held = cache.update(self.up(x)[..., :D], self.index + 1 if self.how == "offset" else self.index)
        return x + self.down(torch.relu(self.up(self.norm(x @ held.transpose(1, 2) @ held))))


class CachingStack(Stack):
    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, cache)
        return x


def cached_count(how: str, filled: dict[int, int] | None = None) -> tuple[flopscope.Profile, flopscope.Profile]:
    """The count of four caching blocks with reuse and without (the same capture), each given its own cache."""
    model, x = CachingStack([CachingBlock(i, how) for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, ToyCache(filled), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    return reused, captured


def test_a_block_handing_its_index_to_a_cache_it_is_given_is_replayed_calling_it_again():
    """Blocks 1 to 3 are replayed from block 0, each calling ``update`` again with its own index: the same capture
    as running them (the cache's ``mul`` and ``cat`` included), per block the projection 2·8·D·2D, the two products
    with the held states 2·(2·8·8·D) and the MLP."""
    reused, _ = cached_count("update")
    block = 2 * 8 * D * 2 * D + 2 * (2 * 8 * 8 * D) + 2 * 8 * (D * 2 * D + 2 * D * D)
    assert reused.total() == 4 * block
    assert [note for note in reused.notes if "replayed" in note] == [
        "blocks: 3 of 4 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]


def test_a_block_reading_its_caches_state_or_using_its_index_is_captured():
    """A block that reads the cache's entries (state a key cannot see), or computes with its index before handing it
    on (a use of the number: the index is keyed), is captured every time."""
    for how in ("peek", "offset"):
        reused, _ = cached_count(how)
        assert not [note for note in reused.notes if "replayed from" in note], how
    assert [note for note in cached_count("peek")[0].notes if "replayed" in note] == [
        "blocks: not replayed, each of its 4 block calls captured: it read 'entries' of the ToyCache it was given "
        "(state a key cannot see)"]


def test_a_torch_function_refusing_an_attributes_stand_in_counts_without_stand_ins():
    """``torch.histc(x, bins=self.bins)`` refuses the stand-in of ``bins`` (an ``int`` argument, which a stand-in is
    not): the run is made again without stand-ins, where the attributes are keyed by value; the count is every
    block's run, and the cache the model was given is left as it was."""
    cache = ToyCache()
    model, x = CachingStack([CachingBlock(i, "histc") for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, cache, reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    assert cache.entries == {}


def test_a_block_whose_cache_entry_gives_other_sizes_is_captured_as_a_template_of_its_own():
    """Entries of 3, 5, 5 and 5 positions before the call: block 0's template takes its states after 3 held ones,
    block 1's entry gives its after 5, which a copy of the cache shows before anything is copied (the cache is left
    as it was): block 1 is captured, a second template of the key, and blocks 2 and 3 are replayed from it (a
    decoding step's layers, whose cache grew since the step before). Per block: the projection, the two products
    with the 1 + held states and the MLP."""
    reused, _ = cached_count("update", {0: 3, 1: 5, 2: 5, 3: 5})
    mlp = 2 * 8 * (D * 2 * D + 2 * D * D)
    held = [3 + 8, 5 + 8, 5 + 8, 5 + 8]
    assert reused.total() == sum(2 * 8 * D * 2 * D + 2 * (2 * 8 * n * D) + mlp for n in held)
    assert [note for note in reused.notes if "replayed" in note] == [
        "blocks: 2 of 4 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["vit", "bert", "t5"])
def test_transformers_encoders_count_as_without_reuse(name):
    """Encoders whose layers are a ModuleList, the same capture as every layer run: ViT's and BERT's layers 1 to 3 are
    replayed from layer 0 (each BERT layer holds its own index, which its forward reads only with a cache: the first
    call read no index, so the index is no part of the key); T5's 2 and 3 from layer 1 (layer 0 computes the position
    bias, with an embedding whose ids it checks, a read of values: its key is refused, not the list's; before, one
    refusal kept every later block from being replayed)."""
    if name == "vit":
        model = transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                                             intermediate_size=64, image_size=32, patch_size=8))
        args = (torch.randn(2, 3, 32, 32),)
    elif name == "bert":
        model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=4,
                                                               num_attention_heads=4, intermediate_size=64,
                                                               vocab_size=100))
        args = (torch.randint(0, 100, (2, 12)),)
    else:
        model = transformers.T5EncoderModel(transformers.T5Config(d_model=32, d_ff=64, d_kv=8, num_heads=4,
                                                                  num_layers=4, vocab_size=100))
        args = (torch.randint(0, 100, (2, 12)),)
    reused, captured = both(model, *args)
    assert reused.total() == captured.total() > 0
    replayed = [note for note in reused.notes if "replayed" in note]
    assert replayed == (["layers: 3 of 4 block calls replayed from an earlier call of a block of the same "
                         "structure on the same inputs' shapes (fake tensors: the same records)"] if name == "vit"
                        else ["encoder.layer: 3 of 4 block calls replayed from an earlier call of a block of the same "
                              "structure on the same inputs' shapes (fake tensors: the same records)"] if name == "bert"
                        else ["encoder.block: 2 of 4 block calls replayed from an earlier call of a block of the same "
                              "structure on the same inputs' shapes (fake tensors: the same records)"])


def tiny_llama(layers: int = 4, **config) -> nn.Module:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, **config)).eval()


def test_language_model_layers_given_a_cache_are_replayed_and_update_it():
    """A decoder's layers are given the model's KV cache and read their own ``layer_idx`` only to hand it to
    ``cache.update``: layers 1 to 3 are replayed from layer 0, each calling ``update`` again with its own index, so
    the capture is every layer's run (the ``cat`` s into the cache included) and the cache the forward returns holds 12
    positions in each of its 4 layers. Projections 2·12·(32·32·2 + 32·16·2) + MLP 3·12·32·64, scores and weighted sum
    2·12·12·32 (causal: counted whole, as SDPA computes them) per layer, the head 12·32·100, and the rotary angles
    (a matmul before transformers 5.19: 12 positions by head_dim / 2 = 4 frequencies)."""
    n, d, kv = 12, 32, 16
    reused, _ = both(tiny_llama(), torch.randint(0, 100, (1, n)))
    layer = n * (2 * d * d + 2 * d * kv) + 3 * n * d * 64 + 2 * n * n * d
    assert reused.total() == 4 * layer + n * d * 100 + total(rotary(n, d // 4))
    assert [note for note in reused.notes if "replayed" in note] == [
        "model.layers: 3 of 4 block calls replayed from an earlier call of a block of the same structure on the same "
        "inputs' shapes (fake tensors: the same records)"]
    cache = reused.output.past_key_values
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(1, 2, n, 8)] * 4


@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma2"])
def test_decoder_layers_are_replayed(name):
    """Decoders of the same layer code as Llama's, a sliding window where they have one: layers 1 to 3 replayed from
    layer 0, Gemma 2's 2 and 3 from 0 and 1 (its layers alternate sliding and full attention: each kind its own key),
    the same capture as every layer run (before, on transformers 5.25 with kernels installed, no layer was: each
    attention module holds its own wrapper of ``apply_rotary_pos_emb``, which keyed each layer apart)."""
    config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    if name == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**config, sliding_window=8))
    elif name == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config))
    else:
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**config, head_dim=8, sliding_window=8))
    reused, captured = both(model, torch.randint(0, 100, (1, 12)))
    assert reused.total() == captured.total() > 0
    assert [note for note in reused.notes if "replayed" in note] == [
        f"model.layers: {2 if name == 'gemma2' else 3} of 4 block calls replayed from an earlier call of a block of "
        "the same structure on the same inputs' shapes (fake tensors: the same records)"]


def test_a_decoding_step_with_a_filled_cache_is_replayed():
    """One token after a real 12-token prefill: each layer attends to 13 keys; layers 1 to 3 replayed, the same
    capture, and each layer of the returned cache holds 13 positions (and the rotary angles of the one position, a
    matmul before transformers 5.19)."""
    model, d, kv = tiny_llama(), 32, 16
    with torch.no_grad():
        prefill = model(torch.randint(0, 100, (1, 12)), use_cache=True)
    reused, _ = both(model, torch.randint(0, 100, (1, 1)), past_key_values=prefill.past_key_values)
    layer = (2 * d * d + 2 * d * kv) + 3 * d * 64 + 2 * 13 * d
    assert reused.total() == 4 * layer + d * 100 + total(rotary(1, d // 4))
    assert [tuple(layer.keys.shape) for layer in reused.output.past_key_values.layers] == [(1, 2, 13, 8)] * 4
    assert [tuple(layer.keys.shape) for layer in prefill.past_key_values.layers] == [(1, 2, 12, 8)] * 4


class Marking(CachingBlock):
    """Also sets an attribute of the cache it is given (``how="roll"``: and rolls its input by its index, a torch
    function that refuses a stand-in with a ``RuntimeError``)."""

    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        if self.how == "roll":
            x = x.roll(self.index, 1)
        cache.last = self.index
        return super().forward(x, cache)


class MarkingStack(CachingStack):
    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        return super().forward(x, cache)[:, : cache.last + 1]


@pytest.mark.parametrize("how", ["update", "roll"])
def test_a_block_setting_its_caches_attributes_or_rolling_by_its_index_counts_as_running(how):
    """Setting ``cache.last`` is a change a replay would not make (before: the last block's index was block 0's, and
    the head read 1 row for 4); ``roll`` refuses the stand-in with a RuntimeError: counted again without stand-ins
    (before: the run failed)."""
    model, x = MarkingStack([Marking(i, how) for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, ToyCache(), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))


class Slot:
    """One block's part of a :class:`SlottedCache`: its states, and the indices it was updated with (a list inside an
    object inside the cache's list: state two levels down)."""

    def __init__(self) -> None:
        self.states: torch.Tensor | None = None
        self.calls: list[int] = []


class SlottedCache:
    def __init__(self, blocks: int = 4) -> None:
        self.slots = [Slot() for _ in range(blocks)]

    def update(self, states: torch.Tensor, index: int) -> torch.Tensor:
        slot = self.slots[index]
        slot.calls.append(index)
        slot.states = states * 1.0 if slot.states is None else torch.cat([slot.states, states], dim=1)
        return slot.states


class ReturningStack(CachingStack):
    def forward(self, x: torch.Tensor, cache: SlottedCache) -> tuple[torch.Tensor, SlottedCache]:
        return super().forward(x, cache), cache


def test_checking_a_replays_call_outs_leaves_the_objects_state_as_it_was_at_any_depth():
    """A replay first calls the cache's ``update`` on a copy (to check the sizes it gives): the copy's slots' lists
    are copies too, so each slot of the cache the forward returns was updated once, with its own index, as a run
    updates it (before: the copy shared the slots' lists, and each replayed block's slot was updated twice)."""
    model, x = ReturningStack([CachingBlock(i) for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, SlottedCache(), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    assert [note for note in reused.notes if "replayed" in note]
    for prof in (reused, captured):
        assert [slot.calls for slot in prof.output[1].slots] == [[0], [1], [2], [3]]
        assert [tuple(slot.states.shape) for slot in prof.output[1].slots] == [(2, 8, D)] * 4


SEEN_FROM_ANOTHER_THREAD: list[type] = []


class Peeking(CachingBlock):
    """Has another thread look at the class of the cache its model holds while it runs."""

    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        thread = threading.Thread(target=lambda: SEEN_FROM_ANOTHER_THREAD.append(type(HOLDING.cache)))
        thread.start()
        thread.join()
        return super().forward(x, cache)


class HoldingStack(Stack):
    """Holds the cache its blocks are given (a model's own object, which the fake run's shadow shares)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__(blocks)
        self.cache = ToyCache()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, self.cache)
        return x


HOLDING = HoldingStack([Peeking(i) for i in range(4)])


def test_an_object_the_model_holds_is_never_watched():
    """Watching an object swaps its class while a first call runs: only objects the run made or copied may be
    watched. A cache the model holds is the user's: another thread sees its own class throughout (before: the
    watching subclass during block 0), and the blocks are captured, as without reuse."""
    SEEN_FROM_ANOTHER_THREAD.clear()
    reused, captured = (profile(HOLDING, torch.randn(2, 8, D), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    assert SEEN_FROM_ANOTHER_THREAD and all(seen is ToyCache for seen in SEEN_FROM_ANOTHER_THREAD)
    assert type(HOLDING.cache) is ToyCache and not HOLDING.cache.entries


class Logging(CachingBlock):
    """Also appends its index to a list it is given."""

    def forward(self, x: torch.Tensor, cache: ToyCache, log: list[int]) -> torch.Tensor:
        log.append(self.index)
        return super().forward(x, cache)


class LoggingStack(Stack):
    def forward(self, x: torch.Tensor, cache: ToyCache) -> tuple[torch.Tensor, list[int]]:
        log: list[int] = []
        for block in self.blocks:
            x = block(x, cache, log)
        return x, log


def test_a_stand_in_never_outlives_the_call_that_read_it():
    """A block's index read as a stand-in and put in a list the block is given is the number once the call
    returns (before: the list the forward returns held stand-ins); the call is no template (a replay would put
    block 0's index there)."""
    model, x = LoggingStack([Logging(i) for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, ToyCache(), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    assert reused.output[1] == [0, 1, 2, 3] and all(type(i) is int for i in reused.output[1])


class Counted:
    """Copied by its own ``__copy__`` (which counts its copies): a class that says how it is copied is copied so."""

    copies = 0

    def __init__(self) -> None:
        self.items: list[int] = []

    def __copy__(self) -> Counted:
        Counted.copies += 1
        twin = Counted()
        twin.items = self.items
        return twin


def test_the_copy_a_call_out_is_checked_on_shares_nothing_the_call_can_change_and_keeps_what_is_shared():
    """``given_objects.detached``: the plain objects, lists and dicts of a cache copied four levels down, each once
    (two slots holding one list hold one copied list), tensors kept; a class with its own ``__copy__`` copied by it;
    changing the copy at any depth leaves the original as it was."""
    from flopscope.capture.replay.given_objects import detached

    shared, states = [1], torch.zeros(2)
    cache = SlottedCache(2)
    cache.slots[0].calls = cache.slots[1].calls = shared
    cache.slots[0].states = states
    cache.counted = Counted()
    twin = detached(cache)
    twin.slots[0].calls.append(2)
    twin.slots[1].states = torch.ones(1)
    twin.counted.items.append(3)
    assert twin.slots[1].calls is twin.slots[0].calls and twin.slots[1].calls == [1, 2]
    assert twin.slots[0].states is states
    assert cache.slots[0].calls == [1] and cache.slots[1].calls is shared and cache.slots[1].states is None
    assert Counted.copies == 1 and cache.counted.items == []


class Stored:
    """A cache whose entries live in ``store()``: ``entries``, a container of the kind each subclass makes (or an
    object deeper inside it)."""

    def __init__(self, entries) -> None:
        self.entries = entries

    def store(self):
        return self.entries

    def update(self, states: torch.Tensor, index: int) -> torch.Tensor:
        store = self.store()
        if isinstance(store, collections.deque):
            while len(store) <= index:
                store.append(None)
        held = store[index] if isinstance(store, collections.deque) else store.get(index)
        store[index] = states * 1.0 if held is None else torch.cat([held, states], dim=1)
        return store[index]


class Ordered(Stored):
    def __init__(self) -> None:
        super().__init__(collections.OrderedDict())


class Defaulting(Stored):
    def __init__(self) -> None:
        super().__init__(collections.defaultdict(lambda: None))


class Queued(Stored):
    def __init__(self) -> None:
        super().__init__(collections.deque())


class Deep(Stored):
    """Its entries seven levels down, deeper than a dry run's copy goes: no copy is made, the blocks are counted."""

    def __init__(self) -> None:
        self.inner = SimpleNamespace(a=SimpleNamespace(b=SimpleNamespace(c=SimpleNamespace(d=SimpleNamespace(
            e=SimpleNamespace(f=SimpleNamespace(entries={})))))))

    def store(self):
        return self.inner.a.b.c.d.e.f.entries


class SelfCopying(Stored):
    """Its store's copy is the store itself (a ``__copy__`` returning ``self``), and it holds a logger (whose copy is
    itself): no copy its methods could change without changing it."""

    def __init__(self) -> None:
        super().__init__({})
        self.log = logging.getLogger("flopscope-test-cache")

    def __copy__(self):
        return self


class PassingTwice(Stack):
    """Runs its blocks twice, each time handing them the cache: the second pass's blocks attend over 16 positions."""

    def forward(self, x: torch.Tensor, cache: Stored) -> tuple[torch.Tensor, Stored]:
        for _ in range(2):
            for block in self.blocks:
                x = block(x, cache)
        return x, cache


@pytest.mark.parametrize("cache", [Ordered, Defaulting, Queued, Deep, SelfCopying])
def test_a_cache_of_any_container_or_depth_is_updated_once_per_block(cache):
    """The dry run of a replay's call-outs runs on a copy of the cache; an ``OrderedDict``, ``defaultdict`` or
    ``deque`` is copied too (before: shared, so each replayed block's entry was updated twice and the second pass
    attended over 24 positions for 16), and where no such copy can be made (deeper than it goes, a copy that is
    the original itself: before, a logger's ``__dict__`` was rewritten) the blocks are captured. Per block and pass:
    the projection, the two products with the held positions (8, then 16), the MLP."""
    root_handlers = logging.root.handlers
    model, x = PassingTwice([CachingBlock(i) for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, cache(), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    mlp = 2 * 8 * (D * 2 * D + 2 * D * D)
    assert reused.total() == sum(4 * (2 * 8 * D * 2 * D + 2 * (2 * 8 * n * D) + mlp) for n in (8, 16))
    entries = [t for t in reused.output[1].store() if t is not None] if cache is Queued else \
        [t for t in reused.output[1].store().values() if t is not None]
    assert [tuple(t.shape) for t in entries] == [(2, 16, D)] * 4
    assert logging.root.handlers is root_handlers and logging.getLogger("flopscope-test-cache").manager is \
        logging.Logger.manager


class Widening(CachingBlock):
    """Runs the ``extra`` submodule its model gives it between two passes, if it has one."""

    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        x = super().forward(x, cache)
        return self.extra(x) if "extra" in self._modules else x


class Extra(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., : self.width] @ x[..., : self.width].transpose(-1, -2) @ x


class Growing(CachingStack):
    """Gives each block a submodule of its own width between two passes."""

    def forward(self, x: torch.Tensor, cache: ToyCache) -> torch.Tensor:
        x = super().forward(x, cache)
        for block in self.blocks:
            block.extra = Extra(4 * (block.index + 1))
        return super().forward(x, cache)


def test_a_submodule_added_between_two_calls_is_watched_in_the_next():
    """The second pass's blocks hold a submodule each, whose width they read: watched, so blocks 1 to 3 are not
    replayed from block 0's width (before: the block's submodules were listed once per run, the new one was not
    watched, and the second pass counted 4-wide products for all four blocks)."""
    model, x = Growing([Widening(i) for i in range(4)]), torch.randn(2, 8, D)
    reused, captured = (profile(model, x, ToyCache(), reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    mlp = 2 * 8 * (D * 2 * D + 2 * D * D)
    blocks = sum(4 * (2 * 8 * D * 2 * D + 2 * (2 * 8 * n * D) + mlp) for n in (8, 16))
    extra = sum(2 * 8 * 8 * w + 2 * 8 * 8 * D for w in (4, 8, 12, 16))  # (x[..., :w] @ its transpose, then @ x)
    assert reused.total() == blocks + extra


class Tupling(CachingBlock):
    def forward(self, x: torch.Tensor, cache: ToyCache, log: list) -> torch.Tensor:
        log.append((self.index, "seen"))
        return super().forward(x, cache)


class TuplingStack(LoggingStack):
    pass


def test_a_stand_in_in_a_tuple_is_the_number_once_the_call_returns():
    """A tuple cannot change in place: the list is given a new one with the number (before: the stand-in stayed in
    the tuple, and the forward's log held it)."""
    model, x = TuplingStack([Tupling(i) for i in range(4)]), torch.randn(2, 8, D)
    reused = profile(model, x, ToyCache())
    assert reused.output[1] == [(i, "seen") for i in range(4)]
    assert all(type(i) is int for i, _ in reused.output[1])


class InPlace(Stack):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
            x.mul_(0.5)  # (in place on the block's output)
        return x


def test_a_replayed_output_takes_an_in_place_op_as_a_run_does_in_grad_mode():
    """With grad mode on (no ``no_grad``) a block's output requires grad and is no leaf: an in-place op on it is
    allowed. A replay's output is a view of a non-leaf too (before: a leaf, and the op raised with reuse only)."""
    model, x = InPlace([Block() for _ in range(3)]), torch.randn(2, 8, D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reused, captured = (flopscope.profile(model, x, mode="fake", reuse=reuse) for reuse in (True, False))
    assert_same_capture(Wrapped(reused), Wrapped(captured))
    assert [note for note in reused.notes if "replayed" in note]
    assert reused.total() == 3 * 2 * 8 * (D * 2 * D + 2 * D * D)


class Transposing(Stack):
    """Each block's output transposed (batch and positions, of one size) before the next block: the same shape, other
    strides."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x).transpose(0, 1)
        return x


def test_a_blocks_note_names_the_strides_that_kept_it_from_the_first_blocks_template():
    """Two blocks given tensors of one shape, [8, 8, D], the second transposed: a key holds strides, so the second
    is captured, and the note says what differs (the strides, [8·D, D, 1] and [D, 8·D, 1]), not only two equal
    shapes."""
    counted, _ = both(Transposing([Block(), Block()]), torch.randn(8, 8, D))
    assert counted.total() == 2 * 8 * 8 * (D * 2 * D + 2 * D * D)
    assert [note for note in counted.notes if "captured" in note] == [
        "blocks: not replayed, each of its 2 block calls captured: a block was given other arguments than the first "
        f"block (argument 0: shape [8, 8, {D}], torch.float32, strides [{D}, {8 * D}, 1], the first block's shape "
        f"[8, 8, {D}], torch.float32, strides [{8 * D}, {D}, 1])"]


class Sharing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, D)

    def forward(self, k: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.up(x) + y * k


class SharingStack(Stack):
    """The first block given one tensor twice, the second two tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.blocks[0](2, x, x)
        return self.blocks[1](2, a, a + 1)


def test_a_blocks_note_names_the_argument_whose_storage_another_shared():
    """Argument 2 of the first block is argument 1's tensor again, the second block's is a tensor of its own: the
    note says so by argument number (the int 2 is argument 0)."""
    counted, _ = both(SharingStack([Sharing(), Sharing()]), torch.randn(4, D))
    assert counted.total() == 2 * 4 * D * D
    assert [note for note in counted.notes if "captured" in note] == [
        "blocks: not replayed, each of its 2 block calls captured: a block was given other arguments than the first "
        f"block (argument 2: shape [4, {D}], torch.float32, its own storage, the first block's shape [4, {D}], "
        "torch.float32, the storage of argument 1)"]
