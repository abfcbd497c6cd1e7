"""The advisor's rules on records built by hand: the evidence each finding needs.

An offline ``Advisor(cpus=..., cores=...)`` analyses exactly the records it is fed, so
these tests pin down, without timing noise, what each rule may and may not conclude:
no finding from lightwork's own work, from a window too short to matter, from a CPU
figure no process can reach, or with a fix the runtime cannot carry out.
"""

from __future__ import annotations

import itertools

import pytest

from lightwork.kernel.events import DriverSpan, TaskRecord  # the advisor's input, by hand
from lightwork.diagnostics.advisor import Advisor

SITE = ("program.py", 10, "<module>")
T0 = 1000.0


def _task(task_id, submitted, started, finished, **fields):
    fields.setdefault("callsite", SITE)
    return TaskRecord(task_id, fields.pop("name", "f"), 0, submitted, started=started,
                      args_loaded=started, finished=finished, stored=finished,
                      seen=finished, state="FINISHED", **fields)


def _findings(records, spans=(), cpus=2, cores=2):
    advisor = Advisor(cpus=cpus, cores=cores)
    advisor.feed(list(records), list(spans))
    return advisor.findings


def _kinds(records, spans=(), **machine):
    return {finding.kind for finding in _findings(records, spans, **machine)}


def _serial_submissions(gap, run, copy_s=0.0, count=6):
    """``count`` tasks submitted ``gap`` apart, each running ``run`` at once."""
    return [
        _task(i + 1, T0 + i * gap, T0 + i * gap + copy_s, T0 + i * gap + copy_s + run,
              copy_s=copy_s)
        for i in range(count)
    ]


def test_driver_work_between_submissions_is_serial_driver():
    [finding] = _findings(_serial_submissions(gap=0.2, run=0.15))
    assert finding.kind == "serial-driver"
    assert finding.evidence["serial_s"] >= 0.8 - 1e-9  # four gaps of 0.2 s at least
    assert finding.evidence["slot_utilization"] < 0.6


def test_a_window_too_short_to_matter_is_not_reported():
    """Once fired on "0.00 s of 0.01 s"."""
    assert _kinds(_serial_submissions(gap=0.002, run=0.0005)) == set()


def test_lightwork_copying_big_arguments_is_not_the_drivers_work():
    """The gaps are .remote() copying a big argument: large-arg-repeated's business."""
    records = _serial_submissions(gap=0.2, run=0.05, copy_s=0.19)
    assert _kinds(records) == set()


def test_busy_slots_come_from_every_run_not_only_the_call_sites():
    """The π tutorial's shape: polls a second apart while two long tasks keep both
    slots busy: the driver's sleep cost nothing."""
    polls = [_task(10 + i, T0 + i, T0 + i + 0.001, T0 + i + 0.002, actor_id=1,
                   name="ProgressActor.get_progress") for i in range(5)]
    samplers = [_task(i, T0 - 0.01, T0, T0 + 4.5, callsite=("program.py", 5, "<module>"),
                      name="sampling_task") for i in (1, 2)]
    assert _kinds(polls + samplers) == set()


def test_calls_that_do_next_to_nothing_gain_nothing_from_being_submitted_first():
    """Polling a progress actor while one task keeps one of two slots busy: the slots
    are half idle, but submitting the polls earlier would not speed anything up."""
    polls = [_task(10 + i, T0 + i, T0 + i + 0.001, T0 + i + 0.002, actor_id=1,
                   name="ProgressActor.get_progress") for i in range(5)]
    sampler = _task(1, T0 - 0.01, T0, T0 + 4.5, callsite=("program.py", 5, "<module>"),
                    name="sampling_task")
    assert _kinds(polls + [sampler]) == set()
    assert _kinds(polls) == set()


def _get_chain(records, gap=0.0):
    """One blocked get of each record's result, from one line, as the records ran."""
    return [DriverSpan("get", r.submitted, r.finished + gap, 1, 1, first_object_id=r.task_id + 100,
                       callsite=("program.py", 20, "<module>"), first_task_id=r.task_id)
            for r in records]


def _one_at_a_time(count=6, run=0.1, **fields):
    records, now = [], T0
    for i in range(count):
        records.append(_task(i + 1, now, now + 0.001, now + 0.001 + run, **fields))
        now += run + 0.002
    return records


