#!/usr/bin/env bash
# Usage (device machine, repository root, .whl carried; one call each, LIMIT under the call's 10 minutes):
#   OUT=/path LIMIT=580 ENV_SH=../shared/gpu/env.sh bash benchmarks/gpu_checks.sh explain     # every change, CUDA
#   OUT=/path LIMIT=580 ENV_SH=../shared/gpu/env.sh bash benchmarks/gpu_checks.sh scripts     # ddp, then HF slowed
#   OUT=/path LIMIT=580 ENV_SH=../shared/gpu/env.sh bash benchmarks/gpu_checks.sh hf          # HF: save, slowed gate
#   OUT=/path LIMIT=580 ENV_SH=../shared/gpu/env.sh bash benchmarks/gpu_checks.sh frameworks  # DeepSpeed, Lightning
#   SCRIPTS=lightning OUT=/path LIMIT=580 ... bash benchmarks/gpu_checks.sh frameworks  # one of them (~250 s)
#   OUT=/path LIMIT=200 ENV_SH=../shared/gpu/env.sh bash benchmarks/gpu_checks.sh after  # a run's fixed cost, 1b pair
#   OUT=/path LIMIT=580 ENV_SH=../shared/gpu/env.sh bash benchmarks/gpu_checks.sh tests  # the plugin's GPU-gated tests
#     (build_cost.py's phases after timing, then run_timeline.py's end-to-end split of 4 runs)
# The GPU checks of benchmarks/results/explain.md and script-jobs.md, one device call each (`frameworks`: the
# DeepSpeed and Lightning scripts' gates, unchanged and slowed; their comparisons with step jobs ran on 1xH100);
# each part writes its JSON to $OUT as it ends, so a part cut off by LIMIT leaves the ones before it. HF needs
# transformers in the image's Python (`pip install transformers`, or wheels carried in .whl/hf).
case "${1:-explain}" in explain|scripts|hf|frameworks|after|tests) ;;
  *) echo "usage: bash benchmarks/gpu_checks.sh explain|scripts|hf|frameworks|after|tests" >&2; exit 2 ;; esac
start=$SECONDS
. "${ENV_SH:-../shared/gpu/env.sh}"
left() { echo $((${LIMIT:-580} - (SECONDS - start))); }
part() {  # name, then the command; skipped when under a minute is left
  local name=$1; shift
  [ "$(left)" -lt 60 ] && { echo "== $name: no time left"; return; }
  local t=$SECONDS; timeout "$(left)" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc $? in $((SECONDS - t)) s"; grep -v "^$" "$OUT/$name.txt" | tail -8 | cut -c1-300
}
case "${1:-explain}" in
  explain) part explain python benchmarks/explain_changes.py --device cuda --world-size 1 --width 1024 \
             --json "$OUT/explain-changes-cuda.json" ;;
  scripts) part ddp python benchmarks/script_jobs.py --script ddp --device cuda --world-size 1 --pairs 3 \
             --json "$OUT/script-jobs-ddp-cuda.json"
           [ -d .whl/hf ] && python -m pip install -q --no-index --find-links .whl/hf transformers >/dev/null 2>&1
           part hf_slowed python benchmarks/script_jobs.py --script hf_trainer --device cuda --world-size 1 \
             --parts slowed --json "$OUT/script-jobs-hf-slowed-cuda.json" ;;
  hf) [ -d .whl/hf ] && python -m pip install -q --no-index --find-links .whl/hf transformers >/dev/null 2>&1
      part hf_slowed python benchmarks/script_jobs.py --script hf_trainer --device cuda --world-size 1 \
        --parts slowed --json "$OUT/script-jobs-hf-slowed-cuda.json" ;;
  frameworks) for s in ${SCRIPTS:-deepspeed lightning}; do
             part "$s" python benchmarks/script_jobs.py --script "$s" --device cuda --world-size 1 \
               --parts unchanged,slowed --json "$OUT/script-jobs-$s-gates-cuda.json"; done ;;
  after) for s in ${JOBS:-fsdp2 zero3}; do  # JOBS=fsdp2: the FSDP2 one alone (~30 s)
           case $s in fsdp2) opts='{}' strategy=fsdp2 ;; zero3) opts='{"stage": 3}' strategy=deepspeed ;; esac
           part "after-$s" python benchmarks/build_cost.py --device cuda --strategy $strategy --options "$opts" \
             --shape 1b --after --top 30 --trace "$OUT/trace-$s-1b.json"
           [ -f "$OUT/trace-$s-1b.json" ] && gzip -f "$OUT/trace-$s-1b.json"
           part "timeline-$s" python benchmarks/run_timeline.py --device cuda --strategy $strategy --options "$opts" \
             --shape 1b --world-size 1 --steps 20 --runs 4 --json "$OUT/timeline-$s-1b.json"; done ;;
  tests) [ -d .whl/hf ] && python -m pip install -q --no-index --find-links .whl/hf transformers >/dev/null 2>&1
         # the tests marked gpu, which skip on the CPU box: a CPU job creates no CUDA context beside a GPU, CUDA use
         # in a CPU job fails loudly, the clock lock, a CUDA job's GPU window and work figures, a CUDA OOM's message,
         # the GPU launchers' scripts unchanged
         part tests python -m pytest tests -m gpu -p no:cacheprovider -rfEsx -v --durations=10 ;;
esac
echo "== whole $((SECONDS - start)) s"
