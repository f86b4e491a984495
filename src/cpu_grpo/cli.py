"""`cpu-grpo <command>`: train, demo, eval. Imports torch only inside commands, so --help is fast."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import fields

from . import config as config_mod
from .errors import UserError
from .train import launch


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=None, help=f"named settings: {', '.join(config_mod.PROFILES)}")
    p.add_argument("--config", default=None, help="YAML or JSON file of config fields")
    p.add_argument("--resume", action="store_true", help="continue the run in the output directory from its newest "
                   "complete checkpoint")
    group = p.add_argument_group("config fields (override profile and file)")
    for f in fields(config_mod.TrainConfig):
        default = f.default if not callable(f.default_factory) else f.default_factory()
        alone = isinstance(default, bool) or "const" in f.metadata  # --use-lora, --bf16 alone mean true
        flag = {"nargs": "?", "const": "true"} if alone else {}
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}", default=None, metavar="X",
                           help=f"{f.metadata['help']} (default: {default})", **flag)
    trl = p.add_argument_group("TRL's names for the same fields (docs/python-api.md)")
    for name in (*config_mod.RENAMED, *config_mod.BATCH):
        ours = config_mod.RENAMED.get(name, "prompts_per_step")
        trl.add_argument(f"--{name.replace('_', '-')}", dest=f"cfg_{name}", default=None, metavar="X",
                         help=f"TRL's GRPOConfig.{name}: sets {ours}")


def config_from(args) -> tuple[config_mod.TrainConfig, str]:
    """The run's config as config.resolve makes it from the profile, --config, the fields and --resume."""
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    return config_mod.resolve(args.profile or args.default_profile, args.config, overrides, args.resume)


def cmd_train(args) -> int:
    if hasattr(args, "nproc"):
        launch.check_counts(args)
    if (getattr(args, "nproc", 1) > 1 or getattr(args, "nnodes", 1) > 1) and not launch.launched():
        return launch.torchrun(args)  # torchrun in this process, our arguments
    from .engine.threads import wait_passively_when_busy
    from .machine import allocator

    if not launch.launched():  # before torch loads; the ranks of a data-parallel run share the cores out instead
        wait_passively_when_busy()
    from .train import distributed
    from .train.loop import train

    cfg, note = config_from(args)
    if args.own_process:  # `cpu-grpo train` itself, not main() called by a program: it may restart with jemalloc
        allocator.restart_with(cfg.allocator, args.argv)
    if note:  # after the restart, so that it is said once
        print(note)
    try:
        train(cfg, profile=args.profile or args.default_profile, resume=args.resume)
    finally:
        distributed.close()
    return 0


