"""``@remote`` on a class: ActorClass, ActorHandle, ActorMethod.

``Cls.remote(*args)`` asks the core to start the actor in its own process and returns an
:class:`ActorHandle` at once. The handle holds an ``ObjectRef`` to the actor's handle
object (see ``engines/local/actors.py``), so handles are counted like any other reference:
the actor's process ends when no handle to it remains anywhere, unless it is detached.
Handles pickle, so they can be passed to tasks and other actors and called from there.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from typing import Any


from lightwork.api.definitions import note_definition
from lightwork.api.generator import ObjectRefGenerator
from lightwork.kernel.generators import DYNAMIC_METHOD, STATIC_METHOD
from lightwork.kernel.object_ref import ObjectRef
from lightwork.api.remote_function import callsite
from lightwork.kernel import pickler
from lightwork.kernel.calls import (
    RETRIES_RULE,
    ActorSpec,
    ArgumentCheck,
    check_amount,
    check_count,
    check_options,
)
from lightwork.kernel.runtime_env import cache_key as env_cache_key
from lightwork.kernel.runtime_env import normalize, payload_with_env
from lightwork.kernel.resources import make_shape
from lightwork.kernel.serialization import SerializationError, describe_unpicklable

ACTOR_OPTIONS = {
    "name", "namespace", "lifetime", "get_if_exists", "max_restarts", "max_task_retries",
    "max_concurrency", "num_cpus", "num_gpus", "resources", "memory",
    "scheduling_strategy", "runtime_env", "max_pending_calls", "concurrency_groups",
    "label_selector", "accelerator_type", "placement_group",
    "placement_group_bundle_index", "_metadata",
}
_NUM_RETURNS = "__lightwork_num_returns__"
#: Methods every actor has (``kernel.calls.built_in_method``; the engines end an actor
#: on ``__ray_terminate__``).
_BUILT_IN_METHODS = ("__ray_terminate__", "__ray_ready__", "__ray_call__")


def method(*, num_returns: int | str = 1, concurrency_group: str | None = None) -> Any:
    """Options for one actor method: ``@lightwork.method(num_returns=2)``."""
    _check_method_returns(num_returns)
    if concurrency_group is not None:
        if not isinstance(concurrency_group, str):
            raise TypeError(f"concurrency_group must be a group name (a string), got {concurrency_group!r}")
        from lightwork.kernel.calls import warn_ignored_option

        warn_ignored_option("concurrency_groups", f"method(concurrency_group={concurrency_group!r})")

    def decorate(function: Any) -> Any:
        setattr(function, _NUM_RETURNS, num_returns)
        return function

    return decorate


def _methods_of(cls: type) -> dict[str, int | str]:
    methods: dict[str, int | str] = {}
    for name, member in inspect.getmembers(cls):
        if not callable(member) or (name.startswith("__") and name.endswith("__")):
            continue
        default: Any = 1
        if inspect.isgeneratorfunction(member) or inspect.isasyncgenfunction(member):
            default = "streaming"  # a generator method streams, as in Ray
        methods[name] = getattr(member, _NUM_RETURNS, default)
    methods.update(dict.fromkeys(_BUILT_IN_METHODS, 1))
    return methods


def invocation_decorated(remote: Any, decorator: Any) -> Any:
    """``remote`` (a bound ``.remote``) through Ray's ``__ray_invocation_decorator__``:
    a method (or function) that carries one has its *call* wrapped by it. The decorator
    takes an invocation ``(args, kwargs) -> refs`` and returns one, so it may rewrite the
    arguments before they are sent and what the caller gets back."""

    def invoke(args: Any, kwargs: Any) -> Any:
        return remote(*args, **kwargs)

    wrapped = decorator(invoke)

    def decorated_remote(*args: Any, **kwargs: Any) -> Any:
        return wrapped(args, kwargs)

    return decorated_remote


def _decorators_of(cls: type) -> dict[str, Any]:
    """The methods' ``__ray_invocation_decorator__``s, by method name."""
    found = {}
    for name, member in inspect.getmembers(cls, callable):
        decorator = getattr(member, "__ray_invocation_decorator__", None)
        if decorator is not None and not (name.startswith("__") and name.endswith("__")):
            found[name] = decorator
    return found


class ActorClassInheritanceException(TypeError):
    """A class statement named an actor class (``@remote`` applied) as a base."""


