"""Actor semantics a Ray program relies on, on every backend.

* every method of an async actor runs on the actor's one event loop, sync methods and the
  constructor included: a plain method that sets an ``asyncio.Event`` wakes the coroutine
  awaiting it (the shape of Ray's ``SignalActor``, which hung here before);
* ``exit_actor()``: in an async actor it raises ``AsyncioActorExit``; in every actor the
  call that made it fails with ``ActorDiedError`` even when the exception is caught, and
  later calls fail naming it; outside an actor it is a ``TypeError``;
* the graceful end of an actor (``exit_actor()``, ``__ray_terminate__``, its last handle
  dropped) calls ``__ray_shutdown__()`` and then the atexit handlers it registered;
  ``kill()`` runs neither;
* calls are ordered per caller: a call whose argument is not ready holds back its own
  caller's later calls, never another caller's; a call's ref can leave its caller (in a
  task's arguments or result, inside a ``put``);
* class attributes of an actor class, a method never hidden by an instance attribute of
  its name, ``async def`` remote functions refused, Ray's
  words in death messages;
* the methods every actor has: ``__ray_ready__``, ``__ray_call__`` (a caller's function
  run in the actor), ``__ray_terminate__``, as ``dir()`` lists them.

Every wait is bounded (``get(timeout=...)``, ``wait_until``), so a hang fails fast.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time

import pytest
from tests.helpers import wait_for_file, wait_until
from tests.conformance import test_conformance as _conformance

import lightwork
from lightwork import exceptions
from lightwork.actor import exit_actor

pytestmark = pytest.mark.lightwork_only
# The conformance suite's fixtures (both backends) and gap marker; bound by assignment
# so the fixture names used as parameters do not read as shadowed imports.
backend = _conformance.backend
_apply_gaps = _conformance._apply_gaps
gap = _conformance.gap

LIMIT = 20  # seconds: any get below that does not return in time is a hang

SHARED_PROCESS = ("the cluster's actors live in shared dask worker processes, so an actor's "
                  "end cannot run its process's atexit handlers")
KILL_DROPS_HOST = ("distributed drops a killed actor's host as it drops one with no handle "
                   "left, so __ray_shutdown__ runs on kill there")


def _mark(path: str, text: str = "") -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


# ---- async actors: one loop for every method -------------------------------------------
@lightwork.remote(num_cpus=0)
class Gate:
    """An Event opened by a plain method and awaited by a coroutine."""

    def __init__(self):
        self.opened = asyncio.Event()
        self.threads = {"__init__": threading.get_ident()}
        # The constructor runs on the loop: asyncio tasks may be started here.
        self.started = asyncio.get_running_loop().create_task(asyncio.sleep(0))

    def open(self):
        self.threads["open"] = threading.get_ident()
        self.opened.set()

    async def passed(self):
        await self.opened.wait()
        self.threads["passed"] = threading.get_ident()
        return True

    def block(self, seconds):
        time.sleep(seconds)  # a sync method blocks the loop while it runs, as in Ray
        return time.monotonic()

    async def now(self):
        return time.monotonic()

    def threads_seen(self):
        return self.threads


@lightwork.remote(num_cpus=0)
class Signal:
    """Ray's SignalActor shape: a plain send(), an async wait()."""

    def __init__(self):
        self.event = asyncio.Event()

    def send(self):
        self.event.set()

    async def wait(self):
        await self.event.wait()
        return "woken"


def test_a_sync_method_wakes_a_coroutine_of_the_same_async_actor(backend):
    signal = Signal.remote()
    waiting = signal.wait.remote()
    lightwork.wait([waiting], timeout=0.3)  # let it start awaiting
    lightwork.get(signal.send.remote(), timeout=LIMIT)
    # Before: send() ran on a pool thread and the loop never woke (a hang).
    assert lightwork.get(waiting, timeout=LIMIT) == "woken"


def test_an_async_actor_runs_its_constructor_and_every_method_on_one_thread(backend):
    gate = Gate.remote()
    waiting = gate.passed.remote()
    lightwork.get(gate.open.remote(), timeout=LIMIT)
    lightwork.get(waiting, timeout=LIMIT)
    threads = lightwork.get(gate.threads_seen.remote(), timeout=LIMIT)
    assert set(threads) == {"__init__", "open", "passed"}
    assert len(set(threads.values())) == 1, threads


