"""The driver's side of the public API, as methods of the Node (a mixin).

``submit_task``/``submit_actor_task``/``create_actor``/``put`` register work under the
node's lock and dispatch it from the caller's thread (no hand-off on the submit path);
``get``/``wait`` register a :class:`Countdown` on the pending objects and block on it.
The first blocked caller *leads*: it polls the worker sockets itself on its own epoll,
so the result that completes its countdown wakes it directly; other blocked callers wait
on their countdown's event, set by whichever thread applied the result.

Every method here runs in a user thread; state belongs to the node (``node.py``).

Where a synchronous ``get(f.remote())`` spends its time (issue 13; measured 2026-11-24
on the shared 2-core machine at load average 4–19, so every figure is a range over
runs; ``bench/floor.py``'s round trip was 15–40 µs, pipelined 9–19 µs, in the same
minutes). The event log's phases, medians of 2,000 calls: submit → dispatch 12 µs,
dispatch → worker starts 55, arguments 4.5, run 2.4, store 7.7, stored → driver has
seen it 74, seen → next submit 39; 190 µs from one submit to the next, 270–440 µs per
call by the wall clock. The driver's CPU per sync call, per thread, which load
distorts far less (``bench/hotpath_profile.py``: ``/proc`` schedstat, 3 rounds of
1,000 calls, steady to ±5%): main thread 72–75 µs, the I/O thread 52 µs, the advisor
16–47 µs (it digests a record and a span per call, off the call path but on the
same 2 cores). So the driver burns 140–170 µs of CPU per call, about 10× the floor's
whole round trip (15.6 µs in that run); the I/O thread's share is pure overhead here, since the
leading getter reads the result itself: the result frame also wakes the I/O
thread's own epoll, and dropping the returned ref writes its wake pipe
(``RefCounter.on_first_release``). cProfile of the loop: ``get``'s own time 22 µs
and ``_poll``'s 34 µs per call (GIL hand-overs with the I/O thread show up as time
in whichever frame was running), ``socket.send`` to the worker 37 µs, the wake-pipe
write 20 µs. Tried, A/B interleaved in one process (12–40 rounds): without the
release wake-up the I/O thread's CPU fell by 15–20 µs per call but the wall time
did not move measurably (paired median ratios 1.03–1.07, quartiles ±50%); with the
I/O thread not watching the worker sockets its CPU fell to ~20 µs but the main
thread's rose to 140–190 µs, not yet understood. ``sys.setswitchinterval`` 5 ms /
0.5 ms / 0.05 ms: medians 437 / 269 / 313 µs over 8 interleaved rounds, overlapping
quartiles. For 10,000 no-op tasks the driver alone is the bottleneck: its submit
loop takes 13 µs per task and its threads use 20–30 µs of CPU per task (main
13–18, I/O 7–10, advisor 0–7) against a pipelined floor of 8–9 µs in the same run.

Changes since, each judged by the driver's CPU per call in interleaved A/B runs of fresh
processes (``bench/hotpath_profile.py``'s per-thread schedstat; 4-5 rounds of 2 x 1,000
sync calls and 2 x 10,000 tasks per variant, load average 11-14, medians):

* The advisor no longer re-checks get-in-loop at a call site it has reported: the check
  (the chain's last 16 gets against the site's recent tasks) was most of its 12-37 µs
  per sync call; now 2-3 µs.
* A dropped ref wakes the I/O thread only when it sleeps idle (``node.py``): I/O thread
  51 -> 33 µs per sync call, driver total 126 -> 105, wall 474 -> 278 µs.
* The main thread's CPU sample for the advisor (``_thread_cpu_and_busy_s``, every 5 ms
  of submissions) reads schedstat without releasing the GIL: each ``os.pread`` handed
  the GIL to the I/O thread and the submit loop waited to get it back (10,000 submits:
  55 -> 26 µs per task by the wall clock, CPU unchanged).
* Tried and dropped: keeping the I/O thread out of the worker sockets while a getter
  leads (its nested epoll unregistered for the leader's time, two epoll_ctl per get).
  The I/O thread fell 51 -> 35 µs but the main thread rose 72 -> 107-149, total +40-60,
  wall 1.6-3x, in three A/B runs; on this loaded 2-core host, two threads racing for
  the result frame reach it sooner than the leader alone, and a late wake-up costs the
  leader CPU (cold caches) as well as time.

Session 5 (2026-11-24, load average 4-9 from other work; ``bench/hotpath_ab.py``: fresh
processes of ``hotpath_profile.py``, A and B interleaved, 8-16 rounds, medians and the
median of paired ratios; the workers' CPU is measured too now). Where the time goes:

* Not lock or GIL waits. ``perf record -g`` of a sync loop: the main thread is ~75%
  Python interpreter and ~18% kernel (send, recv, epoll_wait ~4% each; futex 0.5%).
  The I/O thread's share is real work too: it applies about half of the results (it
  wins the race for the frame as often as the leader). Tried once more, without the
  earlier attempt's flaws (no epoll_ctl per get in steady state; the I/O thread kept
  from idling, so dropped refs do not wake it): the leader reads alone, the I/O
  thread takes the sockets back when no getter leads. I/O thread 29 -> 4 µs per sync
  call, main thread 68 -> 94, total unchanged (106 -> 108), wall 1.06-1.35x and 10,000
  tasks 1.3x slower (their results then all go through one thread). Dropped.
* A CPU profile (yappi, thread CPU clock; its overhead inflates every figure ~10x, the
  shares hold) of 10,000 no-op tasks: submitting ~37% (``submit_task``, ``submit``,
  ``register_task``, the TaskRecord, TaskSpec, ObjectEntry and ObjectRef), applying
  results ~22%, placing them ~16% (``Scheduler._place`` queues each behind a running
  task), the advisor's thread ~5%. The cyclic garbage collector adds 1.7-3.9 µs per task
  (``gc.callbacks``: per 10,000 tasks ~80 young collections of 0.12 ms, 7 middle ones of
  1 ms, 0-1 full ones of 21 ms). No single hot spot: a compiled extension would have to
  take the whole submit and result path (table, scheduler, records) to pay off; a
  compiled frame codec alone would save 2-3 µs per call.
* The workers: ``recv(256 KiB)`` per read cost an mmap, page faults and an mremap per
  frame (``protocol.RECV_SIZE``); each no-op also pays two ``time.process_time`` calls
  (2.4 µs each here: a syscall; the advisor's task CPU time) — see ``worker.py``.

Kept (driver CPU per call, before -> after, medians; paired ratio): batched frames and
the receive buffer (``protocol.py``): 10,000 tasks 25.7 -> 21.9 µs per task (0.85), the
workers' 21.0 -> 16.6 (0.80), sync 106 -> 96 (0.95). Then ``_dispatch`` returning at once
when nothing waits to be placed (it ran 2.6 times per sync call, each pass summing over
the workers), no Event for a get that leads, a span of one object without lists, and a
result list tested first in ``_on_done`` (its ``outcome[0] == "lost"`` called the
dataclass ``__eq__`` of a ``Stored``): sync 89 -> 78 (0.88; main thread 59 -> 51), 10,000
tasks 21.6 -> 19.9 (0.90).

Session 6 (2026-11-24, load average 3-9 from other work; ``hotpath_ab.py`` 6-8 rounds,
``hotpath_worker.py`` for a worker alone; medians, paired ratios):

* Actor calls cost twice a task's driver CPU (37 vs 20 µs per call of 10,000) because
  each went out in a frame of its own: ``add_call`` sent every call at once, even to a
  busy actor, and ``register_task`` pumped the queue again. Now a call to a busy actor
  waits in its queue and the calls queued meanwhile go in one frame when the actor's
  next frame is read (``actors.py``): 10,000 calls in ~10 frames instead of 10,000;
  driver 39.1 -> 21.5 µs per call (0.61), workers 13.8 -> 7.4, wall 56 -> 31; the
  synchronous actor call is unchanged (1.00). It brought out a bug: a get inside an
  actor's method bounced the calls waiting in the actor's inbox, and the driver ignores
  a bounced actor call, so the call was lost (its get hung; ``test_actors.py``).
* The workers (``worker.py``): the read turn's lock and notifies, and the CPU clock only
  for functions whose last run took 1 ms or more: a worker's CPU per task in frames
  9.6 -> 6.6 µs, per sync call 22 -> 18.6. The scheduler queues 5 ms of short tasks per
  worker instead of 2 (``scheduler.py``): 10,000 tasks, workers 15.5 -> 11.2 µs per task.
* 20,000 × ``sleep(0.1 ms)`` on 4 slots (1.5-1.8 s at load 7-8; 1.79 s in the quiet
  bench). Where the time goes: ``sleep(0.0001)`` itself takes ~170 µs on this VM (the
  kernel's default 50 µs timer slack; 119 µs with a 1 µs slack), so the four slots need
  0.85 s for the sleeps alone; the rest is the submit phase (~0.3-0.4 s for 20,000
  submits), during which the workers idled most of the time: the submit loop holds the
  GIL, the I/O thread that reads results and dispatches gets it once per switch
  interval (5 ms), and the workers' 2 ms queues ran dry (now 5 ms, above: 1.82 -> 1.53
  s); and the cyclic GC's full collections (35-90 ms each, 1-2 per run) stop the whole
  runtime. Placement is not it (``_place`` scans 4 workers). Tried and dropped: the
  submitting thread applying results and dispatching itself every 1 ms (``_poll`` as a
  leader, non-blocking): more CPU, no gain in wall time over 6 rounds. Not done:
  lowering the workers' timer slack (``PR_SET_TIMERSLACK``) would cut ~0.25 s from this
  figure but changes every sleep and timeout in user code on the workers.
* The cyclic GC in the driver: every pending task holds 5 tracked objects (ObjectRef,
  Stored, TaskRecord, ObjectEntry, TaskSpec; a finished one 1.4, its record in the
  event log), which no pure-Python layout avoids (session 8 took the records out:
  below). 10,000 tasks: ~90 young, 8 middle and
  0-1 full collections, 1.5-3.5 µs per task. ``gc.set_threshold(10_000)`` while the
  runtime runs: main thread 13.0 -> 11.0 µs per task (driver total 0.94), the sleep
  figure no better (1.62 -> 1.83 s, noise); not done, as it changes the user's process
  for 6%. ``gc.freeze()`` at init would keep the user's objects of that moment from
  ever being collected as cycles: not done. In a worker the collector is idle (one
  young collection per 20,000 no-op tasks): nothing to gain there.
* A compiled spike (Cython 3.3.1, pure-Python mode, the 11 modules of the hot path
  compiled as they are: driver_calls, node, scheduler, objects, protocol, actors,
  worker, events, calls, serialization, _object_ref; 4 minutes to build): no gain.
  Sync call driver CPU 74.7 -> 91.2 µs (1.24), workers 1.15; 10,000 tasks driver 0.99,
  workers 1.06; actor calls 1.05; the worker loop alone 0.94 in frames, 1.05 one at a
  time. Python 3.11's specializing interpreter already runs this code about as fast as
  Cython's generic object calls do; the time is in C (dicts, pickling, object creation)
  and the kernel. Not landed (the brief's bar: 25% less CPU).

Session 7 (2026-11-24, a quiet machine: load below 1). ``perf`` of a sync loop put half
of the worker's CPU per call and a third of the driver's in the kernel's context
switches and wake-ups (``finish_task_switch``, ``_raw_spin_unlock_irqrestore``), and
the Python ran cold after each sleep: the worker used 55 µs of CPU per sync no-op
against 13 µs for the pipe floor's echo process doing the same syscalls. So waiters
now spin before they block (``spin.py``: the worker's reads, and the leader in
``_poll``), and while a getter leads, the I/O thread's epoll does not watch the
workers (``node.py``). ``hotpath_ab.py`` against the session's start, 6 rounds each:
sync 156 -> 70 µs (spinning), then 114 -> 54 µs against spinning alone (the mute);
actor sync 163 -> 87, then 97 -> 71 µs; 10,000 tasks, 10,000 actor calls and 20,000
sleeps unchanged. Both give way when the machine has no core to spare (measured with
CPU hogs on both cores: as fast as before, not slower).

Session 8 (2026-11-24, quiet). The event log's copy of each ended record (a 29-field
tuple) cost 0.7-0.9 µs a task in place (timed around the call: the record and its
older floats had gone cold), and the records were the costliest objects the cyclic
collector walked while tasks were pending. A record holds nothing that could lead back
to it, so it now leaves the collector when it is made (``events.keep_out_of_collector``)
and the ring keeps the record itself. ``gc.callbacks`` over 10,000-task batches: young
collections 1.0 -> 0.35 µs a task, middle ones 0.9 -> 0.4. ``hotpath_ab.py`` against the
session's start, 8 rounds: 10,000 tasks 21.8 -> 19.7 µs a task (paired 0.89), the submit
loop 18.9 -> 15.3, the driver's CPU 17.0 -> 14.9 (the I/O thread 5.2 -> 3.9); sync calls
0.98, 10,000 actor calls 0.99. The event log's own cost (sessions with the advisor off,
log on and off, 8 rounds): +17% -> +9% wall in fresh drivers, within noise when toggled
inside one driver. A task's result entries and its readiness now share one clock
reading, a float less per queued task (the deep queue: 1,027 -> 995 bytes a task).

Session 12 (2026-11-25, quiet unless said; ``hotpath_ab.py``, fresh drivers alternating).
A py-spy of a sync loop put 9% of the main thread in the advisor's schedstat sample;
timed directly it was 1% (the sampler's bias), but each sample took 42 µs where an
isolated read took 3: every 5 ms the code had gone cold, and ctypes'
``create_string_buffer`` alone took 19 µs cold. One buffer, made once: 15 µs, 0.35% of
a sync loop. With the sync frames' fixed layouts (``protocol.py``), the gate the leader
mutes the I/O thread with (``node.py``) and actor methods kept on their handle
(``_actor.py``), against the session's start, 40 rounds: sync 64.0 -> 49.2 µs (paired
0.80), actor sync 75.2 -> 47.9 (0.71), 10,000 actor calls 0.90, 10,000 tasks 0.97.
Measured and left: the cyclic collector takes 2.5-2.9 µs of a 10,000-task batch's
17-20 µs per task (``gc.callbacks``, per 100,000 tasks: ~880 young collections, 0.6 µs
a task; 80 middle ones, 0.6-0.9; 7-8 full ones, 1.2-1.8). Pending tasks' objects outlive
the young collections and reach the oldest generation, so a full collection comes
every batch or two. Untracking every ``ObjectRef`` as records are (ctypes) changed
nothing in two pairs of runs: collections are counted by allocations, and the full ones
walk the whole heap. Fewer tracked objects per pending task (``TaskSpec`` and
``ObjectEntry`` can sit in cycles through the worker slots, so untracking them could
leak) or changing the program's collector (``gc.freeze``, thresholds) would; neither done.

Session 14 (2026-11-25; quiet, then a noisy host: sync calls 43 µs, later 55-65).
For 10,000 no-op tasks the driver's GIL is the bottleneck: its two threads use ~12.8 µs
of CPU a task (py-spy ``--gil``: submitting ~35% of it, reading and applying results
~30%, dispatching ~14%, no function above 10%) against 16 µs by the wall clock, while
``perf -a`` finds the machine ~27% idle. The event log per 10 ms shows why: the submit
loop (91 ms) hardly overlaps the workers: dispatches come in bursts of 1,280 (the
workers' queues) whenever the I/O thread gets the GIL, 20-30 ms apart, and the workers
idle in between; once the last task is submitted the pipeline runs at ~9.5 µs a task.
Tried and dropped (``hotpath_ab.py``, alternating fresh drivers):
* the submitting thread reading results and dispatching itself every 0.5 ms while every
  worker is busy: the pipeline overlapped, but batches were 1.27x slower (16 rounds),
  the driver's CPU +28% and the workers' +53% (smaller frames, more wake-ups): the
  bursts are what keep a task cheap;
* one bound method for all of a get's waiters and no list for an entry's only waiter
  (fewer containers that outlive young collections): 1.00-1.01 (24 rounds), the
  collector's time unchanged;
* a compiled ``untrack`` (24 ns a call against ctypes' 174) for records and results:
  batches 0.95-0.99 (24 rounds each, noisy host). Within the noise, and an extension's
  build and fallback tests would buy no target.
The collector's whole share is the bound for anything of that kind: switched off, a
batch went from 16.8 to 15.0 µs a task (-11%).

Session 15 (2026-11-25) corrects session 14's conclusion that only C could reach the
batch target. ``bench/lean_bound.py`` is a lean pure-Python runtime (batched frames, an
I/O thread, 4 workers) keeping what lightwork keeps per task (a counted ref, a record
of its times in a ring, a table entry with a countdown, the spec in flight): 4.5-6.6 µs
a task against a pipelined floor of 4.4-6.3 in the same minutes, where lightwork takes
15-20. The difference is lightwork's own code: ~80 calls per task in the driver (38 in
the submitting thread, 44 in the I/O thread; ``sys.setprofile``) and 51 in a worker,
against 23 and 6. Split by phase (10,000 tasks submitted with the switch interval at
1 s, so that nothing ran meanwhile, then got): submitting 4.8-5.1 µs a task against the
lean one's 2.9-3.2, and everything after it 12.8-14.3 against 2.6-2.7, where the driver
used 8.5-14.7 µs of CPU a task and the workers 8-10 (the lean ones 1.4-2.5). On two
cores, with the driver's GIL-bound threads on one, the workers share the other: their
CPU bounds a batch as much as the driver's does. Spinning is not it (``LIGHTWORK_SPIN_US=0``:
the same within noise). So the way to the target is a lean path for the common task
(plain function, inline arguments and result, default resources, no dependencies) on
both sides, falling back to the general one for anything else: not an extension.
Part of it is the wire format: a batch frame's TASK and DONE messages each carry a
``Stored`` (pickled through its ``__reduce__``, a Python call, and rebuilt by a class
call), nested in tuples with the shape and the GPU ids. Pickled as a list of 100
distinct messages: a TASK 525 ns to dump (driver) and 356 to load (worker), a DONE 514
and 449; the lean tuples of ids and bytes 62/65 and 89/121. So ~0.8 µs a task in the
driver and ~0.7 in a worker are the format alone.

Session 16 (2026-11-25, quiet; ``hotpath_ab.py`` rounds take ~2 s, so 30 of them, and
paired medians resolve ~2%). Values travel bare (``protocol.py``): the workers' CPU
per batch task 0.84, the driver's unchanged, though decoding results fell from 18% of
the I/O thread's GIL time to 10% (py-spy ``--gil``). The measure that then guided the
driver: bytecodes executed per task (``sys.settrace`` with opcode events on every
thread, 3,000 no-op tasks; deterministic to ~3%, where timings are not): 1,772 a task,
against ``bench/lean_bound.py``'s 351, about 7 ns each in the driver's 13-15 µs. Where:
the dataclass constructors 218 (record 89, spec 62, entry 50, ``Stored`` 17), placing
186 (``_place`` 95 a task, ``schedule``, ``_fits``, ``make_ready``), submitting ~270
besides them, the result ~430, ``get`` and the ref's release ~230. Kept:
* ``TaskSpec.plain`` (one return, no dependencies, inline arguments without refs, the
  driver's): registered from the submit queue and ended in fewer steps, its record born
  with ``deps_ready`` (not touched, cold, at registration): batches 0.97;
* short tasks queued behind running ones handed out in one loop per shape
  (``Scheduler._queue_behind``: ``min``/``index`` over the workers' queue lengths, not a
  call, a fit test and a scan per task), and records and entries made with positional
  arguments (a keyword searches the parameters, C time no bytecode count shows: 0.2 µs
  a record): batches 0.92 paired, 1,772 -> ~1,700 bytecodes;
* for actor calls (1,762 bytecodes a call): ``Actor.slots`` worked out once (a property
  read four times a call), a plain call queued on the driver joining its actor's queue
  directly, its results stored before the rare outcomes are tested, one ``held()`` per
  freed entry: 10,000 calls 0.90 (1,762 -> ~1,630).
Measured and dropped: three calls fewer per result and two per ``get`` item (the DONE
routed without ``_handle``, ``lookup`` inlined, ``ref._id``): 1.01-1.03, nothing.

What remains, for a batch of 10,000 no-op tasks (~14 µs a task of driver CPU): the
bytecodes above, spread over ~60 steps with none above 8%; memory, ~1 KB per queued
task (``bench/deep_queue.py``: 995 bytes; the record, spec, entry and ref alone 736
bytes by ``sys.getsizeof`` against the lean bound's 296), touched cold in each phase
(the first line that touches the record or the entry in a phase is a top line of the
profile); and the cyclic collector, 3.4-3.6 µs a task (``gc.callbacks``: young 0.8-1.0,
middle 1.3-1.6, full 1.2-1.4). The collector walks each pending task's ``TaskSpec``,
``ObjectEntry`` and ``ObjectRef`` in every collection they live through, and a batch's
30,000 of them push the heap past the full collection's 25% rule once per batch.
Untracked (``ctypes``, an experiment): ``ObjectRef`` and the results' ``Stored`` alone
changed nothing; with ``TaskSpec`` and ``ObjectEntry`` too the collector fell to 1.3-1.4
µs a task (young 0.3-0.4, middle 0.1, full 0.9). Not done: both can sit in cycles (an
entry's waiters and errors, a task's worker slot), which an untracked object would leak.
By batch size (best of several, quiet): 11.1-11.7 µs a task for 1,000, 11.1-15.8 for
10,000, 12.7-16 for 30,000; 10.7-13.8 with the collector off. So the next steps are fewer
bytecodes per task (the record's constructor, submitting, the result) and fewer,
smaller objects per task in flight (the record's rarely set fields apart; an entry and
a spec for a one-return task), which the collector and the caches both pay for.

Session 17 (2026-11-28, quiet: load average under 1; ``hotpath_ab.py`` 8-12 rounds, and
the event log of single batches). The anatomy of a 10,000-task batch: dispatches come in
4-10 bursts (at most 2,560 tasks, the workers' 5 ms queues), and each worker idles 83-97
ms of the batch's 95-108: the workers wait for the driver, whose CPU (8-10 µs a task)
is the wall clock. Of that CPU the cyclic collector takes a quarter: per batch ~85
young collections (~40 µs each), ~8 middle ones (~0.45 ms) and about one full one (5-10
ms of CPU with 25,000-58,000 objects in the oldest generation, ~200 ns an object: the
cache misses of visiting each object's referents), 1.5-2.4 µs a task; with the
collector off, 8.7 µs a task against 10.1 (8 interleaved rounds in one driver). While
pending a task adds ~5 to the young generation's count (the ref, spec, entry, record
and return-ids tuple; ``gc.get_count`` with the collector off). Kept:
* the event log's rings leave the collector (``events.py``): a full collection visited
  every record in the ring, one cache miss apiece (100,000 records: 5.0-5.6 -> 1.9-2.5 ms
  a full collection, in every program that runs long enough to fill the ring);
* a read's plain DONEs end in one loop (``WorkerRequests._handle_read``,
  ``ActorManager.on_read``): 10,000 tasks 0.93-0.98 paired, the I/O thread 0.79-0.80;
* a call's new ref counted without the counter's lock (``_object_ref.fresh_ref``):
  tasks 0.95, the submit loop 0.86, actor calls 0.90.
Bytecodes per batch task 1,531 -> 1,469. Measured and dropped again: ``TaskSpec`` and
``ObjectEntry`` untracked at birth (``ctypes``): the collector's share fell 2.3 -> 1.6
µs a task (young 0.3 -> 0.2, middle 0.4 -> 0.2, full 1.6 -> 1.2), the driver's CPU and
the wall clock did not move (0.98-1.00): two ``ctypes`` calls a task cost what it saved,
and both objects can sit in cycles (above).
"""

