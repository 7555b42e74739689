"""Every path a run will write, checked before the first job starts, so an unwritable report or baseline fails
the session at once, naming what is in the way. The check creates (and removes) an empty file in the nearest
existing folder: permission bits alone do not answer (root, ACLs, read-only mounts).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

# Command-line options (dest -> flag) whose value is a file the session writes. Options that other
# modules add (reports, history) belong here too, so one configure-time check covers them all.
REPORT_FILE_OPTIONS: dict[str, str] = {
    "distperf_json": "--distperf-json",
    "distperf_benchmark_json": "--distperf-benchmark-json",
    "distperf_html": "--distperf-html",
    "distperf_pr_comment": "--distperf-pr-comment",
    "xmlpath": "--junitxml",  # pytest's own JUnit report: written at the end of the session too
}


class OutputPathError(ValueError):
    """A path the run would write cannot be written; the message names it and what is in the way."""


def check_file(path: str, what: str) -> None:
    """`path` can be written as a file (it may not exist yet, nor its folders)."""
    target = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(target):
        raise OutputPathError(f"{what}: {target} is a folder; give a file path")
    if os.path.lexists(target) and not os.path.isfile(target):
        raise OutputPathError(f"{what}: {target} exists and is not a regular file ({_kind(target)})")
    _check_folder_chain(os.path.dirname(target), what, f"write {target}")
    if os.path.isfile(target) and not os.access(target, os.W_OK):
        raise OutputPathError(f"{what}: {target} exists and is not writable ({_mode(target)})")


def check_folder(path: str, what: str) -> None:
    """`path` is, or can be created as, a folder that files can be written in."""
    _check_folder_chain(os.path.abspath(os.path.expanduser(path)), what, None)


def _check_folder_chain(folder: str, what: str, goal: str | None) -> None:
    """The folder exists or can be made: the first existing part of its path is a writable folder.
    `goal`: what the folder is for, for messages ("write <file>"); None when the folder is the goal."""
    existing = folder
    while not os.path.lexists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    goal = goal or (f"create folder {folder}" if existing != folder else f"write in folder {folder}")
    if not os.path.isdir(existing):
        if existing == folder and goal.startswith("write in"):
            raise OutputPathError(f"{what}: {folder} is a {_kind(existing)}, not a folder")
        raise OutputPathError(f"{what}: cannot {goal}: {existing} is a {_kind(existing)}, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".distperf-write-check-", dir=existing)
    except OSError as e:
        raise OutputPathError(f"{what}: cannot {goal}: folder {existing} is not writable "
                              f"({_reason(e, existing)})") from None
    os.close(fd)
    os.unlink(probe)


def _reason(e: OSError, path: str) -> str:
    if e.errno == errno.EROFS:
        return "read-only file system"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied ({_mode(path)})"
    return e.strerror or str(e)


def _mode(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "mode unknown"
    return f"mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"


_KINDS = {stat.S_IFREG: "file", stat.S_IFDIR: "folder", stat.S_IFIFO: "named pipe", stat.S_IFSOCK: "socket"}


def _kind(path: str) -> str:
    if os.path.islink(path) and not os.path.exists(path):
        return "broken symbolic link"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "path that cannot be read"
    return _KINDS.get(stat.S_IFMT(mode), "special file")
