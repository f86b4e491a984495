#!/usr/bin/env bash
# Issue 90's demo runs (results/demo-format/PLAN.md): the demo at seeds 0, 1, 2, one after the other, alone.
# Usage: experiments/demo_format.sh [SEED ...]   (default 0 1 2)
# CODE=DIR runs the code of another checkout (a worktree at the plan's commit, so that edits here do not reach
# the runs); the runs and their logs go to this checkout's runs/.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
code=${CODE:-$root}
cd "$code"
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2)
for seed in "${seeds[@]}"; do
  out=$root/runs/demo-format-seed$seed
  [ -f "$out/summary.json" ] && { echo "seed $seed: done already"; continue; }
  echo "$(date -u +%H:%M) seed $seed"
  PYTHONPATH="$code/src" "$root/.venv/bin/python" -m cpu_grpo demo --seed "$seed" --output-dir "$out" \
    > "$root/runs/demo-format-seed$seed.log" 2>&1
  echo "$(date -u +%H:%M) seed $seed rc=$?"
done
