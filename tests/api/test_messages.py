"""What the user reads after a common slip: the unpicklable global a function uses, a
mistyped option, a Ctrl-C during ``get`` (in a real terminal).
"""

from __future__ import annotations

import re
import signal
import sys
import threading

import pytest

import lightwork as ray
from lightwork.kernel.serialization import SerializationError
from tests.helpers import script_env, write_script

pytestmark = [pytest.mark.lightwork_only, pytest.mark.usefixtures("ray_start")]

LOCK = threading.Lock()


def uses_the_lock(x):
    with LOCK:
        return x


def calls_a_helper_that_uses_the_lock():
    return uses_the_lock(1)


def test_an_unpicklable_global_is_named():
    with pytest.raises(SerializationError, match=r"uses the global `LOCK`, a lock object"):
        ray.remote(uses_the_lock).remote(1)


def test_an_unpicklable_global_of_a_helper_is_named_through_it():
    with pytest.raises(SerializationError,
                       match=r"the global `uses_the_lock`, which uses the global `LOCK`"):
        ray.remote(calls_a_helper_that_uses_the_lock).remote()


def test_an_unpicklable_captured_variable_is_named():
    local_lock = threading.Lock()

    def task():
        return local_lock.locked()

    with pytest.raises(SerializationError, match=r"the captured variable `local_lock`"):
        ray.remote(task).remote()


def test_an_actor_method_using_an_unpicklable_global_is_named():
    class Keeper:
        def hold(self):
            with LOCK:
                return 1

    with pytest.raises(SerializationError, match=r"global `LOCK` \(in Keeper.hold\)"):
        ray.remote(Keeper).remote()


def test_a_picklable_function_is_not_affected():
    assert ray.get(ray.remote(lambda: threading.get_ident() > 0).remote(), timeout=30)


@pytest.mark.parametrize("make", [
    lambda: ray.remote(num_cpu=2)(lambda: 1),
    lambda: ray.remote(lambda: 1).options(num_cpu=2),
])
def test_a_mistyped_option_gets_a_suggestion_before_the_list(make):
    with pytest.raises(ValueError) as caught:
        make()
    message = str(caught.value)
    assert "did you mean 'num_cpus'?" in message
    assert message.index("did you mean") < message.index("valid options are")


def test_a_mistyped_actor_option_gets_a_suggestion():
    class Plain:
        pass

    with pytest.raises(ValueError, match="did you mean 'max_restarts'"):
        ray.remote(Plain).options(max_restart=2)


def test_an_option_like_nothing_gets_no_suggestion():
    with pytest.raises(ValueError) as caught:
        ray.remote(lambda: 1).options(zzzz=1)
    assert "did you mean" not in str(caught.value)


def test_a_mistyped_init_argument_gets_a_suggestion():
    with pytest.raises(TypeError, match="did you mean 'num_cpus'"):
        ray.init(num_cpu=2)


INTERRUPTED = """
import time
import lightwork as ray

ray.init(num_cpus=1)

@ray.remote
def slow():
    time.sleep(60)
    return 1

ref = slow.remote()
print("WAITING", flush=True)
try:
    value = ray.get(ref)
finally:
    print("STILL_RUNNING", [t["state"] for t in ray.util.state.list_tasks()], flush=True)
"""


def test_ctrl_c_in_get_shows_the_users_line_and_says_the_task_goes_on(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    script = write_script(str(tmp_path), "interrupted.py", INTERRUPTED)
    # SIGINT at its default in the program, as from a terminal, even when the test run
    # inherited it ignored (a shell's background job).
    child = pexpect.spawn(sys.executable, [script], env=script_env(), encoding="utf-8",
                          timeout=60, dimensions=(50, 200),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        child.expect("WAITING")
        child.expect(pexpect.TIMEOUT, timeout=1)  # the get is blocked by now
        child.sendintr()  # ^C from the terminal: SIGINT to the foreground process group
        child.expect(pexpect.EOF)
        shown = child.before
    finally:
        child.close(force=True)
    states = re.search(r"STILL_RUNNING (.*)", shown)
    assert states and "RUNNING" in states.group(1), shown  # the ^C did not stop the task
    assert re.search(r'interrupted.py", line \d+, in <module>\s+value = ray.get\(ref\)',
                     shown), shown
    for inner in ("spin.py", "io_loop.py", "selectors.py", "driver_calls.py"):
        assert inner not in shown, shown
    assert "KeyboardInterrupt: get() was interrupted" in shown
    assert "its task keeps running until you cancel it (lightwork.cancel(ref))" in shown
