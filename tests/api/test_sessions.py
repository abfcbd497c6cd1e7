"""Refs and actor handles do not outlive their session.

After ``shutdown()``, a ref or actor handle from the ended session must never name an
object or actor of a later session, and using it says so clearly, also before any new
``init()`` (without starting a runtime for it).

lightwork is stricter than Ray on purpose here (Ray has no ``SessionEndedError``), so the
module is lightwork-only.
"""

from __future__ import annotations

import gc

import pytest

import lightwork as ray
from lightwork import exceptions

pytestmark = pytest.mark.lightwork_only
ObjectLostError = exceptions.ObjectLostError
SessionEndedError = getattr(exceptions, "SessionEndedError", None)


@ray.remote
def echo(value):
    return value


@ray.remote
class Box:
    def __init__(self, value):
        self.value = value

    def read(self):
        return self.value

    def keep(self, value):
        self.value = value


@pytest.fixture
def old_session():
    """A ref and an actor handle made in a session that has then been shut down."""
    ray.shutdown()
    ray.init(num_cpus=2)
    ref = echo.remote("one")
    box = Box.remote("old box")
    assert ray.get([ref, box.read.remote()]) == ["one", "old box"]
    ray.shutdown()
    yield ref, box
    ray.shutdown()


def _assert_ended(excinfo: pytest.ExceptionInfo) -> None:
    message = str(excinfo.value)
    assert "session that has ended" in message
    assert "init()" in message  # says what to do next


class TestAfterReinit:
    def test_old_ref_never_returns_the_new_sessions_object(self, old_session):
        ref, _ = old_session
        ray.init(num_cpus=2)
        assert ray.get(echo.remote("two")) == "two"
        assert ray.get(ray.put("three")) == "three"
        with pytest.raises(SessionEndedError) as excinfo:
            ray.get(ref)
        _assert_ended(excinfo)
        assert isinstance(excinfo.value, ObjectLostError)  # `except ObjectLostError` works

    def test_ids_do_not_repeat_across_sessions(self, old_session):
        ref, box = old_session
        ray.init(num_cpus=2)
        new_refs = [echo.remote(i) for i in range(20)] + [ray.put(1)]
        new_box = Box.remote(0)
        assert ref not in new_refs
        assert new_box != box
        ray.get(new_refs)

    def test_wait_on_old_ref(self, old_session):
        ref, _ = old_session
        ray.init(num_cpus=2)
        with pytest.raises(SessionEndedError) as excinfo:
            ray.wait([ref, echo.remote(1)], num_returns=2, timeout=5)
        _assert_ended(excinfo)

    def test_old_ref_as_task_argument(self, old_session):
        ref, _ = old_session
        ray.init(num_cpus=2)
        with pytest.raises(SessionEndedError):
            echo.remote(ref)
        # The runtime is unharmed: later calls work.
        assert ray.get(echo.remote("after")) == "after"

    def test_old_ref_nested_in_an_argument_is_refused_at_remote(self, old_session):
        """Regression: a ref inside a container passed through to the task unchecked."""
        ref, _ = old_session
        ray.init(num_cpus=2)

        @ray.remote
        def fetch(box):
            return ray.get(box[0])

        with pytest.raises(SessionEndedError) as excinfo:
            fetch.remote([ref])
        _assert_ended(excinfo)
        with pytest.raises(SessionEndedError):
            Box.remote({"inside": (ref,)})
        assert ray.get(fetch.remote([ray.put("new")]), timeout=20) == "new"  # unharmed

    def test_old_actor_handle(self, old_session):
        _, box = old_session
        ray.init(num_cpus=2)
        new_box = Box.remote("new box")
        with pytest.raises(SessionEndedError) as excinfo:
            box.read.remote()
        assert "actor handle" in str(excinfo.value)
        _assert_ended(excinfo)
        with pytest.raises(SessionEndedError):
            ray.kill(box)
        assert ray.get(new_box.read.remote()) == "new box"  # the kill hit nothing else

    def test_old_actor_handle_passed_to_a_task(self, old_session):
        _, box = old_session
        ray.init(num_cpus=2)

        @ray.remote
        def call(handle):
            return ray.get(handle.read.remote())

        with pytest.raises(SessionEndedError):
            ray.get(call.remote(box), timeout=20)

    def test_old_actor_handles_inside_containers(self, old_session):
        """Nested in a list or dict (given to a task, an actor's method or constructor),
        or inside an object put in the new session: the old handle never reaches the new
        session's actors and never hangs."""
        _, box = old_session
        ray.init(num_cpus=2)
        new_box = Box.remote("new box")  # would get the old handle's calls if ids repeated

        @ray.remote
        def call_first(handles):
            return ray.get(handles[0].read.remote(), timeout=20)

        @ray.remote
        def call_in(mapping):
            return ray.get(mapping["box"].read.remote(), timeout=20)

        with pytest.raises(SessionEndedError) as excinfo:
            call_first.remote([box])
        _assert_ended(excinfo)
        with pytest.raises(SessionEndedError):
            call_in.remote({"box": box})
        with pytest.raises(SessionEndedError):
            Box.remote({"handles": [box]})
        with pytest.raises(SessionEndedError):
            new_box.keep.remote([box])
        holder = ray.put({"box": box})  # a new-session object holding the old handle
        with pytest.raises(SessionEndedError):
            ray.get(call_in.remote(holder), timeout=20)
        with pytest.raises(SessionEndedError):
            ray.get(call_in.remote(ray.get(holder)), timeout=20)
        assert ray.get(new_box.read.remote(), timeout=20) == "new box"  # unharmed

    def test_old_actor_handle_pickled_by_the_user(self, old_session):
        """Pickled to bytes (no ref tracking can see it), then unpickled and called inside
        a task or an actor: the call raises the session-ended error there."""
        import cloudpickle

        _, box = old_session
        ray.init(num_cpus=2)
        blob = cloudpickle.dumps(box)

        @ray.remote
        def call_unpickled(data):
            return ray.get(cloudpickle.loads(data).read.remote(), timeout=20)

        @ray.remote
        class Caller:
            def call(self, data):
                return ray.get(cloudpickle.loads(data).read.remote(), timeout=20)

        with pytest.raises(SessionEndedError):
            ray.get(call_unpickled.remote(blob), timeout=30)
        with pytest.raises(SessionEndedError):
            ray.get(Caller.remote().call.remote(blob), timeout=30)
        with pytest.raises(SessionEndedError):
            cloudpickle.loads(blob).read.remote()  # in the driver too

    def test_cancel_old_ref(self, old_session):
        ref, _ = old_session
        ray.init(num_cpus=2)
        with pytest.raises(SessionEndedError):
            ray.cancel(ref)

    def test_dropping_old_refs_frees_nothing_of_the_new_session(self, fresh_runtime):
        ray.init(num_cpus=2)
        old = [ray.put(i) for i in range(5)]
        ray.shutdown()
        ray.init(num_cpus=2)
        new = [ray.put(f"kept {i}") for i in range(5)]
        del old
        gc.collect()
        assert ray.get(echo.remote(1)) == 1  # a call makes the node apply the releases
        assert ray.get(new) == [f"kept {i}" for i in range(5)]


