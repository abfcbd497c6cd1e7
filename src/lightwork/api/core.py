"""The public API: init/shutdown/get/put/wait/cancel and friends, with argument checks.

Every call validates its arguments here and says what was wrong and what to do, then
hands the work to the process's *backend* (``lightwork.engines``): the embedded runtime
(the driver's :class:`Node`, or, inside one of its workers, the :class:`Worker`), or a Dask
distributed cluster. ``_core()`` returns it; the first call that needs a runtime starts
the default one (embedded, or the cluster named by ``LIGHTWORK_ADDRESS``), as Ray does.
Importing lightwork starts nothing.

``_backend`` is the one owner of "what runs this process's calls"; the API talks to it
through the :class:`~lightwork.kernel.backend.Backend` interface alone, and opens it
through :func:`lightwork.engines.open_backend`. Diagnostics reach the run's record
through :func:`run_record` (a ``kernel.run.RunRecord``). Code below the API reaches the
backend through :mod:`lightwork.kernel.backend`, which this module connects when it
loads.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from lightwork.api.generator import ObjectRefGenerator
from lightwork.kernel import backend as _kernel_backend
from lightwork.kernel.object_ref import ObjectRef
from lightwork.kernel.run import RunRecord
from lightwork.api.remote_function import RemoteFunction, callsite
from lightwork.kernel.introspect import blocking_observers as _observers
from lightwork.kernel.introspect import observe_call as _observe_call

_backend: Any = None  # the Backend running this process's calls (see lightwork.engines)
_dashboard: Any = None  # the dashboard child of init(dashboard=True), if any
_init_lock = threading.RLock()

# Ray's init arguments that have no meaning for the embedded runtime. Asking for what
# they turn on gets a one-line note; they never raise.
RAY_ONLY_INIT_ARGS = {
    "include_dashboard", "dashboard_host", "dashboard_port",
    "logging_format", "logging_config", "configure_logging", "local_mode",
    "_temp_dir", "_system_config", "storage",
    "_node_ip_address", "_redis_password", "_plasma_directory", "_metrics_export_port",
    "_enable_object_reconstruction", "_tracing_startup_hook", "labels",
    "enable_resource_isolation", "system_reserved_cpu", "system_reserved_memory",
    "_cgroup_path", "_node_name", "_skip_env_hook",
}


class RuntimeContext:
    """What ``get_runtime_context()`` returns: ids and resources of the caller."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self._facts = facts

    def get_job_id(self) -> str:
        return f"{self._facts['job_id']:08x}"

    def get_task_id(self) -> str | None:
        task_id = self._facts["task_id"]
        return None if task_id is None else f"{task_id:020x}"

    def get_worker_id(self) -> str:
        return f"{self._facts['worker_id']:08x}"

    def get_node_id(self) -> str:
        return str(self._facts["node_id"])

    def get_actor_id(self) -> str | None:
        return self._facts.get("actor_id")

    def get_assigned_resources(self) -> dict[str, float]:
        return dict(self._facts["resources"])

    def is_canceled(self) -> bool:
        """Whether ``cancel()`` was called on the running task or actor call.

        A sync or threaded actor's method is not interrupted by ``cancel()`` (as in Ray):
        it can check this now and then and stop early. Raises RuntimeError in the driver
        and in an async actor, where a cancel raises ``asyncio.CancelledError`` instead."""
        backend = _backend
        if backend is None or backend.in_driver:
            if self._facts.get("task_id") is None:
                raise RuntimeError(
                    "is_canceled() works only inside a task or an actor's method: the "
                    "driver is never cancelled")
        return _core().is_canceled()

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        return {"GPU": [str(i) for i in self._facts["gpu_ids"]]}

    @property
    def namespace(self) -> str | None:
        return self._facts.get("namespace")

    job_id = property(get_job_id)
    task_id = property(get_task_id)
    worker_id = property(get_worker_id)
    node_id = property(get_node_id)

    def __repr__(self) -> str:
        return f"RuntimeContext({self._facts})"