class ActorClass:
    """A class made remote: ``Cls.remote(*args)`` starts an actor and returns its handle."""

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self._cls = cls
        self._options = _check_actor_options(options, cls.__qualname__)
        # Read on first use, not here: unpickling a class that refers to itself (a method
        # that makes another actor of its class) builds this object before the class has
        # its methods.
        self._method_table: dict[str, int | str] | None = None
        self._decorators: dict[str, Any] = {}  # filled with _method_table
        self._checks: dict[str, ArgumentCheck] | None = None  # made at the first .remote()
        self._env_payloads: dict[str, tuple[bytes, bytes]] = {}  # runtime_env -> key, blob
        self._key: bytes | None = None
        self._blob: bytes | None = None
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__doc__ = cls.__doc__
        self.__module__ = cls.__module__

    @property
    def _methods(self) -> dict[str, int | str]:
        if self._method_table is None:
            self._method_table = _methods_of(self._cls)
            self._decorators = _decorators_of(self._cls)
        return self._method_table

    def __getattr__(self, name: str) -> Any:
        """The user's class attributes, classmethods and staticmethods (inherited ones
        too), as on Ray's actor class: ``Cls.LIMIT`` or ``Cls.helper()`` inside a method,
        where ``Cls`` is the decorated name. Dunders are the ActorClass's own."""
        cls = self.__dict__.get("_cls")  # (absent while unpickling builds the object)
        if cls is None or name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(cls, name)
        except AttributeError:
            raise AttributeError(
                f"actor class {cls.__qualname__} has no attribute {name!r}") from None

    def __dir__(self) -> list[str]:
        """Its own names and the actor's methods (autocompletion, as on Ray's)."""
        return sorted(set(super().__dir__()) | set(self._methods))

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        raise ActorClassInheritanceException(
            "Inheriting from actor classes is not currently supported (as in Ray): "
            f"subclass the plain class and decorate the subclass, as in `class "
            f"Sub(Base)` then `lightwork.remote(Sub)`, where Base is "
            f"{self._cls.__qualname__} without @remote")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"actor class {self._cls.__qualname__} cannot be instantiated directly: use "
            f".remote(), as in {self._cls.__name__}.remote(...), to start an actor"
        )

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        return _create(self, args, kwargs, self._options)

    def _remote(self, args: Any = None, kwargs: dict[str, Any] | None = None,
                **options: Any) -> ActorHandle:
        """Ray's older form: ``A._remote(args, kwargs, **options)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def options(self, **options: Any) -> _BoundActorOptions:
        _check_actor_options(options, self._cls.__qualname__)
        return _BoundActorOptions(self, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy creation of this actor: a graph node (``api/dag.py``)."""
        from lightwork.api.dag import bind_actor

        return bind_actor(self, self, {}, args, kwargs)

    def _argument_checks(self) -> dict[str, ArgumentCheck]:
        """Signature checks of the constructor ("__init__") and of each method, by name."""
        if self._checks is None:
            cls = self._cls
            qualname = cls.__qualname__
            checks = {"__init__": ArgumentCheck(cls, qualname)}
            for name in self._methods:
                static = inspect.getattr_static(cls, name, None)
                if static is None:
                    continue
                # A plain function is called bound: its first parameter is the instance.
                checks[name] = ArgumentCheck(
                    getattr(cls, name), f"{qualname}.{name}",
                    skip_first=inspect.isfunction(static))
            self._checks = checks
        return self._checks

    def _payload_for(self, options: dict[str, Any]) -> tuple[bytes, bytes]:
        """(key, blob) of the class, loaded under ``options``' runtime_env if it has one."""
        key, blob = self._payload()
        env = normalize(options.get("runtime_env"), f"actor class {self._cls.__qualname__}")
        if env is None:
            return key, blob
        cache_key = env_cache_key(env)
        found = self._env_payloads.get(cache_key)
        if found is None:
            found = self._env_payloads[cache_key] = payload_with_env(blob, env, actor=True)
        return found

    def _payload(self) -> tuple[bytes, bytes]:
        if self._key is None:
            start = time.monotonic()
            try:
                blob = pickler.dumps(self._cls)
            except Exception as exc:
                raise SerializationError(describe_unpicklable(self._cls, exc)) from exc
            pickler.check_function_size(blob, f"actor {self._cls.__name__}")
            self._blob = blob
            self._key = hashlib.blake2b(blob, digest_size=16).digest()
            note_definition(self._cls, len(blob), start, time.monotonic())
        assert self._blob is not None
        return self._key, self._blob

    def __reduce__(self) -> tuple[Any, ...]:
        return (ActorClass, (self._cls, self._options))

    def __repr__(self) -> str:
        return f"<lightwork actor class {self._cls.__qualname__}>"


