"""hooks/commit-msg on good and bad messages, on its own and as git runs it; and the
Makefile's ``hooks`` target, which installs it only at the top of a git checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "hooks" / "commit-msg"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True,
                          timeout=30, check=False)


@pytest.mark.parametrize("message", [
    "Add the install check\n",
    ("Add the install check\n\nA wheel and an sdist, each in a fresh venv, because a user\n"
     "installs a package, not a checkout.\n"),
    "x" * 72 + "\n",
    "Sync path: 34 µs × 1.0 " + "é" * 49 + "\n",  # 72 characters, more bytes
    "\n\nLeading blank lines are dropped by git\n",
    "Subject\n\nBody\n# Please enter the commit message for your changes.\n# " + "c" * 90 + "\n",
    ("Subject\n\nBody\n# ------------------------ >8 ------------------------\n"
     "diff --git a/x b/x\n" + "+" + "y" * 100 + "\n"),
    "Merge branch 'a-branch-with-a-long-name' into another-branch-with-a-long-name-too\n",
    'Revert "' + "z" * 70 + '"\n\nThis reverts commit abc.\n',
    "fixup! " + "w" * 72 + "\n",
    "squash! " + "w" * 72 + "\n",
    "",  # empty: git refuses it itself
])
def test_good_messages_pass(tmp_path: Path, message: str) -> None:
    result = check(tmp_path, message)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_a_long_subject_is_refused_saying_how_long(tmp_path: Path) -> None:
    subject = "Sync path: " + "µ" * 62  # 73 characters
    result = check(tmp_path, subject + "\n\nWhy.\n")
    assert result.returncode == 1
    assert "the subject is 73 characters; at most 72" in result.stderr
    assert subject in result.stderr
    assert "COMMIT_EDITMSG" in result.stderr  # where the message is kept


def test_a_body_needs_a_blank_line_after_the_subject(tmp_path: Path) -> None:
    result = check(tmp_path, "Subject\nbody straight after it\n")
    assert result.returncode == 1
    assert "line 2 must be blank" in result.stderr
    assert "body straight after it" in result.stderr


def test_both_faults_are_reported_at_once(tmp_path: Path) -> None:
    result = check(tmp_path, "s" * 80 + "\nbody\n")
    assert result.returncode == 1
    assert "80 characters" in result.stderr and "line 2 must be blank" in result.stderr


def test_a_long_body_line_is_only_a_warning(tmp_path: Path) -> None:
    long_line = " ".join(["word"] * 20)
    unwrappable = f"    {'indented ' * 10}\nhttps://x/{'u' * 80}"  # code, a URL
    result = check(tmp_path, f"Subject\n\n{long_line}\n{unwrappable}\n")
    assert result.returncode == 0
    assert result.stderr.count("warning") == 1
    assert "body line 3 is 99 characters" in result.stderr


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-c", "user.name=Test", "-c", "user.email=test@example.com",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)


def test_git_runs_the_hook(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git(repo, "init", "-q").returncode == 0
    assert git(repo, "config", "core.hooksPath", str(HOOK.parent)).returncode == 0
    (repo / "f").write_text("1")
    git(repo, "add", "f")
    refused = git(repo, "commit", "-q", "-m", "a" * 73)
    assert refused.returncode != 0
    assert "the subject is 73 characters" in refused.stderr
    assert git(repo, "rev-list", "--all").stdout == ""  # nothing was committed
    landed = git(repo, "commit", "-q", "-m", "Add f\n\nBecause the test needs a commit.")
    assert landed.returncode == 0, landed.stderr
    assert git(repo, "log", "--format=%s").stdout == "Add f\n"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_sets_hooks_path_only_at_the_top_of_a_checkout(tmp_path: Path) -> None:
    def copy_into(where: Path) -> Path:
        where.mkdir(parents=True)
        shutil.copy(REPO / "Makefile", where)
        shutil.copytree(HOOK.parent, where / "hooks")
        return where

    def make_hooks(where: Path) -> None:
        result = subprocess.run(["make", "-s", "hooks"], cwd=where, capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr

    def hooks_path(repo: Path) -> str:
        return git(repo, "config", "core.hooksPath").stdout.strip()

    checkout = copy_into(tmp_path / "checkout")
    git(checkout, "init", "-q")
    make_hooks(checkout)
    assert hooks_path(checkout) == "hooks"
    make_hooks(checkout)  # again: nothing to change
    assert hooks_path(checkout) == "hooks"

    # An unpacked sdist inside some other repository: that repository's config is not
    # touched; and outside any repository, make just goes on.
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    make_hooks(copy_into(outer / "lightwork-0.1.0"))
    assert hooks_path(outer) == ""
    make_hooks(copy_into(tmp_path / "plain" / "lightwork-0.1.0"))
