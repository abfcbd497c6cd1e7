"""A delaying switch for simulated hosts, where the kernel has no ``netem``.

``tc qdisc ... netem`` is the usual way to give a link a delay; kernels built without
``CONFIG_NET_SCH_NETEM`` refuse it. This process is the wire instead: it opens one TUN
device per host (layer 3, no packet-info header), the host's end is moved into the
host's network namespace as its ``eth0``, and every IPv4 packet a host sends is read
here and written to the host it is addressed to ``delay`` seconds later. One delay per
packet and FIFO order per destination: a link of constant latency that never reorders,
as a quiet LAN. Packets to an address no host has are dropped.

Run as ``python tests/wire.py DELAY_MS NAME...``: it creates the devices, prints
``READY`` once they exist, and forwards until stdin closes (its parent's end) or a
SIGTERM. Device MTUs are set by the parent; reads take up to 64 KiB.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def forward(delay: float, devices: list[int], addresses: dict[bytes, int]) -> None:
    """Until stdin closes: read packets from every device, deliver each after ``delay``."""
    stdin = sys.stdin.fileno()
    due: list[tuple[float, int, int, bytes]] = []  # (when, sequence, fd, packet)
    sequence = 0
    while True:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else None
        ready, _, _ = select.select([stdin, *devices], [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            if fd == stdin:
                if not os.read(stdin, 1 << 12):
                    return
                continue
            while True:
                try:
                    packet = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if len(packet) < 20 or packet[0] >> 4 != 4:
                    continue  # IPv4 only (the hosts have no IPv6 address)
                target = addresses.get(packet[16:20])
                if target is not None:
                    sequence += 1
                    heapq.heappush(due, (now + delay, sequence, target, packet))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, fd, packet = heapq.heappop(due)
            try:
                os.write(fd, packet)
            except (BlockingIOError, OSError):
                pass  # a full device queue drops, as a congested link does


def main() -> None:
    delay = float(sys.argv[1]) / 1000
    names = sys.argv[2:]
    devices = [open_tun(name) for name in names]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("READY", flush=True)
    # The parent tells which address each device got: one line "index a.b.c.d" each.
    addresses: dict[bytes, int] = {}
    for _ in names:
        index, address = sys.stdin.readline().split()
        addresses[bytes(int(part) for part in address.split("."))] = devices[int(index)]
    forward(delay, devices, addresses)


if __name__ == "__main__":
    main()
