"""The HTML report (flopscope.render.html), opened in a real browser: headless Chromium loads the file, runs its
script and dumps the DOM; the chart's rectangles (data-macs, written by the page's script at render time) are
checked against by_module() and the closed forms, the tables against the queries, and the console must stay silent.

Without a chromium binary the browser tests skip, saying so (CI installs Debian's chromium: .ci/run)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import warnings
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import torch
from torch import nn

import flopscope
from flopscope.cli import main
from flopscope.cli.targets import load_target
from flopscope.render.html import ROLE_COLOURS, report_data
from flopscope.studies.models import TransformerBlock

from closed_forms import add, attention, ffn, rotary, times, total

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                 if (found := shutil.which(name))), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install "
                                                             "chromium; CI's .ci/run installs it)")
WIDTH = 1400  # the window, CSS pixels: the chart is as wide as the page allows


class Dom(HTMLParser):
    """What the tests read from the rendered page: the chart's rects, the body's attributes, each section's table
    cells (section id -> rows of cell texts)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rects: list[dict[str, str]] = []  # the module tree's (drawn by the page's script)
        self.bars: list[dict[str, Any]] = []  # a pipeline's by-step picture: each bar, its "segments" rects in it
        self.shares: list[dict[str, str]] = []  # its by-component bar's segments
        self.components: list[dict[str, str]] = []  # the reconciliation's lines per component (a pipeline's)
        self._in: str = ""  # the id of the picture being read ("chart", "steps-chart", "components-chart")
        self.svg: dict[str, str] = {}  # the module tree's
        self.points: list[dict[str, str]] = []  # the scaling chart's measured points
        self.crossover: dict[str, str] = {}  # its crossover label
        self.groups: list[dict[str, str]] = []  # the reconciliation's groups of identical blocks
        self.ids: set[str] = set()  # of every element
        self.tip = ""  # the tooltip's text
        self._in_tip = False
        self.body: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.text: dict[str, str] = {}  # section id -> its text
        self._section = ""
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if "id" in values:
            self.ids.add(values["id"])
        if values.get("id") in ("chart", "steps-chart", "components-chart"):
            self._in = values["id"]
        if tag == "rect" and self._in == "chart":
            self.rects.append(values)
        elif tag == "rect" and "segment" in values.get("class", "").split():
            (self.bars[-1]["segments"] if self._in == "steps-chart" else self.shares).append(values)
        elif tag == "g" and "bar" in values.get("class", "").split():
            self.bars.append({**values, "segments": []})
        elif tag == "details" and "component" in values.get("class", "").split():
            self.components.append(values)
        elif tag == "body":
            self.body = values
        elif tag == "svg" and self._in == "chart":
            self.svg = values
        elif tag == "details" and "group" in values.get("class", "").split():
            self.groups.append(values)
        elif tag == "circle" and "point" in values.get("class", "").split():
            self.points.append(values)
        elif tag == "text" and values.get("id") == "crossover":
            self.crossover = values
        elif tag == "div" and values.get("id") == "tip":
            self._in_tip = True
        elif tag == "section":
            self._section = values.get("id", "")
        elif tag == "tr":
            self.tables.setdefault(self._section, []).append([])
        elif tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "div":
            self._in_tip = False
        if tag == "svg":
            self._in = ""
        if tag == "td" and self._cell is not None:
            self.tables[self._section][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text[self._section] = self.text.get(self._section, "") + data
        if self._in_tip:
            self.tip += data
        if self._cell is not None:
            self._cell.append(data)

    def nodes(self) -> dict[str, int]:
        """Module path -> MACs of its rect (each module drawn once in these tests)."""
        out: dict[str, int] = {}
        for rect in self.rects:
            if rect.get("class", "").split()[0:1] == ["node"]:
                assert rect["data-path"] not in out, f"{rect['data-path']!r} drawn twice"
                out[rect["data-path"]] = int(rect["data-macs"])
        return out

    def aggregated(self) -> dict[str, int]:
        """Member paths -> MACs of the rects that draw sibling modules too narrow for a rect of their own (one
        rect a run of them: its members joined by "|")."""
        return {rect["data-members"]: int(rect["data-macs"]) for rect in self.rects
                if rect.get("class", "").split()[0:1] == ["agg"]}

    def rows(self, section: str) -> dict[str, list[str]]:
        """First cell -> the row, of the section's table."""
        return {row[0]: row for row in self.tables.get(section, []) if row}


def render(page: Path, tmp_path: Path, width: int = WIDTH, fragment: str = "") -> tuple[Dom, list[str], float]:
    """The DOM after the page's script ran (the address ending in ``#fragment`` if given), the console lines
    Chromium logged, and the wall time of the run."""
    assert CHROMIUM is not None
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={width},900",
               "--enable-logging=stderr", "--v=0", "--dump-dom",
               page.resolve().as_uri() + (f"#{fragment}" if fragment else "")]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]  # console.* and uncaught errors
    return Dom(result.stdout), console, seconds


