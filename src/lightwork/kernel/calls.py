"""What a call carries: its arguments, serialized once, and its validated options.

Shared by the driver and by workers (nested calls). Top-level ``ObjectRef`` arguments
become :class:`ArgSlot` placeholders and are listed as dependencies: the task runs only
when they are ready, and the worker receives their values beside the arguments. Refs
nested inside containers stay refs (borrowed by the task).

Arguments made only of plain scalars are pickled with the C pickler; anything else goes
through cloudpickle (functions and classes defined in ``__main__`` must travel by value).

A request the runtime can never meet (more CPUs than the session has, a resource no one
declared) is not refused at ``.remote()``: as on Ray, the program goes on. The engine
warns once per shape at submission (``warn_unschedulable``, at the user's line) and fails
the call's refs at once with ``unschedulable_error``, so a ``get`` names the resource and
the fix where Ray would wait forever, and ``wait`` counts the ref as ready. Invalid input
(a negative or non-numeric amount) stays a ``ValueError`` at ``.remote()``.
"""

from __future__ import annotations

import difflib
import itertools
import numbers
import pickle
import sys
import types
import warnings
import weakref
import zlib
from dataclasses import dataclass, field, fields
from typing import Any, Literal, overload

import cloudpickle

from lightwork.kernel import exceptions
from lightwork.kernel.object_ref import ObjectRef
from lightwork.kernel import serialization
from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR
from lightwork.kernel.resources import Shape
from lightwork.kernel.serialization import Stored

_SCALARS = frozenset((int, float, str, bytes, bool, type(None)))
EMPTY_ARGS = serialization.serialize(((), {}), None)


def is_async_method(member: Any) -> bool:
    """A coroutine or an async generator function: a class with one is an async actor
    (its methods all run on one event loop, concurrently), as in Ray."""
    import inspect

    return inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)