def test_independent_tasks_got_one_at_a_time_are_get_in_loop():
    records = _one_at_a_time()
    [finding] = _findings(records, _get_chain(records))
    assert finding.kind == "get-in-loop" and finding.evidence["gets_in_a_row"] >= 4
    assert 0.5 <= finding.evidence["idle_slots"] <= 1.0


def test_a_chain_of_dependent_steps_is_not_get_in_loop():
    """Each step takes the previous step's result by ref (the parameter server)."""
    records = _one_at_a_time()
    for previous, record in itertools.pairwise(records):
        record.dep_tasks = (previous.task_id,)
    assert _kinds(records, _get_chain(records)) == set()


def test_a_dependency_through_an_intermediate_task_is_found():
    records = _one_at_a_time()
    middle = []
    for n, (previous, record) in enumerate(itertools.pairwise(records)):
        gradient = _task(500 + n, record.submitted, record.submitted, record.submitted,
                         dep_tasks=(previous.task_id,), callsite=("program.py", 19, "<module>"))
        record.dep_tasks = (gradient.task_id,)
        middle.append(gradient)
    assert _kinds(records + middle, _get_chain(records)) == set()


def test_calls_on_one_actor_got_one_at_a_time_are_not_get_in_loop():
    records = _one_at_a_time(actor_id=7)
    assert _kinds(records, _get_chain(records)) == set()


def test_gets_while_other_work_keeps_the_slots_busy_are_not_get_in_loop():
    records = _one_at_a_time()
    background = _task(99, T0 - 0.01, T0, T0 + 1.0, callsite=("program.py", 3, "<module>"))
    assert _kinds(records + [background], _get_chain(records)) == set()


def _cpu_task(cpu_time, run=1.0, num_cpus=1.0):
    return _task(1, T0, T0, T0 + run, cpu_time=cpu_time, num_cpus=num_cpus)


def test_a_task_using_two_cores_on_one_cpu_is_oversubscription():
    [finding] = _findings([_cpu_task(1.9)], cpus=2, cores=2)
    assert finding.kind == "oversubscription"
    assert "num_cpus=2" in finding.suggestion


def test_no_oversubscription_beyond_the_machines_cores():
    """Once "14.4 cores" on a 2-core machine: not a measurement of the task."""
    assert _kinds([_cpu_task(14.4)], cpus=2, cores=2) == set()


def test_no_oversubscription_finding_whose_fix_the_runtime_cannot_run():
    """Advising num_cpus=4 to a runtime with 2 CPU slots would make the task infeasible."""
    assert _kinds([_cpu_task(3.8)], cpus=2, cores=8) == set()
    [finding] = _findings([_cpu_task(3.8)], cpus=4, cores=8)
    assert "num_cpus=4" in finding.suggestion


def test_overlapping_calls_of_a_threaded_actor_are_not_oversubscription():
    """Each call's process CPU time also counts the other calls running beside it."""
    calls = [_task(i, T0, T0, T0 + 1.0, cpu_time=1.9, actor_id=3) for i in (1, 2)]
    assert "oversubscription" not in _kinds(calls, cpus=2, cores=2)


def test_a_big_argument_is_the_same_only_while_it_is_the_same_object():
    """id() is reused by a new array made where the last one was freed: not the same."""
    np = pytest.importorskip("numpy")
    from lightwork.kernel.calls import large_arguments

    kept = np.ones(300_000)
    [(identity, size)] = large_arguments((kept,), {})
    assert large_arguments((), {"a": kept}) == ((identity, size),) and size == kept.nbytes
    identities = set()
    for seed in range(6):
        fresh = np.random.default_rng(seed).random(300_000)
        identities.add(large_arguments((fresh,), {})[0][0])
        del fresh  # the next array may well get this one's address
    assert len(identities) == 6
    data = b"x" * (2 << 20)  # no weak refs to bytes: the same object, the same content
    assert large_arguments((data,), {}) == large_arguments((data,), {})


def _actor_calls(count=10, run=0.06, deps_wait=True):
    """Calls on one actor, all submitted at T0, running back to back."""
    calls = []
    for i in range(count):
        ready = T0 + i * run
        calls.append(_task(i + 1, T0, ready, ready + run, actor_id=5,
                           deps_ready=ready if deps_wait else T0,
                           name="program.<locals>.Worker.step"))
    return calls


