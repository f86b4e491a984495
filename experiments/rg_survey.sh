#!/bin/sh
# Base accuracy of a model on reasoning-gym tasks (issue 67: the suite's tasks are chosen among those whose base
# accuracy is between 5% and 60%): greedy, on the held-out rows a seed-0 run would evaluate (eval's --seed 1), one
# per-problem record file per task under results/rg-survey/. Usage: sh experiments/rg_survey.sh MODEL N TOKENS TASK...
# (a TASK may carry its config as --task takes it: letter_counting:min_words=1,max_words=3)
model=$1 n=$2 tokens=$3
shift 3
for task in "$@"; do
  name=$(echo "$task" | sed 's/:/--/')  # a task with its config: letter_counting:min_words=1 -> letter_counting--min_words=1
  out="results/rg-survey/$(echo "$model" | tr '/' '_')-$name.jsonl"
  [ -s "$out" ] && continue
  .venv/bin/cpu-grpo eval --model "$model" --task "rg:$task" --n "$n" --max-new-tokens "$tokens" --output "$out" \
    > "/tmp/rg-survey-$name.log" 2>&1 || echo "$task failed: /tmp/rg-survey-$name.log"
done
