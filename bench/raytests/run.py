"""Run Ray's own test files, unchanged, on lightwork and on Ray; write a results table.

Each test file runs under pytest in a process of its own (``RAYTESTS_TARGET`` picks what
``import ray`` is, see ``shim/sitecustomize.py``), with the harness's fixtures and
results log (``shim/raytests_plugin.py``). The runner watches the log: a test that runs
past ``--timeout`` seconds has its process group killed, is recorded as ``timeout``, and
the file runs again without the tests already done; a process that dies in a test
(``crashed``) is handled the same way. So one hang or crash costs one test, never a
file or the run.

Output, in ``--out`` (default ``bench/raytests/results``): ``<target>.json`` per runtime
(every test: outcome, seconds, failure message, what makes it not public) and
``summary.md``, from every ``<target>.json`` there. A test is *public* when it passes
on Ray and neither takes a fixture of Ray's internals or of several nodes nor mentions
Ray's private modules or its GCS in its own source.

    python bench/raytests/run.py /work/raytests/upstream --target both
    python bench/raytests/run.py DIR --target lightwork --files test_cancel.py -k chain
    python bench/raytests/run.py --report          # summary.md from saved results
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"
SRC = HERE.parent.parent / "src"
TARGETS = ("ray", "lightwork")
GRACE_S = 30.0  # extra time for a runtime to start before the first test, or shut down


def environment(target: str, log: Path) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(SHIM)]
    if target == "lightwork":
        path.append(str(SRC))  # this checkout's lightwork, not an installed one
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(path), RAYTESTS_TARGET=target,
               RAYTESTS_LOG=str(log), PYTHONFAULTHANDLER="1",
               RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0")
    return env


def outcome_of(phases: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """One outcome for a test from its setup, call and teardown reports."""
    for when in ("setup", "call", "teardown"):
        phase = phases.get(when)
        if phase is None:
            continue
        if phase["outcome"] == "failed":
            return ("failed" if when == "call" else "error"), phase["message"]
        if phase["outcome"] == "skipped":
            return "skipped", phase["message"]
    return ("passed", "") if "call" in phases else ("crashed", "no report of the call")


class FileRun:
    """One test file on one runtime, rerun past each timeout or crash."""

    def __init__(self, directory: Path, name: str, target: str, timeout: float,
                 python: str, extra: list[str], work: Path) -> None:
        self.directory, self.name, self.target = directory, name, target
        self.timeout, self.python, self.extra = timeout, python, extra
        self.log = work / f"{target}-{name}.jsonl"
        self.output = work / f"{target}-{name}.out"
        self.private: dict[str, list[str]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.collect_errors: list[str] = []

    def run(self) -> None:
        self.output.write_text("")
        while self._one_process():
            pass

    def _one_process(self) -> bool:
        """Run pytest once; True if it must run again for the tests left."""
        self.log.write_text("")
        command = [self.python, "-m", "pytest", "-c", str(SHIM / "pytest.ini"),
                   "--rootdir", str(self.directory), "-q", "-rN", self.name, *self.extra]
        for nodeid in self.results:
            command += ["--deselect", nodeid]
        with open(self.output, "a") as out:
            proc = subprocess.Popen(command, cwd=self.directory, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env=environment(self.target, self.log),
                                    preexec_fn=_default_sigint)
        phases: dict[str, dict[str, dict[str, Any]]] = {}
        current: str | None = None
        since = last = time.monotonic()
        seen = 0
        collected = False
        while True:
            exited = proc.poll() is not None
            lines = self.log.read_text().splitlines()
            for line in lines[seen:]:
                record = json.loads(line)
                last = time.monotonic()
                if record["event"] == "collected":
                    collected = True
                    self.private.update(record["tests"])
                elif record["event"] == "collect_error":
                    self.collect_errors.append(record["message"])
                elif record["event"] == "start":
                    current, since = record["nodeid"], last
                elif record["event"] == "report":
                    phases.setdefault(record["nodeid"], {})[record["when"]] = record
                    if record["when"] == "teardown":
                        self._finish(record["nodeid"], phases.pop(record["nodeid"]))
                        current = None
            seen = len(lines)
            if exited:
                break
            now = time.monotonic()
            if current is not None and now - since > self.timeout:
                self._kill(proc)
                self.results[current] = {"outcome": "timeout", "duration": round(now - since, 1),
                                         "message": f"still running after {self.timeout:g} s"}
                return True
            if current is None and now - last > self.timeout + GRACE_S:
                self._kill(proc)  # hung collecting, or shutting down after the last test
                break
            time.sleep(0.2)
        if current is not None and current not in self.results:
            self._finish(current, phases.pop(current, {}), died=proc.returncode)
            return True
        left = [nodeid for nodeid in self.private if nodeid not in self.results]
        if collected and left:
            for nodeid in left:  # never started: deselected by -k, or the run hung
                self.private.pop(nodeid)
        return False

    def _finish(self, nodeid: str, phases: dict[str, dict[str, Any]],
                died: int | None = None) -> None:
        outcome, message = outcome_of(phases)
        if died is not None:
            outcome, message = "crashed", f"the pytest process exited ({died}) in this test"
        duration = sum(phase["duration"] for phase in phases.values())
        self.results[nodeid] = {"outcome": outcome, "duration": round(duration, 3),
                                "message": message}

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _default_sigint() -> None:
    """In the test process, before it starts: SIGINT back to its default. A runner
    started in the background by a shell inherits SIGINT ignored, and so would every
    worker; a runtime's cancel (a SIGINT to the task's worker) then fails, which would
    count against the runtime, not the harness."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def version_of(target: str, python: str) -> str:
    code = "import ray; print(getattr(ray, '__version__', '?'))"
    env = environment(target, Path(os.devnull))
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    return done.stdout.strip() or done.stderr.strip()[-200:]


