"""The project's one atomic file writer and JSON reader: baselines, reports, benchmark checkpoints and the files
of a job folder all go through it.

Every JSON file it writes carries its format's version, `format_version` (1 unless the document says otherwise).
`Format` is the one upgrade mechanism (asv's rule): a format's reader registers `update_to_N` for each version N
after 1; a file older than the code is brought up to date in memory, one step at a time, and a file newer than
the code is refused with an error that names it and both versions.

Writes are atomic, optionally under the folder's lock file so concurrent writers (xdist workers, two sessions)
serialise; a temporary file carries its writer's pid (`.<name>.<pid>.<random>.tmp`) so a crashed writer's is
removed. Reading never follows a symlink, and names the file in every error.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, TypeVar

from filelock import FileLock, Timeout

from pytest_distperf.errors import FileError

LOCK_NAME = ".distperf.lock"
LOCK_TIMEOUT_SECONDS = 120.0
STALE_TMP_SECONDS = 60.0  # a temp file this old is a crash's leftover even when its pid was reused
_TMP_PID = re.compile(r"\.(\d+)\.[^.]*\.tmp$")
VERSION_KEY = "format_version"
T = TypeVar("T")


class CorruptFileError(FileError):
    """A file whose contents cannot be used (corrupt, truncated, too large): replaceable, unlike an I/O error."""


class FormatVersionError(FileError):
    """A file written by a newer pytest-distperf than this one reads: left as it is."""


@dataclass
class Format:
    """One kind of file the plugin writes: its name in messages, its current version and, per version N after 1,
    `updates[N]` (update_to_N) that turns a version N-1 file into version N."""

    name: str
    version: int = 1
    updates: dict[int, Callable[[Any], Any]] = field(default_factory=dict)

    def check(self, found: Any, source: str) -> int:
        """`found` as a version this code reads (upgrade's check, also for a reader that must not change
        anything yet): CorruptFileError for a version that is not one, FormatVersionError for a newer one.
        `source` names the file in both."""
        if isinstance(found, bool) or not isinstance(found, int) or found < 1:
            raise CorruptFileError(f"{source}: not a distperf {self.name} ({VERSION_KEY} must be a positive "
                                   f"integer, got {found!r})")
        if found > self.version:
            raise FormatVersionError(f"{source}: {self.name} format version {found} is newer than the version "
                                     f"{self.version} this pytest-distperf reads; upgrade pytest-distperf (the "
                                     f"file was left as it is)")
        return found

    def upgrade(self, found: Any, subject: T, source: str) -> T:
        """`subject` (a document, or a database connection) of version `found` (check) brought to `version` by
        the registered updates, in order."""
        for n in range(self.check(found, source) + 1, self.version + 1):
            subject = self.updates[n](subject)
        return subject

    def load(self, doc: Any, source: str) -> dict[str, Any]:
        """A parsed document of this format at the current version (upgrade)."""
        if not isinstance(doc, Mapping):
            raise CorruptFileError(f"{source}: not a distperf {self.name} (expected an object, got "
                                   f"{type(doc).__name__})")
        return {**self.upgrade(doc.get(VERSION_KEY), dict(doc), source), VERSION_KEY: self.version}

    def stamp(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """`doc` with this format's current version."""
        return {VERSION_KEY: self.version, **doc}