def test_a_blocking_sync_method_holds_the_loop_of_an_async_actor(backend):
    gate = Gate.remote()
    lightwork.get(gate.now.remote(), timeout=LIMIT)
    blocked_until = gate.block.remote(1.0)
    time.sleep(0.2)  # the sync call is running: a coroutine cannot start before it ends
    ran_at = lightwork.get(gate.now.remote(), timeout=LIMIT)
    assert ran_at >= lightwork.get(blocked_until, timeout=LIMIT)


@lightwork.remote(num_cpus=0, max_concurrency=2)
class TwoAtATime:
    def __init__(self):
        self.running = self.most = 0

    async def hold(self):
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.3)
        self.running -= 1

    def most_at_once(self):
        return self.most


def test_max_concurrency_still_bounds_the_async_calls_in_progress(backend):
    actor = TwoAtATime.remote()
    lightwork.get([actor.hold.remote() for _ in range(6)], timeout=LIMIT)
    assert lightwork.get(actor.most_at_once.remote(), timeout=LIMIT) == 2


@lightwork.remote(num_cpus=0)
class Quitter:
    async def quit_by_system_exit(self):
        raise SystemExit(3)

    async def ping(self):
        return "pong"


def test_system_exit_in_a_coroutine_fails_the_call_and_the_loop_goes_on(backend):
    actor = Quitter.remote()
    with pytest.raises(exceptions.TaskError, match="SystemExit"):
        lightwork.get(actor.quit_by_system_exit.remote(), timeout=LIMIT)
    assert lightwork.get(actor.ping.remote(), timeout=LIMIT) == "pong"


# ---- exit_actor() ------------------------------------------------------------------------
@lightwork.remote(num_cpus=0)
class AsyncLeaver:
    def __init__(self, log=None):
        self.log = log

    async def leave(self, catch=False):
        try:
            exit_actor()
        except exceptions.AsyncioActorExit:
            if not catch:
                raise
        if self.log:
            _mark(self.log, "after")  # reached only when the user caught it
        return "returned"

    async def leave_later(self):
        async def quit_soon():
            await asyncio.sleep(0.2)
            exit_actor()

        self.background = asyncio.get_running_loop().create_task(quit_soon())
        return "started"

    async def nap(self, seconds):
        await asyncio.sleep(seconds)
        return "rested"

    def ping(self):
        return "pong"


@lightwork.remote(num_cpus=0)
class SyncLeaver:
    def leave(self, catch=False):
        try:
            exit_actor()
        except SystemExit:
            if not catch:
                raise
        return "returned"

    def ping(self):
        return "pong"


@pytest.mark.parametrize("cls", [AsyncLeaver, SyncLeaver], ids=["async", "sync"])
def test_exit_actor_fails_its_call_and_every_later_one(backend, cls):
    actor = cls.remote()
    assert lightwork.get(actor.ping.remote(), timeout=LIMIT) == "pong"
    # Both name the cause as Ray does too: its worker exit type, INTENDED_USER_EXIT.
    with pytest.raises(exceptions.ActorDiedError,
                       match=r"exit_actor\(\) was called in method .*INTENDED_USER_EXIT"):
        lightwork.get(actor.leave.remote(), timeout=LIMIT)
    with pytest.raises(exceptions.RayActorError, match=r"exit_actor\(\).*INTENDED_USER_EXIT"):
        lightwork.get(actor.ping.remote(), timeout=LIMIT)


@pytest.mark.parametrize("cls", [AsyncLeaver, SyncLeaver], ids=["async", "sync"])
def test_exit_actor_ends_the_actor_even_when_the_user_catches_it(backend, cls):
    actor = cls.remote()
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.leave.remote(catch=True), timeout=LIMIT)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.ping.remote(), timeout=LIMIT)


def test_exit_actor_raises_asyncio_actor_exit_in_an_async_actor(backend, tmp_path):
    log = str(tmp_path / "log")
    actor = AsyncLeaver.remote(log)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.leave.remote(catch=True), timeout=LIMIT)
    assert _lines(log) == ["after"]  # it was catchable as AsyncioActorExit
    assert issubclass(exceptions.AsyncioActorExit, exceptions.RayError)
    assert not issubclass(exceptions.AsyncioActorExit, exceptions.ActorError)


def test_exit_actor_from_an_asyncio_task_of_the_actor_ends_it(backend):
    actor = AsyncLeaver.remote()
    assert lightwork.get(actor.leave_later.remote(), timeout=LIMIT) == "started"

    def ended():
        try:
            lightwork.get(actor.ping.remote(), timeout=LIMIT)
        except exceptions.ActorDiedError:
            return True
        time.sleep(0.1)
        return False

    wait_until(ended, timeout=LIMIT)