def test_calls_queued_behind_one_actor_are_actor_bottleneck():
    [finding] = _findings(_actor_calls(deps_wait=False))
    assert finding.kind == "actor-bottleneck" and "(Worker)" in finding.title


def test_calls_waiting_for_their_arguments_are_not_queued_on_the_actor():
    """A chain (each call takes the previous result): the wait is for the argument."""
    assert _kinds(_actor_calls(deps_wait=True)) == set()


# -- by-value chains: the source says whether the next call takes the last result ------
CHAIN_PROGRAMS = {
    # Each call needs the previous result: submitting first is impossible.
    "x = 0\nfor _ in range(8):\n    x = lightwork.get(step.remote(x))\n": True,
    "x = 0\nfor _ in range(8):\n    ref = step.remote(x)\n    x = lightwork.get(ref)\n": True,
    "x = 0\nfor _ in range(8):\n    y = lightwork.get(step.remote(x))\n    x = y * 0.9 + 1\n": True,
    "x = 0\nwhile x < 8:\n    ref = step.remote(\n        x)\n    x = lightwork.get(\n        ref)\n": True,
    "w = [0]\nfor _ in range(8):\n    w, loss = lightwork.get(step.remote(w))\n": True,
    "history = [0]\nfor _ in range(8):\n    history.append(ray.get(step.remote(history[-1])))\n": True,
    "class A:\n    def run(self):\n        for _ in range(8):\n"
    "            self.w = ray.get(step.remote(self.w))\n": True,
    "state = {}\nfor _ in range(8):\n    update(state, get(step.remote(state)))\n": True,
    # Independent calls, each got before the next is submitted: the classic mistake.
    "results = []\nfor i in range(8):\n    results.append(lightwork.get(step.remote(i)))\n": False,
    "total = 0\nfor i in range(8):\n    total += lightwork.get(step.remote(0.05))\n": False,
    "class A:\n    def run(self):\n        for i in range(8):\n"
    "            self.out.append(ray.get(step.remote(self.items[i])))\n": False,
    "for i in range(8):\n    value = ray.get(step.remote(i))\n    print(value)\n": False,
}


@pytest.mark.parametrize("source,dependent", CHAIN_PROGRAMS.items(),
                         ids=[f"program{n}" for n in range(len(CHAIN_PROGRAMS))])
def test_the_source_tells_a_by_value_chain_from_independent_calls(tmp_path, source, dependent):
    from lightwork.diagnostics._chains import feeds_next_call

    path = tmp_path / "program.py"
    path.write_text(source)
    lines = source.splitlines()
    submit = next(n for n, line in enumerate(lines, 1) if ".remote(" in line)
    get = next(n for n, line in enumerate(lines, 1) if "get(" in line)
    assert feeds_next_call((str(path), get, "f"), (str(path), submit, "f")) is dependent


def test_a_step_function_called_in_a_loop_is_followed_to_its_caller(tmp_path):
    from lightwork.diagnostics._chains import feeds_next_call

    step = "def step_once(x):\n    return ray.get(step.remote(x))\n"
    site = ("", 2, "step_once")
    path = tmp_path / "chain.py"
    path.write_text(step + "x = 0\nfor _ in range(8):\n    x = step_once(x) + 1\n")
    assert feeds_next_call((str(path), *site[1:]), (str(path), *site[1:])) is True
    path = tmp_path / "independent.py"
    path.write_text(step + "out = []\nfor i in range(8):\n    out.append(step_once(i))\n")
    assert feeds_next_call((str(path), *site[1:]), (str(path), *site[1:])) is False
    path = tmp_path / "helper.py"  # never called in a loop here: the source cannot say
    path.write_text(step)
    assert feeds_next_call((str(path), *site[1:]), (str(path), *site[1:])) is None


def test_without_a_loop_or_a_source_the_source_cannot_say(tmp_path):
    from lightwork.diagnostics._chains import feeds_next_call

    path = tmp_path / "helper.py"
    path.write_text("def step_once(x):\n    return ray.get(step.remote(x))\n")
    assert feeds_next_call((str(path), 2, "step_once"), (str(path), 2, "step_once")) is None
    missing = str(tmp_path / "gone.py")
    assert feeds_next_call((missing, 3, "f"), (missing, 3, "f")) is None
    path.write_text("for x in (:\n")  # not Python: no answer, no exception
    assert feeds_next_call((str(path), 1, "f"), (str(path), 1, "f")) is None


