"""Which distributed the backend runs on: a version without the private parts it relies on
fails at ``init`` with an error naming the supported range (``engines/distributed/compat.py``),
not deep inside a call later. No cluster is needed: the check runs before connecting."""

from __future__ import annotations

import pytest

import lightwork
from lightwork.engines.distributed import compat as cluster_compat

pytestmark = pytest.mark.lightwork_only
distributed = pytest.importorskip("distributed",
                                  reason="the cluster extra: pip install 'lightwork[cluster]'")

#: Nothing listens here: were the check to come after connecting, init would wait for it.
NOWHERE = "tcp://127.0.0.1:9"


def test_the_installed_distributed_has_every_part():
    assert cluster_compat.missing_parts(distributed) == []
    cluster_compat.check(distributed)


@pytest.mark.parametrize("owner, name, part", [
    ("actor", "_worker_rpc", "Actor._worker_rpc"),
    ("actor", "_io_loop", "Actor._io_loop"),
    ("client", "_send_to_scheduler", "Client._send_to_scheduler"),
])
def test_a_missing_private_part_fails_init_naming_it_and_the_range(fresh_runtime, monkeypatch,
                                                                   owner, name, part):
    from distributed.actor import Actor

    monkeypatch.delattr(Actor if owner == "actor" else distributed.Client, name)
    with pytest.raises(ImportError) as caught:
        lightwork.init(address=NOWHERE)
    message = str(caught.value)
    assert part in message and f"{cluster_compat.OLDEST} to " in message
    assert distributed.__version__ in message and "pip install" in message
    assert not lightwork.is_initialized()


def test_an_attribute_no_longer_set_by_the_actor_proxy_is_found_from_its_code(monkeypatch):
    from distributed.actor import Actor

    def bare_init(self, cls, address, key, worker=None):
        self.key = key  # does not set _address

    monkeypatch.setattr(Actor, "__init__", bare_init)
    assert cluster_compat.missing_parts(distributed) == ["Actor._address"]


def test_no_private_client_stream_handler_is_relied_on():
    """Tasks lost with their worker are heard through a scheduler plugin and a topic
    (cluster_plugin.TaskErrors), not the client's private task-erred handler."""
    assert not [name for name, _use in cluster_compat.PRIVATE_PARTS if "task-erred" in name]
    assert [name for name, _use in cluster_compat.PRIVATE_PARTS] == [
        "Client._send_to_scheduler", "Actor._worker_rpc", "Actor._io_loop", "Actor._address"]


def test_a_distributed_older_than_the_oldest_supported_is_refused(fresh_runtime, monkeypatch):
    monkeypatch.setattr(distributed, "__version__", "2024.6.2")
    with pytest.raises(ImportError, match=f"needs distributed {cluster_compat.OLDEST} to .*"
                       "this is distributed 2024.6.2"):
        lightwork.init(address=NOWHERE)
    assert not lightwork.is_initialized()


def test_versions_compare_by_number():
    older, oldest, newer = (cluster_compat._version_tuple(v)
                            for v in ("2024.9.0", "2024.11.1", "2025.1.0rc1"))
    assert older < oldest < newer