class Browser:
    """Headless Chromium driven over its DevTools protocol (``--remote-debugging-pipe``: JSON messages ending in NUL
    on file descriptors 3 and 4), for real mouse events: one page, its console and exceptions kept as events."""

    def __init__(self, profile: Path) -> None:
        import fcntl

        assert CHROMIUM is not None
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()

        def child() -> None:  # the pipes onto fds 3 (commands in) and 4 (replies out), by way of free fds above 9
            ours, theirs = fcntl.fcntl(to_read, fcntl.F_DUPFD, 10), fcntl.fcntl(from_write, fcntl.F_DUPFD, 10)
            os.dup2(ours, 3)
            os.dup2(theirs, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             f"--user-data-dir={profile}", f"--window-size={WIDTH},900", "--remote-debugging-pipe", "about:blank"],
            preexec_fn=child, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_read)
        os.close(from_write)
        self._out, self._in = os.fdopen(to_write, "wb", buffering=0), os.fdopen(from_read, "rb", buffering=0)
        self._buffer, self._id, self.events, self._session = b"", 0, [], None

    def send(self, method: str, browser: bool = False, **params: object) -> dict:
        self._id += 1
        message: dict[str, object] = {"id": self._id, "method": method, "params": params}
        if self._session is not None and not browser:
            message["sessionId"] = self._session
        self._out.write(json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = self._in.read(1 << 16)
                assert chunk, "chromium closed its pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply["error"]
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", browser=True, url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", browser=True, targetId=target, flatten=True)["sessionId"]
        self.send("Runtime.enable")
        self.send("Page.enable")
        self.send("Page.setLifecycleEventsEnabled", enabled=True)
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while not self.js("document.readyState === 'complete' && document.body.hasAttribute('data-rendered')"):
            assert time.monotonic() < deadline, "the page did not render"
            time.sleep(0.05)

    def first_paint_ms(self) -> float:
        """Milliseconds from the navigation's start to the page's first contentful paint (Chromium's own events)."""
        deadline = time.monotonic() + 10
        while True:
            events = {e["params"]["name"]: e["params"]["timestamp"] for e in self.events
                      if e.get("method") == "Page.lifecycleEvent" and e["params"]["name"] in ("init",
                                                                                            "firstContentfulPaint")}
            if len(events) == 2:
                return 1000 * (events["firstContentfulPaint"] - events["init"])
            assert time.monotonic() < deadline, "no first contentful paint"
            time.sleep(0.05)
            self.js("0")  # (collects the events that came meanwhile)

    def js(self, expression: str) -> object:
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def centre(self, selector: str, path: str) -> tuple[float, float]:
        """The middle of the element matching ``selector`` whose data-path is ``path``."""
        box = self.js(f"(() => {{ const r = [...document.querySelectorAll({json.dumps(selector)})].find("
                      f"e => e.getAttribute('data-path') === {json.dumps(path)}).getBoundingClientRect();"
                      " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        assert isinstance(box, list)
        return box[0], box[1]

    def mouse(self, kind: str, x: float, y: float) -> None:
        button = {"button": "left", "clickCount": 1} if kind != "mouseMoved" else {}
        self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **button)

    def click(self, x: float, y: float) -> None:
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def troubles(self) -> list[dict]:
        """Exceptions thrown and console messages (the page writes none)."""
        return [e for e in self.events if e.get("method") in ("Runtime.exceptionThrown", "Runtime.consoleAPICalled")]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", browser=True)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def rendered_cleanly(dom: Dom, console: list[str]) -> None:
    assert console == []
    assert "data-error" not in dom.body
    assert int(dom.body["data-rendered"]) == len(dom.rects) > 0


def gpt2(n_layer: int = 2, d: int = 64, h: int = 4, vocab: int = 500) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=d, n_head=h, vocab_size=vocab, n_positions=128,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


# --------------------------------------------------------------------------------------------------
# without a browser: the data and the file
def test_tree_data_is_the_call_tree_by_macs() -> None:
    n, d, h, d_ff = 64, 256, 4, 1024
    prof = flopscope.profile(TransformerBlock(d, h, d_ff), torch.zeros(1, n, d))
    data = report_data(prof)
    tree = {row[1]: row for row in data["tree"]}
    assert {path: row[3] for path, row in tree.items()} == {p: m for p, m in prof.by_module().items() if m}
    projections, core = n * d * d, n * n * d  # each of Q, K, V, out; scores = weighted sum = n²·d
    assert tree[""][3] == n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    assert tree["attention"][3] == 4 * projections + 2 * core
    assert tree["attention"][8] == 2 * core  # its own ops: the attention core, outside the projections
    assert tree["ffn.up"][3] == tree["ffn.down"][3] == n * d * d_ff
    assert tree[""][8] == 0  # the root runs nothing itself
    parents = {row[1]: data["tree"][row[0]][1] for row in data["tree"] if row[0] >= 0}
    assert parents["attention.q_proj"] == "attention" and parents["attention"] == ""
    assert tree["attention.q_proj"][5] == "q_proj" and tree["ffn.down"][5] == "ffn_down"  # dominant roles
    assert tree["attention.q_proj"][4] == d * d + d  # parameters: weight and bias
    assert tree["attention.q_proj"][7] == f"0: 1x{n}x{d}"  # input shapes of the first call


