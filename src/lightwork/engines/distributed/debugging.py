"""The in-task debugger on a Dask cluster: ``breakpoint()`` in a task or actor method
on a worker pauses that call, and ``lightwork debug`` on the driver's machine attaches.

    driver (ClusterDebugging)                 worker process (DebugSession plugin)
    init: token = 128 random bits
      register_plugin(DebugSession) ───────►  setup: the session's (token, kind,
        (the scheduler hands it to every        post-mortem) kept by session tag;
         worker, and to those that join)        breakpoint() hooks installed
      subscribe_topic(lightwork-debug-<tag>)
                                              breakpoint() in a call of that session:
                                                pdb on a TCP socket bound to the
                                                worker's own cluster host, port 0
      PauseTable.add, one line on stderr ◄────  worker.log_event("paused", info)
    lightwork debug ─ control socket ─► debug_paused: rows + the token
    lightwork debug ───── TCP: "HELLO <token>", then text ─────► pdb (kernel.debug_wire)
      PauseTable.remove, paused window ◄─────  worker.log_event("resumed", ...)
    shutdown: unregister_worker_plugin ──────► teardown: its paused calls quit (``q``;
                                                debugpy's stop waiting and run on)

What a worker exposes, and to whom: while a call is paused, one TCP port on the
worker's cluster address (the host of ``Worker.address``, never every interface), for
that one session. It answers only a client whose first line carries the driver
session's token (``debug_wire.TokenListener``); the token reaches the workers inside
the plugin, through the scheduler, as everything a client sends does: whoever can
submit work to the cluster can run code on its workers anyway, and the token adds
nothing against them. Against everyone else who can reach the worker's network it is
the lock. Text only, both ways; nothing is unpickled. The driver hands the token only
to its own control socket's clients (0600, the user's uid). ``debugger="debugpy"``
listens on 127.0.0.1 of the worker's machine instead (debugpy has no token): reach it
there, or through an ssh tunnel.

``PYTHONBREAKPOINT=0`` in the driver's environment at ``init`` turns its session's
breakpoints and post-mortem off on every worker (the session's kind is ``"off"``): the
workers' own environment is the cluster's, shared by every driver.

Announcements go through distributed's own event channel (``Worker.log_event`` ->
the scheduler -> the driver's ``Client.subscribe_topic``), on a topic per session; the
handler runs on the client's event loop and only records and prints. The driver stamps
a pause's start and end on its own clock when it hears of them (workers' clocks are
their own). A pause whose worker left the cluster, or whose task ended, is dropped
when the paused calls are listed (``rows``).

State: in a worker, ``_sessions`` (session tag -> its options, bounded) and the worker
object, set by the plugin; the running call's (task id, name, session) in ``CALL``, set
by the task and actor wrappers. In the driver, ``ClusterDebugging`` owns the session's
``PauseTable`` (the run record's ``pauses``, which the views read).
"""

from __future__ import annotations

import contextvars
import os
import secrets
import sys
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from lightwork.kernel import debugger
from lightwork.kernel.driver_output import STDERR
from lightwork.kernel.pauses import PauseTable, pause_line

TOPIC = "lightwork-debug-{:x}"
MAX_SESSIONS = 16  # sessions of drivers that died without tearing theirs down

#: The call running in this context: (task id, name, session tag), or None.
CALL: contextvars.ContextVar[tuple[int, str, int] | None] = contextvars.ContextVar(
    "lightwork_debug_call", default=None)


# ---------------------------------------------------------------------- worker side
class _Options:
    __slots__ = ("token", "kind", "post_mortem", "addresses")

    def __init__(self, token: str, kind: str, post_mortem: bool) -> None:
        self.token, self.kind, self.post_mortem = token, kind, post_mortem
        self.addresses: set[str] = set()  # the listeners of its calls paused now


_sessions: dict[int, _Options] = {}
_lock = threading.Lock()
_worker: Any = None


class DebugSession(WorkerPlugin):
    """A driver session's debugging options, on every worker of the cluster."""

    def __init__(self, session: int, token: str, kind: str, post_mortem: bool) -> None:
        self.session, self.token, self.kind, self.post_mortem = session, token, kind, post_mortem

    @property
    def plugin_name(self) -> str:
        return f"lightwork-debug-{self.session:x}"

    def setup(self, worker: Any) -> None:
        global _worker
        with _lock:
            _worker = worker
            _sessions[self.session] = _Options(self.token, self.kind, self.post_mortem)
            while len(_sessions) > MAX_SESSIONS:
                del _sessions[next(iter(_sessions))]
        # debugpy has no token: it stays on this machine's loopback.
        debugger.install(None, 0, _announce, _describe, listen=_listen, options=_options)

    def teardown(self, worker: Any) -> None:
        """The driver's session ended: its calls paused now quit (nobody can attach)."""
        from lightwork.kernel import debug_session

        with _lock:
            options = _sessions.pop(self.session, None)
        for address in options.addresses if options is not None else ():
            terminal = debug_session.terminals.get(address)
            if terminal is not None:
                terminal.abandon()
            stop_waiting = debug_session.waiting.get(address)  # debugpy's, for an editor
            if stop_waiting is not None:
                stop_waiting()


def _session() -> int:
    call = CALL.get()
    if call is not None:
        return call[2]
    from lightwork.engines.distributed.worker import current

    return getattr(current, "session", 0)


def _options() -> tuple[str, bool] | None:
    options = _sessions.get(_session())
    return None if options is None else (options.kind, options.post_mortem)


