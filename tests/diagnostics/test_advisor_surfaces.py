"""Where the advisor's findings show: the timeline, ``lightwork advise`` and the demo.

* the trace of a program with a mistake has an ``advice: <kind>`` instant on the
  driver's events row, with the finding's title, evidence, fix and call site;
* the trace file carries the log as the advisor reads it, so ``lightwork advise FILE``
  finds the same mistake offline (also checked without processes, on made-up records);
* ``lightwork advise`` asks a running driver (another process) for its findings;
* ``python -m lightwork demo`` runs end to end and names the loop experiments' mistakes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests import helpers
import pytest
from tests.diagnostics.test_timeline import load_trace

import lightwork
from lightwork.kernel.events import DriverSpan, TaskRecord  # the advisor's input, by hand
from lightwork.diagnostics.advisor import Advisor, Finding, analyse
from lightwork.diagnostics.timeline import EVENTS_TID

pytestmark = pytest.mark.lightwork_only


@lightwork.remote
def sleeper(seconds):
    import time

    time.sleep(seconds)
    return seconds


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(number for number, line in enumerate(f, 1) if text in line)


def _advice(events, kind):
    return [e for e in events if e["ph"] == "i" and e["name"] == f"advice: {kind}"]


def _get_in_a_loop() -> None:
    for _ in range(5):
        lightwork.get(sleeper.remote(0.05))  # the mistake


@pytest.mark.parametrize("advisor", [True, False], ids=["live-advisor", "advisor-off"])
def test_the_trace_shows_the_finding_where_it_was_seen(fresh_runtime, tmp_path, advisor):
    lightwork.init(num_cpus=2, advisor=advisor)
    _get_in_a_loop()
    path = str(tmp_path / "trace.json")
    lightwork.timeline(path)
    events = load_trace(path)

    [instant] = _advice(events, "get-in-loop")
    driver = next(e["pid"] for e in events if e["ph"] == "X" and e["name"] == "get")
    assert (instant["pid"], instant["tid"], instant["s"]) == (driver, EVENTS_TID, "t")
    args = instant["args"]
    assert args["kind"] == "get-in-loop" and "get() waited" in args["title"]
    assert args["evidence"]["gets_in_a_row"] >= 4
    assert "submit all" in args["suggestion"]
    assert args["callsite"] == f"{__file__}:{_line_of('# the mistake')} in _get_in_a_loop"
    # Seen once four gets in a row had happened: after the fourth get, not at the end.
    gets = sorted(e["ts"] + e["dur"] for e in events if e["ph"] == "X" and e["name"] == "get")
    assert gets[3] <= instant["ts"]
    if not advisor:  # the one-off analysis replays the log: seen by the fifth get's end
        assert instant["ts"] <= gets[4] + 0.01  # µs, as both were rounded to ns
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[(driver, EVENTS_TID)] == "events"

    with open(path) as f:
        other = json.load(f)["otherData"]
    data = other["advisor_input"]
    assert data["cpus"] == 2 and data["cores"] == os.cpu_count()
    assert len(data["tasks"]) == 5 and data["tasks"][0]["callsite"][1] == _line_of("# the mistake")
    assert {f["kind"] for f in other["findings"]} >= {"get-in-loop"}
    assert "get-in-loop" in {f.kind for f in analyse(data)}
    if advisor and os.path.exists("/proc/stat"):
        # The machine's idle time as the live advisor sampled it, for wait-for-slowest.
        times = [at for at, _ in data["machine"]]
        assert len(times) >= 2 and times == sorted(times)


def test_offline_analysis_of_plain_records_needs_no_runtime():
    # A driver at t=100 that gets each task's result before submitting the next.
    tasks, spans, t = [], [], 100.0
    for task_id in range(1, 6):
        tasks.append(TaskRecord(
            task_id, "work", 0, t, worker_id=1, deps_ready=t, dispatched=t, started=t,
            args_loaded=t, finished=t + 0.1, stored=t + 0.1, seen=t + 0.1, state="FINISHED",
            callsite=("prog.py", 7, "main")))
        spans.append(DriverSpan("get", t, t + 0.1, 1, 1, first_task_id=task_id,
                                callsite=("prog.py", 7, "main")))
        t += 0.1
    advisor = Advisor(cpus=4, cores=4)
    advisor.feed(tasks, spans)
    [finding] = advisor.findings
    assert finding.kind == "get-in-loop" and finding.callsite == ("prog.py", 7, "main")
    assert 100.4 - 1e-9 <= finding.seen_at <= 100.5 + 1e-9  # the log time, not now
    assert advisor.step() is None  # no runtime to look at: nothing happens

    # The same records as plain JSON (what a timeline file carries) give the same finding.
    plain = {"cpus": 4, "cores": 4, "started_at": 99.0, "init_callsite": None,
             "tasks": [r.as_dict() for r in tasks],
             "spans": [{"kind": s.kind, "start": s.start, "end": s.end, "object_count": 1,
                        "thread_id": 1, "first_task_id": s.first_task_id,
                        "callsite": list(s.callsite)} for s in spans]}
    [again] = analyse(json.loads(json.dumps(plain)))
    assert again.as_dict() == finding.as_dict()
    assert Finding.from_dict(json.loads(json.dumps(finding.as_dict()))) == finding

    # More slots than cores: found from CPU-bound tasks that shared the cores, at the
    # log time the advisor saw them end (not at init, and not for tasks that wait).
    spinning = [TaskRecord(i, "spin", 0, 200.0, worker_id=i, started=200.0,
                           args_loaded=200.0, finished=201.0, stored=201.0, seen=201.0,
                           state="FINISHED", cpu_time=0.5).as_dict() for i in range(10, 14)]
    [slots] = analyse({**plain, "cpus": 8, "cores": 2, "tasks": spinning, "spans": []})
    assert slots.kind == "fewer-slots" and slots.evidence["tasks_at_once"] > 2
    assert slots.seen_at == 201.0
    sleeping = [dict(record, cpu_time=0.001) for record in spinning]
    assert analyse({**plain, "cpus": 8, "cores": 2, "tasks": sleeping, "spans": []}) == []
    with pytest.raises(TypeError, match="cpus="):
        Advisor()


DRIVER = """
import os, sys, time
import lightwork
from tests import support