class ArgSlot:
    """Placeholder for a top-level ObjectRef argument, filled with its value on the worker."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArgSlot, (self.index,))


def prepare_args(
    args: tuple[Any, ...], kwargs: dict[str, Any], segment_path: serialization.SegmentTarget
) -> tuple[Stored, tuple[int, ...]]:
    """Serialize a call's arguments; return them and the ids of top-level ref arguments.

    Arguments that are all plain scalars or refs go through the C pickler alone (refs
    become ``ArgSlot``s); the common call, positional scalars only, skips even the copies
    and the ref checks (a quarter less time for one argument). Anything else goes to
    ``serialization.serialize`` (cloudpickle where needed, big values to a segment)."""
    if not kwargs:
        if not args:
            return EMPTY_ARGS, ()
        for arg in args:
            if type(arg) not in _SCALARS:
                break
        else:  # positional scalars only
            return _pickled(list(args), {}), ()
    deps: list[int] = []
    plain = True
    new_args = list(args)
    for index, arg in enumerate(args):
        kind = type(arg)
        if kind is ObjectRef:
            new_args[index] = ArgSlot(len(deps))
            deps.append(arg._id)
        elif kind not in _SCALARS:
            plain = False
    new_kwargs = dict(kwargs)
    for name, arg in kwargs.items():
        kind = type(arg)
        if kind is ObjectRef:
            new_kwargs[name] = ArgSlot(len(deps))
            deps.append(arg._id)
        elif kind not in _SCALARS:
            plain = False
    if plain:
        return _pickled(new_args, new_kwargs), tuple(deps)
    return serialization.serialize((new_args, new_kwargs), segment_path), tuple(deps)


def _pickled(args: list[Any], kwargs: dict[str, Any]) -> Stored:
    """Arguments of plain scalars and ``ArgSlot``s, pickled inline."""
    stored = Stored(pickle.dumps((args, kwargs), protocol=5))
    stored.size = len(stored.data)
    return stored


@dataclass(eq=False)
class ActorSpec:
    """What creating an actor asks of a backend (``Backend.create_actor``): the API
    fills it; an engine may still adjust where it runs (``place``, ``hold``), its class
    key (a runtime_env) and its ``owner`` before it builds its own actor state."""

    actor_id: int
    class_name: str
    class_key: bytes
    args: Stored
    deps: tuple[int, ...]
    place: Shape
    hold: Shape
    name: str | None
    namespace: str | None
    detached: bool
    max_restarts: int
    max_task_retries: int
    max_concurrency: int
    owner: int
    methods: dict[str, int | str] = field(default_factory=dict)  # name -> num_returns
    async_methods: frozenset[str] = frozenset()  # non-empty: an async actor
    max_pending_calls: int = -1  # queued + running calls allowed at once; -1: no limit

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ArgumentCheck:
    """Checks a call's arguments against the callee's signature at ``.remote()``, as Ray does.

    The common call, positional arguments only and as many as the function takes, passes
    on two comparisons (``low <= len(args) <= high``); anything else (keyword arguments,
    a count out of range) is bound with ``inspect.Signature.bind`` once per *shape* (the
    number of positional arguments and the keyword names, which alone decide whether a
    call binds); shapes that bound are remembered, so repeated keyword calls stay cheap.
    A callee without a readable signature (some builtins) is not checked.
    """

    __slots__ = ("fitting_shapes", "high", "low", "signature", "what")

    def __init__(self, callee: Any, what: str, skip_first: bool = False) -> None:
        import inspect

        self.what = what
        self.fitting_shapes: set[tuple[Any, ...]] = set()
        try:
            signature: inspect.Signature | None = inspect.signature(callee)
        except (TypeError, ValueError):
            signature = None
        if signature is not None and skip_first:
            parameters = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=parameters)
        self.signature = signature
        if signature is None:
            self.low, self.high = 0, sys.maxsize
            return
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        low = high = 0
        for parameter in signature.parameters.values():
            if parameter.kind in positional:
                high += 1
                if parameter.default is inspect.Parameter.empty:
                    low += 1
            elif parameter.kind == inspect.Parameter.VAR_POSITIONAL:
                high = sys.maxsize
            elif (parameter.kind == inspect.Parameter.KEYWORD_ONLY
                  and parameter.default is inspect.Parameter.empty):
                low = sys.maxsize  # a required keyword: never the quick path
        self.low, self.high = low, high

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """Raise TypeError naming the callee when ``args``/``kwargs`` do not fit it."""
        if self.signature is None:
            return
        shape = (len(args), *kwargs)
        if shape in self.fitting_shapes:
            return
        try:
            self.signature.bind(*args, **kwargs)
            if len(self.fitting_shapes) < 64:  # bounded: keyword names may be made up per call
                self.fitting_shapes.add(shape)
        except TypeError as exc:
            raise TypeError(
                f"{self.what}.remote() was called with arguments that do not match "
                f"{self.what}{self.signature}: {exc}"
            ) from None


class CallSpec:
    """What every call of one remote function with one set of options shares.

    Computed once per (function, options) and reused by each ``.remote()``.
    """

    __slots__ = ("arguments", "key", "blob", "name", "shape", "cpus", "num_returns",
                 "max_retries", "retry_exceptions", "stream", "runtime_env", "max_calls")

    def __init__(
        self, key: bytes, blob: bytes, name: str, options: dict[str, Any],
        arguments: ArgumentCheck | None = None,
    ) -> None:
        from lightwork.kernel.resources import make_shape

        self.arguments = arguments or ArgumentCheck(None, name)
        self.key = key
        self.blob = blob
        self.name = name
        self.shape = make_shape(resource_demand(options, 1.0))
        self.cpus = dict(self.shape).get("CPU", 0.0)
        num_returns = options.get("num_returns", 1)
        # "streaming": one return ref, the head of the stream the caller reads through an
        # ObjectRefGenerator; "dynamic": one ref to a generator of refs (see api/generator.py).
        self.stream = num_returns == "streaming"
        self.num_returns: int = 1 if isinstance(num_returns, str) else num_returns
        self.max_retries: int = options.get("max_retries", 3)
        self.retry_exceptions: Any = options.get("retry_exceptions", False)
        # The payload already carries it (runtime_env.payload_with_env); kept for backends
        # that cannot honour a per-task environment.
        self.runtime_env: Any = options.get("runtime_env")
        # Likewise (the payload is a CallLimit): the user's own max_calls, not a default.
        self.max_calls: int = options.get("max_calls") or 0


#: Set by an engine's worker process that can end itself after its current call
#: (``max_calls``); None elsewhere, where ``max_calls`` only counts.
retire_worker: Any = None


class CallLimit:
    """A task function whose worker process exits after running it ``max_calls`` times.

    Ray's ``max_calls``: a worker that ran N calls of the function leaves, and a fresh
    process takes its slot, which gives back what the calls leaked (memory, a GPU a
    library keeps). The payload of such a function is this wrapper (its own key), loaded
    once per worker like any function, so it counts that worker's calls. The call that
    reaches the limit marks the worker as retiring (also when it raises); the worker
    sends its result and ``RETIRE``, then exits (``Worker.run``), and the driver gives the
    tasks it had queued there to other workers and starts a replacement (``Node``).
    """

    def __init__(self, function_blob: bytes, max_calls: int) -> None:
        self.function_blob = function_blob
        self.max_calls = max_calls
        self.calls = 0
        self._function: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (CallLimit, (self.function_blob, self.max_calls))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._function is None:
            import cloudpickle

            self._function = cloudpickle.loads(self.function_blob)
        self.calls += 1
        if self.calls >= self.max_calls and retire_worker is not None:
            retire_worker()
        return self._function(*args, **kwargs)


def call_limited(blob: bytes, max_calls: int) -> tuple[bytes, bytes]:
    """(key, blob) of the task function ``blob`` run under :class:`CallLimit`."""
    import hashlib

    from lightwork.kernel import pickler

    wrapped = pickler.dumps(CallLimit(blob, max_calls))
    return hashlib.blake2b(wrapped, digest_size=16).digest(), wrapped


#: What to do about a request the embedded runtime can never meet.
LOCAL_FIX = ("lower its request with .options(), or start lightwork with more resources "
             "(lightwork.init(num_cpus=..., num_gpus=..., resources={...}))")


@overload
def unschedulable_error(what: Literal["task"], name: str, problem: str,
                        fix: str = ...) -> exceptions.TaskUnschedulableError: ...
@overload
def unschedulable_error(what: Literal["actor"], name: str, problem: str,
                        fix: str = ...) -> exceptions.ActorUnschedulableError: ...
def unschedulable_error(what: str, name: str, problem: str,
                        fix: str = LOCAL_FIX) -> exceptions.LightworkError:
    """The error of a task (``what="task"``) or of an actor's calls (``"actor"``) that
    can never be placed: ``problem`` says which resource it needs and what there is."""
    error = (exceptions.TaskUnschedulableError if what == "task"
             else exceptions.ActorUnschedulableError)
    return error(f"{what} {name} can never be scheduled: {problem}. It did not run; to run "
                 f"it, {fix}.")


def warn_unschedulable(what: str, name: str, problem: str, fix: str = LOCAL_FIX) -> None:
    """Tell the user, at the line that submitted it, that ``name`` will never run (the
    engine calls it once per shape and session)."""
    reads = ("a get of its result raises TaskUnschedulableError" if what == "task"
             else "each of its calls raises ActorUnschedulableError when read")
    warnings.warn(
        f"{what} {name} can never be scheduled: {problem}. It will not run ({reads}; a "
        f"program that never reads it goes on). To run it, {fix}.",
        exceptions.UnschedulableRequestWarning, stacklevel=_user_stacklevel())


def warn_actor_unschedulable(warned: set[tuple], actor: ActorSpec, problem: str) -> None:
    """``warn_unschedulable`` for an actor, once per shape in ``warned`` (a session's)."""
    key = ("actor", actor.place, actor.hold)
    if key not in warned:
        warned.add(key)
        warn_unschedulable("actor", actor.class_name, problem)


def _user_stacklevel() -> int:
    """The stacklevel, for a warnings.warn made here, of the first frame outside lightwork."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIGHTWORK_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


LARGE_ARGUMENT_BYTES = 1 << 20


def large_arguments(args: tuple, kwargs: dict) -> tuple[tuple[int, ...], ...]:
    """(identity, size) of the arguments of a megabyte or more passed by value, and
    (identity, size, 1) for those that point into the object store: a value ``get``
    returned, passed back by value where its ref would do.

    Called only for calls whose arguments went to shared memory, so its cost is off the
    common path; the advisor uses it to spot the same big value sent again and again.
    """
    found: list[tuple[int, ...]] = []
    for value in (*args, *kwargs.values()):
        if not _add_large(value, found) and type(value) in _CONTAINERS:
            # One level into a list, tuple or dict ((X, y), {"weights": w}): the same
            # big array passed inside a fresh tuple each call is still copied each call.
            items = value.values() if type(value) is dict else value
            for item in itertools.islice(items, _CONTAINER_ITEMS):
                _add_large(item, found)
    return tuple(found)


_CONTAINERS = (list, tuple, dict)
_CONTAINER_ITEMS = 64  # the items of a container looked at, at most


def _add_large(value: Any, found: list[tuple[int, ...]]) -> bool:
    """Append ``value``'s fingerprint to ``found`` if it is a big buffer."""
    size = getattr(value, "nbytes", None)
    if size is None and isinstance(value, (bytes, bytearray)):
        size = len(value)
    if isinstance(size, int) and size >= LARGE_ARGUMENT_BYTES:
        found.append((_identity(value), size, 1) if _in_store(value) else (_identity(value), size))
        return True
    return False


def _in_store(value: Any) -> bool:
    """Whether ``value`` is a view of a segment this process mapped (from ``get``): its
    ``base`` (numpy) or ``obj`` (memoryview) chain ends at one of ``serialization.MAPS``."""
    import mmap

    base = value
    for _ in range(8):
        inner = getattr(base, "base", None)
        if inner is None:
            inner = getattr(base, "obj", None) if isinstance(base, memoryview) else None
        if inner is None:
            break
        base = inner
    return isinstance(base, mmap.mmap) and serialization.MAPS.holds(base)


# id() alone is not an identity over time: a loop making a new array per call often gets
# the address of the one just freed, and the advisor would call them "the same value".
# A weak reference tells the same object from a new one at a reused address.
_large_seen: dict[int, tuple[Any, int]] = {}  # id() -> (weak ref, identity)
_identities = itertools.count(1)
_SAMPLE = 1 << 12


def _identity(value: Any) -> int:
    key = id(value)
    try:
        ref = weakref.ref(value)
    except TypeError:  # bytes and bytearray take no weak refs: a sample of their content
        view = memoryview(value).cast("B")
        middle = len(view) // 2
        sample = bytes(view[:_SAMPLE]) + bytes(view[middle:middle + _SAMPLE]) + bytes(
            view[-_SAMPLE:])
        return hash((key, zlib.crc32(sample)))
    known = _large_seen.get(key)
    if known is not None and known[0]() is value:
        return known[1]
    if len(_large_seen) >= 1024:  # forget the values that are gone
        for stale in [k for k, (r, _) in _large_seen.items() if r() is None]:
            del _large_seen[stale]
        if len(_large_seen) >= 1024:
            _large_seen.clear()
    identity = next(_identities)
    _large_seen[key] = (ref, identity)
    return identity


# -- options ---------------------------------------------------------------------------
# Ray's task options. Those in IGNORED_OPTIONS are accepted so Ray code runs unchanged, but
# have no effect on one machine: each is validated, and warned about once per process
# (IgnoredOptionWarning) when given a value that would matter in Ray.
TASK_OPTIONS = {
    "num_returns", "num_cpus", "num_gpus", "resources", "max_retries", "retry_exceptions",
    "name", "memory", "scheduling_strategy", "runtime_env", "accelerator_type",
    "max_calls", "placement_group", "placement_group_bundle_index",
    "_metadata", "label_selector",
}


GENERATOR_RETURNS = ("streaming", "dynamic")

# Option -> what to do instead, for the options that are accepted and have no effect.
IGNORED_OPTIONS = {
    "accelerator_type": "this is one machine: calls use its own accelerators (num_gpus)",
    "label_selector": "this is one node: there are no node labels to select",
    "_metadata": "nothing reads Ray's internal call metadata here",
    "concurrency_groups": "all the actor's methods share its max_concurrency (one thread "
                          "pool or event loop); give a method that must not wait its own actor",
}


def warn_ignored_option(option: str, what: str) -> None:
    """Warn, once per option per process, that ``option`` has no effect (IGNORED_OPTIONS)."""
    from lightwork.kernel.runtime_env import warn_once
    from lightwork.kernel.exceptions import IgnoredOptionWarning

    warn_once(
        f"option:{option}",
        f"option {option!r} (given for {what}) has no effect in lightwork and is ignored: "
        f"{IGNORED_OPTIONS[option]}.", IgnoredOptionWarning)


def _check_ignored_options(options: dict[str, Any], what: str) -> None:
    """Validate the options that have no effect here, and warn about those given a value."""
    accelerator = options.get("accelerator_type")
    if accelerator is not None and not isinstance(accelerator, str):
        raise TypeError(f"accelerator_type must be a string such as 'A100', got {accelerator!r}")
    for option in ("label_selector", "_metadata"):
        value = options.get(option)
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"The type of keyword '{option}' must be {(dict, type(None))}, "
                            f"but received type {type(value)}: give a dict, got {value!r:.80}")
    groups = options.get("concurrency_groups")
    if groups is not None and (not isinstance(groups, dict) or not all(
            isinstance(name, str) and isinstance(size, int) and not isinstance(size, bool)
            and size >= 1 for name, size in groups.items())):
        raise TypeError("concurrency_groups must be a dict of group name -> max "
                        f"concurrency (an int >= 1), got {groups!r:.80}")
    for option in IGNORED_OPTIONS:
        if options.get(option):  # None, 0 and {} ask for nothing: Ray's defaults
            warn_ignored_option(option, what)


