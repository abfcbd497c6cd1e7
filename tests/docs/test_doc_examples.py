"""Every Python block of README.md and docs/ runs, and its shown output is checked.

The pages are read with sybil's Markdown lexers; each fenced block is one test, run in
page order, and the blocks of one page share a namespace (as a reader running them one
after another would). Conventions for page authors:

* a ```` ```python ```` block is run; what it prints is kept for the next block;
* an ```` ```output ```` block right after it is compared with what that block printed,
  with doctest's rules (``...`` matches anything, runs of whitespace are equal);
* ``<!-- skip: next -->`` before a block skips it: put a visible note beside it (for
  example an admonition "Not run by the tests: needs two machines") saying why;
* a page's runtime is shut down after its last block, whatever the page did.

A hang fails the block at the suite's timeout, with every thread's stack (pytest-timeout
and faulthandler, configured in pyproject.toml).
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import sys
import unittest
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

# The pages document lightwork (its output, its command line), not Ray.
pytestmark = pytest.mark.lightwork_only

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
OUTPUT_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
_STDOUT = "__lw_doc_stdout__"
_run_python = PythonEvaluator()


def run_python(example: Example) -> str | None:
    """Run the block; keep its stdout for an ``output`` block that may follow."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        _run_python(example)
    example.namespace[_STDOUT] = buffer.getvalue()
    return None


def check_output(example: Example) -> str | None:
    got = example.namespace.pop(_STDOUT, None)
    if got is None:
        return "an ```output block must come right after the ```python block it shows"
    want = str(example.parsed)
    checker = doctest.OutputChecker()
    if checker.check_output(want, got, OUTPUT_FLAGS):
        return None
    return "the block's output differs from the page:\n" + checker.output_difference(
        doctest.Example("", want), got, OUTPUT_FLAGS
    )


SYBIL = Sybil(
    parsers=[
        CodeBlockParser(language="python", evaluator=run_python),
        CodeBlockParser(language="output", evaluator=check_output),
        SkipParser(),
    ]
)


def _examples() -> list[tuple[Path, int, int]]:
    found = []
    for page in PAGES:
        document = SYBIL.parse(page)
        for index, example in enumerate(document.examples()):
            found.append((page, index, example.line))
    return found


EXAMPLES = _examples()


class _Page:
    """The live state of the page whose blocks are running: namespace and runtime."""

    def __init__(self, page: Path, cwd: str) -> None:
        self.page = page
        self.document = SYBIL.parse(page)
        self.examples = list(self.document.examples())
        self.failed: str | None = None
        self.cwd = cwd
        self.meta_path = list(sys.meta_path)
        self.modules = set(sys.modules)
        self.document.namespace["__name__"] = "__main__"

    def close(self) -> None:
        import lightwork

        if lightwork.is_initialized():
            lightwork.shutdown()
        os.chdir(self.cwd)
        # A page may install the `ray` alias (an import finder of lightwork's): take it
        # out again, so the rest of the suite imports what it imported before. Finders
        # other libraries added meanwhile (importlib_metadata's) stay.
        sys.meta_path[:] = [
            finder for finder in sys.meta_path
            if finder in self.meta_path
            or not type(finder).__module__.startswith("lightwork")
        ]
        for name in set(sys.modules) - self.modules:
            if name == "ray" or name.startswith("ray."):
                del sys.modules[name]


_current: list[_Page] = []


@pytest.fixture(scope="module", autouse=True)
def _close_last_page():
    yield
    while _current:
        _current.pop().close()


@pytest.mark.parametrize(
    "page,index,line",
    EXAMPLES,
    ids=[f"{p.relative_to(REPO)}:{line}" for p, _, line in EXAMPLES],
)
def test_example(page: Path, index: int, line: int, tmp_path_factory) -> None:
    if not _current or _current[-1].page != page:
        while _current:
            _current.pop().close()
        # Each page runs in a directory of its own, so files it writes stay out of the tree.
        cwd = os.getcwd()
        os.chdir(tmp_path_factory.mktemp(page.stem))
        _current.append(_Page(page, cwd))
    state = _current[-1]
    if state.failed:
        pytest.skip(f"an earlier block of this page failed ({state.failed})")
    example = state.examples[index]
    try:
        example.evaluate()
    except (unittest.SkipTest, pytest.skip.Exception):
        raise  # a block marked to be skipped: the page goes on
    except BaseException:
        state.failed = f"line {line}"
        raise
