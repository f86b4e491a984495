"""`cpu-grpo train --nproc N` and `--nnodes N`: torchrun, run inside this process on the same command, so that a
rank that fails, a machine that never joins and a rendezvous that cannot be reached each end in one sentence.
Imports torch only when it launches."""

from __future__ import annotations

import os
import sys

from ..errors import UserError


def launched() -> bool:
    """Whether this process is one rank of several (torchrun sets WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def add_arguments(p) -> None:
    """`cpu-grpo train`'s launch flags, torchrun's names."""
    launch = p.add_argument_group("data-parallel launch (torchrun's names; docs/distributed.md)")
    launch.add_argument("--nproc", type=int, default=1, metavar="N", help="processes on this machine (one machine: "
                        "runs torchrun --standalone --nproc-per-node N)")
    launch.add_argument("--nnodes", type=int, default=1, metavar="N", help="machines; run the same command on each, "
                        "with its --node-rank")
    launch.add_argument("--node-rank", type=int, default=None, metavar="R", help="this machine's rank; 0 hosts the "
                        "rendezvous")
    launch.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="node rank 0's address and a "
                        "free port, the same on every machine")
    launch.add_argument("--rdzv-id", default="cpu-grpo", help="the run's id at the rendezvous (default: %(default)s)")
    launch.add_argument("--join-timeout", type=int, default=600, metavar="S", help="seconds to wait for every "
                        "machine to join (default: %(default)s)")
    launch.add_argument("--local-addr", default=None, metavar="ADDR", help="this machine's address on the shared "
                        "network, where its host name does not resolve to it")


def check_counts(args) -> None:
    """--nproc and --nnodes count processes and machines: at least one each, else a UserError that says so."""
    for flag, n, what in (("--nproc", args.nproc, "processes on this machine"), ("--nnodes", args.nnodes, "machines")):
        if n < 1:
            raise UserError(f"{flag} counts the {what} that train: give 1 or more, not {n} (1, the default, trains "
                            "in this process alone).")


LAUNCH_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--join-timeout", "--local-addr")


def launch_args(args) -> list[str]:
    """torchrun's arguments for `cpu_grpo <the same command without the launch flags>`: `--standalone
    --nproc-per-node N` on one machine, or one machine of `--nnodes` that meet at `--rdzv-endpoint` (c10d; node rank
    0 hosts it and c10d orders the machines)."""
    rest, i, argv = [], 0, args.argv
    while i < len(argv):
        if argv[i].split("=")[0] in LAUNCH_FLAGS:
            i += 1 if "=" in argv[i] else 2
            continue
        rest.append(argv[i])
        i += 1
    launch = [f"--nproc-per-node={args.nproc}", "--max-restarts=0"]
    if args.nnodes == 1:
        return [*launch, "--standalone", "-m", "cpu_grpo", *rest]
    if not args.rdzv_endpoint or args.node_rank is None or not 0 <= args.node_rank < args.nnodes:
        raise UserError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the machine of --node-rank 0) "
                        "and this machine's --node-rank (0 to nnodes - 1).")
    conf = (f"join_timeout={args.join_timeout},read_timeout={min(60, args.join_timeout)},"
            f"is_host={int(args.node_rank == 0)}")
    launch += [f"--nnodes={args.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}",
               f"--rdzv-id={args.rdzv_id}", f"--rdzv-conf={conf}"]  # read_timeout: trying to reach the endpoint
    launch += [f"--local-addr={args.local_addr}"] if args.local_addr else []
    return [*launch, "-m", "cpu_grpo", *rest]


def torchrun(args) -> int:
    """torchrun, run in this process, so that a rank's failure, and a machine that never joins, end in one line,
    not torchrun's traceback."""
    import logging

    launch = launch_args(args)
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ  # c10d's retries, each with a C++ backtrace, in this process
    if quiet:  # (read once, as torch loads): its failures end in one sentence below; the ranks keep torch's level
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    from torch.distributed import run
    if quiet:
        del os.environ["TORCH_CPP_LOG_LEVEL"]
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import api as rdzv

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # its report of a failed rank
    try:
        run.run(run.parse_args(launch))
    except ChildFailedError as e:
        failed = ", ".join(f"rank {rank} ({f.signal_name() if f.exitcode < 0 else f'exit code {f.exitcode}'})"
                           for rank, f in sorted(e.failures.items()))
        print(f"cpu-grpo: the run stopped ({failed}): the lines above say why; `--resume` continues from its last "
              "checkpoint.", file=sys.stderr)
        return 2
    except rdzv.RendezvousTimeoutError:
        raise UserError(f"not all {args.nnodes} machines joined the rendezvous at {args.rdzv_endpoint} within "
                        f"--join-timeout {args.join_timeout} s, so no rank started and nothing was written: start "
                        "the same command on every machine, each with its own --node-rank, and check that each "
                        f"reaches {args.rdzv_endpoint}.") from None
    except rdzv.RendezvousConnectionError:
        raise UserError(f"the rendezvous at {args.rdzv_endpoint} could not be reached (or, on node rank 0, opened), "
                        "so nothing was written: start --node-rank 0 on that machine (it hosts the rendezvous; a free "
                        "port), and check that this machine reaches that address and port.") from None
    except rdzv.RendezvousError as e:
        raise UserError(f"the rendezvous at {args.rdzv_endpoint} failed ({type(e).__name__}: {e}), so nothing was "
                        "written: start the same command on every machine again.") from None
    return 0