def did_you_mean(unknown: list[str], allowed: Any) -> str:
    """"did you mean 'num_cpus'? " for each of ``unknown`` close to a name in ``allowed``
    (difflib's closeness; private names are never suggested), or ""."""
    public = sorted(name for name in allowed if not name.startswith("_"))
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), public, n=1, cutoff=0.6)
        if close:
            hints.append(f"did you mean {close[0]!r}"
                         + (f" for {name!r}" if len(unknown) > 1 else "") + "? ")
    return "".join(hints)


def check_options(options: dict[str, Any], allowed: set[str], what: str) -> dict[str, Any]:
    """Validate option names and values; raise a clear error naming the bad one."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for {what}; "
            + did_you_mean(unknown, allowed)
            + f"valid options are: {', '.join(sorted(allowed))}"
        )
    for key in ("num_cpus", "num_gpus", "memory"):
        if key in options and options[key] is not None:
            amount = check_amount(key, options[key])
            if key != "memory":
                _check_precision(key, amount)
    if not options.keys().isdisjoint(IGNORED_OPTIONS):
        _check_ignored_options(options, what)
    check_count(options, "max_calls", 0, "None, 0 or a positive integer (0: no limit)")
    if options.get("runtime_env") is not None:
        from lightwork.kernel.runtime_env import normalize

        normalize(options["runtime_env"], what)  # raises on a bad one, warns on unsupported keys
    resources = options.get("resources")
    if resources is not None:
        if not isinstance(resources, dict):
            raise TypeError(f"resources must be a dict of name -> amount, got {resources!r}")
        for name, amount in resources.items():
            if not isinstance(name, str):
                raise TypeError(f"resource names must be strings, got {name!r}")
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(  # as in Ray
                    f"use num_cpus/num_gpus/memory instead of resources={{{name!r}: ...}}"
                )
            _check_precision(name, check_amount(f"resources[{name!r}]", amount))
    if "num_returns" in options and options["num_returns"] not in GENERATOR_RETURNS:
        check_count(options, "num_returns", 0, NUM_RETURNS_RULE, (int, str, type(None)))
        if isinstance(options["num_returns"], str):
            raise ValueError(f"The keyword 'num_returns' only accepts {NUM_RETURNS_RULE}, "
                             f"got {options['num_returns']!r}")
    check_count(options, "max_retries", -1, RETRIES_RULE)
    retry = options.get("retry_exceptions")
    if retry is not None and not isinstance(retry, bool):
        if not (
            isinstance(retry, (list, tuple))
            and all(isinstance(c, type) and issubclass(c, BaseException) for c in retry)
        ):
            raise TypeError(
                f"retry_exceptions must be True/False or a list of exception classes, got {retry!r}"
            )
    return options


NUM_RETURNS_RULE = 'None, a non-negative integer, or "dynamic" (or "streaming")'
RETRIES_RULE = "None, 0, -1 or a positive integer, where -1 represents infinity."


def check_count(options: dict[str, Any], key: str, lowest: int, rule: str,
                types: tuple[type, ...] = (int, type(None))) -> None:
    """Check option ``key`` of ``options``, a count of ``types`` that is at least
    ``lowest``; the messages are Ray's (``rule`` says what is accepted), as programs and
    Ray's own tests match them."""
    value = options.get(key)
    if value is None:
        options.pop(key, None)  # None is Ray's "the default"
        return
    if isinstance(value, bool) or not isinstance(value, types):
        raise InvalidCountError(f"The type of keyword '{key}' must be {types}, but received type "
                        f"{type(value)}: {key} takes {rule}, got {value!r:.80}")
    if isinstance(value, int) and value < lowest:
        raise ValueError(f"The keyword '{key}' only accepts {rule}, got {value!r}")


