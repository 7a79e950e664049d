"""The role passes, one module a pass (their order: ``attribute.pipeline.PIPELINE``).

Each module's docstring says what its pass claims and cites docs/roles.md.

- ``family``: by op family, and the weight work after it (sections 3.1, 3.5);
- ``attention``: at softmaxes, at chained activation products and around attention
  kernels (section 3.2), with ``state_products``, the state of chunked linear attention
  (section 3.2.2);
- ``logits``: onto the vocabulary, and the embedding lookups (section 3.3);
- ``ffn``: FFN hidden layers and their vetoes, and the rows asked for (sections 3.4, 4);
- ``low_rank``: low-rank updates, factored projections and output factors (section 3.5);
- ``other``: what is left is ``other``, then the rules (sections 3.6, 3.7).

Private helpers: ``_walks`` (walks several passes share), ``_projections`` (what
attention asks of the projections around it).
"""
