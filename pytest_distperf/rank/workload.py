"""The built-in workload: a decoder-only transformer on synthetic tokens.

One file, read top to bottom (nanoGPT style). Named shapes go from `tiny` (CPU, a
fraction of a second a step) to `7b` (GPU). Nothing is downloaded. `builtin_workload`
gives it as one implementation of the workload interface (pytest_distperf.spec.workloads).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_distperf.spec.workloads import Workload


@dataclass(frozen=True)
class Shape:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    micro_batch: int  # sequences per rank per step
    # Finer fault-injection knob: extra real matmul work of about this fraction of each block's linear-layer
    # FLOPs, forward and backward, with no parameters (optimizer, gradients, memory and loss stay as they
    # are). The baseline store leaves it out of the config hash, so an injected slowdown reads as a
    # regression, as a code change would.
    extra_work: float = 0.0


SHAPES: dict[str, Shape] = {
    "tiny": Shape(vocab_size=2048, d_model=128, n_layers=2, n_heads=4, seq_len=128, micro_batch=4),
    "small": Shape(vocab_size=8192, d_model=512, n_layers=8, n_heads=8, seq_len=512, micro_batch=4),
    "350m": Shape(vocab_size=32000, d_model=1024, n_layers=24, n_heads=16, seq_len=1024, micro_batch=8),
    "1b": Shape(vocab_size=32000, d_model=2048, n_layers=24, n_heads=16, seq_len=2048, micro_batch=4),
    "3b": Shape(vocab_size=32000, d_model=2560, n_layers=32, n_heads=32, seq_len=2048, micro_batch=2),
    "7b": Shape(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, seq_len=2048, micro_batch=1),
}


def resolve_shape(name: str, overrides: dict[str, Any] | None = None) -> Shape:
    if name not in SHAPES:
        raise ValueError(f"unknown workload shape {name!r}; known shapes: {', '.join(SHAPES)}")
    overrides = overrides or {}
    known = {f.name for f in fields(Shape)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown shape field(s) {unknown} for shape {name!r}; known fields: {sorted(known)}")
    shape = replace(SHAPES[name], **overrides)
    if shape.d_model % shape.n_heads:
        raise ValueError(f"shape {name!r}: d_model={shape.d_model} is not divisible by n_heads={shape.n_heads}")
    return shape


class Attention(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.n_heads = s.n_heads
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model, bias=False)
        self.proj = nn.Linear(s.d_model, s.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.up = nn.Linear(s.d_model, 4 * s.d_model, bias=False)
        self.down = nn.Linear(4 * s.d_model, s.d_model, bias=False)
        # extra_work: y @ A @ B with constant (d x w) and (w x d) matrices, w = 9*extra_work*d. Forward and the
        # backward input-gradients cost 4*d*w MACs per token = extra_work x the block's 3 x 12*d*d. Plain tensors,
        # not parameters or buffers: no optimizer state, no gradient all-reduce, no DDP buffer broadcast, no RNG
        # draw (weights and losses stay identical to the uninjected model).
        width = round(9 * s.extra_work * s.d_model)
        self.extra_a = torch.full((s.d_model, width), 0.01) if width > 0 else None
        self.extra_b = torch.full((width, s.d_model), 0.01) if width > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(F.gelu(self.up(x)))
        if self.extra_a is not None and self.extra_b is not None:
            a, b = self.extra_a.to(y.device, y.dtype), self.extra_b.to(y.device, y.dtype)  # no-op unless bf16/moved
            y = y + 0.0 * ((y @ a) @ b)  # computed forward and backward; the loss is unchanged
        return y


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.ln1 = nn.LayerNorm(s.d_model)
        self.attn = Attention(s)
        self.ln2 = nn.LayerNorm(s.d_model)
        self.mlp = MLP(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.tok_emb = nn.Embedding(s.vocab_size, s.d_model)
        self.pos_emb = nn.Embedding(s.seq_len, s.d_model)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.n_layers))
        self.ln_f = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, s.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def build_model(shape: Shape, seed: int, device: torch.device) -> GPT:
    """Same seed -> same weights on every rank and for every strategy."""
    torch.manual_seed(seed)
    with device:
        return GPT(shape)


def make_batch(shape: Shape, seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One synthetic token batch on the CPU: different per rank and step, identical across strategies."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    tokens = torch.randint(0, shape.vocab_size, (shape.micro_batch, shape.seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def make_batches(shape: Shape, seed: int, rank: int, count: int,
                 device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A rank's batches, generated up front so no data work lands inside a timed step."""
    return [tuple(t.to(device) for t in make_batch(shape, seed, step, rank)) for step in range(count)]


def builtin_workload(shape: Shape, seed: int) -> Workload:
    """The GPT as a Workload: it returns its own loss; its blocks are the sharding units."""
    return Workload(model=lambda: GPT(shape), batch=lambda step, rank: make_batch(shape, seed, step, rank),
                    wrap_units=(Block,), tokens_per_batch=shape.micro_batch * shape.seq_len,
                    micro_batch=shape.micro_batch)
