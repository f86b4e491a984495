"""Run code a model wrote, never in the trainer's process, and never with the trainer's rights.

Each program runs in a new Python interpreter (isolated mode, no site packages) inside bubblewrap, the sandbox of
Flatpak (Debian's `bubblewrap`): new user, mount, pid, network, IPC and UTS namespaces; as `nobody`, inside and
out (a trainer that is root starts bubblewrap as nobody: a user namespace made by root would map nobody inside to
root outside, whose processes no process limit counts), with the system's Python where the trainer's is out of
nobody's reach (pyenv under /root; the harness needs only the standard library); no capabilities and no further
user namespaces; a read-only view of the system's programs and libraries and of the interpreter, nothing else (no
/home, /root, /etc but the linker's cache, /run, /var, the project: no keys, tokens, caches, checkpoints or sockets
of the host); its own /proc; a writable /tmp that is a tmpfs of `disk_mb`; a seccomp filter that refuses setns,
unshare, namespace-making clones, mount, ptrace and calls like them (`seccomp_filter`). Inside, the limits of time,
CPU, memory, file size, open files and processes; the whole process tree dies at the wall-clock limit.

Where bubblewrap cannot run (not installed; a user without user namespaces), code rewards are refused, unless the
user accepts running model code with the limits alone (`allow_unisolated_code`): `require` says which at start.

What the field does, read before writing this: TRL's code rewards send programs to E2B's remote sandboxes; Harbor
tasks (TRL's, Tinker's) run in a container built from the task's Dockerfile; verl's sandbox-fusion is a service
that runs code in isolated workers; OpenAI's human-eval runs it in a local process after `reliability_guard`
disables os and shutil functions in that same interpreter, which the code itself can undo. Here there is no
container engine or cloud, so the isolation is the kernel's, through the tool Flatpak uses; and, as in those
services, the expected output is compared outside the code's process."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxError
from . import codecheck

NOBODY = 65534  # the user model code runs as
# util-linux's setpriv drops root to nobody in the child: Popen(user=...) cannot use vfork, and a full fork of a
# trainer holding a model costs ~40 ms a completion (1.3 s of a 32-completion step, measured)
_SETPRIV = shutil.which("setpriv")


@dataclass(frozen=True)
class Limits:
    seconds: float = 5.0  # wall clock, then the whole process tree is killed
    cpu_seconds: int = 5
    memory_mb: int = 512  # address space
    file_mb: int = 8  # any file it writes, its output included
    disk_mb: int = 64  # all it writes (its /tmp)
    open_files: int = 64
    processes: int = 16  # processes and threads of its user at once (a fork bomb of 64 stalled the machine 20 s)


@dataclass(frozen=True)
class Result:
    passed: bool  # exited with status 0 within its limits (run_tests: and every check held)
    status: str  # "passed" | "failed" | "timeout" | "killed"
    seconds: float
    output: str  # the end of what it printed (stdout and stderr), for reading a failure
    share: float = 0.0  # run_tests: the share of the checks that held


# ---------------------------------------------------------------------------- seccomp

# system calls refused with EPERM (Docker's default profile refuses these too): entering or making namespaces,
# mounting, tracing or reading other processes, kernel modules, keyrings, BPF, io_uring, rebooting
_DENIED = ("ptrace", "mount", "umount2", "pivot_root", "chroot", "setns", "unshare", "process_vm_readv",
           "process_vm_writev", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
           "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "open_by_handle_at",
           "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "fsopen", "fsconfig",
           "fsmount", "move_mount", "open_tree", "fspick", "mount_setattr", "io_uring_setup", "io_uring_enter",
           "io_uring_register")
# per machine: the audit architecture, the numbers of _DENIED in its order (linux's unistd_64.h for x86_64,
# asm-generic/unistd.h for aarch64), clone's and clone3's
_NUMBERS = {
    "x86_64": (0xC000003E, (101, 165, 166, 155, 161, 308, 272, 310, 311, 246, 320, 175, 313, 176, 321, 298, 250, 248,
                            249, 323, 304, 303, 167, 168, 169, 163, 179, 103, 430, 431, 432, 429, 428, 433, 442, 425,
                            426, 427), 56, 435),
    "aarch64": (0xC00000B7, (117, 40, 39, 41, 51, 268, 97, 270, 271, 104, 294, 105, 273, 106, 280, 241, 219, 217, 218,
                             282, 265, 264, 224, 225, 142, 89, 60, 116, 430, 431, 432, 429, 428, 433, 442, 425, 426,
                             427), 220, 435),
}
_CLONE_NEW = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The classic-BPF program (struct sock_filter[]) bubblewrap loads with --seccomp: a call of another
    architecture (or x86_64's x32 calls) kills the process; a call of _DENIED, or a clone that makes a namespace,
    fails with EPERM; clone3 fails with ENOSYS, so that the C library falls back to clone, whose flags can be read
    (Docker's profile does the same); any other call is allowed. None on a machine whose numbers are not known."""
    if (machine or platform.machine()) not in _NUMBERS:
        return None
    arch, denied, clone, clone3 = _NUMBERS[machine or platform.machine()]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [(LD, 0, 0, 4), (JEQ, 0, "kill", arch), (LD, 0, 0, 0),  # the architecture, then the call's number
            (JGE, "deny", 0, 0x40000000) if arch == 0xC000003E else (JEQ, 0, 0, 0),
            *[(JEQ, "deny", 0, nr) for nr in denied], (JEQ, "nosys", 0, clone3), (JEQ, 0, "allow", clone),
            (LD, 0, 0, 16), (JSET, "deny", "allow", _CLONE_NEW)]  # clone's flags (its first argument, low half)
    labels = {"allow": len(prog), "deny": len(prog) + 1, "nosys": len(prog) + 2, "kill": len(prog) + 3}
    prog += [(RET, 0, 0, 0x7FFF0000), (RET, 0, 0, 0x00050000 | 1), (RET, 0, 0, 0x00050000 | 38),
             (RET, 0, 0, 0x80000000)]  # SECCOMP_RET_ALLOW, _ERRNO | EPERM, _ERRNO | ENOSYS, _KILL_PROCESS

    def offset(i: int, target) -> int:  # jumps count from the next instruction
        return labels[target] - i - 1 if isinstance(target, str) else target

    return b"".join(struct.pack("=HBBI", code, offset(i, jt), offset(i, jf), k)
                    for i, (code, jt, jf, k) in enumerate(prog))


