"""Lightning-AI/pytorch-lightning#18336 as its reporter ran it: the script, launched with `python`, outside the harness.

perf_tests/test_lightning_18336.py measures the same workload through the plugin. This script is the other
half of that comparison: the reporter's own Trainer and Fabric programs (a LightningModule whose
`configure_model` builds the demo Transformer, `self.log(..., prog_bar=True)`, Adam(lr=0.1) over
`self.parameters()`; the Fabric loop of Lightning's FSDP guide), started as `python benchmarks/seed004_reporter.py`
with `--devices N`, so Lightning's own launcher starts the other ranks. Its figure is what the reporter's progress
bar shows: seconds between the ends of consecutive iterations (the Trainer through a callback, Fabric in its loop),
after warm-up. The tokens are random (batch 1 x 32), as in the issue's measurement.

`--fit-thread` runs the Trainer's `fit` on a second thread while the main thread waits, as the plugin's
Trainer adapter does (strategies/lightning_trainer.py): the one structural difference between the two Trainer runs.

    python benchmarks/seed004_reporter.py trainer --devices 1            # FSDP + CPU offload
    python benchmarks/seed004_reporter.py fabric --devices 1
    python benchmarks/seed004_reporter.py trainer --devices 1 --fit-thread
    python benchmarks/seed004_reporter.py trainer --devices 1 --no-offload --json out.json

Needs CUDA (Lightning's FSDP strategy does). Prints one line per iteration on rank 0 and a summary line.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, Dataset

SIZE = dict(vocab_size=33278, nlayers=32, nhid=4096, ninp=1024, nhead=64)  # ~1.0B parameters
WRAP = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}


class RandomTokens(Dataset):
    def __init__(self, length: int, seq_len: int = 32, vocab: int = SIZE["vocab_size"]):
        self.tokens = torch.randint(0, vocab, (length, seq_len + 1), generator=torch.Generator().manual_seed(42))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[i, :-1], self.tokens[i, 1:]


class LanguageModel(L.LightningModule):
    """The reporter's module."""

    def __init__(self):
        super().__init__()
        self.model = None

    def configure_model(self):
        self.model = self.model or Transformer(**SIZE)

    def training_step(self, batch):
        inputs, target = batch
        output = self.model(inputs, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


class IterationEnds(L.Callback):
    """When each iteration ended (rank 0), the span a progress bar's it/s counts."""

    def __init__(self):
        self.ends: list[float] = []
        self.threads: int | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch.cuda.synchronize()
        self.ends.append(time.perf_counter())  # nothing else here: this runs inside the span it times

    def on_train_end(self, trainer, pl_module):
        self.threads = torch.get_num_threads()  # on the thread that ran the loop


def strategy(offload: bool, fabric: bool):
    if fabric:
        from lightning.fabric.strategies import FSDPStrategy
    else:
        from lightning.pytorch.strategies import FSDPStrategy
    return FSDPStrategy(auto_wrap_policy=WRAP, cpu_offload=offload)


def run_trainer(args) -> tuple[list[float], int | None]:
    ends = IterationEnds()
    trainer = L.Trainer(accelerator="cuda", devices=args.devices, strategy=strategy(args.offload, fabric=False),
                        max_steps=args.warmup + args.steps, enable_checkpointing=False, logger=False,
                        callbacks=[ends], enable_model_summary=False)
    data = DataLoader(RandomTokens(args.warmup + args.steps), batch_size=1)
    if args.fit_thread:
        errors: list[BaseException] = []

        def fit():
            try:
                trainer.fit(LanguageModel(), data)
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=fit, name="lightning-fit")
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
    else:
        trainer.fit(LanguageModel(), data)
    return ends.ends, ends.threads


def run_fabric(args) -> tuple[list[float], int | None]:
    fabric = L.Fabric(accelerator="cuda", devices=args.devices, strategy=strategy(args.offload, fabric=True))
    fabric.launch()
    fabric.seed_everything(42)
    with fabric.init_module():
        model = Transformer(**SIZE)
    model = fabric.setup(model)
    optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=0.1))
    data = RandomTokens(args.warmup + args.steps)
    ends = []
    for i in range(args.warmup + args.steps):
        inputs, target = fabric.to_device(data[i])
        output = model(inputs.unsqueeze(0), target.unsqueeze(0))
        loss = F.nll_loss(output, target.view(-1))
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        fabric.print(f"iteration {i}: loss {loss.item():.3f}")
        torch.cuda.synchronize()
        ends.append(time.perf_counter())
    return ends, torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("side", choices=("trainer", "fabric"))
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--no-offload", dest="offload", action="store_false")
    ap.add_argument("--fit-thread", action="store_true", help="Trainer: run fit on a second thread")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", help="write the figures here (rank 0)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    ends, threads = (run_trainer if args.side == "trainer" else run_fabric)(args)
    if int(torch.distributed.get_rank() if torch.distributed.is_initialized() else 0) != 0:
        return 0
    timed = [b - a for a, b in zip(ends[args.warmup - 1:], ends[args.warmup:])]
    figures = {
        "side": args.side, "devices": args.devices, "offload": args.offload, "fit_thread": args.fit_thread,
        "lightning": L.__version__, "torch": torch.__version__, "intra_op_threads": threads,
        "seconds_per_iteration": timed, "median_s_per_it": statistics.median(timed),
        "cuda_peak_allocated": torch.cuda.max_memory_allocated(), "wall_seconds": time.perf_counter() - t0,
    }
    print(f"{args.side}{' (fit on a thread)' if args.fit_thread else ''} devices={args.devices} "
          f"offload={args.offload}: median {figures['median_s_per_it']:.3f} s/it over {len(timed)} iterations "
          f"(min {min(timed):.3f}, max {max(timed):.3f}); {threads} intra-op threads; "
          f"peak CUDA {figures['cuda_peak_allocated'] / 2**30:.2f} GiB", flush=True)
    if args.json:
        from pytest_distperf.fs.jsonio import write_json_atomic

        write_json_atomic(args.json, figures, lock=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
