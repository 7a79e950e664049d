"""Integer inputs keep their values on fake and meta tensors wherever the model reads them (``.item()``,
``.tolist()``, ``int(t)``, ops whose output shape depends on them), so a vision tower that reads its grid sizes
counts without running (issue 23, item 6)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import flopscope
from flopscope.errors import FakeTensorError

from closed_forms import add, rotary

D = 8


class GridReader(nn.Module):
    """Splits its tokens by sizes read from an integer grid (``.tolist()``), repeats them by a data-dependent count
    (``repeat_interleave``) and runs one more projection per ``int(grid[0, 0])``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        sizes = grid.prod(-1).tolist()
        owners = torch.repeat_interleave(torch.arange(len(sizes)), grid.prod(-1))  # output length: sum(sizes)
        h = torch.cat([self.proj(part) for part in x.split(sizes, 0)]) + owners[:, None]
        for _ in range(int(grid[0, 0].item())):
            h = self.proj(h)
        return h


GRID = [[1, 2, 3], [1, 2, 2]]
TOKENS = 6 + 4


@pytest.mark.parametrize("mode", ["real", "fake", "meta"])
def test_values_of_integer_inputs_are_read_on_fake_and_meta_tensors(mode: str) -> None:
    """At 3bbe37a the fake and meta counts stopped at `_local_scalar_dense` (.tolist()), and then at
    repeat_interleave's data-dependent output shape."""
    model, x, grid = GridReader(), torch.randn(TOKENS, D), torch.tensor(GRID)
    if mode == "meta":
        model, x = model.to("meta"), x.to("meta")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fall-back
        prof = flopscope.profile(model, x, grid, mode="real" if mode == "real" else "fake")
    assert prof.total() == (1 + GRID[0][0]) * TOKENS * D * D


class WritesItsIndex(nn.Module):
    """Reads a count from an integer tensor after writing into it in place: a stale value must never be used."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        counts = counts.clone()
        before = int(counts[0])
        view = counts[:1]
        view.add_(x.shape[0] > 0)  # written through a view: the value is no longer what the input said
        for _ in range(before + int(counts[0])):
            x = self.proj(x)
        return x


def test_a_value_written_in_place_is_not_read_stale() -> None:
    model, x, counts = WritesItsIndex(), torch.randn(4, D), torch.tensor([2, 5])
    expected = (2 + 3) * 4 * D * D
    assert flopscope.profile(model, x, counts, mode="real").total() == expected
    # the write is replayed on the known values of the storage (counts[0] = 3 after it): counted, never stale
    assert flopscope.profile(model, x, counts, mode="fake").total() == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert flopscope.profile(model, x, counts).total() == expected  # auto: counted for real


def test_qwen2_vl_vision_tower_counts_on_meta() -> None:
    """The vision tower reads image_grid_thw with .tolist() and repeat_interleave (a FakeTensorError on meta at
    3bbe37a)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen2VLForConditionalGeneration"):
        pytest.skip("this transformers has no Qwen2-VL")
    embed, depth, ratio, patch, merge, t_patch, hidden = 32, 2, 2, 14, 2, 2, 64
    config = transformers.Qwen2VLConfig(
        text_config=dict(hidden_size=hidden, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000),
        vision_config=dict(depth=depth, embed_dim=embed, hidden_size=hidden, num_heads=4, mlp_ratio=ratio,
                           patch_size=patch, spatial_merge_size=merge, temporal_patch_size=t_patch))
    torch.manual_seed(0)
    visual = transformers.Qwen2VLForConditionalGeneration(config).eval().model.visual
    grid = torch.tensor([[1, 4, 4]])
    patches, width = 16, 3 * t_patch * patch * patch
    pixels = torch.randn(patches, width)
    merged, merged_width = patches // merge**2, embed * merge**2
    expected = {"conv": patches * width * embed,
                "q_proj": depth * patches * embed * embed, "k_proj": depth * patches * embed * embed,
                "v_proj": depth * patches * embed * embed, "out_proj": depth * patches * embed * embed,
                "attn_scores": depth * patches * patches * embed,
                "attn_weighted_sum": depth * patches * patches * embed,
                "ffn_up": depth * patches * embed * ratio * embed, "ffn_down": depth * patches * ratio * embed * embed,
                # the patch merger, a projector between widths (merged_width -> merged_width -> hidden) that writes
                # back to no residual stream: other (issue 47)
                "other": merged * merged_width * merged_width + merged * merged_width * hidden}
    with torch.no_grad():
        real = flopscope.profile(visual, pixels, grid_thw=grid, mode="real")
        meta = flopscope.profile(copy.deepcopy(visual).to("meta"), pixels.to("meta"), grid_thw=grid)
        fake = flopscope.profile(visual, pixels, grid_thw=grid, mode="fake")
    assert meta.mode == fake.mode == "fake"
    for prof in (real, meta, fake):
        assert {role: macs for role, macs in prof.by_role().items() if macs} == expected