class InvalidCountError(TypeError, ValueError):
    """A count option of the wrong type: a TypeError as in Ray, and a ValueError as
    lightwork raised before it matched Ray's message."""


def _check_precision(name: str, amount: float) -> None:
    # As in Ray: fractions of a resource go to 1/10,000 (its fixed-point unit).
    units = amount * 10_000
    if abs(units - round(units)) > 1e-6:
        raise ValueError(f"The precision of the fractional quantity of resource {name} "
                         f"cannot go beyond 0.0001; round {amount} to 4 decimal places")


class InvalidAmountError(TypeError, ValueError):
    """A resource amount that is not a number (both a TypeError and a ValueError)."""


def check_amount(name: str, amount: Any) -> float:
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise InvalidAmountError(f"{name} must be a number, got {amount!r} ({type(amount).__name__})")
    if amount < 0:
        raise ValueError(f"{name} must be >= 0, got {amount}")
    return float(amount)


def resource_demand(options: dict[str, Any], default_cpus: float) -> dict[str, float]:
    num_cpus = options.get("num_cpus")
    demand = {"CPU": float(default_cpus if num_cpus is None else num_cpus)}
    if options.get("num_gpus"):
        demand["GPU"] = float(options["num_gpus"])
    if options.get("memory"):  # bytes, a logical resource as in Ray (scheduler.py)
        demand["memory"] = float(int(options["memory"]))
    for name, amount in (options.get("resources") or {}).items():
        demand[name] = float(amount)
    return demand


