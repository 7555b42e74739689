"""What changed (rank/time_table.py, figures/explain.py): kernel names, self time, the per-run table and the diff of two sides."""

from __future__ import annotations

import pytest

from pytest_distperf.figures import explain as ex
from pytest_distperf.rank import time_table as tt
from pytest_distperf.rank.probes.trace import STEP_MARK, Trace


def test_kernel_names_drop_templates_parameters_and_return_types():
    assert tt.kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, "
                          "at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, "
                          "at::detail::Array<char*, 3>)") == "at::native::vectorized_elementwise_kernel"
    assert tt.kernel_name("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        "ncclDevKernel_AllGather_RING_LL"
    assert tt.kernel_name("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32") == \
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"
    assert tt.kernel_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)") == \
        "at::native::anon::cunn_SoftMaxForward"
    assert tt.kernel_name("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>"
                          "(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params) [clone .kd]") == \
        "cutlass::Kernel2"


def _e(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_self_time_subtracts_direct_children_per_thread():
    events = [_e("aten::linear", 0, 100), _e("aten::t", 5, 10), _e("aten::addmm", 20, 70),
              _e("aten::copy_", 30, 20),  # inside addmm: taken from addmm, not from linear
              _e("aten::mm", 10, 50, tid=2)]  # another thread: no parent, whatever its time overlaps
    selfs = {(e["name"], e["tid"]): s for e, s in tt.self_times(events)}
    assert selfs == {("aten::linear", 1): 20, ("aten::t", 1): 10, ("aten::addmm", 1): 50, ("aten::copy_", 1): 20,
                     ("aten::mm", 2): 50}
    # a child sticking out of its parent by rounding is clamped: no self time below zero
    clamped = {e["name"]: s for e, s in tt.self_times([_e("a", 0, 10), _e("b", 2, 10)])}
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
    table = tt.rank_table(Trace(events), cuda=False)
    assert table == {"op:aten::mm": [1.0, 90e-6], "op:aten::empty": [1.0, 10e-6],
                     "collective:c10d::allreduce_": [1.0, 50e-6], "collective:gloo:all_reduce": [1.0, 30e-6],
                     "op:aten::add_": [1.0, 40e-6], tt.HOST_ROW: [1.0, 250e-6]}  # the step's time outside them


def test_a_table_keeps_the_top_rows_and_sums_the_rest():
    table = tt.trimmed({f"op:o{i}": [1.0, float(i)] for i in range(40)}, top=30)
    assert len(table) == 31 and "op:o39" in table and "op:o9" not in table
    assert table[tt.OTHER] == [10.0, float(sum(range(10)))]
    # over ranks: the mean, a rank without a row counting 0
    assert tt.run_table([{"op:a": [2.0, 4.0]}, {"op:a": [2.0, 2.0], "op:b": [1.0, 1.0]}]) == \
        {"op:a": [2.0, 3.0], "op:b": [0.5, 0.5]}
    assert tt.run_table([{"op:a": [1.0, 1.0]}, None]) is None


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
    # shares over the rows that stand out: each in range, signed by direction, their sizes add up to 100 %
    assert sum(abs(r.share) for r in e.rows if r.share is not None) == pytest.approx(1.0)
    assert top.share == pytest.approx(0.0205 / 0.0215) and gone.share == pytest.approx(-0.001 / 0.0215)
    assert all(r.share is None for r in e.rows if r.name in ("op:mm", "op:add"))  # within their noise: none
    assert "op:sort [new]: 0x 0 ms -> 1x 20.5 ms (+20.5 ms, 95% of the change beyond noise;" in e.lines()[1]
    assert "op:old [gone]: 1x 1 ms -> 0x 0 ms (-1 ms, shrank: 5% of the change beyond noise;" in e.lines()[2]
    assert ex.Explanation.from_json(e.to_json()) == e



def _rows(**rows: tuple[float, float, float, float]) -> dict[str, list[float]]:
    return {name.replace("__", ":"): list(v) for name, v in rows.items()}


def _user_trial_sides(by_side: int = 3) -> tuple[list[dict], list[dict]]:
    """A matmul added in a CPU step (a user's trial): aten::mm 5 -> 23 a step and its aten::t and transpose more
    often, both cheap; gloo's all-reduce and the host's own time shrank by more than mm grew, each within its noise."""
    base, cand = [], []
    for i in range(by_side):
        j = (i % 3) - 1  # -1, 0, 1: each side's spread
        base.append({"op:aten::mm": [5.0, 0.000132 + 0.00001 * j], "op:aten::t": [10.0, 0.00002 + 0.000002 * j],
                     "op:aten::transpose": [10.0, 0.00001 + 0.000001 * j],
                     "collective:gloo:all_reduce": [1.0, 0.020 + 0.004 * j], "host:(outside operators)":
                     [1.0, 0.015 + 0.003 * j], "op:aten::add": [3.0, 0.001 + 0.0001 * j]})
        cand.append({"op:aten::mm": [23.0, 0.000846 + 0.00001 * j], "op:aten::t": [46.0, 0.0000762 + 0.000002 * j],
                     "op:aten::transpose": [46.0, 0.0000429 + 0.000001 * j],
                     "collective:gloo:all_reduce": [1.0, 0.0161 + 0.004 * j], "host:(outside operators)":
                     [1.0, 0.0116 + 0.003 * j], "op:aten::add": [3.0, 0.001 + 0.0001 * j]})
    return base, cand


@pytest.mark.parametrize("failed", [[("step_time", "time")], [("aten_ops_per_step", "count")]])
def test_a_grown_row_among_noisy_rows_that_shrank_more_has_a_positive_share_and_ranks_first(failed):
    # the net change of the family is negative (the noisy rows shrank by ~7 ms), yet aten::mm grew 0.714 ms beyond
    # its noise: its share is of the change beyond noise, positive, and it heads the ranking under either verdict
    # (the cheap aten::t, whose count changed more, is a small part of it)
    base, cand = _user_trial_sides()
    e = ex.explain(base, cand, *ex.explain_by(failed))
    mm = e.rows[0]
    assert mm.name == "op:aten::mm" and mm.beyond_noise and mm.change == pytest.approx(0.000714)
    assert sum(r.change for r in e.rows) < 0  # the net change: what made its old share negative
    assert mm.share == pytest.approx(0.714 / (0.714 + 0.0562 + 0.0329))
    assert [r.name for r in e.rows[:3]] == ["op:aten::mm", "op:aten::t", "op:aten::transpose"]
    assert all(0 < r.share <= 1 for r in e.rows[:3])
    noisy = [r for r in e.rows if r.name in ("collective:gloo:all_reduce", "host:(outside operators)")]
    assert all(not r.stands_out and r.share is None for r in noisy)
    assert all(r.stands_out for r in e.rows[:3]) and not any(r.stands_out for r in e.rows[3:])
    line = e.lines()[1]
    assert line.startswith("  op:aten::mm: 5x 0.132 ms -> 23x 0.846 ms (+0.714 ms, 89% of the change beyond noise;")
    within = next(x for x in e.lines() if "gloo:all_reduce" in x)
    assert "of the change" not in within and "within its noise" in within


def test_replaced_rows_share_the_change_in_range_each_signed_by_its_direction():
    # a dtype change on a GPU: one kernel gone, two new ones in its place, a third kernel unchanged but noisy
    def run(new: bool, j: float) -> dict[str, list[float]]:
        t = {"kernel:gemm_noisy": [4.0, 0.002 + 0.0002 * j]}
        if new:
            t.update({"kernel:gemm_bf16": [2.0, 0.0000167 + 1e-7 * j], "kernel:cast_bf16": [2.0, 0.00001 + 1e-7 * j]})
        else:
            t["kernel:gemm_f32"] = [2.0, 0.0000853 + 1e-7 * j]
        return t

    base, cand = [run(False, j) for j in (-1, 0, 1)], [run(True, j) for j in (1, -1, 0)]
    e = ex.explain(base, cand, *ex.explain_by([("gpu_time", "time")]))
    by = {r.name: r for r in e.rows}
    gone, new, cast = by["kernel:gemm_f32"], by["kernel:gemm_bf16"], by["kernel:cast_bf16"]
    assert (gone.status, new.status, cast.status) == ("gone", "new", "new")
    assert all(-1 <= r.share <= 1 for r in (gone, new, cast)) and by["kernel:gemm_noisy"].share is None
    assert gone.share < 0 < new.share and cast.share > 0
    assert sum(abs(r.share) for r in (gone, new, cast)) == pytest.approx(1.0)
    assert [r.name for r in e.rows[:3]] == ["kernel:gemm_f32", "kernel:gemm_bf16", "kernel:cast_bf16"]
    text = "\n".join(e.lines())
    assert "kernel:gemm_f32 [gone]: 2x 0.0853 ms -> 0x 0 ms (-0.0853 ms, shrank: 76% of the change beyond noise;" \
        in text
    assert "(+0.0167 ms, 15% of the change beyond noise;" in text
    assert all(cell[6] in ("–", "76%", "15%", "9%") for cell in e.cells())  # the HTML table: sizes, no sign


def test_the_pr_comment_names_the_row_that_carries_the_change():
    from pytest_distperf.decide.verdicts import MetricVerdict
    from pytest_distperf.report.document import SessionDocument, TestDocument
    from pytest_distperf.report.pr_comment import render_pr_comment

    base, cand = _user_trial_sides()
    e = ex.explain(base, cand, *ex.explain_by([("aten_ops_per_step", "count")]))
    v = MetricVerdict(test="t.py::test_x", job="ddp tiny x2 cpu", metric="aten_ops_per_step", metric_kind="count",
                      unit="", direction="lower", status="fail", baseline=1.0, current=2.0, explanation=e.to_json(),
                      fails=True)
    doc = SessionDocument([TestDocument("t.py::test_x", "failed", 1.0, verdicts=[v])], {}, {}).to_json()
    comment = render_pr_comment(doc)
    [line] = [x for x in comment.splitlines() if x.startswith("What changed in")]
    assert line == ("What changed in ddp tiny x2 cpu: `op:aten::mm` +0.714 ms (89% of the change); "
                    "`op:aten::t` +0.0562 ms (7% of the change); `op:aten::transpose` +0.0329 ms (4% of the change)")
    # the same rows, in the same order, as the terminal's lines and the HTML report's table read back from the JSON
    again = ex.Explanation.from_json(e.to_json())
    top = ["op:aten::mm", "op:aten::t", "op:aten::transpose"]
    assert again == e and [c[0] for c in again.cells()[:3]] == top
    assert [x.split(": ")[0].strip() for x in again.lines()[1:4]] == top
    assert [name for name, _, _ in again.contributions()] == top
    # an older document (its shares of the net change, no ranking stored) is read under the one rule
    old = e.to_json()
    del old["by"], old["first"]
    old["rows"] = [{**r, "share": -0.11} for r in reversed(old["rows"])]
    assert ex.Explanation.from_json(old).short().startswith("`op:aten::mm` +0.714 ms (89% of the change)")


def test_an_a_a_comparison_names_no_row_in_the_pr_comment():
    base, _ = _user_trial_sides()
    e = ex.explain(base, list(reversed(base)), *ex.explain_by([("step_time", "time")]))
    assert not e.any_beyond_noise and all(r.share is None for r in e.rows)
    assert e.short() == "no row changed beyond its noise"
    assert e.lines()[0].endswith("no row changed beyond its noise")
    assert all("of the change" not in x for x in e.lines())


def test_a_row_whose_count_changed_stands_out_even_when_its_time_is_within_its_noise():
    # an added collective: its time is no more than the spread of its runs (they wait for the peers), its count
    # changed every run; the host's noisy time moved as much and is ranked after it
    base = [_run(mm=(2, 0.010), host=(1, 0.001)), _run(mm=(2, 0.010), host=(1, 0.006))]
    cand = [_run(mm=(2, 0.010), host=(1, 0.003), allreduce=(1, 0.0005)),
            _run(mm=(2, 0.010), host=(1, 0.008), allreduce=(1, 0.003))]
    e = ex.explain(base, cand, *ex.explain_by([("aten_ops_per_step", "count")]))  # only aten_ops_per_step failed
    top = e.rows[0]
    assert top.name == "op:allreduce" and top.count_changed and not top.beyond_noise and top.stands_out
    assert not e.rows[1].stands_out and abs(e.rows[1].change) >= abs(top.change)
    assert "count changed; time within its noise" in e.lines()[1]
    assert "no row changed beyond its noise" not in e.lines()[0]


def test_rows_of_the_clock_a_failed_figure_reads_come_first_and_a_summed_rest_last():
    # a CUDA table: an added sort shows as a new kernel (GPU clock) and as host ops that moved more microseconds
    # (the host's clock); under a failed gpu_time the kernel heads the explanation, and the host family's summed
    # rest, which names nothing, comes last
    def run(sort: bool, jitter: float) -> dict[str, list[float]]:
        t = {"kernel:gemm": [4.0, 0.001], "cpu:aten::mm": [4.0, 0.0003 + jitter], "cpu:(other)": [10.0, 0.00002]}
        if sort:
            t.update({"kernel:radixSort": [1.0, 0.00002], "cpu:aten::sort": [1.0, 0.0008],
                      "cpu:(other)": [40.0, 0.0002]})
        return t

    base, cand = [run(False, 0.0), run(False, 0.00001)], [run(True, 0.0), run(True, 0.00001)]
    failed = [("aten_ops_per_step", "count"), ("gpu_time", "time"), ("kernels_per_step", "count")]
    assert ex.explain_by(failed) == ("time", ("",))
    e = ex.explain(base, cand, *ex.explain_by(failed))
    names = [r.name for r in e.rows]
    assert names[:2] == ["kernel:radixSort", "cpu:aten::sort"]
    assert names[-1] == "cpu:(other)" and not e.rows[-1].stands_out  # it grew, but names nothing: never stands out
    # step_time reads every clock: all families alike, by |change|; the summed rest still after the named rows
    assert ex.explain_by([("step_time", "time")]) == ("time", ())
    names = [r.name for r in ex.explain(base, cand, *ex.explain_by([("step_time", "time")])).rows]
    assert names[:2] == ["cpu:aten::sort", "kernel:radixSort"] and names[-1] == "cpu:(other)"
    assert ex.explain_by([]) == ("time", ()) and ex.explain_by([("aten_ops_per_step", "count")]) == ("count", ("", tt.CPU))


def test_under_a_count_verdict_rows_rank_by_their_share_of_the_counts_change_and_cut_rows_are_not_shown():
    # an extra matmul in a block: aten::mm 3 -> 12 a step is most of the operators' change; the new autograd node
    # once a step, however new, is less of it; the module's FLOPs, another figure's rows, come after the operators
    base = [{**_run(mm=(3, 0.001), add=(2, 0.001)), "op:tiny": [1.0, 1e-6], "flops:mlp": [1e6, 0.0]}] * 3
    cand = [{**_run(mm=(12, 0.004), add=(2, 0.001)), "op:MmBackward0": [1.0, 5e-5], tt.OTHER: [1.0, 1e-6],
             "flops:mlp": [4e6, 0.0]}] * 3
    e = ex.explain(base, cand, *ex.explain_by([("aten_ops_per_step", "count")]))
    assert [r.name for r in e.rows][:2] == ["op:mm", "op:MmBackward0"]
    assert next(r for r in e.rows if r.name == "op:tiny").status == "cut"  # summed into (other): says nothing
    assert "op:tiny" not in [r.name for r in e.shown(5)]


def test_a_small_row_missing_from_a_trimmed_table_is_cut_not_gone():
    kept = {f"op:k{i}": [1.0, 0.01] for i in range(3)}
    base = [{**kept, "op:tiny": [1.0, 0.001]}, {**kept, "op:tiny": [1.0, 0.001]}]
    cand = [{**kept, tt.OTHER: [1.0, 0.001]}, {**kept, tt.OTHER: [1.0, 0.001]}]  # op:tiny summed into (other)
    tiny = next(r for r in ex.explain(base, cand).rows if r.name == "op:tiny")
    assert tiny.status == "cut" and not tiny.stands_out
    # just above a trimmed table's smallest kept row where it is seen: it may have shrunk below it, not gone
    small = {f"op:k{i}": [1.0, 0.0025 + 0.001 * i] for i in range(3)}
    base = [{**small, "op:to": [5.0, 0.003]}] * 2
    cand = [{**small, "op:sort": [2.0, 5.0], tt.OTHER: [5.0, 0.002]}] * 2
    e = ex.explain(base, cand, by="count")
    assert [r.name for r in e.rows][:1] == ["op:sort"] and e.rows[0].status == "new"
    assert next(r for r in e.rows if r.name == "op:to").status == "cut"

def test_module_rows_hold_each_modules_own_flops_with_repeated_blocks_folded():
    counts = {"Global": {"mm": 330}, "M": {"mm": 330}, "M.head": {"mm": 30},
              "M.layers.0": {"mm": 100}, "M.layers.0.mlp": {"mm": 90}, "M.layers.0.mlp.0": {"mm": 90},
              "M.layers.1": {"mm": 200}, "M.layers.1.mlp": {"mm": 180}, "M.layers.1.mlp.0": {"mm": 180}}
    rows = tt.module_rows(counts, steps=2)
    assert rows == {"flops:layers.*.mlp.0": [135.0, 0.0], "flops:head": [15.0, 0.0], "flops:layers.*": [15.0, 0.0]}
    assert sum(v[0] for v in rows.values()) == 330 / 2  # the rows add up to the step's FLOPs
    many = tt.module_rows({f"M.b{i}": {"mm": 100 + i} for i in range(tt.TOP_MODULES + 3)} | {"M": {"mm": 0}}, 1)
    assert len(many) == tt.TOP_MODULES + 1 and many[tt.MODULES_OTHER] == [303.0, 0.0]  # b0 + b1 + b2
    # flops: rows are kept whatever their (zero) time when a table is trimmed
    assert "flops:head" in tt.trimmed({**_run(a=(1, 2.0)), "flops:head": [15.0, 0.0]}, top=1)


def _seq(e: dict, seq: int, fwd_thread: int = 0) -> dict:
    return {**e, "args": {"Sequence number": seq, "Fwd thread id": fwd_thread}}


def test_module_time_rows_take_forward_ops_by_range_backward_ops_by_sequence_and_kernels_by_launch():
    mark = tt.MODULE_MARK
    events = [_e(STEP_MARK, 0, 1000, cat="user_annotation"),
              _e(mark + "Net", 10, 300, cat="user_annotation"),
              _e(mark + "Net.layers.0", 20, 100, cat="user_annotation"),
              _seq(_e("aten::addmm", 30, 60), 1),  # layers.0's own forward op
              _e(mark + "Net.layers.1", 130, 100, cat="user_annotation"),
              _seq(_e("aten::addmm", 140, 40), 2),
              _e(mark + "Net.layers.1.act", 190, 30, cat="user_annotation"),
              _seq(_e("aten::gelu", 195, 20), 3),  # the child's, not layers.1's
              _seq(_e("aten::mean", 320, 10), 4),  # the loss: under no module
              # backward on the autograd thread: by the sequence number of the node it evaluates
              _seq(_e(tt.BACKWARD_MARK + " AddmmBackward0", 400, 80, tid=9), 2, fwd_thread=1),
              _e("aten::mm", 410, 50, tid=9),
              _seq(_e(tt.BACKWARD_MARK + " MeanBackward0", 390, 5, tid=9), 4, fwd_thread=1)]
    cpu = tt.module_time_rows(Trace(events), cuda=False)
    assert cpu == {"module:layers.*": [2.0, pytest.approx((60 + 40 + 30 + 50) * 1e-6)],  # the node's own + its mm
                   "module:layers.*.act": [1.0, pytest.approx(20e-6)]}
    # on CUDA: the GPU time of the kernels each module's launches started, the backward's included
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1}
    kernel = {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "tid": 7}
    gpu = events + [{**launch, "ts": 40, "dur": 5, "args": {"correlation": 1}},
                    {**kernel, "ts": 600, "dur": 70, "args": {"correlation": 1}},
                    {**launch, "ts": 198, "dur": 5, "args": {"correlation": 2}},
                    {**kernel, "ts": 700, "dur": 20, "args": {"correlation": 2}},
                    {**launch, "ts": 420, "dur": 5, "tid": 9, "args": {"correlation": 3}},
                    {**kernel, "ts": 800, "dur": 90, "args": {"correlation": 3}}]
    assert tt.module_time_rows(Trace(gpu), cuda=True) == {"module:layers.*": [2.0, pytest.approx(160e-6)],
                                                          "module:layers.*.act": [1.0, pytest.approx(20e-6)]}
    # the module ranges are no parents in the op rows' self time: the step's host row keeps its time (the
    # backward ran on another thread)
    assert tt.cpu_rows(Trace(events))[tt.HOST_ROW] == [1.0, pytest.approx((1000 - 60 - 40 - 20 - 10) * 1e-6)]