class TestBeforeReinit:
    """With no runtime running, an old ref raises at once and starts no runtime."""

    @pytest.mark.parametrize("use", [
        lambda ref, box: ray.get(ref),
        lambda ref, box: ray.get([ref]),
        lambda ref, box: ray.wait([ref]),
        lambda ref, box: ray.cancel(ref),
        lambda ref, box: echo.remote(ref),
        lambda ref, box: echo.remote(value=ref),
        lambda ref, box: echo.remote([ref]),
        lambda ref, box: echo.remote(value={"nested": (ref,)}),
        lambda ref, box: Box.remote([ref]),
        lambda ref, box: box.read.remote(),
        lambda ref, box: ray.kill(box),
        lambda ref, box: Box.remote(ref),
        lambda ref, box: ref.future(),
    ], ids=["get", "get-list", "wait", "cancel", "task-arg", "task-kwarg", "task-arg-in-list",
            "task-kwarg-nested", "actor-arg-in-list", "actor-call", "kill", "actor-arg",
            "future"])
    def test_raises_without_starting_a_runtime(self, old_session, use):
        ref, box = old_session
        with pytest.raises(SessionEndedError) as excinfo:
            use(ref, box)
        assert "No lightwork runtime is running" in str(excinfo.value)
        _assert_ended(excinfo)
        assert not ray.is_initialized()

    def test_a_new_call_without_old_refs_still_starts_a_runtime(self, old_session):
        assert ray.get(echo.remote(5)) == 5
        assert ray.is_initialized()


class TestOldPlacementGroup:
    """Regression: an old group after re-init failed with internal resource names
    ("needs 0.001 bundle_group_…") instead of saying its session ended."""

    @pytest.fixture
    def old_group(self, fresh_runtime):
        from lightwork.util import placement_group

        ray.init(num_cpus=2)
        group = placement_group([{"CPU": 1}])
        assert ray.get(group.ready(), timeout=20) == group
        ray.shutdown()
        return group

    @pytest.mark.parametrize("reinit", [True, False], ids=["after-reinit", "before-reinit"])
    def test_using_an_old_group_says_its_session_ended(self, old_group, reinit):
        from lightwork.util import placement_group_table, remove_placement_group
        from lightwork.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if reinit:
            ray.init(num_cpus=2)
        strategy = PlacementGroupSchedulingStrategy(old_group)
        uses = [
            lambda: echo.options(scheduling_strategy=strategy).remote(1),
            lambda: Box.options(scheduling_strategy=strategy).remote(1),
            old_group.ready,
            lambda: remove_placement_group(old_group),
            lambda: placement_group_table(old_group),
        ]
        for use in uses:
            with pytest.raises(SessionEndedError) as excinfo:
                use()
            assert "placement group" in str(excinfo.value)
            assert "bundle_group" not in str(excinfo.value)
            _assert_ended(excinfo)
        assert ray.is_initialized() == reinit  # no runtime was started for the old group
        if reinit:
            assert ray.get(echo.remote("unharmed"), timeout=20) == "unharmed"