def _describe() -> tuple[int, str]:
    call = CALL.get()
    return (call[0], call[1]) if call is not None else (0, "?")


def _listen() -> Any:
    from distributed.comm import get_address_host

    from lightwork.kernel.debug_wire import TokenListener

    options = _sessions.get(_session())
    if options is None or _worker is None:
        raise RuntimeError(
            "breakpoint() ran in a cluster task whose driver session set up no debugger "
            "(a driver without lightwork.init, or one that has ended); call it in tasks "
            "of a session started with lightwork.init(address=...)")
    return TokenListener(get_address_host(_worker.address), options.token)


def _announce(event: str, info: dict[str, Any]) -> None:
    session = _session()
    options = _sessions.get(session)
    if options is not None:
        if event == "paused":
            options.addresses.add(info["socket"])
        else:
            options.addresses.discard(info["socket"])
    worker = _worker
    if worker is None:
        return
    info = {**info, "worker": str(worker.address)}
    if info.get("kind") == "debugpy":
        from distributed.comm import get_address_host

        info["host"] = get_address_host(worker.address)
    worker.log_event(TOPIC.format(session), {"event": event, "info": info})


# ---------------------------------------------------------------------- driver side
class ClusterDebugging:
    """The driver's side: the plugin, the pauses heard of, their rows for the CLI."""

    def __init__(self, backend: Any, kind: str, post_mortem: bool) -> None:
        self.backend = backend
        self.token = secrets.token_hex(16)
        self.pauses = PauseTable()
        self.topic = TOPIC.format(backend.session_tag)
        if os.environ.get("PYTHONBREAKPOINT") == "0":  # the driver's switch, for its workers
            kind, post_mortem = "off", False
        plugin = DebugSession(backend.session_tag, self.token, kind, post_mortem)
        client = backend.client
        self.plugin_name = plugin.plugin_name + client_suffix(client)
        # Subscribed first: a task that pauses at once is heard of.
        client.loop.add_callback(client.subscribe_topic, self.topic, self._on_event)
        client.register_plugin(plugin, name=self.plugin_name)

    def _on_event(self, event: tuple[float, Any]) -> None:
        """A worker's announcement (on the client's event loop: never block)."""
        message = event[1]
        if not isinstance(message, dict):
            return
        info = dict(message.get("info") or {})
        now = time.monotonic()
        if message.get("event") == "paused":
            info["since"] = now
            info["worker_id"] = 0
            self.pauses.add(info)
            output = getattr(self.backend, "output", None)
            if output is not None:  # in turn with the workers' lines
                output.say(STDERR, pause_line(info))
            else:
                print(pause_line(info), file=sys.stderr, flush=True)
            return
        opened = self.pauses.remove(str(info.get("socket")))
        if opened is not None:
            self._close_window(opened, now)

    def _close_window(self, info: dict[str, Any], until: float) -> None:
        """The pause joins its record's ``paused`` windows (the advisor, the timeline)."""
        log = self.backend.session_log
        if log is None:
            return
        with log.lock:
            live = log.tasks.get(info["task_id"])
            if live is not None:
                live.record.paused += ((info["since"], until),)

    def call_ended(self, record: Any) -> None:
        """``record``'s report came before the end of its pause (two channels; the log's
        lock held): the pause ends with the call, before the record is final."""
        for info in self.pauses.rows():
            if info["task_id"] == record.task_id and self.pauses.remove(info["socket"]):
                record.paused += ((info["since"], max(info["since"], record.finished)),)

    def rows(self) -> list[dict[str, Any]]:
        """The paused calls (``debug_paused``), with the token to attach with; those
        whose worker left the cluster, or whose task ended, are dropped first."""
        if not self.pauses:
            return []
        workers = set(self.backend.client.run_on_scheduler(_worker_addresses))
        log = self.backend.session_log
        tracked = log is not None and log.log.enabled
        now = time.monotonic()
        for info in self.pauses.rows():
            gone = info.get("worker") not in workers
            if not gone and tracked:
                with log.lock:
                    gone = info["task_id"] not in log.tasks
            if gone and self.pauses.remove(info["socket"]) is not None:
                self._close_window(info, now)
        # (debugpy's listener takes no token: it is not handed out with its row)
        return [row if row.get("kind") == "debugpy" else {**row, "token": self.token}
                for row in self.pauses.rows()]

    def stop(self) -> None:
        """The session ends: the workers forget it; calls still paused quit."""
        client = self.backend.client
        if getattr(client, "status", None) != "running":
            return
        try:
            client.unregister_worker_plugin(self.plugin_name)
        except Exception:  # noqa: BLE001, S110 - a worker may be gone: nothing to undo
            pass
        # From the client's loop: its stream to the scheduler is woken only from there.
        client.loop.add_callback(_unsubscribe, client, self.topic)


def client_suffix(client: Any) -> str:
    """The end of the names of a session's worker plugins: its driver's client, so that
    the scheduler drops them when that client disconnects (``plugin.TaskErrors``)."""
    return "@" + str(client.id)


def _unsubscribe(client: Any, topic: str) -> None:
    try:
        client.unsubscribe_topic(topic)
    except Exception:  # noqa: BLE001, S110 - never subscribed, or the client is closing
        pass


def _worker_addresses(dask_scheduler: Any = None) -> list[str]:
    """Run on the scheduler: the addresses of the workers it has now."""
    return [str(address) for address in dask_scheduler.workers]
