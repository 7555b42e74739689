"""The project's one JSON reader and writer: baselines, reports, benchmark checkpoints all go through it.

Writes are atomic (temporary file in the same folder, fsync, rename, fsync the folder), optionally under the
folder's lock file so concurrent writers (pytest-xdist workers, two sessions) serialise. Reading never writes; a
file that is not complete, valid JSON raises FileError naming it.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from filelock import FileLock, Timeout

from pytest_distperf.errors import FileError

LOCK_NAME = ".distperf.lock"
LOCK_TIMEOUT_SECONDS = 120.0


def dumps(obj: Any) -> str:
    """Sorted keys, strict JSON (no NaN), a trailing newline: stable diffs for committed files."""
    return json.dumps(obj, sort_keys=True, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_json_atomic(path: str, obj: Any, *, lock: bool = True) -> None:
    """Write `obj` to `path` so that a reader sees the old file or the new one, never a torn one.

    Temporary file in the same folder (same filesystem), fsync, rename over, fsync the folder;
    under the folder's lock file when `lock` (so concurrent writers serialise).
    """
    try:
        text = dumps(obj)
    except ValueError as e:  # NaN/inf: json's message does not say which file
        raise FileError(f"{path}: cannot write non-finite numbers as JSON ({e})") from None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise FileError(f"cannot create folder {folder}: {e.strerror or e}") from None
    if not os.path.isdir(folder):
        raise FileError(f"{folder} is not a folder")
    guard = FileLock(os.path.join(folder, LOCK_NAME), timeout=LOCK_TIMEOUT_SECONDS) if lock else None
    try:
        if guard is not None:
            guard.acquire()
        _replace(path, folder, text.encode("utf-8"))
    except Timeout:
        raise FileError(f"{path}: gave up waiting {LOCK_TIMEOUT_SECONDS:g} s for the lock "
                            f"{os.path.join(folder, LOCK_NAME)} (another writer holds it)") from None
    except OSError as e:
        raise FileError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if guard is not None and guard.is_locked:
            guard.release()


def _replace(path: str, folder: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a committed file is world-readable
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def read_json(path: str) -> Any:
    """Parse a JSON file; FileError (naming the file) when it is not complete, valid JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FileError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(f"{path}: corrupt (not UTF-8 text: {e.reason} at byte {e.start})") from None
    if not text.strip():
        raise FileError(f"{path}: truncated (the file is empty)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            raise FileError(f"{path}: truncated (the JSON ends at byte {len(data)} before it is complete: "
                                f"{e.msg})") from None
        raise FileError(f"{path}: corrupt (not valid JSON: {e.msg} at line {e.lineno}, column {e.colno})") from None
