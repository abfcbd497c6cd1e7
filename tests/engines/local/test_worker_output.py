"""What tasks and actor methods print reaches the driver's terminal, labelled with the
call and the worker's pid, in the order each worker wrote it; ``log_to_driver=False``
keeps it off the terminal. Real driver programs in subprocesses."""

from __future__ import annotations

import io
import re
import threading

import pytest

from tests import helpers

pytestmark = pytest.mark.lightwork_only

LABEL = re.compile(r"^\((?P<name>[\w.]+) pid=(?P<pid>\d+)\) (?P<text>.*)$")

PROGRAM = """
import logging, sys
import lightwork as ray
ray.init(num_cpus=2{options})

@ray.remote
def speak(i):
    print("hello from task", i)
    logging.warning("warn from task %d", i)
    print("to stderr", i, file=sys.stderr)
    print("partial", i, end="")
    return i

@ray.remote
class Greeter:
    def hi(self):
        print("actor says hi")
        return "hi"

print("results", ray.get([speak.remote(0), speak.remote(1)]), flush=True)
print("actor", ray.get(Greeter.remote().hi.remote()), flush=True)
"""


def labelled(text: str) -> list[tuple[str, int, str]]:
    found = [LABEL.match(line) for line in text.splitlines()]
    return [(m["name"], int(m["pid"]), m["text"]) for m in found if m]


def run(tmp_path, body: str):
    done = helpers.run_script(helpers.write_script(str(tmp_path), "driver.py", body))
    assert done.returncode == 0, done.stderr
    return done


def test_lines_are_labelled_in_order_with_stderr_and_logging(tmp_path):
    done = run(tmp_path, PROGRAM.format(options=""))
    out, err = labelled(done.stdout), labelled(done.stderr)
    for i in (0, 1):
        pid = next(pid for name, pid, text in out if text == f"hello from task {i}")
        assert [t for n, p, t in out if p == pid and n == "speak"] == [
            f"hello from task {i}", f"partial {i}"]  # the partial line, flushed alone
        assert [t for n, p, t in err if p == pid] == [
            f"WARNING:root:warn from task {i}", f"to stderr {i}"]
    assert [n for n, p, t in out if t == "actor says hi"] == ["Greeter.hi"]
    # Printed before each result was returned, so before the driver's own next line.
    lines = done.stdout.splitlines()
    assert max(i for i, line in enumerate(lines) if "partial" in line) < \
        lines.index("results [0, 1]") < lines.index("actor hi")
    assert lines.index("actor hi") > next(i for i, line in enumerate(lines) if "actor says" in line)


def test_log_to_driver_false_keeps_it_off_the_terminal(tmp_path):
    done = run(tmp_path, PROGRAM.format(options=", log_to_driver=False"))
    assert "results [0, 1]" in done.stdout and "actor hi" in done.stdout
    assert "hello" not in done.stdout and "warn" not in done.stderr, done.stderr


def test_a_task_that_prints_then_fails_still_shows_its_lines(tmp_path):
    done = run(tmp_path, """
import lightwork as ray
ray.init(num_cpus=1)

@ray.remote(max_retries=0)
def doomed():
    print("last words")
    raise ValueError("on purpose")

try:
    ray.get(doomed.remote())
except ValueError:
    print("caught", flush=True)
""")
    lines = done.stdout.splitlines()
    assert [t for n, p, t in labelled(done.stdout)] == ["last words"]
    assert lines.index("caught") > 0


def test_huge_and_binary_output(tmp_path):
    done = run(tmp_path, """
import sys
import lightwork as ray
ray.init(num_cpus=1)

@ray.remote
def loud():
    for i in range(20000):
        print("line", i)
    print("x" * 200_000)
    sys.stdout.buffer.write(b"bad \\xff\\xfe bytes\\n")
    return "ok"

print("result", ray.get(loud.remote()), flush=True)
""")
    out = labelled(done.stdout)
    texts = [t for n, p, t in out]
    assert texts[:20000] == [f"line {i}" for i in range(20000)]
    assert len(texts[20000]) <= (1 << 16) + 10  # a huge line is cut, not kept whole
    assert "bad \\xff\\xfe bytes" in texts
    assert done.stdout.splitlines()[-1] == "result ok"


def test_the_driver_keeps_a_bounded_log_per_call():
    """The driver's end alone, with injected streams: labels, streams, and bounds."""
    import io

    from lightwork.engines.local import output

    out, err = io.StringIO(), io.StringIO()
    kept = output.DriverOutput(stdout=out, stderr=err)
    kept.receive(3, 77, [(output.STDOUT, 5, "f", "one"), (output.STDERR, 5, "f", "two")])
    kept.settle()  # (printed by the writer thread)
    assert out.getvalue() == "(f pid=77) one\n" and err.getvalue() == "(f pid=77) two\n"
    [task] = kept.query(task=5)
    assert task["lines"] == [["stdout", "one"], ["stderr", "two"]] and task["worker_id"] == 3
    many = [(output.STDOUT, 6, "g", f"line {i}") for i in range(output.LINES_PER_TASK + 5)]
    kept.receive(3, 77, many)
    [task] = kept.query(function="g")
    assert task["dropped"] == 5 and task["lines"][0] == ["stdout", "line 5"]
    for task_id in range(100, 100 + output.TASKS_KEPT + 10):
        kept.receive(4, 78, [(output.STDOUT, task_id, "h", "x")])
    assert len(kept.tasks) == output.TASKS_KEPT and not kept.query(task=5)
    assert kept.size == sum(len(t) for e in kept.tasks.values() for _s, t in e.lines)
    quiet = output.DriverOutput(echo=False, stdout=out, stderr=err)
    quiet.receive(1, 2, [(output.STDOUT, 9, "q", "not shown")])
    quiet.settle()
    assert "not shown" not in out.getvalue() and quiet.query(worker=1)
    kept.close()
    quiet.close()