# ---------------------------------------------------------------------------- isolation

@dataclass(frozen=True)
class Isolation:
    name: str  # "bubblewrap" or "none"
    detail: str  # its version and what it gives, or why none works here

    def line(self) -> str:
        """The one line a run prints at start."""
        if self.name == "none":
            return f"code sandbox: NO isolation ({self.detail}); model code runs with process limits only"
        return f"code sandbox: {self.detail}"


def _system_binds(python: str) -> list[str]:
    """bubblewrap's arguments for a read-only view of the system's programs and libraries, and the interpreter."""
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = str(Path(python).parent.parent)
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]
    return args


def _command(iso: Isolation, task: Path, limits: Limits, mode: str, values_fd: int, seccomp_fd: int) -> list[str]:
    """The command line that runs harness.py over the folder `task` under `iso`: bubblewrap with a user namespace
    of its own, started as nobody when the trainer is root (so that nobody it is outside too, and the process limit
    holds: root's processes are never counted)."""
    caps = {"RLIMIT_AS": limits.memory_mb << 20, "RLIMIT_CPU": limits.cpu_seconds, "RLIMIT_CORE": 0,
            "RLIMIT_FSIZE": limits.file_mb << 20, "RLIMIT_NOFILE": limits.open_files,
            "RLIMIT_NPROC": limits.processes}
    inside = "/task" if iso.name == "bubblewrap" else str(task)
    python = [_interpreter(), "-I", "-S", "-B", f"{inside}/harness.py", mode, inside, json.dumps(caps),
              str(values_fd)]
    if iso.name != "bubblewrap":
        return python
    return ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--uid", str(NOBODY), "--gid", str(NOBODY), *_system_binds(python[0]), "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp", "--ro-bind", str(task), "/task",
            "--chdir", "/tmp", "--seccomp", str(seccomp_fd), *python]


def _interpreter() -> str:
    """The trainer's own Python, or, as root where nobody cannot reach it (pyenv under /root), the system's: the
    harness needs only the standard library."""
    mine = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if os.geteuid() != 0 or _others_can_run(mine):
        return mine
    system = shutil.which("python3", path="/usr/bin:/bin")
    return os.path.realpath(system) if system and _others_can_run(os.path.realpath(system)) else mine


def _others_can_run(path: str) -> bool:
    """Whether a user other than the owner can reach and run `path` (every folder above it searchable)."""
    parts = Path(path).parents
    return os.stat(path).st_mode & 0o001 != 0 and all(os.stat(d).st_mode & 0o001 for d in parts)


@functools.cache
def isolation() -> Isolation:
    """The isolation model code gets here: bubblewrap where it runs (tried once, with a real program), else none,
    with the reason."""
    tool = shutil.which("bwrap")
    if tool is None:
        return Isolation("none", "bubblewrap is not installed: apt-get install bubblewrap (or dnf, pacman: "
                                 "bubblewrap)")
    if seccomp_filter() is None:
        return Isolation("none", f"no seccomp filter is known here for {platform.machine()}")
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
    iso = Isolation("bubblewrap", f"{version or 'bubblewrap'} (user, mount, pid, network namespaces; as nobody, no "
                                  "capabilities; a read-only view of the system; seccomp)")
    probe = _run(iso, "print('ok')", Limits(seconds=20, cpu_seconds=10), "run")[0]
    if probe.status != "passed" or "ok" not in probe.output:
        why = probe.output.strip().splitlines()[-1:] or [probe.status]
        return Isolation("none", f"bubblewrap did not start here ({why[0][:160]}); as a user it needs user "
                                 "namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu an AppArmor "
                                 "profile for bwrap)")
    return iso


