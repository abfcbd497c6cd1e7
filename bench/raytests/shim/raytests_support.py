"""The helpers Ray's tests import from Ray's test utilities, written for any Ray API.

On a lightwork run ``ray._private.test_utils`` (and ``ray._common.test_utils``) is this
module (see ``sitecustomize.py``). Each helper does what the tests rely on, through the
public API only: a signal actor to hold tasks until the test releases them, a semaphore
actor, polling for a condition, running a driver script in a fresh interpreter. Helpers
that read Ray's internals (its GCS, its error pubsub, its metrics) are absent, so the
tests that use them fail with an ``ImportError`` naming the helper; those tests are not
public by the harness's rule.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any
from collections.abc import Callable

import ray


@ray.remote(num_cpus=0)
class SignalActor:
    """Holds every ``wait`` until ``send``; ``send(clear=True)`` lets the current waiters
    go and holds later ones again."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiting = 0

    def send(self, clear: bool = False) -> None:
        self._event.set()
        if clear:
            self._event.clear()

    async def wait(self, should_wait: bool = True) -> None:
        if not should_wait:
            return
        self._waiting += 1
        try:
            await self._event.wait()
        finally:
            self._waiting -= 1

    async def cur_num_waiters(self) -> int:
        return self._waiting


@ray.remote(num_cpus=0)
class Semaphore:
    """A counting semaphore shared by tasks: ``acquire`` waits for a unit."""

    def __init__(self, value: int = 1) -> None:
        self._semaphore = asyncio.Semaphore(value=value)

    async def acquire(self) -> None:
        await self._semaphore.acquire()

    async def release(self) -> None:
        self._semaphore.release()

    async def locked(self) -> bool:
        return self._semaphore.locked()


def wait_for_condition(condition_predictor: Callable[..., Any], timeout: float = 10,
                       retry_interval_ms: float = 100, raise_exceptions: bool = False,
                       **kwargs: Any) -> None:
    """Poll ``condition_predictor(**kwargs)`` until it is true; RuntimeError at timeout."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if condition_predictor(**kwargs):
                return
        except Exception as error:
            if raise_exceptions:
                raise
            last_error = error
        time.sleep(retry_interval_ms / 1000.0)
    message = "The condition wasn't met before the timeout expired."
    if last_error is not None:
        message += f" Last exception: {last_error!r}"
    raise RuntimeError(message)


async def async_wait_for_condition(condition_predictor: Callable[..., Any],
                                   timeout: float = 10, retry_interval_ms: float = 100,
                                   **kwargs: Any) -> None:
    """:func:`wait_for_condition` for a coroutine; the predicate may be async."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = condition_predictor(**kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
        except Exception as error:
            last_error = error
        await asyncio.sleep(retry_interval_ms / 1000.0)
    message = "The condition wasn't met before the timeout expired."
    if last_error is not None:
        message += f" Last exception: {last_error!r}"
    raise RuntimeError(message)


def create_remote_signal_actor(ray_module: Any) -> Any:
    """The signal actor, for the tests that build it from the ``ray`` module they were
    given (Ray's client tests pass its client's module; the harness never does)."""
    return SignalActor


def client_test_enabled() -> bool:
    """Ray's tests skip some cases under Ray Client; the harness never runs it."""
    return False


def client_mode_should_convert() -> bool:
    """Whether calls go through Ray Client (``ray._private.client_mode_hook``): never."""
    return False


def wait_for_pid_to_exit(pid: int, timeout: float = 20) -> None:
    """Wait until process ``pid`` is gone (a zombie counts as gone); RuntimeError at
    timeout."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise RuntimeError(f"process {pid} was still running after {timeout} s")


def kill_actor_and_wait_for_failure(actor: Any, timeout: float = 10,
                                    retry_interval_ms: float = 100) -> None:
    """``ray.kill(actor)``, then wait until a call to it fails with the actor's death."""
    ray.kill(actor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
        time.sleep(retry_interval_ms / 1000.0)
    raise RuntimeError(f"{actor!r} still answered calls {timeout} s after ray.kill")


def external_redis_test_enabled() -> bool:
    """Ray's tests skip some cases against an external Redis; the harness never uses one."""
    return False


def run_string_as_driver(driver_script: str, env: dict[str, str] | None = None,
                         encode: str = "utf-8") -> str:
    """Run ``driver_script`` in a fresh interpreter (``import ray`` resolves the same way
    as here); its stdout and stderr, or CalledProcessError if it exits non-zero."""
    proc = subprocess.run([sys.executable, "-"], input=driver_script.encode(encode),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env if env is not None else os.environ.copy(), timeout=300)
    output = proc.stdout.decode(encode, errors="replace")
    if proc.returncode:
        print(output)
        raise subprocess.CalledProcessError(proc.returncode, proc.args, output)
    return output


def run_string_as_driver_nonblocking(driver_script: str, env: dict[str, str] | None = None,
                                     ) -> subprocess.Popen[bytes]:
    """Start ``driver_script`` in a fresh interpreter; the caller waits for it."""
    proc = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env if env is not None else os.environ.copy())
    assert proc.stdin is not None
    proc.stdin.write(driver_script.encode("utf-8"))
    proc.stdin.close()
    return proc


def generate_system_config_map(**kwargs: Any) -> dict[str, Any]:
    """Ray's tests parametrize a runtime fixture with this to set Ray's internal system
    config; lightwork has none, so the runtime starts with its defaults (the tests that
    use it are not public by the harness's rule: they tune Ray's internals)."""
    return {}


def __getattr__(name: str) -> Any:
    """Any other helper of Ray's test utilities: importable, so a test module that
    imports it at the top still loads; calling it fails, naming it."""
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"the harness has no lightwork version of Ray's test helper {name!r}: it reads "
            "Ray's internals, so the tests that use it are not public")

    missing.__name__ = name
    return missing