from __future__ import annotations

import concurrent.futures
import copy
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork import exceptions
from lightwork._object_ref import ObjectRef, fresh_ref, ref_counter
from lightwork._runtime import serialization
from lightwork._runtime.actors import Actor
from lightwork._runtime.calls import CallSpec, infeasible_message, large_arguments, prepare_args
from lightwork._runtime.events import DriverSpan, TaskRecord, keep_out_of_collector
from lightwork._runtime.lineage import value_vanished
from lightwork._runtime.objects import PENDING, READY, ObjectEntry
from lightwork._runtime.scheduler import TaskSpec
from lightwork._runtime.serialization import Stored
from lightwork._runtime.spin import cores_to_spare

if TYPE_CHECKING:
    from lightwork._runtime.node import Node
    from lightwork._runtime.store import SegmentStore

    _Base = Node
else:
    _Base = object


DRIVER_BUSY_SAMPLE_S = 0.005


_schedstat: tuple[int, int] | None = None  # (pid, fd of the main thread's schedstat)
#: libc's pread through ctypes, and the one buffer it reads into (the main thread's only).
_pread_holding_gil: tuple[Callable[[int, Any, int, int], int], Any] | None = None


def _read_schedstat(fd: int) -> bytes:
    # libc's pread through ctypes.PyDLL, which keeps the GIL: os.pread releases it, and
    # in a submit loop the I/O thread takes it then, so each sample cost the loop a GIL
    # hand-off (10,000 submits: 51 -> 22 µs per task without them; issue 13). The buffer
    # is made once: a sample comes every 5 ms, with ctypes' code gone cold by then, and
    # a new buffer each time cost 19 µs of the sample's 50 (after a 5 ms sleep).
    global _pread_holding_gil
    import ctypes

    if _pread_holding_gil is None:
        pread = ctypes.PyDLL(None, use_errno=True).pread
        pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
        pread.restype = ctypes.c_ssize_t
        _pread_holding_gil = (pread, ctypes.create_string_buffer(64))
    pread, buffer = _pread_holding_gil
    length = pread(fd, buffer, 64, 0)
    if length < 0:
        raise OSError(ctypes.get_errno(), "pread of schedstat failed")
    return buffer.raw[:length]


