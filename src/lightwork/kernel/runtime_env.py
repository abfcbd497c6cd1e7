"""``runtime_env`` on one machine: what is applied, where, and what is refused.

Supported keys, after :func:`normalize` (which checks them in the caller, at
``.options()``/``@remote``/``init``, and resolves paths against the driver's cwd):

* ``env_vars`` (dict of str to str): set in the process while the task or actor runs;
* ``working_dir`` (a local directory): the task's or actor's current directory, and first
  on ``sys.path``, as in Ray (which uploads it and does both; here it is used in place);
* ``py_modules`` (local package directories, ``.py`` files, or module objects): made
  importable by putting each one's parent directory on ``sys.path``;
* ``excludes`` and ``config`` are accepted and mean nothing here: they tune the upload
  and the installation, and nothing is uploaded or installed.

Every other key (``pip``, ``conda``, ``uv``, ``container``, ``image_uri``, ...) asks for an
environment to be *installed*, which lightwork does not do: the task runs in the
driver's Python environment. That is a warning (``exceptions.RuntimeEnvWarning``, once per key
per process), not an error, on purpose: Ray programs often list packages that are already
installed here, and refusing them would break programs that work; when a package is
missing, the ``ImportError`` that follows comes after a warning saying why. A remote
``working_dir``/``py_modules`` (a URI, a ``.zip`` or ``.whl``) is an error: the task would
silently run in the wrong directory or without its code.

Where it is applied:

* job-wide (``init(runtime_env=...)``): in every worker process at its start (environment,
  cwd, ``sys.path`` in the worker's config), so tasks pay nothing per call;
* per task (``.options(runtime_env=...)`` or ``@remote(runtime_env=...)``): the function is
  pickled inside a :class:`TaskWithEnv`, under a key of its own. The worker applies the
  env around each call and restores what was there before, so nothing leaks into the
  next task on that pooled worker. The function itself is unpickled only once the env is
  applied, so it can import from ``working_dir``/``py_modules``. Modules a task imported
  stay imported in that worker (as in any Python process);
* per actor: the class is pickled inside a loader that applies the env for the whole life
  of the actor's own process when unpickled there, before the class itself is loaded.

A task's or actor's env is applied over the job's (already in place in every worker): its
``env_vars`` are set on top of the job's, and its ``working_dir`` becomes the cwd (the
job's stays on ``sys.path``).

Inheritance, as in Ray: the tasks and actors that a task or actor submits inherit its env.
The env in force in a worker (``inherited``: the running task's, merged over the envs of
the tasks that submitted it, or an actor's own) is kept while it applies; a submission
from there wraps its payload in one more :class:`TaskWithEnv` (``ActorClassWithEnv``)
carrying that env, outside the child's own env if it has one. So a child without an env
runs in its parent's; a child with its own gets its parent's ``env_vars`` with its own set
on top (Ray's merge by key), its own ``working_dir`` if it names one (else the parent's),
and both ``py_modules`` on ``sys.path`` (Ray replaces the parent's; keeping them only adds
paths). Only submissions from a task or actor that has an env pay for it (a cached payload
per function and env).
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, ModuleType
from typing import Any

from lightwork.kernel.exceptions import RuntimeEnvWarning
from lightwork.kernel.introspect import LIGHTWORK_DIR as _LIGHTWORK_DIR

SUPPORTED = ("env_vars", "working_dir", "py_modules")
MEANINGLESS_HERE = ("excludes", "config")
_REMOTE_SUFFIXES = (".zip", ".whl", ".tar.gz", ".tgz")

_warned: set[str] = set()  # keys already warned about (warn_once)


Env = dict[str, Any]  # normalized: "env_vars" (dict), "working_dir" (str|None), "paths" (list)


def normalize(runtime_env: Any, what: str) -> Env | None:
    """Check ``runtime_env`` and return its normalized form, or None when it is empty."""
    if runtime_env is None:
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(
            f"runtime_env for {what} must be a dict such as "
            f"{{'env_vars': {{'NAME': 'value'}}}}, got {type(runtime_env).__name__}")
    for key in runtime_env:
        if not isinstance(key, str):
            raise TypeError(f"runtime_env keys must be strings, got {key!r} for {what}")
        if key not in SUPPORTED and key not in MEANINGLESS_HERE:
            _warn_unsupported(key, what)
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
        raise TypeError(
            f"runtime_env['env_vars'] for {what} must be a dict of str to str (environment "
            f"variables are strings: write {{'N': '4'}}, not {{'N': 4}}), got {env_vars!r}")
    working_dir = runtime_env.get("working_dir")
    paths: list[str] = []
    if working_dir is not None:
        working_dir = _local_path(working_dir, "working_dir", what, directory=True)
        paths.append(working_dir)
    modules = runtime_env.get("py_modules") or []
    if not isinstance(modules, (list, tuple)):
        raise TypeError(
            f"runtime_env['py_modules'] for {what} must be a list of local paths or "
            f"modules, got {type(modules).__name__}")
    for module in modules:
        paths.append(os.path.dirname(_module_path(module, what)))
    if not env_vars and working_dir is None and not paths:
        return None
    return {"env_vars": dict(env_vars), "working_dir": working_dir,
            "paths": list(dict.fromkeys(paths))}


def cache_key(env: Env) -> str:
    return repr(sorted(env.items()))


def _local_path(value: Any, key: str, what: str, directory: bool) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"runtime_env[{key!r}] for {what} must be a path, got {value!r}")
    text = os.fspath(value)
    if "://" in text or text.endswith(_REMOTE_SUFFIXES):
        raise ValueError(
            f"runtime_env[{key!r}]={text!r} for {what}: lightwork runs on this machine and "
            "uses local paths in place; give a local directory (unpack the archive first)")
    path = os.path.abspath(text)
    if directory and not os.path.isdir(path):
        raise ValueError(
            f"runtime_env[{key!r}]={text!r} for {what} is not an existing directory "
            f"(resolved to {path}); create it or fix the path")
    if not directory and not os.path.exists(path):
        raise ValueError(
            f"runtime_env[{key!r}] entry {text!r} for {what} does not exist (resolved to "
            f"{path}); give a package directory or a .py file")
    return path


def _module_path(module: Any, what: str) -> str:
    """The directory or file that makes ``module`` importable under its own name."""
    if isinstance(module, ModuleType):
        file = getattr(module, "__file__", None)
        if file is None:
            raise ValueError(
                f"runtime_env['py_modules'] for {what}: module {module.__name__} has no "
                "file on disk to make importable")
        if os.path.basename(file).startswith("__init__."):
            return os.path.dirname(os.path.abspath(file))  # a package: its directory
        return os.path.abspath(file)
    return _local_path(module, "py_modules", what, directory=False)


def warn_once(key: str, message: str, category: type[Warning]) -> None:
    """Warn ``message`` at the user's line, once per ``key`` per process (``_warned``)."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, category, stacklevel=_user_stacklevel())


