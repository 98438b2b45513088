"""Models the training tests share (tests/e2e/test_training.py, test_dynamic_training.py)."""

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention by matmul and softmax, GELU MLP, residuals,
    dropout."""

    def __init__(self, width: int = 16, heads: int = 2, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / (width // self.heads) ** 0.5
        attention = torch.softmax(scores, dim=-1) @ v
        x = x + self.dropout(self.proj(attention.transpose(1, 2).reshape(batch, length, width)))
        return x + self.dropout(self.down(F.gelu(self.up(self.norm2(x)))))


class TransformerModel(torch.nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.block = Block(dropout=dropout)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.block(x).mean(dim=1))
