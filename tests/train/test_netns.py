"""Data-parallel training across simulated hosts on real links (bench/netns.sh: network namespaces, veth, a bridge,
tc), the faults a network brings, each ending in one sentence that names the rank and says what to do:

- a host's link cut mid-run: rank 0 names rank 1 within ddp_timeout, and rank 1 names rank 0 and its store; the
  run resumes on one host;
- a link that loses 5% of its packets: TCP retransmits, the run completes; one 20 ms away completes too;
- a host that never joins: `cpu-grpo train --nnodes 2` says so within --join-timeout (no rank started);
- a host killed while its rank writes a checkpoint: the other rank names it; the last complete checkpoint is intact
  and the run resumes on two hosts.
Run as root (the namespaces); skipped otherwise. Run as a script, this file is a rank whose checkpoints after the
first take a minute to write (so that a test can kill its host mid-write).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpu_grpo.rundir import read_jsonl


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root: bench/netns.sh makes network namespaces"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is not available here"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def _why_no_delay() -> str | None:
    """--delay needs TAP devices (bench/delaylink.py) and an ifb for the way in."""
    if _why_not() is not None:
        return _why_not()
    if not Path("/dev/net/tun").exists():
        return "--delay needs /dev/net/tun (TAP devices)"
    name = f"cgifb{os.getpid() % 10000}"
    if subprocess.run(["ip", "link", "add", name, "type", "ifb"], capture_output=True).returncode != 0:
        return "--delay needs ifb devices (CONFIG_IFB)"
    subprocess.run(["ip", "link", "del", name], capture_output=True)
    return None

HERE = Path(__file__).parent
NETNS = HERE.parents[1] / "bench" / "netns.sh"
WORKER = str(HERE / "dist_worker.py")
_names = itertools.count()


class Hosts:
    """bench/netns.sh running one training rank per host; its output (every host's, prefixed) in a file."""

    def __init__(self, n: int, out: Path, fields: str, *opts: str, worker: str = WORKER, command=None):
        """Each host runs `worker train OUT FIELDS`, or `command` (netns.sh's words after --) where given."""
        self.prefix = f"t{os.getpid() % 10000}{next(_names)}"
        self.log = out.parent / f"{self.prefix}.log"
        cmd = [str(NETNS), "--hosts", str(n), "--rate", "1gbit", "--prefix", self.prefix, "--timeout", "150", *opts,
               "--", *(command or [worker, "train", str(out), fields])]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, done, timeout: float) -> float:
        """Seconds until done() held; fails with the hosts' output if it never did."""
        t0 = time.time()
        while not done() and time.time() - t0 < timeout:
            assert self.proc.poll() is None or done(), self.text()[-4000:]
            time.sleep(0.1)
        assert done(), self.text()[-4000:]
        return time.time() - t0

    def stop(self) -> None:
        """End every host (netns.sh removes what it made on SIGTERM)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=30)

    def kill_host(self, i: int) -> None:
        pids = subprocess.run(["ip", "netns", "pids", f"{self.prefix}h{i}"], capture_output=True, text=True).stdout
        for pid in pids.split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass


def steps_done(out: Path) -> int:
    return len(read_jsonl(out / "metrics.jsonl")) if (out / "metrics.jsonl").exists() else 0


def sentence(text: str, start: str) -> str:
    """The line of the hosts' output that holds a rank's sentence starting with `start`."""
    return next((line for line in text.splitlines() if start in line), "")


def trains_two_steps(hosts: Hosts, out: Path) -> None:
    """The hosts' 2-step run ends without error and logs both steps."""
    try:
        hosts.wait_for(lambda: hosts.proc.poll() is not None, 120)
    finally:
        hosts.stop()
    assert hosts.proc.returncode == 0, hosts.text()[-4000:]
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]


def fields(model, out, reward, **kw):
    from test_distributed import fields

    return fields(model, out, reward, **{"eval_size": 0, "save_every": 1, "ddp_timeout": 10, **kw})


