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
    pytester.makepyfile(gan="""
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        g, d = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
        for _ in range(30):
            fake = g(torch.randn(4, 8))
            opt_d.zero_grad()
            d(fake.detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            d(fake).mean().backward()
            opt_g.step()
        dist.destroy_process_group()
    """)
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

        def test_two_optimizers(distperf):  # the discriminator's steps; both models' parameters
            run = distperf.run(distperf.script_job("gan.py", steps=3, warmup=1))
            assert [len(r.step_times) for r in run.ranks] == [3, 3]
            assert run.ranks[0].num_params == 8 * 16 + 16 + 16 + 1, run.ranks[0].num_params
            assert run.ranks[0].extra["launch"]["optimizer"] == "Adam, Adam"
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=3, failed=5)
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
    # a script that exited 0 is not said to have exited 1 (torchrun's exit is 0, or unseen when it was ended)
    short = [line for line in result.outlines if "torchrun train.py --steps 4 x2 cpu failed" in line]
    assert short and not any("exited with code 1" in line for line in short), short
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


def test_a_relative_script_or_cwd_is_found_from_the_project_root_not_the_folder_pytest_runs_in(tmp_path, monkeypatch):
    from pytest_distperf.errors import UsageError
    from pytest_distperf.spec.userjobs import script_ref

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path / "sub")  # `cd sub && pytest test_x.py`
    ref = script_ref("sub/train.py", (), "torchrun", None, "sub", "cpu", root=str(tmp_path))
    assert (ref.path, ref.name, ref.cwd) == (str(tmp_path / "sub" / "train.py"), "sub/train.py", str(tmp_path / "sub"))
    with pytest.raises(UsageError, match="no such file .*a relative path is found from the project root"):
        script_ref("train.py", (), "torchrun", None, None, "cpu", root=str(tmp_path))
    with pytest.raises(UsageError, match="cwd='nowhere'.*no such folder"):
        script_ref("sub/train.py", (), "torchrun", None, "nowhere", "cpu", root=str(tmp_path))


def test_a_usage_error_points_at_the_tests_call_not_the_plugins_frames(pytester: pytest.Pytester):
    pytester.makepyfile(test_missing="""
        def test_missing(distperf):
            distperf.script_job("missing.py")
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['>*distperf.script_job("missing.py")', "E*UsageError: test_missing.py::test_missing: "
                                 "distperf.script_job('missing.py'): no such file*", "test_missing.py:2: UsageError"])
    for frame in ("contextlib.py", "userjobs.py", "fixture.py"):
        assert frame not in result.stdout.str(), frame
    # the other verbs' count checks alike
    pytester.makepyfile(test_counts="""
        def test_step(distperf):
            distperf.step_job("os:getcwd", steps=0)

        def test_job(distperf):
            distperf.job("ddp", warmup=-1)
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "test_counts.py")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["E*UsageError: *distperf.step_job(steps=...) must be an integer of at least 1, got 0",
                                 "E*UsageError: *distperf.job(warmup=...) must be an integer of at least 0, got -1"],
                                consecutive=False)
    assert "fixture.py" not in result.stdout.str()


def _watch(tmp_path: Path, warmup: int = 100) -> "object":
    """A StepWatch outside a job: what at_exit and the optimizer hook read of the job."""
    from types import SimpleNamespace

    from pytest_distperf.rank.script_steps import StepWatch

    job = SimpleNamespace(script=SimpleNamespace(name="train.py"), warmup_steps=warmup, steps=3, work_steps=3,
                          measure_once=True, probes=(), probe_steps=3, device="cpu")
    return StepWatch(str(tmp_path), job, 0)


def test_several_optimizers_step_on_the_first_and_are_sized_together(tmp_path):
    """A GAN's two optimizers (one tensor in both): the steps are the first one's, the parameters (that tensor
    once), the optimizer state and the training state are both's; an optimizer the script drops is not kept."""
    import gc

    import torch

    from pytest_distperf import strategies
    from pytest_distperf.rank import work

    watch = _watch(tmp_path)
    g, d, shared = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Parameter(torch.zeros(8))
    opt_g = torch.optim.Adam([*g.parameters(), shared])
    opt_d = torch.optim.Adam([*d.parameters(), shared])
    for _ in range(3):
        (d(g(torch.ones(2, 4)) + shared).sum()).backward()
        for opt in (opt_g, opt_d):
            opt.step()
            watch.on_optimizer_step(opt, (), {})
    assert watch.steps_seen == 3 and watch.optimizer is opt_g
    both = watch._optimizers()
    assert both.names() == "Adam, Adam"
    assert sum(p.numel() for p in both.parameters()) == 4 * 8 + 8 + 8 + 1 + 8
    alone = strategies.optimizer_state_bytes(opt_g) + strategies.optimizer_state_bytes(opt_d)
    assert strategies.optimizer_state_bytes(both) == alone - shared.numel() * 4  # the tensor once, both its states
    assert work.state_bytes(both, both) > work.state_bytes(None, opt_g)
    del opt_d, opt, both
    gc.collect()
    assert watch._optimizers().names() == "Adam"


