"""Read-only views of the driver's runtime state, and the blocking-call hook.

Diagnostics (``lightwork.diagnostics``, ``lightwork.dask``) live above the runtime and
must not reach into the node's tables while they change, so what they need to read is
gathered here, always under ``node.lock`` and as copies (a task's record is the one
live object handed out: the node only fills in its times and state):

* :func:`task_graph_of` — for some object ids, the tasks that make them and, walking
  back through top-level ref arguments, every *unfinished* task they still depend on
  (what a ``get`` is waiting for), as ids and the tasks' records: it runs under the
  runtime's lock for every ``get`` that callbacks observe, so it must be quick.

* :func:`forking_callsite` — in a fork hook, the user's line that forks (the advisor's
  fork-in-task and fork-after-threads findings, in a worker and in the driver).

* :func:`serializing_callsite` — in ``RefCounter.on_out_of_band``, the user's line that
  pickled a ref (or rebuilt one from its id), or None when it is lightwork's own.

Blocking-call observers
-----------------------
``blocking_observers`` is the one hook the public ``get``/``wait`` call into. It is a
plain list so that the API can test it for emptiness with no function call (the hot
path pays one truth test when nothing observes). ``_api`` calls :func:`observe_call`
only when the list is non-empty::

    observer(kind, refs) -> end | None     # before blocking; kind is "get" or "wait"
    end(failed: bool) -> None              # after returning (failed: it raised)

Observers run in the calling thread. An observer that raises is a bug in diagnostics,
never the user's problem, so its error is reported with ``sys.unraisablehook`` and the
call goes on.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any, NamedTuple

BlockingObserver = Callable[[str, list[Any]], "Callable[[bool], None] | None"]

blocking_observers: list[BlockingObserver] = []


def observe_call(kind: str, refs: list[Any], call: Callable[[], Any]) -> Any:
    """Run ``call`` (the core get/wait) between the observers' start and end."""
    ends: list[Callable[[bool], None]] = []
    for observer in list(blocking_observers):
        try:
            end = observer(kind, refs)
        except Exception as exc:  # noqa: BLE001 - a diagnostics bug must not break get
            _report(exc, observer)
            continue
        if end is not None:
            ends.append(end)
    failed = True
    try:
        result = call()
        failed = False
        return result
    finally:
        for end in ends:
            try:
                end(failed)
            except Exception as exc:  # noqa: BLE001
                _report(exc, end)


def report_unraisable(exc: BaseException, message: str, where: Any) -> None:
    """Report a diagnostics bug as Python reports an exception it cannot raise.

    A hook the user or a tool installed (pytest's, say) gets it through
    ``sys.unraisablehook``; the default hook accepts only the interpreter's own
    argument type, which Python code cannot build, so then it is printed the same way.
    """
    hook = sys.unraisablehook
    if hook is not sys.__unraisablehook__:
        hook(SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__,
                             err_msg=f"{message} {where!r}", object=where))
        return
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    print(f"{message} {where!r}:\n{text}", file=sys.stderr, end="")


def _report(exc: BaseException, where: Any) -> None:
    report_unraisable(exc, "Exception ignored in lightwork blocking-call observer", where)


class TaskGraph(NamedTuple):
    """What a ``get`` waits for, from :func:`task_graph_of`."""

    made_by: list[int]  # per object asked for: its task's id, 0 for a put, -1 if freed
    # The unfinished tasks, by id: each one's live TaskRecord (the node fills in its
    # times and state as it runs; its ``dep_tasks`` name the tasks making its ref
    # arguments, those in this dict being the unfinished ones). A record is the one
    # object per task here, and it is out of the cyclic collector: a graph of 20,000
    # tasks adds one dict for the collector to walk, not 20,000 tuples.
    records: dict[int, Any]
    return_ids: dict[int, tuple[int, ...]]  # per task in ``records``, if asked for


def task_graph_of(node: Any, object_ids: Iterable[int], with_return_ids: bool = False
                  ) -> TaskGraph:
    """For the objects asked for: the task that makes each, and the unfinished tasks
    they (transitively) wait on (their results' ids too if ``with_return_ids``)."""
    with node.lock:
        entries = node.objects.entries
        made_by = [entry.task_id if entry is not None else -1
                   for entry in map(entries.get, object_ids)]
        return walk_task_graph(made_by, node.tasks, with_return_ids)