def cmd_eval(args) -> int:
    from pathlib import Path

    if args.samples < 0 or (args.samples > 0 and args.temperature <= 0) or args.max_new_tokens < 1:
        print("cpu-grpo: --samples must be >= 0, sampling needs --temperature > 0, and --max-new-tokens >= 1.",
              file=sys.stderr)
        return 2
    from .engine.threads import wait_passively_when_busy

    wait_passively_when_busy()  # before torch loads
    import torch

    from .data.loaders import RowFormat
    from .data.rewards import check_columns, sandbox_for
    from .engine.models import load_model
    from .engine.sampler import Sampler, Sampling, stop_ids
    from .engine.threads import set_threads
    from .eval.evaluate import Judge, run_eval, run_sampled
    from .eval.tables import level_tables, metric_summary, sampled_summary, sampled_table
    from .machine.doctor import bf16_wanted
    from .train.runstate import offered_environments, offered_tools
    from .train.step import StopFlag

    if args.output and not Path(args.output).resolve().parent.is_dir():  # found now, not after the evaluation
        print(f"cpu-grpo: --output {args.output}: its directory does not exist: create it, or choose another path.",
              file=sys.stderr)
        return 2
    trained = _trained_with(args.model, args.task)  # a checkpoint is asked the way it was trained, unless told
    ask = {k: getattr(args, k) if getattr(args, k) is not None else trained[k]
           for k in ("instruction", "system_prompt", "prompt_column", "column_map", "correct_reward")}
    set_threads(log=print)
    examples = _eval_examples(args, RowFormat.parse(ask["prompt_column"], ask["column_map"]))
    judge = Judge.of(trained["rewards"], ask["correct_reward"], args.max_new_tokens, trained["reward_timeout"])
    check_columns([judge.fn], [ex for ex in examples if judge.by_reward(ex)], args.task,
                  ["environments"] if trained["environment"] else [])
    if line := sandbox_for([judge.fn], args.allow_unisolated_code):
        print(line, file=sys.stderr)
    model, tok = load_model(args.model, args.trust_remote_code)
    # the dtype its run evaluated in (an old run's bf16: true included)
    bf16 = bf16_wanted(config_mod.coerce(config_mod.TrainConfig.__dataclass_fields__["bf16"], trained["bf16"]))
    sampler, stops = Sampler(model, dtype=torch.bfloat16 if bf16 else torch.float32), stop_ids(tok, model)
    instruction, system = ask["instruction"], ask["system_prompt"]
    if args.samples > 0:
        sampling = Sampling(args.max_new_tokens, stops, tok.pad_token_id, args.temperature)
        records = run_sampled(sampler, tok, examples, instruction, sampling, args.samples, args.seed, args.output,
                              system=system, judge=judge)
        print(sampled_table(sampled_summary(records)))
        return 0
    greedy = Sampling(args.max_new_tokens, stops, tok.pad_token_id, temperature=0.0)
    stop = StopFlag(log=lambda line: print(line, flush=True),  # SIGTERM or Ctrl-C: the batch at hand finishes
                    doing="finishing this batch and keeping its records (again to abort)")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    tools = offered_tools(trained["tools"], args.model, tok)  # a run with tools is evaluated with them
    environments = offered_environments(trained["environment"], args.model, tok, trained["rewards"])
    records = run_eval(sampler, tok, examples, instruction, greedy, args.output, system=system, judge=judge,
                       stop=lambda: stop.requested, tools=tools, max_calls=trained["max_tool_calling_iterations"],
                       environments=environments)
    print(level_tables(metric_summary(records)))
    return 0


def _eval_examples(args, fmt) -> list:
    """The problems `cpu-grpo eval` scores: the --split of the task's rows (default: the held-out rows when the
    model's run trained on this task, else all), at most --n; one line says how many are rows a run trains on."""
    from .data.loaders import Task, load_task

    drawn = Task.of(args.task).drawn  # rows drawn by seed: --n of them, 250 by default
    rows = load_task(args.task, n=(args.n or 250) if drawn else None, seed=args.seed, split=None,
                     on_error="skip" if args.skip_bad_lines else "raise", fmt=fmt)
    ran_on = _trained_on(args.model, args.task)
    split = args.split or ("held-out" if ran_on else "all")
    chosen = [ex for ex in rows if split == "all" or ex.split == {"held-out": "test", "train": "train"}[split]]
    trained = sum(ex.split == "train" for ex in rows)
    if trained or ran_on or args.split:
        why = "" if args.split else " (the default: held-out rows for a model trained on this task, else all)"
        print(f"task {args.task}: {len(rows)} rows, {trained} of them in the training split of a run on it"
              f"{'; this model was trained on it' if ran_on else ''}: evaluating "
              f"{ {'all': 'all rows', 'held-out': 'the held-out rows', 'train': 'the training rows'}[split]}{why}",
              file=sys.stderr)
    if not chosen:
        raise UserError(f"task {args.task} has no {split} rows: choose another --split.")
    return chosen[:args.n]


