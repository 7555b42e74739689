"""A user's training script through `distperf.script_job`: its step time against the same model as a step job, and
the stored gate on the script unchanged and slowed.

A scratch project holds one model and loop twice: `train.py`, a plain torchrun DDP script (argparse, its own
process group, device and loop), and `usersteps.py`, the same model, optimizer and batch as a step factory
(`distperf.step_job`). Printed:

1. the script's steps found per rank, and its step time against the step job's over `--pairs` interleaved pairs
   (`distperf.compare`: the ratio and its interval, pair-to-pair variation): the hook's laps and the harness's
   calls should time the same step alike, within the runs' noise. The step job is launched as torchrun launches
   the script (`--step-job-launch as_user`); the harness's controlled launch pins each CPU rank to its cores,
   which the script's torchrun does not;
2. the stored gate: a baseline saved from the script, then the same script (should pass) and the script with one
   more operator in its step (`--slow-op`, a sort: should fail), each with its verdicts and wall time.

`--script hf_trainer` does the same with a Hugging Face `Trainer` script (a small Llama built from its config, random
token ids: no download) against the same model, AdamW, batch and gradient clipping as a step job under DDP; the
slowed script adds the operator in a `TrainerCallback.on_step_begin`. The Trainer's own per-step work (its data
loader, learning-rate schedule, DDP with `find_unused_parameters` on CPU) is in the script's step and not in the
step job's: the ratio says how much that is. `--script deepspeed` is a DeepSpeed ZeRO-3 engine loop (`deepspeed`
on GPUs, torchrun on CPU, where DeepSpeed's launcher finds no GPU to count) against the same engine built in a step
factory; `--script lightning` a Lightning `Trainer` script started as `python train.py` (Lightning's launcher starts
the other ranks) against the same model and AdamW under DDP, so that its ratio is the Trainer's own per-step work.

    python benchmarks/script_jobs.py                               # 2 gloo ranks on CPU
    python benchmarks/script_jobs.py --device cuda --world-size 1  # 1 GPU, NCCL
    python benchmarks/script_jobs.py --script hf_trainer           # needs transformers (the test extra)
    python benchmarks/script_jobs.py --script deepspeed            # or lightning
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.explain_changes import session  # noqa: E402

SCRIPT = '''
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--width", type=int, default=512)
args = p.parse_args()
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(4)]).to(device))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, args.width, device=device)
big = torch.randn(1 << 20, device=device)
for step in range(args.steps):
    loss = model(x).square().mean()
    loss.backward()
    SLOW
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
'''

STEP = '''
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def stepper(width):
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=device)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
'''

HF_SCRIPT = '''
import argparse
import os
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--width", type=int, default=128)
args = p.parse_args()
cuda = torch.cuda.is_available()
big = torch.randn(1 << 20, device=torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else "cpu")


class Tokens(torch.utils.data.Dataset):  # random token ids: no download, no tokenizer
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        ids = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class EachStep(TrainerCallback):
    def on_step_begin(self, *_, **__):
        SLOW


torch.manual_seed(0)
config = LlamaConfig(vocab_size=512, hidden_size=args.width, intermediate_size=2 * args.width, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
training = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=args.steps, per_device_train_batch_size=8,
                             learning_rate=1e-3, save_strategy="no", report_to=[], logging_strategy="no",
                             use_cpu=not cuda, bf16=cuda, disable_tqdm=True)
Trainer(model=LlamaForCausalLM(config), args=training, train_dataset=Tokens(), callbacks=[EachStep()]).train()
'''

HF_STEP = '''
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import LlamaConfig, LlamaForCausalLM


def stepper(width):
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = DDP(LlamaForCausalLM(config).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (8, 64), device=device)

    def step():
        with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
'''

DS_SCRIPT = '''
import argparse

import deepspeed
import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--width", type=int, default=256)
p.add_argument("--local_rank", type=int, default=-1)  # deepspeed's launcher passes it
args = p.parse_args()
deepspeed.init_distributed()
cuda = torch.cuda.is_available()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(args.width, 4 * args.width), torch.nn.GELU(),
                            torch.nn.Linear(4 * args.width, args.width))
config = {"train_micro_batch_size_per_gpu": 32, "zero_optimization": {"stage": 3}, "bf16": {"enabled": cuda},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
x = torch.randn(32, args.width, device=engine.device, dtype=torch.bfloat16 if cuda else torch.float32)
big = torch.randn(1 << 20, device=engine.device)
for step in range(args.steps):
    engine.backward(engine(x).float().square().mean())
    SLOW
    engine.step()
'''

DS_STEP = '''
import deepspeed
import torch


def stepper(width):
    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
    config = {"train_micro_batch_size_per_gpu": 32, "zero_optimization": {"stage": 3}, "bf16": {"enabled": cuda},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(32, width, device=engine.device, dtype=torch.bfloat16 if cuda else torch.float32)

    def step():
        engine.backward(engine(x).float().square().mean())
        engine.step()

    return step
'''

LIGHTNING_SCRIPT = '''
import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--width", type=int, default=256)
p.add_argument("--devices", type=int, default=2)
args = p.parse_args()


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(args.width, 4 * args.width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * args.width, args.width))
        self.register_buffer("big", torch.randn(1 << 20), persistent=False)

    def training_step(self, batch, i):
        big = self.big
        SLOW
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


torch.manual_seed(0)
trainer = L.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=args.devices, strategy="ddp",
                    max_steps=args.steps, enable_checkpointing=False, logger=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(4096, args.width)), batch_size=32))
'''

LIGHTNING_STEP = '''
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def stepper(width):
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                    torch.nn.Linear(4 * width, width)).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, width, device=device)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
'''


@dataclass(frozen=True)
class Script:
    text: str
    step_job: str
    width: int
    launcher: dict[str, str]  # by device: the launcher the script's users start it with
    devices_arg: bool = False  # the script starts its own ranks and is told how many


SCRIPTS = {
    "ddp": Script(SCRIPT, STEP, 512, {"cpu": "torchrun", "cuda": "torchrun"}),
    "hf_trainer": Script(HF_SCRIPT, HF_STEP, 128, {"cpu": "torchrun", "cuda": "torchrun"}),
    # DeepSpeed's launcher counts GPUs: on CPU its users start the engine loop with torchrun
    "deepspeed": Script(DS_SCRIPT, DS_STEP, 256, {"cpu": "torchrun", "cuda": "deepspeed"}),
    "lightning": Script(LIGHTNING_SCRIPT, LIGHTNING_STEP, 256, {"cpu": "python", "cuda": "python"}, devices_arg=True),
}

TESTS = '''
import json
import os

from usersteps import stepper


def script(distperf):
    return distperf.script_job("train.py", args={script_args}, launcher="{launcher}", steps={steps}, warmup=3)


def test_against_step_job(distperf):
    cmp = distperf.compare(script(distperf), distperf.step_job(stepper, args=({width},), steps={steps}, warmup=3,
                                                               launch="{launch}"), repeats={pairs})
    e = cmp.step_time_ratio
    a, b = cmp.a.runs[0], cmp.b.runs[0]
    with open("compare.json", "w") as f:
        json.dump(dict(ratio=e.ratio, lo=e.lo, hi=e.hi, level=e.level, pairs=e.n_pairs, pair_cv=e.pair_cv,
                       script_step=cmp.a.figures.step_time, step_job_step=cmp.b.figures.step_time,
                       script_run_cv=cmp.a.figures.run_cv, step_job_run_cv=cmp.b.figures.run_cv,
                       steps_found=[len(r.step_times) for r in a.ranks],
                       steps_by=a.ranks[0].extra["launch"]["steps_by"]), f)


def test_gate(distperf):
    distperf.measure(script(distperf))
'''


def verdicts(report: Path) -> list[str]:
    if not report.exists():
        return []
    test = json.loads(report.read_text())["tests"][0]
    return [f"{v['metric']} {v['status']}" + (f" {v['delta']:+.1%}" if v.get("delta") is not None else "")
            for v in test["verdicts"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int)
    p.add_argument("--script", default="ddp", choices=sorted(SCRIPTS),
                   help="a plain torchrun DDP loop, a Hugging Face Trainer script, a DeepSpeed ZeRO-3 engine loop "
                        "or a Lightning Trainer script")
    p.add_argument("--width", type=int, help="the model's width (default: the script's)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--pairs", type=int, default=6, help="interleaved pairs (a planned look falls at 3 and 6)")
    p.add_argument("--step-job-launch", default="as_user", choices=("as_user", "controlled"),
                   help="the step job launched as torchrun launches it (as the script is), or the harness's way "
                        "(CPU ranks pinned to their cores)")
    p.add_argument("--slow-op", default="torch.sort(big)", help="the operator the slowed script adds to its step")
    p.add_argument("--parts", default="compare,unchanged,slowed",
                   help="which parts to run: compare (script vs step job), unchanged and slowed (the stored gate; "
                        "a baseline is saved before the first)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json")
    args = p.parse_args(argv)
    args.world_size = args.world_size or (2 if args.device == "cpu" else 1)
    chosen = SCRIPTS[args.script]
    script = chosen.text
    args.width = args.width or chosen.width
    script_args = ("--width", str(args.width)) + (("--devices", str(args.world_size)) if chosen.devices_arg else ())
    out: dict = {"args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="distperf-scripts-") as folder:
        project = Path(folder)
        (project / "train.py").write_text(script.replace("SLOW", "pass"))
        (project / "usersteps.py").write_text(chosen.step_job)
        (project / "test_script.py").write_text(TESTS.format(
            width=args.width, steps=args.steps, pairs=args.pairs, launch=args.step_job_launch,
            script_args=repr(script_args), launcher=chosen.launcher[args.device]))

        parts = args.parts.split(",")
        if "compare" in parts:
            compare(project, args, out)
            save(args, out)
        gates = [(name, slow) for name, slow in (("unchanged", "pass"), ("slowed", args.slow_op)) if name in parts]
        if gates:
            rc, text, seconds = session(project, args, "-k", "gate", "--distperf-save")
            print(f"baseline saved: exit {rc} in {seconds:.0f} s", flush=True)
            out["gate"] = {}
        for name, slow in gates:
            (project / "train.py").write_text(script.replace("SLOW", slow))
            report = project / f"{name}.json"
            rc, text, seconds = session(project, args, "-k", "gate", f"--distperf-json={report}")
            v = verdicts(report)
            out["gate"][name] = {"exit": rc, "seconds": seconds, "verdicts": v}
            print(f"gate, script {name}: exit {rc} in {seconds:.0f} s; {'; '.join(v)}", flush=True)
            save(args, out)
    return 0


def save(args: argparse.Namespace, out: dict) -> None:
    """Written after every part, so that a part cut off by a time limit leaves the ones before it."""
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def compare(project: Path, args: argparse.Namespace, out: dict) -> None:
    rc, text, seconds = session(project, args, "-k", "against_step_job")
    if not (project / "compare.json").exists():
        print(text[-4000:])
        raise SystemExit(f"the comparison failed (exit {rc})")
    c = json.loads((project / "compare.json").read_text())
    out["compare"] = {**c, "seconds": seconds}
    print(f"{args.script} script vs step job ({seconds:.0f} s): steps found per rank {c['steps_found']} by {c['steps_by']}; "
          f"step time {c['script_step'] * 1e3:.2f} vs {c['step_job_step'] * 1e3:.2f} ms, ratio {c['ratio']:.3f} "
          f"[{c['lo'] or 0:.3f}, {c['hi'] or float('inf'):.3f}] ({c['level']:.0%}, {c['pairs']} pairs); "
          f"pair-to-pair {c['pair_cv'] or 0:.1%}, run-to-run {c['script_run_cv'] or 0:.1%} (script) / "
          f"{c['step_job_run_cv'] or 0:.1%} (step job)", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
