"""``@remote`` on functions: RemoteFunction and ``.options()``.

A RemoteFunction pickles its function once (cloudpickle, by value for ``__main__``) and
names it by the hash of those bytes; a task frame carries only the hash, and each worker
receives the code once. Redefining the function makes a new RemoteFunction with a new
hash, so the newest definition is what runs.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
import time
from typing import Any


from lightwork.api.definitions import note_definition
from lightwork.api.generator import ObjectRefGenerator
from lightwork.kernel import pickler
from lightwork.kernel.calls import (
    TASK_OPTIONS,
    ArgumentCheck,
    CallSpec,
    call_limited,
    check_options,
)
from lightwork.kernel.runtime_env import cache_key as env_cache_key
from lightwork.kernel.runtime_env import normalize, payload_with_env
from lightwork.kernel.serialization import SerializationError, describe_unpicklable


class RemoteFunction:
    """A function that runs as a task: call ``f.remote(*args)`` to get an ObjectRef."""

    def __init__(self, function: Any, options: dict[str, Any]) -> None:
        if inspect.iscoroutinefunction(function):  # Ray refuses it here too
            raise ValueError(
                f"remote function {_name(function)} is an 'async def': a task runs a plain "
                "function. Run the coroutine inside one (def f(): return asyncio.run(g())), "
                "or make it a method of an actor: an async actor runs its coroutines on "
                "its own event loop")
        self._function = function
        self._options = check_options(dict(options), TASK_OPTIONS, f"remote function {_name(function)}")
        _check_strategy(self._options, f"remote function {_name(function)}")
        max_calls = self._options.get("max_calls")
        if max_calls is None and self._options.get("num_gpus"):
            # Ray's default for GPU functions: a fresh process per call, so whatever GPU
            # memory a library kept is given back (max_calls=0 turns it off).
            max_calls = 1
        self._max_calls: int = max_calls or 0
        self._key: bytes | None = None
        self._blob: bytes | None = None
        self._spec: CallSpec | None = None
        self._arguments: ArgumentCheck | None = None
        self._env_payloads: dict[str, tuple[bytes, bytes]] = {}  # payload+env -> key, blob
        self._wrapped: dict[str, tuple[bytes, bytes]] = {}  # see _wrapped_payload
        functools.update_wrapper(self, function, updated=())
        decorator = getattr(function, "__ray_invocation_decorator__", None)
        if decorator is not None:  # (an instance attribute: other functions pay nothing)
            from lightwork.api.actor import invocation_decorated

            self.remote = invocation_decorated(RemoteFunction.remote.__get__(self), decorator)  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"remote function {_name(self._function)} cannot be called directly: use "
            f".remote(), as in {self._function.__name__}.remote(...), to run it as a task "
            "and lightwork.get() the result"
        )

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        spec = self._spec
        if spec is None:
            spec = self._spec = self._call_spec(self._options)
        return _submit(spec, args, kwargs)

    def _call_spec(self, options: dict[str, Any]) -> CallSpec:
        function = self._function
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            # A generator streams unless told otherwise (Ray's default since 2.8). It is
            # retried like any task: a re-run skips the items already streamed (streams.py).
            options = {"num_returns": "streaming", **options}
        num_returns = options.get("num_returns")
        if num_returns == 1 and (inspect.isgeneratorfunction(function)
                                 or inspect.isasyncgenfunction(function)):
            key, blob = self._wrapped_payload("static")  # its first item, not a stream
        elif num_returns == "dynamic":
            key, blob = self._wrapped_payload("dynamic")
        else:
            key, blob = self._payload()
        if self._max_calls:  # @remote's only: .options() refuses it
            key, blob = call_limited(blob, self._max_calls)
        if options.get("runtime_env"):
            key, blob = self._payload_with_env(options["runtime_env"], key, blob)
        if self._arguments is None:
            self._arguments = ArgumentCheck(self._function, _name(self._function))
        spec = CallSpec(key, blob, options.get("name") or _name(self._function), options,
                        self._arguments)
        if options.get("scheduling_strategy") is not None or options.get("placement_group") is not None:
            from lightwork.api.scheduling_strategies import shape_for

            spec.shape = shape_for(options, spec.shape, f"task {spec.name}")
        return spec

    def _remote(self, args: Any = None, kwargs: dict[str, Any] | None = None,
                **options: Any) -> Any:
        """Ray's older call form: ``f._remote(args, kwargs, **options)`` is
        ``f.options(**options).remote(*args, **kwargs)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def options(self, **options: Any) -> _BoundOptions:
        """This function with some options changed for the calls made through the result."""
        _refuse_max_calls(options, _name(self._function))
        check_options(options, TASK_OPTIONS, f"remote function {_name(self._function)}")
        _check_strategy(options, f"remote function {_name(self._function)}")
        return _BoundOptions(self, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy call of this function: a graph node that ``execute()`` runs (``api/dag.py``)."""
        from lightwork.api.dag import bind_function

        return bind_function(self, self, {}, args, kwargs)

    def _wrapped_payload(self, kind: str) -> tuple[bytes, bytes]:
        """The payload of this function run inside DynamicReturns (``"dynamic"``) or
        StaticReturns (``"static"``, a generator called with num_returns=1), made once."""
        found = self._wrapped.get(kind)
        if found is None:
            from lightwork.kernel.generators import DynamicReturns, StaticReturns

            wrapper = DynamicReturns if kind == "dynamic" else StaticReturns
            self._payload()  # (checks that the function pickles, with the clear message)
            blob = pickler.dumps(wrapper(self._function))
            found = self._wrapped[kind] = (hashlib.blake2b(blob, digest_size=16).digest(), blob)
        return found

    def _payload(self) -> tuple[bytes, bytes]:
        if self._key is None:
            start = time.monotonic()
            try:
                blob = pickler.dumps(self._function)
            except Exception as exc:
                raise SerializationError(
                    f"remote function {_name(self._function)} could not be pickled: "
                    + describe_unpicklable(self._function, exc)
                ) from exc
            pickler.check_function_size(blob, f"remote function {_name(self._function)}")
            self._blob = blob
            self._key = hashlib.blake2b(blob, digest_size=16).digest()
            note_definition(self._function, len(blob), start, time.monotonic())
        assert self._blob is not None
        return self._key, self._blob

    def _payload_with_env(
        self, runtime_env: dict[str, Any], key: bytes, blob: bytes
    ) -> tuple[bytes, bytes]:
        """(key, blob) of the payload ``key``/``blob`` run under ``runtime_env``."""
        env = normalize(runtime_env, f"remote function {_name(self._function)}")
        if env is None:
            return key, blob
        cache_key = key.hex() + env_cache_key(env)
        found = self._env_payloads.get(cache_key)
        if found is None:
            found = self._env_payloads[cache_key] = payload_with_env(blob, env, actor=False)
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteFunction, (self._function, self._options))

    def __repr__(self) -> str:
        return f"<lightwork remote function {_name(self._function)}>"


class _BoundOptions:
    """What ``f.options(...)`` returns: ``.remote()`` with those options."""

    def __init__(self, function: RemoteFunction, options: dict[str, Any]) -> None:
        self._remote_function = function
        self._options = options
        self._spec: CallSpec | None = None

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        spec = self._spec
        if spec is None:
            spec = self._spec = self._remote_function._call_spec(self._options)
        return _submit(spec, args, kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy call with these options: a graph node (``api/dag.py``)."""
        from lightwork.api.dag import bind_function

        return bind_function(self._remote_function, self, self._options, args, kwargs)

    def options(self, **options: Any) -> _BoundOptions:
        _refuse_max_calls(options, _name(self._remote_function._function))
        check_options(options, TASK_OPTIONS, "remote function")
        _check_strategy(options, "remote function")
        return _BoundOptions(self._remote_function, {**self._options, **options})


def _refuse_max_calls(options: dict[str, Any], name: str) -> None:
    if "max_calls" in options:  # as in Ray: it belongs to the function's worker processes
        raise ValueError(
            f"max_calls cannot be set in .options() (remote function {name}), as in Ray: "
            f"give it where the function is declared, @remote(max_calls=N)")


def _check_strategy(options: dict[str, Any], what: str) -> None:
    if options.get("scheduling_strategy") is not None:
        from lightwork.api.scheduling_strategies import check_strategy

        check_strategy(options["scheduling_strategy"], what)


def _name(function: Any) -> str:
    return getattr(function, "__qualname__", "") or getattr(function, "__name__", repr(function))


# Call sites seen so far, by the calling instruction (its code and offset), each kept as
# one tuple that every task record from that line shares: a queue of a million tasks from
# one loop then costs one tuple, not a million; and the line number, which Python works
# out from the code's line table on each read (~45 ns), is read once per instruction.
_callsites: dict[tuple[Any, int], tuple[str, int, str]] = {}
_CALLSITES_MAX = 10_000


def callsite(depth: int) -> tuple[str, int, str]:
    """(file, line, function) of the user's frame ``depth`` levels above the caller."""
    frame = sys._getframe(depth + 1)
    instruction = (frame.f_code, frame.f_lasti)
    site = _callsites.get(instruction)
    if site is None:
        code = frame.f_code
        site = (code.co_filename, frame.f_lineno, code.co_name)
        if len(_callsites) < _CALLSITES_MAX:  # generated code: do not grow without bound
            _callsites[instruction] = site
    return site


def submit_at(target: RemoteFunction | _BoundOptions, args: tuple, kwargs: dict,
              site: tuple[str, int, str]) -> Any:
    """``target.remote(*args, **kwargs)``, recorded as called from ``site`` (the lazy
    graphs of ``api/dag.py``: the user's ``execute()`` line, not the graph's own code)."""
    if "remote" in target.__dict__:  # an invocation decorator wraps the call: let it
        return target.remote(*args, **kwargs)
    spec = target._spec
    if spec is None:
        if isinstance(target, RemoteFunction):
            spec = target._spec = target._call_spec(target._options)
        else:
            spec = target._spec = target._remote_function._call_spec(target._options)
    return _submit(spec, args, kwargs, site)


def _submit(spec: CallSpec, args: tuple, kwargs: dict,
            site: tuple[str, int, str] | None = None) -> Any:
    check = spec.arguments
    if kwargs or not check.low <= len(args) <= check.high:
        check.bind(args, kwargs)
    refs = _api._core(args, kwargs).submit_task(spec, args, kwargs, site or callsite(2))
    num_returns = spec.num_returns
    if num_returns == 1:
        return ObjectRefGenerator(refs[0]) if spec.stream else refs[0]
    if num_returns == 0:
        return None
    return refs


__all__ = ["RemoteFunction"]

from lightwork.api import core as _api  # noqa: E402  (_api imports this module: bind it after)
