"""Simulated hosts on one machine, for the tests of what crosses a network.

Each host is a network namespace with its own mount namespace, in which ``/tmp`` and
``/dev/shm`` are fresh tmpfs mounts: a session directory, a shared-memory segment or a
socket file made on one host is not there on another, as on separate machines. A
checkout or an environment that itself lives under ``/tmp`` (a CI clone) is bound back
into each host's fresh ``/tmp`` at the same path, so the hosts run the same code. The
hosts are joined by a bridge that lives in a namespace of its own (the switch), one
veth pair per host, on addresses in 198.18.0.0/15 (set aside for benchmarking, so they
never collide with a real LAN); nothing is routed out of the machine.

A host is held by one long-lived process (``sleep``) started inside both namespaces;
every command run "on" the host enters that process's namespaces with ``nsenter``, so
two commands on host A see the same ``/tmp`` (a CLI finds the driver's control socket),
and commands on A and B do not.

Needs root, ``ip`` (iproute2), ``unshare`` and ``nsenter`` (util-linux). ``skip_reason``
says what is missing; ``stop`` tears everything down, and the namespaces are named
with a tag of this process so a run that was killed leaves names that the next run's
sweep (``sweep_stale``) removes.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "lwh"
STASH = "/mnt"  # where the machine's /tmp is seen while the host's own /tmp is mounted


def _kept_under_tmp() -> list[str]:
    """The top directories under /tmp that a host must still see: this checkout and the
    interpreter's environment, when they live there (a CI clone in /tmp, say)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kept = set()
    for path in (here, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        parts = os.path.realpath(path).split(os.sep)
        if len(parts) > 2 and parts[1] == "tmp":
            kept.add(os.sep.join(parts[:3]))
    return sorted(kept)


def _mounts() -> str:
    """The holder's script: fresh /tmp and /dev/shm, with what must stay bound back in."""
    keep = _kept_under_tmp()
    steps = [f"mount --bind /tmp {STASH}"] if keep else []
    steps += ["mount -t tmpfs -o mode=1777 tmpfs /tmp"]
    for path in keep:
        inside = path[len("/tmp/"):]
        steps += [f"mkdir -p {path}", f"mount --bind {STASH}/{inside} {path}"]
    if keep:
        steps += [f"umount -l {STASH}"]
    steps += ["mount -t tmpfs -o mode=1777 tmpfs /dev/shm", "exec sleep infinity"]
    return " && ".join(steps)


def skip_reason() -> str | None:
    """Why simulated hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network and mount namespaces)"
    if _kept_under_tmp() and not os.path.isdir(STASH):
        return f"simulated hosts need {STASH} to see this checkout under /tmp from a host"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}` (iproute2 / util-linux)"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def sweep_stale() -> None:
    """Remove namespaces of earlier runs whose process is gone (a killed run)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX + "-"):
            continue
        try:
            owner = int(name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not os.path.exists(f"/proc/{owner}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


class SimulatedHosts:
    """``names`` hosts on one bridge; ``address(name)`` is the host's IPv4 address."""

    def __init__(self, names: tuple[str, ...] = ("a", "b", "c"), delay_ms: float = 0) -> None:
        self.names = names
        self.delay_ms = delay_ms
        self.wire: subprocess.Popen | None = None
        self.tag = f"{os.getpid()}-{random.randrange(1 << 16):04x}"
        # 198.18.0.0/15: the third octet spans 0-255 in 198.18 and 198.19
        self.subnet = f"198.{random.choice((18, 19))}.{random.randrange(256)}"
        self.holders: dict[str, subprocess.Popen] = {}
        self.processes: list[subprocess.Popen] = []
        self.namespaces: list[str] = []

    def _ns(self, name: str) -> str:
        return f"{PREFIX}-{self.tag}-{name}"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def start(self) -> SimulatedHosts:
        sweep_stale()
        try:
            if self.delay_ms:
                self._start_wire()
            else:
                self._start_bridge()
            for name in self.names:
                ns = self._ns(name)
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.holders[name] = subprocess.Popen(
                    ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation",
                     "private", "--", "sh", "-c", _mounts()], start_new_session=True)
            if self.wire is not None:
                assert self.wire.stdin is not None
                self.wire.stdin.write("".join(f"{index} {self.address(name)}\n"
                                              for index, name in enumerate(self.names)))
                self.wire.stdin.flush()
            for name in self.names:
                self._wait_for_mounts(name)
        except BaseException:
            self.stop()
            raise
        return self

    def _add_namespace(self, name: str) -> str:
        ns = self._ns(name)
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        return ns

    def _start_bridge(self) -> None:
        switch = self._add_namespace("sw")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index, name in enumerate(self.names):
            ns = self._add_namespace(name)
            host_end, switch_end = (f"lwh{index}h{os.getpid() % 100000}",
                                    f"lwh{index}s{os.getpid() % 100000}")
            _ip("link", "add", host_end, "type", "veth", "peer", "name", switch_end)
            _ip("link", "set", switch_end, "netns", switch)
            _ip("link", "set", host_end, "netns", ns)
            _ip("-n", ns, "link", "set", host_end, "name", "eth0")
            _ip("-n", switch, "link", "set", switch_end, "master", "br0")
            _ip("-n", switch, "link", "set", switch_end, "up")

    def _start_wire(self) -> None:
        devices = [f"lwt{index}x{os.getpid() % 100000}" for index in range(len(self.names))]
        wire = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.py")
        self.wire = subprocess.Popen(
            [sys.executable, wire, str(self.delay_ms), *devices], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.wire.stdout is not None
        if self.wire.stdout.readline().strip() != "READY":
            raise RuntimeError("the delaying wire did not start (no /dev/net/tun?)")
        for device, name in zip(devices, self.names):
            ns = self._add_namespace(name)
            _ip("link", "set", device, "netns", ns)
            _ip("-n", ns, "link", "set", device, "name", "eth0")
            # one large packet per TCP segment: the wire's cost is per packet
            _ip("-n", ns, "link", "set", "eth0", "mtu", "65000")

    def _wait_for_mounts(self, name: str, timeout: float = 10.0) -> None:
        holder = self.holders[name]
        deadline = time.monotonic() + timeout
        while True:
            if holder.poll() is not None:
                raise RuntimeError(f"host {name}'s namespace holder exited ({holder.returncode})")
            try:
                # the holder is `sleep` once both mounts are made (sh execs it)
                with open(f"/proc/{holder.pid}/comm") as f:
                    if f.read().strip() == "sleep":
                        return
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {name}'s namespaces were not ready in {timeout} s")
            time.sleep(0.02)

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``name`` (its network, its /tmp and /dev/shm)."""
        return ["nsenter", "-t", str(self.holders[name].pid), "-n", "-m", "--", *argv]

    def popen(self, name: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``name``, in a process group of its own (``stop`` ends it)."""
        process = subprocess.Popen(self.command(name, argv), start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def run(self, name: str, argv: list[str], timeout: float = 120,
            **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(name, argv), capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def start_dask(self, threads: int, env: dict[str, str] | None = None,
                   port: int = 8786) -> str:
        """A ``dask scheduler`` on the first host and a ``dask worker`` of ``threads``
        threads (``CPU=threads``) on each other one; its address (``stop`` ends them)."""
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        first, *others = self.names
        address = f"tcp://{self.address(first)}:{port}"
        quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.popen(first, [dask, "scheduler", "--host", self.address(first), "--port",
                           str(port), "--no-dashboard"], **quiet)
        for name in others:
            self.popen(name, [dask, "worker", address, "--host", self.address(name),
                              "--nthreads", str(threads), "--resources", f"CPU={threads}",
                              "--no-dashboard"], **quiet)
        return address

    def stop(self) -> None:
        wire = [self.wire] if self.wire is not None else []
        for process in [*self.processes, *self.holders.values(), *wire]:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for process in [*self.processes, *self.holders.values(), *wire]:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(5)
        for ns in reversed(self.namespaces):  # deleting a namespace removes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()
