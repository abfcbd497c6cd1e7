"""The install check of ``make test``: lightwork works as a package, not only as a checkout.

    python tests/packaging/check_install.py [--python PYTHON] [--keep]

1. ``python -m build`` makes an sdist and, from it, a wheel, into a temporary directory
   (so the wheel is proof the sdist holds everything a build needs). Both are listed:
   the dashboard's static files are in each, and the wheel carries the C module.
2. Two fresh venvs (``PYTHON -m venv``; ``--python`` tries another interpreter) install
   * the wheel, whose ``lightwork._collector`` must import;
   * the sdist, built with no compiler (``CC=false``: the extension is optional, so the
     install must go on without it) and run with ``LIGHTWORK_PURE_PYTHON=1``.
   The first venv's pip downloads the dependencies once (``pip download``: the package
   registry, and pip's own cache); both installs then use ``--no-index --find-links``.
3. In each venv, from a directory outside the checkout, ``smoke.py`` runs tasks, an
   actor, put/get and wait and writes a timeline, then holds its session open while the
   venv's ``lightwork status`` and ``lightwork version`` run, and ``lightwork dashboard``
   serves its page and script (fetched with the token, as a browser would).

Every child has a timeout; a failure prints the step, its command and its output. Each
venv has its own ``TMPDIR``, so the CLI finds that venv's session and no other user's of
the machine. Standard library only: any Python 3.10+ can run it, with ``build`` installed.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import os
import queue
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("smoke.py")
STATIC = ("index.html", "dashboard.js", "dashboard.css")
BUILD_TIMEOUT = 300  # the build's isolated envs may download setuptools; the C compile
STEP_TIMEOUT = 120  # a venv, an install, a CLI command


class CheckFailed(Exception):
    pass


def run(step: str, cmd: Sequence[str | Path], timeout: float = STEP_TIMEOUT,
        **kwargs: object) -> str:
    """Run ``cmd``; its output on success, else :class:`CheckFailed` saying what failed."""
    cmd = [str(c) for c in cmd]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    except subprocess.TimeoutExpired as exc:
        output = exc.output or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        raise CheckFailed(f"{step}: no answer in {timeout:.0f} s: {' '.join(cmd)}\n{output}")
    if proc.returncode != 0:
        raise CheckFailed(f"{step}: exit status {proc.returncode}: {' '.join(cmd)}\n{proc.stdout}")
    print(f"  {step} ({time.monotonic() - started:.1f} s)", flush=True)
    return proc.stdout


class Child:
    """A long-running child whose output lines are read by a thread, so that waiting for
    a line can time out."""

    def __init__(self, name: str, cmd: Sequence[str | Path], **kwargs: object) -> None:
        self.name = name
        self.cmd = [str(c) for c in cmd]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     **kwargs)  # type: ignore[call-overload]
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = STEP_TIMEOUT) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(left, 0))
            except queue.Empty:
                raise self.failure(f"printed no line matching {pattern!r} in {timeout:.0f} s")
            if line is None:
                self.proc.wait()
                raise self.failure(f"exited ({self.proc.returncode}) before printing "
                                   f"a line matching {pattern!r}")
            self.lines.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def finish(self, timeout: float = STEP_TIMEOUT) -> None:
        """Send a line on its stdin (the smoke program's signal to end) and wait."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self.failure(f"did not exit in {timeout:.0f} s after it was told to")
        try:  # the rest of its output (a worker that outlives it may hold the pipe)
            while (line := self._queue.get(timeout=5)) is not None:
                self.lines.append(line)
        except queue.Empty:
            pass
        if self.proc.returncode != 0:
            raise self.failure(f"exit status {self.proc.returncode}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def failure(self, what: str) -> CheckFailed:
        self.stop()
        return CheckFailed(f"{self.name} {what}: {' '.join(self.cmd)}\n{''.join(self.lines)}")


def copy_source(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked or new, not ignored), copied: the
    build then writes its egg-info there, not in the checkout, and cannot pick up a stale
    one (whose file list setuptools would reuse). Outside git (an sdist), every file but
    the build's own leftovers."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=REPO, capture_output=True,
                                check=True, timeout=30).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
            ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so"))
        return dest
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet staged is still listed
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def build(python: str, source: Path, out: Path) -> tuple[Path, Path]:
    run("build the sdist and the wheel", [python, "-m", "build", "--outdir", out, source],
        timeout=BUILD_TIMEOUT)
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(f"the build made {wheels + sdists}, not one wheel and one sdist")
    wheel, sdist = wheels[0], sdists[0]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    missing = [f"lightwork/dashboard/static/{s}" for s in STATIC
               if f"lightwork/dashboard/static/{s}" not in names]
    if not any(re.fullmatch(r"lightwork/_collector\..*(so|pyd)", n) for n in names):
        missing.append("lightwork/_collector (the compiled module)")
    with tarfile.open(sdist) as t:
        root = sdist.name[: -len(".tar.gz")]
        sdist_names = set(t.getnames())
    missing += [f"{sdist.name}: {n}" for n in
                [f"src/lightwork/dashboard/static/{s}" for s in STATIC]
                + ["src/lightwork/_collector.c", "setup.py", "pyproject.toml"]
                if f"{root}/{n}" not in sdist_names]
    if missing:
        raise CheckFailed("the packages lack: " + ", ".join(missing))
    return wheel, sdist


def make_venv(python: str, where: Path) -> Path:
    run(f"make a venv ({where.name})", [python, "-m", "venv", where])
    return where / "bin"


def fetch_dashboard(url: str) -> None:
    """Fetch the page and its script as a browser would: the token in the URL, traded for
    a cookie by a redirect."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(url, timeout=30) as response:
        page = response.read().decode()
    if response.status != 200 or "dashboard.js" not in page:
        raise CheckFailed(f"the dashboard's page at {url} answered {response.status}:\n"
                          f"{page[:500]}")
    base = url.split("?")[0].rstrip("/")
    for name in ("dashboard.js", "dashboard.css"):
        with opener.open(f"{base}/static/{name}", timeout=30) as response:
            body = response.read()
        if response.status != 200 or not body:
            raise CheckFailed(f"the dashboard's /static/{name} answered {response.status}, "
                              f"{len(body)} bytes")


def smoke(bin_dir: Path, work: Path, expect_c: bool, env: dict[str, str]) -> None:
    """The smoke program in the venv, and the venv's CLI against its session."""
    work.mkdir()
    (work / "tmp").mkdir()
    env = {**env, "TMPDIR": str(work / "tmp")}  # this venv's sessions only
    program = Child("the smoke program",
                    [bin_dir / "python", SMOKE, "with-c" if expect_c else "without-c",
                     work / "timeline.json"], cwd=work, env=env)
    try:
        program.wait_for("^READY$")
        status = run("lightwork status", [bin_dir / "lightwork", "status"], cwd=work, env=env)
        for key in ("session", "workers", "actors", "tasks"):
            if not re.search(rf"^{key}\b", status, re.MULTILINE):
                raise CheckFailed(f"lightwork status printed no {key!r} line:\n{status}")
        finished = re.search(r"finished (\d+)", status)
        if not finished or int(finished.group(1)) < 21:  # 20 squares and a total, at least
            raise CheckFailed(f"lightwork status does not count the program's tasks:\n{status}")
        version = run("lightwork version", [bin_dir / "lightwork", "version"], cwd=work, env=env)
        dashboard = Child("lightwork dashboard",
                          [bin_dir / "lightwork", "dashboard", "--port", "0"], cwd=work, env=env)
        try:
            url = dashboard.wait_for(r"(http://127\.0\.0\.1:\d+/\?token=\S+)").group(1)
            fetch_dashboard(url)
            print("  the dashboard served its page, script and style sheet", flush=True)
        finally:
            dashboard.stop()
        program.finish()
    finally:
        program.stop()
    print(f"  smoke program passed: {program.lines[0].strip()}; version {version.strip()}",
          flush=True)


def check(python: str, tmp: Path) -> None:
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LIGHTWORK_PURE_PYTHON")
           and not k.startswith("LIGHTWORK_TEST")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    builder = sys.executable
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        # The wheel is for the interpreter that builds it: another one builds its own.
        builder = str(make_venv(python, tmp / "venv-build") / "python")
        run("install build", [builder, "-m", "pip", "install", "-q", "build"], env=env)
    wheel, sdist = build(builder, copy_source(tmp / "source"), tmp / "dist")
    wheels = tmp / "wheels"
    offline = ["--no-index", "--find-links", wheels, "--no-cache-dir"]

    print(f"the wheel {wheel.name}, with its C module:", flush=True)
    bin_dir = make_venv(python, tmp / "venv-wheel")
    with open(REPO / "pyproject.toml", "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    run("download the dependencies (and the sdist's build requirements)",
        [bin_dir / "python", "-m", "pip", "download", "-q", "-d", wheels, wheel, *requires],
        env=env)
    run("install the wheel", [bin_dir / "python", "-m", "pip", "install", "-q", *offline, wheel],
        env=env)
    smoke(bin_dir, tmp / "run-wheel", expect_c=True, env=env)

    print(f"the sdist {sdist.name}, built with no compiler, run pure Python:", flush=True)
    bin_dir = make_venv(python, tmp / "venv-sdist")
    run("install the sdist (CC=false)",
        [bin_dir / "python", "-m", "pip", "install", "-q", *offline, sdist],
        env={**env, "CC": "false", "CXX": "false"})
    smoke(bin_dir, tmp / "run-sdist", expect_c=False, env={**env, "LIGHTWORK_PURE_PYTHON": "1"})
    print(f"install check passed in {time.monotonic() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the fresh venvs (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    # Short: the sessions' control sockets live under the venvs' TMPDIR, and a Unix
    # socket's path has at most 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="lwi-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        check(args.python, tmp)
    except CheckFailed as exc:
        print(f"install check FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