def test_calls_queued_behind_exit_actor_never_run(backend):
    actor = AsyncLeaver.remote()
    napping = actor.nap.remote(0.5)
    leaving = actor.leave.remote()
    queued = [actor.ping.remote() for _ in range(200)]
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(leaving, timeout=LIMIT)
    # The call running when exit_actor() came finishes; those queued never start.
    assert lightwork.get(napping, timeout=LIMIT) == "rested"
    failed = 0
    for ref in queued:
        try:
            lightwork.get(ref, timeout=LIMIT)
        except exceptions.ActorDiedError:
            failed += 1
    assert failed > 0


@lightwork.remote
def exits_in_a_task():
    exit_actor()


def test_exit_actor_outside_an_actor_is_a_type_error(backend):
    with pytest.raises(TypeError, match="exit_actor API is called on a non-actor worker"):
        exit_actor()
    with pytest.raises(TypeError, match="exit_actor API is called on a non-actor worker"):
        lightwork.get(exits_in_a_task.remote(), timeout=LIMIT)


# ---- the graceful end: __ray_shutdown__, then atexit --------------------------------------
@lightwork.remote(num_cpus=0)
class Tidy:
    def __init__(self, log, register_atexit=True):
        self.log = log
        if register_atexit:
            atexit.register(_mark, log, "atexit")

    def __ray_shutdown__(self):
        _mark(self.log, "shutdown")

    def leave(self):
        exit_actor()

    def pid(self):
        return os.getpid()

    def sleep(self, seconds):
        time.sleep(seconds)


@lightwork.remote(num_cpus=0)
class BrokenTidy:
    def __init__(self, log):
        self.log = log

    def __ray_shutdown__(self):
        _mark(self.log, "shutdown")
        raise ValueError("cleanup failed")

    def ping(self):
        return "pong"


def _ends_with(log: str, expected: list[str]) -> None:
    wait_until(lambda: _lines(log), timeout=LIMIT, message="the actor's end to begin")
    # The end has begun: what follows its first line comes within moments (the process
    # is exiting), so a missing line fails in seconds, not at LIMIT.
    deadline = time.monotonic() + 3.0
    while len(_lines(log)) < len(expected) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # nothing more comes
    assert _lines(log) == expected


def test_ray_terminate_calls_ray_shutdown(backend, tmp_path):
    log = str(tmp_path / "log")
    actor = Tidy.remote(log, register_atexit=False)
    lightwork.get(actor.pid.remote(), timeout=LIMIT)
    actor.__ray_terminate__.remote()
    _ends_with(log, ["shutdown"])


def test_dropping_the_last_handle_calls_ray_shutdown(backend, tmp_path):
    log = str(tmp_path / "log")
    actor = Tidy.remote(log, register_atexit=False)
    lightwork.get(actor.pid.remote(), timeout=LIMIT)
    del actor
    _ends_with(log, ["shutdown"])


def test_exit_actor_calls_ray_shutdown(backend, tmp_path):
    log = str(tmp_path / "log")
    actor = Tidy.remote(log, register_atexit=False)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.leave.remote(), timeout=LIMIT)
    _ends_with(log, ["shutdown"])


def test_an_error_in_ray_shutdown_does_not_stop_the_end(backend, tmp_path):
    log = str(tmp_path / "log")
    actor = BrokenTidy.remote(log)
    lightwork.get(actor.ping.remote(), timeout=LIMIT)
    lightwork.get(actor.__ray_terminate__.remote(), timeout=LIMIT)
    _ends_with(log, ["shutdown"])
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.ping.remote(), timeout=LIMIT)


@gap("distributed", SHARED_PROCESS)
@pytest.mark.parametrize("how", ["terminate", "exit_actor", "last handle"])
def test_a_graceful_end_runs_ray_shutdown_then_the_atexit_handlers(backend, tmp_path, how):
    log = str(tmp_path / "log")
    actor = Tidy.remote(log)
    lightwork.get(actor.pid.remote(), timeout=LIMIT)
    if how == "terminate":
        actor.__ray_terminate__.remote()
    elif how == "exit_actor":
        actor.leave.remote()
    else:
        del actor
    _ends_with(log, ["shutdown", "atexit"])


@gap("distributed", KILL_DROPS_HOST)
def test_kill_runs_neither_ray_shutdown_nor_atexit(backend, tmp_path):
    log = str(tmp_path / "log")
    actor = Tidy.remote(log)
    lightwork.get(actor.pid.remote(), timeout=LIMIT)
    lightwork.kill(actor)
    with pytest.raises(exceptions.ActorDiedError):
        lightwork.get(actor.pid.remote(), timeout=LIMIT)
    time.sleep(1.0)
    assert _lines(log) == []


