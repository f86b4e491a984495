"""A switch with a fixed one-way latency, for kernels without netem (bench/netns.sh --delay).

    python bench/delaylink.py --delay-ms 20 [--loss 5] PREFIX0 PREFIX1 ...   # one TAP device per name

It opens one TAP device per name (with virtio-net headers and TSO, as a VM's NIC: the hosts send 64 KB segments,
which keeps this loop at a few thousand frames a second at 1 Gbit/s), prints `ready` once they exist, and then
forwards every Ethernet frame it reads from one device to the device its destination MAC was last seen on (every
other device for broadcasts and unknown addresses), `--delay-ms` after it arrived; `--loss` drops that percentage
of the frames, at random. The devices live while this process does: netns.sh moves each into its host's namespace
and shapes its rate there (tbf on the way out, tbf on an ifb for the way in), so the wire is: host -> rate -> this
delay -> rate -> host. Frames to one device leave in arrival order (the latency is constant).
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import os
import random
import select
import struct
import sys
import time

TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
VNET_HDR = 10  # struct virtio_net_hdr, before every frame


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    return fd


def forward(fds: list[int], delay: float, loss: float) -> None:
    where: dict[bytes, int] = {}  # a MAC address -> the device it was last seen on
    queues = [collections.deque() for _ in fds]  # per device: (due, frame), due ascending
    while True:
        due = min((q[0][0] for q in queues if q), default=None)
        timeout = None if due is None else max(0.0, due - time.monotonic())
        ready, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for src in ready:
            i = fds.index(src)
            while True:
                try:
                    frame = os.read(src, 70000)
                except BlockingIOError:
                    break
                eth = frame[VNET_HDR:]
                where[eth[6:12]] = i
                if loss and random.random() * 100 < loss:
                    continue
                dst = where.get(eth[0:6]) if not eth[0] & 1 else None  # multicast bit: flood
                for j in ([dst] if dst is not None else range(len(fds))):
                    if j != i:
                        queues[j].append((now + delay, frame))
        now = time.monotonic()
        for j, q in enumerate(queues):
            while q and q[0][0] <= now:
                try:
                    os.write(fds[j], q.popleft()[1])
                except OSError:  # a device whose host is gone (its link set down): the frame is lost, as on a wire
                    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="+", help="TAP device names, one per host")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way latency of the switch")
    ap.add_argument("--loss", type=float, default=0.0, help="percent of the frames dropped")
    a = ap.parse_args()
    fds = [open_tap(n) for n in a.names]
    print("ready", flush=True)
    forward(fds, a.delay_ms / 1000, a.loss)


if __name__ == "__main__":
    sys.exit(main())
