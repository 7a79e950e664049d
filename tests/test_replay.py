"""Repeated calls counted once (``flopscope.capture.replay``): a call whose key (module state, argument shapes and plain
values) was seen before is replayed from the first call's records, and the capture is the same as running it again
(every record, module call and count); a call whose records could differ with the same key (it reads values, writes an
input, hands back an input) is refused and captured again each time."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopscope
from flopscope.capture.records import link, records_in

D = 16


class Net(nn.Module):
    """Two linear layers (D -> 2D -> D) around a GELU; ``extra`` adds a third product (a plain attribute the key
    reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.extra = False

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        y = self.down(torch.nn.functional.gelu(self.up(x))) * scale
        return y @ self.down.weight @ self.up.weight if self.extra else y


class Prefix(nn.Module):
    """Multiplies the first ``k`` rows only, ``k`` read from a small integer input (its values are known)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.proj(x[:, : int(k.item())])


class PrefixList(nn.Module):
    """As Prefix, ``k`` read with ``.tolist()`` (no ATen op: the value read outside the dispatcher)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.proj(x[:, : k.tolist()[0]])


class InPlace(nn.Module):
    """Adds its projection into its input (a write to storage the call did not allocate), then projects it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(self.proj(x))
        return self.proj(x)


class Slot(nn.Module):
    """Reads the frames its cache holds and leaves its own there with a mark, and steps a counter, as the causal
    convolutions of a video VAE's decoder do (``feat_cache[idx]``, ``feat_idx[0] += 1``): ``cache`` a list indexed
    by ``idx[0]``, or a dict keyed by ``"frames"``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, cache: list | dict, idx: list) -> torch.Tensor:
        i = idx[0] if isinstance(cache, list) else "frames"
        y = self.proj(torch.cat([cache[i], x], dim=1))  # (1, 2 + 8, D)
        cache[i] = y[:, -2:].clone()
        cache[i + 1 if isinstance(cache, list) else "seen"] = "seen"
        idx[0] += 1
        return y[:, 2:]


class Stash(nn.Module):
    """Leaves in the list it is given what a replay could not make again: ``what`` is ``"weight"`` (its parameter)
    or ``"list"`` (a new list)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.what = what

    def forward(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        cache[0] = self.proj.weight if self.what == "weight" else [x.shape[0]]
        return self.proj(x)


class Loop:
    """The smallest pipeline: ``components`` and a call running ``net`` once per entry of ``calls`` (arguments of
    each call), feeding each output to the next call where ``chain``."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.components = {"net": net}
        self.scheduler = None

    def __call__(self, calls: list[tuple], chain: bool = False) -> list:
        outputs, previous = [], None
        for args in calls:
            if chain and previous is not None:
                args = (previous, *args[1:])
            previous = self.net(*args)
            outputs.append(previous)
        return outputs


def count(pipe, reuse: bool, **call) -> flopscope.PipelineProfile:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile_pipeline(pipe, reuse=reuse, **call)


def records(prof) -> list:
    """Every op record of the capture as what a count reads of it (op, module calls, shapes, MACs) and its dataflow:
    each input as the position of the op record that made it, or as a leaf (its kind, name and shape). (A replay may
    record the leaf of an input earlier than a run would: leaves are compared by what they are, not where.)"""
    link(prof.profile._ops)
    # (a replayed call's copies are made with their inputs, which link() keeps: those it would gather)
    assert all(op.inputs == records_in(op.args, op.kwargs) for op in prof.profile._ops)
    ops = [op for op in prof.profile._ops if op.node_op == "call_function"]
    at = {id(op): i for i, op in enumerate(ops)}

    def source(op) -> tuple:
        return ("op", at[id(op)]) if id(op) in at else ("leaf", op.leaf, op.target, op.output_shapes)

    return [(op.op_name, op.module_stack, op.input_shapes, op.output_shapes, op.macs, op.parts, op.elementwise,
             op.phase, tuple(source(i) for i in op.inputs)) for op in ops]


