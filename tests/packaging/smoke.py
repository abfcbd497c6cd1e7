"""The smoke program of the install check: run by ``check_install.py`` with the python
of a fresh venv that installed lightwork from a wheel or an sdist, from a directory
outside the checkout.

    python smoke.py with-c|without-c TIMELINE_PATH

It checks that the package imported is the installed one (not the source tree), that
the compiled module is there or not as the build promised, that the version the package
reports is its metadata's, and that the dashboard's page shipped with it. Then it runs
tasks, an actor, ``put``/``get`` and ``wait``, writes a timeline, prints ``READY`` and
keeps its session open until a line arrives on stdin, so that the check can run the
venv's ``lightwork status`` and ``lightwork dashboard`` against it. Standard library and
lightwork only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys


def check_install(expect_c: bool) -> None:
    import lightwork

    here = os.path.realpath(lightwork.__file__)
    prefix = os.path.realpath(sys.prefix)
    assert here.startswith(prefix + os.sep), (
        f"lightwork was imported from {here}, not from the venv at {prefix}: the source "
        "tree leaked in (PYTHONPATH, or the current directory)")
    metadata_version = importlib.metadata.version("lightwork")
    assert lightwork.__version__ == metadata_version, (
        f"lightwork.__version__ is {lightwork.__version__!r} but the installed metadata "
        f"says {metadata_version!r}")
    has_c = importlib.util.find_spec("lightwork._collector") is not None
    assert has_c == expect_c, (
        f"lightwork._collector is {'importable' if has_c else 'missing'}, but this install "
        f"was meant to be {'with' if expect_c else 'without'} its C module")
    if has_c:
        import lightwork._collector  # it loads, not only exists
    static = os.path.join(os.path.dirname(here), "dashboard", "static")
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        assert os.path.isfile(os.path.join(static, name)), f"{name} is missing from {static}"
    print(f"lightwork {lightwork.__version__} from {os.path.dirname(here)}, "
          f"C module {'loaded' if has_c else 'absent'}", flush=True)


def run_program(timeline_path: str) -> None:
    import lightwork

    lightwork.init(num_cpus=2)

    @lightwork.remote
    def square(x: int) -> int:
        return x * x

    @lightwork.remote
    def total(values: list[int]) -> int:
        return sum(values)

    @lightwork.remote
    class Counter:
        def __init__(self) -> None:
            self.count = 0

        def add(self, n: int) -> int:
            self.count += n
            return self.count

    refs = [square.remote(i) for i in range(20)]
    ready, not_ready = lightwork.wait(refs, num_returns=len(refs), timeout=60)
    assert len(ready) == len(refs) and not not_ready, (len(ready), len(not_ready))
    assert lightwork.get(refs) == [i * i for i in range(20)]

    values = lightwork.put(list(range(1000)))
    assert lightwork.get(total.remote(values)) == sum(range(1000))
    blob = os.urandom(1 << 20)  # big enough to leave the pipe for shared memory
    assert lightwork.get(lightwork.put(blob)) == blob

    counter = Counter.remote()
    assert lightwork.get([counter.add.remote(1) for _ in range(5)]) == [1, 2, 3, 4, 5]

    lightwork.timeline(filename=timeline_path)
    with open(timeline_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {event.get("name") for event in events}
    assert "square" in names, f"the timeline has no 'square' task: {sorted(map(str, names))[:20]}"

    print("READY", flush=True)
    sys.stdin.readline()  # the check has run the CLI against this session
    lightwork.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    check_install(expect_c=sys.argv[1] == "with-c")
    run_program(sys.argv[2])