class _BoundActorOptions:
    def __init__(self, actor_class: ActorClass, options: dict[str, Any]) -> None:
        self._actor_class = actor_class
        self._options = options

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        return _create(self._actor_class, args, kwargs, self._options)

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy creation with these options: a graph node (``api/dag.py``)."""
        from lightwork.api.dag import bind_actor

        return bind_actor(self._actor_class, self, self._options, args, kwargs)


def _check_actor_options(options: dict[str, Any], what: str) -> dict[str, Any]:
    check_options(options, ACTOR_OPTIONS, f"actor class {what}")  # names, resource amounts
    if options.get("scheduling_strategy") is not None:
        from lightwork.api.scheduling_strategies import check_strategy

        check_strategy(options["scheduling_strategy"], f"actor class {what}")
    lifetime = options.get("lifetime")
    if lifetime not in (None, "detached", "non_detached"):
        raise ValueError(f"lifetime must be None, 'detached' or 'non_detached', got {lifetime!r}")
    if lifetime == "detached" and not options.get("name"):
        raise ValueError("a detached actor needs a name (options(name=..., lifetime='detached'))")
    name = options.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    for key in ("max_restarts", "max_task_retries"):
        check_count(options, key, -1, RETRIES_RULE)
    pending = options.get("max_pending_calls", -1)
    if isinstance(pending, bool) or not isinstance(pending, int) or not (pending == -1 or pending > 0):
        raise ValueError(
            f"max_pending_calls must be a positive int, or -1 for no limit, got {pending!r}")
    concurrency = options.get("max_concurrency")
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ValueError(f"max_concurrency must be an int >= 1, got {concurrency!r}")
    return options


def _async_methods(cls: type) -> frozenset[str]:
    """Names of the coroutine and async generator methods (an actor with any is an
    async actor)."""
    import inspect

    from lightwork.kernel.calls import is_async_method

    return frozenset(name for name, member in inspect.getmembers(cls, callable)
                     if is_async_method(member))


def _create(actor_class: ActorClass, args: tuple, kwargs: dict, options: dict[str, Any]) -> ActorHandle:
    from lightwork.api.core import _core
    from lightwork.kernel.calls import prepare_args

    checks = actor_class._argument_checks()
    checks["__init__"].bind(args, kwargs)
    key, blob = actor_class._payload_for(options)
    extra = {"GPU": float(options["num_gpus"])} if options.get("num_gpus") else {}
    if options.get("memory"):  # bytes, reserved for the actor's life as in Ray
        extra["memory"] = float(int(options["memory"]))
    for resource, amount in (options.get("resources") or {}).items():
        extra[resource] = check_amount(f"resources[{resource!r}]", amount)
    if options.get("num_cpus") is not None:
        place = hold = make_shape({"CPU": float(options["num_cpus"]), **extra})
    else:  # Ray's default: 1 CPU to be placed, none held while it runs
        place, hold = make_shape({"CPU": 1.0, **extra}), make_shape(extra)
    if options.get("scheduling_strategy") is not None or options.get("placement_group") is not None:
        from lightwork.api.scheduling_strategies import shape_for

        what = f"actor {actor_class._cls.__qualname__}"
        place, hold = shape_for(options, place, what), shape_for(options, hold, what)
    # After the shapes: a group from an ended session is refused before a runtime starts.
    core = _core(args, kwargs)
    name = options.get("name")
    namespace = options.get("namespace")
    if name is not None and options.get("get_if_exists"):
        found = core.find_actor(name, namespace)
        if found is not None:
            return ActorHandle(ObjectRef(found.actor_id, _borrowed=True), found.class_name,
                               found.methods, decorators=actor_class._decorators)
    lifetime = options.get("lifetime")
    if lifetime is None and name is not None:  # the JobConfig's default_actor_lifetime
        from lightwork.api.job_config import default_actor_lifetime

        lifetime = default_actor_lifetime()
    actor_id = core.next_object_id()
    stored, deps = prepare_args(args, kwargs, None)
    actor = ActorSpec(
        actor_id, actor_class._cls.__qualname__, key, stored, deps, place, hold, name,
        namespace, lifetime == "detached", options.get("max_restarts", 0),
        options.get("max_task_retries", 0), options.get("max_concurrency") or 0, 0,
        methods=actor_class._methods, async_methods=_async_methods(actor_class._cls),
        max_pending_calls=options.get("max_pending_calls", -1),
    )
    core.create_actor(actor, blob)
    return ActorHandle(ObjectRef(actor_id), actor.class_name, actor_class._methods, checks,
                       actor_class._decorators)


class ActorHandle:
    """A reference to a running actor; call its methods with ``handle.method.remote()``."""

    def __init__(
        self, ref: ObjectRef, class_name: str, methods: dict[str, int | str],
        checks: dict[str, ArgumentCheck] | None = None,
        decorators: dict[str, Any] | None = None,
    ) -> None:
        self._ref = ref
        self._class_name = class_name
        self._methods = methods
        # Signature checks of the methods, where this process has the class (the handle
        # Cls.remote() returned); a handle rebuilt elsewhere leaves the check to the actor.
        self._checks = checks
        # The methods' __ray_invocation_decorator__s (travel with the handle, as in Ray).
        self._decorators = decorators or None

    @property
    def _actor_id(self) -> str:
        return self._ref.hex()

    def __getattr__(self, name: str) -> ActorMethod:
        methods = self.__dict__.get("_methods")
        if methods is None or name.startswith("__") and name not in _BUILT_IN_METHODS:
            raise AttributeError(name)
        if name not in methods:
            raise AttributeError(
                f"actor {self._class_name} has no method {name!r}. A handle exposes only the "
                f"actor's methods, not its attributes: to read {name!r}, add a method such "
                f"as `def get_{name}(self): return self.{name}` and call "
                f"handle.get_{name}.remote()"
            )
        # Kept on the handle: ``handle.method.remote()`` in a loop then finds it as a
        # plain attribute (no __getattr__, no new object: ~0.8 µs of each call's ~18).
        method = self.__dict__[name] = ActorMethod(self, name, methods[name])
        decorators = self._decorators
        if decorators is not None and name in decorators:
            method._decorate(decorators[name])
        return method

    def __reduce__(self) -> tuple[Any, ...]:
        if self._decorators:
            return (ActorHandle, (self._ref, self._class_name, self._methods, None,
                                  self._decorators))
        return (ActorHandle, (self._ref, self._class_name, self._methods))

    def __dir__(self) -> list[str]:
        """What can be called on it, as Ray lists it (autocompletion): the actor's
        methods, ``__init__`` and the built-in ``__ray_*__`` methods."""
        return sorted(set(self._methods) | {"__init__"})

    def __repr__(self) -> str:
        return f"Actor({self._class_name}, {self._ref.hex()})"

    def __hash__(self) -> int:
        return hash(self._ref)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._ref == self._ref


class ActorMethod:
    """``handle.method``: ``.remote(*args)`` queues a call and returns its ObjectRef(s)."""

    def __init__(self, handle: ActorHandle | ActorMethod, name: str, num_returns: int | str,
                 call_name: str | None = None) -> None:
        # What a call needs of the handle (or of another method of it), not the handle
        # itself: the handle keeps its methods (``ActorHandle.__getattr__``), and a method
        # holding the handle would make a cycle that only the cyclic collector frees, so
        # the actor would outlive its last handle until the collector ran.
        self._ref: ObjectRef = handle._ref
        self._class_name: str = handle._class_name
        self._checks: dict[str, ArgumentCheck] | None = handle._checks
        self._name = name
        self._num_returns = num_returns
        self._call_name = call_name or f"{handle._class_name}.{name}"
        # A generator method (it streams by default) called with num_returns=1 returns
        # its first item: the worker must not stream it (kernel/generators.py).
        self._yields: bool = (handle._yields if type(handle) is ActorMethod
                              else num_returns in ("streaming", "dynamic"))
        self._target = STATIC_METHOD + name if self._yields and num_returns == 1 else name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"actor method {self._class_name}.{self._name} cannot be called directly: "
            f"use .remote(), as in handle.{self._name}.remote(...)"
        )

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        _core = _api._core  # (not an import per call: 0.7 µs of each call's ~17)
        checks = self._checks
        if checks is not None:
            check = checks.get(self._name)
            if check is not None and (kwargs or not check.low <= len(args) <= check.high):
                check.bind(args, kwargs)
        name = self._call_name
        num_returns = self._num_returns
        if type(num_returns) is str:  # "streaming" or "dynamic": one ref, the head
            method = DYNAMIC_METHOD + self._name if num_returns == "dynamic" else self._name
            refs = _core((self,)).submit_actor_task(
                self._ref.id, method, name, args, kwargs, 1, callsite(1))
            return ObjectRefGenerator(refs[0]) if num_returns == "streaming" else refs[0]
        refs = _core((self,)).submit_actor_task(
            self._ref.id, self._target, name, args, kwargs, num_returns, callsite(1))
        if num_returns == 1:
            return refs[0]
        return None if num_returns == 0 else refs

    def _remote(self, args: Any = None, kwargs: dict[str, Any] | None = None,
                **options: Any) -> Any:
        """Ray's older form: ``handle.m._remote(args, kwargs, num_returns=...)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def options(self, *, num_returns: int | str | None = None, name: str | None = None,
                **ignored: Any) -> ActorMethod:
        count = self._num_returns if num_returns is None else num_returns
        _check_method_returns(count)
        method = ActorMethod(self, self._name, count, name)
        decorator = self.__dict__.get("_decorator")
        if decorator is not None:
            method._decorate(decorator)
        return method

    def _submit_at(self, args: tuple, kwargs: dict, site: tuple[str, int, str]) -> Any:
        """``.remote(*args, **kwargs)`` recorded as called from ``site`` (``api/dag.py``:
        the user's ``execute()`` line). Kept apart so ``.remote`` stays one frame."""
        if "remote" in self.__dict__:  # an invocation decorator wraps the call: let it
            return self.remote(*args, **kwargs)
        checks = self._checks
        if checks is not None:
            check = checks.get(self._name)
            if check is not None and (kwargs or not check.low <= len(args) <= check.high):
                check.bind(args, kwargs)
        num_returns = self._num_returns
        if type(num_returns) is str:
            method = DYNAMIC_METHOD + self._name if num_returns == "dynamic" else self._name
            refs = _api._core((self,)).submit_actor_task(
                self._ref.id, method, self._call_name, args, kwargs, 1, site)
            return ObjectRefGenerator(refs[0]) if num_returns == "streaming" else refs[0]
        refs = _api._core((self,)).submit_actor_task(
            self._ref.id, self._target, self._call_name, args, kwargs, num_returns, site)
        if num_returns == 1:
            return refs[0]
        return None if num_returns == 0 else refs

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy call of this method on its live actor: a graph node (``api/dag.py``)."""
        from lightwork.api.dag import bind_method

        return bind_method(self, args, kwargs)

    def _decorate(self, decorator: Any) -> None:
        """Route this method's ``.remote`` through its invocation decorator (an instance
        attribute, so undecorated methods' calls pay nothing)."""
        self._decorator = decorator
        self.remote = invocation_decorated(ActorMethod.remote.__get__(self), decorator)  # type: ignore[method-assign]