def _cuda_step_events(collective: bool = False) -> list[dict]:
    events = []
    for step in range(2):
        t0 = step * 1000
        events += [_e(STEP_MARK, t0, 800, cat="user_annotation"), _e("aten::mm", t0 + 10, 100),
                   _e("cudaLaunchKernel", t0 + 20, 30, cat="cuda_runtime"),  # inside the op: the op's
                   _e("cudaDeviceSynchronize", t0 + 600, 200, cat="cuda_runtime")]  # the step's closing sync
        if collective:  # one rank: NCCL launches no kernel for it
            events.append(_e("c10d::allreduce_", t0 + 300, 40))
    return events


def test_a_cuda_table_has_the_host_side_as_a_family_of_its_own():
    table = tt.rank_table(Trace(_cuda_step_events()), cuda=True)
    assert table[tt.CUDA_HOST_ROW] == [1.0, pytest.approx(500e-6)]  # 800 - 100 - 200 a step
    assert table["cpu:aten::mm"] == [1.0, pytest.approx(100e-6)]  # an op's host time holds its CUDA calls
    assert tt.HOST_ROW not in table and tt.family(tt.CUDA_HOST_ROW) == tt.family("cpu:aten::mm") == tt.CPU
    slower = [{**table, tt.CUDA_HOST_ROW: [1.0, 900e-6]}] * 3
    row = next(r for r in ex.explain([table] * 3, slower).rows if r.name == tt.CUDA_HOST_ROW)
    assert row.share == 1.0 and row.beyond_noise  # its own family's change; beyond a noise of 0