def _chain_records_at(path, get_line, submit_line):
    records = _one_at_a_time(callsite=(str(path), submit_line, "<module>"))
    spans = _get_chain(records)
    for span in spans:
        span.callsite = (str(path), get_line, "<module>")
    return records, spans


def test_a_by_value_chain_is_not_get_in_loop_and_independent_gets_still_are(tmp_path):
    """``x = get(f.remote(x))``: no ref links the steps, the source does."""
    chain = tmp_path / "chain.py"
    chain.write_text("x = 0\nfor _ in range(6):\n    x = ray.get(f.remote(x))\n")
    assert _kinds(*_chain_records_at(chain, 3, 3)) == set()
    independent = tmp_path / "independent.py"
    independent.write_text("out = []\nfor i in range(6):\n    out.append(ray.get(f.remote(i)))\n")
    assert _kinds(*_chain_records_at(independent, 3, 3)) == {"get-in-loop"}


# -- the driver's own work is its CPU time, not its wall time, nor lightwork's copying --
def _with_driver_busy(records, per_gap, cpu_share=1.0):
    """The main thread's time working at each submission: ``per_gap`` seconds per gap,
    ``cpu_share`` of it on a core (the rest waiting for one)."""
    for n, record in enumerate(records):
        record.driver_busy = 5.0 + n * per_gap
        record.driver_cpu = 3.0 + n * per_gap * cpu_share
    return records


def test_a_driver_computing_between_submissions_is_serial_driver_by_its_cpu_time():
    [finding] = _findings(_with_driver_busy(_serial_submissions(gap=0.2, run=0.15), 0.15))
    assert finding.kind == "serial-driver"
    # Four or five gaps (the replay checks as records arrive) of 0.15 s of CPU each,
    # not the 0.2 s of wall time each gap took.
    assert finding.evidence["serial_s"] in (pytest.approx(0.6), pytest.approx(0.75))


def test_a_sleeping_driver_is_not_serial_driver_work():
    """The gaps are the driver asleep (or blocked in I/O): its main thread used no CPU."""
    records = _with_driver_busy(_serial_submissions(gap=0.2, run=0.15), 0.001)
    assert _kinds(records) == set()


def test_a_driver_mostly_blocked_is_judged_by_the_time_it_worked():
    """0.04 s of work (running or waiting for a core) per 0.2 s gap, blocked the rest
    (reading a file, say): 0.2 s in all, below what is worth a finding; the wall time
    alone would have said 1 s."""
    records = _with_driver_busy(_serial_submissions(gap=0.2, run=0.15), 0.04)
    assert _kinds(records) == set()
    assert _kinds(_serial_submissions(gap=0.2, run=0.15)) == {"serial-driver"}


def test_big_puts_between_submissions_are_lightworks_copying_not_the_drivers_work():
    """``ref = put(big_array); f.remote(ref)`` in a loop: the gaps are put() copying."""
    records = _serial_submissions(gap=0.2, run=0.15)
    puts = [DriverSpan("put", r.submitted - 0.19, r.submitted - 0.001, 1, 1)
            for r in records[1:]]
    assert _kinds(records, puts) == set()
    # The same with the CPU the copies used on the main thread's clock.
    assert _kinds(_with_driver_busy(_serial_submissions(gap=0.2, run=0.15), 0.19), puts) == set()


# -- wait-for-slowest: a slow task's own work, not machine load -----------------------
def _one_slow_among_four(slow_cpu, typical_cpu=0.001):
    """Four tasks got at once; one runs 1.5 s, the others 0.05 s."""
    runs = [0.05, 0.05, 0.05, 1.5]
    records = [_task(i + 1, T0, T0 + 0.01, T0 + 0.01 + run,
                     cpu_time=slow_cpu if run > 1 else typical_cpu)
               for i, run in enumerate(runs)]
    span = DriverSpan("get", T0, T0 + 1.52, 4, 1, first_object_id=101,
                      callsite=("program.py", 30, "<module>"), first_task_id=1,
                      first_ready=T0 + 0.06, last_ready=T0 + 1.51, shortest=0.06, longest=1.51)
    return records, [span]