class InitContext(dict):
    """What ``init`` returns (Ray returns a context with address information)."""

    def __enter__(self) -> InitContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        shutdown()


def init(
    address: str | None = None,
    *,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: dict[str, float] | None = None,
    object_store_memory: int | None = None,
    ignore_reinit_error: bool = False,
    namespace: str | None = None,
    event_budget: int | None = None,
    advisor: bool = True,
    runtime_env: dict[str, Any] | None = None,
    dashboard: bool = False,
    post_mortem: bool | None = None,
    debugger: str = "pdb",
    _memory_usage_threshold: float | None = None,
    _memory_monitor_refresh_ms: float | None = None,
    **ray_kwargs: Any,
) -> InitContext:
    """Start the embedded runtime in this process, or connect to a cluster.

    ``address`` picks the backend (``lightwork.engines``): None (or the
    ``LIGHTWORK_ADDRESS`` environment variable) for the embedded runtime;
    ``"tcp://host:port"``, a scheduler file or a ``distributed.Client`` for a Dask
    cluster; ``"local-cluster"`` to start a Dask cluster of ``num_cpus`` worker processes
    on this machine. ``num_cpus`` defaults to the machine's CPU count. Ray's dashboard and logging
    arguments are accepted; those with no meaning here are noted and ignored.
    ``advisor=False`` turns off the advisor's warnings (``lightwork.advise()`` still works).
    ``event_budget`` bounds the event log (task records kept); ``0`` turns it off, and with
    it the timeline, the profilers and the advisor (only for measuring what it costs).
    ``runtime_env`` is the job-wide default of every task and actor: ``env_vars``,
    ``working_dir`` and ``py_modules`` (local paths) are applied in every worker; other
    keys are warned about once (see ``kernel/runtime_env.py``).
    ``dashboard=True`` (or Ray's ``include_dashboard=True``) starts the live dashboard in a
    process of its own and prints its URL (``lightwork.dashboard``).
    ``job_config`` (a :class:`lightwork.job_config.JobConfig`) gives the job's runtime_env,
    namespace, code_search_path and default actor lifetime, where ``init``'s own
    arguments do not (see ``api/job_config.py`` for what each field does here).
    ``post_mortem=True`` (or ``LIGHTWORK_POST_MORTEM=1``) pauses a task or actor method
    that raises in the debugger, in the frame that raised, before its error is sent;
    ``debugger`` is what ``breakpoint()`` in a task starts: ``"pdb"`` (attach with
    ``lightwork debug``) or ``"debugpy"`` (an editor attaches; the ``debug`` extra). See
    the debugging guide.
    ``_memory_usage_threshold`` (default 0.95) and ``_memory_monitor_refresh_ms`` (250; 0
    turns it off) set the memory monitor (``lightwork.engines.local.memory_monitor``).
    """
    global _backend
    from lightwork.engines import open_backend, parse_address
    from lightwork.kernel.calls import check_amount, did_you_mean

    if _backend is not None and not _backend.in_driver:
        raise RuntimeError("lightwork.init() cannot be called inside a task or actor")
    backend_name, target = parse_address(address)
    spill_dir = _spill_dir_option(ray_kwargs.pop("_spill_dir", None),
                                  ray_kwargs.pop("object_spilling_config", None))
    # Ray's `memory` resource of the node, in bytes (default: available memory less the store's).
    task_memory = ray_kwargs.pop("_memory", None)
    job_config = ray_kwargs.pop("job_config", None)
    log_to_driver = ray_kwargs.pop("log_to_driver", True)
    if not isinstance(log_to_driver, bool):
        raise TypeError(f"log_to_driver must be True or False, got {log_to_driver!r}")
    if task_memory is not None:
        task_memory = check_amount("_memory", task_memory)
    post_mortem, debugger = _debug_options(post_mortem, debugger)
    unknown = sorted(set(ray_kwargs) - RAY_ONLY_INIT_ARGS - {"logging_level"})
    if unknown:
        import inspect

        known = {*inspect.signature(init).parameters, *RAY_ONLY_INIT_ARGS}
        raise TypeError(
            f"init() got unexpected keyword argument(s) {', '.join(unknown)}; "
            + did_you_mean(unknown, known)
            + "lightwork accepts Ray's init arguments and num_cpus, num_gpus, resources, "
            "object_store_memory, namespace, event_budget"
        )
    if "logging_level" in ray_kwargs:
        import logging

        logging.getLogger("lightwork").setLevel(ray_kwargs.pop("logging_level"))
    if not isinstance(dashboard, bool):
        raise TypeError(f"dashboard must be True or False, got {dashboard!r}")
    dashboard = dashboard or bool(ray_kwargs.pop("include_dashboard", None))
    dashboard_port = ray_kwargs.pop("dashboard_port", None) if dashboard else None
    if dashboard_port is not None and (isinstance(dashboard_port, bool)
                                       or not isinstance(dashboard_port, int)
                                       or not 0 <= dashboard_port <= 65535):
        raise ValueError(f"dashboard_port must be a port number (0 picks a free one), "
                         f"got {dashboard_port!r}")
    noted = sorted(k for k, v in ray_kwargs.items() if v not in (None, False))
    cpus = None if num_cpus is None else check_amount("num_cpus", num_cpus)
    gpus = None if num_gpus is None else check_amount("num_gpus", num_gpus)
    custom = {}
    if resources is not None:
        if not isinstance(resources, dict):
            raise TypeError(f"resources must be a dict of name -> amount, got {resources!r}")
        for name, amount in resources.items():
            if name in ("CPU", "GPU", "memory"):
                raise ValueError("use num_cpus/num_gpus/_memory instead of "
                                 f"resources={{{name!r}: ...}}")
            custom[str(name)] = check_amount(f"resources[{name!r}]", amount)
    from lightwork.kernel.backend import SessionOptions
    from lightwork.kernel.runtime_env import normalize

    from lightwork.api.job_config import session_settings, set_default_actor_lifetime

    runtime_env, namespace, code_paths = session_settings(job_config, runtime_env, namespace)
    job_env = normalize(runtime_env, "init()")
    if code_paths:  # JobConfig(code_search_path=...): first on the workers' sys.path
        job_env = job_env or {"env_vars": {}, "working_dir": None, "paths": []}
        job_env["paths"] = list(dict.fromkeys(code_paths + job_env["paths"]))
    budget = 200_000 if event_budget is None else event_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(
            f"event_budget must be an int >= 0 (records kept; 0 turns the event log off), "
            f"got {event_budget!r}")
    options = SessionOptions(
        num_cpus=cpus, num_gpus=gpus, resources=custom, namespace=namespace, event_budget=budget,
        advisor=advisor, init_callsite=callsite(1), runtime_env=job_env,
        object_store_memory=object_store_memory, spill_dir=spill_dir, memory=task_memory,
        memory_usage_threshold=_memory_usage_threshold,
        memory_monitor_refresh_ms=_memory_monitor_refresh_ms, log_to_driver=log_to_driver,
        debugger=debugger, post_mortem=post_mortem)
    with _init_lock:
        if _backend is not None and not _backend.closed:
            if ignore_reinit_error:
                return _context()
            raise RuntimeError(
                "lightwork.init() was already called in this process; call "
                "lightwork.shutdown() first, or pass ignore_reinit_error=True"
            )
        _backend = open_backend(backend_name, target, options)
        set_default_actor_lifetime(job_config)
        if _backend.ends_before_thread_pools:
            _shut_down_before_thread_pools()
    if dashboard:
        _start_dashboard(dashboard_port or 0)
    if noted:
        print(
            f"lightwork: ignoring Ray-only init argument(s) {', '.join(noted)} "
            "(no effect on the embedded runtime)",
            file=sys.stderr,
        )
    return _context()