def assert_same_capture(reused, captured) -> None:
    """Reuse and recapture agree on every record, its dataflow, every module call and every count, and every
    record's roles (a replayed record takes those of the record it copies; recapture runs the role passes on all)."""
    assert records(reused) == records(captured)
    mine, theirs = reused.profile.role_assignments_by_op(), captured.profile.role_assignments_by_op()
    ops = [op for op in reused.profile._ops if op.node_op == "call_function"]
    again = [op for op in captured.profile._ops if op.node_op == "call_function"]
    assert [(dict(mine[a].parts), mine[a].block, mine[a].factor) if a in mine else None for a in ops] == [
        (dict(theirs[b].parts), theirs[b].block, theirs[b].factor) if b in theirs else None for b in again]
    assert reused.reconcile().rows == captured.reconcile().rows
    assert reused.total() == captured.total()
    assert reused.by_role() == captured.by_role()
    assert reused.by_module() == captured.by_module()
    assert reused.profile._capture.module_inputs == captured.profile._capture.module_inputs
    assert reused.profile._capture.module_calls == captured.profile._capture.module_calls


def test_calls_of_one_key_are_replayed_and_count_as_captured():
    """Four calls on (3, 8, D) inputs, chained (each on the previous output, a fake tensor after the first): the first
    is captured, the other three replayed; each call is up + down at 3·8 positions."""
    x = torch.randn(3, 8, D)
    pipe = Loop(Net())
    reused, captured = (count(pipe, reuse, calls=[(x,)] * 4, chain=True) for reuse in (True, False))
    per_call = 3 * 8 * (D * 2 * D + 2 * D * D)
    assert reused.total() == 4 * per_call
    assert_same_capture(reused, captured)
    assert reused.reuse == ("net: 3 of 4 calls replayed from an earlier call of the same inputs' shapes (fake tensors: "
                            "the same records)",)
    assert captured.reuse == ()
    assert pipe.net.up.weight.device.type == "cpu" and "forward" not in vars(pipe.net)  # the wrapper is gone


