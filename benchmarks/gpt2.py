"""GPT-2 small in plain torch: the language model that ``benchmarks/models.py`` times.

``GPT2()`` is GPT-2 small's shape: 12 blocks of width 768 (12 heads of 64), each pre-LayerNorm
attention then a pre-LayerNorm MLP of 3072 with GELU (tanh approximation), both residual; learned
position embeddings (1024), a vocabulary of 50257, the LM head tied to the token embedding, no
dropout. Attention is causal, through ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``
on (batch, heads, sequence, 64) views of one packed q/k/v projection. GPT-2's initialisation:
weights N(0, 0.02), biases 0, each residual branch's output projection N(0, 0.02 / sqrt(2 x blocks)).

``route_attention(model, call)`` makes every attention block call ``call`` (with torch's signature)
instead, leaving every other operation as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as TF
from torch import nn

VOCABULARY = 50257
POSITIONS = 1024


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: packed q/k/v projection, SDPA, output projection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)
        # the call the block attends with: torch's, or one with its signature (route_attention)
        self.scaled_dot_product_attention: Callable[..., torch.Tensor] = TF.scaled_dot_product_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, sequence, width = x.shape
        qkv = self.qkv(x).view(batch, sequence, 3, self.heads, width // self.heads)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (batch, heads, sequence, head dim) each
        y = self.scaled_dot_product_attention(query, key, value, is_causal=True)
        return self.projection(y.transpose(1, 2).reshape(batch, sequence, width))


class Block(nn.Module):
    """x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x))."""

    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT2(nn.Module):
    """Token ids (batch, sequence) -> next-token logits (batch, sequence, vocabulary)."""

    def __init__(
        self,
        layers: int = 12,
        width: int = 768,
        heads: int = 12,
        hidden: int = 3072,
        vocabulary: int = VOCABULARY,
        positions: int = POSITIONS,
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocabulary, width)
        self.position_embedding = nn.Embedding(positions, width)
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:  # each residual branch's last projection (GPT-2's scaling)
            for projection in (block.attention.projection, block.mlp[2]):
                nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return TF.linear(self.final_norm(x), self.token_embedding.weight)  # the LM head: the embedding, tied


def route_attention(model: nn.Module, call: Callable[..., torch.Tensor]) -> int:
    """Make every ``CausalSelfAttention`` of ``model`` attend with ``call``; returns how many there are."""
    blocks = [module for module in model.modules() if isinstance(module, CausalSelfAttention)]
    for block in blocks:
        block.scaled_dot_product_attention = call
    return len(blocks)