def test_a_collective_that_launches_no_kernel_explains_a_cuda_count_verdict():
    before = tt.rank_table(Trace(_cuda_step_events()), cuda=True)
    after = tt.rank_table(Trace(_cuda_step_events(collective=True)), cuda=True)
    top = ex.explain([before] * 3, [after] * 3, by="count").rows[0]
    assert (top.name, top.status, top.candidate_count, top.count_changed) == \
        ("cpu:collective:c10d::allreduce_", "new", 1.0, True)


def test_a_cuda_tables_host_rows_are_trimmed_and_keep_the_host_row():
    rows = {f"cpu:op{i}": [1.0, float(i)] for i in range(40)}
    table = tt.trimmed({**rows, tt.CUDA_HOST_ROW: [1.0, 0.5]}, top=30)
    assert tt.CUDA_HOST_ROW in table and len([n for n in table if tt.family(n) == tt.CPU]) == 31
    assert table["cpu:(other)"][0] == 11.0  # the host row kept first, then 29 op rows: 11 summed


def test_an_operator_added_in_one_block_is_found_under_that_block_in_a_real_profile():
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    from pytest_distperf.rank.probes.trace import export

    class Block(torch.nn.Module):
        def __init__(self, extra: bool):
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
            self.extra = extra

        def forward(self, x):
            y = self.mlp(x)
            return y + torch.sort(y, dim=-1).values * 0 if self.extra else y

    def table(extra: bool) -> dict:
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList([Block(extra and i == 2) for i in range(4)])
        net = torch.nn.Sequential(*blocks)  # Sequential runs its blocks; the rows still fold their index
        x = torch.randn(32, 64)
        with profile(activities=[ProfilerActivity.CPU]) as prof, tt.module_ranges():
            for _ in range(2):
                with record_function(STEP_MARK):
                    net(x).square().mean().backward()
        return tt.rank_table(Trace([e for e in export(prof, complete_only=False) if e.get("ph") == "X"]), False)

    base, cand = table(False), table(True)
    assert {"module:*.mlp.0", "module:*.mlp.2"} <= set(base) and "module:*" not in base
    assert cand["module:*"][0] == 4.0 and cand["module:*"][1] > 0  # the blocks' own ops: the sort and its add
    e = ex.explain([base], [cand])
    row = next(r for r in e.rows if r.name == "module:*")
    assert row.status == "new" and row.share is not None
    assert all(r.share is None or abs(r.share) < 100 for r in e.rows)


