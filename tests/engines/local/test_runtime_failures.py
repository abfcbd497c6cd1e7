"""When the runtime itself breaks, callers get a clear error, never a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest
from tests import support

import lightwork
from lightwork.exceptions import RuntimeSystemError

pytestmark = pytest.mark.lightwork_only


def test_dead_fork_server_fails_pending_and_later_calls_clearly(fresh_runtime):
    lightwork.init(num_cpus=2)

    @lightwork.remote
    def slow():
        time.sleep(0.5)
        return 1

    ref = slow.remote()
    os.kill(support.forkserver().process.pid, signal.SIGKILL)
    with pytest.raises(RuntimeSystemError, match="fork server .* exited"):
        lightwork.get(ref, timeout=20)
    with pytest.raises(RuntimeSystemError, match="shutdown.*init"):
        slow.remote()
    lightwork.shutdown()
    lightwork.init(num_cpus=1)  # a new runtime works again
    assert lightwork.get(slow.remote(), timeout=20) == 1


class _LoadsOnceFlagIsGone:
    """Unpickles only once its flag file is gone: the first load removes it and raises."""

    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        return (_load_unless_flagged, (self.flag,))


def _load_unless_flagged(flag):
    if os.path.exists(flag):
        os.remove(flag)
        raise ImportError("the first load of this function fails on purpose")
    return _LoadsOnceFlagIsGone(flag)


def test_a_function_whose_load_failed_loads_on_its_next_call(fresh_runtime, tmp_path):
    """The driver sends a function's code to a worker once: a load that fails there
    must leave it, so the next call loads it again rather than finding nothing."""
    lightwork.init(num_cpus=1)  # one worker: both calls land on it
    flag = tmp_path / "fail-the-first-load"
    flag.touch()
    held = _LoadsOnceFlagIsGone(str(flag))

    @lightwork.remote
    def uses_held():
        return os.path.basename(held.flag)

    with pytest.raises(lightwork.exceptions.TaskError, match="fails on purpose"):
        lightwork.get(uses_held.remote(), timeout=20)
    assert not flag.exists()
    assert lightwork.get(uses_held.remote(), timeout=20) == "fail-the-first-load"
