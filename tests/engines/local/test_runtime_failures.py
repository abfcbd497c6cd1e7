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