def alone(out: Path, fields_json: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, WORKER, "train", str(out), fields_json], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_cut_link_is_one_sentence_naming_the_host_and_the_run_resumes_on_fewer(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    out.mkdir()
    hosts = Hosts(2, out, fields(tiny_model, out, reward_file, steps=200))
    try:
        hosts.wait_for(lambda: steps_done(out) >= 2, 60)
        subprocess.run(["ip", "link", "set", f"{hosts.prefix}b1", "down"], check=True)
        seconds = hosts.wait_for(lambda: "rank 0: rank 1 stopped answering" in hosts.text(), 30)
        # behind the cut link, rank 1 times out too, and cannot reach the store on host 0 either: 8 s later
        hosts.wait_for(lambda: "rank 1: rank 0 and the rendezvous store" in hosts.text(), 20)
    finally:
        hosts.stop()
    said = sentence(hosts.text(), "rank 0: rank 1 stopped answering")
    assert seconds < 10 + 10 and "--resume" in said, said  # ddp_timeout, then ~2 s to agree on who is gone
    assert "--resume" in sentence(hosts.text(), "rank 1: rank 0 and the rendezvous store")
    done = steps_done(out)
    p = alone(out, fields(tiny_model, out, reward_file, steps=done + 1, resume=True))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumes with 1" in p.stdout and read_jsonl(out / "metrics.jsonl")[-1]["step"] == done + 1


@pytest.mark.skipif(shutil.which("nft") is None, reason="--loss needs nft (apt-get install nftables)")
def test_a_link_losing_5_percent_of_its_packets_still_completes(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    out.mkdir()
    trains_two_steps(Hosts(2, out, fields(tiny_model, out, reward_file, steps=2, ddp_timeout=30), "--loss", "5"), out)


@pytest.mark.skipif(_why_no_delay() is not None, reason=str(_why_no_delay()))
def test_a_link_with_20_ms_of_latency_holds_each_way_that_long_and_training_completes(tiny_model, tmp_path,
                                                                                     reward_file):
    out = tmp_path / "run"
    out.mkdir()
    probe = Hosts(2, out, "", "--delay", "20ms", command=[str(HERE / "netns_rtt.py")])
    probe.wait_for(lambda: probe.proc.poll() is not None, 60)
    rtt = float(sentence(probe.text(), "[host 1] rtt ").split()[-1])
    assert 0.040 <= rtt < 0.2, probe.text()[-3000:]  # the handshake: 20 ms there, 20 ms back
    trains_two_steps(Hosts(2, out, fields(tiny_model, out, reward_file, steps=2, ddp_timeout=30), "--delay", "20ms"),
                     out)


def test_a_host_that_never_joins_is_one_sentence_within_the_join_timeout(tiny_model, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    train = ["train", "--profile", "quick", "--model", tiny_model, "--output-dir", str(out), "--steps", "2"]
    hosts = Hosts(2, out, "", "--absent", "1", "--join-timeout", "10", command=train)
    try:
        seconds = hosts.wait_for(lambda: hosts.proc.poll() is not None, 60)
    finally:
        hosts.stop()
    assert hosts.proc.returncode == 2 and seconds < 10 + 30, hosts.text()[-4000:]
    said = sentence(hosts.text(), "[host 0] cpu-grpo: not all 2 machines joined the rendezvous at 10.77.0.1:")
    assert "within --join-timeout 10 s" in said and "start the same command on every machine" in said, hosts.text()
    assert "Traceback" not in hosts.text() and not (out / "metrics.jsonl").exists()


def test_a_host_killed_while_writing_a_checkpoint_leaves_the_last_complete_one(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    out.mkdir()
    hosts = Hosts(2, out, fields(tiny_model, out, reward_file, steps=200), worker=__file__)
    partial = []
    try:
        hosts.wait_for(lambda: partial.extend((out / "checkpoints").glob(".step-*/train_config.yaml")) or partial, 60)
        hosts.kill_host(0)  # rank 0: the rank that writes
        hosts.wait_for(lambda: "rank 1: rank 0 and the rendezvous store" in hosts.text(), 20)
    finally:
        hosts.stop()
    said = sentence(hosts.text(), "rank 1: rank 0 and the rendezvous store")
    assert "--resume" in said, said
    complete = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert complete == ["step-000001"] and (out / "checkpoints" / complete[0] / "trainer_state.pt").exists()
    again = Hosts(2, out, fields(tiny_model, out, reward_file, steps=3, resume=True))
    again.wait_for(lambda: again.proc.poll() is not None, 90)
    assert again.proc.returncode == 0, again.text()[-4000:]
    assert "resumed from" in again.text() and read_jsonl(out / "metrics.jsonl")[-1]["step"] == 3
    assert (out / "checkpoints" / "step-000003" / "trainer_state.pt").exists()


def _slow_checkpoints() -> None:
    """Rank 0's checkpoints after the first stop for a minute once their config is written (killed by then)."""
    from cpu_grpo.train import checkpoint

    real, calls = checkpoint.config_mod, itertools.count()

    class Slow:
        def __getattr__(self, name):
            return getattr(real, name)

        def save(self, cfg, path):
            real.save(cfg, path)
            if Path(path).parent.name.startswith(".") and next(calls) >= 1 and os.environ.get("RANK") == "0":
                time.sleep(60)

    checkpoint.config_mod = Slow()


if __name__ == "__main__":
    import json

    import dist_worker

    _slow_checkpoints()
    dist_worker.train(Path(sys.argv[2]), json.loads(sys.argv[3]))
