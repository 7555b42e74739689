"""The workload of Lightning-AI/pytorch-lightning#18336, as its reporter trained it.

Lightning's demo `Transformer` (an nn.Transformer encoder-decoder language model) at the issue's size:
`Transformer(vocab_size=33278, nlayers=32, nhid=4096, ninp=1024, nhead=64)`, about 1.0B parameters;
batch 1, sequence 32 of random tokens; `F.nll_loss` on its log-probabilities (its training_step);
`torch.optim.Adam(lr=0.1)`; FSDP units = `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer`
(the reporter's auto-wrap policy); fp32 (the reporter set no precision). Dropout stays on (train mode).

Ranks import this module by name (it sits next to the tests that use it, on pytest's sys.path).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_distperf.spec.workloads import Workload

REPORTER_SIZE = dict(vocab_size=33278, nlayers=32, nhid=4096, ninp=1024, nhead=64)
# The same model, small enough for a CPU unit test (the structure and the code path are the reporter's).
TINY_SIZE = dict(vocab_size=512, nlayers=2, nhid=64, ninp=32, nhead=2)


def nll(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, target = batch
    return F.nll_loss(model(inputs, target), target.view(-1))


def adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.1)


def reporter_transformer(*, seed: int = 1234, batch_size: int = 1, seq_len: int = 32, **size) -> Workload:
    from lightning.pytorch.demos import Transformer

    size = {**REPORTER_SIZE, **size}
    vocab = size["vocab_size"]

    def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
        tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    return Workload(model=lambda: Transformer(**size), batch=batch, loss=nll, optimizer=adam,
                    wrap_units=(nn.TransformerEncoderLayer, nn.TransformerDecoderLayer),
                    tokens_per_batch=batch_size * seq_len, micro_batch=batch_size, precision="fp32")