_unisolated_allowed = False


def require(allow_unisolated: bool = False) -> str:
    """Before a run that rewards code: the line that says which isolation it gets, or SandboxError in one sentence
    when there is none and the user has not accepted running model code without it."""
    global _unisolated_allowed
    iso = isolation()
    if iso.name == "none" and not allow_unisolated:
        raise SandboxError(f"a code reward runs model-written code, and no sandbox works here ({iso.detail}): "
                           "install bubblewrap, or accept running model code with process limits only "
                           "(--allow-unisolated-code; only on a machine you would give the model a shell on)")
    _unisolated_allowed = _unisolated_allowed or allow_unisolated
    return iso.line()


# ---------------------------------------------------------------------------- running

def _run(iso: Isolation, program: str, limits: Limits, mode: str, spec: dict | None = None) -> tuple:
    """Run harness.py in `mode` over main.py = `program` under `iso`; the Result and the lines written to the
    values descriptor (mode "calls")."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cpu-grpo-sandbox-") as tmp:
        task, work = Path(tmp, "task"), Path(tmp, "work")
        for folder in (task, work):
            folder.mkdir()
        Path(task, "main.py").write_text(program)
        Path(task, "calls.json").write_text(json.dumps(spec or {}))
        shutil.copy(Path(__file__).with_name("harness.py"), task / "harness.py")
        os.chmod(tmp, 0o711)
        os.chmod(task, 0o755)
        os.chmod(work, 0o777)
        drop = os.geteuid() == 0 and _others_can_run(_interpreter())  # as root: nobody runs it (and bubblewrap)
        as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if drop and not _SETPRIV else {}
        prefix = [_SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"] if drop and _SETPRIV \
            else []
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp" if iso.name == "bubblewrap" else str(work),
               "TMPDIR": "/tmp" if iso.name == "bubblewrap" else str(work), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
               RUN_MARK: tmp}
        read_fd, write_fd = os.pipe()
        os.write(write_fd, seccomp_filter() or b"")
        os.close(write_fd)
        with open(Path(tmp, "out.txt"), "wb") as out, open(Path(tmp, "values.jsonl"), "wb") as values:
            cmd = prefix + _command(iso, task, limits, mode, values.fileno(), read_fd)
            try:
                proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        pass_fds=(values.fileno(), read_fd), **as_nobody)
            finally:
                os.close(read_fd)
            try:
                code = proc.wait(timeout=limits.seconds)
                status = "passed" if code == 0 else "killed" if code < 0 or code >= 128 else "failed"
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                _kill_group(proc)
                if iso.name == "none":
                    _kill_marked(tmp)
        output = Path(tmp, "out.txt").read_bytes()[-2000:].decode(errors="replace")
        with open(Path(tmp, "values.jsonl"), "rb") as f:
            lines = f.read(4 << 20).decode(errors="replace").splitlines()
    return Result(status == "passed", status, time.monotonic() - t0, output), lines


def _isolation_for_a_run() -> Isolation:
    iso = isolation()
    if iso.name == "none" and not _unisolated_allowed:
        require(False)  # raises, with the reason
    return iso


def run_python(program: str, limits: Limits = Limits()) -> Result:
    """Run `program` as a Python script in the sandbox under `limits`; passed when it exits with status 0."""
    return _run(_isolation_for_a_run(), program, limits, "run")[0]


def run_tests(solution: str, tests: str | codecheck.CodeTests, limits: Limits = Limits()) -> Result:
    """Run `solution`, then the calls of `tests` (codecheck.py says which forms) in the sandbox, and compare the
    values they give with the expected ones here; passed when the program ended well and every check held, `share`
    the share of the checks that held. codecheck.CodeTestsError when the tests cannot be checked this way."""
    plan = tests if isinstance(tests, codecheck.CodeTests) else codecheck.parse_tests(tests)
    result, lines = _run(_isolation_for_a_run(), solution, limits, "calls", plan.spec())
    held = codecheck.results(plan, lines)
    passed = result.passed and all(held)
    status = result.status if not result.passed else "passed" if passed else "failed"
    return Result(passed, status, result.seconds, result.output, sum(held) / len(held))


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the sandbox's process group (bubblewrap's pid namespace dies with it) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


RUN_MARK = "CPU_GRPO_SANDBOX_RUN"  # in the environment of every process a program starts: its run's folder


def _kill_marked(run: str) -> None:
    """Without bubblewrap's pid namespace, processes a program left behind in sessions of their own (which killpg
    does not reach) are found by their run's mark in their environment, and killed."""
    import psutil

    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_MARK) == run:
                p.kill()
        except (psutil.Error, OSError):
            pass


def run_many(pairs: list[tuple[str, str]], limits: Limits = Limits(), workers: int | None = None) -> list[Result]:
    """run_tests on each (solution, tests), a few at a time (one per core), in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers or max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda pair: run_tests(*pair, limits=limits), pairs))