def dumps(obj: Any) -> str:
    """Sorted keys, strict JSON (no NaN), a trailing newline: stable diffs for committed files."""
    return json.dumps(obj, sort_keys=True, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_json_atomic(path: str, obj: Any, *, lock: bool = True) -> None:
    """Write `obj` to `path` so that a reader sees the old file or the new one, never a torn one.

    Temporary file in the same folder (same filesystem), fsync, rename over, fsync the folder;
    under the folder's lock file when `lock` (so concurrent writers serialise). An object without its
    format_version is written at version 1.
    """
    if isinstance(obj, Mapping):
        obj = {VERSION_KEY: 1, **obj}
    try:
        text = dumps(obj)
    except ValueError as e:  # NaN/inf: json's message does not say which file
        raise FileError(f"{path}: cannot write non-finite numbers as JSON ({e})") from None
    write_text_atomic(path, text, lock=lock)


def write_text_atomic(path: str, text: str, *, lock: bool = False) -> None:
    """Write `text` (UTF-8) to `path` whole or not at all, as write_json_atomic does: a report page or comment
    that a reader never sees half written."""
    _make_folder(os.path.dirname(os.path.abspath(path)))
    with folder_lock(path) if lock else contextlib.nullcontext():
        try:
            write_bytes_atomic(path, text.encode("utf-8"), mode=0o644)  # a committed file is world-readable
        except OSError as e:
            raise FileError(f"cannot write {path}: {e.strerror or e}") from None


def _make_folder(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise FileError(f"cannot create folder {folder}: {e.strerror or e}") from None
    if not os.path.isdir(folder):
        raise FileError(f"{folder} is not a folder")


@contextlib.contextmanager
def folder_lock(path: str) -> Iterator[None]:
    """Hold the lock file of `path`'s folder (made if missing) as a writer of `path`, so concurrent writers
    serialise (a reader that must see what a write replaces holds it across both); crashed writers' temp files
    are removed under it. FileError naming `path` when the lock cannot be had."""
    folder = os.path.dirname(os.path.abspath(path))
    _make_folder(folder)
    guard = FileLock(os.path.join(folder, LOCK_NAME), timeout=LOCK_TIMEOUT_SECONDS)
    try:
        guard.acquire()
    except Timeout:
        raise FileError(f"{path}: gave up waiting {LOCK_TIMEOUT_SECONDS:g} s for the lock "
                        f"{os.path.join(folder, LOCK_NAME)} (another writer holds it)") from None
    except OSError as e:
        raise FileError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        remove_stale_tmp(folder)  # only under the lock: a live writer's temp file is never touched
        yield
    finally:
        guard.release()


def write_bytes_atomic(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Write `data` to `path`, in a folder that exists, whole or not at all: a temporary file beside it with
    `mode`, rename over. `durable`: fsync the file before the rename and the folder after it. No lock, no
    folder made, OSError as raised (the write_*_atomic above add those)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode != 0o600:  # mkstemp makes 0600
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def remove_stale_tmp(folder: str) -> list[str]:
    """Remove the temp files of writers that crashed (pid gone, or older than STALE_TMP_SECONDS); call it under
    the folder's lock. Returns what it removed."""
    removed = []
    now = time.time()
    for tmp in glob.glob(os.path.join(glob.escape(folder), ".*.json.*.tmp")):  # only this writer's temp files
        m = _TMP_PID.search(tmp)
        try:
            old = now - os.lstat(tmp).st_mtime > STALE_TMP_SECONDS
            if old or (m and not _pid_alive(int(m.group(1)))):
                os.unlink(tmp)
                removed.append(tmp)
        except OSError:
            continue
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_json(path: str, max_bytes: int | None = None) -> Any:
    """Parse a JSON file, never through a symlink; CorruptFileError (naming the file) when it is not complete,
    valid JSON or is larger than `max_bytes` (checked before reading), FileError when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(path):
            raise FileError(f"{path}: is a symlink; distperf reads no file through one (replace it with the "
                            f"file itself)") from None
        raise FileError(f"cannot read {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise CorruptFileError(f"{path}: too large ({size / 2**20:.1f} MiB, over the {max_bytes / 2**20:g} MiB "
                                   f"limit); refused without reading it")
        try:
            data = f.read()
        except OSError as e:
            raise FileError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"{path}: corrupt (not UTF-8 text: {e.reason} at byte {e.start})") from None
    if not text.strip():
        raise CorruptFileError(f"{path}: truncated (the file is empty)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        # e.msg alone can end mid-phrase ("Unterminated string starting at"): its position completes it
        where = f"{e.msg.removesuffix(' at')} at line {e.lineno} column {e.colno} (char {e.pos})"
        hint = _conflict_hint(text)
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            raise CorruptFileError(f"{path}: truncated (the JSON ends at byte {len(data)} before it is complete: "
                                   f"{where}){hint}") from None
        raise CorruptFileError(f"{path}: corrupt (not valid JSON: {where}){hint}") from None


_CONFLICT = re.compile(r"^(<<<<<<<|=======|>>>>>>>)(?:[ \t\r]|$)", re.MULTILINE)


def _conflict_hint(text: str) -> str:
    """'; contains git merge-conflict markers (line 9)' for a file a merge left half-resolved: JSON's own error
    points at the marker's line without saying what it is."""
    m = _CONFLICT.search(text)
    if m is None:
        return ""
    line = text.count("\n", 0, m.start()) + 1
    return (f"; contains git merge-conflict markers (line {line}): resolve the conflict, keeping one side, or "
            f"delete the file")