def _with_machine(advisor, idle_cores):
    for n in range(12):
        advisor.add_machine_sample(T0 - 0.5 + n * 0.25, 1000.0 + n * 0.25 * idle_cores)
    return advisor


def _slowest_kinds(slow_cpu, idle_cores=None, typical_cpu=0.001):
    advisor = Advisor(cpus=2, cores=2)
    if idle_cores is not None:
        _with_machine(advisor, idle_cores)
    advisor.feed(*_one_slow_among_four(slow_cpu, typical_cpu))
    return {finding.kind for finding in advisor.findings}


def test_a_slow_task_waiting_while_cores_sat_idle_was_slow_by_its_own_work():
    """A sleeping (or I/O-bound) slow task with idle cores around it: its own time."""
    assert _slowest_kinds(slow_cpu=0.002, idle_cores=1.4) == {"wait-for-slowest"}
    assert _slowest_kinds(slow_cpu=0.002) == {"wait-for-slowest"}  # offline: wall times


def test_a_slow_task_that_used_no_more_cpu_while_no_core_was_idle_may_be_load():
    """Equal work stretched by other programs on every core: wait() would not help."""
    assert _slowest_kinds(slow_cpu=0.002, idle_cores=0.1) == set()


def test_a_slow_task_that_computed_is_named_however_busy_the_machine_was():
    assert _slowest_kinds(slow_cpu=1.2, idle_cores=0.1) == {"wait-for-slowest"}
    # Every task got a tenth of a core (a loaded machine): the slow one did 30 times
    # the typical work, its own, though its CPU is a tenth of its extra time.
    assert _slowest_kinds(slow_cpu=0.15, idle_cores=0.0, typical_cpu=0.005) == {
        "wait-for-slowest"}
    # The same share, the same work as the others: kept off the cores, not its own.
    assert _slowest_kinds(slow_cpu=0.005, idle_cores=0.0, typical_cpu=0.005) == set()


def test_idle_cores_come_from_the_samples_around_the_run():
    advisor = _with_machine(Advisor(cpus=2, cores=2), idle_cores=1.5)
    assert advisor._idle_cores_between(T0, T0 + 1.0) == pytest.approx(1.5)
    assert advisor._idle_cores_between(T0 - 10, T0) is None  # before the first sample
    assert advisor._idle_cores_between(T0, T0 + 100) is None  # after the last


def test_the_drivers_busy_clock_counts_work_and_not_sleep():
    import time

    from lightwork.engines.local.driver_calls import _thread_cpu_and_busy_s

    def busy():
        cpu, busy = _thread_cpu_and_busy_s()
        assert busy >= cpu > 0
        return busy

    before = busy()
    deadline = time.thread_time() + 0.1
    while time.thread_time() < deadline:
        pass
    worked = busy() - before
    before = busy()
    time.sleep(0.3)
    slept = busy() - before
    assert worked >= 0.1 - 1e-3  # at least its CPU time (more if it waited for a core)
    assert slept < 0.15  # only the wake-up, however long the sleep


def test_a_driver_slowed_by_load_while_computing_is_still_serial_driver():
    """Other programs kept the driver off its core for most of each gap: its work took
    longer, it did not vanish; the tasks' work is set against it at full speed."""
    records = _with_driver_busy(_serial_submissions(gap=0.6, run=0.15), 0.59, cpu_share=0.25)
    [finding] = _findings(records)
    assert finding.kind == "serial-driver"


def test_calls_queued_on_each_of_several_busy_actors_are_no_bottleneck():
    """multiprocessing.Pool's map queues its chunks on every process at once: each
    actor has a queue, but every slot is busy."""
    first = _actor_calls(deps_wait=False)
    second = _actor_calls(deps_wait=False)
    for record in second:
        record.task_id += 100
        record.actor_id = 6
    assert _kinds(first + second) == set()
    assert _kinds(first) == {"actor-bottleneck"}