# ---- the order of calls: per caller ----------------------------------------------------
@lightwork.remote
def _released_by(path, fails=False):
    """A value that is ready once ``path`` exists (or an error, if ``fails``): an
    argument that keeps a call waiting."""
    opened = wait_for_file(path, limit=LIMIT)
    if fails:
        raise ValueError("the argument failed")
    return "released" if opened else "gate never opened"


@lightwork.remote(num_cpus=0)
class Log:
    def __init__(self):
        self.seen = []

    def note(self, value):
        self.seen.append(value)
        return value

    def notes(self):
        return self.seen


@lightwork.remote
def _call_from_a_task(log, waiting):
    """A caller of its own: sends ``log`` a call whose argument is not ready yet."""
    log.note.remote(waiting[0])
    return "called"


def test_a_call_waiting_for_its_argument_holds_back_only_its_own_callers_calls(
        backend, tmp_path):
    gate = str(tmp_path / "gate")
    log = Log.remote()
    # A task makes the first call, before the driver makes its own.
    assert lightwork.get(_call_from_a_task.remote(log, [_released_by.remote(gate)]),
                         timeout=LIMIT) == "called"
    assert lightwork.get(log.note.remote("from the driver"), timeout=LIMIT) == \
        "from the driver"
    open(gate, "w").close()
    wait_until(lambda: len(lightwork.get(log.notes.remote(), timeout=LIMIT)) == 2,
               timeout=LIMIT, message="the task's call ran once its argument was ready")
    assert lightwork.get(log.notes.remote(), timeout=LIMIT) == ["from the driver", "released"]


@pytest.mark.parametrize("fails", [False, True], ids=["argument comes", "argument fails"])
def test_one_callers_calls_run_in_the_order_it_made_them_whatever_their_arguments(
        backend, tmp_path, fails):
    gate = str(tmp_path / "gate")
    log = Log.remote()
    first = log.note.remote(_released_by.remote(gate, fails))
    second = log.note.remote("second")
    ready, _ = lightwork.wait([second], timeout=0.5)
    assert ready == []  # held behind the first, whose argument is not ready
    open(gate, "w").close()
    if fails:  # the call fails with its argument's error; the next one runs
        with pytest.raises(ValueError, match="the argument failed"):
            lightwork.get(first, timeout=LIMIT)
    else:
        assert lightwork.get(first, timeout=LIMIT) == "released"
    assert lightwork.get(second, timeout=LIMIT) == "second"
    expected = ["second"] if fails else ["released", "second"]
    assert lightwork.get(log.notes.remote(), timeout=LIMIT) == expected


# ---- an actor call's ref leaves its caller ---------------------------------------------
@lightwork.remote
def _get_first(refs):
    return lightwork.get(refs[0], timeout=LIMIT)


@lightwork.remote
def _calls_and_returns_the_ref(log, value):
    return [log.note.remote(value)]


def test_an_actor_calls_ref_can_be_returned_passed_and_put_inside_values(backend):
    log = Log.remote()
    [from_a_task] = lightwork.get(_calls_and_returns_the_ref.remote(log, "returned"),
                                  timeout=LIMIT)
    assert lightwork.get(from_a_task, timeout=LIMIT) == "returned"
    assert lightwork.get(_get_first.remote([log.note.remote("passed")]),
                         timeout=LIMIT) == "passed"
    inside = lightwork.put([log.note.remote("put")])
    assert lightwork.get(_get_first.remote(lightwork.get(inside, timeout=LIMIT)),
                         timeout=LIMIT) == "put"
    # A call that can only answer after a later call: passing its ref must not wait.
    signal = Signal.remote()
    waiting = _get_first.remote([signal.wait.remote()])
    signal.send.remote()
    assert lightwork.get(waiting, timeout=LIMIT) == "woken"


# ---- the actor class and the messages ----------------------------------------------------
class Base:
    FLOOR = 2

    @staticmethod
    def double(x):
        return 2 * x


@lightwork.remote(num_cpus=0)
class WithAttributes(Base):
    STEP = 3

    @classmethod
    def total(cls):
        return cls.FLOOR + cls.STEP

    def read(self):
        # The decorated name, inside a method, as Ray programs write it.
        return WithAttributes.FLOOR, WithAttributes.STEP, WithAttributes.total(), \
            WithAttributes.double(4)


