"""The file-lock device allocator: jobs in different processes (xdist workers) never share a GPU."""

import multiprocessing as mp
import time

import pytest

from pytest_distperf.launch import allocator

GPUS = ["0", "1", "2", "3"]


def hold_two_gpus(folder, seconds, queue):
    with allocator.gpus(2, GPUS, owner="job", folder=folder) as env:
        start = time.monotonic()
        queue.put(("got", env["CUDA_VISIBLE_DEVICES"], time.time()))
        time.sleep(seconds)  # stands for the job holding its GPUs; no timing is measured from it
        queue.put(("released", env["CUDA_VISIBLE_DEVICES"], time.time(), time.monotonic() - start))


def test_concurrent_jobs_get_disjoint_gpus_and_the_extra_one_waits(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=hold_two_gpus, args=(str(tmp_path), 2.0, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    events = [queue.get(timeout=60) for _ in range(6)]
    for p in procs:
        p.join(timeout=30)
    grants = [e for e in events if e[0] == "got"]
    held: dict[str, float] = {}
    for kind, gpus, at, *rest in sorted(events, key=lambda e: e[2]):
        for g in gpus.split(","):
            if kind == "got":
                assert g not in held, f"GPU {g} granted twice"
                held[g] = at
            else:
                held.pop(g)
    assert all(len(g[1].split(",")) == 2 for g in grants)
    # 4 GPUs, three 2-GPU jobs: the third waited for one of the first two.
    first_release = min(e[2] for e in events if e[0] == "released")
    assert max(g[2] for g in grants) >= first_release - 0.05
    log = (tmp_path / "allocations.log").read_text()
    assert log.count("granted GPUs") == 3 and log.count("released GPUs") == 3


def test_asking_for_more_gpus_than_visible_is_an_error_not_a_wait(tmp_path):
    with pytest.raises(RuntimeError, match="needs 8 GPUs; only 4 are visible"):
        with allocator.gpus(8, GPUS, owner="big", folder=str(tmp_path)):
            pass


def test_cpu_measurement_slot_is_exclusive(tmp_path):
    waits = []
    with allocator.cpu("a", folder=str(tmp_path)):
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=_take_cpu_slot, args=(str(tmp_path),))
        p.start()
        time.sleep(1.5)
        assert p.is_alive(), "the second job must wait for the slot"
        waits.append(True)
    p.join(timeout=30)
    assert p.exitcode == 0 and waits


def _take_cpu_slot(folder):
    with allocator.cpu("b", folder=folder):
        pass


def test_every_job_splits_the_cores_between_its_ranks_unless_the_user_set_threads(monkeypatch):
    from pytest_distperf.launch.devices import usable_cores
    from pytest_distperf.launch.launcher import agent_environment
    from pytest_distperf.spec.job import JobSpec

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    share = str(max(1, usable_cores() // 2))
    for device in ("cpu", "cuda"):  # on CUDA too: torch's default (all cores in every rank) oversubscribes
        assert agent_environment(JobSpec(world_size=2, device=device, strategy="ddp"))["OMP_NUM_THREADS"] == share
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert agent_environment(JobSpec(world_size=2, device="cuda", strategy="ddp"))["OMP_NUM_THREADS"] == "3"
