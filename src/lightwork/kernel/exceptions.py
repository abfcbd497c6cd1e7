"""The public error hierarchy.

Two kinds of failure are never confused:

* the user's code raised: ``TaskError`` (alias ``RayTaskError``), re-raised in the
  caller as an instance of *both* ``TaskError`` and the user's own exception class, so
  ``except ValueError`` keeps working; its message carries the remote traceback;
* the runtime broke: a worker crashed, an object was lost, an actor died — each has its
  own class below, and its message says what happened and what to do next.

Ray's names exist as aliases so ``except ray.exceptions.X`` clauses keep working after
``import lightwork as ray``::

    LightworkError (RayError)
    ├── TaskError (RayTaskError)            user code raised; also the user's class
    ├── UnserializableException             stands in for a user's exception that could
    │                                       not be sent back; type name and message kept
    ├── ActorError (RayActorError)
    │   ├── ActorDiedError
    │   ├── ActorDeadlockError              a get inside an actor that can never return
    │   ├── ActorUnavailableError           Ray's "for now" (defined; never raised here)
    │   └── ActorUnschedulableError         it asks for more than the runtime has
    ├── AsyncioActorExit                    exit_actor() in an async actor (Ray's name)
    ├── WorkerCrashedError                  process died while running a task
    ├── ObjectLostError
    │   ├── OwnerDiedError
    │   ├── ObjectReconstructionFailedError
    │   ├── ReferenceCountingAssertionError
    │   └── SessionEndedError               a ref or actor handle from an ended session
    ├── GetTimeoutError                     also a built-in TimeoutError
    ├── TaskCancelledError
    ├── TaskPlacementGroupRemoved           the task's placement group was removed
    ├── TaskUnschedulableError              it asks for more than the runtime has
    ├── ObjectStoreFullError                no room in memory nor on the spill disk
    ├── OutOfMemoryError                    the memory monitor killed the task's worker
    │   └── ActorOutOfMemoryError           ... or the actor's (also an ActorDiedError)
    ├── PendingCallsLimitExceeded           an actor's max_pending_calls was reached
    ├── ObjectRefStreamEndOfStreamError     a ref past the end of a generator's stream
    ├── UnsupportedOnBackend                also NotImplementedError: not on this engine
    └── SystemError_ (RaySystemError)       the runtime itself failed

Three warnings live here too: ``RuntimeEnvWarning`` (a ``runtime_env`` key lightwork does
not support; see ``kernel/runtime_env.py``), ``IgnoredOptionWarning`` (a Ray option that
has no effect on lightwork's one machine; see ``kernel/calls.py``) and
``UnschedulableRequestWarning`` (a task or actor asks for resources the session can never
offer; see ``kernel/calls.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActorDeadlockError",
    "ActorDiedError",
    "ActorError",
    "ActorOutOfMemoryError",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "AsyncioActorExit",
    "GetTimeoutError",
    "IgnoredOptionWarning",
    "LightworkError",
    "ObjectLostError",
    "ObjectReconstructionFailedError",
    "ObjectRefStreamEndOfStreamError",
    "ObjectStoreFullError",
    "OutOfMemoryError",
    "OwnerDiedError",
    "PendingCallsLimitExceeded",
    "RayActorError",
    "RayError",
    "RaySystemError",
    "RayTaskError",
    "ReferenceCountingAssertionError",
    "RuntimeEnvWarning",
    "RuntimeSystemError",
    "SessionEndedError",
    "TaskCancelledError",
    "TaskPlacementGroupRemoved",
    "TaskError",
    "TaskUnschedulableError",
    "UnschedulableRequestWarning",
    "UnserializableException",
    "UnsupportedOnBackend",
    "WorkerCrashedError",
]


class LightworkError(Exception):
    """Base class of every error the runtime raises."""


class TaskError(LightworkError):
    """A task or actor method raised; ``cause`` is the user's exception.

    ``get`` raises an instance of a class derived from both this class and the user's
    exception class (see :meth:`as_instanceof_cause`), except for exceptions that are not
    ``Exception`` (a ``sys.exit`` in the task): those come back as a plain ``TaskError``.

    How the cause travels from the worker: pickled on its own, inside the error (see
    :func:`_pack_cause`), so a cause that cannot be rebuilt never makes the whole error
    unreadable. The sender checks that the pickle loads again; when it does not (an
    ``__init__`` whose required arguments are not the exception's ``args``, such as
    ``subprocess.CalledProcessError`` or ``MyError(a, b)`` calling ``super().__init__(msg)``),
    the cause is sent as its class, ``args`` and ``__dict__`` and rebuilt without calling
    ``__init__``. When even that fails (an attribute holding a lock, a class the receiver
    cannot import), the cause becomes an :class:`UnserializableException` keeping the
    original type's name and message; the task name and the remote traceback are kept in
    every case.
    """

    def __init__(
        self,
        function_name: str,
        traceback_str: str,
        cause: BaseException | None,
        pid: int | None = None,
    ) -> None:
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        self.pid = pid
        # Not super().__init__: in a class derived from the user's class too, that would
        # be the user's __init__, which may need arguments we do not have.
        Exception.__init__(self, self._message())

    def _message(self) -> str:
        where = f" (pid={self.pid})" if self.pid else ""
        text = f"task {self.function_name}{where} raised:\n{self.traceback_str.rstrip()}"
        cause = self.cause
        if isinstance(cause, UnserializableException):
            text += (
                f"\n(the exception, a {cause.type_name}, {cause.reason}; it is raised here "
                "as lightwork.exceptions.UnserializableException, with its type name in "
                ".type_name and its message in .message)"
            )
        return text

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpack_task_error, (
            self.function_name, self.traceback_str, _pack_cause(self.cause), self.pid, False))

    def make_dual_exception_instance(self) -> TaskError:
        """Ray's name for :meth:`as_instanceof_cause`."""
        return self.as_instanceof_cause()

    def as_instanceof_cause(self) -> TaskError:
        """This error as an instance of a class deriving from the user's class too."""
        cause = self.cause
        while isinstance(cause, TaskError):  # a nested task's error: the user's class
            cause = cause.cause
        cause_cls = type(cause) if cause is not None else None
        if cause_cls is None or not issubclass(cause_cls, Exception):
            # SystemExit, KeyboardInterrupt, GeneratorExit: as their instance, an uncaught
            # task error would end the driver (silently, for sys.exit(0)) instead of
            # reporting the task's failure.
            return self
        if isinstance(self, cause_cls):  # Exception itself: this error is one already (Ray)
            return self
        try:
            derived = _dual_class(cause_cls)
            err = derived.__new__(derived)
        except TypeError:  # a class we cannot subclass (final, odd metaclass, layout)
            _warn_not_dual(cause_cls)
            return self
        err.__dict__.update(getattr(cause, "__dict__", {}))  # e.g. OSError's errno
        TaskError.__init__(err, self.function_name, self.traceback_str, self.cause, self.pid)
        err.args = (self._message(),)
        return err


