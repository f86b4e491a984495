#!/usr/bin/env bash
# Issue 67's demo runs (results/demo-recipe/README.md): bf16 seeds 0-4, fp32 seeds 0-2, one after the other.
# Usage: experiments/demo_recipe.sh [RUN ...]   (RUN: bf16-seed0 ... fp32-seed2; default all eight)
set -u
cd "$(dirname "$0")/.."
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(bf16-seed0 bf16-seed1 bf16-seed2 fp32-seed0 bf16-seed3 bf16-seed4 fp32-seed1 fp32-seed2)
for run in "${runs[@]}"; do
  dtype=${run%%-*}; seed=${run##*seed}
  extra=(); [ "$dtype" = fp32 ] && extra=(--bf16 false)
  out=runs/demo-recipe-$run
  [ -f "$out/summary.json" ] && { echo "$run: done already"; continue; }
  echo "$(date -u +%H:%M) $run"
  .venv/bin/cpu-grpo demo --seed "$seed" "${extra[@]}" --output-dir "$out" > "runs/demo-recipe-$run.log" 2>&1
  echo "$(date -u +%H:%M) $run rc=$?"
done
