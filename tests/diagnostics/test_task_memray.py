"""profile_tasks(memory="memray"): memray captures of every worker, by task function.

A task that holds a known block while it runs must show it at its worker's peak, under
its own function and line; a task that keeps a block each call must show what it kept
still allocated at the end; an actor method is labelled with its class. The flame graph
is memray's page, self-contained. The tracker ends with the profile, and a program
without memray is told what to install.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests import helpers
import lightwork
from lightwork.diagnostics.task_profiler import profile_tasks

pytestmark = pytest.mark.lightwork_only
memray = pytest.importorskip("memray")

MB = 1 << 20
_kept: list[bytearray] = []


@lightwork.remote
def holds() -> int:
    block = bytearray(24 * MB)  # the line to find at the peak
    time.sleep(0.02)
    return len(block)


@lightwork.remote
def keeps() -> int:
    _kept.append(bytearray(3 * MB))  # the line to find among what is left
    return len(_kept)


@lightwork.remote
class Cache:
    def fill(self) -> int:
        self.rows = [bytearray(MB) for _ in range(6)]
        return len(self.rows)


@lightwork.remote
def tracker_free(path: str) -> bool:
    """Whether this worker can start a tracker of its own (memray allows one at a time)."""
    if os.path.exists(path):
        os.unlink(path)
    with memray.Tracker(path):
        pass
    return True


def line_of(text: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


def sizes(stacks, label, function):
    return sum(size for stack_label, frames, size, _n in stacks
               if stack_label == label and any(f[0] == function and f[1] == __file__
                                               for f in frames))


def test_allocations_show_under_their_task_function(two_cpus, tmp_path):
    cache = Cache.remote()
    lightwork.get([holds.remote() for _ in range(2)] + [cache.fill.remote()])
    with profile_tasks(memory="memray") as prof:
        lightwork.get([holds.remote() for _ in range(4)] + [keeps.remote() for _ in range(4)]
                      + [cache.fill.remote()])
    workers = prof.memray["workers"]
    assert len(workers) >= 2 and not any(w["error"] for w in workers), workers
    peak = prof.memray_stacks()
    held = [(frames, size) for label, frames, size, _n in peak if label == "holds"]
    assert held, peak
    assert any(frames[0] == ("holds", __file__, line_of("bytearray(24 * MB)"))
               and size >= 24 * MB for frames, size in held), held
    assert sizes(peak, "Cache.fill", "fill") >= 6 * MB, peak
    assert all(not frames[-1][1].startswith(os.path.dirname(lightwork.__file__))
               for _l, frames, _s, _n in peak), "the runtime's own frames are left out"
    left = prof.memray_stacks(leaks=True)
    kept = [(frames, size) for label, frames, size, _n in left if label == "keeps"]
    assert sum(size for _f, size in kept) >= 4 * 3 * MB, left
    assert kept[0][0][0] == ("keeps", __file__, line_of("_kept.append(bytearray"))
    assert sizes(left, "holds", "holds") < MB, "a block freed in the call is not left"

    page = prof.memray_flamegraph(str(tmp_path / "memory.html"))
    text = open(page).read()
    assert "holds" in text and "Cache.fill" in text
    assert not re.search(r"<script[^>]+src=\"https?:", text), "it opens offline"
    # The trackers ended with the profile: every worker may start one again.
    path = str(tmp_path / "after.bin")
    assert lightwork.get([tracker_free.remote(path + str(i)) for i in range(4)]) == [True] * 4


def test_memray_missing_or_misnamed_says_what_to_do(two_cpus, monkeypatch):
    with pytest.raises(ValueError, match="memory must be True"):
        with profile_tasks(memory="memrey"):
            pass
    with pytest.raises(ValueError, match="profile hook"):  # cProfile's and memray's
        with profile_tasks(mode="cprofile", memory="memray"):
            pass
    monkeypatch.setitem(sys.modules, "memray", None)  # import memray raises ImportError
    with pytest.raises(ImportError, match=r"lightwork\[profile\]"):
        with profile_tasks(memory="memray"):
            pass
    with profile_tasks() as prof:  # nothing was left running
        lightwork.get(keeps.remote())
    with pytest.raises(ValueError, match="memory=\"memray\""):
        prof.memray_stacks()


DRIVER = """
import os, sys
import lightwork
from tests import support
from tests.diagnostics.test_task_memray import holds

lightwork.init(num_cpus=2)
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    lightwork.get([holds.remote() for _ in range(4)])
lightwork.shutdown()
print("DONE", flush=True)
"""


def test_cli_writes_a_memory_flame_graph_of_a_running_program(tmp_path):
    info = helpers.start_session_driver(DRIVER)
    try:
        page = tmp_path / "memory.html"
        done = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "1", "--memray",
             str(page)], env=info["env"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "memory flame graph of 2 workers'" in done.stdout, done.stdout
        assert "holds" in page.read_text()
        both = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "1", "--memray",
             str(page), "--mode", "cprofile"], env=info["env"], capture_output=True,
            text=True, timeout=60)
        assert both.returncode != 0 and "--memray" in both.stderr
    finally:
        helpers.stop_session_driver(info)