class UnserializableException(LightworkError):
    """Stands in for a task's exception that could not be sent back or rebuilt.

    It is the ``cause`` of the ``TaskError`` that ``get`` raises (which is an instance of
    both). ``type_name`` is the original exception's qualified class name, ``message``
    its ``str()``, ``reason`` why it could not travel (e.g. an attribute holding a lock).
    ``type_names`` are the ``module.qualname`` of the original class and of each of its
    bases (its MRO), so ``retry_exceptions=[MyError]`` still matches a subclass of
    ``MyError`` that arrived as this (see :func:`class_names`).
    The remote traceback is in the TaskError's message.
    """

    def __init__(self, type_name: str, message: str, reason: str,
                 type_names: tuple[str, ...] = ()) -> None:
        self.type_name = type_name
        self.message = message
        self.reason = reason
        self.type_names = tuple(type_names)
        what = f"{type_name}: {message}" if message else type_name
        super().__init__(f"{what} (the exception isn't serializable: {reason})" if reason
                         else what)

    def __reduce__(self) -> tuple[Any, ...]:
        return (UnserializableException,
                (self.type_name, self.message, self.reason, self.type_names))

    def is_instance_of_any(self, classes: tuple[type, ...]) -> bool:
        """Whether the original exception was an instance of one of ``classes`` (by name)."""
        names = self.type_names
        return any(class_names(cls)[0] in names for cls in classes)