def test_a_script_that_ends_inside_a_phase_closes_it_before_writing_its_error(tmp_path):
    """The FLOP counter of the work phase is left when the script ends inside it, and a phase that fails to close
    is told after the script's own news."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from pytest_distperf.rank import work

    watch = _watch(tmp_path)
    watch.steps_seen = 7
    watch.after = work.passes(3, lambda: None, torch.device("cpu"), counts=True)
    next(watch.after)
    for _ in range(6):  # past the instruction counter's pass, if this machine has one, into the counting pass
        if _get_current_dispatch_mode_stack():
            break
        watch.after.send(None)
    assert _get_current_dispatch_mode_stack(), "the counting pass is active"
    watch.at_exit()
    assert not _get_current_dispatch_mode_stack() and watch.after is None
    assert (tmp_path / "error-rank0.txt").read_text().startswith("train.py ended after 7 optimizer steps")

    def stuck() -> "object":
        try:
            yield 0
        finally:
            raise RuntimeError("the profiler would not stop")

    watch = _watch(tmp_path)
    watch.script_error = "ValueError: the script's own"
    watch.after = stuck()
    next(watch.after)
    watch.at_exit()
    text = (tmp_path / "error-rank0.txt").read_text()
    assert text.startswith("train.py raised after 0 optimizer steps") and "ValueError: the script's own" in text
    assert text.endswith("(closing the phases after timing at the script's end raised RuntimeError: the profiler "
                         "would not stop)")


@pytest.mark.parametrize("launcher, rc, raised, said", [
    ("torchrun", 0, False, "exited with code 0"),  # torchrun exits 0 only when every rank did
    ("torchrun", -15, False, "left an error, its exit code seen by the script's launcher only"),
    ("torchrun", 1, True, "exited with code 1"),  # Python's exit after the script's exception
    ("python", 0, False, "exited with code 0"),  # the agent's own process is rank 0
])
def test_a_script_rank_that_left_an_error_is_said_to_exit_with_its_real_code_or_none(tmp_path, monkeypatch, launcher,
                                                                                    rc, raised, said):
    from pytest_distperf.agents.script import collect
    from pytest_distperf.launch import jobfiles
    from pytest_distperf.launch.launcher import _failure_message

    monkeypatch.setenv(jobfiles.KEY_ENV, "ab" * 32)
    job = JobSpec(world_size=1, device="cpu", script=ScriptRef(path="/a/train.py", name="train.py", args=(),
                                                                launcher=launcher, env=(), sha256="0" * 64))
    jobfiles.write_rank_error(str(tmp_path), 0, "train.py ended after 8 optimizer steps, without an exception")
    if raised:
        jobfiles.write_failure_time(str(tmp_path), 0)
    failures = collect(str(tmp_path), 1, rc, launcher).failures
    message = _failure_message(job, str(tmp_path), failures)
    assert message.startswith(f"distperf job {job.describe()} failed: rank 0 {said} (root cause)"), message


def test_launcher_python_on_a_script_that_starts_no_other_rank_says_what_to_use(tmp_path, monkeypatch):
    from pytest_distperf.errors import JobError
    from pytest_distperf.launch import jobfiles
    from pytest_distperf.launch.launcher import _collect

    monkeypatch.setenv(jobfiles.KEY_ENV, "ab" * 32)
    job = JobSpec(world_size=2, device="cpu", script=ScriptRef(path="/a/train.py", name="train.py", args=(),
                                                                launcher="python", env=(), sha256="0" * 64))
    jobfiles.write_result(str(tmp_path), jobfiles.AgentResult(values={0: "measured"}))
    with pytest.raises(JobError, match="rank 1 never started.*\n.*expects its framework .* to start the other ranks.*"
                                       "launcher='torchrun'.*world_size=1"):
        _collect(job, str(tmp_path))
