#!/usr/bin/env bash
# Issue 69's proof (results/agent-gsm8k/PLAN.md): GSM8K with the calculator (arm A) against without (arm B), each
# from its supervised warm start, one run at a time under runs/.cpu.lock, each run's card made after it
# (with the calculator's tool use read from the transcripts: experiments/agent_transcripts.py).
# Usage: experiments/agent_gsm8k.sh [JOB ...]   JOB: warm-calculator warm-text A0 B0 A1 B1 (default: all, in order),
#   B0-long B1-long: the plan's minutes rule: B's run copied and resumed to the steps that fill A's training minutes
#   at B's mean step time (where A's exceed B's by more than 10%), then evaluated again.
# CODE=DIR runs the code of another checkout (a worktree at the plan's commit: edits here do not reach the runs).
set -u
cd "$(dirname "$0")/.."
code=${CODE:-.}
jobs=("$@")
[ ${#jobs[@]} -eq 0 ] && jobs=(warm-calculator warm-text A0 B0 A1 B1)
system() { PYTHONPATH="$code/src:$code/experiments" .venv/bin/python -c "from tool_warmstart import SYSTEM; print(SYSTEM['$1'])"; }
for job in "${jobs[@]}"; do
  case $job in
    warm-*) arm=${job#warm-}; out=runs/agent-gsm8k-warm-$arm
      [ -f "$out/config.json" ] && { echo "$job: done already"; continue; }
      echo "$(date -u +%H:%M) $job"
      PYTHONPATH="$code/src" flock runs/.cpu.lock .venv/bin/python "$code/experiments/tool_warmstart.py" "$arm" "$out" \
        > "$out.log" 2>&1
      echo "$(date -u +%H:%M) $job rc=$?"; continue ;;
    B?-long) seed=${job:1:1}; base=runs/agent-gsm8k-text-seed$seed; out=$base-long
      [ -f "results/agent-gsm8k/text-seed$seed-long/README.md" ] && { echo "$job: done already"; continue; }
      steps=$(.venv/bin/python - "runs/agent-gsm8k-calculator-seed$seed" "$base" <<'EOF'
import json, sys
steps = [[json.loads(line)["step_seconds"] for line in open(f"{run}/metrics.jsonl")] for run in sys.argv[1:]]
a, b = sum(steps[0]), sum(steps[1])
print(round(a / (b / len(steps[1]))) if a > 1.1 * b else 0)  # 0: A's minutes within 10% of B's, nothing to fill
EOF
)
      [ "${steps:-0}" -gt 0 ] || { echo "$job: no steps to add ($steps)"; continue; }
      [ -d "$out" ] || cp -r "$base" "$out"
      echo "$(date -u +%H:%M) $job: $steps steps"
      PYTHONPATH="$code/src" flock runs/.cpu.lock .venv/bin/python -m cpu_grpo train --resume --output-dir "$out" \
        --steps "$steps" --threads 2 > "$out.log" 2>&1
      rc=$?
      echo "$(date -u +%H:%M) $job rc=$rc"
      [ $rc -eq 0 ] && .venv/bin/python experiments/card.py "$out" "results/agent-gsm8k/text-seed$seed-long" \
        --plots accuracy.png
      continue ;;
    A*) arm=calculator; tools=(--tools calculator) ;;
    B*) arm=text; tools=() ;;
    *) echo "unknown job $job"; exit 2 ;;
  esac
  seed=${job:1}
  out=runs/agent-gsm8k-$arm-seed$seed
  [ -f "$out/summary.json" ] && { echo "$job: done already"; continue; }
  first=runs/agent-gsm8k-$arm-seed0/eval_before.jsonl  # greedy: the warm-started model's base evaluation, reused
  [ "$seed" != 0 ] && [ -f "$first" ] && mkdir -p "$out" && cp -n "$first" "$out/"
  sleep 5
  echo "$(date -u +%H:%M) $job"
  PYTHONPATH="$code/src" flock runs/.cpu.lock .venv/bin/python -m cpu_grpo train --model "runs/agent-gsm8k-warm-$arm" \
    --task gsm8k --eval-size 1319 --instruction "" --system-prompt "$(system $arm)" "${tools[@]}" --seed "$seed" \
    --threads 2 --output-dir "$out" > "$out.log" 2>&1
  rc=$?
  echo "$(date -u +%H:%M) $job rc=$rc"
  [ $rc -eq 0 ] && .venv/bin/python experiments/card.py "$out" "results/agent-gsm8k/$arm-seed$seed" --plots accuracy.png \
    && [ $arm = calculator ] && PYTHONPATH="$code/src" .venv/bin/python experiments/agent_transcripts.py "$out" \
    "results/agent-gsm8k/$arm-seed$seed" > /dev/null
done