def test_a_module_whose_flops_changed_explains_a_flops_verdict_first():
    base = [{**_run(mm=(4, 0.010), add=(2, 0.001)), "flops:mlp": [1e6, 0.0], "flops:head": [2e5, 0.0]}] * 3
    cand = [{**_run(mm=(5, 0.012), add=(2, 0.001)), "flops:mlp": [1e6, 0.0], "flops:head": [2e5, 0.0],
             "flops:mlp.extra": [5e5, 0.0]}] * 3
    e = ex.explain(base, cand, *ex.explain_by([("flops_per_step", "count")]))
    assert e.rows[0].name == "flops:mlp.extra" and e.rows[0].status == "new" and e.rows[0].count_changed
    assert next(r for r in e.rows if r.name == "flops:mlp").stands_out is False
    line = next(x for x in e.lines() if "flops:mlp.extra" in x)
    assert "0 FLOP -> 5e+05 FLOP a step (+5e+05 FLOP, 100% of the FLOPs' change; changed)" in line
    assert all("flops:" not in name for name, _, _ in e.contributions())  # no time to draw


def test_one_run_a_side_leaves_the_noise_unknown_and_a_missing_table_explains_nothing():
    e = ex.explain([_run(mm=(1, 0.01))], [_run(mm=(1, 0.02))])
    assert e.rows[0].noise is None and not e.rows[0].beyond_noise and "noise unknown" in e.lines()[1]
    missing = ex.explain([None], [_run(mm=(1, 0.02))])
    assert missing.rows == [] and "the baseline holds no operator/kernel table" in missing.lines()[0]