def class_names(cls: type) -> tuple[str, ...]:
    """``module.qualname`` of ``cls`` and of each class in its MRO but ``object``."""
    return tuple(f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__ if c is not object)


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _pack_cause(cause: BaseException | None) -> tuple[Any, ...] | None:
    """The cause as (pickle, type name, message), with a pickle that is known to load."""
    if cause is None:
        return None
    import pickle

    from lightwork.kernel import pickler

    try:
        message = str(cause)
    except Exception as exc:  # noqa: BLE001 - a broken __str__ must not lose the error
        message = f"<str() failed: {type(exc).__name__}>"
    reason = ""
    for attempt in (cause, _CauseByState(cause)):
        try:
            data = pickler.dumps(attempt, protocol=5)
            pickle.loads(data)  # the receiver runs the same code: make sure it loads
            return (data, _type_name(cause), message, "", class_names(type(cause)))
        except Exception as exc:  # noqa: BLE001 - try the next form, then give up
            reason = reason or f"{type(exc).__name__}: {exc}"
    return (None, _type_name(cause), message, f"could not be pickled ({reason})",
            class_names(type(cause)))


def _unpack_cause(packed: tuple[Any, ...] | None) -> BaseException | None:
    if packed is None:
        return None
    import pickle

    data, type_name, message, reason, type_names = packed
    if data is not None:
        try:
            return pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - e.g. a class this process cannot import
            reason = f"could not be rebuilt here ({type(exc).__name__}: {exc})"
    return UnserializableException(type_name, message, reason, type_names)


def _unpack_task_error(
    name: str, tb: str, packed: tuple[Any, ...] | None, pid: int | None, dual: bool
) -> TaskError:
    error = TaskError(name, tb, _unpack_cause(packed), pid)
    return error.as_instanceof_cause() if dual else error


class _CauseByState:
    """Pickles an exception as its class, args and attributes, never calling __init__."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        cause = self.cause
        return (_restore_cause, (type(cause), cause.args, dict(getattr(cause, "__dict__", {}))))


def _restore_cause(cls: type, args: tuple, state: dict[str, Any]) -> BaseException:
    cause = cls.__new__(cls, *args)
    cause.args = args
    cause.__dict__.update(state)
    return cause


_DUAL_CLASSES: dict[type, type[TaskError]] = {}
_WARNED_NOT_DUAL: set[type] = set()


def _warn_not_dual(cause_cls: type) -> None:
    """Say once per class why ``except`` of the user's class does not catch its errors."""
    if cause_cls in _WARNED_NOT_DUAL:
        return
    _WARNED_NOT_DUAL.add(cause_cls)
    import logging

    name = cause_cls.__qualname__
    logging.getLogger("lightwork.exceptions").warning(
        "%s cannot be subclassed, so a task that raises it fails with a TaskError that is "
        "not also a %s. This exception is raised as RayTaskError only. You can use "
        "`ray_task_error.cause` to access the user exception. Catch TaskError (or "
        "RayTaskError) and read the %s from its .cause.",
        name, name, name)