def _debug_options(post_mortem: Any, debugger: Any) -> tuple[bool, str]:
    """``init``'s debugger options, checked (``LIGHTWORK_POST_MORTEM=1``: post-mortem on)."""
    import os

    if post_mortem is None:
        post_mortem = os.environ.get("LIGHTWORK_POST_MORTEM", "") not in ("", "0")
    if not isinstance(post_mortem, bool):
        raise TypeError(f"post_mortem must be True or False, got {post_mortem!r}")
    if debugger not in ("pdb", "debugpy"):
        raise ValueError(f"debugger must be 'pdb' (attach with `lightwork debug`) or "
                         f"'debugpy' (attach an editor), got {debugger!r}")
    if debugger == "debugpy":
        import importlib.util

        if importlib.util.find_spec("debugpy") is None:
            raise ImportError("init(debugger='debugpy') needs debugpy: pip install "
                              "'lightwork[debug]' (or pip install debugpy)")
    return post_mortem, debugger


def _start_dashboard(port: int) -> None:
    global _dashboard
    from lightwork.kernel import tools

    start = tools.dashboard_starter()

    if _dashboard is not None:
        _dashboard.stop()
        _dashboard = None
    # The control server of the session: the node's, or a cluster run's log's.
    record = _backend.run_record() if _backend is not None else None
    sidecar = record.control if record is not None else None
    if sidecar is None:
        print("lightwork: no dashboard: it reads the event log, which event_budget=0 turns "
              "off (leave event_budget at its default to have both)", file=sys.stderr)
        return
    if sidecar.error:
        print(f"lightwork: no dashboard: {sidecar.error}", file=sys.stderr)
        return
    try:
        if start is None:
            raise RuntimeError("the dashboard is not loaded (import lightwork.dashboard)")
        _dashboard = start(sidecar.path, port)
    except (OSError, RuntimeError) as exc:  # the program runs on without its dashboard
        print(f"lightwork: no dashboard: {exc}", file=sys.stderr)
        return
    print(f"lightwork: dashboard at {_dashboard.url}", file=sys.stderr)


