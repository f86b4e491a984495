"""The web app driven in headless Chromium (Debian's chromium, Playwright's Python client).

One story, as a person would live it: start a quick run of a tiny model from the Train tab, watch the step
counter and the curves move, open a group, reload the page mid-run and find it re-attached to the same run,
stop the run and find a complete checkpoint, evaluate that checkpoint, and ask base and checkpoint the same
question. Each tab is photographed: into docs/screenshots/ when CPU_GRPO_SCREENSHOTS=1, else into tmp.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from cpu_grpo.app import runs
from cpu_grpo.train import checkpoint

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
REWARD = '''
def length_reward(completions, **kwargs):
    """A reward with variance inside every group, so a random model gets a gradient."""
    return [len(c) / 10 for c in completions]
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def app(tmp_path, tiny_model):
    """`cpu-grpo app --runs-dir runs` on a free port, working in tmp_path beside the tiny model and a reward
    file (relative paths, as a person would type them); the runs it started are killed at the end."""
    root = tmp_path / "runs"
    root.mkdir()
    (tmp_path / "tiny-llama").symlink_to(tiny_model)
    (tmp_path / "my_rewards.py").write_text(REWARD)
    port = free_port()
    log = open(tmp_path / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "cpu_grpo.cli", "app", "--runs-dir", "runs", "--port", str(port),
                             "--data-dir", ".", "--data-dir", tiny_model, "--allow-code"],  # what the test uses
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "app.log").read_text()
            time.sleep(0.5)
    yield url, root
    proc.terminate()
    proc.wait(timeout=30)
    for run in runs.list_runs(root):
        for name in ("run.lock", "status.json"):
            pid = (runs.read_json(run / name) or {}).get("pid")
            if runs.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    log.close()


def fill(page, elem_id: str, value) -> None:
    page.locator(f"#{elem_id} textarea, #{elem_id} input").first.fill(str(value))


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def shoot(page, name: str, tmp_path: Path) -> None:
    folder = SHOTS if os.environ.get("CPU_GRPO_SCREENSHOTS") == "1" else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def watched_step(page) -> int:
    found = re.search(r"step (\d+)/", page.locator("#watch-status").inner_text())
    return int(found.group(1)) if found else 0


def wait_for_step(page, above: int, timeout: float = 90) -> int:
    deadline = time.time() + timeout
    while (step := watched_step(page)) <= above:
        assert time.time() < deadline, page.locator("#watch-status").inner_text()
        time.sleep(0.5)
    return step


def start_run(page) -> None:
    """Fill the Train tab with tiny settings, preview the command, start; a second Start is refused."""
    fill(page, "train-model", "tiny-llama")
    fill(page, "train-run-name", "web")
    knobs = {"steps": 5000, "prompts-per-step": 2, "num-generations": 4, "max-new-tokens": 12, "eval-size": 4,
             "eval-max-new-tokens": 8, "save-every": 20, "learning-rate": 1e-3,
             "rewards": "my_rewards.py:length_reward", "reward-weights": 1}  # steps: still running when stopped
    for name, value in knobs.items():
        fill(page, f"knob-{name}", value)
    fill(page, "train-extra", "--train-size 50 --threads 1")
    page.locator("#train-preview").click()
    expect(page.locator("#train-command")).to_contain_text("cpu-grpo train --profile quick", timeout=60_000)
    expect(page.locator("#train-command")).to_contain_text("--num-generations 4")
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("Started web", timeout=60_000)
    page.locator("#train-start").click()
    expect(page.locator("#train-message")).to_contain_text("web is busy", timeout=60_000)


@pytest.mark.browser
@pytest.mark.slow
def test_train_watch_inspect_reload_stop_evaluate_try(app, tmp_path):
    if not Path(CHROMIUM).exists() and os.geteuid() != 0:
        pytest.skip("Debian's chromium is missing: install it with `sudo apt-get install chromium` to run this test")
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make test` installs it (apt-get install chromium)"
    url, root = app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_navigation_timeout(120_000)  # a loaded 2-core machine can take a while
        page.goto(url)
        start_run(page)
        shoot(page, "train", tmp_path)

        # ---------------------------------------------------------------- Watch: the counter and curves move
        tab(page, "Watch")
        first = wait_for_step(page, 0)
        expect(page.locator("#plot-reward canvas, #plot-reward svg").first).to_be_visible(timeout=60_000)
        second = wait_for_step(page, first)
        assert "web" in page.locator("#watch-status").inner_text()

        # ---------------------------------------------------------------- Inspect groups
        tab(page, "Inspect groups")
        expect(page.locator("#groups-html")).to_contain_text("Group 0", timeout=60_000)
        expect(page.locator("#groups-html")).to_contain_text("advantage")
        shoot(page, "groups", tmp_path)

        # ---------------------------------------------------------------- reload mid-run: re-attached
        decoy = root / "lr-1e-4"  # newer files, but not running: the page must pick the live run
        decoy.mkdir()
        config = (root / "web" / "train_config.yaml").read_text()
        (decoy / "train_config.yaml").write_text(config.replace("learning_rate: 0.001", "learning_rate: 0.0001"))
        (decoy / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5, "step_seconds": 0.2}) + "\n")
        page.reload()
        tab(page, "Watch")
        expect(page.locator("#watch-status")).to_contain_text("web:", timeout=60_000)
        assert wait_for_step(page, second - 1) >= second  # the same run, still counting
        shoot(page, "watch", tmp_path)

        # ---------------------------------------------------------------- Stop: a complete checkpoint
        tab(page, "Train")
        page.locator("#train-stop").click()
        expect(page.locator("#train-message")).to_contain_text("Stop sent to web", timeout=60_000)
        deadline = time.time() + 60
        while runs.running_pid(root / "web") and time.time() < deadline:
            time.sleep(0.5)
        assert runs.running_pid(root / "web") is None, runs.console_tail(root / "web")
        ckpt = checkpoint.latest(root / "web")
        assert ckpt is not None, runs.console_tail(root / "web")
        for name in ("model.safetensors", "config.json", "trainer_state.pt"):
            assert (ckpt / name).exists(), name
        tab(page, "Watch")
        expect(page.locator("#watch-status")).to_contain_text("stopped", timeout=60_000)

        evaluate_and_try(page, root, ckpt.relative_to(tmp_path), tmp_path)
        browser.close()


def evaluate_and_try(page, root: Path, ckpt: Path, tmp_path: Path) -> None:
    """Evaluate the checkpoint from the page; compare with the other run; ask base and checkpoint."""
    tab(page, "Evaluate and compare")
    expect(page.locator("#eval-model input")).to_have_value(str(ckpt), timeout=60_000)
    fill(page, "eval-n", 4)
    fill(page, "eval-max-new-tokens", 8)
    page.locator("#eval-run").click()
    expect(page.locator("#eval-table")).to_contain_text("basic", timeout=90_000)
    page.locator("#compare-btn").click()
    expect(page.locator("#compare-a")).to_contain_text("web", timeout=60_000)
    shoot(page, "evaluate", tmp_path)
    assert list((root / "web" / "evals").glob("*.jsonl"))

    tab(page, "Try")
    expect(page.locator("#try-model-b input")).to_have_value(str(ckpt), timeout=60_000)
    fill(page, "try-max-new-tokens", 8)
    page.locator("#try-ask").click()
    for side in ("a", "b"):
        expect(page.locator(f"#try-answer-{side} textarea")).not_to_have_value(re.compile(r"^(…)?$"), timeout=60_000)
    assert "Cannot load" not in page.locator("#try-answer-b textarea").input_value()
    shoot(page, "try", tmp_path)
