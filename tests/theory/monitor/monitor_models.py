"""Models and data the monitor tests share: a small transformer classifier over token inputs
(Embedding, LayerNorm, hand-written attention through Linear layers), and its data set."""

import torch
import torch.nn.functional as F
from torch import nn

import training

VOCAB, LENGTH, CLASSES = 12, 8, 3


class Block(nn.Module):
    """A pre-norm transformer block: causal attention (``heads`` heads, through Linear layers),
    then a GELU MLP of twice the width, each added to the residual stream."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(self.ln1(h)).chunk(3, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        return h + self.ff(self.ln2(h))


class TinyTransformer(nn.Module):
    """``blocks`` pre-norm transformer blocks (default one, two heads, width 16) over token ids
    given as floats (training's data sets hold float inputs), mean-pooled into a linear
    classifier; ``length`` positions, a ``vocab``-token alphabet."""

    def __init__(self, dim: int = 16, heads: int = 2, blocks: int = 1, length: int = LENGTH,
                 vocab: int = VOCAB) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(blocks)))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.long()
        b, t = ids.shape
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device).expand(b, t))
        return self.head(self.ln_f(self.blocks(h)).mean(1))


def token_dataset(n: int = 2000, seed: int = 0, length: int = LENGTH, vocab: int = VOCAB
                  ) -> training.Dataset:
    """Random token sequences labelled by (first + last token) mod 3."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab, (n, length), generator=gen)
    y = (x[:, 0] + x[:, -1]) % CLASSES
    return training.Dataset.from_tensors(x.float(), y, num_classes=CLASSES, name="tokens")