def _spill_dir_option(spill_dir: Any, spilling_config: Any) -> str | None:
    """The spill directory from ``_spill_dir=`` or Ray's ``object_spilling_config``."""
    if spilling_config is not None:
        import json

        config = spilling_config
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except ValueError as exc:
                raise ValueError(
                    f"object_spilling_config is not valid JSON ({exc}); pass e.g. "
                    '\'{"type": "filesystem", "params": {"directory_path": "/tmp/spill"}}\''
                ) from None
        params = config.get("params", {}) if isinstance(config, dict) else None
        if (not isinstance(config, dict) or config.get("type") != "filesystem"
                or not isinstance(params, dict) or "directory_path" not in params):
            raise ValueError(
                f"object_spilling_config={spilling_config!r}: lightwork spills to a local "
                'directory only; pass {"type": "filesystem", "params": {"directory_path": '
                '"/path/on/disk"}}')
        path = params["directory_path"]
        spill_dir = path[0] if isinstance(path, (list, tuple)) and path else path
    if spill_dir is None:
        return None
    if not isinstance(spill_dir, (str, os.PathLike)):
        raise TypeError(f"the spill directory must be a path (str), got {spill_dir!r}")
    spill_dir = os.path.abspath(os.fspath(spill_dir))
    if not os.path.isdir(spill_dir):
        raise ValueError(
            f"spill directory {spill_dir} does not exist; create it (on a disk, not "
            "tmpfs) or leave the option out to spill into the session directory")
    return spill_dir


def _context() -> InitContext:
    backend = _backend
    node = backend.run_record(session=True)
    return InitContext(
        session_dir=getattr(getattr(node, "session", None), "directory", None),
        node_id=backend.runtime_context()["node_id"],
        address=backend.address(),
        backend=backend.name,
        dashboard_url=_dashboard.url if _dashboard is not None else None,
    )


def shutdown() -> None:
    """Stop the runtime (or disconnect from the cluster). Safe to call twice.

    Embedded: workers exit, shared memory is released. Cluster: this program's tasks and
    actors are released; a ``local-cluster`` started by ``init`` is closed.
    """
    global _backend, _dashboard
    with _init_lock:
        if _backend is not None and not _backend.in_driver:
            return  # inside a task or actor: the driver owns the runtime
        backend, _backend = _backend, None
        dashboard, _dashboard = _dashboard, None
        if backend is not None:
            from lightwork.api.job_config import set_default_actor_lifetime

            set_default_actor_lifetime(None)
    if dashboard is not None:
        dashboard.final_sync()  # its last look while the session is still open
    if backend is not None:
        backend.shutdown()


