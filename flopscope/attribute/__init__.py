"""Layer 4, a role for every multiply, from the captured dataflow (never from module names).

- ``roles``: the role passes and :class:`~flopscope.attribute.roles.Assignment` (``{role: MACs}`` and a block);
- ``graph_view``: the records as a graph, and the one walk helper the passes are written with;
- ``columns``: a fused projection split by the columns each consumer reads;
- ``paths``: module paths (``""`` is the root).

May import: ``flopscope.capture`` (its records), ``flopscope.formulas`` and the vocabulary.
"""