def test_a_baseline_round_trips_its_tables_and_an_older_one_explains_nothing(tmp_path):
    from pytest_distperf.decide.policy import Policy
    from pytest_distperf.decide.regression import decide_job
    from pytest_distperf.decide.verdicts import describe_verdict
    from pytest_distperf.store.baselines import BaselineFile, JobEntry, MetricSeries, Store, parse

    tables = [_run(mm=(2, 0.010)), _run(mm=(2, 0.011), sort=(1, 0.002))]
    entry = JobEntry("job", "h", {}, {"step_time": MetricSeries("s", "lower", "time", [0.1, 0.11])}, explain=tables)
    doc = BaselineFile("t.py::test_x", "cpu-x", {}, {}, "now", {"job": entry})
    path = Store(str(tmp_path)).save(doc)
    again = Store(str(tmp_path)).load(path, "t.py::test_x")
    assert again is not None and again.jobs["job"].explain == tables and again.to_dict() == doc.to_dict()
    older = doc.to_dict()
    del older["jobs"]["job"]["explain"]
    assert parse(older, "old.json").jobs["job"].explain is None
    bad = doc.to_dict()
    bad["jobs"]["job"]["explain"] = [{"op:mm": [1.0]}]
    with pytest.raises(Exception, match="expected \\[count, seconds\\]"):
        parse(bad, "bad.json")
    # a failed verdict against the older file says there is nothing to explain, and does not fail for it
    old_entry = parse(older, "old.json").jobs["job"]
    v = decide_job("t", "job", old_entry, "h", {"step_time": MetricSeries("s", "lower", "time", [0.2, 0.21])},
                   Policy(), "")[0]
    v.explanation = ex.explain(old_entry.explain or [None], tables).to_json()
    assert any("the baseline holds no operator/kernel table" in line for line in describe_verdict(v, Policy()))


