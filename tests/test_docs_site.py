"""The documentation site as a reader sees it: built by mkdocs (strictly, as .ci/run builds it) and read back
from its HTML.

- Every line of every code block fits the page: 88 characters. Two kinds are left out, each held elsewhere:
  ``diff`` blocks, a patch that must show the source's lines as they are (ruff's 120); and the API pages, which
  are the docstrings (ruff's doc-line-length).
- Every page of the guide opens with an example: the first thing under its title is a code block or a picture.
  ``tests/test_examples.py`` runs each opening example and compares what it prints.
- No paragraph of the guide, nor item of a list, is longer than 80 words.
"""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 88  # characters in a line of a code block: what the page shows without scrolling sideways
WORDS = 80  # words in a paragraph or a list item of the guide
GUIDE = ("guide", "examples")  # the guide's pages in the built site: guide/<page>/, examples/
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Element:
    """An HTML element: its tag, attributes, parent and children (elements and text)."""

    def __init__(self, tag: str, attributes: dict[str, str | None], parent: Element | None) -> None:
        self.tag, self.attributes, self.parent = tag, attributes, parent
        self.children: list[Element | str] = []

    def text(self, leave_out: tuple[str, ...] = ()) -> str:
        return "".join(child if isinstance(child, str) else "" if child.tag in leave_out else child.text(leave_out)
                       for child in self.children)

    def elements(self) -> list[Element]:
        return [child for child in self.children if isinstance(child, Element)]

    def walk(self):
        yield self
        for child in self.elements():
            yield from child.walk()

    def classes(self) -> set[str]:
        return set((self.attributes.get("class") or "").split())

    def inside(self, css_class: str) -> bool:
        element: Element | None = self
        while element is not None:
            if css_class in element.classes():
                return True
            element = element.parent
        return False


class Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.current = Element("document", {}, None)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs), self.current)
        self.current.children.append(element)
        if tag not in VOID:
            self.current = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Element(tag, dict(attrs), self.current))

    def handle_endtag(self, tag: str) -> None:
        element: Element | None = self.current
        while element is not None and element.tag != tag:
            element = element.parent
        if element is not None and element.parent is not None:
            self.current = element.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)


def article(page: Path) -> Element:
    """The page's content: Material's ``<article>``, without the navigation around it."""
    tree = Tree()
    tree.feed(page.read_text(encoding="utf-8"))
    return next(element for element in tree.root.walk() if element.tag == "article")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Element]:
    """Every page of the built site, by its folder ("guide/use", "roles", "" for the home page)."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the site needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("transformers", reason="the site's build makes its example report with transformers")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    pages = {page.parent.relative_to(out).as_posix().strip("."): article(page)
             for page in sorted(out.rglob("index.html")) if page.parent.name not in ("search", "assets")}
    assert {"guide/use", "examples", "roles"} <= set(pages)
    return pages


def guide(site: dict[str, Element]) -> dict[str, Element]:
    return {name: page for name, page in site.items() if name.split("/")[0] in GUIDE}


def test_every_line_of_every_code_block_fits_the_page(site):
    wide = [f"{name or 'index'}: {len(line)} characters: {line}"
            for name, page in site.items() if not name.startswith("api/")
            for block in page.walk() if block.tag == "pre" and not block.inside("language-diff")
            for line in block.text().splitlines() if len(line) > WIDTH]
    assert not wide, "\n".join(wide)


def test_every_guide_page_opens_with_an_example(site):
    """The first element after the title: a code block, a picture, or an admonition holding one."""

    def shows(element: Element) -> bool:
        if "highlight" in element.classes() or element.tag in ("pre", "img", "figure"):
            return True
        if element.tag == "p":  # a picture alone in its paragraph
            return [e.tag for e in element.elements()] == ["img"] and not element.text().strip()
        return "admonition" in element.classes() and any(shows(e) for e in element.elements())

    pages = guide(site)
    assert len(pages) >= 14
    openings = {}
    for name, page in pages.items():
        elements = page.elements()
        title = next(i for i, element in enumerate(elements) if element.tag == "h1")
        openings[name] = elements[title + 1] if title + 1 < len(elements) else None
    plain = {name: opening.tag if opening is not None else None
             for name, opening in openings.items() if opening is None or not shows(opening)}
    assert not plain, f"pages that open with prose, not an example: {plain}"


def test_the_guide_paragraphs_are_short(site):
    long = [f"{name}: {len(words)} words: {' '.join(words[:12])} ..."
            for name, page in guide(site).items()
            for element in page.walk() if element.tag in ("p", "li")
            for words in [element.text(leave_out=("ul", "ol", "p", "div", "pre")).split()] if len(words) > WORDS]
    assert not long, "\n".join(long)
