"""Ray's public names and modules that programs import, on every backend:
``cloudpickle``, ``ray_constants``, ``runtime_context``, ``job_config``,
``experimental.state.api``, the public names of ``ray._raylet``,
``ObjectRefStreamEndOfStreamError``, ``ObjectID``, ``util.get_node_ip_address``,
``ObjectRef.as_future`` and ``asyncio.wait`` over refs, ``util.joblib``, and
``util.state``'s ``get_*`` calls with rows that read as attributes, as Ray's do.

Each module must import, give lightwork's own objects, and fail clearly for what
lightwork does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from tests.conformance import test_conformance
from tests.helpers import wait_until

import lightwork
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only

# The conformance suite's fixtures and gap marker (assigned, not imported by name: the
# tests' parameters then shadow no import).
backend = test_conformance.backend
_apply_gaps = test_conformance._apply_gaps
gap = test_conformance.gap


@contextlib.contextmanager
def session(backend_name, cluster, **init_args):
    """A session of its own for one test (init arguments of its own), then the module's
    session again, as the ``backend`` fixture made it."""
    lightwork.shutdown()
    address = None if backend_name == "local" else cluster.scheduler_file
    try:
        lightwork.init(address=address, num_cpus=2 if address is None else None, **init_args)
        if address is not None:
            cluster.wait_for_workers(lightwork.api.core._backend.client)
        yield
    finally:
        lightwork.shutdown()
        lightwork.init(address=address, num_cpus=2 if address is None else None)
        if address is not None:
            cluster.wait_for_workers(lightwork.api.core._backend.client)


@lightwork.remote
def double(x):
    return 2 * x


@lightwork.remote
def slow(x, seconds):
    time.sleep(seconds)
    return x


@lightwork.remote
def fail(message):
    raise ValueError(message)


# ---- the modules import under Ray's names -------------------------------------------------
def test_ray_programs_import_the_modules_and_get_clear_errors_for_the_rest(backend, tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(textwrap.dedent("""\
        import lightwork
        lightwork.install_as_ray()
        import ray
        from ray import cloudpickle, ray_constants
        import ray.cloudpickle, ray.runtime_context, ray.job_config
        from ray.types import ObjectRef as TypesRef
        def annotated(refs: "list[TypesRef[int]]") -> TypesRef[int]: ...
        assert TypesRef is lightwork.ObjectRef and TypesRef[int].__origin__ is TypesRef
        from ray._raylet import (ObjectRef, ObjectRefGenerator, StreamingObjectRefGenerator,
                                 ObjectRefStreamEndOfStreamError)
        from ray.experimental.state.api import list_objects
        from ray.util.joblib import register_ray
        print(cloudpickle is lightwork.cloudpickle, ObjectRef is ray.ObjectID is ray.ObjectRef,
              StreamingObjectRefGenerator is ObjectRefGenerator is lightwork.ObjectRefGenerator,
              ObjectRefStreamEndOfStreamError is ray.exceptions.ObjectRefStreamEndOfStreamError,
              list_objects is lightwork.state.list_objects,
              ray.runtime_context.get_runtime_context is lightwork.get_runtime_context)
        try:
            from ray._raylet import GcsClient
        except ImportError as exc:
            print("not public:", "'GcsClient'" in str(exc))
        print(hasattr(ray._raylet, "GcsClient"), hasattr(ray_constants, "KV_NAMESPACE_FUNCTION_TABLE"))
        try:
            import ray._private.worker
        except ModuleNotFoundError as exc:
            print("private:", exc.name)
        try:
            import ray.experimental.tqdm_ray
        except ModuleNotFoundError as exc:
            print("missing:", exc.name)
    """))
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "LIGHTWORK_ADDRESS": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True True True True True True", "not public: True", "False False",
        "private: ray._private", "missing: ray.experimental.tqdm_ray"]


def test_raylet_and_ray_constants_name_what_they_lack(backend):
    from lightwork import _raylet, ray_constants
    from lightwork.dashboard.server import DEFAULT_PORT

    with pytest.raises(AttributeError, match="PythonFunctionDescriptor is part of Ray's "
                                             "compiled core.*ObjectRefGenerator"):
        _raylet.PythonFunctionDescriptor
    with pytest.raises(AttributeError, match="TASK_PUSH_ERROR is a setting of Ray's own "
                                             "machinery.*DEFAULT_DASHBOARD_PORT"):
        ray_constants.TASK_PUSH_ERROR
    assert ray_constants.DEFAULT_DASHBOARD_PORT == DEFAULT_PORT
    assert ray_constants.RAY_ADDRESS_ENVIRONMENT_VARIABLE == "LIGHTWORK_ADDRESS"
    assert lightwork.ray_constants is ray_constants and lightwork._raylet is _raylet


# ---- cloudpickle -------------------------------------------------------------------------
def test_cloudpickle_round_trips_functions_and_refs_and_keeps_file_names(backend):
    from lightwork import cloudpickle

    offset = 5
    blob = cloudpickle.dumps(lambda x: x + offset)
    restored = cloudpickle.loads(blob)
    assert restored(1) == 6
    assert restored.__code__.co_filename == __file__  # not cloudpickle's "<dynamic-code>"
    ref = double.remote(21)
    assert lightwork.get(cloudpickle.loads(cloudpickle.dumps(ref))) == 42
    assert cloudpickle.register_pickle_by_value and cloudpickle.CloudPickler
    assert cloudpickle.__version__
    with pytest.raises(AttributeError, match="neither has the cloudpickle"):
        cloudpickle.no_such_name


# ---- exceptions, ObjectID, runtime_context -------------------------------------------------
@lightwork.remote
def count_to(n):
    yield from range(n)


def test_end_of_stream_error_is_public_and_a_stream_still_ends_with_stop_iteration(backend):
    error = exceptions.ObjectRefStreamEndOfStreamError("end")
    assert isinstance(error, exceptions.RayError) and str(error) == "end"
    assert "ObjectRefStreamEndOfStreamError" in exceptions.__all__
    assert type(error).__module__ == "lightwork.exceptions"
    stream = count_to.remote(2)
    assert lightwork.get([next(stream), next(stream)]) == [0, 1]
    with pytest.raises(StopIteration):
        next(stream)


def test_actor_unavailable_error_is_public_with_ray_s_arguments():
    """Ray programs catch it (an ActorPool keeps such an actor); it takes Ray's
    ``(message, actor_id)``, is an actor error and survives a pickle."""
    import pickle

    error = exceptions.ActorUnavailableError("temporarily unavailable", None)
    assert isinstance(error, exceptions.RayActorError)
    assert "temporarily unavailable" in str(error)
    assert "ActorUnavailableError" in exceptions.__all__
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)


def test_object_id_is_object_ref(backend):
    assert lightwork.ObjectID is lightwork.ObjectRef
    assert isinstance(lightwork.put(1), lightwork.ObjectID)


@lightwork.remote
def context_in_task():
    from lightwork import runtime_context

    context = runtime_context.get_runtime_context()
    return isinstance(context, runtime_context.RuntimeContext), context.get_task_id()


def test_runtime_context_module(backend):
    from lightwork import runtime_context

    assert isinstance(runtime_context.get_runtime_context(), runtime_context.RuntimeContext)
    is_context, task_id = lightwork.get(context_in_task.remote())
    assert is_context and task_id is not None


# ---- get_node_ip_address -------------------------------------------------------------------
@lightwork.remote
def ip_in_task():
    return lightwork.util.get_node_ip_address()


def test_get_node_ip_address_in_the_driver_and_in_a_task(backend):
    driver_ip, task_ip = lightwork.util.get_node_ip_address(), lightwork.get(ip_in_task.remote())
    ipaddress.ip_address(driver_ip)  # an address, not a host name or a Dask URL
    if backend == "local":
        assert driver_ip == task_ip == "127.0.0.1"
    else:  # the host of the Dask worker that ran the task
        assert task_ip in {node["NodeManagerAddress"] for node in lightwork.nodes()}


# ---- JobConfig ---------------------------------------------------------------------------
def test_job_config_checks_its_fields():
    from lightwork.job_config import JobConfig

    with pytest.raises(ValueError, match="default_actor_lifetime must be 'detached' or"):
        JobConfig(default_actor_lifetime="forever")
    with pytest.raises(TypeError, match="metadata keys and values must be strings"):
        JobConfig(metadata={"n": 1})
    with pytest.raises(TypeError, match="code_search_path=...\\) must be a list of strings"):
        JobConfig(code_search_path="/tmp")
    with pytest.raises(TypeError, match="runtime_env=...\\) must be a dict"):
        JobConfig(runtime_env=["pip"])
    config = JobConfig.from_json({"ray_namespace": "ns", "metadata": {"who": "me"}})
    assert (config.ray_namespace, config.metadata) == ("ns", {"who": "me"})
    with pytest.raises(TypeError, match="must be a lightwork.job_config.JobConfig"):
        lightwork.init(job_config={"ray_namespace": "ns"})


@lightwork.remote
def read_variable(name):
    return os.environ.get(name)


def test_job_config_namespace_and_init_arguments_first(backend, shared_dask_cluster):
    from lightwork.job_config import JobConfig

    with session(backend, shared_dask_cluster, job_config=JobConfig(ray_namespace="jobs")):
        assert lightwork.get_runtime_context().namespace == "jobs"
    with session(backend, shared_dask_cluster, namespace="mine",
                 job_config=JobConfig(ray_namespace="jobs")):
        assert lightwork.get_runtime_context().namespace == "mine"


@gap("distributed", "a job-wide runtime_env is refused on a cluster (UnsupportedOnBackend)")
def test_job_config_runtime_env_and_code_search_path(backend, shared_dask_cluster, tmp_path):
    from lightwork.job_config import JobConfig

    (tmp_path / "job_helper_mod.py").write_text("VALUE = 'from the search path'\n")
    config = JobConfig(runtime_env={"env_vars": {"JOB_NAME_37": "yes"}},
                       code_search_path=[str(tmp_path)])
    with session(backend, shared_dask_cluster, job_config=config):
        assert lightwork.get(read_variable.remote("JOB_NAME_37")) == "yes"
        assert lightwork.get(import_value.remote("job_helper_mod")) == "from the search path"


def test_job_config_refuses_a_search_path_entry_that_is_no_directory(backend, tmp_path):
    from lightwork.job_config import JobConfig

    with pytest.raises(ValueError, match="not an existing directory.*Python workers only"):
        lightwork.api.job_config.session_settings(
            JobConfig(code_search_path=[str(tmp_path / "lib.jar")]), None, None)


@lightwork.remote
def import_value(module):
    import importlib

    return importlib.import_module(module).VALUE


@lightwork.remote
class Named:
    def ping(self):
        return "pong"


def test_job_config_default_actor_lifetime_detaches_named_actors(backend, shared_dask_cluster):
    from lightwork.job_config import JobConfig

    with session(backend, shared_dask_cluster,
                 job_config=JobConfig(default_actor_lifetime="detached")):
        handle = Named.options(name="kept37").remote()
        assert lightwork.get(handle.ping.remote()) == "pong"
        del handle  # detached: the name keeps it
        time.sleep(0.5)
        assert lightwork.get(lightwork.get_actor("kept37").ping.remote()) == "pong"
        lightwork.kill(lightwork.get_actor("kept37"))
    handle = Named.options(name="gone37").remote()  # the default again: non-detached
    assert lightwork.get(handle.ping.remote()) == "pong"
    lightwork.kill(handle)


# ---- asyncio: as_future, asyncio.wait, done callbacks ----------------------------------------
def test_as_future_is_an_asyncio_future_and_cancelling_it_spares_the_ref(backend):
    async def main():
        assert await double.remote(4).as_future() == 8
        with pytest.raises(ValueError, match="no good"):
            await fail.remote("no good").as_future()
        ref = slow.remote("late", 1.0)
        future = ref.as_future()
        assert isinstance(future, asyncio.Future)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(future, timeout=0.05)
        assert future.cancelled()
        return await ref, await ref

    assert asyncio.run(main()) == ("late", "late")


@lightwork.remote
class AsyncWaiter:
    async def give_up_then_await(self, refs):
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(refs[0].as_future(), timeout=0.05)
        return await refs[0]


def test_a_cancelled_as_future_inside_an_async_actor_leaves_the_ref_usable(backend):
    waiter = AsyncWaiter.remote()
    assert lightwork.get(waiter.give_up_then_await.remote([slow.remote(7, 0.5)])) == 7


def test_asyncio_wait_takes_refs(backend):
    async def main():
        fast, late = double.remote(1), slow.remote("late", 1.5)
        done, pending = await asyncio.wait([fast, late], return_when=asyncio.FIRST_COMPLETED)
        assert done == {fast} and pending == {late}
        done, pending = await asyncio.wait([fast, late])
        assert done == {fast, late} and not pending
        return [ref.result() for ref in (fast, late)]

    assert asyncio.run(main()) == [2, "late"]


def test_done_callbacks_outside_an_event_loop(backend):
    called = threading.Event()
    seen = []
    ref = slow.remote(3, 0.3)
    assert not ref.done() and not ref.cancelled()

    def record(done_ref):
        seen.append(done_ref)
        called.set()

    ref.add_done_callback(record)
    ref.add_done_callback(seen.append)
    assert ref.remove_done_callback(seen.append) == 1
    assert called.wait(30) and seen == [ref]
    assert ref.done() and ref.result() == 3 and ref.exception() is None
    assert isinstance(fail.remote("bad").exception(timeout=30), ValueError)
    with pytest.raises(TypeError, match="needs a callable"):
        ref.add_done_callback("not callable")


# ---- joblib ------------------------------------------------------------------------------
def pid_of_call(x):
    return x * x, os.getpid()


def fail_on(x, bad):
    if x == bad:
        raise KeyError(f"call {x}")
    return x


def test_joblib_ray_backend_runs_calls_as_tasks(backend):
    joblib = pytest.importorskip("joblib")
    from lightwork.util.joblib import register_ray

    register_ray()
    with joblib.parallel_backend("ray"):
        results = joblib.Parallel(n_jobs=2)(joblib.delayed(pid_of_call)(i) for i in range(20))
    assert [value for value, _ in results] == [i * i for i in range(20)]
    assert os.getpid() not in {pid for _, pid in results}
    with joblib.parallel_backend("ray", ray_remote_args={"num_cpus": 1}):
        assert joblib.Parallel(n_jobs=-1)(joblib.delayed(abs)(-i) for i in range(5)) == [
            0, 1, 2, 3, 4]
        with pytest.raises(KeyError, match="call 3"):
            joblib.Parallel(n_jobs=2)(joblib.delayed(fail_on)(i, 3) for i in range(8))
    assert joblib.Parallel(backend="lightwork", n_jobs=2, return_as="generator")(
        joblib.delayed(abs)(-i) for i in range(3)).__next__() == 0


def test_joblib_backend_checks_its_arguments(backend):
    pytest.importorskip("joblib")
    from lightwork.util.joblib import LightworkBackend

    with pytest.raises(TypeError, match="ray_remote_args must be a dict"):
        LightworkBackend(ray_remote_args=["num_cpus", 1])
    with pytest.raises(ValueError, match="num_cpus"):
        LightworkBackend(ray_remote_args={"num_cpus": -1})
    backend_ = LightworkBackend()
    with pytest.raises(TypeError, match="unexpected argument\\(s\\) chunks"):
        backend_.configure(n_jobs=2, chunks=4)
    with pytest.raises(ValueError, match="n_jobs == 0"):
        backend_.effective_n_jobs(0)
    assert backend_.effective_n_jobs(-1) == int(lightwork.cluster_resources()["CPU"])


def test_register_ray_without_joblib_says_what_to_install(backend, monkeypatch):
    from lightwork.util.joblib import register_ray

    monkeypatch.setitem(sys.modules, "joblib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "joblib.parallel", None)
    with pytest.raises(ImportError, match=r"pip install 'lightwork\[joblib\]'"):
        register_ray()


@lightwork.remote
class StateProbe:
    def ping(self):
        return "pong"


@lightwork.remote
def state_probe_task():
    return 2


def test_state_get_calls_find_one_row_each_and_rows_read_as_attributes(backend):
    from lightwork.util.state import (get_actor, get_objects, get_task, get_worker,
                                      list_actors)

    actor = StateProbe.remote()
    assert lightwork.get(actor.ping.remote(), timeout=20) == "pong"
    ref = state_probe_task.remote()
    assert lightwork.get(ref, timeout=20) == 2
    stored = lightwork.put(b"y" * 2000)

    row = get_actor(actor._actor_id)
    assert row is not None and row.state == row["state"] == "ALIVE"
    assert row.class_name.endswith("StateProbe") and row.asdict() == dict(row)
    assert [r.actor_id for r in list_actors() if r.actor_id == actor._actor_id] == [row.actor_id]
    assert get_actor("f" * len(actor._actor_id)) is None
    with pytest.raises(AttributeError, match="no field 'no_such_field'; its fields are: actor_id"):
        row.no_such_field  # noqa: B018

    task = get_task(ref)  # by the ref the task makes, and by its id as int and str
    assert task is not None and task.state == "FINISHED" and task.name.endswith("state_probe_task")
    assert get_task(task.task_id).task_id == get_task(str(task.task_id)).task_id == task.task_id
    assert get_worker(0).kind == "driver"
    [obj] = get_objects(stored.hex())
    assert obj.object_id == stored.hex() and obj.size >= 2000
    for call, bad in ((get_actor, 7), (get_task, None), (get_worker, 1.5), (get_objects, "")):
        with pytest.raises(TypeError, match=r"takes the id as"):
            call(bad)
    with pytest.raises(ValueError, match=r"timeout=\) is a positive number of seconds, got 0"):
        get_actor(actor._actor_id, timeout=0)
    with pytest.raises(TypeError, match=r"address=\) is a string or None"):
        get_worker(0, address=5)


def test_state_nodes_summaries_and_what_lightwork_lacks(backend):
    from lightwork.util import state

    [first, *_] = nodes = state.list_nodes()
    assert all(row.state == "ALIVE" for row in nodes) and first.resources_total["CPU"] >= 1
    assert state.get_node(first.node_id).node_id == first.node_id
    assert state.get_node("no-such-node") is None
    with pytest.raises(ValueError, match="unknown filter key 'cpu' for nodes; valid keys"):
        state.list_nodes(filters=[("cpu", "=", 1)])

    live, dead = StateProbe.remote(), StateProbe.remote()
    lightwork.get([live.ping.remote(), dead.ping.remote()], timeout=20)
    lightwork.kill(dead)

    def probes():
        [entry] = [c for c in state.summarize_actors()["classes"]
                   if c["class_name"].endswith("StateProbe")]
        return entry if entry["state_counts"].get("DEAD") else None

    entry = wait_until(probes, timeout=20, message="the killed actor in the summary")
    assert entry["state_counts"]["ALIVE"] >= 1 and entry["count"] == sum(
        entry["state_counts"].values())
    assert set(state.summarize_objects()) >= {"objects", "total_bytes", "by_owner"}

    for name in ("list_jobs", "get_job", "list_logs", "get_log", "list_runtime_envs",
                 "list_cluster_events", "StateApiClient"):
        with pytest.raises(NotImplementedError, match=f"ray.util.state.{name} is not in "
                                                      "lightwork: "):
            getattr(state, name)()