def run_target(directory: Path, files: list[str], target: str, args: argparse.Namespace,
               out: Path) -> dict[str, Any]:
    work = out / "logs"
    work.mkdir(parents=True, exist_ok=True)
    tests: dict[str, Any] = {}
    file_errors: dict[str, list[str]] = {}
    for name in files:
        started = time.monotonic()
        run = FileRun(directory, name, target, args.timeout, args.python, args.pytest_args, work)
        run.run()
        for nodeid, result in run.results.items():
            tests[nodeid] = {**result, "private": run.private.get(nodeid, [])}
        if run.collect_errors:
            file_errors[name] = run.collect_errors
        counts = _count(run.results.values())
        print(f"{target:9} {name:36} {counts}  ({time.monotonic() - started:.0f} s)",
              flush=True)
    return {"target": target, "version": version_of(target, args.python),
            "timeout_s": args.timeout, "tests": tests, "collect_errors": file_errors}


def _count(results: Any) -> str:
    tally: dict[str, int] = {}
    for result in results:
        tally[result["outcome"]] = tally.get(result["outcome"], 0) + 1
    return " ".join(f"{key}={tally[key]}" for key in sorted(tally)) or "no tests"


def summary(out: Path) -> str:
    """summary.md's text from the ``<target>.json`` files in ``out``."""
    runs = {t: json.loads((out / f"{t}.json").read_text()) for t in TARGETS
            if (out / f"{t}.json").exists()}
    ray_tests = runs.get("ray", {}).get("tests", {})
    lw_tests = runs.get("lightwork", {}).get("tests", {})
    # Not public by either run's reading (the rule may have changed since one ran).
    public = sorted(n for n, r in ray_tests.items() if r["outcome"] == "passed"
                    and not r["private"] and not lw_tests.get(n, {}).get("private"))
    lines = ["# Ray's core tests, unchanged, on Ray and on lightwork", ""]
    for target, run in runs.items():
        lines.append(f"- {target} {run['version']}: {_count(run['tests'].values())} "
                     f"(timeout {run['timeout_s']:g} s a test)")
    if ray_tests and lw_tests:
        passing = [n for n in public if lw_tests.get(n, {}).get("outcome") == "passed"]
        lines += ["", f"**Public tests (pass on Ray, public API only): {len(public)}; "
                      f"lightwork passes {len(passing)} of them.**", "",
                  "| file | tests | pass on Ray | public | public passing on lightwork |",
                  "|---|---|---|---|---|"]
        for name in sorted({n.split("::")[0] for n in ray_tests}):
            mine = [n for n in ray_tests if n.split("::")[0] == name]
            pub = [n for n in public if n.split("::")[0] == name]
            lines.append(f"| {name} | {len(mine)} | "
                         f"{sum(ray_tests[n]['outcome'] == 'passed' for n in mine)} | "
                         f"{len(pub)} | {sum(n in passing for n in pub)} |")
        lines += ["", "## Public tests lightwork does not pass", "",
                  "| test | on lightwork | why (first line) |", "|---|---|---|"]
        for nodeid in public:
            result = lw_tests.get(nodeid, {"outcome": "not run", "message": ""})
            if result["outcome"] != "passed":
                why = (result["message"].splitlines() or [""])[0][:140].replace("|", "\\|")
                lines.append(f"| `{nodeid}` | {result['outcome']} | {why} |")
    for target, run in runs.items():
        for name, errors in sorted(run.get("collect_errors", {}).items()):
            first = (errors[0].splitlines() or [""])[-1][:160]
            lines.append(f"\n{target}: {name} did not import: {first}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", type=Path,
                        help="a directory of Ray's test files (python/ray/tests of a checkout)")
    parser.add_argument("--target", choices=(*TARGETS, "both"), default="lightwork")
    parser.add_argument("--files", nargs="*", help="test files in DIRECTORY (default: all test_*.py)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a test (default 60)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--report", action="store_true", help="only write summary.md")
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.pytest_args = pytest_args  # after --: passed to pytest (e.g. -- -k chain)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        if args.directory is None or not args.directory.is_dir():
            parser.error("give the directory of Ray's test files (see README.md)")
        directory = args.directory.resolve()
        files = args.files or sorted(p.name for p in directory.glob("test_*.py"))
        for target in (TARGETS if args.target == "both" else (args.target,)):
            result = run_target(directory, files, target, args, args.out)
            path = args.out / f"{target}.json"
            if path.exists() and args.files:  # a partial run updates the saved one
                saved = json.loads(path.read_text())
                saved["tests"] = {n: r for n, r in saved["tests"].items()
                                  if n.split("::")[0] not in files}
                saved["tests"].update(result["tests"])
                saved["collect_errors"] = {**{k: v for k, v in saved.get("collect_errors", {}).items()
                                              if k not in files}, **result["collect_errors"]}
                saved.update(version=result["version"], timeout_s=result["timeout_s"])
                result = saved
            path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    text = summary(args.out)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
