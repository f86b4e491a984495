#!/bin/sh
# Base accuracy of a model on reasoning-gym tasks (issue 67: the suite's tasks are chosen among those whose base
# accuracy is between 5% and 60%): greedy, on the held-out rows a seed-0 run would evaluate (eval's --seed 1), one
# per-problem record file per task under results/rg-survey/. Usage: sh experiments/rg_survey.sh MODEL N TOKENS TASK...
model=$1 n=$2 tokens=$3
shift 3
for task in "$@"; do
  out="results/rg-survey/$(echo "$model" | tr '/' '_')-$task.jsonl"
  [ -s "$out" ] && continue
  .venv/bin/cpu-grpo eval --model "$model" --task "rg:$task" --n "$n" --max-new-tokens "$tokens" --output "$out" \
    > "/tmp/rg-survey-$task.log" 2>&1 || echo "$task failed: /tmp/rg-survey-$task.log"
done