class PositionsWrittenInPlace(nn.Module):
    """Qwen2-VL's multimodal rotary positions: a float multiply of known positions cast back to integers, a write
    into a row of a stacked grid (``v[0] += start``), and ``torch.tensor`` of a list of one-element tensors
    computed from them (whose memory torch reads directly); the last value sets how often a projection runs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        t = (torch.arange(grid[0].item()) * 1.0).long()
        v = torch.stack([t, t + 1, t + 2]).reshape(3, -1)
        v[0] += 5
        deltas = torch.tensor([v.max() + 1, v.min()])
        for _ in range(int(deltas[0])):
            x = self.proj(x)
        return x


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_values_follow_writes_floats_and_tensor_of_a_list(mode: str) -> None:
    """grid[0] = 3: t = [0, 1, 2], v[0] = [5, 6, 7], so max + 1 = 8 projections. At 47d4c63 a fake run lost the
    values at the float multiply and at the in-place add, and torch.tensor([...]) failed reading fake memory."""
    prof = flopscope.profile(PositionsWrittenInPlace(), torch.randn(2, D), torch.tensor([3, 5]), mode=mode)
    assert prof.mode == mode
    assert prof.total() == 8 * 2 * D * D


def test_qwen2_vl_counts_on_meta_as_on_the_cpu() -> None:
    """The whole model: the vision tower (grid sizes read with .tolist()) and the language model, whose multimodal
    rotary positions are computed from the grid (get_rope_index: in-place writes, torch.tensor of a list of fake
    one-element tensors). On meta it failed at 47d4c63 (FakeTensorError: "data is not allocated yet")."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen2VLForConditionalGeneration"):
        pytest.skip("this transformers has no Qwen2-VL")
    embed, depth, ratio, patch, merge, t_patch, hidden, heads, kv, d_ff, vocab = 32, 2, 2, 14, 2, 2, 64, 4, 2, 128, 1000
    config = transformers.Qwen2VLConfig(
        text_config=dict(hidden_size=hidden, intermediate_size=d_ff, num_hidden_layers=1, num_attention_heads=heads,
                         num_key_value_heads=kv, vocab_size=vocab,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
        vision_config=dict(depth=depth, embed_dim=embed, hidden_size=hidden, num_heads=4, mlp_ratio=ratio,
                           patch_size=patch, spatial_merge_size=merge, temporal_patch_size=t_patch),
        image_token_id=900, video_token_id=901, vision_start_token_id=902, vision_end_token_id=903)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    patches, width = 16, 3 * t_patch * patch * patch  # one image, grid 1 x 4 x 4
    merged, merged_width = patches // merge**2, embed * merge**2
    ids = torch.tensor([[5] * 3 + [902] + [900] * merged + [903] + [7] * 3])
    n, d_k = ids.shape[1], hidden // heads
    inputs = dict(input_ids=ids, pixel_values=torch.randn(patches, width), image_grid_thw=torch.tensor([[1, 4, 4]]),
                  mm_token_type_ids=(ids == 900).long())
    vision = {"conv": patches * width * embed, "q_proj": depth * patches * embed * embed,
              "k_proj": depth * patches * embed * embed, "v_proj": depth * patches * embed * embed,
              "out_proj": depth * patches * embed * embed, "attn_scores": depth * patches * patches * embed,
              "attn_weighted_sum": depth * patches * patches * embed,
              "ffn_up": depth * patches * embed * ratio * embed, "ffn_down": depth * patches * ratio * embed * embed,
              # the patch merger, a projector between widths: other (issue 47)
              "other": merged * merged_width * merged_width + merged * merged_width * hidden}
    text = {"q_proj": n * hidden * hidden, "k_proj": n * hidden * kv * d_k, "v_proj": n * hidden * kv * d_k,
            "out_proj": n * hidden * hidden, "attn_scores": heads * n * n * d_k,
            "attn_weighted_sum": heads * n * n * d_k,
            "ffn_up": n * hidden * d_ff, "ffn_gate": n * hidden * d_ff, "ffn_down": n * d_ff * hidden,
            "logits": n * hidden * vocab}
    expected = add(vision, text, rotary(n, d_k, rows=3))  # multimodal rotary: 3 rows of positions (t, h, w)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = flopscope.profile(model, **inputs, mode="real")
        fake = flopscope.profile(model, **inputs, mode="fake")
        meta = flopscope.profile(copy.deepcopy(model).to("meta"),
                                 **{**inputs, "pixel_values": inputs["pixel_values"].to("meta")})
    assert (real.mode, fake.mode, meta.mode) == ("real", "fake", "fake")
    for prof in (real, fake, meta):
        assert {role: macs for role, macs in prof.by_role().items() if macs} == expected


class WritesAnUnknownValue(nn.Module):
    """Writes a value computed from the activations (unknown on fake tensors) into its count, then reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        counts = counts.clone()
        counts[:1].add_((x > 100).sum())  # 0 for these inputs, but only a real run knows
        for _ in range(int(counts[0])):
            x = self.proj(x)
        return x


def test_a_value_written_from_unknown_data_is_refused_never_stale() -> None:
    model, x, counts = WritesAnUnknownValue(), torch.randn(4, D), torch.tensor([2, 5])
    assert flopscope.profile(model, x, counts, mode="real").total() == 2 * 4 * D * D
    with pytest.raises(FakeTensorError, match="needs real data"):
        flopscope.profile(model, x, counts, mode="fake")


def test_torch_tensor_is_torchs_own_again_after_every_fake_run() -> None:
    """The stand-in for torch.tensor / as_tensor / asarray lives only while a fake run counts, also when the
    forward raises; a torch function mode would have done it without patching, but it turns nn.MultiheadAttention's
    fast path off (tests/test_zoo.py's fast-path cases in fake mode)."""
    originals = (torch.tensor, torch.as_tensor, torch.asarray)
    flopscope.profile(PositionsWrittenInPlace(), torch.randn(2, D), torch.tensor([3, 5]), mode="fake")
    assert (torch.tensor, torch.as_tensor, torch.asarray) == originals
    with pytest.raises(FakeTensorError):
        flopscope.profile(WritesAnUnknownValue(), torch.randn(4, D), torch.tensor([2, 5]), mode="fake")
    assert (torch.tensor, torch.as_tensor, torch.asarray) == originals


class Pick(nn.Module):
    """Projects, keeps the tokens an integer buffer marks (``nonzero``: an output size its values decide), and
    projects again."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("marks", torch.tensor([0, 2, 3, 1]))
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = torch.nonzero(self.marks > 1).flatten() + torch.zeros(2, dtype=torch.long)  # 2 of the 4 positions
        return self.proj(self.proj(x)[:, kept])


class PickPipeline:
    """A pipeline of one :class:`Pick`, whose own code runs outside the fake mode."""

    def __init__(self) -> None:
        self.pick = Pick()
        self.components = {"pick": self.pick}
        self.scheduler = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.pick(x)


@pytest.mark.parametrize("how", ["profile", "profiler", "pipeline"])
def test_values_of_integer_buffers_are_read_in_every_way_of_counting(how: str) -> None:
    """The values of a model's integer buffers are known in a ``profiler`` block and a pipeline count as in
    ``profile``: 2 x 4 tokens x D x D, then the two positions a buffer marks, 2 x 2 tokens x D x D. (A block and a
    pipeline had no values for the state they swap in: ``nonzero`` raised ``DynamicOutputShapeException``. A
    pipeline's own code runs outside the fake mode, so what the values make must be a fake tensor of the run all the
    same: it was a meta tensor, which the CPU tensor ``zeros`` makes there could not be added to.)"""
    x = torch.randn(2, 4, D)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "profile":
            prof = flopscope.profile(Pick(), x, mode="fake")
        elif how == "profiler":
            model = Pick()
            with flopscope.profiler(model, mode="fake") as block:
                model(x)
            prof = block.result
        else:
            prof = flopscope.profile_pipeline(PickPipeline(), x=x)
    assert prof.total() == 2 * 4 * D * D + 2 * 2 * D * D


class Prefix(nn.Module):
    """Projects the first ``k`` tokens, ``k`` an integer buffer it reads (``int(self.k)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.tensor(8))
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x[:, : int(self.k)])


class NarrowingPipeline:
    """Runs :class:`Prefix` twice, narrowing its prefix to 2 in between (the pipeline's own code), and widens it back
    after."""

    def __init__(self) -> None:
        self.prefix = Prefix()
        self.components = {"prefix": self.prefix}
        self.scheduler = None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = [self.prefix(x)]
        self.prefix.k.fill_(2)
        out.append(self.prefix(x))
        self.prefix.k.fill_(8)
        return out


@pytest.mark.parametrize("how", ["profiler", "pipeline"])
@pytest.mark.parametrize("mode", ["real", "fake"])
def test_a_buffer_the_callers_code_writes_between_calls_is_read_after_the_write(how: str, mode: str) -> None:
    """The caller's own code sets a buffer between two forwards of a block (or a pipeline's code between two calls of
    a component): the second forward reads the new value in every mode, 8 x D x D then 2 x D x D. (Fake runs kept the
    values read at the block's start: the second forward was counted at 8 tokens, without a word.)"""
    x = torch.randn(1, 8, D)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "profiler":
            model = Prefix()
            with flopscope.profiler(model, mode=mode) as block:
                model(x)
                model.k.fill_(2)
                model(x)
            prof = block.result
        else:
            prof = flopscope.profile_pipeline(NarrowingPipeline(), mode=mode, x=x)
    assert prof.total() == 8 * D * D + 2 * D * D
