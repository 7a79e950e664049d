"""Layer 6, a result written for people: self-contained HTML, notebook views,
flame-graph files, from a profile's data (this layer never imports the façade; the
façade calls it).

- ``html``: the HTML report (with ``html.js`` and ``html.css``, inlined);
  ``scaling_chart``: its scaling picture, an inline SVG; ``diff_page``: the page of
  ``flopscope diff``; ``notebook``: Jupyter's views;
- ``flame``: folded stacks and speedscope files; ``module_stats``: per-module figures
  from plain data;
- ``files``: writing a file all or nothing.

May import: ``flopscope.predict``, ``flopscope.attribute``, ``flopscope.capture``,
``flopscope.formulas`` and the vocabulary.
"""
