"""The role passes in the order they run: :data:`PIPELINE`, one tuple.

Roles come from the dataflow of the captured graph, never from module names: each pass
reads a :class:`~flopscope.attribute.graph_view.GraphView` and claims multiplies through
a :class:`~flopscope.attribute.state.RoleState`. A pass claims only multiplies that no
earlier pass claimed. The projections a pass asks for are settled (split by columns
where several roles want one projection) before the next pass starts. Definitions:
docs/roles.md.

1. **by family**: fused kernels (SDPA, the ``nn.MultiheadAttention`` /
   ``nn.TransformerEncoderLayer`` fast paths, recurrent kernels) keep their formula's
   parts; convolutions are ``conv``, Fourier transforms ``token_mixing``.
2. **attention**: a softmax whose nearest multiply behind it multiplies two activations
   is attention, and so are two chained activation products without one (the linear
   form); the projections nearest to the query, key and value operands and after the
   output are asked for.
3. **logits**: a weight matmul whose weight is an embedding table (tied) or has its
   shape.
4. **FFN**: a weight matmul whose input passes an activation from nearer weight matmuls
   is ``ffn_down``, those are ``ffn_up`` / ``ffn_gate``; position-wise only. A down
   projection reading a concatenation is judged per part and split by rows.
5. **low-rank updates and factors**: a weight-matmul chain from a projection's input
   added to its output (LoRA's ``B·A``) takes the projection's roles; so does a weight
   matmul only attention projections read (MLA's latents).
6. everything left is ``other``;
7. **rules**: built in, every multiply inside an ``nn.RNNBase`` / ``nn.RNNCellBase`` is
   ``recurrent``; then the user's rules, which win.

Which ops are matmuls (and where their operands are), convolutions or attention kernels
comes from the formula registry (:class:`~flopscope.formulas.registry.OpFamily`), so a
new op is found once it is registered.
"""

from __future__ import annotations

from .passes.attention import attention
from .passes.family import by_family, weight_work
from .passes.ffn import concatenated_inputs, ffn
from .passes.logits import logits
from .passes.low_rank import factored_projections, low_rank_updates, output_factors
from .passes.other import builtin_rules, unclaimed_are_other, user_rules
from .state import Pass

PIPELINE: tuple[Pass, ...] = (
    by_family,
    builtin_rules,
    weight_work,
    attention,
    logits,
    ffn,
    concatenated_inputs,
    low_rank_updates,
    factored_projections,
    output_factors,
    unclaimed_are_other,
    builtin_rules,
    user_rules,
)
"""The passes, in the order they run; the column demands are settled after each.

Order matters: each pass claims only multiplies no earlier pass claimed.

- The built-in rules also run right after the first pass. An unfused LSTM (on meta, or
  with projections) gates its state with products of activations, which the FFN pass
  would read as a gated FFN feeding the projection after the LSTM.
- Logits (a weight matmul onto the vocabulary, often behind an activation) are found
  before the FFN pass could take them for a down projection.
- Rows asked for are settled after the FFN pass (``concatenated_inputs``): attention and
  the FFN each ask for their part of a parallel block's ``proj_out``.
- Low-rank updates follow, once every projection they extend is known.
- Factored projections come after the FFN pass, so that the FFN down projection that
  ends an encoder (whose output only the decoder's key / value projections read) stays
  ``ffn_down``.
- The rules come last: the built-in ones again, then the user's, which win.
"""
