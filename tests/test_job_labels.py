"""Jobs of one test whose labels would read the same although their configurations differ are told apart: the
first keeps its label, a later one gets the fields it differs in (spec/job.py). A job no other job of its test is
confused with keeps its label, so its baselines stay where they are."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_distperf.spec.job import FunctionRef, JobSpec, LabelScope, label_difference

W = dict(world_size=2, device="cpu", strategy="ddp", workload=FunctionRef("bench", "make_workload"))
LABEL = "ddp bench:make_workload x2 cpu"


def test_a_job_alone_keeps_its_label_also_off_its_defaults():
    assert JobSpec(**W).describe() == JobSpec(**W, steps=5).describe() == LABEL  # outside a test: as always
    assert LabelScope().label(JobSpec(**W, steps=5)).describe() == LABEL  # nothing to tell it from
    assert LabelScope().label(JobSpec(world_size=2, device="cpu", strategy="ddp", steps=20)).describe() == (
        "ddp tiny x2 cpu")


def test_jobs_that_read_the_same_are_told_apart_by_what_differs():
    label = LabelScope().label
    a, b = label(JobSpec(**W)), label(JobSpec(**W, steps=5))
    c = label(JobSpec(**W, steps=5, warmup_steps=1, seed=7))
    again = label(JobSpec(**W, steps=5))  # the same configuration: the same label
    moved = dataclasses.replace(b, sys_path=["/elsewhere"], measure_once=False)  # bookkeeping only
    injected = label(JobSpec(**W, shape_overrides={"extra_work": 0.4}))  # named by its own suffix (baselines.py)
    zero3 = label(JobSpec(world_size=2, device="cpu", strategy="deepspeed",
                          options={"stage": 3, "ds_config": {"zero_optimization": {"stage3_prefetch_bucket_size": 5e7}}}))
    plain3 = label(JobSpec(world_size=2, device="cpu", strategy="deepspeed", options={"stage": 3}))
    small = label(JobSpec(world_size=2, device="cpu", strategy="deepspeed", options={"stage": 3},
                          shape_overrides={"n_layers": 4}))
    assert [j.describe() for j in (a, b, c, again, moved, injected)] == [
        LABEL, f"{LABEL} steps=5", f"{LABEL} seed=7 steps=5 warmup=1", f"{LABEL} steps=5", f"{LABEL} steps=5", LABEL]
    assert zero3.describe() == "deepspeed[stage=3] tiny x2 cpu"
    assert plain3.describe() == "deepspeed[stage=3] tiny x2 cpu ds_config=(unset)"
    assert small.describe() == "deepspeed[stage=3] tiny x2 cpu ds_config=(unset) n_layers=4"
    # the label is no part of the configuration: the hash (and so a stored baseline's) is the job's as before
    assert b.config_hash() == JobSpec(**W, steps=5).config_hash() and "label_suffix" not in b.config_dict()


def test_label_difference_is_short_and_names_keywords():
    first = {"steps": 10, "seed": 1, "options": {"a": 1}, "shape_overrides": {}}
    assert label_difference(first, first) == ""
    assert label_difference(first, {**first, "options": {"a": 2, "b": "x" * 40}}) == \
        " a=2 b=xxxxxxxxxxxxxxx~" + label_difference(first, {**first, "options": {"a": 2, "b": "x" * 40}})[-8:]
    many = {"steps": 1, "seed": 2, "options": {"a": 3, "b": 4, "c": 5}, "shape_overrides": {}}
    assert label_difference(first, many) == " a=3 b=4 c=5 +2 more"


PERF_TEST = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_two(distperf):
    a, b = distperf.job("ddp"), distperf.job("ddp", steps=5)
    print("LABELS", repr(a.describe()), repr(b.describe()))

@pytest.mark.distperf(world_size=2)
def test_one(distperf):
    print("LABELS", repr(distperf.job("ddp", steps=5).describe()))
"""


def test_the_distperf_fixture_tells_a_tests_jobs_apart_and_no_other_tests(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf=PERF_TEST)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*LABELS 'ddp tiny x2 cpu' 'ddp tiny x2 cpu steps=5'*",
                                 "*LABELS 'ddp tiny x2 cpu'*"])
