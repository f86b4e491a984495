#!/usr/bin/env bash
# Issue 67's demo runs (results/demo-recipe/README.md): bf16 seeds 0-4, fp32 seeds 0-2, one after the other.
# Usage: experiments/demo_recipe.sh [RUN ...]   (RUN: bf16-seed0 ... fp32-seed2; default all eight)
# CODE=DIR runs the code of another checkout (a worktree at the plan's commit, so that edits here do not reach
# the runs); the runs and their logs go to this checkout's runs/.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
code=${CODE:-$root}
cd "$code"
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(bf16-seed0 bf16-seed1 bf16-seed2 fp32-seed0 bf16-seed3 bf16-seed4 fp32-seed1 fp32-seed2)
for run in "${runs[@]}"; do
  dtype=${run%%-*}; seed=${run##*seed}
  extra=(); [ "$dtype" = fp32 ] && extra=(--bf16 false)
  out=$root/runs/demo-recipe-$run
  [ -f "$out/summary.json" ] && { echo "$run: done already"; continue; }
  echo "$(date -u +%H:%M) $run"
  PYTHONPATH="$code/src" "$root/.venv/bin/python" -m cpu_grpo demo --seed "$seed" "${extra[@]}" --output-dir "$out" \
    > "$root/runs/demo-recipe-$run.log" 2>&1
  echo "$(date -u +%H:%M) $run rc=$?"
done
