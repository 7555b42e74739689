"""A user's training script, unchanged (`distperf.script_job`): run by its own launcher, steps found by torch's
optimizer hook, measured and gated like any job.

Real 2-rank CPU jobs through torchrun: a plain DDP loop is measured (its optimizer steps timed, its work figures
counted), saved as a baseline, then gated: the same script passes, the script with an extra operator in its step
fails. A script that ends before the job has its steps, one whose update the hook cannot see, and one that marks
its steps with `pytest_distperf.step()` each get what they should; a rank that dies of a signal is named as the
root cause with its stacks. Bad arguments are errors naming them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import psutil
import pytest

from benchmarks import script_jobs
from pytest_distperf.spec.job import JobSpec, ScriptRef

ROOT = Path(__file__).resolve().parents[1]

INNER = ("--distperf", "-p", "no:cacheprovider", "-rsfE", "--distperf-max-repeats=3")

TRAIN = """
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
args = p.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)
for step in range(args.steps):
    loss = model(x).square().mean()
    loss.backward()
    EXTRA
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


FAILS_AT_THIRD_STEP = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    model(torch.ones(4, 16)).sum().backward()
    opt.step()
    dist.barrier()
    if step == 2 and dist.get_rank() == 1:
        FAILURE
"""


def _script(extra: str = "pass") -> str:
    return TRAIN.replace("EXTRA", extra)


@pytest.mark.slow
def test_a_torchrun_ddp_script_is_measured_saved_and_gated(pytester: pytest.Pytester):
    pytester.makepyfile(train=_script())
    pytester.makepyfile(test_train="""
        def test_train(distperf):
            distperf.measure(distperf.script_job("train.py", args=("--steps", "40"), steps=6, warmup=2))
    """)
    saved = pytester.runpytest(*INNER, "--distperf-save", "--distperf-json", "saved.json")
    saved.assert_outcomes(passed=1)
    job = json.loads((pytester.path / "saved.json").read_text())["tests"][0]["jobs"][0]
    assert job["label"] == "torchrun train.py --steps 40 x2 cpu"
    run = job["runs"][0]
    assert [len(r["step_times"]) for r in run["ranks"]] == [6, 6]
    launch = run["ranks"][0]["extra"]["launch"]
    assert launch["steps_by"] == "torch's optimizer hook" and launch["optimizer"] == "AdamW"
    assert run["work"]["aten_ops_per_step"] > 0, "the work phase ran on the script's own steps"

    same = pytester.runpytest(*INNER)
    same.assert_outcomes(passed=1)

    pytester.makepyfile(train=_script("torch.sort(torch.randn(400_000))"))  # one more operator in the step
    slowed = pytester.runpytest(*INNER)
    slowed.assert_outcomes(failed=1)
    slowed.stdout.fnmatch_lines(["*aten_ops_per_step*FAIL*"])


@pytest.mark.slow
def test_scripts_that_end_early_hide_their_steps_or_mark_them(pytester: pytest.Pytester):
    pytester.makepyfile(train=_script())
    pytester.makepyfile(by_hand="""
        import torch
        import torch.distributed as dist

        import pytest_distperf

        class Sgd:  # an optimizer of its own, not a torch.optim.Optimizer
            def __init__(self, params):
                self.param_groups = [{"params": list(params)}]

            def step(self):
                with torch.no_grad():
                    for p in self.param_groups[0]["params"]:
                        p -= 0.01 * p.grad

        dist.init_process_group("gloo")
        model = torch.nn.Linear(16, 16)
        opt = Sgd(model.parameters())
        for _ in range(30):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            if "MARK" in __import__("os").environ:
                pytest_distperf.step()
    """)
    # rank 1 fails at its third step: natively (faulthandler's stacks only), or with the script's own exception
    for name, failure in (("aborts", "os.abort()"), ("raises", 'raise ValueError("the script\'s own error")')):
        pytester.makepyfile(**{name: FAILS_AT_THIRD_STEP.replace("FAILURE", failure)})
    pytester.makepyfile(forever="""
        import os
        import time

        import torch.distributed as dist

        def spin():  # a hand-written loop that never steps
            while True:
                time.sleep(0.01)

        dist.init_process_group("gloo")
        with open(f"pid{dist.get_rank()}", "w") as f:
            f.write(str(os.getpid()))
        spin()
    """)
    pytester.makepyfile(test_scripts="""
        import pytest

        def test_raises(distperf):  # the script's error leads, not the steps it did not get to
            distperf.run(distperf.script_job("raises.py", steps=3, warmup=1))

        @pytest.mark.distperf(timeout=20)
        def test_never_steps(distperf):  # torchrun stands between the agent and the ranks
            distperf.run(distperf.script_job("forever.py", steps=3, warmup=1))

        def test_too_short(distperf):
            distperf.run(distperf.script_job("train.py", args=("--steps", "4"), steps=6, warmup=2))

        def test_unseen_update(distperf):
            distperf.run(distperf.script_job("by_hand.py", steps=3, warmup=1))

        def test_probed(distperf):  # the comms probe over the script's steps after the work phase
            run = distperf.probe(distperf.script_job("train.py", args=("--steps", "40"), steps=3, warmup=1,
                                                     probes=("comms",)))
            comms = run.ranks[0].probes.comms
            assert comms is not None and comms.steps == 3 and any("all_reduce" in k for k in comms.by_kind), comms

        def test_marked(distperf):
            run = distperf.run(distperf.script_job("by_hand.py", env={"MARK": "1"}, steps=3, warmup=1))
            assert run.ranks[0].extra["launch"]["steps_by"] == "pytest_distperf.step()"
            assert len(run.ranks[0].step_times) == 3

        def test_aborted(distperf):  # the rank that died of a signal is the root cause, not the peer it broke
            distperf.run(distperf.script_job("aborts.py", steps=3, warmup=1))
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=2, failed=5)
    result.stdout.fnmatch_lines(["*rank 1*", "*raises.py raised after 3 optimizer steps (the job needs up to*",
                                 "*ValueError: the script's own error*"])
    # every rank's stacks at the timeout, and no rank left running
    result.stdout.fnmatch_lines(["*torchrun forever.py x2 cpu timed out after 20 s*", '*File "*forever.py", line * in spin*'])
    for rank in (0, 1):
        pid = int((pytester.path / f"pid{rank}").read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, rank
    result.stdout.fnmatch_lines([
        "*train.py ended after 4 optimizer steps, without an exception; the job needs up to 14*",
        "*by_hand.py ended without a step distperf could see*not torch.optim.Optimizers: __main__.Sgd.*pytest_distperf.step()*",
    ])
    result.stdout.fnmatch_lines([
        "*distperf job torchrun aborts.py x2 cpu failed: rank 1 died of SIGABRT (root cause)*",
        "Fatal Python error: Aborted",
        '*File "*aborts.py", line * in <module>*',
    ])


LIGHTNING = """
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))

    def training_step(self, batch, i):
        loss = self.net(batch[0]).square().mean()
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=40, enable_checkpointing=False,
                    logger=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(4096, 64)), batch_size=32))
"""

DEEPSPEED = """
import argparse

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)  # deepspeed's launcher passes it
parser.parse_args()
deepspeed.init_distributed()
cuda = torch.cuda.is_available()
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
config = {"train_micro_batch_size_per_gpu": 32, "zero_optimization": {"stage": 3}, "bf16": {"enabled": cuda},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
x = torch.randn(32, 64, device=engine.device, dtype=torch.bfloat16 if cuda else torch.float32)
for _ in range(40):
    engine.backward(engine(x).float().square().mean())
    engine.step()
"""

# the Hugging Face Trainer script of benchmarks/script_jobs.py (a small Llama from its config, no download), unslowed
HF_TRAINER = script_jobs.HF_SCRIPT.replace("SLOW", "pass")

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HF_MARKS = "" if HAS_TRANSFORMERS else ", marks=pytest.mark.skip(reason='needs transformers: the test extra has it')"
HF_OUTCOME = dict(passed=1) if HAS_TRANSFORMERS else dict(skipped=1)


@pytest.mark.slow
def test_each_launcher_runs_its_script_unchanged(pytester: pytest.Pytester):
    """Lightning's Trainer started as `python script.py` (its launcher starts rank 1), a DeepSpeed ZeRO-3 engine
    loop under torchrun, a DDP loop through `accelerate launch`, a Hugging Face `Trainer` script under torchrun:
    every rank's optimizer steps are found."""
    pytester.makepyfile(train=_script(), light=LIGHTNING, ds_loop=DEEPSPEED, hf_train=HF_TRAINER)
    pytester.makepyfile(test_launchers="""
        import pytest

        @pytest.mark.parametrize("script, launcher", [("light.py", "python"), ("ds_loop.py", "torchrun"),
                                                      ("train.py", "accelerate"),
                                                      pytest.param("hf_train.py", "torchrun"HF_MARKS)])
        def test_launcher(distperf, script, launcher):
            run = distperf.run(distperf.script_job(script, launcher=launcher, steps=4, warmup=2))
            assert [len(r.step_times) for r in run.ranks] == [4, 4]
            assert {r.extra["launch"]["steps_by"] for r in run.ranks} == {"torch's optimizer hook"}
    """.replace("HF_MARKS", HF_MARKS))
    pytester.runpytest(*INNER).assert_outcomes(**{**HF_OUTCOME, "passed": 3 + HF_OUTCOME.get("passed", 0)})


@pytest.mark.slow
@pytest.mark.gpu(reason="DeepSpeed's launcher counts GPUs, and the seed-004 reporter's scripts run Lightning's FSDP "
                        "strategy, which needs CUDA")
def test_gpu_launchers_run_their_scripts_unchanged(pytester: pytest.Pytester):
    """On one GPU: a DeepSpeed ZeRO-3 engine loop through `deepspeed`, the seed-004 reporter's Trainer and Fabric
    scripts (benchmarks/seed004_reporter.py, Lightning's demo Transformer, FSDP) as `python script.py`, and a
    Hugging Face `Trainer` script (bf16) under torchrun."""
    pytester.makepyfile(ds_loop=DEEPSPEED, hf_train=HF_TRAINER)
    (pytester.path / "reporter.py").write_text((ROOT / "benchmarks" / "seed004_reporter.py").read_text())
    pytester.makepyfile(test_gpu="""
        import pytest

        @pytest.mark.parametrize("script, launcher, args", [
            ("ds_loop.py", "deepspeed", ()),
            ("reporter.py", "python", ("trainer", "--no-offload", "--steps", "30")),
            ("reporter.py", "python", ("fabric", "--no-offload", "--steps", "30")),
            pytest.param("hf_train.py", "torchrun", ()HF_MARKS),
        ])
        def test_gpu(distperf, script, launcher, args):
            run = distperf.run(distperf.script_job(script, args=args, launcher=launcher, steps=5, warmup=2))
            assert [len(r.step_times) for r in run.ranks] == [5]
            times = sorted(run.step_times)
            print(f"{script} {args[:1]}: median step {times[len(times) // 2]:.4f} s; {run.ranks[0].extra['launch']}")
    """.replace("HF_MARKS", HF_MARKS))
    result = pytester.runpytest(*INNER, "--distperf-world-size=1", "-s")
    result.assert_outcomes(**{**HF_OUTCOME, "passed": 3 + HF_OUTCOME.get("passed", 0)})


def test_bad_script_jobs_are_errors_naming_the_argument(pytester: pytest.Pytester):
    pytester.makepyfile(train="print('hi')")
    pytester.makepyfile(test_bad="""
        import pytest
        from pytest_distperf.errors import UsageError

        @pytest.mark.parametrize("call, message", [
            (dict(script="missing.py"), "no such file"),
            (dict(script="train.py", launcher="mpirun"), "launcher='mpirun' is not one of"),
            (dict(script="train.py", args=("--steps", 3)), "args=...) must be a tuple of strings"),
            (dict(script="train.py", env={"A": 1}), "env=...) must be a dict of strings"),
            (dict(script="train.py", warmup=0), "warmup=0"),
        ])
        def test_bad(distperf, call, message):
            with pytest.raises(UsageError, match=message.replace("(", "[(]").replace(")", "[)]")):
                distperf.script_job(**call)
    """)
    pytester.runpytest("--distperf", "-p", "no:cacheprovider").assert_outcomes(passed=5)


def test_a_script_jobs_key_is_its_name_arguments_environment_and_launcher_not_its_content():
    def job(**changes: object) -> JobSpec:
        script = dict(path="/a/train.py", name="train.py", args=("--steps", "40"), launcher="torchrun",
                      env=(("A", "1"),), sha256="0" * 64)
        script.update(changes)
        return JobSpec(world_size=2, device="cpu", script=ScriptRef(**script))  # type: ignore[arg-type]

    key = job().config_hash()
    assert job(sha256="1" * 64, path="/b/train.py").config_hash() == key  # an edited script, another checkout
    for other in (dict(args=("--steps", "41")), dict(env=()), dict(launcher="accelerate"), dict(name="t.py")):
        assert job(**other).config_hash() != key, other


def test_a_script_is_named_relative_to_the_project_root_whichever_folder_pytest_runs_from(tmp_path, monkeypatch):
    from pytest_distperf.spec.userjobs import script_ref

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text("print('hi')\n")
    names = set()
    for folder in (tmp_path, tmp_path / "sub"):
        monkeypatch.chdir(folder)
        ref = script_ref(tmp_path / "sub" / "train.py", (), "torchrun", None, None, "cpu", root=str(tmp_path))
        names.add(ref.name)
    assert names == {"sub/train.py"}  # one name, so one baseline key
    outside = script_ref(tmp_path / "sub" / "train.py", (), "torchrun", None, None, "cpu", root=str(tmp_path / "x"))
    assert outside.name == str(tmp_path / "sub" / "train.py")