def walk_task_graph(made_by: list[int], live: dict[int, Any], with_return_ids: bool
                    ) -> TaskGraph:
    """The :class:`TaskGraph` of the objects made by ``made_by``'s tasks, from ``live``
    (task id -> its task, which has ``record`` and ``return_ids``: the node's specs, a
    cluster run's tasks), under the lock that guards ``live``."""
    records: dict[int, Any] = {}
    return_ids: dict[int, tuple[int, ...]] = {}
    stack = [task_id for task_id in made_by if task_id in live]
    while stack:
        task_id = stack.pop()
        if task_id in records:
            continue
        task = live[task_id]
        records[task_id] = record = task.record
        if with_return_ids:
            return_ids[task_id] = task.return_ids
        if record.dep_tasks:  # (the tasks making its ref arguments, 0 for a put)
            stack.extend([dep for dep in record.dep_tasks if dep in live])
    return TaskGraph(made_by, records, return_ids)


def unfinished_deps(record: Any, records: dict[int, Any]) -> tuple[int, ...]:
    """The tasks of a graph's ``records`` whose results ``record``'s task takes as
    arguments (each once, in argument order)."""
    if not record.dep_tasks:
        return ()
    return tuple(dict.fromkeys([dep for dep in record.dep_tasks if dep in records]))


def ready_value(node: Any, object_id: int) -> tuple[bool, Any]:
    """``(True, value)`` if the object is alive and ready, else ``(False, None)``."""
    with node.lock:
        entry = node.objects.entries.get(object_id)
        if entry is None or entry.state != 1:
            return False, None
    try:
        return True, node.get([object_id], 0)[0]
    except Exception:  # noqa: BLE001 - freed between the check and the read
        return False, None


_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__))
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: lightwork's own directory, with a trailing separator: a frame whose file starts with
#: it is lightwork's (the one definition every module that leaves such frames out uses).
LIGHTWORK_DIR = _PACKAGE_DIR + os.sep


def forking_callsite() -> tuple[str, int, str] | None:
    """In an ``os.register_at_fork`` hook (called by the hook itself): the user's frame
    that is forking, past the standard library and other libraries (``os``,
    ``multiprocessing``), or None when the fork is lightwork's own."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_PACKAGE_DIR + os.sep):
            return None  # lightwork's own fork
        if not (filename.startswith(_STDLIB_DIR + os.sep) or os.sep + "site-packages" + os.sep
                in filename or os.sep + "dist-packages" + os.sep in filename):
            return (filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back  # the standard library's or another library's: who called it
    return None


# Where a ref's pickling passes through on its way from the user's call: the picklers
# (``lightwork.cloudpickle`` is the user's ``ray.cloudpickle``) and the ref's own code.
_PICKLING_FILES = tuple(
    os.path.join(_PACKAGE_DIR, *parts)
    for parts in (("cloudpickle.py",), ("kernel", "pickler.py"), ("kernel", "object_ref.py")))
_REF_FILE = _PICKLING_FILES[2]
_REF_ENTRIES = frozenset({"__reduce__", "__init__"})  # where ObjectRef calls the hook


def serializing_callsite() -> tuple[str, int, str] | None:
    """In ``RefCounter.on_out_of_band`` (called from the ref's ``__reduce__`` or a
    rebuild): the user's frame that pickles the ref, past the picklers, the standard
    library and other libraries; None when lightwork itself pickles it (a function's
    closure, a message) or no user frame is on the stack (a library's own thread)."""
    frame: Any = sys._getframe(1)
    while frame is not None and not (  # past the hook, up to the ref's own code
            frame.f_code.co_name in _REF_ENTRIES and frame.f_code.co_filename == _REF_FILE):
        frame = frame.f_back
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_PACKAGE_DIR + os.sep):
            if not filename.startswith(_PICKLING_FILES):
                return None  # lightwork's own pickling
        elif not (filename.startswith(_STDLIB_DIR + os.sep) or os.sep + "site-packages" + os.sep
                  in filename or os.sep + "dist-packages" + os.sep in filename):
            return (filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None