def test_an_actor_class_forwards_class_attributes_and_methods(backend):
    assert WithAttributes.STEP == 3 and WithAttributes.total() == 5
    actor = WithAttributes.remote()
    assert lightwork.get(actor.read.remote(), timeout=LIMIT) == (2, 3, 5, 8)
    with pytest.raises(AttributeError, match="no attribute 'MISSING'"):
        WithAttributes.MISSING  # noqa: B018


@lightwork.remote
class ShadowedMethods:
    """Instance attributes named like its methods, as Ray programs sometimes write."""

    def __init__(self):
        self.ready = True
        self.count = 7

    def ready(self):  # noqa: F811 - the shadowing is the point
        return ("method", self.ready)

    def count(self):  # noqa: F811
        return self.count + 1

    @staticmethod
    def helper(x):
        return x * 2

    @classmethod
    def kind(cls):
        return cls.__name__


def test_an_instance_attribute_does_not_hide_a_method_of_the_same_name(backend):
    """A call names a method of the class, as in Ray: ``self.ready = True`` in the
    constructor does not turn ``actor.ready.remote()`` into a call of ``True``."""
    actor = ShadowedMethods.remote()
    assert lightwork.get(actor.ready.remote(), timeout=LIMIT) == ("method", True)
    assert lightwork.get(actor.count.remote(), timeout=LIMIT) == 8
    assert lightwork.get(actor.helper.remote(4), timeout=LIMIT) == 8
    assert lightwork.get(actor.kind.remote(), timeout=LIMIT) == "ShadowedMethods"


def test_an_actor_class_cannot_be_subclassed(backend):
    from lightwork.actor import ActorClassInheritanceException

    assert issubclass(ActorClassInheritanceException, TypeError)  # Ray's is one too
    with pytest.raises(ActorClassInheritanceException,
                       match="Inheriting from actor classes is not currently supported"):
        class Sub(WithAttributes):  # noqa: F841
            pass


@lightwork.remote
class Plain:
    def __init__(self):
        self.value = 3


@lightwork.remote
class AsyncPlain:
    async def ping(self):
        return "pong"


async def _later_plus(actor, amount):
    await asyncio.sleep(0.01)
    return amount + 1


def test_ray_call_runs_a_function_of_the_callers_in_the_actor(backend):
    """``__ray_call__``: ``fn(actor, *args, **kwargs)`` runs in the actor, with its state;
    a coroutine function on an async actor is awaited on its loop; a non-callable is a
    TypeError raised in the actor; the handle's attribute cannot be called directly."""
    actor = Plain.remote()
    assert lightwork.get(actor.__ray_call__.remote(lambda self: self.value), timeout=LIMIT) == 3
    assert lightwork.get(actor.__ray_call__.remote(lambda self, x: x * self.value, x=2),
                         timeout=LIMIT) == 6
    assert lightwork.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=LIMIT) \
        != os.getpid()
    with pytest.raises(TypeError, match="cannot be called directly"):
        actor.__ray_call__()
    with pytest.raises(TypeError, match="first argument must be callable, got 5"):
        lightwork.get(actor.__ray_call__.remote(5), timeout=LIMIT)
    assert lightwork.get(actor.__ray_ready__.remote(), timeout=LIMIT) is True
    async_actor = AsyncPlain.remote()
    assert lightwork.get(async_actor.__ray_call__.remote(_later_plus, 4), timeout=LIMIT) == 5


def test_an_async_def_remote_function_is_refused_at_decoration(backend):
    with pytest.raises(ValueError, match="async def"):
        @lightwork.remote
        async def fetch():
            return 1


def test_a_killed_actors_calls_say_it_in_rays_words(backend):
    actor = Gate.remote()
    lightwork.get(actor.now.remote(), timeout=LIMIT)
    lightwork.kill(actor)
    with pytest.raises(exceptions.RayActorError,
                       match="The actor is dead because it was killed by `ray.kill`"):
        lightwork.get(actor.now.remote(), timeout=LIMIT)


def test_dir_lists_an_actors_methods_for_autocompletion(backend):
    public = [name for name in dir(WithAttributes) if not name.startswith("_")]
    # (bind: the lazy-graph call, which Ray 2.60's ActorClass has too)
    assert set(public) == {"double", "read", "total", "options", "remote", "bind"}
    actor = WithAttributes.remote()
    assert [name for name in dir(actor) if not name.startswith("_")] == ["double", "read", "total"]
    assert {name for name in dir(actor) if name.startswith("_")} == {
        "__init__", "__ray_call__", "__ray_ready__", "__ray_terminate__"}
    public = [name for name in dir(actor.read) if not name.startswith("_")]
    assert set(public) == {"bind", "options", "remote"}
