"""What changed (figures/explain.py): kernel names, self time, the per-run table and the diff of two sides."""

from __future__ import annotations

import pytest

from pytest_distperf.figures import explain as ex
from pytest_distperf.rank.probes.trace import STEP_MARK, Trace


def test_kernel_names_drop_templates_parameters_and_return_types():
    assert ex.kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, "
                          "at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, "
                          "at::detail::Array<char*, 3>)") == "at::native::vectorized_elementwise_kernel"
    assert ex.kernel_name("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        "ncclDevKernel_AllGather_RING_LL"
    assert ex.kernel_name("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32") == \
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"
    assert ex.kernel_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)") == \
        "at::native::anon::cunn_SoftMaxForward"
    assert ex.kernel_name("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>"
                          "(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params) [clone .kd]") == \
        "cutlass::Kernel2"


def _e(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_self_time_subtracts_direct_children_per_thread():
    events = [_e("aten::linear", 0, 100), _e("aten::t", 5, 10), _e("aten::addmm", 20, 70),
              _e("aten::copy_", 30, 20),  # inside addmm: taken from addmm, not from linear
              _e("aten::mm", 10, 50, tid=2)]  # another thread: no parent, whatever its time overlaps
    selfs = {(e["name"], e["tid"]): s for e, s in ex.self_times(events)}
    assert selfs == {("aten::linear", 1): 20, ("aten::t", 1): 10, ("aten::addmm", 1): 50, ("aten::copy_", 1): 20,
                     ("aten::mm", 2): 50}
    # a child sticking out of its parent by rounding is clamped: no self time below zero
    clamped = {e["name"]: s for e, s in ex.self_times([_e("a", 0, 10), _e("b", 2, 10)])}
    assert clamped == {"a": 2, "b": 10}


def test_a_cpu_trace_gives_op_and_collective_rows_per_step():
    events = []
    for step in range(2):
        t0 = step * 1000
        events += [_e(STEP_MARK, t0, 500, cat="user_annotation"), _e("aten::mm", t0 + 10, 100),
                   _e("aten::empty", t0 + 20, 10), _e("c10d::allreduce_", t0 + 200, 50),
                   _e("gloo:all_reduce", t0 + 210, 30, tid=7, cat="user_annotation"),
                   _e("Optimizer.step#SGD.step", t0 + 300, 100, cat="user_annotation"),
                   _e("aten::add_", t0 + 310, 40)]
    events.append(_e("aten::mm", 5000, 100))  # outside every step: not counted
    table = ex.rank_table(Trace(events), cuda=False)
    assert table == {"op:aten::mm": [1.0, 90e-6], "op:aten::empty": [1.0, 10e-6],
                     "collective:c10d::allreduce_": [1.0, 50e-6], "collective:gloo:all_reduce": [1.0, 30e-6],
                     "op:aten::add_": [1.0, 40e-6]}


def test_a_table_keeps_the_top_rows_and_sums_the_rest():
    table = ex.trimmed({f"op:o{i}": [1.0, float(i)] for i in range(40)}, top=30)
    assert len(table) == 31 and "op:o39" in table and "op:o9" not in table
    assert table[ex.OTHER] == [10.0, float(sum(range(10)))]
    # over ranks: the mean, a rank without a row counting 0
    assert ex.run_table([{"op:a": [2.0, 4.0]}, {"op:a": [2.0, 2.0], "op:b": [1.0, 1.0]}]) == \
        {"op:a": [2.0, 3.0], "op:b": [0.5, 0.5]}
    assert ex.run_table([{"op:a": [1.0, 1.0]}, None]) is None


def _run(**rows: tuple[float, float]) -> dict[str, list[float]]:
    return {f"op:{name}": list(v) for name, v in rows.items()}


def test_an_a_a_comparison_changes_no_row_beyond_its_noise():
    base = [_run(mm=(2, 0.010), add=(3, 0.002)), _run(mm=(2, 0.011), add=(3, 0.0021)),
            _run(mm=(2, 0.0105), add=(3, 0.0019))]
    cand = [_run(mm=(2, 0.0102), add=(3, 0.0020)), _run(mm=(2, 0.0108), add=(3, 0.0022)),
            _run(mm=(2, 0.0099), add=(3, 0.0020))]
    e = ex.explain(base, cand)
    assert not e.any_beyond_noise and [r.status for r in e.rows] == ["", ""]
    assert e.lines()[0].endswith("no row changed beyond its noise")


def test_the_diff_ranks_by_change_flags_new_and_gone_rows_and_gives_shares():
    base = [_run(mm=(2, 0.010), add=(3, 0.002), old=(1, 0.001)), _run(mm=(2, 0.0102), add=(3, 0.0021), old=(1, 0.001))]
    cand = [_run(mm=(2, 0.0101), add=(3, 0.002), sort=(1, 0.020)), _run(mm=(2, 0.0103), add=(3, 0.0019), sort=(1, 0.021))]
    e = ex.explain(base, cand)
    names = [r.name for r in e.rows]
    assert names[0] == "op:sort" and names[1] == "op:old"
    top, gone = e.rows[0], e.rows[1]
    assert top.status == "new" and top.beyond_noise and top.reference_count == 0 and top.candidate_count == 1
    assert top.change == pytest.approx(0.0205) and top.noise == pytest.approx(0.001)
    assert gone.status == "gone" and gone.change == pytest.approx(-0.001) and gone.beyond_noise
    assert not any(r.beyond_noise for r in e.rows if r.name in ("op:mm", "op:add"))
    assert sum(r.share for r in e.rows) == pytest.approx(1.0) and top.share > 1.0  # "gone" moved the other way
    assert "op:sort [new]: 0x 0 ms -> 1x 20.5 ms (+20.5 ms" in e.lines()[1]
    assert ex.Explanation.from_json(e.to_json()) == e


def test_one_run_a_side_leaves_the_noise_unknown_and_a_missing_table_explains_nothing():
    e = ex.explain([_run(mm=(1, 0.01))], [_run(mm=(1, 0.02))])
    assert e.rows[0].noise is None and not e.rows[0].beyond_noise and "noise unknown" in e.lines()[1]
    missing = ex.explain([None], [_run(mm=(1, 0.02))])
    assert missing.rows == [] and "the baseline holds no operator/kernel table" in missing.lines()[0]