def _thread_cpu_and_busy_s() -> tuple[float, float]:
    """The calling (main) thread's CPU seconds, and its seconds running or ready to run
    (``schedstat``: CPU time plus time waiting for a core, so a loaded machine stretches
    the driver's work without hiding it; its CPU time where ``/proc`` has no schedstat)."""
    global _schedstat
    try:
        if _schedstat is None or _schedstat[0] != os.getpid():
            _schedstat = (os.getpid(), os.open("/proc/thread-self/schedstat", os.O_RDONLY))
        ran, waited = _read_schedstat(_schedstat[1]).split()[:2]
        return int(ran) / 1e9, (int(ran) + int(waited)) / 1e9
    except (OSError, ValueError, AttributeError):  # AttributeError: no libc pread
        cpu = time.thread_time()
        return cpu, cpu


class Countdown:
    """Wakes a blocked caller when ``remaining`` objects have resolved.

    ``hit`` runs under the node's lock. The caller may be polling the workers itself
    (``Node._block_on``, the leader: it reads ``remaining``); when another thread
    completes the countdown, ``wake`` interrupts the leader's select. A caller that does
    not lead sleeps on ``event``, made (under the lock) only then: most gets lead.
    """

    __slots__ = ("remaining", "event", "waiter", "wake")

    def __init__(self, remaining: int) -> None:
        self.remaining = remaining
        self.event: threading.Event | None = None
        self.waiter = threading.get_ident()
        self.wake: Callable[[], None] | None = None

    def hit(self, entry: ObjectEntry) -> None:
        self.remaining -= 1
        if self.remaining <= 0:
            if self.event is not None:
                self.event.set()
            if self.wake is not None and threading.get_ident() != self.waiter:
                self.wake()