def test_every_role_has_its_colour() -> None:
    assert set(ROLE_COLOURS) == {role.value for role in flopscope.Role}
    assert len(set(ROLE_COLOURS.values())) == len(ROLE_COLOURS)


def test_page_is_self_contained(tmp_path: Path) -> None:
    prof = flopscope.profile(TransformerBlock(128, 4, 512), torch.zeros(1, 32, 128))
    text = prof.to_html(tmp_path / "block.html").read_text()
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) <= {"http://www.w3.org/2000/svg"}  # a namespace, no fetch
    assert not re.search(r"<(link|img|iframe)\b|\bsrc\s*=|@import|url\(", text)
    embedded = re.search(r"<script type=application/json id=data>(.*?)</script>", text, re.S)
    assert embedded is not None and json.loads(embedded.group(1))["macs"] == prof.total()


def test_unwritable_path_is_named(tmp_path: Path) -> None:
    prof = flopscope.profile(TransformerBlock(64, 4, 256), torch.zeros(1, 8, 64))
    with pytest.raises(flopscope.FlopscopeError, match=r"report\.html"):
        prof.to_html(tmp_path / "missing" / "report.html")


def test_cli_html_with_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n, d, d_ff = 128, 512, 2048  # TransformerBlock's defaults: h = 8
    out = tmp_path / "block.html"
    assert main(["profile", "flopscope.studies.models:TransformerBlock", "--input", f"1x{n}x{d}", "--sweep",
                 "64,128,256,512", "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = out.read_text()
    data = json.loads(re.search(r"<script type=application/json id=data>(.*?)</script>", text, re.S).group(1))
    assert data["macs"] == n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    polynomials = {role: poly for role, poly, _, _ in data["scaling"]["rows"]}
    assert polynomials["q_proj"] == f"{d * d:,}·n" and polynomials["ffn_up"] == f"{d * d_ff:,}·n"
    assert polynomials["attn_scores"] == f"{d:,}·n²"
    assert data["scaling"]["lengths"] == [64, 128, 256, 512]
    assert f"<td>{d * d:,}·n</td>" in text  # the table is in the page itself, before any script


@needs_browser
def test_the_scaling_chart_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The seed study's picture: each measured point of the scaling chart is the role's closed form at its length
    (projections n·d², FFN n·d·d_ff, scores and weighted sum n²·d), and the crossover is labelled where
    2·n²·d > n·(4·d² + 2·d·d_ff) first holds: n = 2·d + d_ff + 1; the page logs nothing."""
    d, d_ff, lengths = 512, 2048, (64, 128, 256, 512)  # TransformerBlock's defaults: h = 8
    out = tmp_path / "block.html"
    assert main(["profile", "flopscope.studies.models:TransformerBlock", "--input", f"1x128x{d}", "--sweep",
                 ",".join(map(str, lengths)), "--html", str(out)]) == 0
    capsys.readouterr()
    dom, console, _ = render(out, tmp_path)
    rendered_cleanly(dom, console)
    closed = {"q_proj": lambda n: n * d * d, "k_proj": lambda n: n * d * d, "v_proj": lambda n: n * d * d,
              "out_proj": lambda n: n * d * d, "attn_scores": lambda n: n * n * d,
              "attn_weighted_sum": lambda n: n * n * d, "ffn_up": lambda n: n * d * d_ff,
              "ffn_down": lambda n: n * d * d_ff}
    points = {(p["data-role"], int(p["data-n"])): int(p["data-macs"]) for p in dom.points}
    assert points == {(role, n): form(n) for role, form in closed.items() for n in lengths}
    assert int(dom.crossover["data-n"]) == 2 * d + d_ff + 1
    assert f"from n = {2 * d + d_ff + 1:,}" in dom.text["scaling"]


def test_steps_of_several_forwards() -> None:
    d, h, d_ff = 128, 4, 512
    block = TransformerBlock(d, h, d_ff)
    with flopscope.profiler(block, mode="fake") as recorder:
        block(torch.zeros(1, 16, d))
        block(torch.zeros(1, 48, d))
    data = report_data(recorder.result)
    assert [s["macs"] for s in data["steps"]] == [n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d for n in (16, 48)]


def test_generation_steps_and_decode_polynomials(tmp_path: Path) -> None:
    L, d, h, V, n, new = 2, 64, 4, 500, 8, 4
    model = gpt2(L, d, h, V)
    ids = torch.randint(1, V, (1, n))
    with flopscope.profiler(model, mode="real") as recorder:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0)
    data = report_data(recorder.result)
    body = L * (4 * d * d + 2 * d * 4 * d)  # projections and MLP of one position
    assert [(s["phase"], s["context"]) for s in data["steps"]] == [("prefill", n)] + [
        ("decode", n + k) for k in range(1, new)]
    # generate() takes the logits of the prompt's last position only; a new position scores its c cached ones
    assert [s["macs"] for s in data["steps"]] == [n * body + L * 2 * n * n * d + d * V] + [
        body + L * 2 * (n + k) * d + d * V for k in range(1, new)]
    decode = dict(data["decode"])
    assert decode["q_proj"] == f"{L * d * d:,}" and decode["logits"] == f"{d * V:,}"
    assert decode["attn_scores"] == decode["attn_weighted_sum"] == f"{L * d:,}·c"
    text = recorder.result.to_html(tmp_path / "generate.html").read_text()
    assert "<h2>Generation steps</h2>" in text and f"<td>{L * d:,}·c</td>" in text


def test_reconciliation_reasons_are_in_the_page(tmp_path: Path) -> None:
    class Bare(nn.Module):  # attention without projections: no block whose closed form flopscope knows
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    n, d = 16, 32
    q = torch.zeros(1, n, d)
    prof = flopscope.profile(Bare(), q, q, q)
    rows = prof.reconcile().rows
    assert rows and all(r.predicted is None and r.reason for r in rows)
    dom = Dom(prof.to_html(tmp_path / "bare.html").read_text())  # the tables are the page's own HTML
    shown = [row for row in dom.tables["reconciliation"] if row]  # (header rows have no cells)
    assert [(row[0], row[1], row[2], row[3], row[6]) for row in shown] == [
        (r.role, f"{r.measured:,}", "no prediction", "—", r.reason) for r in rows]
    assert {row[0]: row[1] for row in shown} == {"attn_scores": f"{n * n * d:,}", "attn_weighted_sum": f"{n * n * d:,}"}
    assert f"0 of {len(rows)} rows exactly as predicted" in dom.text["reconciliation"]


def test_a_model_without_macs() -> None:
    prof = flopscope.profile(nn.ReLU(), torch.zeros(4, 4))
    data = report_data(prof)
    assert data["macs"] == 0 and [row[3] for row in data["tree"]] == [0]
    assert "<table>" in prof._repr_html_() and prof._repr_markdown_().startswith("ReLU: 0 MACs = 0 FLOPs")


# --------------------------------------------------------------------------------------------------
# in the browser
@needs_browser
def test_gpt2_report_by_the_cli_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    L, d, h, V, n = 2, 64, 4, 500, 32
    settings = [f"n_layer={L}", f"n_embd={d}", f"n_head={h}", f"vocab_size={V}", "bos_token_id=0", "eos_token_id=0"]
    page = tmp_path / "gpt2.html"
    options = [option for setting in settings for option in ("--set", setting)]
    assert main(["profile", "hf:gpt2/causal-lm", *options, "--input", f"1x{n}", "--mode", "fake", "--html",
                 str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().out
    prof = flopscope.profile(load_target("hf:gpt2/causal-lm", settings).model, torch.zeros(1, n, dtype=torch.long))
    dom, console, _ = render(page, tmp_path)
    rendered_cleanly(dom, console)
    drawn = dom.nodes()
    uncalled = prof.uncalled_modules()  # (the chart is the call tree: a container never called, h, is no node)
    assert drawn == {path: macs for path, macs in prof.by_module().items() if macs and path not in uncalled}
    layer = n * d * 3 * d + n * d * d + 2 * n * n * d + 2 * n * d * 4 * d  # fused QKV, out, core, MLP up / down
    assert drawn[""] == L * layer + n * d * V
    assert drawn["lm_head"] == n * d * V
    for i in range(L):
        assert drawn[f"transformer.h.{i}.attn.c_attn"] == n * d * 3 * d  # Conv1D: an addmm
        assert drawn[f"transformer.h.{i}.mlp.c_fc"] == n * d * 4 * d
    own = {r["data-path"]: int(r["data-macs"]) for r in dom.rects if r.get("class") == "self"}
    assert own == {f"transformer.h.{i}.attn": 2 * n * n * d for i in range(L)}  # SDPA inside GPT2Attention
    assert not [r for r in dom.rects if r.get("class") == "agg"]  # every module wide enough at this width
    roles = dom.rows("roles")
    assert roles["q_proj"][1:3] == [f"{L * n * d * d:,}", f"{2 * L * n * d * d:,}"]
    assert roles["logits"][1] == f"{n * d * V:,}"
    reconciliation = [row for row in dom.tables["reconciliation"] if row]  # one block's rows per group
    assert [(g["data-pattern"], int(g["data-count"])) for g in dom.groups] == [
        ("transformer.h.*.attn", L), ("transformer.h.*.mlp", L), ("lm_head", 1)]
    assert len(reconciliation) == 6 + 2 + 1 and len(prof.reconcile().rows) == L * (6 + 2) + 1  # (roles per block)
    assert all(row[3] == "1" for row in reconciliation)
    assert prof.unsupported() == {} and "None: every op that ran has a formula" in dom.text["unsupported"]


@needs_browser
def test_narrow_modules_are_aggregated_in_chromium(tmp_path: Path) -> None:
    n, d, tiny = 64, 1024, 200

    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.Linear(d, d, bias=False)
            self.small = nn.ModuleList(nn.Linear(1, 1, bias=False) for _ in range(tiny))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.big(x)
            for layer in self.small:
                y = y + layer(x[..., :1])
            return y

    prof = flopscope.profile(Wide(), torch.zeros(1, n, d))
    dom, console, _ = render(prof.to_html(tmp_path / "wide.html"), tmp_path)
    rendered_cleanly(dom, console)
    assert dom.nodes() == {"": n * d * d + tiny * n, "big": n * d * d}  # n·1·1 each: far below a pixel
    (aggregate,) = [r for r in dom.rects if r.get("class") == "agg"]
    assert aggregate["data-members"].split("|") == [f"small.{i}" for i in range(tiny)]
    assert int(aggregate["data-macs"]) == tiny * n == sum(prof.by_module()[f"small.{i}"] for i in range(tiny))


@needs_browser
def test_ledger_in_chromium(tmp_path: Path) -> None:
    class Inverts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.linalg.inv(self.proj(x))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", flopscope.FlopscopeWarning)
        prof = flopscope.profile(Inverts(), torch.zeros(16, 16))
    dom, console, _ = render(prof.to_html(tmp_path / "inverts.html"), tmp_path)
    rendered_cleanly(dom, console)
    assert dom.nodes() == {"": 16 * 16 * 16, "proj": 16 * 16 * 16}
    ledger = dom.rows("unsupported")
    assert {op: int(row[1]) for op, row in ledger.items()} == prof.unsupported()
    assert "aten.linalg_inv_ex" in ledger


LLAMA_2_7B = {  # the published config.json of Llama-2-7b (the 7B shape): 32 layers, d 4096, 32 heads, d_ff 11008
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "torch_dtype": "float16", "tie_word_embeddings": False}


@needs_browser
def test_llama_7b_report_by_the_cli_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 7B shape from its config.json, built on meta by the CLI (nothing allocated): the page stays small and
    draws fast, every rectangle at its module's MACs."""
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_2_7B))
    L, d, h, d_ff, V, n = 32, 4096, 32, 11008, 32000, 2048
    page = tmp_path / "llama7b.html"
    assert main(["profile", str(config), "--input", f"1x{n}", "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().out
    size = page.stat().st_size
    assert size < 2_000_000, f"{size:,} bytes"
    dom, console, seconds = render(page, tmp_path)
    rendered_cleanly(dom, console)
    assert float(dom.body["data-render-ms"]) < 1000  # the page's script: JSON parsed, chart drawn
    assert float(dom.body["data-drawn-ms"]) < 1000  # from navigation start: page read, tables parsed, chart drawn
    drawn = dom.nodes()
    layer = add(attention(1, n, n, d, h), ffn(1, n, d, d_ff, gated=True))
    assert drawn[""] == total(add(times(L, layer), {"logits": n * d * V}, rotary(n, d // h)))
    assert drawn["lm_head"] == n * d * V
    for i in range(L):
        assert drawn[f"model.layers.{i}.self_attn.q_proj"] == n * d * d
        assert drawn[f"model.layers.{i}.mlp.down_proj"] == n * d_ff * d
    target = load_target(str(config))  # the same model once more, on meta: every module as by_module() has it
    prof = flopscope.profile(target.model, torch.zeros(1, n, dtype=torch.long, device="meta"))
    uncalled = prof.uncalled_modules()  # (containers, model.layers: no node of the call tree)
    by_module = {path: macs for path, macs in prof.by_module().items() if macs and path not in uncalled}
    runs = dom.aggregated()  # modules under a pixel wide (the rotary angles' matmul, where it is one: 131,072 MACs)
    assert {path: macs for path, macs in by_module.items() if path in drawn} == drawn
    assert {members: sum(by_module[m] for m in members.split("|")) for members in runs} == runs
    hidden = {m for members in runs for m in members.split("|")}
    assert all(path in drawn or any(path == m or path.startswith(m + ".") for m in hidden) for path in by_module)
    assert seconds < 20
    # the reconciliation at a glance: one group per block type, the 32 layers' identical blocks each one group
    assert [(g["data-pattern"], int(g["data-count"])) for g in dom.groups] == [
        ("model.layers.*.self_attn", L), ("model.layers.*.mlp", L), ("lm_head", 1)]
    assert f"model.layers.0–{L - 1}.self_attn" in dom.text["reconciliation"]
    rows = [row for row in dom.tables["reconciliation"] if row]
    assert [row[0] for row in rows] == ["q_proj", "k_proj", "v_proj", "attn_scores", "attn_weighted_sum", "out_proj",
                                        "ffn_up", "ffn_gate", "ffn_down", "logits"]
    assert rows[0][1] == f"{n * d * d:,}" and all(row[3] == "1" for row in rows)
    assert len(prof.reconcile().rows) == L * 9 + 1
    formulas = dom.rows("formulas")  # per token against the published formulas, each difference explained
    assert [row[0] for row in prof.model_formulas().cells()] == list(formulas) and len(formulas) == 4
    assert all(row[2] == f"{float(prof.model_formulas().measured):,.0f}" for row in formulas.values())
    browser = Browser(tmp_path / "chromium-pipe-profile")
    try:
        browser.open(page.resolve().as_uri())
        assert browser.first_paint_ms() < 1000  # Chromium's firstContentfulPaint, from the navigation's start
        shown = "document.querySelector('details.group table').checkVisibility()"
        assert browser.js(shown) is False  # closed: the rows hidden
        browser.js("document.querySelector('details.group').open = true")
        assert browser.js(shown) is True  # opened: the attention block's six rows
        assert browser.troubles() == []
    finally:
        browser.close()


@needs_browser
def test_names_that_look_like_markup_stay_names_in_chromium(tmp_path: Path) -> None:
    odd = "</script><b id=x>&amp;\"'"  # a ModuleDict key may hold anything but a dot
    model = nn.ModuleDict({odd: nn.Linear(8, 4, bias=False)})
    model.forward = lambda x: model[odd](x)  # type: ignore[method-assign]
    prof = flopscope.profile(model, torch.zeros(2, 8))
    dom, console, _ = render(prof.to_html(tmp_path / "odd.html"), tmp_path, fragment=f"tip={quote(odd)}")
    rendered_cleanly(dom, console)
    assert dom.nodes() == {"": 2 * 8 * 4, odd: 2 * 8 * 4}
    assert odd in dom.tip and "x" not in dom.ids and {"chart", "tip", "data"} <= dom.ids  # no element made of it


@needs_browser
def test_phases_in_the_details_in_chromium(tmp_path: Path) -> None:
    n, d, d_h = 16, 32, 64
    model = nn.Sequential(nn.Linear(d, d_h, bias=False), nn.Sequential(nn.Linear(d_h, d, bias=False)))
    x = torch.zeros(n, d, requires_grad=True)  # every operand needs its gradient: backward = 2 x forward
    prof = flopscope.profile(model, x, backward=True)
    dom, console, _ = render(prof.to_html(tmp_path / "backward.html"), tmp_path, fragment="tip=1")
    rendered_cleanly(dom, console)
    forward = n * d_h * d  # the inner Linear's
    assert dom.nodes() == {"": 3 * 2 * forward, "0": 3 * forward, "1": 3 * forward, "1.0": 3 * forward}
    assert f"forward {forward:,} · backward {2 * forward:,} MACs" in dom.tip
    assert "every phase together (forward, backward)" in dom.text["chart-section"]


@needs_browser
def test_counts_beyond_2_to_the_53_stay_exact_in_chromium(tmp_path: Path) -> None:
    """A JSON number is a double: past 2^53 the page gets MACs as digits, and draws and prints them exactly."""
    B, n, d = 3, 2**21 + 1, 65537  # odd, past 2^53: no double holds it (on meta: nothing is allocated)
    prof = flopscope.profile(nn.Linear(d, d, bias=False, device="meta"), torch.zeros(B, n, d, device="meta"))
    expected = B * n * d * d
    assert prof.total() == expected and float(expected) != expected  # a double would round it
    dom, console, _ = render(prof.to_html(tmp_path / "huge.html"), tmp_path, fragment="tip=")
    rendered_cleanly(dom, console)
    assert dom.nodes() == {"": expected}
    assert f"{expected:,} MACs" in dom.tip and f"{2 * expected:,} FLOPs" in dom.tip


@needs_browser
def test_zoom_and_details_from_the_address_in_chromium(tmp_path: Path) -> None:
    L, d, h, V, n = 2, 64, 4, 500, 32
    prof = flopscope.profile(gpt2(L, d, h, V), torch.zeros(1, n, dtype=torch.long))
    page = prof.to_html(tmp_path / "gpt2.html")
    dom, console, _ = render(page, tmp_path, fragment="focus=transformer.h.1&tip=transformer.h.1.attn")
    rendered_cleanly(dom, console)
    assert dom.svg["data-focus"] == "transformer.h.1"
    drawn = dom.nodes()  # the ancestors, then the zoomed module's subtree only
    inside = {path for path, macs in prof.by_module().items() if path.startswith("transformer.h.1.") and macs}
    assert set(drawn) == {"", "transformer", "transformer.h.1"} | inside
    ancestors = [r["data-path"] for r in dom.rects if "ancestor" in r.get("class", "")]
    assert ancestors == ["", "transformer"]
    widths = {r["data-path"]: float(r["width"]) for r in dom.rects if r.get("class", "").startswith("node")}
    assert widths["transformer.h.1"] == pytest.approx(widths[""], abs=0.01)  # the zoomed module fills the width
    attention = n * d * 3 * d + n * d * d + 2 * n * n * d
    assert widths["transformer.h.1.attn"] == pytest.approx(widths[""] * attention / drawn["transformer.h.1"], abs=0.02)
    params = 3 * d * d + 3 * d + d * d + d  # c_attn and c_proj, weights and biases
    for shown in ("transformer.h.1.attn", "GPT2Attention", f"{attention:,} MACs", f"{2 * attention:,} FLOPs",
                  f"share {100 * attention / prof.total():.2f}% of the total", f"parameters {params:,}",
                  "dominant role q_proj", f"0: 1x{n}x{d}"):
        assert shown in dom.tip


@needs_browser
def test_hover_and_click_with_real_mouse_events_in_chromium(tmp_path: Path) -> None:
    L, d, h, V, n = 2, 64, 4, 500, 32
    prof = flopscope.profile(gpt2(L, d, h, V), torch.zeros(1, n, dtype=torch.long))
    page = prof.to_html(tmp_path / "gpt2.html")
    browser = Browser(tmp_path / "chromium-profile")
    try:
        browser.open(page.resolve().as_uri())
        attention = n * d * 3 * d + n * d * d + 2 * n * n * d
        browser.mouse("mouseMoved", *browser.centre("rect.node", "transformer.h.1.attn"))
        tip = browser.js("(t => t.style.display + '|' + t.textContent)(document.getElementById('tip'))")
        assert isinstance(tip, str) and tip.startswith("block|transformer.h.1.attn GPT2Attention")
        assert f"{attention:,} MACs" in tip and f"{2 * attention:,} FLOPs" in tip
        browser.mouse("mouseMoved", 2, 2)  # off the chart: the details go
        assert browser.js("document.getElementById('tip').style.display") == "none"
        focus = "document.querySelector('#chart svg').getAttribute('data-focus')"
        browser.click(*browser.centre("rect.node", "transformer.h.1"))  # zoom in
        assert browser.js(focus) == "transformer.h.1"
        width = browser.js("document.querySelector('#chart svg').getAttribute('width')")
        zoomed = browser.js("[...document.querySelectorAll('rect.node')].find(r => r.getAttribute('data-path') === "
                            "'transformer.h.1').getAttribute('width')")
        assert float(str(zoomed)) == pytest.approx(float(str(width)), abs=0.01)
        browser.click(*browser.centre("rect.node", "transformer"))  # an ancestor: zoom out to it
        assert browser.js(focus) == "transformer"
        browser.js("document.getElementById('reset').click()")
        assert browser.js(focus) == ""
        assert browser.troubles() == []
    finally:
        browser.close()


# --------------------------------------------------------------------------------------------------
# a diffusion pipeline's page
STEPS = 4  # denoising steps of the tiny Stable Diffusion call


def tiny_stable_diffusion(folder: Path) -> tuple[Any, dict[str, int]]:
    """A tiny Stable Diffusion pipeline built from configs (a prompt through a CLIP tokenizer of a tiny vocabulary
    written here: no download) called for STEPS steps with guidance by batch, and each component's MACs as its
    calls of it profiled alone on the inputs it received: the text encoder on the prompt and the empty negative
    prompt (77 tokens each), the UNet once per step on the doubled batch, the VAE decoder once."""
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    from test_pipeline import D_TEXT, SIDE, TEXT, Decode, alone, clip_tokenizer, count, sd_components

    pipe = diffusers.StableDiffusionPipeline(tokenizer=clip_tokenizer(folder / "clip"), **sd_components())
    torch.manual_seed(0)
    prof = count(pipe, prompt="abc", num_inference_steps=STEPS, guidance_scale=7.5, height=SIDE, width=SIDE)
    latent = SIDE // 2
    return prof, {"text_encoder": alone(pipe.text_encoder, torch.zeros(1, TEXT, dtype=torch.long)),
                  "unet": alone(pipe.unet, torch.randn(2, 4, latent, latent), torch.tensor(10),
                                torch.randn(2, TEXT, D_TEXT)),
                  "vae": alone(Decode(pipe.vae), torch.randn(1, 4, latent, latent))}


def test_a_pipeline_tree_has_one_root_with_every_component_below_it(tmp_path: Path) -> None:
    """The pipeline's container is never called and the VAE runs through vae.decode, not its forward: the chart's
    tree still has one root, the pipeline, holding the whole call, each component a child of it with its MACs, and
    vae.decoder below vae."""
    prof, one = tiny_stable_diffusion(tmp_path)
    macs = {"text_encoder": 2 * one["text_encoder"], "unet": STEPS * one["unet"], "vae": one["vae"]}
    assert prof.by_component() == {"vae": macs["vae"], "text_encoder": macs["text_encoder"], "unet": macs["unet"]}
    data = report_data(prof.profile)
    tree = data["tree"]
    assert [row[1] for row in tree if row[0] == -1] == [""]
    assert tree[0][3] == sum(macs.values()) == prof.total()
    children = {row[1]: row[3] for row in tree if row[0] == 0}
    assert children == macs  # in the order they ran: the prompt, the steps, the decode
    assert list(children) == ["text_encoder", "unet", "vae"]
    parents = {row[1]: tree[row[0]][1] for row in tree if row[0] >= 0}
    assert parents["vae.decoder"] == "vae" and parents["unet.conv_in"] == "unet"
    before, after = prof.around_steps()
    assert before == {"text_encoder": macs["text_encoder"]} and after == {"vae": macs["vae"]}


@needs_browser
def test_a_pipeline_report_in_chromium(tmp_path: Path) -> None:
    """The page of a diffusion pipeline's call: the module tree rooted at the pipeline, every component reached by
    clicking down from it (and every module with MACs drawn at some zoom); the call by component; the by-step picture
    with one bar per step at the UNet's MACs per call, the prompt's encoding before and the decode after, the bars
    adding up to the total and drawn at heights in proportion; the reconciliation grouped by component."""
    prof, one = tiny_stable_diffusion(tmp_path)
    macs = {"text_encoder": 2 * one["text_encoder"], "unet": STEPS * one["unet"], "vae": one["vae"]}
    total = sum(macs.values())
    assert prof.total() == total
    page = prof.to_html(tmp_path / "sd.html")
    dom, console, _ = render(page, tmp_path)
    rendered_cleanly(dom, console)
    drawn = dom.nodes()
    assert drawn[""] == total and {c: drawn[c] for c in macs} == macs
    assert "StableDiffusionPipeline" in dom.text[""]  # the title
    # the call by component, and by part of the call: before the steps, one bar per step, after the steps
    assert {s["data-component"]: int(s["data-macs"]) for s in dom.shares} == macs
    assert [(b["data-kind"], b.get("data-step")) for b in dom.bars] == [
        ("before", None), *[("step", str(i)) for i in range(STEPS)], ("after", None)]
    assert [int(b["data-macs"]) for b in dom.bars] == [macs["text_encoder"], *[one["unet"]] * STEPS, macs["vae"]]
    assert [{s["data-component"]: int(s["data-macs"]) for s in b["segments"]} for b in dom.bars] == [
        {"text_encoder": macs["text_encoder"]}, *[{"unet": one["unet"]}] * STEPS, {"vae": macs["vae"]}]
    assert sum(int(b["data-macs"]) for b in dom.bars) == total
    heights = [sum(float(s["height"]) for s in b["segments"]) for b in dom.bars]
    assert heights[1:-1] == [heights[1]] * STEPS
    assert heights[-1] / heights[1] == pytest.approx(macs["vae"] / one["unet"], rel=1e-3)
    assert f"{STEPS} steps × " in dom.text["call"] and "FLOPs = 2 × MACs" in dom.text["call"]
    steps = dom.rows("pipeline")[f"0–{STEPS - 1}"]  # the steps' table: one row for the run of identical steps
    assert steps[1:5] == [str(STEPS), f"{one['unet']:,}", f"{one['unet']:,}", f"{macs['unet']:,}"]
    # the reconciliation by component, identical blocks grouped (the text encoder's two layers are one group)
    assert [c["data-component"] for c in dom.components] == ["text_encoder", "unet", "vae"]
    patterns = {g["data-pattern"]: int(g["data-count"]) for g in dom.groups}
    assert patterns["text_encoder.encoder.layers.*.self_attn"] == patterns["text_encoder.encoder.layers.*.mlp"] == 2
    assert sum(int(g["data-count"]) for g in dom.groups) == len({r.block for r in prof.reconcile().rows})
    # every component reached by clicking down from the pipeline; every module with MACs drawn at some zoom
    uncalled = prof.uncalled_modules()  # (containers such as unet.down_blocks: no node of the call tree)
    with_macs = {path for path, m in prof.by_module().items() if m and path not in uncalled}
    browser = Browser(tmp_path / "chromium-pipe-profile")
    try:
        browser.open(page.resolve().as_uri())
        focus = "document.querySelector('#chart svg').getAttribute('data-focus')"
        nodes = "[...document.querySelectorAll('#chart rect.node')].map(r => r.getAttribute('data-path'))"
        runs = "[...document.querySelectorAll('#chart rect.agg')].map(r => r.getAttribute('data-members'))"
        drawn_somewhere: set[str] = set()
        hidden: set[str] = set()  # too narrow for a rect of their own: in a run of neighbours' rect
        for component in macs:
            browser.js("document.getElementById('reset').click()")
            browser.click(*browser.centre("rect.node", component))
            assert browser.js(focus) == component
            shown, narrow = browser.js(nodes), browser.js(runs)
            assert isinstance(shown, list) and isinstance(narrow, list)
            drawn_somewhere |= set(shown)
            hidden |= {path for members in narrow for path in members.split("|")}
        assert all(path in drawn_somewhere or any(path == m or path.startswith(m + ".") for m in hidden)
                   for path in with_macs)
        assert len(drawn_somewhere) > len(hidden)
        browser.js("location.hash = 'focus=vae'")  # the components' links in the table: zoom into one
        deadline = time.monotonic() + 5
        while browser.js(focus) != "vae":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert browser.troubles() == []
    finally:
        browser.close()