atexit.register(shutdown)
_early_exit_registered = False


def _shut_down_before_thread_pools() -> None:
    """At exit, shut a cluster session down before Python stops its thread pools.

    ``atexit`` runs after ``concurrent.futures`` has stopped every thread pool (its hook
    runs before the program's threads are joined), and distributed's client runs each
    future's done callbacks in one: a program that exited with work in flight on a
    cluster printed "cannot schedule new futures after interpreter shutdown" tracebacks
    as the closing client cancelled its futures. Those hooks run last registered first,
    so one registered now, after distributed's import, runs before the pools stop
    (``_shutdown_unless_threads_remain``). ``shutdown`` is idempotent: the ``atexit``
    hook then finds nothing to do."""
    global _early_exit_registered
    register = getattr(threading, "_register_atexit", None)
    if _early_exit_registered or register is None:
        return
    try:
        register(_shutdown_unless_threads_remain)
    except RuntimeError:  # the interpreter is exiting already: atexit still runs shutdown
        return
    _early_exit_registered = True


def _shutdown_unless_threads_remain() -> None:
    """The main thread has ended: shut down now, unless a thread of the program's own
    (not daemon, not a thread pool's, which Python stops next) still runs and may use
    the session: then ``atexit`` does, once the program's threads are joined."""
    from concurrent.futures import thread as pool_threads

    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is main or thread.daemon or not thread.is_alive():
            continue
        if getattr(thread, "_target", None) is pool_threads._worker:
            continue
        return
    shutdown()


def is_initialized() -> bool:
    return _backend is not None and not _backend.closed


def backend() -> str:
    """Which backend runs this process's calls: "local" or "distributed".

    Does not start a runtime: before ``init`` it names the one the first call would start.
    """
    current = _backend
    if current is not None and not current.closed:
        return current.name
    from lightwork.engines import parse_address

    return parse_address(None)[0]


def _core(uses: Any = (), named: dict[str, Any] | None = None) -> Any:
    """The process's backend, starting a default runtime if none runs.

    ``uses`` (and the values of ``named``) are what the caller is about to hand to the
    backend: refs, actor handles, a call's arguments. With no runtime running, a ref or
    handle among them can only come from a session that ended, so that raises
    ``SessionEndedError`` instead of starting a runtime in which it would not be found.
    """
    backend = _backend
    if backend is None or backend.closed:
        with _init_lock:
            if _backend is None or _backend.closed:
                _refuse_ended_session(uses)
                if named:
                    _refuse_ended_session(named.values())
                _refuse_auto_start()
                init()
            backend = _backend
    return backend


def _refuse_auto_start() -> None:
    """A call before ``init()`` starts a default runtime, unless the environment turns
    that off (``LIGHTWORK_ENABLE_AUTO_CONNECT=0``, or Ray's ``RAY_ENABLE_AUTO_CONNECT=0``):
    read at each call, so a test or a program can set it at any time; lightwork's name
    wins when both are set."""
    variable = "LIGHTWORK_ENABLE_AUTO_CONNECT"
    if variable not in os.environ:
        variable = "RAY_ENABLE_AUTO_CONNECT"
    if os.environ.get(variable, "") == "0":
        raise RuntimeError(
            f"no runtime is running and {variable}=0 turns off starting one on first "
            "use: call lightwork.init() first, or unset the variable"
        )


def driver_node() -> Any:
    """The embedded runtime's driver ``Node`` (``Backend.node``), or None: for the API's
    own advisor warnings and for the tests' ``support`` module; tools read the run
    through :func:`run_record`."""
    backend = _backend
    if backend is None or backend.closed:
        return None
    return backend.node