def _dual_class(cause_cls: type) -> type[TaskError]:
    derived = _DUAL_CLASSES.get(cause_cls)
    if derived is None:

        def reduce(self: TaskError) -> tuple[Any, ...]:
            return (_unpack_task_error, (
                self.function_name, self.traceback_str, _pack_cause(self.cause), self.pid, True))

        derived = type(
            f"TaskError({cause_cls.__name__})",
            (TaskError, cause_cls),
            {"__str__": TaskError.__str__, "__reduce__": reduce, "__module__": PUBLIC_MODULE},
        )
        _DUAL_CLASSES[cause_cls] = derived
    return derived


class ActorError(LightworkError):
    """An actor cannot run the call."""


class ActorDiedError(ActorError):
    """The actor's process died or its constructor raised."""


#: Why an actor that called ``exit_actor()`` is dead, with Ray's name for it (its worker
#: exit type), which programs and Ray's tests match.
USER_EXIT = "it called exit_actor() (Ray's worker exit type: INTENDED_USER_EXIT)"


def exit_actor_called(class_name: str, method: str) -> ActorDiedError:
    """The error of the call in which the actor called ``exit_actor()``."""
    return ActorDiedError(f"actor {class_name}: exit_actor() was called in method {method}. "
                          f"The actor is dead because {USER_EXIT}")


class ActorDeadlockError(ActorError):
    """A ``get`` inside an actor waits for a call that can never run (lightwork only).

    The actor's free slots are all taken by callers waiting, directly or through other
    actors, on calls queued behind them: e.g. a method of a ``max_concurrency=1`` actor
    that gets another call on its own handle. Ray hangs there; lightwork raises.
    """


class ActorUnavailableError(ActorError):
    """Ray's error for an actor that cannot take calls *for now* (restarting, or its
    node unreachable) and may again later. lightwork never raises it: on one machine an
    actor restarting queues the calls meanwhile, and one that cannot come back raises
    ``ActorDiedError``. It is here so that ``except`` clauses naming it keep working.
    Takes Ray's arguments, ``(message, actor_id)``."""

    def __init__(self, error_message: str = "", actor_id: Any = None) -> None:
        super().__init__(error_message)
        self.error_message = error_message
        self.actor_id = actor_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.error_message, self.actor_id))


class ActorUnschedulableError(ActorError):
    """The actor asks for resources the runtime can never offer (more CPUs than the
    session has, a GPU on a machine without one, a custom resource nobody declared).

    Ray leaves such an actor pending, and its calls wait forever; lightwork creates the
    handle (with an ``UnschedulableRequestWarning``, so a program that never calls it
    goes on) and fails each of its calls with this error, naming the resource and what
    the session has.
    """


class AsyncioActorExit(LightworkError):
    """Raised by ``exit_actor()`` in an async actor (any of its methods, or a task it
    started on its event loop).

    A ``SystemExit`` there would end only the event loop's thread, so it is an ordinary
    exception, as in Ray. Catching it does not stop the exit: the actor has been told to
    end once its running calls return. Its caller sees ``ActorDiedError``.
    """


class WorkerCrashedError(LightworkError):
    """The worker process running the task died (crash, signal, ``os._exit``)."""


class ObjectLostError(LightworkError):
    """The object's value is no longer stored anywhere."""

    def __init__(self, object_id: str, message: str = "") -> None:
        self.object_id = object_id
        super().__init__(message or f"object {object_id} was lost")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.object_id, str(self)))


class OwnerDiedError(ObjectLostError):
    """The object's value is gone and the process that created it (its owner) is dead.

    On one machine a dead worker's objects are adopted by the driver and stay readable;
    this is raised only when such an object's value then vanished too (its shared-memory
    file was removed) and no task can rebuild it (a ``put``, or an actor's result).
    """


class ObjectReconstructionFailedError(ObjectLostError):
    """A task result was lost and re-running its task failed or was not allowed.

    The message says why: ``max_retries`` used up (or 0), an argument freed or lost for
    good, by-value arguments too large to have been kept, or an actor call's result.
    """


