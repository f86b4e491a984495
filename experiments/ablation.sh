#!/usr/bin/env bash
# Issue 67's ablation (results/ablation/PLAN.md): the default recipe against the code task's, one knob at a
# time, on rg:basic_arithmetic; one run at a time under runs/.cpu.lock; each run's card made after it.
# Usage: experiments/ablation.sh SEED [ARM ...]   ARM: code lr 96 nodyn (default: these four), codemask
# CODE=DIR runs the code of another checkout (the suite's worktree at 4faa34c).
set -u
cd "$(dirname "$0")/.."
code=${CODE:-.}
seed=$1; shift
arms=("$@")
[ ${#arms[@]} -eq 0 ] && arms=(code lr 96 nodyn)
for arm in "${arms[@]}"; do
  case $arm in
    code) flags=(--learning-rate 2e-4 --max-new-tokens 96 --dynamic-sampling 1 --eval-max-new-tokens 256) ;;
    lr) flags=(--learning-rate 2e-4) ;;
    96) flags=(--max-new-tokens 96 --eval-max-new-tokens 256) ;;
    nodyn) flags=(--dynamic-sampling 1) ;;
    codemask) flags=(--learning-rate 2e-4 --max-new-tokens 96 --dynamic-sampling 1 --eval-max-new-tokens 256
                     --mask-truncated-completions) ;;  # the follow-up: the code recipe, cut completions masked
    *) echo "unknown arm $arm"; exit 2 ;;
  esac
  out=runs/ablation-$arm-seed$seed
  [ -f "$out/summary.json" ] && { echo "$arm: done already"; continue; }
  base=runs/suite-basic_arithmetic-seed$seed/eval_before.jsonl  # greedy, the same problems: reused
  card=results/task-suite/basic_arithmetic-seed$seed/eval_before.jsonl.gz  # or its card's compact records
  mkdir -p "$out"
  if [ -f "$base" ]; then cp -n "$base" "$out/"
  elif [ -f "$card" ] && [ ! -f "$out/eval_before.jsonl" ]; then zcat "$card" > "$out/eval_before.jsonl"; fi
  sleep 5
  echo "$(date -u +%H:%M) $arm seed $seed"
  PYTHONPATH="$code/src" flock runs/.cpu.lock .venv/bin/python -m cpu_grpo train --task rg:basic_arithmetic \
    --seed "$seed" --threads 2 "${flags[@]}" --output-dir "$out" > "$out.log" 2>&1
  rc=$?
  echo "$(date -u +%H:%M) $arm seed $seed rc=$rc"
  [ $rc -eq 0 ] && .venv/bin/python experiments/card.py "$out" "results/ablation/$arm-seed$seed"  # no plots: one
  # stage's before and after are the table's numbers
done