def _refuse_ended_session(values: Any) -> None:
    from lightwork.api.actor import ActorHandle, ActorMethod
    from lightwork.kernel.object_ref import ended_session_message
    from lightwork.kernel.exceptions import SessionEndedError

    for value in values:
        if isinstance(value, (ActorHandle, ActorMethod)):
            value = value._ref
            what = f"actor handle {value.hex()}"
        elif isinstance(value, ObjectRef):
            what = repr(value)
        elif isinstance(value, (str, bytes, int, float, type(None))):
            continue
        else:
            contained = _contained_ref_ids(value)
            if not contained:
                continue
            hex_id = f"{contained[0]:020x}"
            raise SessionEndedError(hex_id, ended_session_message(
                f"ObjectRef({hex_id}) (inside an argument)", running=False))
        raise SessionEndedError(value.hex(), ended_session_message(what, running=False))


def _contained_ref_ids(value: Any) -> list[int]:
    """The ids of the refs pickled inside ``value`` (only called with no runtime running,
    so any is from an ended session); [] when it does not pickle: the call reports that."""
    from lightwork.kernel import serialization

    try:
        return serialization.dumps(value)[2]
    except Exception:  # noqa: BLE001 - not ours to report here; submitting it will
        return []


def run_record(feature: str, live: bool = False, session: bool = False) -> RunRecord | None:
    """The run's record (``kernel.run.RunRecord``) for the diagnostic ``feature``, or None
    with no runtime running here (or inside a worker process, whose driver keeps it).

    UnsupportedOnBackend naming ``feature`` where the backend records no run (its event
    log is off), or, for a ``live`` diagnostic (one that needs the engine's own
    processes or store), where the record says it has no such state
    (``RunRecord.live_state_missing``). With ``session`` (the state API, which answers
    even with the log off, as a local session does), the record of the session."""
    backend = _backend
    if backend is None or backend.closed or not backend.in_driver:
        return None
    record = backend.run_record(session=session)
    why = None
    if live:
        probe = record if record is not None else backend.run_record(session=True)
        why = probe.live_state_missing if probe is not None else None
    if why is None and record is None:
        why = "its event log is off (init(event_budget=0))"
    if why is not None:
        from lightwork.kernel.exceptions import UnsupportedOnBackend

        raise UnsupportedOnBackend(
            f"{feature} is not supported on the {backend.name} backend: {why}; run on the "
            "embedded runtime (init() with no address) to use it, or read the Dask "
            "dashboard")
    return record


def _install_backend(backend: Any) -> None:
    """In an engine's worker process: the calls of the task running there go to
    ``backend`` (``kernel.backend.install`` calls this)."""
    global _backend
    _backend = backend


def _installed() -> Any:
    return _backend


_kernel_backend.connect_api(_core, _install_backend, _installed)


# -- decorators ---------------------------------------------------------------------------
def remote(*args: Any, **options: Any) -> Any:
    """``@remote`` or ``@remote(num_cpus=..., ...)`` on a function (or class: an actor)."""
    if len(args) == 1 and not options and callable(args[0]):
        return _make_remote(args[0], {})
    if args or not options:
        # (``@remote()`` too, as in Ray: empty parentheses are a slip for ``@remote``)
        raise TypeError(
            "@remote takes either no arguments and no parentheses (@lightwork.remote) or "
            "only keyword options, e.g. @lightwork.remote(num_cpus=2)"
        )
    return lambda target: _make_remote(target, options)


def _make_remote(target: Any, options: dict[str, Any]) -> Any:
    if isinstance(target, type):
        from lightwork.api.actor import make_actor_class

        return make_actor_class(target, options)
    if not callable(target):
        raise TypeError(f"@remote applies to functions and classes, not {type(target).__name__}")
    return RemoteFunction(target, options)


# -- objects ------------------------------------------------------------------------------
def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be None or a number of seconds, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
    return float(timeout)


class NotObjectRefsError(TypeError, ValueError):
    """``get``/``wait`` was given something other than ObjectRefs.

    Both a ValueError (what Ray's ``get`` raises for a value that is not a ref or a list,
    and what Ray code catches) and a TypeError (what Ray raises for a list holding a
    non-ref, and for any bad ``wait`` argument), so either ``except`` clause works.
    """