class ReferenceCountingAssertionError(ObjectLostError):
    """The object was already freed because no reference to it remained."""


class SessionEndedError(ObjectLostError):
    """The ref or actor handle was made in a session that ``shutdown()`` ended.

    Ids are never reused within a process, so an old ref cannot name a new object; using
    one (``get``, ``wait``, ``cancel``, a task argument, an old actor handle's methods,
    ``kill``) raises this error, also before any new ``init()`` (no runtime is started
    for it).
    """


class GetTimeoutError(LightworkError, TimeoutError):
    """``get`` did not finish within its ``timeout``."""


class TaskCancelledError(LightworkError):
    """The task was cancelled with ``cancel`` before it finished."""


class TaskPlacementGroupRemoved(LightworkError):
    """The task was to run in a placement group that was removed before it could start."""


class TaskUnschedulableError(LightworkError):
    """The task asks for resources the runtime can never offer.

    ``.remote()`` returns its refs (with an ``UnschedulableRequestWarning``, so a program
    that never reads them goes on, as on Ray); ``get`` raises this at once, naming the
    resource and what the session has, where Ray would wait forever, and ``wait`` counts
    the ref as ready.
    """


class ObjectStoreFullError(LightworkError):
    """An object fits neither in the store's memory budget nor on the spill disk."""


class OutOfMemoryError(LightworkError):
    """The machine ran low on memory and the memory monitor killed the task's worker."""


class ActorOutOfMemoryError(ActorDiedError, OutOfMemoryError):
    """The memory monitor killed the actor's process: both an ``ActorDiedError`` (the
    actor is gone, or restarting) and an ``OutOfMemoryError`` (Ray's name for the
    cause), so ``except`` clauses written for either catch it."""


class PendingCallsLimitExceeded(LightworkError):
    """An actor already has ``max_pending_calls`` calls waiting; this one was refused."""


class ObjectRefStreamEndOfStreamError(LightworkError):
    """A streaming generator has no item at this place: its stream ended before it.

    Ray raises it from ``get`` of a ref that stands for a place past the end of a
    generator's stream (its lower-level calls can hand out such refs ahead of the
    items). lightwork's ``ObjectRefGenerator`` ends its iteration with ``StopIteration``
    (``StopAsyncIteration``) and never hands out a ref past the end, so its own calls do
    not raise this; the class is here so that code written for Ray, which names it in an
    ``except`` clause or raises it from a test double, runs unchanged.
    """


class UnsupportedOnBackend(LightworkError, NotImplementedError):
    """The backend in use (a cluster engine) cannot do what was asked.

    The message names the feature, the backend and what to do instead.
    """


class RuntimeSystemError(LightworkError):
    """The runtime itself failed (a bug or a broken environment)."""


class RuntimeEnvWarning(UserWarning):
    """A ``runtime_env`` key asks for what lightwork does not do (install an environment:
    ``pip``, ``conda``, ``container``, ...); given once per key per process. The task runs
    in the current Python environment."""


class IgnoredOptionWarning(UserWarning):
    """A Ray option (``memory``, ``max_calls``, ``concurrency_groups``, ...) that is accepted,
    so Ray code runs unchanged, but has no effect here; given once per option per process,
    saying what to do instead."""


class UnschedulableRequestWarning(UserWarning):
    """A task or actor asks for resources the session can never offer; given once per
    resource request (shape) per session, at its first ``.remote()``. Its refs raise
    ``TaskUnschedulableError`` (an actor's calls ``ActorUnschedulableError``)."""


# Ray's names, so `except ray.exceptions.X` keeps working.
RayError = LightworkError
RayTaskError = TaskError
RayActorError = ActorError
RaySystemError = RuntimeSystemError

# Tracebacks, reprs and pickles name the public module, where users import these from.
PUBLIC_MODULE = "lightwork.exceptions"
for _name in __all__:
    globals()[_name].__module__ = PUBLIC_MODULE
del _name
