#!/usr/bin/env bash
# The same short training run at two commits, one after the other on this machine: each step's time, reward and
# loss side by side (and whether rewards, losses and gradient norms are equal at every step), so that a refactor
# shows it changed neither the speed nor what was computed.
#
#   bench/commits.sh OLD NEW [train options]     (default options: --profile quick --seed 0 --eval-size 0)
#
# Each commit is checked out in a temporary worktree and run with this checkout's .venv (PYTHONPATH=its src).
# Run it alone on the CPU: the two runs are compared with each other, not with other days.
set -euo pipefail
old=$1 new=$2
shift 2
opts=("$@")
[ ${#opts[@]} -gt 0 ] || opts=(--profile quick --seed 0 --eval-size 0)
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'for c in "$work"/src-*; do git -C "$root" worktree remove --force "$c" 2>/dev/null || true; done; rm -rf "$work"' EXIT
for commit in "$old" "$new"; do
  git -C "$root" worktree add --detach --force "$work/src-$commit" "$commit" >/dev/null 2>&1
  start=$(date +%s)
  PYTHONPATH="$work/src-$commit/src" "$root/.venv/bin/python" -m cpu_grpo train "${opts[@]}" \
    --output-dir "$work/run-$commit" >"$work/$commit.log" 2>&1 || { tail -5 "$work/$commit.log"; exit 1; }
  echo "$commit: $(( $(date +%s) - start )) s for the whole command"
done
"$root/.venv/bin/python" - "$work/run-$old/metrics.jsonl" "$work/run-$new/metrics.jsonl" "$old" "$new" <<'EOF'
import json, sys
a, b = ([json.loads(line) for line in open(p)] for p in sys.argv[1:3])
print(f"\n| step | reward {sys.argv[3]} | reward {sys.argv[4]} | loss {sys.argv[3]} | loss {sys.argv[4]} | "
      f"seconds {sys.argv[3]} | seconds {sys.argv[4]} |\n|---|---|---|---|---|---|---|")
for x, y in zip(a, b, strict=True):
    print(f"| {x['step']} | {x['reward']:.4f} | {y['reward']:.4f} | {x['loss']:.4f} | {y['loss']:.4f} | "
          f"{x['step_seconds']:.1f} | {y['step_seconds']:.1f} |")
ta, tb = sum(x["step_seconds"] for x in a), sum(y["step_seconds"] for y in b)
same = {name: all(x[k] == y[k] for x, y in zip(a, b))
        for k, name in (("reward", "rewards"), ("loss", "losses"), ("grad_norm", "gradient norms"))}
print(f"\nsteps: {ta:.0f} s and {tb:.0f} s ({tb / ta:.2f}x); at every step, "
      + ", ".join(f"{name} {'identical' if ok else 'differ'}" for name, ok in same.items()))
EOF
