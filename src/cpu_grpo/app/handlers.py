"""What the page's buttons and timer do. Each handler takes the runs root first (bound by ui.py) and
returns plain values or gradio updates; gradio is imported inside the functions that need it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from . import chat, runs, views
from .policy import Policy

PLOTS = [  # (elem_id, title, metrics; a trailing '/' takes every metric with that prefix)
    ("plot-reward", "reward (total and per function)", ["reward", "reward/"]),
    ("plot-accuracy", "sampled accuracy", ["accuracy"]),
    ("plot-kl", "KL to the reference (beta > 0) and clipped-token fraction", ["kl", "clip_frac"]),
    ("plot-length", "completion length (tokens)", ["completion_len"]),
    ("plot-toks", "tokens/s", ["rollout_tok_s", "train_tok_s"]),
    ("plot-memory", "RSS after the step and peak so far (MB)", ["rss_mb", "peak_rss_mb"]),
]


def run_path(root: Path, name: str | None) -> Path | None:
    return Path(root) / name if name else None


def run_names(root: Path) -> list[str]:
    return [r.name for r in runs.list_runs(root)]


def frame(metrics: list[dict], keys: list[str]):
    """Long-format DataFrame (step, value, metric) of the metrics named by `keys`."""
    import pandas as pd

    names = []
    for key in keys:
        if key.endswith("/"):
            names += sorted({k for m in metrics for k in m if k.startswith(key)})
        else:
            names.append(key)
    rows = [(s, v, name) for name in names for s, v in runs.series(metrics, name)]
    return pd.DataFrame(rows, columns=["step", "value", "metric"])


# ---------------------------------------------------------------------------------------------------------
# page load, run selection, timer


def on_load(root: Path):
    """Re-attach: select the newest running run, else the newest run."""
    import gradio as gr

    names = run_names(root)
    live = runs.attach(root)
    value = live.name if live else (names[0] if names else None)
    return gr.update(choices=names, value=value)


def refresh_runs(root: Path, current: str | None):
    import gradio as gr

    names = run_names(root)
    return gr.update(choices=names, value=current if current in names else (names[0] if names else None))


def tick(root: Path, name: str | None, seen: dict | None):
    """Every few seconds: status line, progress bars, curves (redrawn only when new steps came), console."""
    import gradio as gr

    seen = dict(seen or {})
    names = run_names(root)
    runs_update = gr.update(choices=names) if names != seen.get("names") else gr.skip()
    seen["names"] = names
    run = run_path(root, name)
    if run is None:
        return runs_update, "No run selected: start one in the Train tab.", "", *[gr.skip()] * len(PLOTS), "", seen
    st = runs.status(run)
    metrics = runs.read_metrics(run)
    key = (name, len(metrics), metrics[-1]["step"] if metrics else None)
    plots = [frame(metrics, keys) for _, _, keys in PLOTS] if key != seen.get("plots") else [gr.skip()] * len(PLOTS)
    seen["plots"] = key
    return (runs_update, views.status_line(name, st), views.progress_html(st), *plots, runs.console_tail(run, 12),
            seen)


def pickers(root: Path, name: str | None, eval_model=None, try_a=None, try_b=None, other=None, seen=None):
    """Model pickers (the run's checkpoints, newest first, and its base model), the other-run list, the run's
    summary. Chosen values stay until the run has new checkpoints; `seen` is the list the values were for."""
    import gradio as gr

    run = run_path(root, name)
    if run is None:
        return [gr.update()] * 4 + ["No run selected.", seen]
    base = runs.base_model(run)
    ckpts = [str(p) for p in runs.checkpoints(run)]
    if ckpts != seen:  # a new run or new checkpoints: back to the newest one
        eval_model = try_a = try_b = None
    models = [m for m in [*ckpts, base] if m]
    others = [n for n in run_names(root) if n != name]
    return (gr.update(choices=models, value=eval_model or (models[0] if models else None)),
            gr.update(choices=models, value=try_a or base or None),
            gr.update(choices=models, value=try_b or (ckpts[0] if ckpts else None)),
            gr.update(choices=others, value=other if other in others else (others[0] if others else None)),
            views.summary_markdown(run), ckpts)


def on_run_change(root: Path, name: str | None):
    """A run was chosen: reset the pickers to its checkpoints, show its newest step's groups."""
    import gradio as gr

    run = run_path(root, name)
    steps = runs.group_steps(run) if run else []
    step = steps[-1] if steps else None
    body = views.groups_html(runs.groups_at(run, step), step) if step is not None else views.groups_html([], None)
    return (*pickers(root, name), gr.update(choices=steps, value=step), body)


# ---------------------------------------------------------------------------------------------------------
# Train


def train_command(policy: Policy, knob_names: list[str], values: list):
    """(run dir, command, resume, error, the config the run would get) from the Train tab's fields; the policy is
    applied to the fields as typed and then to the resolved config (a config file, or a resumed run's saved one,
    cannot bring in what the fields may not)."""
    model, profile, config_file, run_name, resume, use_lora, extra, *knobs = values
    profile, config_file, resume = profile or "", (config_file or "").strip(), bool(resume)
    name = (run_name or "").strip() or f"{profile or 'default'}-{time.strftime('%Y%m%d-%H%M%S')}"
    if "/" in name or name.startswith(".") or len(name) > 200:
        return None, None, resume, ("A run name is a plain directory name of at most 200 characters (no '/', not "
                                    "starting with '.')."), None
    run = Path(policy.root) / name
    overrides = dict(zip(knob_names, knobs, strict=True))
    if use_lora:
        overrides["use_lora"] = True
    try:
        overrides.update(runs.parse_extra(extra))
    except ValueError as e:
        return None, None, resume, str(e), None
    cmd = runs.build_command(run, model or "", profile, config_file, overrides, resume)
    if error := policy.run_problem(run) or policy.train_problem(model or "", config_file, overrides):
        return run, cmd, resume, error, None
    fields = {**overrides, **({"model": model} if model else {}), "output_dir": str(run)}
    cfg, error = runs.resolve_config(profile, config_file, fields, resume)
    source = " with ".join(filter(None, [f"config file {config_file}" if config_file else "",
                                         "the run's saved train_config.yaml" if resume else ""])) or "the fields"
    return run, cmd, resume, error or policy.config_problem(cfg, run, source), cfg


def preview(policy: Policy, knob_names: list[str], *values):
    """The command Start runs, and the planner's forecast of its time and memory on this machine."""
    run, cmd, _, error, cfg = train_command(policy, knob_names, list(values))
    text = runs.preview(cmd) if cmd else ""
    if error:
        return text, f"⚠️ {error}"
    return text, (f"This is the command that Start runs: it checks it again and hands the process the configuration "
                  f"it checked (a config file is not read a second time).\n\n```\n{runs.plan_text(cfg)}\n```")


def start(policy: Policy, knob_names: list[str], *values):
    import gradio as gr

    run, cmd, resume, error, cfg = train_command(policy, knob_names, list(values))
    if error:
        return (runs.preview(cmd) if cmd else ""), f"⚠️ Not started: {error}", gr.skip()
    # the process gets the configuration checked here, never the file named in the fields (read again, maybe changed)
    checked = runs.build_command(run, profile=values[1] or "", config_file=runs.CHECKED, resume=resume)
    pid, message = runs.start(checked, run, resume, config=cfg, max_runs=policy.max_runs)
    if pid is None:
        return runs.preview(cmd), f"⚠️ Not started: {message}", gr.skip()
    return runs.preview(cmd), message, gr.update(choices=run_names(policy.root), value=run.name)


def stop(root: Path, name: str | None) -> str:
    run = run_path(root, name)
    return runs.stop(run) if run else "No run selected."


# ---------------------------------------------------------------------------------------------------------
# Inspect groups


def groups_refresh(root: Path, name: str | None, current=None):
    """Fresh step list; keep the chosen step if it is still there, else show the newest."""
    import gradio as gr

    run = run_path(root, name)
    steps = runs.group_steps(run) if run else []
    step = int(current) if current is not None and int(current) in steps else (steps[-1] if steps else None)
    body = views.groups_html(runs.groups_at(run, step), step) if step is not None else views.groups_html([], None)
    return gr.update(choices=steps, value=step), body


def groups_show(root: Path, name: str | None, step):
    run = run_path(root, name)
    if run is None or step is None:
        return views.groups_html([], None)
    return views.groups_html(runs.groups_at(run, int(step)), int(step))


# ---------------------------------------------------------------------------------------------------------
# Evaluate and compare, Try


def evaluate(policy: Policy, name: str | None, model: str, task: str, n, max_new_tokens):
    """Run `cpu-grpo eval` as a separate process; stream its output; end with its accuracy table."""
    run = run_path(policy.root, name)
    if run is None or not model:
        yield "Choose a run and a model or checkpoint to evaluate.", ""
        return
    refusal = policy.run_problem(run) or policy.model_problem(model) or policy.task_problem("task", task or "")
    if refusal:
        yield f"Not evaluated: {refusal}", ""
        return
    out = runs.eval_output(run, model, task or "basic", n or 50)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = runs.eval_command(model, task or "basic", n or 50, max_new_tokens or 256, out)
    log_path = out.with_suffix(".log")
    code = yield from _follow(cmd, log_path)
    text = log_path.read_text(errors="replace")
    result = f"exit code {code}" if code else f"records: `{out}`"
    yield _tail(text), views.eval_table(text) + f"\n{result}"


def export_choices(root: Path, name: str | None):
    """The chosen run's checkpoints, newest first, for the Export tab."""
    import gradio as gr

    run = run_path(root, name)
    ckpts = [str(p) for p in runs.checkpoints(run)] if run else []
    return gr.update(choices=ckpts, value=ckpts[0] if ckpts else None)


def export(policy: Policy, name: str | None, ckpt: str, fmt: str, quant: str, ollama: str):
    """Run `cpu-grpo export` on a checkpoint of a finished run, into run/exports/ (a separate process); stream its
    output; end with the export.md it wrote."""
    run = run_path(policy.root, name)
    if run is None or not ckpt:
        yield "Choose a run and one of its checkpoints.", ""
        return
    if runs.status(run)["state"] in runs.LIVE_STATES:
        yield "The run is still training: export once it has finished (or stop it: that saves a checkpoint).", ""
        return
    quant = "" if fmt == "peft" else (quant or "")
    out = run / "exports" / f"{fmt}{'-' + quant if quant else ''}-{Path(ckpt).name}"
    if refusal := policy.export_problem(run, ckpt, out):
        yield f"Not exported: {refusal}", ""
        return
    cmd = [sys.executable, "-m", "cpu_grpo.cli", "export", ckpt, "--format", fmt, "--out", str(out)]
    cmd += (["--quant", quant] if quant else []) + (["--ollama", ollama.strip()] if (ollama or "").strip() else [])
    log_path = run / "exports" / f"{out.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    code = yield from _follow(cmd, log_path)
    card = out / "export.md"
    yield _tail(log_path.read_text(errors="replace")), card.read_text() if card.exists() else \
        f"exit code {code}: see the output above."


def _follow(cmd: list[str], log_path: Path):
    """Run `cmd` as a separate process writing to log_path; yield the log's tail every second while it runs, then
    return its exit code."""
    with open(log_path, "w") as log:
        log.write(f"$ {runs.preview(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=runs.child_env())
    while proc.poll() is None:
        time.sleep(1.0)
        yield _tail(log_path.read_text(errors="replace")), ""
    return proc.returncode


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.splitlines()[-lines:])


def compare(root: Path, name: str | None, other: str | None):
    a, b = run_path(root, name), run_path(root, other)
    if a is None or b is None:
        return "Choose two runs.", "", ""
    return views.compare_markdown(a, b), views.summary_markdown(a), views.summary_markdown(b)


def ask(policy: Policy, model_a: str, model_b: str, question: str, instruction: str, max_new_tokens):
    """The same question to two models, one after the other (the first answer shows as soon as it is ready)."""
    refusal = policy.model_problem(model_a or "") or policy.model_problem(model_b or "")
    if refusal:
        yield f"Not asked: {refusal}", ""
        return
    first = chat.answer(model_a, question, instruction, int(max_new_tokens or 128))
    yield first, "…"
    yield first, chat.answer(model_b, question, instruction, int(max_new_tokens or 128))