def _trained_on(model: str, task: str) -> bool:
    """Whether `model` is a checkpoint whose run trained on `task` (a stage's task or one part of a joined one)."""
    from pathlib import Path

    from .data.loaders import Task

    saved = Path(model) / "train_config.yaml"
    cfg = config_mod.load_file(saved) if saved.is_file() else {}
    specs = [cfg.get("task")] + [st.get("task") for st in cfg.get("stages") or [] if isinstance(st, dict)]
    parts = {p for spec in specs if isinstance(spec, str) for p in Task.of(spec).parts}

    def same(a: str, b: str) -> bool:
        here, there = Path(a).expanduser(), Path(b).expanduser()
        return a == b or here.exists() and here.resolve() == there.resolve()

    return any(same(mine, theirs) for mine in Task.of(task).parts for theirs in parts)


def _trained_with(model: str, task: str) -> dict:
    """The fields a checkpoint was trained with (its train_config.yaml) that say how to ask, judge and run it, else
    the training defaults (with the verifier the task brings, if it brings one, as its judge)."""
    from pathlib import Path

    from .data.loaders import Task

    saved, verifier = Path(model) / "train_config.yaml", Task.of(task).verifier
    mine = config_mod.load_file(saved) if saved.is_file() else {"rewards": [verifier]} if verifier else {}
    fields = ("instruction", "system_prompt", "prompt_column", "column_map", "correct_reward", "rewards",
              "reward_timeout", "bf16", "max_tool_calling_iterations")
    return {**{k: mine.get(k, config_mod.TrainConfig.__dataclass_fields__[k].default) if k != "rewards" else
               list(mine.get("rewards") or ["correctness"]) for k in fields},
            "tools": list(mine.get("tools") or []), "environment": list(mine.get("environment") or [])}


def cmd_compare(args) -> int:
    from pathlib import Path

    from .eval.compare import compare_runs

    text = compare_runs(args.run_a, args.run_b, args.include_trained)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)
    return 0


def cmd_plan(args) -> int:
    from .machine.planner import Machine, Shapes, fit_budget, forecast

    cfg, note = config_from(args)
    if note:
        print(note)
    shapes, machine = Shapes.of_model(cfg.model), Machine.measure()
    print(forecast(cfg, shapes, machine, cfg.model, args.completion_len))
    if args.budget or args.memory:
        seconds = _duration(args.budget) if args.budget else None
        memory = _gigabytes(args.memory) if args.memory else None
        fits = fit_budget(cfg, shapes, machine, seconds, memory)
        if not fits:
            print(f"nothing tried fits {args.budget or ''} {args.memory or ''}: fewer --steps or a smaller model")
            return 1
        print("settings that fit, nearest to yours first:")
        for changes, p in fits[:5]:
            flags = " ".join(f"--{k.replace('_', '-')} {str(v).lower()}" for k, v in changes.items())
            print(f"  {flags}: {p.step_s:.0f} s a step, {p.peak_gb:.1f} GB, {p.wall_s / 60:.0f} min")
    return 0


