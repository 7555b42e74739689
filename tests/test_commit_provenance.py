"""A measurement names the commit it ran: and, where the tree held uncommitted changes, says so (launch/fingerprint.py:
git_state, commit_text), in the environment every baseline, report and history session records."""

from __future__ import annotations

import os
import subprocess

import pytest

from pytest_distperf.launch import fingerprint


def _git(repo, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_a_clean_tree_is_its_commit(repo):
    head = _git(repo, "rev-parse", "HEAD")
    assert fingerprint.git_state(str(repo)) == {"git_commit": head, "git_dirty": False, "git_dirty_files": 0}
    assert fingerprint.commit_text(fingerprint.git_state(str(repo))) == head[:12]


def test_uncommitted_changes_are_recorded_with_the_files_counted(repo):
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("x = 2\n")  # changed, not staged
    (repo / "b.py").write_text("x = 3\n")
    _git(repo, "add", "b.py")  # staged
    (repo / "new.py").write_text("y = 1\n")  # untracked: not HEAD's code either way, not counted (as --against)
    state = fingerprint.git_state(str(repo))
    assert state == {"git_commit": head, "git_dirty": True, "git_dirty_files": 2}
    assert fingerprint.commit_text(state) == f"{head[:12]} + uncommitted changes"
    meta = fingerprint.soft_metadata("cpu", str(repo))
    assert (meta["git_commit"], meta["git_dirty"], meta["git_dirty_files"]) == (head, True, 2)


def test_outside_a_repository_nothing_is_claimed(tmp_path):
    assert fingerprint.git_state(str(tmp_path)) == {"git_commit": None}
    assert fingerprint.commit_text(fingerprint.git_state(str(tmp_path))) == "?"


def test_commit_text_of_records_old_and_new():
    assert fingerprint.commit_text({"git_commit": "cc03c20" + "0" * 33}) == "cc03c20" + "0" * 5  # an old record
    assert fingerprint.commit_text({"git_commit": "cc03c20" + "0" * 33, "git_dirty": False}) == "cc03c20" + "0" * 5
    assert fingerprint.commit_text({"git_commit": "cc03c20", "git_dirty": True}) == "cc03c20 + uncommitted changes"
    assert fingerprint.commit_text({}) == fingerprint.commit_text(None) == "?"
    assert fingerprint.describe_commit("abc", True, width=2) == "ab + uncommitted changes"