class DriverCalls(_Base):
    """The public API's operations on the driver's runtime."""

    def cancel(self, object_ids: list[int], force: bool, recursive: bool = True) -> None:
        with self.lock:
            for object_id in object_ids:
                if object_id not in self.objects.entries and self.id_floor.minted_before(object_id):
                    raise self.ended_session_error(object_id)
            self._cancel_ids(object_ids, force, recursive)

    # When the next submission samples the driver's CPU time (see _sample_driver_busy).
    _driver_busy_due = 0.0

    def _sample_driver_busy(self, record: TaskRecord, submitted: float) -> None:
        """Note on ``record`` how long the main thread has worked (at most every
        ``DRIVER_BUSY_SAMPLE_S``: a float compare per task otherwise; a sample costs
        ~2-10 µs). The advisor's serial-driver rule reads the driver's own work from
        it rather than from wall time, in which a sleeping driver looks busy."""
        self._driver_busy_due = submitted + DRIVER_BUSY_SAMPLE_S
        if threading.get_ident() == threading.main_thread().ident:
            record.driver_cpu, record.driver_busy = _thread_cpu_and_busy_s()

    # ------------------------------------------------------------------ the API
    def submit_task(
        self, spec: CallSpec, args: tuple, kwargs: dict, callsite: Any = None
    ) -> list[ObjectRef]:
        shape = spec.shape
        if shape not in self._feasible_shapes:
            problem = self.scheduler.check_feasible(shape)
            if problem:
                removed = self.scheduler.removed_names
                if removed and any(name in removed for name, _ in shape):
                    raise exceptions.TaskPlacementGroupRemoved(
                        f"task {spec.name} was submitted to a placement group that was "
                        "removed; create a new group, or submit it without one")
                raise ValueError(infeasible_message(spec.name, problem))
            self._feasible_shapes.add(shape)
        ids = self._ids
        task_id = next(ids)
        submitted = time.monotonic()  # before the copy: the copy is part of submitting
        stored, deps = prepare_args(args, kwargs, self.store)
        try:
            single = spec.num_returns == 1
            return_ids = (next(ids),) if single else tuple(
                next(ids) for _ in range(spec.num_returns))
            # A task without dependencies is ready from its submission (register_task).
            record = TaskRecord(task_id, spec.name, 0, submitted, 0.0 if deps else submitted,
                                stored.size, callsite, spec.cpus)
            keep_out_of_collector(record)  # while pending too (events.py)
            if submitted >= self._driver_busy_due:
                self._sample_driver_busy(record, submitted)
            if stored.path is not None:
                record.large_args = large_arguments(args, kwargs)
                record.copy_s = time.monotonic() - submitted
            task = TaskSpec(
                task_id, spec.key, spec.name, stored, deps, return_ids, spec.num_returns, shape,
                spec.max_retries, spec.retry_exceptions, 0, record, 0, 0,
                single and not (deps or stored.contained) and stored.path is None,  # plain
            )
            self.submit(task, spec.blob)
        except BaseException:
            if stored.path is not None:
                self.store.release(stored.path)
            raise
        if single:
            return [fresh_ref(return_ids[0])]
        return [fresh_ref(object_id) for object_id in return_ids]

    def create_actor(self, actor: Actor, blob: bytes) -> None:
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            self.functions.setdefault(actor.class_key, blob)
            self.actors.create(actor)

    def submit_actor_task(
        self, actor_id: int, method: str, name: str, args: tuple, kwargs: dict,
        num_returns: int, callsite: Any = None,
    ) -> list[ObjectRef]:
        actor = self.actors.actors.get(actor_id)
        if actor is None and self.id_floor.minted_before(actor_id):
            raise self.ended_session_error(actor_id, actor=True)
        ids = self._ids
        task_id = next(ids)
        submitted = time.monotonic()
        stored, deps = prepare_args(args, kwargs, self.store)
        return_ids = (next(ids),) if num_returns == 1 else tuple(
            next(ids) for _ in range(num_returns))
        record = TaskRecord(task_id, name, 0, submitted, 0.0 if deps else submitted,
                            stored.size, callsite, 1.0, actor_id)
        keep_out_of_collector(record)
        if submitted >= self._driver_busy_due:
            self._sample_driver_busy(record, submitted)
        if stored.path is not None:
            record.large_args = large_arguments(args, kwargs)
            record.copy_s = time.monotonic() - submitted
        task = TaskSpec(task_id, method, name, stored, deps, return_ids, num_returns, (), 0,
                        False, 0, record, actor_id, 0,
                        num_returns == 1 and not (deps or stored.contained)
                        and stored.path is None)
        if (actor is not None and len(actor.inflight) >= actor.slots
                and actor.max_pending_calls < 0 and not (deps or stored.contained)):
            # Every slot of the actor is taken: queued, as in submit (node_lock.py).
            self._check_open()
            self.lock.queued.append(task)
            if len(actor.inflight) < actor.slots:  # looked at again after the append:
                with self.lock:  # a slot freed meanwhile; __enter__ registers and sends it
                    self._check_open()
            if num_returns == 1:
                return [fresh_ref(return_ids[0])]
            return [fresh_ref(object_id) for object_id in return_ids]
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            try:
                self.actors.check_room(actor_id)
                now = time.monotonic()
                for object_id in return_ids:
                    self.objects.create(object_id, 0, task_id, now)
                self.register_task(task, stored.contained, now)
            except BaseException:
                for object_id in return_ids:
                    self.objects.entries.pop(object_id, None)
                if stored.path is not None:
                    self.store.release(stored.path)
                raise
            self.actors.add_call(actor_id, task)
        return [fresh_ref(object_id) for object_id in return_ids]

    def driver_request(self, what: str, *args: Any) -> Any:
        with self.lock:
            self._check_open()
            if what == "get_actor":
                found = self.actors.lookup_name(args[0], args[1])
                return None if found is None else (found.actor_id, found.class_name, found.methods)
            if what == "kill":
                self.actors.kill(args[0], args[1])
                return None
            if what == "placement_group":
                return self.placement_group_request(*args)
            if what == "stream":
                return self.streams.request(*args)
            raise ValueError(f"unknown request {what!r}")

    # ------------------------------------------------------------------ placement groups
    def placement_group_request(self, op: str, *args: Any) -> Any:
        """``create``/``remove``/``table`` of placement groups (caller holds the lock).

        The decisions are the scheduler's (see ``scheduler.py``); this carries them out:
        dispatch what a new reservation or a returned one lets run, fail what a removal
        strands, and forget cached feasibility of the removed group's resource names."""
        scheduler = self.scheduler
        if op == "create":
            group_id, group_hex, name, bundles, strategy = args
            if name and any(group.name == name and group.state != "REMOVED"
                            for group in scheduler.groups.values()):
                raise ValueError(
                    f"a placement group named {name!r} already exists; pick another name, or "
                    "remove it first (lightwork.util.remove_placement_group)")
            scheduler.add_group(group_id, group_hex, name, bundles, strategy)
            self._dispatch()
            return None
        if op == "remove":
            group = scheduler.remove_group(args[0])
            if group is None:
                raise ValueError(f"no placement group with id {args[0]} in this session")
            self.gpus.remove_group(group.hex)
            removed = scheduler.removed_names
            self._feasible_shapes = {shape for shape in self._feasible_shapes
                                     if not any(name in removed for name, _ in shape)}
            for actor in list(self.actors.actors.values()):
                if actor.state != "DEAD" and any(
                        name in removed for name, _ in (*actor.place, *actor.hold)):
                    self.actors.kill(actor.actor_id, True)
                    actor.death_cause = "its placement group was removed"
            self._dispatch()
            return None
        if op == "table":
            return {group.hex: group.row(self.node_id) for group in scheduler.groups.values()}
        raise ValueError(f"unknown placement group request {op!r}")

    def _fail_orphaned_tasks(self) -> None:
        orphaned, self.scheduler.orphaned = self.scheduler.orphaned, []
        for task in orphaned:
            self._fail_task(task, exceptions.TaskPlacementGroupRemoved(
                f"task {task.name} was to run in a placement group that was removed before "
                "it could start; create a new group, or submit it without one"))

    def submit(self, task: TaskSpec, function_blob: bytes | None) -> None:
        scheduler = self.scheduler
        if scheduler.workers and not scheduler.idle and not (task.deps or task.args.contained):
            # Every worker is busy: queued, and registered by the lock's next taker
            # (node_lock.py), most often the I/O thread once a worker frees.
            self._check_open()
            if function_blob is not None:  # the table only grows: one atomic setdefault
                self.functions.setdefault(task.function_key, function_blob)
            self.lock.queued.append(task)
            if scheduler.idle:  # looked at again after the append (see node_lock.py):
                with self.lock:  # a worker freed meanwhile; __enter__ registers it
                    self._check_open()
                    self._dispatch()
            return
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            if function_blob is not None:
                self.functions.setdefault(task.function_key, function_blob)
            now = time.monotonic()
            for object_id in task.return_ids:
                self.objects.create(object_id, 0, task.task_id, now)
            try:
                self.register_task(task, task.args.contained, now)
            except BaseException:
                self.tasks.pop(task.task_id, None)
                for object_id in task.return_ids:
                    self.objects.entries.pop(object_id, None)
                raise
            if self.scheduler.idle or not self.scheduler.workers:
                self._dispatch()
            # else: every worker is busy; the next result frees one and the poller
            # dispatches a whole batch then, instead of one frame per submit here.

    def _drain_refs_if_any(self) -> None:
        if ref_counter._released:
            with self.lock:
                self._drain_refs()

    def _check_open(self) -> None:
        if self.closed:
            raise exceptions.RuntimeSystemError(
                "the lightwork runtime was shut down; call lightwork.init() to start a new one")
        if self.broken:
            raise exceptions.RuntimeSystemError(
                f"the lightwork runtime stopped working: {self.broken}\nCall "
                "lightwork.shutdown() and lightwork.init() to start a new runtime.")

    def put(self, value: Any) -> ObjectRef:
        object_id = self.next_object_id()
        start = time.monotonic()
        stored = serialization.serialize(value, self.store)
        if stored.path is not None and self.log.enabled:
            # lightwork's own copying, not the driver's work (the advisor subtracts it).
            self.log.add_span(DriverSpan("put", start, time.monotonic(), 1,
                                         threading.get_ident(), object_id))
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            entry = self.objects.create(object_id, 0)
            self.objects.resolve(entry, stored)
            return fresh_ref(object_id)

    def get(self, ids: list[int], timeout: float | None, callsite: Any = None) -> list[Any]:
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            entries = [self.lookup(i) for i in ids]
            pending = [e for e in entries if e.state == PENDING]
            countdown = None
            if pending:
                countdown = Countdown(len(pending))
                for entry in pending:
                    entry.add_waiter(countdown.hit)
        if countdown is not None:
            start = time.monotonic()
            finished = self._block_on(countdown, timeout)
            if self.log.enabled:
                self.log.add_span(self._span("get", start, entries, pending, callsite))
            if not finished:
                with self.lock:
                    for entry in pending:
                        entry.remove_waiter(countdown.hit)
                still = sum(1 for e in pending if e.state == PENDING)
                raise exceptions.GetTimeoutError(
                    f"get timed out after {timeout} s: {still} of {len(ids)} object(s) not ready. "
                    "Raise the timeout, or use wait() to take the ready ones first.")
        store = self.store
        try:
            return [_value_of(entry, store) for entry in entries]
        except FileNotFoundError:  # a segment vanished from /dev/shm: rebuild, then read
            with self.lock:
                for entry in entries:
                    if value_vanished(entry, store):
                        self.recover_lost(entry)
            return self.get(ids, timeout, callsite)

    def wait(
        self, ids: list[int], num_returns: int, timeout: float | None, callsite: Any = None
    ) -> list[int]:
        """Ids (in input order) of up to ``num_returns`` objects that are ready."""
        self._drain_refs_if_any()
        with self.lock:
            self._check_open()
            entries = [self.lookup(i) for i in ids]
            ready = sum(1 for e in entries if e.state != PENDING)
            countdown = None
            if ready < num_returns and timeout != 0:
                countdown = Countdown(num_returns - ready)
                for entry in entries:
                    if entry.state == PENDING:
                        entry.add_waiter(countdown.hit)
        if countdown is not None:
            start = time.monotonic()
            self._block_on(countdown, timeout)
            if self.log.enabled:
                waited = [e for e in entries if e.ready_at >= start or e.state == PENDING]
                self.log.add_span(self._span("wait", start, entries, waited, callsite))
            with self.lock:
                for entry in entries:
                    entry.remove_waiter(countdown.hit)
        return [e.object_id for e in entries if e.state != PENDING][:num_returns]

    def _span(
        self, kind: str, start: float, entries: list[ObjectEntry], waited: list[ObjectEntry],
        callsite: Any,
    ) -> DriverSpan:
        """The record of one blocked get/wait, with when its objects became ready."""
        if len(waited) == 1:  # get(f.remote()): the same figures, without the lists
            ready_at = waited[0].ready_at
            first = last = ready_at
            shortest = longest = ready_at - waited[0].created_at if ready_at else 0.0
        else:
            ready = [e for e in waited if e.ready_at]
            ready_times = [e.ready_at for e in ready]
            durations = [e.ready_at - e.created_at for e in ready]
            first, last = min(ready_times, default=0.0), max(ready_times, default=0.0)
            shortest, longest = min(durations, default=0.0), max(durations, default=0.0)
        return DriverSpan(
            kind, start, time.monotonic(), len(entries), threading.get_ident(),
            entries[0].object_id, callsite, entries[0].task_id, len(entries) - len(waited),
            first, last, shortest, longest,
        )

    def _block_on(self, countdown: Countdown, timeout: float | None) -> bool:
        """Wait until ``countdown`` completes, polling the workers from this thread."""
        if threading.current_thread() is self._thread or not self._leader.acquire(blocking=False):
            with self.lock:
                if countdown.remaining <= 0:
                    return True
                event = countdown.event = threading.Event()
            return event.wait(timeout)  # the I/O thread or the leading getter completes it
        # While this thread leads, the I/O thread's epoll does not watch the workers
        # (see node.py), unless the machine's cores are all taken: then two threads
        # waiting for a result see it sooner than one (this one may not be running).
        muted = cores_to_spare(time.monotonic()) and self._watch_workers(False)
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            countdown.wake = self._wake_leader
            while countdown.remaining > 0:
                remaining = None
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                if not self._poll(remaining, leading=True):
                    return countdown.remaining <= 0
            return True
        finally:
            if muted:
                self._watch_workers(True)
            self._leader.release()

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def complete(entry: ObjectEntry, keep: ObjectRef = ref) -> None:
            def run() -> None:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(_value_of(entry))
                    except BaseException as exc:  # noqa: BLE001 - delivered to the future
                        future.set_exception(exc)
            self._deferred.append(run)

        with self.lock:
            self._check_open()
            entry = self.lookup(ref.id)
            if entry.state == PENDING:
                entry.add_waiter(complete)
                return future
        complete(entry)
        for run in self._deferred_pop():
            run()
        return future

    def _deferred_pop(self) -> list[Callable[[], None]]:
        with self.lock:
            deferred, self._deferred = self._deferred, []
        return deferred

    def runtime_context(self) -> dict[str, Any]:
        return {"actor_id": None, "actor_name": None,
                "job_id": self.job_id, "task_id": None, "worker_id": 0,
                "node_id": self.node_id, "resources": {}, "gpu_ids": (),
                "namespace": self.namespace, "pid": os.getpid()}

    def task_id_of(self, object_id: int) -> int:
        with self.lock:
            return self.lookup(object_id).task_id

    # ------------------------------------------------------------------ introspection
    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        with self.lock:
            total = {k: v for k, v in self.scheduler.total.items() if v or k == "CPU"}
            available = {k: max(0.0, self.scheduler.available.get(k, 0.0)) for k in total}
            return total, available



def _value_of(entry: ObjectEntry, store: SegmentStore | None = None) -> Any:
    if entry.state == READY:
        stored = entry.stored
        assert stored is not None
        if stored.path is not None and store is not None:
            store.touch(stored.path)  # least recently used spills first
        return serialization.loads(stored)
    error = entry.error
    if isinstance(error, Stored):
        error = serialization.loads(error)
    if isinstance(error, exceptions.TaskError):
        raised = error.as_instanceof_cause()
        raise copy.copy(error) if raised is error else raised
    assert isinstance(error, BaseException)
    # A copy: raising the table's own exception object would hang this call's frames (and
    # the ObjectRefs in them) on its __traceback__, so the object could never be freed.
    raise copy.copy(error)

