"""What a notebook shows (flopscope.render.notebook): Profile._repr_html_ and _repr_markdown_, against closed forms."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
import torch
from torch import nn

import flopscope
from flopscope.render.notebook import tree_rows
from flopscope.studies.models import TransformerBlock


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each pipe table of ``text`` as rows of cells (header and rule left out)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]  # (no escaped pipes in these tests)
            if current is None:
                current = []
                tables.append(current)
                continue  # the header
            if not set("".join(cells)) <= set("-:"):
                current.append(cells)
        else:
            current = None
    return tables


class Cells(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.tables: list[list[list[str]]] = []
        self.paragraphs: list[str] = []
        self._where: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "p"):
            self._where = tag
            if tag == "td":
                self.tables[-1][-1].append("")
            else:
                self.paragraphs.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "p"):
            self._where = None

    def handle_data(self, data: str) -> None:
        if self._where == "td":
            self.tables[-1][-1][-1] += data
        elif self._where == "p":
            self.paragraphs[-1] += data


N, D, H, D_FF = 64, 256, 4, 1024
ROLES = {"q_proj": N * D * D, "k_proj": N * D * D, "v_proj": N * D * D, "out_proj": N * D * D,
         "attn_scores": N * N * D, "attn_weighted_sum": N * N * D, "ffn_up": N * D * D_FF, "ffn_down": N * D_FF * D}
TOTAL = N * (4 * D * D + 2 * D * D_FF) + 2 * N * N * D


@pytest.fixture(scope="module")
def block_profile() -> flopscope.Profile:
    return flopscope.profile(TransformerBlock(D, H, D_FF), torch.zeros(1, N, D))


def test_markdown_summary_roles_and_tree(block_profile: flopscope.Profile) -> None:
    text = block_profile._repr_markdown_()
    first = text.splitlines()[0]
    assert first.startswith(f"TransformerBlock: {TOTAL:,} MACs = {2 * TOTAL:,} FLOPs")
    assert "fake mode" in first and "every op counted" in first
    roles, tree = markdown_tables(text)
    assert {row[0]: (int(row[1].replace(",", "")), int(row[2].replace(",", ""))) for row in roles} == {
        role: (macs, 2 * macs) for role, macs in ROLES.items()}
    assert {row[0]: row[3] for row in roles}["ffn_up"] == f"{100 * N * D * D_FF / TOTAL:.1f}%"
    by_label = {row[0]: row for row in tree}
    assert by_label["(model)"][3] == f"{TOTAL:,}" and by_label["(model)"][1] == "TransformerBlock"
    assert by_label["· attention"][3] == f"{4 * N * D * D + 2 * N * N * D:,}"
    assert by_label["· ffn"][3] == f"{2 * N * D * D_FF:,}"
    assert by_label["· · q_proj"][3] == f"{N * D * D:,}" and by_label["· · q_proj"][5] == f"{D * D + D:,}"
    assert by_label["· · down"][6] == "ffn_down"
    assert [row[0] for row in tree][:3] == ["(model)", "· attention", "· · q_proj"]  # parents first, in order


def test_html_holds_the_same_and_no_script(block_profile: flopscope.Profile) -> None:
    parsed = Cells(block_profile._repr_html_())
    assert "script" not in parsed.tags and "style" not in parsed.tags  # safe in any notebook
    assert parsed.paragraphs[0].startswith(f"TransformerBlock: {TOTAL:,} MACs = {2 * TOTAL:,} FLOPs")
    roles, tree = parsed.tables
    assert {row[0]: int(row[1].replace(",", "")) for row in roles[1:]} == ROLES  # (the header row first)
    assert {row[0].strip(): row[3] for row in tree[1:]}["attention"] == f"{4 * N * D * D + 2 * N * N * D:,}"
    markdown_tree = markdown_tables(block_profile._repr_markdown_())[1]
    assert [row[3] for row in tree[1:]] == [row[3] for row in markdown_tree]


def test_numbered_siblings_fold_into_one_row() -> None:
    d = 32
    model = nn.Sequential(nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 2 * d))
    prof = flopscope.profile(model, torch.zeros(4, d))
    rows = tree_rows(prof)
    assert [(r.label, r.times, r.macs) for r in rows] == [
        ("(model)", 1, 3 * 4 * d * d + 4 * d * 2 * d), ("0–2", 3, 4 * d * d), ("3", 1, 4 * d * 2 * d)]


def test_gpt2_layers_fold_and_count_for_all() -> None:
    transformers = pytest.importorskip("transformers")
    L, d, h, V, n = 3, 64, 4, 500, 16
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=L, n_embd=d, n_head=h, vocab_size=V,
                                                                 n_positions=64, bos_token_id=0, eos_token_id=0))
    prof = flopscope.profile(model.eval(), torch.zeros(1, n, dtype=torch.long))
    rows = {r.label: r for r in tree_rows(prof)}
    attention = n * d * 3 * d + n * d * d + 2 * n * n * d  # fused QKV, out, the SDPA core
    layer = attention + 2 * n * d * 4 * d
    assert rows["h.0–2"].times == 3 and rows["h.0–2"].macs == layer  # the ModuleList h opened in place
    assert rows["attn"].times == 3 and rows["attn"].macs == attention
    table = markdown_tables(prof._repr_markdown_())[1]
    attn = next(row for row in table if row[0] == "· · · attn")
    assert attn[2:5] == ["×3", f"{attention:,}", f"{100 * 3 * attention / prof.total():.1f}%"]
    assert rows["lm_head"].macs == n * d * V


def test_phases_in_the_summary() -> None:
    prof = flopscope.profile(nn.Linear(16, 8), torch.zeros(4, 16, requires_grad=True), backward=True)
    first = prof._repr_markdown_().splitlines()[0]
    # forward x·Wᵀ; backward: the input's gradient and the weight's, each the forward's size
    assert f"forward {4 * 16 * 8:,}, backward {2 * 4 * 16 * 8:,}" in first