class StuckTerminal(io.StringIO):
    """A driver's stdout that takes nothing until ``release`` is set (a paused terminal)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writes = 0

    def write(self, text):
        self.writes += 1
        self.release.wait()
        return super().write(text)


def test_a_stuck_terminal_never_holds_up_the_caller_of_receive():
    """``receive`` runs under the node lock: it must hand lines over, not print them."""
    from lightwork.engines.local import output

    stuck = StuckTerminal()
    kept = output.DriverOutput(stdout=stuck, stderr=stuck)
    for batch in range(50):  # the writer is stuck on the first line from here on
        done = threading.Event()
        receiving = threading.Thread(target=lambda b=batch: (kept.receive(
            1, 7, [(output.STDOUT, b, "f", f"line {b}.{i}") for i in range(20)]), done.set()))
        receiving.start()
        assert done.wait(helpers.HANG_LIMIT_S), "receive waited for the terminal"
        receiving.join()
    assert stuck.writes == 1 and kept.written == 0 and kept.queued == 1000
    assert kept.query(task=49)[0]["lines"][-1] == ["stdout", "line 49.19"]  # kept at once
    kept.settle(timeout=0.2)  # the caller's get: waits once, a little, then gives up ...
    assert kept.written == 0
    kept.receive(1, 7, [(output.STDOUT, 50, "f", "one more")])
    waited = threading.Thread(target=kept.settle)  # ... and is not held again meanwhile
    waited.start()
    waited.join(helpers.HANG_LIMIT_S)
    assert not waited.is_alive()
    stuck.release.set()
    kept.close(timeout=helpers.HANG_LIMIT_S)
    printed = stuck.getvalue().splitlines()
    assert printed == [f"(f pid=7) line {b}.{i}" for b in range(50) for i in range(20)] + [
        "(f pid=7) one more"]
    assert kept.written == kept.queued == 1001


def test_a_full_queue_drops_lines_from_the_terminal_and_says_how_many(monkeypatch):
    from lightwork.engines.local import output
    from lightwork.kernel import driver_output

    monkeypatch.setattr(driver_output, "MAX_QUEUED_CHARS", 100)
    stuck = StuckTerminal()
    kept = output.DriverOutput(stdout=stuck, stderr=stuck)
    kept.receive(1, 7, [(output.STDOUT, 1, "f", "x" * 20) for _ in range(10)])
    assert kept.queued < 10 and len(kept.query(task=1)[0]["lines"]) == 10
    kept.say(output.STDERR, "lightwork: a call paused")  # the driver's own: never dropped
    stuck.release.set()
    kept.settle(timeout=helpers.HANG_LIMIT_S)  # the queue drained: room again
    kept.receive(1, 7, [(output.STDOUT, 1, "f", "after")])
    kept.close(timeout=helpers.HANG_LIMIT_S)
    text = stuck.getvalue()
    assert "lines of worker output were not printed" in text and text.endswith("after\n")
    assert "lightwork: a call paused\n" in text


def test_a_driver_whose_terminal_takes_nothing_still_finishes_its_tasks(tmp_path):
    """The driver's stdout is a pipe nobody reads (a stuck terminal): its workers print
    far more than the pipe holds, and the tasks, their results and the driver's own
    bookkeeping still go on (they are written to a file here, not to stdout)."""
    import subprocess
    import sys
    import time

    marker = tmp_path / "progress.txt"
    script = helpers.write_script(str(tmp_path), "driver.py", f"""
import lightwork as ray
ray.init(num_cpus=2)

@ray.remote
def loud(i):
    for k in range(2000):
        print("task", i, "line", k, "x" * 60)
    return i

with open({str(marker)!r}, "w") as progress:
    for round in range(3):
        results = ray.get([loud.remote(round * 4 + i) for i in range(4)])
        print("round", round, results, file=progress, flush=True)
ray.shutdown()
with open({str(marker)!r}, "a") as progress:
    print("shut down", file=progress, flush=True)
""")
    driver = subprocess.Popen([sys.executable, script], env=helpers.script_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + helpers.HANG_LIMIT_S * 2  # (within the test timeout)
        while "shut down" not in (marker.read_text() if marker.exists() else ""):
            assert driver.poll() is None, "the driver exited early"
            assert time.monotonic() < deadline, (
                "a stuck terminal held the runtime up: " + (
                    marker.read_text() if marker.exists() else "no round finished"))
            time.sleep(0.1)
        assert marker.read_text().splitlines()[:3] == [
            f"round {r} {[r * 4 + i for i in range(4)]}" for r in range(3)]
        printed = driver.communicate(timeout=helpers.HANG_LIMIT_S * 2)[0].decode()
    finally:
        driver.kill()
        driver.wait()
    # What the terminal could not take in time is dropped from it (and said), never
    # reordered: each task's lines that were printed are in the order it wrote them.
    by_task: dict[str, list[int]] = {}
    for _name, _pid, text in labelled(printed):
        if text.startswith("task "):
            words = text.split()
            by_task.setdefault(words[1], []).append(int(words[3]))
    assert by_task and all(lines == sorted(lines) for lines in by_task.values())