class Kinds(Loop):
    """:class:`Loop`, keeping the class of each call's output (what the pipeline's own code goes on with) in
    ``kinds``, a list made beforehand (a count restores the pipeline's attributes afterwards)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__(net)
        self.kinds: list[type] = []

    def __call__(self, calls: list[tuple], chain: bool = False) -> list:
        outputs = super().__call__(calls, chain)
        self.kinds.extend(type(out) for out in outputs)
        return outputs


def test_a_replayed_calls_outputs_are_fake_tensors_where_the_pipelines_code_runs_on_real_ones():
    """A pipeline's own code runs outside the fake mode (its scheduler on real tensors): a replay's outputs must be
    fake tensors of the run all the same, as the captured call's are. A real tensor there would make every op after
    it that takes no fake tensor (an upsampling, a norm without weights) compute for real: a VAE decoder's
    upsampling at 1024² allocated and filled 1 GB."""
    from torch._subclasses.fake_tensor import FakeTensor

    x = torch.randn(3, 8, D)
    pipe = Kinds(Net())
    prof = count(pipe, True, calls=[(x,)] * 3)
    assert prof.reuse == ("net: 2 of 3 calls replayed from an earlier call of the same inputs' shapes (fake tensors: "
                          "the same records)",)
    assert pipe.kinds == [FakeTensor] * 3


def test_a_new_shape_or_plain_argument_or_attribute_is_a_new_key():
    """Another batch, another plain argument (scale), or a changed attribute (extra: a third product) is captured; a
    repeat of any of them is replayed."""
    net = Net()
    pipe = Loop(net)
    a, b = torch.randn(1, 8, D), torch.randn(2, 8, D)
    calls = [(a,), (b,), (a, 0.5), (a,), (b,), (a, 0.5)]
    reused, captured = (count(pipe, reuse, calls=calls) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert "3 of 6 calls replayed" in reused.reuse[0]
    per_token = D * 2 * D + 2 * D * D
    assert reused.total() == 2 * (8 + 16 + 8) * per_token

    class Toggle(Loop):
        def __call__(self, calls: list[tuple], chain: bool = False) -> list:
            out = super().__call__(calls[:2])
            self.net.extra = True
            try:
                return out + super().__call__(calls[2:])
            finally:
                self.net.extra = False

    toggled = count(Toggle(net), True, calls=[(a,)] * 4)
    extra = 8 * (D * 2 * D + 2 * D * D)  # y @ down.weight (D -> 2D) @ up.weight (2D -> D) at 8 positions
    assert toggled.total() == 4 * 8 * per_token + 2 * extra
    assert "2 of 4 calls replayed" in toggled.reuse[0]


def test_a_call_that_reads_values_is_captured_every_time():
    """Prefix reads k (known values: a small integer input) to choose how many rows it multiplies: the same key
    with k = 2 then 5 must count 2 then 5 rows, so the call is refused, never replayed."""
    x = torch.randn(1, 8, D)
    pipe = Loop(Prefix())
    calls = [(x, torch.tensor(2)), (x, torch.tensor(5))]
    reused, captured = (count(pipe, reuse, calls=calls) for reuse in (True, False))
    assert reused.total() == (2 + 5) * D * D
    assert_same_capture(reused, captured)
    assert reused.reuse == ("net: not replayed, each call captured: it read the values of tensors 1 time(s) (what runs "
                            "may depend on them)",)


def test_a_call_that_reads_values_with_tolist_is_captured_every_time():
    """.tolist() of a real tensor runs no ATen op: it is counted as a read while the first call is watched, and the
    methods are as they were afterwards."""
    x = torch.randn(1, 8, D)
    methods = {name: vars(torch.Tensor).get(name) for name in ("tolist", "numpy")}
    reused = count(Loop(PrefixList()), True, calls=[(x, torch.tensor([3])), (x, torch.tensor([6]))])
    assert reused.total() == (3 + 6) * D * D
    assert "it read the values of tensors 1 time(s)" in reused.reuse[0]
    assert {name: vars(torch.Tensor).get(name) for name in methods} == methods


def test_a_call_that_writes_its_input_is_captured_every_time():
    x = torch.randn(1, 8, D)
    pipe = Loop(InPlace())
    reused = count(pipe, True, calls=[(x.clone(),), (x.clone(),)])
    assert reused.total() == 2 * 2 * 8 * D * D
    assert reused.reuse == ("net: not replayed, each call captured: it wrote 1 time(s) to storage it did not allocate "
                            "(an input, a parameter, a cache)",)


class Alternating(nn.Module):
    """Projects once, then twice, then once...: it flips an attribute at each call (state a schedule keeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.odd = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.odd = not self.odd
        return self.proj(x) if self.odd else self.proj(self.proj(x))


def test_a_call_that_changes_its_modules_attributes_is_captured_every_time():
    """Four calls: 1 + 2 + 1 + 2 products. Before, the third call (``odd`` False again: the first call's key) was
    replayed without flipping ``odd``, so the fourth was keyed as the first and counted 1 product: 5 in all. The
    change is now found by comparing the attributes before and after, and no call of such a module is a template."""
    pipe = Loop(Alternating())
    x = torch.randn(1, 8, D)
    reused = count(pipe, True, calls=[(x,)] * 4)
    assert reused.total() == (1 + 2 + 1 + 2) * 8 * D * D
    assert reused.reuse == ("net: not replayed, each call captured: it changed attributes of its modules "
                            "((module).odd): state a replay would not change",)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_call_that_changes_the_cache_it_was_given_is_replayed_with_the_same_changes(kind):
    """Slot reads a cache entry and leaves its own: the first call sees the starting cache (a mark still unset), the
    second and third the same shapes and marks, so the third is replayed. The replay leaves in the cache what the
    call would have (new tensors of the same shapes, the mark, the counter), and the count is every call's:
    3 calls x (2 + 8) rows x D x D."""
    x = torch.randn(1, 8, D)
    caches = {}
    profiles = []
    for reuse in (True, False):
        cache = [torch.randn(1, 2, D), None] if kind == "list" else {"frames": torch.randn(1, 2, D), "seen": None}
        counters = [[0] for _ in range(3)]
        profiles.append(count(Loop(Slot()), reuse, calls=[(x, cache, idx) for idx in counters]))
        caches[reuse] = cache
        assert counters == [[1]] * 3
    reused, captured = profiles
    assert reused.total() == 3 * (2 + 8) * D * D
    assert_same_capture(reused, captured)
    assert reused.reuse == ("net: 1 of 3 calls replayed from an earlier call of the same inputs' shapes (fake tensors: "
                            "the same records)",)
    for cache in caches.values():
        values = list(cache.values()) if kind == "dict" else cache
        assert [tuple(v.shape) if isinstance(v, torch.Tensor) else v for v in values] == [(1, 2, D), "seen"]
    left = [cache["frames"] if kind == "dict" else cache[0] for cache in caches.values()]
    assert type(left[0]) is type(left[1])  # (the replay's tensor is the run's kind, as the captured call's: fake)
    if kind == "dict":
        assert list(caches[True]) == ["frames", "seen"]


@pytest.mark.parametrize(("what", "reason"), [
    ("weight", "it put a tensor it did not allocate (a parameter, a view of an input) in a list or dict it was given"),
    ("list", "it put a new list in a list or dict it was given (only tensors and plain values are remade)")])
def test_a_call_that_leaves_what_a_replay_cannot_remake_in_a_list_is_captured_every_time(what, reason):
    x = torch.randn(1, 8, D)
    reused = count(Loop(Stash(what)), True, calls=[(x, [None]) for _ in range(3)])  # (three lists)
    assert reused.total() == 3 * 8 * D * D
    assert reused.reuse == (f"net: not replayed, each call captured: {reason}",)


def test_a_replay_changes_lists_given_twice_only_where_they_are_one_list():
    """The template's call was given one list twice (its changes made once); a later call of the same shapes given
    two lists is captured, not replayed into one of them."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(D, D, bias=False)

        def forward(self, x: torch.Tensor, a: list, b: list) -> torch.Tensor:
            a[0] = self.proj(x)
            b[0] = self.proj(a[0])
            return self.proj(b[0])

    x = torch.randn(1, 8, D)
    one = [None]
    calls = [(x, one, one), (x, [None], [None])]
    reused, captured = (count(Loop(Twice()), reuse, calls=calls) for reuse in (True, False))
    assert reused.total() == 2 * 3 * 8 * D * D
    assert_same_capture(reused, captured)
    assert reused.reuse == ("net: 2 calls, each captured (no two had the same inputs' shapes and plain arguments)",)


class Viewed(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)


class Passing(nn.Module):
    """Hands back its second argument as it is (as T5's blocks hand back the position bias they are given)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(x), bias


class Pair(nn.Module):
    """Adds its two inputs, then projects the sum."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.proj(x + y)


def test_a_call_given_one_tensor_twice_is_not_a_call_given_two():
    """The first call adds two tensors, a later one adds a tensor to itself: the key tells them apart (a replay
    would read one record where the template read two), so both are captured, the second add reading its input
    once."""
    x, y = torch.randn(2, 8, D), torch.randn(2, 8, D)
    reused, captured = (count(Loop(Pair()), reuse, calls=[(x, y), (x, x)]) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert reused.reuse == ("net: 2 calls, each captured (no two had the same inputs' shapes and plain arguments)",)
    adds = [op for op in reused.profile._ops if op.op_name.startswith("aten.add")]
    assert [len(op.inputs) for op in adds] == [2, 1]


class Summed(nn.Module):
    """Multiplies by the sum of its two weights."""

    def __init__(self) -> None:
        super().__init__()
        self.p, self.q = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.p.weight + self.q.weight)


class Tied(nn.Module):
    """Three :class:`Summed` blocks, the second's two weights one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Summed() for _ in range(3)])
        self.blocks[1].q.weight = self.blocks[1].p.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_block_whose_two_weights_are_one_is_replayed_reading_it_once():
    """The second block's weights are tied: replayed from the first, its add reads one parameter where the first
    block's read two, so its copy reads that record once, as the block's capture does (before: twice, a duplicate
    among its inputs and its weight's users)."""
    x = torch.randn(2, 8, D)
    reused, captured = (count(Loop(Tied()), reuse, calls=[(x,)]) for reuse in (True, False))
    assert reused.reuse == ("net.blocks: 2 of 3 block calls replayed from an earlier call of a block of the same "
                            "structure on the same inputs' shapes (fake tensors: the same records)",)
    assert_same_capture(reused, captured)
    adds = [op for op in reused.profile._ops if op.op_name.startswith("aten.add")]
    assert [len(op.inputs) for op in adds] == [2, 1, 2]


def test_a_call_that_hands_back_its_argument_is_replayed_handing_back_its_own():
    """A call returning one of its tensor arguments as it is: replayed, the replay returning its own call's argument
    (the capture the same as every call run); a call returning a view of its input is captured every time (the view
    aliases the input: a tensor made anew would not)."""
    x, bias = torch.randn(2, 8, D), torch.randn(4)
    reused, captured = (count(Loop(Passing()), reuse, calls=[(x, bias), (x, bias * 2)]) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert reused.reuse == ("net: 1 of 2 calls replayed from an earlier call of the same inputs' shapes (fake "
                            "tensors: the same records)",)
    assert reused.total() == 2 * 2 * 8 * (D * 2 * D + 2 * D * D)
    viewed = count(Loop(Viewed()), True, calls=[(torch.randn(2, D),)] * 2)
    assert viewed.reuse == ("net: not replayed, each call captured: it returns a tensor it did not allocate (a "
                            "parameter, a view of an input or a parameter)",)


def test_a_module_with_its_own_hooks_is_not_replayed():
    net = Net()
    handle = net.up.register_forward_hook(lambda module, args, out: None)
    try:
        reused = count(Loop(net), True, calls=[(torch.randn(1, 8, D),)] * 2)
    finally:
        handle.remove()
    assert reused.total() == 2 * 8 * (D * 2 * D + 2 * D * D)
    assert any("hooks of its own" in line for line in reused.reuse)


@pytest.mark.parametrize("name", ["sd", "flux", "wan"])
def test_diffusion_pipelines_replay_their_denoiser(name):
    """Every step's denoiser call after the first is replayed (Flux: true CFG's second pass too; Wan: both passes;
    SD: one call per step, the timestep a view at another offset each step), and the capture is the one every call
    makes when run."""
    diffusers = pytest.importorskip("diffusers")
    from test_pipeline import D_TEXT, TEXT, flux, sd_components, wan
    torch.manual_seed(0)
    steps = 3
    if name == "sd":
        text = torch.randn(1, TEXT, D_TEXT)
        make, call, denoiser, calls = (lambda: diffusers.StableDiffusionPipeline(tokenizer=None, **sd_components()),
                                       dict(prompt_embeds=text, negative_prompt_embeds=text), "unet", steps)
    elif name == "flux":
        text, pooled = torch.randn(1, 8, D_TEXT), torch.randn(1, D_TEXT)
        make, call, denoiser, calls = flux, dict(prompt_embeds=text, pooled_prompt_embeds=pooled,
                                                 negative_prompt_embeds=text, negative_pooled_prompt_embeds=pooled,
                                                 true_cfg_scale=2.0), "transformer", 2 * steps
    else:
        text = torch.randn(1, 8, D_TEXT)
        make, call, denoiser, calls = wan, dict(prompt_embeds=text, negative_prompt_embeds=text, num_frames=9,
                                                guidance_scale=5.0), "transformer", 2 * steps
    reused, captured = (count(make(), reuse, num_inference_steps=steps, height=32, width=32, **call)
                        for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert [s.macs for s in reused.steps()] == [s.macs for s in captured.steps()]
    assert reused.reuse[0] == (f"{denoiser}: {calls - 1} of {calls} calls replayed from an earlier call of the same "
                               "inputs' shapes (fake tensors: the same records)")
    assert any(" block calls replayed " in line for line in reused.reuse[1:])  # (blocks of one structure)


def test_a_copy_passes_the_records_fields_in_their_order():
    """A replay builds each copy from the fields it maps (the first seven, in order) and the rest as they are."""
    import dataclasses

    from flopscope.capture.records import CapturedOp
    from flopscope.capture.replay import template as replay
    names = tuple(f.name for f in dataclasses.fields(CapturedOp))
    assert names[:len(replay._HEAD)] == replay._HEAD
    assert names[len(replay._HEAD):len(replay._HEAD) + len(replay._REST)] == replay._REST
    assert names[len(replay._HEAD) + len(replay._REST):] == ("index", "inputs", "users")


def test_every_refusal_is_an_entry_of_the_one_table():
    """Every reason a call is not replayed is a named entry of flopscope.capture.replay._refusals, listed once in
    REFUSALS or MISSES (a reader finds a replay decision there, not by its message)."""
    from flopscope.capture.replay import _refusals
    named = [v for v in vars(_refusals).values() if isinstance(v, _refusals.Refusal)]
    listed = (*_refusals.REFUSALS, *_refusals.MISSES)
    assert len({id(r) for r in listed}) == len(listed) == len(named)
    assert {id(r) for r in named} == {id(r) for r in listed}


def test_a_call_from_another_thread_is_never_replayed_into_the_capture():
    """The profiled thread calls net once; another thread then calls it on the same shapes: that call is not the
    profile's (a foreign forward, warned about), and it is not replayed into it either."""
    import threading

    class Threads(Loop):
        def __call__(self, calls: list[tuple], chain: bool = False) -> list:
            out = super().__call__(calls)
            other = threading.Thread(target=lambda: torch.no_grad()(self.net)(*calls[0]))
            other.start()
            other.join()
            return out

    x = torch.randn(1, 8, D)
    prof = count(Threads(Net()), True, calls=[(x,)])
    assert prof.total() == 8 * (D * 2 * D + 2 * D * D)
    assert prof.reuse == ()


class Block(nn.Module):
    """A block of a stack: Net, scaled by a plain attribute."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.net, self.scale = Net(), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.scale + x


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(), Block(scale=2.0), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_blocks_of_one_structure_are_replayed_from_one_another():
    """Blocks 1 and 3 are block 0's structure on the same shapes: replayed, each with its own parameters and module
    paths; block 2's scale differs (a plain attribute): captured. The capture is every block run."""
    x = torch.randn(2, 8, D)
    reused, captured = (count(Loop(Stack()), reuse, calls=[(x,)]) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert reused.total() == 4 * 2 * 8 * (D * 2 * D + 2 * D * D)
    assert reused.reuse == ("net.blocks: 2 of 4 block calls replayed from an earlier call of a block of the same "
                            "structure on the same inputs' shapes (fake tensors: the same records)",)
    weights = {op.target for op in reused.profile._ops if op.node_op == "get_attr" and op.target.endswith("up.weight")}
    assert weights == {f"net.blocks.{i}.net.up.weight" for i in range(4)}


class Indexed(Stack):
    """Stack whose blocks each hold their own index, which their forward never reads (a text encoder's
    ``layer_idx``, read only with a cache)."""

    def __init__(self) -> None:
        super().__init__()
        for i, block in enumerate(self.blocks):
            block.index = i


def test_a_pipelines_blocks_are_keyed_by_the_attributes_they_read():
    """In a pipeline count the components are the user's modules (their parameters swapped for fake ones for the
    run): their blocks' first calls are watched as a shadow's are, so blocks 1 and 3 are replayed from block 0 though
    each holds another index, and block 2 (its scale, read, differs) is captured. Every module's class is its own
    again afterwards, also where the pipeline raised."""
    x = torch.randn(2, 8, D)
    stack = Indexed()
    reused, captured = (count(Loop(stack), reuse, calls=[(x,)]) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert reused.total() == 4 * 2 * 8 * (D * 2 * D + 2 * D * D)
    assert reused.reuse == ("net.blocks: 2 of 4 block calls replayed from an earlier call of a block of the same "
                            "structure on the same inputs' shapes (fake tensors: the same records)",)
    classes = {name: type(m) for name, m in stack.named_modules()}
    with pytest.raises(RuntimeError):
        count(Loop(stack), True, calls=[(x,), (torch.randn(2, 8, D + 1),)])
    assert {name: type(m) for name, m in stack.named_modules()} == classes
    assert all(type(m).__module__ in (__name__, "torch.nn.modules.linear", "torch.nn.modules.container")
               for m in stack.modules())


class Encode:
    """A pipeline's prompt encoding: its text encoder run on token ids."""

    def __init__(self, encoder: nn.Module) -> None:
        self.components = {"text_encoder": encoder}
        self.scheduler = None

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.components["text_encoder"](input_ids=ids).last_hidden_state


def test_a_t5_encoders_blocks_are_replayed_in_a_pipeline():
    """T5's blocks each hold their own ``layer_idx``, read only with a cache: in a pipeline's prompt encoding blocks 2
    and 3 are replayed from block 1 (block 0, which holds the relative attention bias, is another structure), as in
    ``flopscope.profile``; the capture is every block run."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(d_model=D, d_kv=4, d_ff=2 * D, num_layers=4, num_heads=4, vocab_size=50)
    encoder = transformers.T5EncoderModel(config).eval()
    ids = torch.randint(0, 50, (1, 7))
    reused, captured = (count(Encode(encoder), reuse, ids=ids) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert "text_encoder.encoder.block: 2 of 4 block calls replayed from an earlier call of a block of the same " \
           "structure on the same inputs' shapes (fake tensors: the same records)" in reused.reuse
    blocks, n, heads, d_head = 4, 7, 4, 4  # (4 heads of 4: the projections are D x D)
    assert {role: macs for role, macs in reused.by_role().items() if macs} == {
        "q_proj": blocks * n * D * D, "k_proj": blocks * n * D * D, "v_proj": blocks * n * D * D,
        "out_proj": blocks * n * D * D, "attn_scores": blocks * heads * n * n * d_head,
        "attn_weighted_sum": blocks * heads * n * n * d_head, "ffn_up": blocks * n * D * 2 * D,
        "ffn_down": blocks * n * 2 * D * D}


class Two:
    """A pipeline of two components: ``a`` twice on the same shapes (the second replayed), then ``b`` (captured) on
    the replayed call's output."""

    def __init__(self) -> None:
        self.components = {"a": Net(), "b": Stack()}
        self.scheduler = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.components["a"](x)
        return self.components["b"](self.components["a"](x))


def test_a_captured_call_reading_a_replayed_calls_output_gets_its_roles():
    """The role passes run over the distinct calls' records and over the replayed records those read (here the
    second call of ``a``, read by ``b``): every record's roles equal those of the passes over every call."""
    x = torch.randn(2, 8, D)
    reused, captured = (count(Two(), reuse, x=x) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert reused.total() == 2 * 2 * 8 * (D * 2 * D + 2 * D * D) + 4 * 2 * 8 * (D * 2 * D + 2 * D * D)


def test_a_block_sharing_a_module_with_another_is_not_replayed():
    """Block 1 uses block 0's Net (one module in two places, attributed to its first path): a copy renamed to block
    1's paths would not be what a run records, so block 1 is captured."""
    stack = Stack()
    stack.blocks[1].net = stack.blocks[0].net
    x = torch.randn(2, 8, D)
    reused, captured = (count(Loop(stack), reuse, calls=[(x,)]) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert any("shared with another place" in line for line in reused.reuse)


class Split(nn.Module):
    """Returns two views of one product and the product itself (outputs sharing one storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.proj(x)
        return y[:, :4], y[:, 4:], y


class UseSplit(Loop):
    """Calls Split twice, then multiplies what the second call returned (its views and the whole)."""

    def __call__(self, calls: list[tuple], chain: bool = False) -> list:
        out = super().__call__(calls)
        first, second, whole = out[-1]
        assert first.untyped_storage().nbytes() == whole.untyped_storage().nbytes()  # views of one storage
        return [first @ second.transpose(1, 2), whole.sum()]


def test_outputs_viewing_one_storage_are_remade_as_views_of_one():
    x = torch.randn(2, 8, D)
    reused, captured = (count(UseSplit(Split()), reuse, calls=[(x,), (x,)]) for reuse in (True, False))
    assert_same_capture(reused, captured)
    assert reused.total() == 2 * 2 * 8 * D * D
    assert "net: 1 of 2 calls replayed" in reused.reuse[0]


def _token_model(model_class: str, config_class: str, **config) -> tuple[nn.Module, dict]:
    """A Hugging Face model of ``config``, with 8 token ids as its input."""
    transformers = pytest.importorskip("transformers")
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    return model, dict(input_ids=torch.zeros(1, 8, dtype=torch.long))


def _llama() -> tuple[nn.Module, dict]:
    return _token_model("LlamaForCausalLM", "LlamaConfig", hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64)


def _deepseek_v3() -> tuple[nn.Module, dict]:
    return _token_model(
        "DeepseekV3ForCausalLM", "DeepseekV3Config", hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=4, first_k_dense_replace=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=8,
        qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)


def _bert_classifier() -> tuple[nn.Module, dict]:
    return _token_model("BertForSequenceClassification", "BertConfig", hidden_size=32, intermediate_size=64,
                        num_hidden_layers=3, num_attention_heads=4, vocab_size=64, num_labels=3)


def _squeezebert() -> tuple[nn.Module, dict]:
    return _token_model("SqueezeBertModel", "SqueezeBertConfig", hidden_size=32, intermediate_size=64,
                        num_hidden_layers=3, num_attention_heads=4, vocab_size=64, embedding_size=32)


def _sd3() -> tuple[nn.Module, dict]:
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=24, caption_projection_dim=16, pooled_projection_dim=12, out_channels=4,
        pos_embed_max_size=16)
    return model, dict(hidden_states=torch.randn(1, 4, 8, 8), timestep=torch.tensor([3]),
                       encoder_hidden_states=torch.randn(1, 7, 24), pooled_projections=torch.randn(1, 12))


CONDENSED = {
    # a residual stream through replayed layers; rotary tables and a mask every layer reads
    "llama": _llama,
    # dense layers and MoE layers, each kind replayed from its first; MLA's low-rank factors
    "deepseek_v3": _deepseek_v3,
    # a pooler and a classifier on the last layer's first position
    "bert_classifier": _bert_classifier,
    # every block modulated by one timestep embedding (conditioning, no FFN), one text stream projected by all
    "sd3": _sd3,
    # attention blocks named by a layer that is no module call of its own (encoder.layers.1, renamed from .0)
    "squeezebert": _squeezebert,
}


def _profiled(name: str) -> flopscope.Profile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "llama_generation":
            # a cache's update called out of every replayed layer: records made inside a replayed call
            model, inputs = _llama()
            return flopscope.profile_generation(model, inputs["input_ids"], 3)
        model, inputs = CONDENSED[name]()
        return flopscope.profile(model, mode="fake", forward_kwargs=inputs)


@pytest.mark.parametrize("name", [*sorted(CONDENSED), "llama_generation"])
def test_the_role_passes_run_over_the_distinct_blocks_and_give_every_blocks_roles(name, monkeypatch):
    """Blocks replayed from another of the same structure take its roles, found by passes over the distinct blocks
    alone (the capture condensed): every record's role split, block and factor flag equal those of the passes over
    every record."""
    from flopscope.attribute import carried

    prof = _profiled(name)
    assert prof._capture.copies
    seen: list[int] = []
    passes = carried.find_roles
    monkeypatch.setattr(carried, "find_roles", lambda ops, *rest: seen.append(len(ops)) or passes(ops, *rest))
    condensed = prof.role_assignments_by_op()
    whole = carried.roles_with_copies(prof._ops, {}, prof._facts.types)
    assert seen[0] < seen[1] == len(prof._ops)

    def split(found: dict) -> dict:
        return {op: (dict(a.parts), a.block, a.factor) for op, a in found.items()}

    assert split(condensed) == split(whole)


def test_a_replayed_layers_cache_is_no_chain_through_the_decoding_steps_for_the_role_passes():
    """A cache's update, called out of every replayed layer at every decoding step, makes records of its own: each
    step's concatenation reads the last step's. The role passes see it read a leaf there, as it reads the call's
    copies: a chain through every step would be walked back from each step's attention core (time quadratic in the
    steps). Only the distinct layer, run anew at each step, keeps its cache's chain (its keys are every later step's).
    The roles stay those of the passes over every record (the test above)."""
    from flopscope.attribute import carried

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, inputs = _llama()
        prof = flopscope.profile_generation(model, inputs["input_ids"], 5)
    ops, copies = prof._ops, prof._capture.copies
    link(ops)
    condensed, twins = carried._condensed(ops, copies)
    link(condensed, again=True)
    replayed = {frame for copy in copies for frame in copy.module_stack} - {
        frame for template in copies.values() for frame in template.module_stack}
    layers = {op.module_stack[2].path for op in ops
              if op.target is torch.ops.aten.cat.default and op.module_stack[-1].path.startswith("model.layers.")}
    assert layers == {f"model.layers.{i}" for i in range(4)}
    chained = set()
    for op in ops:
        if op in copies or op.target is not torch.ops.aten.cat.default or not set(op.module_stack) & replayed:
            continue
        for x in twins[op].inputs:
            if x.target is torch.ops.aten.cat.default:
                chained.add(op.module_stack[2].path)
    assert not chained, f"replayed layers' caches read their last step's through the role passes: {sorted(chained)}"
