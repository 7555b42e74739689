"""A user's own model, as a distperf workload: a stack of residual MLP blocks on a regression task.

Ranks import this module by name ("my_model:make_workload"), so it lives at module level next to the
test. Nothing here knows about FSDP2 or DeepSpeed: the strategies wrap `Block` (wrap_units) and
build the model through the constructor (`model=` a callable, which DeepSpeed's zero.Init needs).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_distperf import Workload


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MyModel(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x)).squeeze(-1)


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def make_workload(width: int = 256, depth: int = 4, batch_size: int = 32, seed: int = 0) -> Workload:
    teacher = torch.randn(width, generator=torch.Generator().manual_seed(seed)) / width ** 0.5  # the target to learn

    def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)  # same data on every side
        x = torch.randn(batch_size, width, generator=g)
        return x, x @ teacher

    return Workload(model=lambda: MyModel(width, depth), batch=batch, loss=mse, wrap_units=(Block,),
                    micro_batch=batch_size)
