"""Layer 11, the command line: ``flopscope profile | generate | pipeline | ...`` (``main``), and the targets it resolves
(``hf:``, ``timm:``, config files, ``module:factory``) in ``targets``.

May import: every layer.
"""

from .main import main

__all__ = ["main"]