def _warn_unsupported(key: str, what: str) -> None:
    warn_once(
        f"runtime_env:{key}",
        f"runtime_env[{key!r}] (given for {what}) is not supported by lightwork and is "
        "ignored: lightwork installs no environments; tasks run in this Python environment. "
        f"Install what {key!r} lists here if the tasks need it. Supported keys: "
        f"{', '.join(SUPPORTED)}.",
        RuntimeEnvWarning,
    )




def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside lightwork, for warnings.warn from here."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIGHTWORK_DIR):
        frame = frame.f_back
        level += 1
    return level


# -- applying, in a worker ------------------------------------------------------------
# The env in force for the task running now in this worker, merged over its parents'
# (innermost last), and an actor's own env for its process's life: what a submission
# from here inherits (see the module docstring).
_in_force: list[Env] = []
_process_env: Env | None = None


def inherited() -> Env | None:
    """The env that tasks and actors submitted from this process now inherit, or None."""
    return _in_force[-1] if _in_force else _process_env


def merged(outer: Env | None, inner: Env) -> Env:
    """``inner`` applied over ``outer``: env_vars merged by key, inner's working_dir first."""
    if outer is None:
        return inner
    return {"env_vars": {**outer["env_vars"], **inner["env_vars"]},
            "working_dir": inner["working_dir"] or outer["working_dir"],
            "paths": list(dict.fromkeys(inner["paths"] + outer["paths"]))}


@contextmanager
def applied(env: Env) -> Iterator[None]:
    """Set ``env`` in this process for the duration of the block, then restore."""
    _in_force.append(merged(inherited(), env))
    environ = os.environ
    saved = {name: environ.get(name) for name in env["env_vars"]}
    environ.update(env["env_vars"])
    old_cwd = None
    if env["working_dir"] is not None:
        old_cwd = os.getcwd()
        os.chdir(env["working_dir"])
    added = [path for path in env["paths"] if path not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        _in_force.pop()
        for path in added:
            try:
                sys.path.remove(path)
            except ValueError:
                pass
        if old_cwd is not None:
            try:
                os.chdir(old_cwd)
            except OSError:
                pass
        for name, value in saved.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value


def apply_for_good(env: Env) -> None:
    """Set ``env`` for the rest of this process's life (an actor's own process)."""
    global _process_env
    _process_env = merged(_process_env, env)
    os.environ.update(env["env_vars"])
    if env["working_dir"] is not None:
        os.chdir(env["working_dir"])
    sys.path[:0] = [path for path in env["paths"] if path not in sys.path]


class TaskWithEnv:
    """A task function that runs under its runtime_env (see the module docstring)."""

    def __init__(self, function_blob: bytes, env: Env) -> None:
        self.function_blob = function_blob
        self.env = env
        self._function: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaskWithEnv, (self.function_blob, self.env))

    def _load(self) -> Any:
        if self._function is None:
            import cloudpickle

            self._function = cloudpickle.loads(self.function_blob)
        return self._function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with applied(self.env):
            result = self._load()(*args, **kwargs)
        if inspect.isgenerator(result):
            return self._steps_in_env(result)
        return result

    def _steps_in_env(self, generator: Any) -> Iterator[Any]:
        """A generator task's body runs at each step: apply the env around every step."""
        while True:
            with applied(self.env):
                try:
                    item = next(generator)
                except StopIteration as stop:
                    return stop.value
            yield item


def load_actor_class(class_blob: bytes, env: Env) -> type:
    """Unpickled in the actor's process: apply its env for good, then load its class."""
    import cloudpickle

    apply_for_good(env)
    return cloudpickle.loads(class_blob)


class ActorClassWithEnv:
    """Pickles as a call of :func:`load_actor_class` (nothing else is ever made of it)."""

    def __init__(self, class_blob: bytes, env: Env) -> None:
        self.class_blob = class_blob
        self.env = env

    def __reduce__(self) -> tuple[Any, ...]:
        return (load_actor_class, (self.class_blob, self.env))


def payload_with_env(blob: bytes, env: Env, actor: bool) -> tuple[bytes, bytes]:
    """(key, blob) of a task function or actor class ``blob`` that runs under ``env``."""
    import hashlib

    from lightwork.kernel import pickler

    wrapper = ActorClassWithEnv(blob, env) if actor else TaskWithEnv(blob, env)
    wrapped = pickler.dumps(wrapper)
    return hashlib.blake2b(wrapped, digest_size=16).digest(), wrapped