def test_a_saved_log_carries_the_machines_idle_time_to_the_offline_rules():
    from lightwork.diagnostics._measure import plain
    from lightwork.diagnostics.advisor import analyse

    records, spans = _one_slow_among_four(slow_cpu=0.002)
    data = {"cpus": 2, "cores": 2, "tasks": [plain(r) for r in records],
            "spans": [plain(s) for s in spans],
            "machine": [[T0 - 0.5 + n * 0.25, 1000.0 + n * 0.025] for n in range(12)]}
    assert analyse(data) == []  # 0.1 idle cores: the slow task may have been kept off them
    del data["machine"]  # a file from before the samples: the wall times decide
    assert [finding.kind for finding in analyse(data)] == ["wait-for-slowest"]


def _slowest_with_worker_waits(waited_during_run):
    advisor = _with_machine(Advisor(cpus=2, cores=2), idle_cores=0.0)  # no core idle
    records, spans = _one_slow_among_four(slow_cpu=0.002)
    slow = max(records, key=lambda r: r.finished - r.started)
    slow.worker_id = 4242
    for n in range(12):  # its worker's wait for a core, sampled every 0.25 s
        at = T0 - 0.5 + n * 0.25
        share = min(max(at - slow.started, 0.0), slow.finished - slow.started)
        advisor.add_worker_sample(4242, at, 7.0 + waited_during_run * share / 1.5)
    advisor.feed(records, spans)
    return {finding.kind for finding in advisor.findings}


def test_a_slow_task_whose_worker_did_not_wait_for_a_core_was_slow_by_its_own_work():
    """Every core busy, but its worker's own waits for a core were 0.05 s of 1.5 s: the
    task slept (or waited for I/O) by itself, so the finding stands."""
    assert _slowest_with_worker_waits(0.05) == {"wait-for-slowest"}


def test_a_slow_task_whose_worker_waited_for_a_core_was_kept_off_by_load():
    assert _slowest_with_worker_waits(1.2) == set()


def test_a_workers_wait_comes_from_its_own_samples():
    from lightwork.diagnostics.advisor import worker_waited_s

    advisor = Advisor(cpus=2, cores=2)
    for n in range(5):
        advisor.add_worker_sample(7, T0 + n, 1.0 + 0.1 * n)
    assert advisor._worker_waited_between(7, T0 + 1, T0 + 3) == pytest.approx(0.2)
    assert advisor._worker_waited_between(8, T0 + 1, T0 + 3) is None  # never sampled
    # A worker first sampled during the run: scaled from what the samples cover.
    assert advisor._worker_waited_between(7, T0 - 1, T0 + 3) == pytest.approx(0.3 * 4 / 3)
    assert advisor._worker_waited_between(7, T0 - 10, T0 + 3) is None  # too little covered
    import os

    if os.path.exists("/proc/self/schedstat"):
        assert worker_waited_s(os.getpid()) >= 0.0
    assert worker_waited_s(2 ** 22 + 12345) is None  # no such process


def test_tiny_tasks_message_is_true_for_runs_longer_than_the_overhead():
    # The rule fires below TINY_RATIO times the per-task overhead: a 90 µs median is
    # longer than the overhead, and the message must not say it is shorter.
    from lightwork.diagnostics._rules_load import TASK_OVERHEAD_S, TINY_MIN_TASKS

    records = [_task(i, 1.0 + i * 1e-3, 1.0 + i * 1e-3, 1.0 + i * 1e-3 + 90e-6)
               for i in range(TINY_MIN_TASKS)]
    [finding] = [f for f in _findings(records) if f.kind == "tiny-tasks"]
    assert finding.evidence["median_run_s"] == pytest.approx(90e-6)
    share = round(100 * TASK_OVERHEAD_S / (TASK_OVERHEAD_S + 90e-6))
    assert "run for 90.0 µs" in finding.title and f"about {share}% of the time" in (
        finding.title)
    assert "less than" not in finding.title
    # A task of no work at all: the overhead is all of its time.
    records = [_task(i, 1.0 + i * 1e-3, 1.0 + i * 1e-3, 1.0 + i * 1e-3 + 2e-7)
               for i in range(TINY_MIN_TASKS)]
    [finding] = [f for f in _findings(records) if f.kind == "tiny-tasks"]
    assert "about 100% of the time" in finding.title


