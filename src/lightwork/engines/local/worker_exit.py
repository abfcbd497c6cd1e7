"""How a worker process ends, and what runs on its way out (a mixin of
:class:`worker.Worker`).

The ways out, and what each runs:

* the driver closes the socket (``shutdown()``, or the driver died): the thread reading
  it sees EOF and the process ends at once, ``os._exit(0)`` in ``Worker._take_turn``:
  nothing to report to, nothing to keep, no hook runs. At ``shutdown()`` the fork server
  also kills every worker it started, and a worker gets a parent-death signal
  (``forkserver.set_parent_death_signal``), so none outlives the fork server;
* a signal: SIGKILL (``kill()``, ``cancel(force=True)``, the memory monitor) runs
  nothing, and the driver says how the worker died (``worker_deaths.py``); SIGTERM keeps
  its default action (``worker.main``); SIGINT is a cancel, never an exit
  (``worker_cancels.py``);
* the task loop returns: after an EXIT frame (an actor whose handles are all gone, or
  whose constructor failed or called ``exit_actor()``), after the call that made the
  worker ``exiting``, or after a ``max_calls`` function's last call here (``retire``: its
  result goes with RETIRE, and the driver moves what it had queued here elsewhere). A
  task worker's ``main`` then returns, and the fork server's child ends; an actor's
  process ends gracefully (``end``);
* ``exit_actor()`` (``request_exit``) or ``__ray_terminate__``: the running calls finish
  (the one that asked fails with ActorDiedError whatever it did, ``exit_result``), the
  calls not started never start, then the graceful end.

The graceful end (``leave``): the actor's ``__ray_shutdown__()``, then the atexit handlers
registered in this worker (those a fork server forked from the driver inherited were
dropped in ``worker.main``), then the streams flushed and ``os._exit(0)``; a watchdog ends
the process after ``GRACEFUL_EXIT_S`` whatever hangs. A threaded or async actor first
lets its running calls return, on a thread of its own (``begin_exit``: a pool thread
cannot wait for its own pool).

The state is the worker's (``Worker.__init__``): ``exiting`` (no call starts after the
running ones), ``exit_call`` (the task id of the call ``exit_actor()`` ran in; -1
outside any call), ``actor_started`` and ``_exit_lock`` (which order an exit requested
during the constructor against the constructor's end), ``_exit_thread``, ``retiring``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

from lightwork.engines.local.actor_runners import leave_sigint_to_the_main_thread

if TYPE_CHECKING:
    from lightwork.engines.local.worker_state import WorkerState

    _Base = WorkerState
else:
    _Base = object


class ActorExit(SystemExit):
    """Raised by ``exit_actor()`` in a sync actor: finish the current call, then end the
    actor's process. (An async actor's gets ``AsyncioActorExit``: a ``SystemExit`` would
    end only its loop's thread.)"""


#: How long an actor's graceful exit (``__ray_shutdown__``, atexit handlers) may take
#: before its process is ended anyway (Ray's actor_graceful_shutdown_timeout_ms: 30 s).
GRACEFUL_EXIT_S = 30.0


def _give_up_exiting() -> None:
    print(f"lightwork: the actor's __ray_shutdown__() or atexit handlers did not return "
          f"within {GRACEFUL_EXIT_S:.0f} s; its process ends without them", file=sys.stderr)
    os._exit(1)


class WorkerExit(_Base):
    """The worker's end: a task worker's retirement, an actor's graceful exit."""

    def retire(self) -> None:
        """Exit once the running task is done; the driver runs nothing more here."""
        self.retiring = self.exiting = True

    # -- an actor's end ----------------------------------------------------------------
    def request_exit(self) -> None:
        """``exit_actor()``, from a call or from a thread or asyncio task of the actor's.

        The call it ran in fails with ActorDiedError even if the user catches the
        exception (``exit_result``), calls not yet started never start, and the process
        ends gracefully once the running calls return (``begin_exit``). In the
        constructor, ``start_actor`` reports it; ``_exit_lock`` makes sure that either
        ``start_actor`` sees the request or this starts the exit, never neither.
        """
        frame = self.current
        with self._exit_lock:
            self.exiting = True
            if not self.exit_call:
                self.exit_call = frame[0] if frame is not None else -1
            started = self.actor_started
        if started and self.pool is not None:
            self.begin_exit()

    def exit_result(self, done: tuple[Any, ...]) -> tuple[Any, ...]:
        """The DONE of a call that ran while the actor began to exit: the one that called
        ``exit_actor()`` says so, whatever it returned or raised."""
        if done[1] == self.exit_call and done[2] != "cancelled":
            return (done[0], done[1], ("exit", None)) + done[3:]
        return done

    def begin_exit(self) -> None:
        """End a threaded or async actor once its running calls return (a thread of its
        own: a pool thread cannot wait for the pool). Idempotent."""
        with self._exit_lock:
            if self._exit_thread is not None:
                return
            self._exit_thread = threading.Thread(
                target=self._exit_when_idle, name="lightwork-actor-exit", daemon=True)
        self._exit_thread.start()

    def _exit_when_idle(self) -> None:
        leave_sigint_to_the_main_thread()
        if self.pool is not None:  # calls not started are dropped: they fail with the death
            self.pool.executor.shutdown(wait=True, cancel_futures=True)
        self.leave()

    def end(self) -> None:
        """The task loop returned: an actor's process ends gracefully (``leave``); a task
        worker's just returns."""
        if not self.actor_id:
            return
        if self.pool is not None:
            self.begin_exit()
            assert self._exit_thread is not None
            self._exit_thread.join()  # it never returns: leave() ends the process
        self.leave()

    def leave(self) -> None:
        """End an actor's process gracefully: ``__ray_shutdown__()``, then the atexit
        handlers registered in it, then ``os._exit(0)``. ``kill()`` never comes here (it
        is a SIGKILL), nor does a crash.

        A hung hook must not keep the process (and the resources it holds) for good:
        after ``GRACEFUL_EXIT_S`` a watchdog ends it anyway, as Ray's
        ``actor_graceful_shutdown_timeout_ms`` does. The handlers are the ones registered
        in this worker only: those inherited from the driver (a forked fork server
        carries its atexit table) were dropped in ``main``.
        """
        watchdog = threading.Timer(GRACEFUL_EXIT_S, _give_up_exiting)
        watchdog.daemon = True
        watchdog.start()
        if self.exit_call:  # no call may have said it (an asyncio task called exit_actor)
            try:
                self.driver_request("actor_exiting")
            except BaseException:  # noqa: BLE001 - the driver is gone: nothing to tell
                pass
        shutdown = getattr(self.actor, "__ray_shutdown__", None) if self.actor is not None else None
        if callable(shutdown):
            try:
                if self.loop is not None:
                    self.loop.call(shutdown, (), {}, None)
                else:
                    shutdown()
            except BaseException:  # noqa: BLE001 - logged, as in Ray; the exit goes on
                print(f"lightwork: {type(self.actor).__name__}.__ray_shutdown__() raised "
                      "(the actor exits all the same):", file=sys.stderr)
                traceback.print_exc()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream
                pass
        os._exit(0)