lightwork.init(num_cpus=2)

@lightwork.remote
def step(x):
    time.sleep(0.05)
    return x

for i in range(5):
    lightwork.get(step.remote(i))  # get in a loop
gate = sys.argv[1]
print("SOCKET", os.path.join(support.session_directory(), "control.sock"), flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
lightwork.shutdown()
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def session():
    info = helpers.start_session_driver(DRIVER)
    with open(info["script"]) as f:
        info["line"] = next(n for n, text in enumerate(f, 1) if "# get in a loop" in text)
    yield info
    helpers.stop_session_driver(info)


def run(env, *args):
    return subprocess.run([sys.executable, "-m", "lightwork", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_advise_a_running_session_and_its_saved_timeline(session, tmp_path):
    where = f"{session['script']}:{session['line']} in <module>"
    done = run(session["env"], "advise")
    assert done.returncode == 0, done.stderr
    assert "from its advisor" in done.stdout
    assert "[get-in-loop]" in done.stdout and where in done.stdout
    assert "fix: submit all the tasks first" in done.stdout

    as_json = run(session["env"], "advise", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    [finding] = [f for f in json.loads(as_json.stdout) if f["kind"] == "get-in-loop"]
    assert finding["callsite"] == [session["script"], session["line"], "<module>"]
    assert finding["evidence"]["gets_in_a_row"] >= 4

    path = str(tmp_path / "saved.json")
    assert run(session["env"], "timeline", "--output", path).returncode == 0
    offline = run(session["env"], "advise", path)
    assert offline.returncode == 0, offline.stderr
    assert "5 task records" in offline.stdout
    assert "[get-in-loop]" in offline.stdout and where in offline.stdout
    offline_json = json.loads(run(session["env"], "advise", path, "--format", "json").stdout)
    assert "get-in-loop" in {f["kind"] for f in offline_json}


def test_advise_exit_codes(session, tmp_path):
    nobody = dict(session["env"], TMPDIR=str(tmp_path))
    done = run(nobody, "advise")
    assert done.returncode == 1 and "no running lightwork session" in done.stderr
    missing = run(nobody, "advise", str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and "cannot read the timeline file" in missing.stderr
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"traceEvents": [], "otherData": {}}))
    done = run(nobody, "advise", str(foreign))
    assert done.returncode == 2 and "carries no advisor input" in done.stderr


@pytest.mark.timeout(240)  # the demo runs ~10 s on 2 quiet cores; a loaded CI machine is slower
def test_the_demo_runs_end_to_end(tmp_path):
    out_dir = tmp_path / "demo"
    command = [sys.executable, "-m", "lightwork", "demo", "--output-dir", str(out_dir)]
    done = subprocess.run(command, env=helpers.script_env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    for experiment in ("ex1", "ex2", "ex3"):
        assert f"\n{experiment} " in text
    assert "what the advisor found" in text
    assert "ex1   [get-in-loop]" in text and "ex3   [serial-driver]" in text
    assert "in ex1: results.append(ray.get(func.remote()))" in text
    assert "in ex3: results.append(func.remote())" in text
    assert "AdviceWarning:" not in done.stderr  # printed once, by the demo, not warned again

    timeline_file = out_dir / "lightwork-demo-timeline.json"
    assert f"{timeline_file}" in text and timeline_file.exists()
    events = load_trace(str(timeline_file))
    assert _advice(events, "get-in-loop") and _advice(events, "serial-driver")

    profile = out_dir / "lightwork-demo-dask-profile.html"
    try:
        import bokeh  # noqa: F401
        import dask.array  # noqa: F401
    except ImportError:
        assert "skipped" in text and "pip install" in text
    else:
        assert "q.dot(r) equals a: True" in text
        assert f"{profile}" in text and profile.exists()
        assert "bokeh" in profile.read_text()[:5000].lower()
    assert list(tmp_path.iterdir()) == [out_dir]  # nothing written outside --output-dir
