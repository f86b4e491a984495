"""The web app's page: five tabs (Train, Watch, Inspect groups, Evaluate and compare, Try) over the runs in
one directory. gradio is imported inside functions, never at module import, so `cpu-grpo --help` stays fast.

Components that tests drive carry stable elem_ids (train-start, watch-status, groups-html, ...).
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

from . import handlers

TICK_SECONDS = 2.5
KNOBS = ["task", "stages", "steps", "prompts_per_step", "num_generations", "max_new_tokens", "temperature",
         "learning_rate", "beta", "eval_size", "eval_max_new_tokens", "save_every", "rewards", "reward_weights",
         "seed"]
EXAMPLE_QUESTION = "A baker makes 24 rolls and sells 9 of them. How many rolls are left?"


def _knob_boxes(gr) -> tuple[list[str], list]:
    """One textbox per main config field that this version has; empty keeps the profile's or file's value."""
    from dataclasses import fields

    from ..config import TrainConfig

    known = {f.name: f for f in fields(TrainConfig)}
    names = [k for k in KNOBS if k in known]
    boxes = []
    for i in range(0, len(names), 5):
        with gr.Row():
            for name in names[i:i + 5]:
                f = known[name]
                default = f.default_factory() if callable(f.default_factory) else f.default
                if isinstance(default, list):
                    default = ",".join(str(x) for x in default)
                boxes.append(gr.Textbox(label=name, placeholder=str(default), info=f.metadata["help"],
                                        elem_id=f"knob-{name.replace('_', '-')}", min_width=180))
    return names, boxes


def _train_tab(gr, policy, run):
    from ..config import PROFILES

    with gr.Tab("Train", elem_id="tab-train"):
        gr.Markdown("Start `cpu-grpo train` as a separate process: closing or reloading this page does not stop "
                    "it. Empty fields keep the profile's (or config file's) value.")
        with gr.Row():
            model = gr.Textbox(label="model", value="smollm2-135m", elem_id="train-model", scale=3,
                               info="alias, local Hugging Face directory, .gguf file or hub id")
            profile = gr.Dropdown(label="profile", choices=list(PROFILES), value="quick", elem_id="train-profile")
            config_file = gr.Textbox(label="config file (YAML/JSON)", elem_id="train-config", scale=2)
            run_name = gr.Textbox(label="run name", placeholder="profile and time", elem_id="train-run-name", scale=2)
        knob_names, boxes = _knob_boxes(gr)
        with gr.Row():
            use_lora = gr.Checkbox(label="LoRA", elem_id="train-lora")
            resume = gr.Checkbox(label="resume (continue this run from its newest checkpoint)", elem_id="train-resume")
            extra = gr.Textbox(label="more fields", placeholder="--train-size 500 --top-k 20", elem_id="train-extra",
                               scale=3)
        with gr.Row():
            preview = gr.Button("Preview command", elem_id="train-preview")
            start = gr.Button("Start", variant="primary", elem_id="train-start")
            stop = gr.Button("Stop (saves a checkpoint)", variant="stop", elem_id="train-stop")
        command = gr.Code(label="command", language="shell", elem_id="train-command", interactive=False)
        message = gr.Markdown(elem_id="train-message")
    inputs = [model, profile, config_file, run_name, resume, use_lora, extra, *boxes]
    preview.click(partial(handlers.preview, policy, knob_names), inputs, [command, message])
    start.click(partial(handlers.start, policy, knob_names), inputs, [command, message, run])
    stop.click(partial(handlers.stop, policy.root), [run], [message])


def _watch_tab(gr, root: Path, run) -> list:
    """Status line, progress bars, the curves and the console; returns the outputs of the timer."""
    with gr.Tab("Watch", elem_id="tab-watch"):
        status = gr.Markdown("No run selected.", elem_id="watch-status")
        progress = gr.HTML(elem_id="watch-progress")
        plots = []
        for i in range(0, len(handlers.PLOTS), 2):
            with gr.Row():
                for elem_id, title, keys in handlers.PLOTS[i:i + 2]:
                    several = len(keys) > 1 or keys[0].endswith("/")  # (a set height would clip the legend)
                    plots.append(gr.LinePlot(x="step", y="value", color="metric" if several else None, label=title,
                                             elem_id=elem_id, y_title=None if several else keys[0]))
        with gr.Row():
            stop = gr.Button("Stop (saves a checkpoint)", variant="stop", elem_id="watch-stop", scale=0)
            stopped = gr.Markdown(elem_id="watch-message")
        console = gr.Textbox(label="console (last lines)", lines=12, max_lines=12, elem_id="watch-console")
    stop.click(partial(handlers.stop, root), [run], [stopped])
    return [status, progress, *plots, console]


def _groups_tab(gr, root: Path, run):
    with gr.Tab("Inspect groups", elem_id="tab-groups") as tab:
        gr.Markdown("Each prompt's G completions with their rewards per function, total and advantage. A group "
                    "whose rewards are all equal has zero advantage everywhere and adds nothing to the gradient.")
        with gr.Row():
            step = gr.Dropdown(label="step", choices=[], elem_id="groups-step", scale=2)
            latest = gr.Button("Newest step", elem_id="groups-latest", scale=0)
        body = gr.HTML(elem_id="groups-html")
    tab.select(partial(handlers.groups_refresh, root), [run, step], [step, body])
    latest.click(partial(handlers.groups_refresh, root), [run], [step, body])
    step.input(partial(handlers.groups_show, root), [run, step], [body])
    return step, body


def _eval_tab(gr, policy, run):
    with gr.Tab("Evaluate and compare", elem_id="tab-evaluate") as tab:
        summary = gr.Markdown(elem_id="eval-summary")
        gr.Markdown("#### Evaluate a checkpoint (greedy, held-out problems, a separate process)")
        with gr.Row():
            model = gr.Dropdown(label="model or checkpoint", choices=[], allow_custom_value=True,
                                elem_id="eval-model", scale=3)
            task = gr.Textbox(label="task", value="basic", elem_id="eval-task")
            n = gr.Number(label="problems", value=50, precision=0, elem_id="eval-n")
            max_new = gr.Number(label="max new tokens", value=256, precision=0, elem_id="eval-max-new-tokens")
            go = gr.Button("Evaluate", variant="primary", elem_id="eval-run", scale=0)
        table = gr.Markdown(elem_id="eval-table")
        log = gr.Textbox(label="output (last lines)", lines=8, max_lines=8, elem_id="eval-log")
        gr.Markdown("#### Compare with another run")
        with gr.Row():
            other = gr.Dropdown(label="other run", choices=[], elem_id="compare-run", scale=3)
            cmp = gr.Button("Compare", elem_id="compare-btn", scale=0)
        cmp_md = gr.Markdown(elem_id="compare-md")
        with gr.Row():
            side_a, side_b = gr.Markdown(elem_id="compare-a"), gr.Markdown(elem_id="compare-b")
    go.click(partial(handlers.evaluate, policy), [run, model, task, n, max_new], [log, table])
    cmp.click(partial(handlers.compare, policy.root), [run, other], [cmp_md, side_a, side_b])
    return tab, model, summary, other


def _try_tab(gr, policy):
    from ..config import TrainConfig

    with gr.Tab("Try", elem_id="tab-try") as tab:
        gr.Markdown("The same question to two models, greedy decoding, in the chat format of training.")
        with gr.Row():
            model_a = gr.Dropdown(label="model A (base)", choices=[], allow_custom_value=True, elem_id="try-model-a")
            model_b = gr.Dropdown(label="model B (checkpoint)", choices=[], allow_custom_value=True,
                                  elem_id="try-model-b")
        question = gr.Textbox(label="question", value=EXAMPLE_QUESTION, lines=2, elem_id="try-question")
        with gr.Row():
            instruction = gr.Textbox(label="instruction", value=TrainConfig().instruction, scale=4,
                                     elem_id="try-instruction")
            max_new = gr.Number(label="max new tokens", value=128, precision=0, elem_id="try-max-new-tokens")
            ask = gr.Button("Ask both", variant="primary", elem_id="try-ask", scale=0)
        with gr.Row():
            answer_a = gr.Textbox(label="answer A", lines=8, elem_id="try-answer-a")
            answer_b = gr.Textbox(label="answer B", lines=8, elem_id="try-answer-b")
    ask.click(partial(handlers.ask, policy), [model_a, model_b, question, instruction, max_new], [answer_a, answer_b])
    return tab, model_a, model_b


def _export_tab(gr, policy, run):
    with gr.Tab("Export", elem_id="tab-export") as tab:
        gr.Markdown("A checkpoint of a finished run as a GGUF file (llama.cpp, Ollama, LM Studio), a Hugging Face "
                    "model or a PEFT adapter, into the run's `exports/` directory, then checked against it.")
        with gr.Row():
            ckpt = gr.Dropdown(label="checkpoint", choices=[], elem_id="export-checkpoint", scale=3)
            fmt = gr.Dropdown(label="format", choices=["gguf", "hf", "peft"], value="gguf", elem_id="export-format")
            quant = gr.Dropdown(label="precision", choices=["bf16", "f16", "q8_0", "q4_0", "f32"], value="q8_0",
                                elem_id="export-quant")
            ollama = gr.Textbox(label="Ollama name (optional)", elem_id="export-ollama")
            go = gr.Button("Export", variant="primary", elem_id="export-run", scale=0)
        log = gr.Textbox(label="output (last lines)", lines=8, max_lines=8, elem_id="export-log")
        card = gr.Markdown(elem_id="export-card")
    tab.select(partial(handlers.export_choices, policy.root), [run], [ckpt], show_progress="hidden")
    go.click(partial(handlers.export, policy), [run, ckpt, fmt, quant, ollama], [log, card])


def build_app(root: Path | str, data_dirs: tuple = (), allow_code: bool = False, max_runs: int = 1):
    """The gr.Blocks of the page, over the runs under `root` (paths and code as `Policy` allows)."""
    import gradio as gr

    from .policy import Policy

    root = Path(root)
    policy = Policy(root, tuple(Path(d) for d in data_dirs), allow_code, max_runs)
    with gr.Blocks(title="cpu-grpo", analytics_enabled=False) as demo:
        gr.Markdown(f"## cpu-grpo · runs in `{root}`")
        with gr.Row():
            run = gr.Dropdown(label="run", choices=handlers.run_names(root), elem_id="run-select", scale=4)
            refresh = gr.Button("Refresh runs", elem_id="runs-refresh", scale=0)
        with gr.Tabs():
            _train_tab(gr, policy, run)
            watch_outputs = _watch_tab(gr, root, run)
            step, groups_body = _groups_tab(gr, root, run)
            eval_tab, eval_model, summary, other = _eval_tab(gr, policy, run)
            try_tab, try_a, try_b = _try_tab(gr, policy)
            _export_tab(gr, policy, run)
        seen, picked = gr.State({}), gr.State(None)
        gr.Timer(TICK_SECONDS).tick(partial(handlers.tick, root), [run, seen], [run, *watch_outputs, seen],
                                    show_progress="hidden")
        demo.load(partial(handlers.on_load, root), None, [run])
        refresh.click(partial(handlers.refresh_runs, root), [run], [run])
        pickers = [eval_model, try_a, try_b, other]
        run.change(partial(handlers.on_run_change, root), [run], [*pickers, summary, picked, step, groups_body])
        for tab in (eval_tab, try_tab):  # new checkpoints and runs since the run was chosen; typed values stay
            tab.select(partial(handlers.pickers, root), [run, *pickers, picked], [*pickers, summary, picked],
                       show_progress="hidden")
    return demo


MAX_UPLOAD = "1mb"  # the page takes no file uploads (it reads paths); gradio's upload route would take any size


def _credentials(auth: str | None) -> tuple[str, str] | None:
    if not auth:
        return None
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        raise SystemExit("cpu-grpo: --auth takes USER:PASSWORD, e.g. --auth alice:s3cret")
    return user, password


def launch(runs_dir: str | Path = "runs", host: str = "127.0.0.1", port: int = 7860, auth: str | None = None,
           share: bool = False, block: bool = True, data_dirs: tuple = (), allow_code: bool = False,
           max_runs: int = 1):
    """Serve the page. Bound to 127.0.0.1 unless --host says otherwise; a public link only with --share."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    credentials = _credentials(auth)
    if host not in ("127.0.0.1", "localhost", "::1") and credentials is None:
        print(f"cpu-grpo app: serving on {host} without --auth: anyone who can reach this address can start "
              "and stop runs.", file=sys.stderr)
    demo = build_app(runs_dir, data_dirs, allow_code, max_runs)
    demo.queue(default_concurrency_limit=4)
    try:
        return demo.launch(server_name=host, server_port=port, auth=credentials, share=share, show_error=True,
                           prevent_thread_lock=not block, inbrowser=False, max_file_size=MAX_UPLOAD)
    except OSError as e:
        raise SystemExit(f"cpu-grpo: cannot serve on {host}:{port} ({e}): pass another --port.") from None