def _refs_of(object_refs: Any, call: str) -> list[ObjectRef]:
    if not isinstance(object_refs, (list, tuple)):
        raise NotObjectRefsError(
            f"{call} expects an ObjectRef or a list of ObjectRefs, got "
            f"{_a(type(object_refs).__name__)}: {object_refs!r:.80}{_generator_hint(object_refs)}"
        )
    for index, ref in enumerate(object_refs):
        if not isinstance(ref, ObjectRef):
            raise NotObjectRefsError(
                f"{call} expects ObjectRefs, but item {index} is {_a(type(ref).__name__)}: "
                f"{ref!r:.80}; pass the refs returned by .remote() or put()"
                f"{_generator_hint(ref)}"
            )
    return list(object_refs)


def _a(noun: str) -> str:
    """``noun`` with its indefinite article, for messages."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _generator_hint(value: Any) -> str:
    if isinstance(value, ObjectRefGenerator):
        return ("; iterate the ObjectRefGenerator (for ref in gen) to get each item's ref, "
                "or use gen.completed() for the ref of the whole task")
    return ""


def get(object_refs: Any, *, timeout: float | None = None) -> Any:
    """The value(s) of ``object_refs`` (one ref, or a list), blocking until ready."""
    timeout = _check_timeout(timeout)
    single = isinstance(object_refs, ObjectRef)
    refs = [object_refs] if single else _refs_of(object_refs, "get()")
    if not refs:
        return []
    ids = [ref._id for ref in refs]  # (not .id: the property costs 4x; a ref a task)
    site = callsite(1)
    try:
        if _observers:  # diagnostics callbacks follow this get as one run
            values = _observe_call("get", refs, lambda: _core(refs).get(ids, timeout, site))
        else:
            values = _core(refs).get(ids, timeout, site)
    except KeyboardInterrupt:
        # The user's line, not the runtime's wait loop; and what the interrupt did not do.
        # (In a worker, an interrupt is a cancel of the task: left as it is.)
        if _backend is None or not _backend.in_driver:
            raise
        raise _interrupted("get", refs) from None
    _deliver_advice()
    return values[0] if single else values


def _interrupted(call: str, refs: list[ObjectRef]) -> KeyboardInterrupt:
    """The KeyboardInterrupt of a Ctrl-C during ``call``, saying what goes on."""
    if len(refs) == 1:
        going = (f"{refs[0]!r}; its task keeps running until you cancel it "
                 "(lightwork.cancel(ref))")
    else:
        going = (f"{len(refs)} objects; their tasks keep running until you cancel them "
                 "(lightwork.cancel(ref) for each)")
    return KeyboardInterrupt(f"{call}() was interrupted while it waited for {going} or "
                             "the session ends (lightwork.shutdown())")


def _deliver_advice() -> None:
    """Warn, in the user's thread, about what the advisor found since the last call."""
    backend = _backend
    node = None if backend is None else backend.node
    if node is not None and node.advisor is not None and node.advisor.undelivered:
        node.advisor.deliver_warnings()


def put(value: Any) -> ObjectRef:
    """Store ``value`` once; pass the returned ref to tasks instead of the value."""
    if isinstance(value, ObjectRef):
        raise TypeError(
            "put() of an ObjectRef is not allowed: the ref already names a stored object; "
            "pass the ref itself, or put([ref]) to store a container holding it"
        )
    return _core().put(value)