def test_run_tally_sums_runs_as_it_would_one_run_at_a_time():
    # The advisor sums runs as their records end (RunTally, bucket by bucket), taking
    # the sums at each look; the figures must be those of adding each run on its own:
    # runs inside a bucket, across buckets, of actors (one slot) and of multi-CPU
    # tasks, and records that never ran; whether taken once or at every look.
    import random

    from lightwork.diagnostics._measure import RunTally, SlotTime

    rng = random.Random(7)
    records, at = [], 100.0
    for task_id in range(3000):
        at += rng.choice((2e-5, 1e-3, 0.03))
        run = rng.choice((1e-5, 4e-3, 0.12, 0.0))
        started = 0.0 if task_id % 97 == 0 else at
        records.append(_task(task_id, at, started, at + run,
                             actor_id=7 if task_id % 5 == 0 else 0,
                             num_cpus=rng.choice((0.5, 1.0, 2.0))))
    at_once, looked, one_by_one = SlotTime(), SlotTime(), SlotTime()
    tally = RunTally(at_once)
    tally.ended(records)
    tally.flush()
    live = RunTally()
    for look in range(0, len(records), 250):  # a look after every 250 records
        for read in range(look, look + 250, 50):  # ... of 5 reads of 50
            live.ended(records[read:read + 50])
        looked.merge(live.take())
    for record in records:
        if record.started and record.finished > record.started:
            slots = 1.0 if record.actor_id else max(1.0, record.num_cpus)
            one_by_one.add(record.started, record.finished, slots)
    for summed in (at_once, looked):
        assert set(summed.buckets) == set(one_by_one.buckets)
        for bucket, total in one_by_one.buckets.items():
            assert summed.buckets[bucket] == pytest.approx(total, rel=1e-9, abs=1e-12)
        assert summed.between(100.0, at + 1) == pytest.approx(
            one_by_one.between(100.0, at + 1), rel=1e-9)
    assert live.take() == {}  # nothing since the last take


def _ended(log, records):
    for record in records:
        log.finish_task(record)


def test_the_live_looks_sample_and_the_records_it_must_read():
    # The live look reads in full every stride-th record, standing for `stride` tasks,
    # and every other record with big arguments or a long run (from its arguments
    # loaded), counted already: the tally names those as they end, the log hands their
    # places over with the records.
    from lightwork.kernel.events import EventLog
    from lightwork.diagnostics._measure import RunTally, sample_places

    records = []
    for task_id in range(100):
        run = 0.02 if task_id in (13, 51) else 1e-4
        record = _task(task_id, 10.0 + task_id * 1e-3, 10.0 + task_id * 1e-3,
                       10.0 + task_id * 1e-3 + run,
                       large_args=((1, 10 << 20),) if task_id in (7, 20) else ())
        records.append(record)
    records[88].args_loaded = 0.0  # failed loading its arguments: a run from 0 is long
    log = EventLog(budget=1000)
    _ended(log, records[:5])  # before anyone watched: not handed out
    log.watch(RunTally(long_s=0.01).ended)
    _ended(log, records[5:])
    fresh = log.take_fresh()
    assert [r.task_id for r in fresh.records] == list(range(5, 100))
    assert [fresh.records[place].task_id for place in fresh.notable] == [7, 13, 20, 51, 88]
    picked = [(fresh.records[place].task_id, weight)
              for place, weight in sample_places(len(fresh.records), 10, fresh.notable)]
    # The last of the stride stands for the 5 records left (95 in all), not 10.
    assert picked == sorted([(i, 10) for i in range(5, 95, 10)] + [(95, 5)]
                            + [(7, 0), (13, 0), (20, 0), (51, 0), (88, 0)])
    assert sum(weight for _, weight in picked) == len(fresh.records)
    every = sample_places(len(fresh.records), 1, fresh.notable)
    assert every == [(place, 1) for place in range(95)]  # none twice
    assert log.take_fresh() == ([], [], [])


