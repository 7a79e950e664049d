"""A custom block that dataflow alone names wrongly, and a user rule that names it.

MLP-Mixer's token-mixing MLP is two weight matmuls around an activation, applied along
the sequence axis: to dataflow it is an FFN (``ffn_up`` / ``ffn_down``), but it mixes
positions, as attention does, not channels. A ``RoleRule`` (module pattern or type ->
role) says what it is; user rules apply after dataflow and win.

    python examples/custom_block_rule.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope import Role, RoleRule


class MixerBlock(nn.Module):
    """Token mixing (an MLP over the ``n`` positions of each channel), then channel
    mixing (an MLP over ``d``)."""

    def __init__(self, n: int, d: int, token_hidden: int) -> None:
        super().__init__()
        self.token_up = nn.Linear(n, token_hidden)
        self.token_down = nn.Linear(token_hidden, n)
        self.channel_up, self.channel_down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, n, d]
        tokens = x.transpose(1, 2)  # [batch, d, n]: an MLP along the positions
        mixed = self.token_down(F.gelu(self.token_up(tokens))).transpose(1, 2)
        x = x + mixed
        return x + self.channel_down(F.gelu(self.channel_up(x)))


def main(argv: list[str] | None = None) -> dict[str, int]:
    n, d, token_hidden = 128, 64, 256
    model, x = MixerBlock(n, d, token_hidden), torch.randn(1, n, d)
    print("dataflow alone:", flopscope.profile(model, x).by_role())
    rules = [RoleRule("token_*", Role.TOKEN_MIXING)]
    roles = flopscope.profile(model, x, roles=rules).by_role()
    print("with rules:    ", roles)
    return roles


if __name__ == "__main__":
    main()
