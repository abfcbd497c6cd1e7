"""profile_tasks(lines=[...]): line_profiler's timings of chosen functions, in the workers.

A helper called by tasks on both workers (and by an actor's method) must show every
call's hits on each of its lines, added up over the workers, and print as
line_profiler prints; the first call on each worker counts too (the function arrives
with the task that calls it). From another terminal, ``lightwork profile --lines``
names the functions instead, against a running program.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from tests import helpers
import lightwork
from lightwork.diagnostics.task_profiler import profile_tasks

pytest.importorskip("line_profiler")  # the `profile` extra (it is in `test` as well)

pytestmark = pytest.mark.lightwork_only


def helper(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


@lightwork.remote
def task(n: int) -> int:
    return helper(n) + helper(2 * n)


@lightwork.remote
class Caller:
    def call(self, n: int) -> int:
        return helper(n)


def scale(value: int, factor: int) -> int:
    return value * factor


@lightwork.remote
def scaled_sum(values: list[int], factor: int) -> int:
    return sum(scale(value, factor) for value in values)


def hits_of(printed: str, source: str) -> int:
    """The hits line_profiler printed for the line whose source is ``source``."""
    [row] = [line for line in printed.splitlines() if line.strip().endswith(source)]
    return int(re.split(r"\s+", row.strip())[1])


def hits(prof, name: str) -> dict[int, int]:
    """{line offset from the def: hits} of one function."""
    [(first, rows)] = [(first, rows) for _f, first, fname, rows in prof.line_timings["timings"]
                       if fname.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]]
    return {line - first: h for line, h, _t in rows}


def test_every_call_on_every_worker_is_timed_by_line(two_cpus):
    caller = Caller.remote()
    with profile_tasks(lines=[helper, task, Caller.call]) as prof:
        pids = lightwork.get([task.remote(50) for _ in range(10)])
        lightwork.get([caller.call.remote(20) for _ in range(3)])
    assert pids
    by_line = hits(prof, "helper")
    assert by_line[1] == 10 * 2 + 3  # `total = 0`: once a call
    assert by_line[4] == 10 * 2 + 3  # `return total`
    assert by_line[3] == 10 * (50 + 100) + 3 * 20  # the loop's body
    assert hits(prof, "task")[2] == 10  # (its first line is its decorator)
    assert hits(prof, "Caller.call")[1] == 3
    out = io.StringIO()
    prof.print_lines(stream=out)
    printed = out.getvalue()
    assert "Timer unit:" in printed and "Line #      Hits" in printed
    assert "total += i" in printed and "Function: helper" in printed


def test_bad_line_targets_say_what_to_give(two_cpus):
    with pytest.raises(TypeError, match="a list of functions"):
        with profile_tasks(lines=helper):
            pass
    with pytest.raises(TypeError, match="cannot time 3 by line"):
        with profile_tasks(lines=[3]):
            pass
    with pytest.raises(ValueError, match="lines must be a list"):
        lightwork.state.query("sample_start", lines="helper")
    with profile_tasks() as prof:
        lightwork.get(task.remote(1))
    with pytest.raises(ValueError, match="no line timings"):
        prof.print_lines()


DRIVER = """
import os, sys
import lightwork
from tests import support
from tests.diagnostics.test_task_lines import scaled_sum

lightwork.init(num_cpus=2)
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
gate = sys.argv[1]
while not os.path.exists(gate):
    lightwork.get([scaled_sum.remote(list(range(200)), 2) for _ in range(4)])
lightwork.shutdown()
print("DONE", flush=True)
"""


def test_cli_times_named_functions_of_a_running_program():
    info = helpers.start_session_driver(DRIVER)
    try:
        def profile(*names):
            done = subprocess.run(
                [sys.executable, "-m", "lightwork", "profile", "--seconds", "1", "--lines",
                 *names], env=info["env"], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        printed = profile("scale", "test_task_lines.py:scaled_sum")
        assert "Function: scale at line" in printed and "Function: scaled_sum" in printed
        hits = hits_of(printed, "return value * factor")
        calls = hits_of(printed, "return sum(scale(value, factor) for value in values)")
        # Each call makes 200 calls of scale. A call already running on one of the two
        # workers when the profile began is counted from then on (scale's hits without the
        # call's own line), and one running when it ended up to then: so at most two
        # calls' worth off, either way, from 200 a counted call.
        assert calls > 0 and abs(hits - 200 * calls) <= 2 * 200, printed
        assert "no call of" in profile("tests.diagnostics.test_task_lines:nowhere")
        bad = subprocess.run(
            [sys.executable, "-m", "lightwork", "profile", "--seconds", "1", "--lines",
             "a b"], env=info["env"], capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "names such as" in bad.stderr
    finally:
        helpers.stop_session_driver(info)
