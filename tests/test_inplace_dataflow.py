"""The dataflow is single-assignment: a write into a tensor (an in-place op, a copy into a slice or a view, an
``out=`` op) becomes an input of every later read of its storage, so roles found from the dataflow see values
assembled in place (DeepSeek-V3's keys, a buffer filled by columns, a view taken before the write)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope.capture.records import captured

B, n, d, h = 2, 8, 32, 4
dh = d // h


def by_role(model: nn.Module, x: torch.Tensor, mode: str) -> dict[str, int]:
    with torch.no_grad():
        prof = flopscope.profile(model.eval(), x, mode=mode)
    roles = prof.by_role()
    assert sum(roles.values()) == prof.total()
    return {role: macs for role, macs in roles.items() if macs}


def heads(t: torch.Tensor) -> torch.Tensor:
    return t.view(B, n, h, -1).transpose(1, 2)


class KeysAssembledInPlace(nn.Module):
    """The key of each head is two pieces written into an empty tensor by slices (DeepSeek-V3's MLA:
    ``key[..., :nope].copy_(k_nope); key[..., nope:].copy_(k_rope)``), the second piece from its own projection."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(d, 2 * d, bias=False)
        self.k_first = nn.Linear(d, d, bias=False)
        self.k_second = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = heads(self.q(x))
        first, second = heads(self.k_first(x)), heads(self.k_second(x))
        key = first.new_empty(B, h, n, 2 * dh)
        key[..., :dh].copy_(first)
        key[..., dh:].copy_(second)
        out = F.scaled_dot_product_attention(q, key, heads(self.v(x)))
        return self.o(out.transpose(1, 2).reshape(B, n, d))


class ValuesThroughAViewTakenBeforeTheWrite(nn.Module):
    """The values are read through a view made before the buffer it views was filled in place, and the keys
    through an ``out=`` product into a preallocated buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Parameter(torch.randn(d, d) / d)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buffer = x.new_zeros(B, n, d)
        per_head = buffer.view(B, n, h, dh)  # taken before the write
        buffer.copy_(self.v(x))
        keys = x.new_empty(B * n, d)
        keys_by_head = keys.view(B, n, h, dh)
        torch.mm(x.reshape(B * n, d), self.k, out=keys)
        out = F.scaled_dot_product_attention(heads(self.q(x)), keys_by_head.transpose(1, 2),
                                             per_head.transpose(1, 2))
        return self.o(out.transpose(1, 2).reshape(B, n, d))


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_keys_assembled_in_place_are_keys(mode: str) -> None:
    """Before the version records, only the last copy's producer was seen behind the key: k_first was other."""
    roles = by_role(KeysAssembledInPlace(), torch.randn(B, n, d), mode)
    assert roles == {"q_proj": B * n * d * 2 * d, "k_proj": 2 * B * n * d * d, "v_proj": B * n * d * d,
                     "out_proj": B * n * d * d, "attn_scores": B * h * n * n * 2 * dh,
                     "attn_weighted_sum": B * h * n * n * dh}


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_a_view_taken_before_a_write_reads_what_was_written(mode: str) -> None:
    roles = by_role(ValuesThroughAViewTakenBeforeTheWrite(), torch.randn(B, n, d), mode)
    projection = B * n * d * d
    assert roles == {"q_proj": projection, "k_proj": projection, "v_proj": projection, "out_proj": projection,
                     "attn_scores": B * h * n * n * dh, "attn_weighted_sum": B * h * n * n * dh}


def test_a_version_record_names_the_write_and_the_value_before_it() -> None:
    """Each read of a written storage takes one record ``after_write(before, write)``: the graph says what was
    written, into what, and the totals do not change (it runs nothing)."""
    prof = flopscope.profile(KeysAssembledInPlace(), torch.randn(B, n, d), mode="real")
    ops = [captured(node) for node in prof.graph.nodes]
    versions = [op for op in ops if op.op_name == "flopscope.after_write"]
    writes = [op for op in ops if op.op_name == "aten.copy_"]
    assert len(writes) == 2
    assert {v.args[1] for v in versions} == set(writes)
    assert all(v.macs == 0 and v.output_shapes == ((B, h, n, 2 * dh),) for v in versions if v.args[1] is writes[1])
    last = [v for v in versions if v.args[1] is writes[1]]
    assert last and all(v.users for v in last)  # the attention reads the key after the second write
