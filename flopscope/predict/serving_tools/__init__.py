"""The analytic tools' FLOPs for a Hugging Face config, and why they differ from
flopscope's count.

Each tool's published formula, reimplemented from its source as facts (the module of
each tool cites the file and commit read), taking a ``config.json`` as a plain dict and
returning the tool's own named terms in FLOPs for a prefill of ``prompt`` tokens and one
decode step on a cache of ``context`` tokens, batch 1 (:meth:`Tool.count`), known
mistakes included. :func:`explain` sets them beside flopscope's MACs by role (doubled)
and names the cause of every difference (:data:`CAUSES`).

Pure arithmetic: no torch, no model.
"""

from __future__ import annotations

from ._tool import CAUSES, Tool, ToolCount
from .eleuther import ELEUTHER
from .explain import Row, explain
from .llm_analysis import LLM_ANALYSIS
from .llm_viewer import LLM_VIEWER
from .megatron import MEGATRON
from .nanogpt import NANOGPT
from .torchtitan import TORCHTITAN
from .vllm_perf import VLLM_PERF

__all__ = ["CAUSES", "ELEUTHER", "LLM_ANALYSIS", "LLM_VIEWER", "MEGATRON", "NANOGPT", "TOOLS", "TORCHTITAN",
           "VLLM_PERF", "Row", "Tool", "ToolCount", "explain"]

TOOLS: dict[str, Tool] = {tool.name: tool for tool in (VLLM_PERF, LLM_VIEWER, LLM_ANALYSIS, NANOGPT, TORCHTITAN,
                                                         MEGATRON, ELEUTHER)}
"""The tools by name, in the order they were written."""
