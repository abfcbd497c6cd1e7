"""The program's libraries, imported once in the fork server before it forks workers.

Why: a worker forked from a fork server that lacks the program's libraries imports them
when its first task's function or arguments arrive (unpickling a DataFrame imports
pandas), so every fresh worker pays the program's imports in its first task, and a first
batch looks slower than running serially. Imported in the fork server, they are in every
worker it forks, shared copy-on-write, for the cost of one import.

When (the driver: ``ForkServer.preload_new_modules``, before each spawn): the driver
knows, before a spawn, what the new worker is about to run (the tasks waiting for
workers, the actor being created). A fork server forked from the driver has the
driver's modules of ``init`` already; an exec'd one
(``fork_client.fork_server_start_method``) has none. Either is sent, before the spawn,
the driver's modules (those it does not have) of the packages that the waiting work's
pickles name (:func:`packages_named`: the function's or class's pickle, its arguments,
the values of its ref arguments: what the worker would import to unpickle them), and
of every package named so far once the driver imports more of them. A driver that
imported many libraries but runs tasks that use one does not pay the others' imports
before its first result.

At ``init``, an exec'd fork server whose driver has libraries to preload forks no
worker (``WorkerPool.first_workers_at_init``): the first submission does, once its
pickles are there to read. Meanwhile it imports all the driver's libraries in the
background (``ForkServer.preload_in_background``), so that the driver's own work
between ``init`` and its first batch is time they load for free; that preload gives
way, between two imports, to the driver's next message (the first spawn's own
preload), and is skipped if that message came with it; if it ends before any
submission, the node forks the first workers then (``WorkerPool.background_done``),
as it would have at ``init``. Cutting an import in the
middle would leave a package half made, which a later import of it cannot mend.

What (only modules the fork server can import without changing anything but its own
memory):

* installed libraries only: a module whose file lies in a site-packages directory. The
  program's own modules, its ``__main__``, and anything under a ``runtime_env``
  ``working_dir`` or ``py_modules`` may do anything at import, and are left out;
* never the libraries of ``NEVER``: those that open devices or start threads or servers
  at import (CUDA and other accelerator stacks: a CUDA context does not survive a
  fork), debuggers and profilers, test runners, GUI toolkits, notebook kernels, lightwork
  itself and Ray;
* with the thread-count variables the workers get (``OMP_NUM_THREADS=1``, ... unless the
  user set them), so that numpy's BLAS starts no thread pool in the fork server.

The fork server (``import_modules``) imports them in the driver's import order, with
warnings and Python-level output silenced, skipping any that fails. It stops at the first
module after which the process has a new thread (a library that starts one at import: a
thread that holds a lock when the process forks leaves it locked forever in the child),
unless it is one made to survive a fork (``FORK_AWARE``), and when ``PRELOAD_BUDGET_S``
have passed, interrupting the import then running (one that never ends would keep every
worker from starting). A library the driver imported is unlikely to crash a fresh
process that imports it, but one that did would end the fork server, and the session
with it: ``LIGHTWORK_PRELOAD=0`` is the way out. It answers with what it did (``PRELOADED``), which the
driver keeps in ``ForkServer.preloaded``.

``LIGHTWORK_PRELOAD=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import select
import signal
import site
import sys
import sysconfig
import threading
import time
import types
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

#: How much of each pickle :func:`packages_named` reads, and of how many waiting calls:
#: a module is named near where its object starts, and a call's pickles are ~100 µs
#: to read this far.
PICKLE_HEAD_BYTES = 1 << 16
WAITING_CALLS_READ = 16

PRELOAD = "preload"
PRELOADED = "preloaded"
SWITCH_VARIABLE = "LIGHTWORK_PRELOAD"
#: The fork server stops importing after this much time (the first workers wait for it;
#: under the 10 s the driver waits to hand it its next message, see ForkServer._send).
PRELOAD_BUDGET_S = 5.0

#: Top-level packages never imported in the fork server (see the module docstring).
NEVER = frozenset({
    # accelerators: they open devices, or start driver threads, at import
    "torch", "torchvision", "torchaudio", "tensorflow", "tensorboard", "keras", "jax",
    "jaxlib", "flax", "cupy", "cupyx", "pycuda", "numba", "tensorrt", "mxnet", "paddle",
    "onnxruntime", "triton", "xformers", "pynvml", "nvidia", "GPUtil", "cudf", "cuml",
    "rmm", "dask_cuda", "pyopencl", "pyarrow_cuda",
    # threads, servers, hooks or one-per-process state at import
    "grpc", "debugpy", "pydevd", "_pydevd_bundle", "memray", "line_profiler", "py_spy",
    "sentry_sdk", "wandb", "mlflow", "ddtrace", "opentelemetry", "IPython", "ipykernel",
    "ipywidgets", "jupyter_client", "zmq", "pytest", "_pytest", "pluggy", "coverage",
    "playwright", "distributed", "ray", "lightwork",
    # GUI toolkits
    "tkinter", "PyQt5", "PyQt6", "PySide2", "PySide6", "wx", "gi", "pygame",
})


#: Threads that libraries start at import and that are made to survive a fork (their
#: locks are taken before it and given back after, in both processes): jemalloc's
#: background thread, which pyarrow (so pandas) starts.
FORK_AWARE = frozenset({"jemalloc_bg_thd"})


def enabled() -> bool:
    return os.environ.get(SWITCH_VARIABLE, "1") != "0"


def _site_dirs() -> tuple[str, ...]:
    dirs = set()
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user:
        dirs.add(user)
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    # As given and resolved: a module's file is compared as Python found it (no
    # realpath per module: a few thousand of them would cost tens of ms).
    return tuple({os.path.join(form(d), "") for d in dirs
                  for form in (os.path.abspath, os.path.realpath)})


# A short string in a pickle (SHORT_BINUNICODE): how protocol 4 and 5 name the module
# of a class or function they refer to, before STACK_GLOBAL. Matched in C; each hit's
# length byte is checked against the string that follows it.
_SHORT_STRING = re.compile(rb"\x8c([\x01-\xff])([A-Za-z_][A-Za-z0-9_.]*)")


def packages_named(pickles: Iterable[bytes], modules: Mapping[str, object]) -> set[str]:
    """The top-level packages of the modules in ``modules`` (the driver's) that
    ``pickles`` (the heads of a call's pickles) name: what unpickling them imports."""
    found: set[str] = set()
    for blob in pickles:
        for match in _SHORT_STRING.finditer(blob, 0, PICKLE_HEAD_BYTES):
            length = match.group(1)[0]
            name = match.group(2)[:length]
            if len(name) != length:
                continue
            text = name.decode("ascii")
            if text in modules:
                found.add(text.partition(".")[0])
    return found


def pickle_head(value: Any) -> bytes:
    """The first ``PICKLE_HEAD_BYTES`` of a stored value's pickle (``bytes``, or a
    ``Stored`` inline or in its segment file; b"" where it cannot be read)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[:PICKLE_HEAD_BYTES])
    data = getattr(value, "data", b"")
    if data:
        return bytes(data[:PICKLE_HEAD_BYTES])
    path = getattr(value, "path", None)
    if isinstance(path, str):
        try:  # (the segment's layout header, then the pickle: both small)
            with open(path, "rb") as segment:
                return segment.read(PICKLE_HEAD_BYTES)
        except OSError:  # spilled or freed meanwhile: nothing named
            return b""
    return b""


def waiting_pickles(node: Any) -> list[bytes]:
    """The heads of the pickles of the work waiting for workers on ``node`` (the caller
    holds its lock): the first ``WAITING_CALLS_READ`` ready tasks' functions, arguments
    and ref arguments' values."""
    functions = node.task_table.functions
    entries = node.objects.entries
    heads: list[bytes] = []
    seen: set[bytes] = set()
    calls = 0
    for queue in node.scheduler.ready.values():
        for task in queue:
            if calls >= WAITING_CALLS_READ:
                return heads
            calls += 1
            if task.function_key not in seen:  # (a batch's calls share their function)
                seen.add(task.function_key)
                heads.append(functions.get(task.function_key, b""))
            heads.append(pickle_head(task.args))
            for object_id in task.deps[:4]:
                entry = entries.get(object_id)
                if entry is not None:
                    heads.append(pickle_head(entry.serialized))
    return heads


def actor_pickles(node: Any, actor: Any) -> list[bytes]:
    """The heads of the pickles an actor's new process loads first: its class, its
    constructor's arguments and their ref arguments' values."""
    entries = node.objects.entries
    heads = [node.task_table.functions.get(actor.class_key, b""), pickle_head(actor.args)]
    for object_id in actor.deps[:4]:
        entry = entries.get(object_id)
        if entry is not None:
            heads.append(pickle_head(entry.serialized))
    return heads


def modules_to_preload(modules: Mapping[str, object], known: Iterable[str] = (),
                       excluded_dirs: Iterable[str] = (),
                       packages: Iterable[str] | None = None) -> list[str]:
    """The names in ``modules`` (``sys.modules``, in import order) that the fork server
    may import (see the module docstring), less those in ``known`` (it has them); with
    ``packages``, only the modules of those top-level packages."""
    known = set(known)
    wanted = None if packages is None else set(packages)
    sites = _site_dirs()
    excluded = tuple({os.path.join(form(d), "") for d in excluded_dirs if d
                      for form in (os.path.abspath, os.path.realpath)})
    chosen = []
    for name, module in list(modules.items()):
        top = name.partition(".")[0]
        if name in known or top in NEVER or name == "__main__":
            continue
        if wanted is not None and top not in wanted:
            continue
        if not isinstance(module, types.ModuleType) or getattr(module, "__spec__", None) is None:
            continue
        file = getattr(module, "__file__", None)
        if not isinstance(file, str):
            continue  # built in, or a namespace package (its modules bring it)
        if file.startswith(sites) and not (excluded and file.startswith(excluded)):
            chosen.append(name)
    return chosen


def import_modules(names: list[str], env: Mapping[str, str],
                   budget_s: float = PRELOAD_BUDGET_S,
                   stop_when_readable: int | None = None) -> dict[str, object]:
    """Import ``names`` here, in the fork server (see the module docstring); a report of
    what was done: how many were imported, how long it took, which failed, the module
    after which a thread appeared (if one did), and the first one left out because
    ``stop_when_readable`` (a descriptor: the control socket) had input: the driver
    wants a worker, and a background preload gives way to it between two imports (one
    cut in the middle leaves a package half made, which a later import of it cannot
    mend)."""
    started = time.monotonic()
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    # An import that never ends must not keep every worker from starting: the budget
    # interrupts it (a timer's signal, which Python code sees between bytecodes).
    alarm = _arm_budget(budget_s)
    imported = 0
    failed: list[str] = []
    threaded = interrupted = ""
    threads = _threads()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            for name in names:
                if name in sys.modules:
                    continue
                if time.monotonic() - started > budget_s:
                    break
                if stop_when_readable is not None and _readable(stop_when_readable):
                    interrupted = name
                    break
                try:
                    importlib.import_module(name)
                    imported += 1
                except _OutOfTime:
                    failed.append(name)
                    break
                except BaseException:  # noqa: BLE001 - SystemExit too: a library's own business
                    failed.append(name)
                now = _threads()
                if any(thread not in threads and now[thread] not in FORK_AWARE
                       for thread in now):
                    threaded = name
                    break
                threads = now
    finally:
        _disarm_budget(alarm)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {"imported": imported, "seconds": time.monotonic() - started, "failed": failed,
            "threaded": threaded, "interrupted": interrupted}


class _OutOfTime(BaseException):
    """The preload's budget ran out during an import."""


def _out_of_time(_signum: int, _frame: Any) -> None:
    raise _OutOfTime


def _readable(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # closed: the driver is gone, stop


def _arm_budget(budget_s: float) -> Any:
    """Interrupt the import running when ``budget_s`` have passed; the handler it
    replaced (for ``_disarm_budget``), or None where there is no timer signal."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.signal(signal.SIGALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    return previous


def _disarm_budget(previous: Any) -> None:
    if previous is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _threads() -> dict[str, str]:
    """This process's threads: their name (``comm``) by thread id."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # no /proc: Python's own threads
        return {str(thread.ident): thread.name for thread in threading.enumerate()}
    found = {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                found[task] = comm.read().strip()
        except OSError:  # it ended meanwhile
            continue
    return found