EXTRA_OP_STEP = """
import os

import torch


def stepper():
    model = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64)
    big = torch.randn(1 << 16)
    extra = os.environ.get("DP_EXTRA_OP") == "1"  # the code change: one more operator in the step

    def step():
        loss = model(x).square().mean()
        loss.backward()
        if extra:
            torch.sort(big)
        return loss.detach()

    return step
"""


@pytest.mark.slow
def test_a_step_that_gains_an_operator_fails_naming_it_as_what_changed(pytester: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch):
    import json

    pytester.makepyfile(usersteps=EXTRA_OP_STEP)
    pytester.makepyfile(test_steps="""
        import pytest
        from usersteps import stepper

        @pytest.mark.distperf(world_size=2, repeats=2)
        def test_step(distperf):
            distperf.measure(distperf.step_job(stepper, steps=4, warmup=1))
    """)
    inner = ("--distperf", "-p", "no:cacheprovider", "--distperf-max-repeats=3")
    pytester.runpytest(*inner, "--distperf-save").assert_outcomes(passed=1)
    monkeypatch.setenv("DP_EXTRA_OP", "1")
    result = pytester.runpytest(*inner, "--distperf-json", "report.json", "--distperf-html", "report.html",
                                "--distperf-pr-comment", "comment.md")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*distperf baseline gate failed for test_steps.py::test_step*",
                                 "*what changed (per step, median of 3 baseline / * current runs, ranks averaged*",
                                 "*op:aten::sort [[]new[]]: 0x 0 ms -> 2x * ms (+* ms, *% of the change beyond noise; count changed; "
                                 "time beyond its noise (* ms))"])
    test = json.loads((pytester.path / "report.json").read_text())["tests"][0]
    failed = [v for v in test["verdicts"] if v.get("fails")]
    assert failed and all(v["explained"] for v in failed)
    [diff] = test["explanations"].values()  # once for the job, however many of its verdicts it explains
    assert diff["rows"][0]["name"] == "op:aten::sort"
    assert len(diff["rows"]) > 5  # the whole table, not only the rows the message shows
    html = (pytester.path / "report.html").read_text()
    assert '<table class="explain">' in html and "op:aten::sort [new]" in html
    chart = html[html.index('class="chart contributions"'):]  # the contribution bars: the sort's, slower, first
    assert chart.index("op:aten::sort [new]") < chart.index("</svg>") and 'fill="#cf222e"' in chart
    comment = (pytester.path / "comment.md").read_text()
    assert "What changed in step:usersteps:stepper x2 cpu: `op:aten::sort` +" in comment and "(new; " in comment
    # distperf_explain: every verdict compared against the baseline says what changed, a passing one too
    monkeypatch.delenv("DP_EXTRA_OP")
    clean = pytester.runpytest(*inner, "-o", "distperf_explain=true", "--distperf-json", "clean.json")
    clean.assert_outcomes(passed=1)
    clean.stdout.fnmatch_lines(["*step:usersteps:stepper x2 cpu (step_time *, *flops_per_step PASS*",
                                "*what changed (per step, median of 3 baseline / * current runs*"])
    test = json.loads((pytester.path / "clean.json").read_text())["tests"][0]
    assert all(v["explained"] for v in test["verdicts"] if v["status"] != "new")
    assert all(diff["rows"] for diff in test["explanations"].values())


