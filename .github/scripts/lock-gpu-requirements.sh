#!/usr/bin/env bash
# Regenerate .github/gpu-requirements.txt, the hashed lock the GPU workflows install with --require-hashes, from
# .github/gpu-constraints.txt and pyproject.toml's [all,test] extras. Run it on a machine that reaches PyPI and
# https://download.pytorch.org/whl/cu130 (the lock is for linux x86_64 and the Python version given, default the
# GPU runner's 3.12), then commit the result with the constraint change and refreshed baselines.
#
#   bash .github/scripts/lock-gpu-requirements.sh [PYTHON_VERSION]
set -euo pipefail

python_version=${1:-3.12}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "pip-tools==7.5.1"
out="$work/gpu-requirements.txt"
# --allow-unsafe: setuptools too (the workflows build the editable install with --no-build-isolation).
"$work/venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras --no-header \
  --extra all --extra test --constraint "$root/.github/gpu-constraints.txt" \
  --extra-index-url https://download.pytorch.org/whl/cu130 \
  --pip-args "--python-version $python_version --platform manylinux_2_28_x86_64 --only-binary=:all:" \
  --output-file "$out" "$root/pyproject.toml"
echo "setuptools>=77" > "$work/build.in"
"$work/venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --no-header \
  --output-file "$work/build.txt" "$work/build.in"

{
  sed -n '1,/^# lock-status:/{/^# lock-status:/d;p}' "$root/.github/gpu-requirements.txt" \
    | sed '/^# HONEST STATUS/,/^# indexes/d'
  echo "# lock-status: complete"
  cat "$out"
  grep -v '^#' "$work/build.txt"
} > "$root/.github/gpu-requirements.txt.new"
mv "$root/.github/gpu-requirements.txt.new" "$root/.github/gpu-requirements.txt"
echo "wrote $root/.github/gpu-requirements.txt"
