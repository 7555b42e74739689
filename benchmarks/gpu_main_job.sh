#!/usr/bin/env bash
# Usage (device machine, from the repository root, .whl carried): OUT=/path LIMIT=590 bash benchmarks/gpu_main_job.sh
# Writes console.txt (set-up and outcomes), main.txt (the whole pytest output) and main.json (the JSON report) to $OUT.
# README's GPU main job on a fresh machine: the set-up (env, op builds), then the main job; everything to $OUT
exec > >(tee "$OUT/console.txt") 2>&1
start=$SECONDS
. "${ENV_SH:-../shared/gpu/env.sh}"
echo "== build-ops"; python -m pytest_distperf build-ops 2>&1 | tail -5
echo "== set-up took $((SECONDS - start)) s"
# the op builds' ninja files, to compare with what the ranks leave there (a rank must load, not rebuild)
ext=$(python -c "from pytest_distperf.strategies.ds_ops import cache_dir; print(cache_dir())")
save_ninja() { head -n 400 "$ext"/*/build.ninja "$ext"/*/.ninja_log > "$OUT/ninja-$1.txt" 2>&1
  ls -la --time-style=+%T "$ext"/*/*.so >> "$OUT/ninja-$1.txt" 2>&1; }
save_ninja set-up
t=$SECONDS
timeout $((${LIMIT:-590} - SECONDS)) python -m pytest --distperf -m zero3 --distperf-world-size 1 --distperf-session-budget ${BUDGET:-360} \
  -p no:cacheprovider -rfEsxX -v --durations=0 --distperf-json $OUT/main.json > $OUT/main.txt 2>&1
echo "== main job rc $? in $((SECONDS - t)) s; whole $((SECONDS - start)) s"
save_ninja main-job
grep -E "PASSED|FAILED|XFAIL|XPASS|SKIPPED|ERROR|passed|failed" $OUT/main.txt | tail -40
