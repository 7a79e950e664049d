"""Layer 5, closed forms and conventions over data: records, roles and the model's
declared facts, never a ``Profile`` (the façade calls these and caches their
results).

- ``attention``: the attention core's pairs under the ``executed`` / ``causal`` /
  ``mask`` conventions;
- ``reconcile``: measured MACs per block and role against the closed forms;
  ``model_formulas``: against Kaplan, Chinchilla, Megatron-LM and PaLM; ``timing``: wall
  time per role and module (real mode).

May import: ``flopscope.attribute``, ``flopscope.capture``, ``flopscope.formulas`` and
the vocabulary.
"""
