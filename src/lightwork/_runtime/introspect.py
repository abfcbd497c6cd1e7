"""Read-only views of the driver's runtime state, and the blocking-call hook.

Diagnostics (``lightwork.diagnostics``, ``lightwork.dask``) live above the runtime and
must not reach into the node's tables while they change, so what they need to read is
gathered here, always under ``node.lock`` and always as copies:

* :func:`task_graph_of` — for some object ids, the tasks that make them and, walking
  back through top-level ref arguments, every *unfinished* task they still depend on
  (what a ``get`` is waiting for), as plain ids and tuples: it runs under the runtime's
  lock for every ``get`` that callbacks observe, so it must be quick.

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


class TaskView(NamedTuple):
    """One unfinished task, as a ``get`` sees it (a tuple: thousands are made at once)."""

    task_id: int
    name: str
    dep_task_ids: tuple[int, ...]  # creating tasks of its top-level ref arguments
    return_ids: tuple[int, ...]
    record: Any  # the live TaskRecord (mutated by the node; read its times once ended)


def task_graph_of(node: Any, object_ids: Iterable[int]) -> tuple[list[int], dict[int, TaskView]]:
    """For the objects asked for: the id of the task that makes each (0 for a ``put``,
    -1 if already freed), and the unfinished tasks they (transitively) wait on."""
    tasks: dict[int, TaskView] = {}
    no_deps: tuple[int, ...] = ()
    view = tuple.__new__  # TaskView(...) would run namedtuple's Python-level __new__
    with node.lock:
        entries = node.objects.entries
        live = node.tasks
        made_by = [entry.task_id if entry is not None else -1
                   for entry in map(entries.get, object_ids)]
        stack = [task_id for task_id in made_by if task_id in live]
        while stack:
            task_id = stack.pop()
            if task_id in tasks:
                continue
            spec = live[task_id]
            dep_tasks = no_deps
            if spec.deps:
                found = []
                for dep in spec.deps:
                    dep_entry = entries.get(dep)
                    if dep_entry is not None and dep_entry.task_id in live:
                        found.append(dep_entry.task_id)
                        stack.append(dep_entry.task_id)
                dep_tasks = tuple(dict.fromkeys(found))
            tasks[task_id] = view(TaskView, (task_id, spec.name, dep_tasks, spec.return_ids,
                                             spec.record))
    return made_by, tasks


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
