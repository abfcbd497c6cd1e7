"""Bytecodes the driver executes per task, by function (issue 13).

Timings on the shared 2-core machine move by ±5% between runs; the number of bytecodes
a no-op task makes the driver execute moves by ~3% (the I/O thread's frames and the
advisor's samples vary a little with timing). At about 7 ns a bytecode it is most of
the driver's CPU per task, so it tells where a change can pay before an A/B run
(``hotpath_ab.py``) says whether it did.

Every thread of the driver is traced (``threading.settrace`` before ``init``, opcode
events) while it submits and gets a batch of no-op tasks, or of calls to one actor;
tracing makes it ~50x slower, so frames and batches differ from a real run somewhat.
The figure leaves out lightwork's periodic threads, listed apart: the advisor looks
every 0.25 s of wall time, which under tracing comes every few tasks (its share in a
real run: ``make bench``'s ``advisor_looks``), and so do the others' rounds.
Dataclass constructors (generated code, ``<string>``) are named by their class.

    python bench/bytecodes.py [--actor] [--tasks N] [--top K] [--lean]

``--lean`` counts ``lean_bound.py``'s runtime instead (the same batch), for scale.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "src"))
sys.path.insert(0, str(BENCH_DIR))


class OpcodeCounter:
    """Counts opcodes per (file, function) while ``on``; install before threads start."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()  # (thread, where)
        self.on = False

    def install(self) -> None:
        threading.settrace(self._trace)

    def start(self) -> None:
        self.on = True
        sys.settrace(self._trace)

    def stop(self) -> None:
        self.on = False
        sys.settrace(None)

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        if not self.on:
            return None
        frame.f_trace_opcodes = True
        code = frame.f_code
        name = code.co_name
        if code.co_filename == "<string>":  # a dataclass's generated method: its class
            name += f" ({type(frame.f_locals.get('self')).__name__})"
        key = (threading.current_thread().name, f"{Path(code.co_filename).name}:{name}")
        counts = self.counts

        def count(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] += 1
            return count

        return count


def count_lightwork(tasks: int, actor: bool, counter: OpcodeCounter) -> None:
    import lightwork

    counter.install()
    lightwork.init(num_cpus=4)
    try:
        @lightwork.remote
        def noop() -> None:
            return None

        @lightwork.remote
        class Noop:
            def call(self) -> None:
                return None

        if actor:
            handle = Noop.remote()
            submit = handle.call.remote
        else:
            submit = noop.remote
        lightwork.get([submit() for _ in range(2_000)])  # warm: workers started, code hot
        counter.start()
        lightwork.get([submit() for _ in range(tasks)])
        counter.stop()
    finally:
        lightwork.shutdown()


def count_lean(tasks: int, counter: OpcodeCounter) -> None:
    import lean_bound

    counter.install()
    runtime = lean_bound.LeanRuntime(kept=True)
    try:
        runtime.register(1, lean_bound._noop)
        runtime.get([runtime.submit(1, (), {}) for _ in range(2_000)])
        counter.start()
        runtime.get([runtime.submit(1, (), {}) for _ in range(tasks)])
        counter.stop()
    finally:
        runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actor", action="store_true", help="calls to one actor, not tasks")
    parser.add_argument("--lean", action="store_true", help="lean_bound.py's runtime instead")
    parser.add_argument("--tasks", type=int, default=3_000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    counter = OpcodeCounter()
    if args.lean:
        count_lean(args.tasks, counter)
    else:
        count_lightwork(args.tasks, args.actor, counter)
    periodic = ("lightwork-advisor", "lightwork-control", "lightwork-memory")
    by_thread: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    for (thread, where), count in counter.counts.items():
        by_thread[thread] += count
        if thread not in periodic:
            by_function[where] += count
    per = "call" if args.actor else "task"
    total = sum(count for thread, count in by_thread.items() if thread not in periodic)
    print(f"bytecodes per {per}: {total / args.tasks:.0f}")
    others = {t: round(c / args.tasks) for t, c in by_thread.items() if t in periodic}
    print(f"in lightwork's periodic threads, per {per}: {others or 'none'}")
    for where, count in by_function.most_common(args.top):
        print(f"{count / args.tasks:8.1f}  {where}")


if __name__ == "__main__":
    main()