def _check_method_returns(count: Any) -> None:
    if count in ("streaming", "dynamic"):
        return
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(
            f"num_returns must be a non-negative int, 'streaming' or 'dynamic', got {count!r}")


def make_actor_class(cls: type, options: dict[str, Any]) -> ActorClass:
    return ActorClass(cls, options)


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The handle of the live actor called ``name`` (in ``namespace``)."""
    from lightwork.api.core import _core

    if not isinstance(name, str) or not name:
        raise ValueError(f"get_actor() needs an actor name, got {name!r}")
    found = _core().find_actor(name, namespace)
    if found is None:
        raise ValueError(
            f"no live actor named {name!r} in namespace {namespace!r}; create it with "
            f"Cls.options(name={name!r}).remote(), or check the name and namespace"
        )
    return ActorHandle(ObjectRef(found.actor_id, _borrowed=True), found.class_name,
                       found.methods)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill the actor's process now; pending and later calls raise ActorDiedError."""
    from lightwork.api.core import _core

    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() expects an actor handle, got {type(actor).__name__}: {actor!r:.80}")
    _core((actor,)).kill_actor(actor._ref.id, bool(no_restart))


def exit_actor() -> None:
    """End the current actor from inside it, as Ray's ``exit_actor``.

    Raises (``SystemExit``; ``AsyncioActorExit`` in an async actor) to unwind the call,
    which fails with ``ActorDiedError`` in its caller even if the exception is caught.
    Calls not yet started fail the same way; running calls of a threaded or async actor
    finish first. Then ``__ray_shutdown__()`` and the actor's atexit handlers run, and
    its process ends. Outside an actor: ``TypeError``."""
    from lightwork.api import core as _api

    backend = _api._backend
    if backend is None or backend.in_driver:
        from lightwork.kernel.backend import NOT_IN_AN_ACTOR

        raise TypeError(NOT_IN_AN_ACTOR)
    backend.exit_actor()


from lightwork.api import core as _api  # noqa: E402  (_api imports this module: bind it after)
