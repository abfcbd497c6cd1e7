"""Refs and actor handles do not outlive their session on the cluster backend either
(``test_sessions.py`` has the local runtime's side): the backend remembers the id
prefixes of this process's ended driver sessions (``cluster._ENDED_SESSIONS``)."""

from __future__ import annotations

import pytest

import lightwork

pytestmark = pytest.mark.lightwork_only
pytest.importorskip("distributed", reason="the cluster extra: pip install 'lightwork[cluster]'")


def test_a_ref_or_handle_of_an_ended_session_says_so(fresh_runtime, shared_dask_cluster):
    """After shutdown() and a new init(), a ref or an actor handle of the old session
    raises SessionEndedError saying what to do, as on the local runtime (it said "not
    known to this session ... it was freed, or it comes from an earlier session" with
    ReferenceCountingAssertionError)."""
    from lightwork import exceptions

    @lightwork.remote
    class Box:
        def read(self):
            return 1

    fresh_runtime.init(address=shared_dask_cluster.scheduler_file)
    old_ref, old_box = lightwork.put(1), Box.remote()
    assert lightwork.get(old_box.read.remote(), timeout=30) == 1
    lightwork.shutdown()
    fresh_runtime.init(address=shared_dask_cluster.scheduler_file)
    for use in (lambda: lightwork.get(old_ref, timeout=10),
                lambda: old_box.read.remote(),
                lambda: lightwork.kill(old_box)):
        with pytest.raises(exceptions.SessionEndedError, match="session that has ended"):
            use()
    assert lightwork.get(lightwork.put(2), timeout=10) == 2
