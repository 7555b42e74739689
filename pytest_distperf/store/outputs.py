"""Every path a run will write, checked before the first job starts, so an unwritable report or baseline fails
the session at once, naming what is in the way. The check creates (and removes) an empty file in the nearest
existing folder: permission bits alone do not answer (root, ACLs, read-only mounts). Outputs must also stay apart
(check_apart): two reports in one file, a report in the baselines folder or over the history database would
silently replace what is there.
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


def check_apart(outputs: list[tuple[str, str]], baselines: tuple[str, str] | None = None,
                history: tuple[str, str] | None = None) -> None:
    """No two `outputs` ((option, path)) are one file, none lies inside the baselines folder and none is the
    history database ((option, path) each): the later write would silently replace the other (a report, a
    stored baseline, every session's history). Paths are compared resolved (symlinks, hard links)."""
    seen: list[tuple[str, str]] = []
    for what, path in outputs:
        real = _real(path)
        for other, other_real in seen:
            if _same_file(real, other_real):
                raise OutputPathError(f"{what}: {real} is also the file of {other}; one would replace the other: "
                                      f"give each its own file")
        if history is not None and _same_file(real, _real(history[1])):
            raise OutputPathError(f"{what}: {real} is the {history[0]} database; the report would replace every "
                                  f"session's history: give another file")
        if baselines is not None:
            folder = _real(baselines[1])
            if real != folder and os.path.commonpath([real, folder]) == folder:
                raise OutputPathError(f"{what}: {real} lies inside the baselines folder {folder} ({baselines[0]}); "
                                      f"a report there would replace a stored baseline or be read as one: give a "
                                      f"path outside it")
        seen.append((what, real))


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def _same_file(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)  # two names of one file (a hard link)
    except OSError:  # one does not exist yet: only the names could say
        return False


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
    if e.errno == errno.EPERM and os.access(path, os.W_OK):
        # the mode allows writing, so something beside it refuses: an immutable attribute, or a security policy
        return (f"operation not permitted, though {_mode(path)} allows writing: the folder may be immutable "
                f"(`lsattr -d {path}`) or refused by a security policy")
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied ({_mode(path)})"
    if e.errno == errno.ENOENT and os.path.isdir(path):  # the folder is there: its file system makes no new files
        return "its file system creates no files there: a virtual file system such as /proc or /sys?"
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