def _duration(text: str) -> float:
    """'90m', '2h', '45s' or seconds -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except ValueError:
        raise config_mod.ConfigError(f"--budget {text!r}: give a duration such as 30m, 2h or 900s") from None


def _gigabytes(text: str) -> float:
    """'8G', '8GB' or '8' -> 8.0."""
    try:
        return float(text.upper().removesuffix("B").removesuffix("G"))
    except ValueError:
        raise config_mod.ConfigError(f"--memory {text!r}: give gigabytes such as 8G") from None


def cmd_doctor(args) -> int:
    import json

    from .machine.doctor import facts, render

    f = facts(args.seconds)
    print(json.dumps(f, indent=2) if args.json else render(f))
    return 0


def cmd_export(args) -> int:
    from .export.run import Request, export

    req = Request(args.run, args.format, args.quant or "", args.out or "", args.ollama or "", not args.no_verify,
                  args.overwrite, args.keep_template, args.verify_n)
    result = export(req)
    print(f"wrote {result.out} ({', '.join(result.files)}); see {result.out / 'export.md'}")
    if result.command:
        print(f"Ollama: {result.command}")
    code, sentence = result.verdict()
    if sentence:
        print(f"cpu-grpo: {sentence}", file=sys.stderr)
    return code


def cmd_app(args) -> int:
    try:
        from .app.ui import launch
    except ImportError:
        print("cpu-grpo: the web app needs gradio: pip install 'cpu-grpo[app]'.", file=sys.stderr)
        return 2
    launch(args.runs_dir, args.host, args.port, args.auth, args.share, data_dirs=tuple(args.data_dir),
           allow_code=args.allow_code, max_runs=args.max_runs)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cpu-grpo", description="GRPO fine-tuning of small language models on a CPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    _training_commands(sub)
    _other_commands(sub)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.own_process = argv is None
    try:
        return args.func(args)
    except KeyboardInterrupt:  # outside the training loop (which saves a checkpoint and returns by itself)
        print("cpu-grpo: interrupted; nothing was saved from the step in progress.", file=sys.stderr)
        return 130
    except (UserError, FileNotFoundError) as e:  # ours: one sentence, no traceback
        rank = os.environ.get("RANK") if launch.launched() else None
        mine = rank is not None and not str(e).startswith("rank ")
        print(f"cpu-grpo: {'rank ' + rank + ': ' if mine else ''}{e}", file=sys.stderr)
        return 2


def _training_commands(sub) -> None:
    p = sub.add_parser("train", help="train with GRPO (profile default: Qwen2.5-Coder-0.5B with LoRA through the "
                       "basic, intermediate, advanced curriculum with EWC; evaluates before and after; a report)")
    _add_config_args(p)
    launch.add_arguments(p)
    p.set_defaults(func=cmd_train, default_profile="default")
    p = sub.add_parser("demo", help="the default job: train the default model on basic problems, before/after report")
    _add_config_args(p)
    p.set_defaults(func=cmd_train, default_profile="demo")
    p = sub.add_parser("eval", help="evaluate a model or checkpoint on held-out problems (greedy)")
    p.add_argument("--model", default="smollm2-135m", help="alias, HF directory (a checkpoint), .gguf or hub id")
    p.add_argument("--task", default="basic", help="basic | intermediate | advanced | mix | countdown | code | gsm8k | "
                   "gsm8k-train | rg:NAME[:key=value,...] (reasoning-gym) | levels joined by + | a data file or saved "
                   "dataset (the whole of it, or its test split) | hf:NAME[:config][:split]")
    p.add_argument("--n", type=int, default=None, help="number of problems (default: 250 of a generated level; "
                   "all of a file, of GSM8K's 1,319 test problems or of a hub dataset, as lm-eval does)")
    p.add_argument("--seed", type=int, default=1, help="seed of the held-out problems (a run uses its seed + 1) "
                   "and of sampling")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--instruction", default=None, help="text appended to every math question (default for this and "
                   "the four below: what a checkpoint was trained with, from its train_config.yaml; else the training "
                   "default)")
    p.add_argument("--system-prompt", default=None, help="a system turn before every prompt")
    p.add_argument("--prompt-column", default=None, help="the column of a data file that holds the prompt")
    p.add_argument("--column-map", default=None, help="columns renamed first, 'yours:ours,...'")
    p.add_argument("--correct-reward", default=None, help="the reward (0/1) that decides correct: a builtin "
                   "(exact_match, choice, regex, json, math, countdown, code, ...) or file.py:function; default: math "
                   "problems by their answer, rows of your own by a checkpoint's first reward")
    p.add_argument("--output", default=None, help="write per-problem records to this JSONL file")
    p.add_argument("--samples", type=int, default=0, metavar="K", help="draw K sampled completions per problem "
                   "and report pass@1..K and majority-vote@K instead of greedy accuracy (default 0: greedy)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature with --samples")
    p.add_argument("--split", choices=("held-out", "train", "all"), default=None, help="which rows of a data file "
                   "(a fifth, by a hash of each prompt, is held out): default held-out when --model was trained on "
                   "this task, else all")
    p.add_argument("--skip-bad-lines", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--allow-unisolated-code", action="store_true", help="where no sandbox works, run a code "
                   "reward's model-written code with process limits only (off: refused)")
    p.set_defaults(func=cmd_eval)


def _other_commands(sub) -> None:
    p = sub.add_parser("compare", help="two runs side by side: config, before/after, training, paired test; or two "
                       "evaluations of the same problems, paired")
    p.add_argument("run_a", metavar="A", help="a run directory (runs/<name>), or an evaluation (eval --output)")
    p.add_argument("run_b", metavar="B", help="another run directory, or another evaluation of the same problems")
    p.add_argument("--output", default=None, metavar="FILE.md", help="write the markdown here instead of printing")
    p.add_argument("--include-trained", action="store_true", help="two evaluations: keep the rows a run on their "
                   "task trains on (left out by default: a checkpoint answers them from memory)")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("plan", help="predict seconds per step, peak memory and wall time of a train command on "
                       "this machine; with --budget/--memory, settings that fit")
    _add_config_args(p)
    p.add_argument("--budget", default=None, help="wall-time budget for the run: 30m, 2h, 900s")
    p.add_argument("--memory", default=None, help="memory budget: 8G")
    p.add_argument("--completion-len", type=int, default=None, help="assume completions of this many tokens "
                   "(default: likely lengths, and every completion at max_new_tokens for the most it may take)")
    p.set_defaults(func=cmd_plan, default_profile="default")
    p = sub.add_parser("doctor", help="this machine: CPU flags, cores, memory, torch, measured matmul speed, models "
                       "cached, extras installed")
    p.add_argument("--seconds", type=float, default=2.0, help="time spent measuring matmul speed")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.set_defaults(func=cmd_doctor)
    _export_command(sub)
    p = sub.add_parser("app", help="web page on this machine: train, watch, inspect groups, evaluate, compare, try")
    p.add_argument("--runs-dir", default="runs", help="directory whose runs the page lists and starts")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                   "0.0.0.0 shares it on your network: add --auth)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--auth", default=None, metavar="USER:PASSWORD", help="ask for this login")
    p.add_argument("--share", action="store_true", help="also open a public share link (off unless asked)")
    p.add_argument("--data-dir", action="append", default=[], metavar="DIR", help="a directory whose files (data, "
                   "models, configs) the page may use besides the runs directory; repeatable")
    p.add_argument("--allow-code", action="store_true", help="let the page load reward functions from files and "
                   "modules (they run code in the training process)")
    p.add_argument("--max-runs", type=int, default=1, metavar="N", help="training runs the page lets run at once "
                   "(default 1: runs on the same cores slow each other far more than their share; 0: no cap)")
    p.set_defaults(func=cmd_app)


def _export_command(sub) -> None:
    p = sub.add_parser("export", help="write a run's checkpoint as a Hugging Face model, a PEFT adapter or a GGUF file "
                       "(+ Ollama Modelfile), then check it against the checkpoint (docs/export.md)")
    p.add_argument("run", metavar="RUN_OR_CHECKPOINT", help="a run directory (its newest good checkpoint) or "
                   "runs/<name>/checkpoints/step-NNNNNN")
    p.add_argument("--format", default="gguf", choices=["hf", "peft", "gguf"], help="hf: the full model, any LoRA "
                   "merged; peft: the LoRA adapter alone; gguf: one file for llama.cpp, Ollama, LM Studio (default)")
    p.add_argument("--quant", default=None, help="gguf: bf16 (default), f16, q8_0, q4_k_m, q4_0; hf: f32 (default), "
                   "bf16, f16")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where to write (default: RUN/exports/FORMAT-QUANT-stepN)")
    p.add_argument("--ollama", default=None, metavar="NAME", help="also write a Modelfile for `ollama create NAME`")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--no-verify", action="store_true", help="skip loading the export back and checking it")
    p.add_argument("--keep-template", action="store_true", help="leave the chat template as the checkpoint's (by "
                   "default it appends the run's instruction to the user's message)")
    p.add_argument("--verify-n", type=int, default=200, metavar="N", help="held-out problems for the accuracy check "
                   "of a quantized GGUF (q8_0, q4_k_m, q4_0)")
    p.set_defaults(func=cmd_export)


if __name__ == "__main__":
    sys.exit(main())
