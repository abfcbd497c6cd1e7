"""The caller's side of actors on the distributed backend.

The ``ActorCalls`` part of ``DistributedBackend`` (``cluster.py``); the actor's own side,
on a worker, is ``cluster_actors.py``, whose docstring has the design of a call.

Named actors are published as scheduler datasets (``lightwork-actor/<namespace>/<name>``:
the cluster's directory, found from any client); a detached one stays published after
its driver leaves. ``kill`` cancels the actor's key, which ends it on its worker.
"""

from __future__ import annotations

import threading
from typing import Any

import cloudpickle

from lightwork import exceptions
from lightwork._object_ref import ObjectRef, collecting_refs, ref_counter
from lightwork.backends.cluster_worker import ArgSlot, Failed, key_name, unsupported

_ACTOR_DATASET = "lightwork-actor/"


def _actor_dataset(name: str, namespace: str | None) -> str:
    """The scheduler dataset under which a named actor is published."""
    return f"{_ACTOR_DATASET}{namespace or ''}/{name}"


class ActorCalls:
    """Creating and calling actors (a part of ``DistributedBackend``)."""

    lock: threading.Lock
    futures: dict[int, Any]
    task_ids: dict[int, int]
    namespace: str | None
    recorder: Any
    _proxies: dict[int, Any]
    _killed: dict[int, bool]
    _seqs: dict[int, int]
    _caller: str
    _call_borrows: list[tuple[Any, list[Any]]]
    _named: list[str]

    def create_actor(self, actor: Any, blob: bytes) -> None:
        from lightwork._runtime import serialization
        from lightwork.backends.cluster_actors import ActorHost

        self._check_open()
        namespace = actor.namespace if actor.namespace is not None else self.namespace
        if actor.name is not None and self.driver_request(
                "get_actor", actor.name, namespace) is not None:
            raise ValueError(
                f"an actor named {actor.name!r} already exists in namespace "
                f"{namespace!r}; pick another name, or pass get_if_exists=True")
        if actor.max_restarts:
            raise unsupported("max_restarts", "create the actor again after ActorDiedError")
        args, kwargs = serialization.loads(actor.args)
        if actor.deps:  # top-level refs of the constructor: this backend's own slots
            values = self.get(list(actor.deps), None)
            args = [values[a.index] if type(a) is ArgSlot else a for a in args]
            kwargs = {k: values[v.index] if type(v) is ArgSlot else v
                      for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = cloudpickle.dumps((tuple(args), kwargs))
        shape = dict(actor.hold)
        restrictions = {r: a for r, a in shape.items() if a and not (r == "CPU" and a <= 1)}
        if restrictions:
            problem = self._infeasible(restrictions, refresh=True)
            if problem:
                raise ValueError(f"actor {actor.class_name} can never be placed on this "
                                 f"cluster: {problem}")
        header = (actor.actor_id, actor.class_name, blob, payload,
                  self._keys_of(contained) if contained else None, actor.max_concurrency,
                  bool(actor.async_methods))
        future = self.client.submit(
            ActorHost, header, actor=True, pure=False, resources=restrictions or None,
            key=f"{key_name(actor.class_name)}-{actor.actor_id:x}")
        with self.lock:
            self.futures[actor.actor_id] = future
        if self.recorder is not None:
            self.recorder.actor_created(actor.actor_id, actor.class_name, actor.name, namespace,
                                        actor.detached, actor.max_concurrency)
        if actor.name is not None:
            # The scheduler's datasets are the cluster's directory: whoever knows the name
            # finds the actor, and a published actor outlives this client (detached).
            entry = (actor.actor_id, actor.class_name, dict(actor.methods), future)
            self.client.publish_dataset(entry, name=_actor_dataset(actor.name, namespace))
            if not actor.detached:
                self._named.append(_actor_dataset(actor.name, namespace))

    def _actor(self, actor_id: int) -> Any:
        """The distributed proxy of the actor, once it exists; ActorDiedError if it is gone."""
        proxy = self._proxies.get(actor_id)
        if proxy is None:
            future = self._future_of(actor_id)
            try:
                proxy = future.result()
            except Exception as exc:  # noqa: BLE001 - its worker died, or it was killed
                raise self._actor_died(actor_id, exc) from None
            self._proxies[actor_id] = proxy
        if self._killed.get(actor_id) or proxy._future is not None and (
                proxy._future.status not in ("finished", "pending")):
            raise self._actor_died(actor_id, None)
        return proxy

    def _actor_died(self, actor_id: int, exc: BaseException | None) -> exceptions.ActorDiedError:
        why = "it was killed" if self._killed.get(actor_id) else (
            f"its worker was lost ({type(exc).__name__}: {exc})" if exc else
            "its worker was lost")
        return exceptions.ActorDiedError(
            f"actor {actor_id:020x} is dead: {why}. Create a new actor to go on "
            "(max_restarts is not supported on the distributed backend)")

    def submit_actor_task(self, actor_id: int, method: str, name: str, args: tuple,
                          kwargs: dict, num_returns: int, callsite: Any = None) -> list[ObjectRef]:
        from lightwork.backends.cluster_actors import ActorResult

        self._check_open()
        if ref_counter._released:
            self._drain()
        tops = [a for a in (*args, *kwargs.values()) if type(a) is ObjectRef]
        if tops:  # resolved here, before the call is sent: its order is kept
            values = iter(self.get([ref.id for ref in tops], None))
            args = tuple(next(values) if type(a) is ObjectRef else a for a in args)
            kwargs = {k: next(values) if type(v) is ObjectRef else v for k, v in kwargs.items()}
        with collecting_refs() as contained:
            payload = cloudpickle.dumps((args, kwargs))
        keys = self._keys_of(contained) if contained else None
        with self.lock:
            seq = self._seqs.get(actor_id, 0)
            self._seqs[actor_id] = seq + 1
        task_id = self.next_object_id()
        if self.recorder is not None:
            self.recorder.submitted(task_id, name, callsite, len(payload), actor_id=actor_id)
        try:
            proxy = self._actor(actor_id)
            call = proxy.call(self._caller, seq, method, name, payload, keys, num_returns,
                              task_id)
        except exceptions.ActorDiedError as died:
            from distributed.actor import EagerActorFuture

            call = EagerActorFuture(Failed(died) if num_returns <= 1
                                    else (Failed(died),) * num_returns)
        if keys:  # hold what the call borrows until it ends (no callback on ActorFuture)
            if len(self._call_borrows) > 64:
                self._call_borrows = [(c, h) for c, h in self._call_borrows if not c.done()]
            self._call_borrows.append((call, [self.futures[i] for i in keys]))
        refs = []
        with self.lock:
            indexes = [None] if num_returns == 1 else list(range(num_returns))
            for index in indexes:
                object_id = self.next_object_id()
                self.futures[object_id] = ActorResult(call, index)
                self.task_ids[object_id] = task_id
                refs.append(ObjectRef(object_id))
        return refs

    def driver_request(self, what: str, *args: Any) -> Any:
        if what == "get_actor":
            name, namespace = args[0], args[1] if args[1] is not None else self.namespace
            entry = self.client.get_dataset(_actor_dataset(name, namespace), default=None)
            if entry is None:
                return None
            actor_id, class_name, methods, future = entry
            with self.lock:
                self.futures.setdefault(actor_id, future)
            return actor_id, class_name, methods
        if what == "kill":
            actor_id = args[0]
            future = self._future_of(actor_id)
            self._killed[actor_id] = True
            for name in self._published_names_of(future):
                self.client.unpublish_dataset(name)
            self.client.cancel([future], force=True)
            return None
        raise unsupported(f"{what!r}", "it is not implemented on this backend; run on the "
                          "embedded runtime (init() with no address)")

    def _published_names_of(self, future: Any) -> list[str]:
        return [name for name in self.client.list_datasets()
                if isinstance(name, str) and name.startswith(_ACTOR_DATASET)
                and getattr(self.client.get_dataset(name)[3], "key", None) == future.key]