def test_records_the_ring_dropped_still_count_towards_how_busy_slots_were():
    # More tasks between two looks than the ring holds: the dropped records are
    # missed by the look (counted in missed_rows) but their runs were tallied as they
    # ended, and the places handed over are those of the records still in the ring.
    from lightwork.kernel.events import EventLog
    from lightwork.diagnostics._measure import RunTally, SlotTime

    records = [_task(i, 5.0 + i * 1e-3, 5.0 + i * 1e-3, 5.0 + i * 1e-3 + 1e-4,
                     large_args=((1, 10 << 20),) if i in (3, 45) else ())
               for i in range(50)]
    log, tally = EventLog(budget=20), RunTally(long_s=0.01)
    log.watch(tally.ended)
    _ended(log, records)
    fresh = log.take_fresh()
    assert log.missed_rows == 30 and len(fresh.records) == 20
    assert [fresh.records[place].task_id for place in fresh.notable] == [45]
    busy = SlotTime()
    busy.merge(tally.take())
    assert busy.between(4.0, 6.0) == pytest.approx(50 * 1e-4)


def test_the_compiled_tally_sums_and_names_what_the_python_one_does(monkeypatch):
    # RunTally.ended sums the common record in C (_collector's RunSummer) and hands the
    # rest to its Python loop; with or without the C, the buckets, the places named and
    # the running sums must agree, over runs that cross buckets, take several slots,
    # never ran, carry big arguments, run long, or hold a field that is not a float.
    import random

    from lightwork.diagnostics import _measure
    from lightwork.diagnostics._measure import RunTally

    rng = random.Random(20)
    records = []
    at = 100.0
    for task_id in range(3_000):
        at += rng.choice((1e-5, 1e-4, 0.003))
        run = rng.choice((2e-6, 5e-5, 0.004, 0.02, 0.08))
        record = _task(task_id, at, at, at + run)
        kind = rng.randrange(12)
        if kind == 0:
            record.num_cpus = 2.0
        elif kind == 1:
            record.actor_id, record.num_cpus = 7, 0.5
        elif kind == 2:
            record.started = record.args_loaded = 0.0  # it never ran
        elif kind == 3:
            record.large_args = ((1, 10 << 20),)
        elif kind == 4:
            record.args_loaded = 0  # an int, not a float: Python's to read
        records.append(record)
    reads = []
    while records:  # as the event log hands them over: a read's records at a time
        size = rng.randrange(1, 130)
        reads.append(records[:size])
        records = records[size:]

    def tally_all() -> tuple[dict[int, float], list[list[int]], float]:
        tally = RunTally(long_s=0.01)
        named = [tally.ended(read) for read in reads]
        tally.flush()
        return dict(tally.into.buckets), named, tally._summed

    monkeypatch.setattr(_measure, "_sum_runs", None)
    in_python = tally_all()
    monkeypatch.undo()
    compiled = tally_all()
    assert compiled[1] == in_python[1]  # the same places named, read by read
    assert sum(len(named) for named in compiled[1]) > 100
    assert compiled[0].keys() == in_python[0].keys()
    for bucket, seconds in in_python[0].items():
        assert compiled[0][bucket] == pytest.approx(seconds, rel=1e-9, abs=1e-12)
    if _measure._sum_runs is None:
        pytest.skip("lightwork._collector not built (LIGHTWORK_PURE_PYTHON): compared with itself")


def _fresh_runtime_loop(startup, count=6, gap=0.1, run=0.1, cpus=2):
    """A fresh runtime's serial-driver loop: ``count`` submissions ``gap`` apart (the
    driver computing between them), the first ``cpus`` tasks each sent to a worker that
    takes ``startup`` to start; the others wait for a free one, ``run`` each."""
    records, free = [], [T0 + startup] * cpus
    for i in range(count):
        submitted = T0 + i * gap
        slot = min(range(cpus), key=free.__getitem__)
        started = max(submitted, free[slot])
        record = _task(i + 1, submitted, started, started + run, worker_id=slot + 1)
        record.dispatched = submitted if i < cpus else started  # a new worker's first task
        free[slot] = started + run
        records.append(record)
    return _with_driver_busy(records, gap)


def test_worker_start_up_is_left_out_of_the_serial_driver_window():
    """Workers slow to start (a fork server importing the program's libraries) held
    every task until after the loop: the window the rule divides by was mostly start-up."""
    [finding] = _findings(_fresh_runtime_loop(startup=2.0))
    assert finding.kind == "serial-driver"
    assert finding.evidence["wall_s"] < 1.0  # not the 2.3 s that ended with the start-up
    # Submitted first, the same tasks on the same slow workers draw nothing.
    assert _kinds(_fresh_runtime_loop(startup=2.0, gap=0.0)) == set()