def built_in_method(instance: Any, name: str) -> Any:
    """The methods every actor has beside its class's, as in Ray, or None:
    ``__ray_ready__`` (True once the actor is up) and ``__ray_call__``, which runs
    ``fn(actor, *args, **kwargs)`` in the actor for a function the caller sends
    (a coroutine function on an async actor is awaited on its loop, as a method would
    be). ``__ray_terminate__`` is each engine's own: it ends the actor."""
    if name == "__ray_ready__":
        return _actor_ready
    if name == "__ray_call__":
        def generic_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not callable(fn):
                raise TypeError(
                    f"__ray_call__ runs a function in the actor, as fn(actor, *args, "
                    f"**kwargs): its first argument must be callable, got {fn!r}")
            return fn(instance, *args, **kwargs)

        return generic_call
    return None


def _actor_ready() -> bool:
    return True


def actor_method(instance: Any, name: str) -> Any:
    """The callable an actor call named ``name`` runs on ``instance``: its class's member,
    as in Ray, so an instance attribute of the same name (``self.ready = True`` beside a
    method ``ready``) does not hide the method. The common case, a plain method, costs a
    ``getattr`` and a type test."""
    found = getattr(instance, name)
    if type(found) is types.MethodType and found.__self__ is instance:
        return found
    cls = type(instance)
    member = None
    for klass in cls.__mro__:
        if name in klass.__dict__:
            member = klass.__dict__[name]
            break
    if member is None:  # an instance attribute only: what getattr found
        return found
    if isinstance(member, staticmethod):
        return member.__func__
    if hasattr(member, "__get__"):
        return member.__get__(instance, cls)
    return found


# retry_exceptions' classes as messages carry them: pickled once per tuple where they
# are sent, loaded once per pickle where they are read.
_packed_retry: dict[tuple[type, ...], bytes] = {}
_unpacked_retry: dict[bytes, tuple[type, ...]] = {}


def pack_retry_exceptions(retry: Any) -> Any:
    """``retry_exceptions`` as a message between processes carries it: a bool as itself,
    classes as one cloudpickle. A class of the driver's ``__main__`` lives in a task's
    process only as cloudpickle rebuilt it (plain pickle cannot send it on), and a
    cluster's scheduler, which unpickles every graph, may not import the user's modules
    at all."""
    if type(retry) is bool or not retry:
        return retry
    classes = tuple(retry)
    packed = _packed_retry.get(classes)
    if packed is None:
        packed = _packed_retry[classes] = cloudpickle.dumps(classes)
    return packed


def retry_classes(retry: Any) -> tuple[type, ...]:
    """The classes of a ``retry_exceptions`` list, or of its pack."""
    if type(retry) is not bytes:
        return tuple(retry)
    classes = _unpacked_retry.get(retry)
    if classes is None:
        classes = _unpacked_retry[retry] = cloudpickle.loads(retry)
    return classes
