"""The plugins of the distributed backend: :class:`ExportedRefs` on every worker and
:class:`TaskErrors` on the scheduler.

Installed by the driver's ``init`` (``client.register_plugin``); imported only with
``distributed``.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from lightwork.engines.distributed import worker as cluster_worker

#: The scheduler topic :class:`TaskErrors` publishes on (``Client.subscribe_topic``).
TASK_ERRORS_TOPIC = "lightwork-task-errors"


class TaskErrors(SchedulerPlugin):
    """A scheduler plugin: publishes each task the scheduler fails because a worker was
    lost, so that every lightwork client can act on its own (``cluster_tasks``).

    Published on :data:`TASK_ERRORS_TOPIC` for a key that went to ``erred`` when its
    failure is a lost worker: ``{"key": key, "killed": the task that was running when its
    worker died (the key itself, or the dependency it failed with), "losses": how many
    lost workers that failure stands for (the scheduler's allowed-failures + 1)}``; and
    ``{"key": key, "actor": True}`` for an actor whose worker was lost. Other failures
    are the users' errors, which lightwork's tasks return as values: nothing is sent.

    The message goes out once the scheduler has finished the current stimulus (a
    callback on its loop), so a client that wants the key has its ``task-erred``
    message, which fails the future, before this one (both travel on the client's one
    stream). It costs the scheduler one method call per transition; the topic carries
    only lost-worker failures, which are rare. Idempotent: the first driver registers
    it, later ones reuse it; it stays for the scheduler's life.

    When a client disconnects it drops the worker plugins of that client's driver
    sessions (the debugger's and the output forwarding's, named ``lightwork-...@<client
    id>``) and their topics' kept events (``remove_client``; unless the client is back
    within ``CLIENT_GONE_GRACE_S``, as one is after a lost connection): a driver killed
    without its shutdown leaves nothing on the scheduler or the workers.

    It also remembers which actor keys the scheduler forgot (``gone_actors``: killed, or
    their last handle dropped; the newest ``GONE_ACTORS_KEPT``), so that a process that
    meets a handle after that can tell such a key from one whose creation is still on its
    way (``cluster_actor_calls.actor_key_state``). It keeps the keys of the actors the
    scheduler knows meanwhile (``actors``), learnt as each enters the graph.
    """

    name = "lightwork-task-errors"
    idempotent = True
    #: The worker plugins (and event topics) of a driver session start with this and end
    #: with ``@<its client's id>`` (``cluster_debugging.client_suffix``).
    SESSION_PREFIX = "lightwork-"
    GONE_ACTORS_KEPT = 10_000

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.actors: set[Any] = set()
        self.gone_actors: dict[Any, None] = {}  # oldest first

    #: How long a disconnected client has to come back (a client reconnects with its own
    #: id after a lost connection) before its sessions' plugins go.
    CLIENT_GONE_GRACE_S = 5.0

    def remove_client(self, scheduler: Any, client: str) -> None:
        """A client disconnected: unless it is back within ``CLIENT_GONE_GRACE_S``, the
        worker plugins of its driver sessions go (from every worker, and from those that
        join later), with their topics' kept events. A driver that shut down removed
        its own; this is for one that was killed."""
        scheduler.loop.call_later(self.CLIENT_GONE_GRACE_S, self._drop_sessions_of,
                                  scheduler, str(client))

    async def _drop_sessions_of(self, scheduler: Any, client: str) -> None:
        if client in scheduler.clients:  # it reconnected: its sessions live on
            return
        suffix = "@" + client
        for name in list(scheduler.worker_plugins):
            if not (name.startswith(self.SESSION_PREFIX) and name.endswith(suffix)):
                continue
            try:
                await scheduler.unregister_worker_plugin(None, name)
            except ValueError:  # removed meanwhile (its driver's own shutdown)
                pass
            scheduler._broker.truncate(name.rsplit("@", 1)[0])

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        if finish == "forgotten":
            if key in self.actors:
                self.actors.discard(key)
                gone = self.gone_actors
                gone[key] = None
                if len(gone) > self.GONE_ACTORS_KEPT:
                    del gone[next(iter(gone))]
            return
        if start == "released" and finish == "waiting":  # a key entering the graph
            task = self.scheduler.tasks.get(key)
            if task is not None and task.actor:
                self.actors.add(key)
            return
        if finish != "erred":
            return
        task = self.scheduler.tasks.get(key)
        if task is None:
            return
        if task.actor:
            message: dict[str, Any] = {"key": key, "actor": True}
        else:
            blame = task.exception_blame
            exception = getattr(blame, "exception", None)
            # (The scheduler's own KilledWorker is stored pickled, not as a Serialized.)
            if blame is None or type(exception) is not bytes or (
                    b"KilledWorker" not in exception[:100]):
                return
            message = {"key": key, "killed": blame.key,
                       "losses": int(self.scheduler.allowed_failures) + 1}
        self.scheduler.loop.add_callback(self.scheduler.log_event, TASK_ERRORS_TOPIC, message)


class ExportedRefs(WorkerPlugin):
    """A worker plugin: the refs inside a task's result are released with that result.

    ``run_task`` keeps the futures of the refs inside a single result in
    ``exported_by_key`` under the result's key. When this worker lets the key go, and
    the scheduler holds no copy of it anywhere (it was released, not moved), those
    futures are dropped, so the inner objects are freed once no one else holds them.
    Refs inside other stored values (a ``put``, one of several returns, an actor call's
    result) are held as ``cluster_holds`` says.
    """

    name = "lightwork-exported-refs"

    def setup(self, worker: Any) -> None:
        self.worker = worker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        backend = cluster_worker._backend
        if start == "memory" and backend is not None and key in backend.exported_by_key:
            self.worker.loop.add_callback(self._release_if_gone, key)

    async def _release_if_gone(self, key: Any) -> None:
        backend = cluster_worker._backend
        try:
            who_has = await self.worker.scheduler.who_has(keys=[key])
        except Exception:  # noqa: BLE001 - the scheduler is gone: so is the cluster
            return
        if not who_has.get(key) and backend is not None:
            with backend.lock:
                backend.exported_by_key.pop(key, None)
