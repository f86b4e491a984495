"""Data-parallel GRPO with real processes: torchrun, gloo over 127.0.0.1, the tiny model.

- two ranks with half the prompts each compute the gradient one process computes with all of them;
- after a 2-rank run every rank holds the same weights, metrics.jsonl has one line a step, and a resume from a
  checkpoint continues exactly as the uninterrupted run did;
- a rank killed mid-run, or failing on bad input, stops the others with a message naming it, and the run
  resumes from its last complete checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cpu_grpo.rundir import read_jsonl

WORKER = str(Path(__file__).with_name("dist_worker.py"))


def torchrun(*args: str, nproc: int = 2, timeout: float = 240, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **popen.pop("env", {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", WORKER, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **popen)


def alone(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_two_ranks_compute_the_gradient_of_one_process(tiny_model, tmp_path):
    ok(alone("grads", tiny_model, str(tmp_path)))
    ok(torchrun("grads", tiny_model, str(tmp_path)))
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        one = torch.load(tmp_path / f"grads-{loss_type}-1.pt")
        two = torch.load(tmp_path / f"grads-{loss_type}-2.pt")
        assert one["groups"] == two["groups"] == [0, 2, 3, 4, 5]  # group 1 is all-equal: skipped
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
        scale = max(g.abs().max().item() for g in one["grads"].values())
        assert scale > 0
        for name, g in one["grads"].items():  # fp32; the sum of two ranks' parts in another order
            torch.testing.assert_close(two["grads"][name], g, atol=1e-6 * scale, rtol=1e-5, msg=name)


def fields(model: str, out: Path, reward: Path, **kw) -> str:
    values = dict(model=model, output_dir=str(out), steps=4, prompts_per_step=4, num_generations=4,
                  max_new_tokens=12, eval_size=4, eval_max_new_tokens=8, save_every=2, ddp_timeout=60,
                  rewards=[f"{reward}:length_reward"], reward_weights=[1.0], learning_rate=1e-3, train_size=50,
                  score_truncated=True)
    return json.dumps({**values, **kw})


@pytest.mark.slow
def test_two_ranks_train_the_same_weights_and_resume_exactly(tiny_model, tmp_path, reward_file):
    whole, part = tmp_path / "whole", tmp_path / "part"
    whole.mkdir(), part.mkdir()
    ok(torchrun("train", str(whole), fields(tiny_model, whole, reward_file)))
    digests = {(whole / f"digest-{r}-of-2").read_text() for r in (0, 1)}
    assert len(digests) == 1  # the same weights on both ranks, bit for bit
    metrics = read_jsonl(whole / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    groups = read_jsonl(whole / "groups.jsonl")
    assert len(groups) == 4 * 4 and {g["group"] for g in groups} == {0, 1, 2, 3}  # both ranks' groups, by rank 0
    assert len(read_jsonl(whole / "eval_after.jsonl")) == 4  # sharded evaluation, gathered
    assert not (whole / "digest-0-of-1").exists()

    ok(torchrun("train", str(part), fields(tiny_model, part, reward_file, steps=2)))  # stops at step 2 ...
    ok(torchrun("train", str(part), fields(tiny_model, part, reward_file, resume=True)))  # ... and goes on
    resumed = read_jsonl(part / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(metrics, resumed, strict=True):
        assert (a["loss"], a["reward"], a["completion_len"]) == (b["loss"], b["reward"], b["completion_len"])
    assert (part / "digest-0-of-2").read_text() == digests.pop()


@pytest.mark.slow
def test_ranks_join_over_gloo_where_cuda_is_present(tiny_model, tmp_path, reward_file):
    # the model stays on the CPU, so nccl (which wants CUDA tensors) is never the backend, even on a GPU machine
    env = {"PRETEND_CUDA": "" if torch.cuda.is_available() else "1"}
    p = ok(torchrun("train", str(tmp_path), fields(tiny_model, tmp_path, reward_file, steps=1, eval_size=0), env=env))
    assert p.stdout.count("backend gloo") == 2


@pytest.mark.slow
def test_two_ranks_agree_on_dynamic_sampling(tiny_model, tmp_path):
    """Dynamic sampling under torchrun: both ranks draw the same extra batches, keep the same groups (decided on
    the gathered batch) and end with the same weights; only groups whose reward varies are trained."""
    some = tmp_path / "some.py"
    some.write_text("def some_groups_reward(completions, question, **kw):\n"
                    "    return [len(c) / 10 if len(q) % 2 else 0.0 for c, q in zip(completions, question)]\n")
    out = tmp_path / "run"
    out.mkdir()
    ok(torchrun("train", str(out), fields(tiny_model, out, some, steps=2, eval_size=0, dynamic_sampling=3,
                                          rewards=[f"{some}:some_groups_reward"])))
    assert len({(out / f"digest-{r}-of-2").read_text() for r in (0, 1)}) == 1
    metrics, groups = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "groups.jsonl")
    assert sum(m["sample_batches"] for m in metrics) * 4 == metrics[-1]["data_pos"]
    for m in metrics:
        step = [x for x in groups if x["step"] == m["step"]]
        trained = [x for x in step if any(a != 0 for a in x["advantages"])]
        assert len(step) == 4 * m["sample_batches"]
        assert trained == [x for x in step if len(x["question"]) % 2][:4]


@pytest.mark.slow
def test_two_ranks_draw_the_prioritized_problems_of_one_process(tiny_model, tmp_path):
    """prioritized_sampling under torchrun: the draws follow counts of the gathered groups, so two ranks draw the
    problems one process draws, step after step (only the bike problems never earn the reward: the counts move)."""
    from test_curriculum import NO_BIKE

    reward = tmp_path / "no_bike.py"
    reward.write_text(NO_BIKE)
    drawn = {}
    for name, run in (("one", alone), ("two", torchrun)):
        out = tmp_path / name
        out.mkdir()
        ok(run("train", str(out), fields(tiny_model, out, reward, steps=3, eval_size=0, task="intermediate",
                                         prioritized_sampling=True, rewards=[f"{reward}:no_bike_reward"])))
        drawn[name] = [g["question"] for g in read_jsonl(out / "groups.jsonl")]
    assert drawn["one"] == drawn["two"] and any("bike" in q for q in drawn["one"])


@pytest.mark.slow
def test_a_killed_rank_stops_the_others_with_its_name_and_the_run_resumes(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", WORKER, "train",
           str(out), fields(tiny_model, out, reward_file, steps=200, save_every=1, eval_size=0)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while len(read_jsonl(out / "metrics.jsonl")) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.kill(int((out / "pid-1").read_text()), signal.SIGKILL)
    t0 = time.time()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.time() - t0 < 60
    assert "rank 1" in err and "stopped answering" in err, err[-3000:]
    done = len(read_jsonl(out / "metrics.jsonl"))
    # one process goes on from the last complete checkpoint, with a note that its samples differ
    p = ok(alone("train", str(out), fields(tiny_model, out, reward_file, steps=done + 2, save_every=1, eval_size=0,
                                          resume=True)))
    assert "resumes with 1" in p.stdout
    assert read_jsonl(out / "metrics.jsonl")[-1]["step"] == done + 2


FAILING_ON_RANK_1 = '''
import os

def length_reward(completions, **kwargs):
    if os.environ.get("RANK") == "1":
        raise ValueError("this reward cannot read its data file on rank 1")
    return [len(c) / 10 for c in completions]
'''


@pytest.mark.slow
def test_bad_input_on_one_rank_is_one_sentence_naming_it(tiny_model, tmp_path):
    reward = tmp_path / "flaky.py"
    reward.write_text(FAILING_ON_RANK_1)
    out = tmp_path / "run"
    out.mkdir()
    p = torchrun("train", str(out), fields(tiny_model, out, reward, eval_size=0), timeout=120)
    assert p.returncode != 0
    assert "rank 1" in p.stderr and "cannot read its data file" in p.stderr, p.stderr[-3000:]


@pytest.mark.slow
def test_a_failed_rank_under_train_nproc_ends_in_one_line_not_torchruns_traceback(tiny_model, tmp_path):
    reward = tmp_path / "flaky.py"
    reward.write_text(FAILING_ON_RANK_1)
    cmd = [sys.executable, "-m", "cpu_grpo", "train", "--nproc", "2", "--profile", "quick", "--model", tiny_model,
           "--output-dir", str(tmp_path / "run"), "--steps", "2", "--prompts-per-step", "4", "--num-generations", "4",
           "--max-new-tokens", "12", "--eval-size", "0", "--train-size", "50", "--rewards",
           f"{reward}:length_reward", "--reward-weights", "1", "--score-truncated", "true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 2
    assert "cannot read its data file" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("cpu-grpo: the run stopped (rank 0 (exit code 2), rank 1 (exit code 2))"), last
    assert "--resume" in last


def _nnodes(tmp_path, rank: int, port: int, *extra: str) -> list[str]:
    """`cpu-grpo train` as one of two machines (torchrun's c10d rendezvous at 127.0.0.1:port)."""
    return [sys.executable, "-m", "cpu_grpo", "train", "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--local-addr", "127.0.0.1", "--profile", "quick", "--output-dir",
            str(tmp_path / "run"), *extra]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_machines_launched_by_train_nnodes_train_as_one_run(tiny_model, tmp_path):
    port, env = _free_port(), {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    run = ["--model", tiny_model, "--steps", "2", "--prompts-per-step", "2", "--num-generations", "2",
           "--max-new-tokens", "8", "--eval-size", "0", "--train-size", "20"]
    procs = [subprocess.Popen(_nnodes(tmp_path, r, port, *run), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2]


@pytest.mark.slow
def test_two_machines_started_with_different_configurations_are_refused_naming_the_field(tiny_model, tmp_path):
    """Different learning rates trained with exit code 0 while the weights drifted apart; different models or
    steps ended in a C++ abort or 'another rank stopped answering'."""
    port, env = _free_port(), {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    run = ["--model", tiny_model, "--steps", "2", "--prompts-per-step", "2", "--num-generations", "2",
           "--max-new-tokens", "8", "--eval-size", "0", "--train-size", "20"]
    rates = (["--learning-rate", "1e-5"], ["--learning-rate", "3e-5"])
    procs = [subprocess.Popen(_nnodes(tmp_path, r, port, *run, *rates[r]), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs[0][-3000:] + outs[1][-3000:]
    said = "rank 1 was started with learning_rate = 3e-05 but rank 0 with 1e-05: start every rank with the same"
    assert all(said in out and "Traceback" not in out for out in outs), outs[0][-3000:] + outs[1][-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_machine_that_never_joins_is_one_sentence_within_the_join_timeout(tiny_model, tmp_path):
    port = _free_port()
    t0 = time.time()
    p = subprocess.run(_nnodes(tmp_path, 0, port, "--model", tiny_model, "--join-timeout", "5"), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and time.time() - t0 < 5 + 30, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cpu-grpo: not all 2 machines joined the rendezvous at 127.0.0.1:{port} within "
                           "--join-timeout 5 s"), last
    assert "start the same command on every machine" in last and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_rendezvous_that_cannot_be_reached_is_one_sentence(tiny_model, tmp_path):
    p = subprocess.run(_nnodes(tmp_path, 1, _free_port(), "--model", tiny_model, "--join-timeout", "5"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "could not be reached" in last and "start --node-rank 0" in last, last


@pytest.mark.slow
def test_nnodes_without_an_endpoint_says_what_it_needs(tmp_path):
    p = subprocess.run([sys.executable, "-m", "cpu_grpo", "train", "--nnodes", "2", "--output-dir",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == ("cpu-grpo: --nnodes 2 needs --rdzv-endpoint HOST:PORT (the "
                                                      "machine of --node-rank 0) and this machine's --node-rank (0 to "
                                                      "nnodes - 1)."), p.stderr


@pytest.mark.parametrize("flag", ["--nnodes", "--nproc"])
def test_no_machines_or_no_processes_are_refused_in_one_sentence(flag, tmp_path, capsys):
    from cpu_grpo.cli import main

    assert main(["train", flag, "0", "--output-dir", str(tmp_path / "run")]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"cpu-grpo: {flag} counts the ") and said.endswith("not 0 (1, the default, trains in "
                                                                            "this process alone)."), said
    assert not (tmp_path / "run").exists()
