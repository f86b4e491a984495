#!/usr/bin/env bash
# Issue 67's task suite (results/task-suite/PLAN.md): the default recipe, unchanged, on each task, one run at a time.
# Usage: experiments/task_suite.sh SEED [NAME ...]   (NAME: basic gsm8k countdown code chain_sum ...; default all)
# Each run goes to runs/suite-NAME-seedS; its card is made with experiments/card.py into results/task-suite/.
# CODE=DIR runs the code of another checkout (a worktree at the plan's commit: edits here do not reach the runs).
# Each run holds runs/.cpu.lock: a bench started as `flock runs/.cpu.lock CMD` waits for the run and runs alone.
set -u
cd "$(dirname "$0")/.."
code=${CODE:-.}
seed=$1; shift
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(basic gsm8k countdown code chain_sum products basic_arithmetic propositional_logic
                                 syllogism simple_equations letter_counting)
for name in "${names[@]}"; do
  case $name in
    basic|countdown|code) task=(--task "$name") ;;
    gsm8k) task=(--task gsm8k --eval-size 1319) ;;
    letter_counting) task=(--task "rg:letter_counting:min_words=1,max_words=3") ;;  # the survey's easier config
    word_sorting) task=(--task "rg:word_sorting:min_words=2,max_words=4,max_word_length=6") ;;  # a replacement
    *) task=(--task "rg:$name") ;;
  esac
  out=runs/suite-$name-seed$seed
  [ -f "$out/summary.json" ] && { echo "$name: done already"; continue; }
  sleep 5  # a bench waiting for the lock gets it before the next run
  echo "$(date -u +%H:%M) $name seed $seed"
  PYTHONPATH="$code/src" flock runs/.cpu.lock \
    .venv/bin/python -m cpu_grpo train "${task[@]}" --seed "$seed" --threads 2 --output-dir "$out" > "$out.log" 2>&1
  rc=$?
  echo "$(date -u +%H:%M) $name seed $seed rc=$rc"
  [ $rc -eq 0 ] && .venv/bin/python experiments/card.py "$out" "results/task-suite/$name-seed$seed" --plots accuracy.png
done