def _synthetic_run(step: float, table: dict[str, list[float]]):
    from pytest_distperf.rank.results import RankResult, RunResult, WorkResult
    from pytest_distperf.spec.job import JobSpec

    rank = RankResult(rank=0, step_times=[step * f for f in (1.0, 1.01, 0.99)], losses=[1.0] * 3,
                      cuda_peak_allocated=None, cuda_peak_reserved=None, host_peak_rss=1 << 20,
                      host_rss_before_build=0, optimizer_state_bytes=0, num_params=1, tokens_per_step=1,
                      build_seconds=0.0, warmup_seconds=0.0, work=WorkResult(steps=3, explain=table))
    return RunResult(spec=JobSpec(world_size=1, device="cpu", strategy="ddp"), ranks=[rank], wall_seconds=1.0)


def test_head_vs_base_says_what_changed_under_a_failed_verdict():
    from pytest_distperf.decide import against
    from pytest_distperf.decide.policy import Policy
    from pytest_distperf.launch.fingerprint import machine_class

    checkout = against.BaseCheckout(ref="main", exact=True, head_commit="1" * 40, base_commit="2" * 40,
                                    repo_root="/repo", worktree="/base", harness_dir="/harness")
    machine = machine_class("cpu", 1)
    gate = against.AgainstGate(checkout, "t.py::test_x", Policy(), machine=machine, environment={})
    [paired] = [gate._job(_synthetic_run(0.1, {}).spec)]
    for i in range(4):
        jitter = 1 + 0.001 * i
        paired.sources[0].append(_synthetic_run(0.2 * jitter, _run(mm=(2, 0.01 * jitter), sort=(1, 0.1 * jitter))))
        paired.base_runs.append(_synthetic_run(0.1 * jitter, _run(mm=(2, 0.01 * jitter))))
    outcome = gate.finish(test_passed=True)
    assert outcome.failed and outcome.message is not None
    assert outcome.message.count("what changed (per step, median of 4 base / 4 head runs") == 1  # once a job
    assert ("op:sort [new]: 0x 0 ms -> 1x 100 ms (+100 ms, 100% of the change beyond noise; count changed; time "
            "beyond its noise"
            in outcome.message)
    step_time = next(r for r in outcome.records if r.metric == "step_time")
    assert step_time.explanation["rows"][0]["name"] == "op:sort"