def wait(
    object_refs: Sequence[ObjectRef | ObjectRefGenerator],
    *,
    num_returns: int = 1,
    timeout: float | None = None,
    fetch_local: bool = True,
) -> tuple[list[Any], list[Any]]:
    """Split ``object_refs`` into (ready, not ready), keeping their order.

    Returns as soon as ``num_returns`` are ready or ``timeout`` seconds passed;
    ``timeout=0`` only looks. As in Ray, the list may hold ``ObjectRefGenerator``s: a
    generator is ready when ``next(gen)`` would not block (its next item was yielded,
    or the stream ended); waiting does not advance it.
    """
    if isinstance(object_refs, (ObjectRef, ObjectRefGenerator)):
        raise NotObjectRefsError(
            f"wait() expects a list of ObjectRefs; wrap a single "
            f"{type(object_refs).__name__}: wait([ref])")
    if not isinstance(object_refs, (list, tuple)):
        _refs_of(object_refs, "wait()")  # raises, naming what was passed
    waitables = list(object_refs)
    if not waitables:
        return [], []
    if len({id(w) if isinstance(w, ObjectRefGenerator) else w for w in waitables}) != len(waitables):
        raise ValueError("wait() requires a list of unique ObjectRefs; remove the duplicates")
    # Each generator waits on the ref its next item will be (see ObjectRefGenerator._peek).
    refs = _refs_of([w._peek() if isinstance(w, ObjectRefGenerator) else w for w in waitables],
                    "wait()")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int):
        raise TypeError(f"num_returns must be an int, got {num_returns!r}")
    if num_returns < 1:
        raise ValueError(f"num_returns must be >= 1, got {num_returns}")
    if num_returns > len(refs):
        raise ValueError(
            f"num_returns={num_returns} is more than the {len(refs)} ref(s) passed to wait()"
        )
    timeout = _check_timeout(timeout)
    # A generator's next ref may be a ref also passed (its head, once the stream ended):
    # such a shared ref is already ready, so waiting on each id once is enough.
    ids = list(dict.fromkeys([ref._id for ref in refs]))
    site = callsite(1)

    def call() -> list[int]:
        return _core(refs).wait(ids, min(num_returns, len(ids)), timeout, site)

    try:
        ready_ids = set(_observe_call("wait", refs, call) if _observers else call())
    except KeyboardInterrupt:
        if _backend is None or not _backend.in_driver:
            raise
        raise _interrupted("wait", refs) from None  # (as in get)
    _deliver_advice()
    ready: list[Any] = []
    not_ready: list[Any] = []
    for waitable, ref in zip(waitables, refs):
        is_ready = ref._id in ready_ids and len(ready) < num_returns
        (ready if is_ready else not_ready).append(waitable)
    return ready, not_ready


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task that makes ``object_ref``; its ``get`` raises TaskCancelledError.

    An ObjectRefGenerator cancels its generator task: the stream ends with the error.
    An actor's call, as in Ray: one that has not started never runs; a running call of
    an async actor gets ``asyncio.CancelledError``; a running call of a sync or threaded
    actor is not interrupted (``get_runtime_context().is_canceled()`` turns True in it)
    and its ``get`` raises TaskCancelledError when it returns; ``force=True`` raises
    ValueError for an actor's call (``kill`` ends the actor). A finished call or task is
    not affected.
    ``recursive`` (Ray's default, True): if the task (or actor call) is running, the
    tasks and actor calls it submitted that are still pending or running are cancelled
    too, and theirs, as in Ray: tasks with the same ``force``, actor calls without it;
    ``recursive=False`` leaves them alone."""
    if not isinstance(recursive, bool):
        raise TypeError(f"cancel(recursive=...) must be True or False, got {recursive!r}")
    if isinstance(object_ref, ObjectRefGenerator):
        object_ref = object_ref.completed()
    if not isinstance(object_ref, ObjectRef):
        raise TypeError(f"cancel() expects an ObjectRef returned by a task, got {object_ref!r:.80}")
    _core((object_ref,)).cancel([object_ref.id], bool(force), recursive)


# -- introspection ------------------------------------------------------------------------
def cluster_resources() -> dict[str, float]:
    return _core().resources()[0]


def available_resources() -> dict[str, float]:
    return _core().resources()[1]


def get_runtime_context() -> RuntimeContext:
    return RuntimeContext(_core().runtime_context())


def get_gpu_ids() -> list[int]:
    return list(_core().runtime_context()["gpu_ids"])


def nodes() -> list[dict[str, Any]]:
    """One entry per machine: this one for the embedded runtime, each cluster worker's."""
    return _core().nodes()