def test_the_json_report_holds_a_jobs_diff_once_and_reads_it_back_into_each_verdict():
    from pytest_distperf.decide.verdicts import MetricVerdict
    from pytest_distperf.report.document import TestDocument

    diff = ex.explain([_run(mm=(2, 0.01))] * 2, [_run(mm=(2, 0.01), sort=(1, 0.1))] * 2).to_json()

    def verdict(metric: str, explained: bool) -> MetricVerdict:
        return MetricVerdict(test="t.py::test_x", job="ddp tiny x2 cpu", metric=metric, metric_kind="time", unit="s",
                             direction="lower",
                             status="fail", baseline=1.0, current=2.0, explanation=diff if explained else None)

    doc = TestDocument("t.py::test_x", "failed", 1.0, verdicts=[verdict("step_time", True), verdict("gpu_time", True),
                                                                 verdict("peak_memory", False)])
    d = doc.to_json()
    assert d["explanations"] == {"ddp tiny x2 cpu": diff} and [v["explained"] for v in d["verdicts"]] == [
        True, True, False] and not any("explanation" in v for v in d["verdicts"])
    assert [v.explanation for v in TestDocument.from_json(d).verdicts] == [diff, diff, None]


def test_a_row_some_reference_runs_cut_is_read_from_the_runs_that_kept_it():
    # a host loop of 100 adds: aten::add, 3 a step before, was cut from one baseline run's table (its time near the
    # cut-off); the candidate's 103 a step are far above every cut-off: the count changed, it is not "cut"
    kept = {f"op:k{i}": [1.0, 0.001 + 0.0001 * i] for i in range(3)}
    base = [{**kept, "op:add": [3.0, 0.0011]}, {**kept, tt.OTHER: [3.0, 0.0009]}, {**kept, "op:add": [3.0, 0.0012]}]
    cand = [{**kept, "op:add": [103.0, 0.02]}, {**kept, "op:add": [103.0, 0.021]}, {**kept, "op:add": [103.0, 0.02]}]
    e = ex.explain(base, cand, *ex.explain_by([("aten_ops_per_step", "count")]))
    add = e.rows[0]
    assert add.name == "op:add" and add.status == "" and add.count_changed
    assert (add.reference_count, add.candidate_count) == (3.0, 103.0)
    assert add.reference_time == pytest.approx(0.00115)  # the median of the two runs that kept it


def test_a_summed_rest_never_stands_out_and_a_change_under_the_material_share_says_so():
    # an A/A: (other) moved more than its spread (many small rows, each within its noise), but names nothing
    base = [_run(mm=(2, 0.100), add=(3, 0.0020)) | {tt.OTHER: [280.0, 0.0003]},
            _run(mm=(2, 0.101), add=(3, 0.0021)) | {tt.OTHER: [280.0, 0.0004]}]
    cand = [_run(mm=(2, 0.1005), add=(3, 0.0030)) | {tt.OTHER: [280.0, 0.0005]},
            _run(mm=(2, 0.1002), add=(3, 0.0031)) | {tt.OTHER: [280.0, 0.0006]}]
    e = ex.explain(base, cand)
    assert not e.any_beyond_noise and e.rows[-1].name == tt.OTHER
    # aten::add moved 1 ms, ten times its noise, but under 1 % of a ~100 ms step: it does not stand out, and says why
    line = next(x for x in e.lines() if "op:add" in x)
    assert "beyond its noise (0.1 ms) but under 1% of the step" in line


def test_a_row_in_one_run_of_a_side_and_none_of_the_other_is_no_change():
    # an A/A: one candidate run's table holds a small row (a range's self time about the cut-off) that the side's
    # other runs and every reference run lack: its presence is noise, not a change
    kept = {f"op:k{i}": [1.0, 0.001 + 0.0001 * i] for i in range(3)}
    base = [{**kept, tt.OTHER: [5.0, 0.0001]}] * 3
    cand = [{**kept, "op:GeluBackward0": [1.5, 0.005], tt.OTHER: [5.0, 0.0001]}] + [{**kept, tt.OTHER: [5.0, 0.0001]}] * 2
    e = ex.explain(base, cand, *ex.explain_by([("aten_ops_per_step", "count")]))
    row = next(r for r in e.rows if r.name == "op:GeluBackward0")
    assert row.status == "cut" and not row.stands_out and not e.any_beyond_noise
    # in two of the three candidate runs, far above every cut-off, and in no reference run: new
    cand[1] = cand[0]
    row = next(r for r in ex.explain(base, cand, by="count").rows if r.name == "op:GeluBackward0")
    assert row.status == "new" and row.count_changed and row.candidate_count == 1.5
