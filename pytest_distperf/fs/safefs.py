"""Folders other local users must not control: the lock/state folder and the shared job folder.

The lock folder (`$TMPDIR/pytest-distperf-locks-$UID`) sits in a world-writable /tmp, so another user can create
it first. Every use checks that it is a real folder (not a symlink), owned by us, with no group or other write
bit; files in it are opened with O_NOFOLLOW, so a symlink planted there is never followed. The shared job folder
of multi-node jobs (`--distperf-shared-dir`) may be writable by a group only when its sticky bit is set (as /tmp):
then nobody else can rename or delete the private (0700) job folders made in it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat

from pytest_distperf.errors import UnsafeFolderError


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _describe(path: str, st: os.stat_result) -> str:
    return f"{path} (owner {owner_name(st.st_uid)}, mode {stat.filemode(st.st_mode)} {stat.S_IMODE(st.st_mode):04o})"


def make_private_folder(path: str) -> str:
    """Create `path` 0700 when missing (its parents as usual) and check it (check_private_folder)."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_private_folder(path)
    return path


def check_private_folder(path: str) -> None:
    """Refuse a folder that is a symlink, not ours, or writable by group or others (UnsafeFolderError)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise UnsafeFolderError(f"cannot use the lock folder {path}: {e.strerror or e}") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise UnsafeFolderError(f"refusing the lock folder {_describe(path, st)}: it is {what}; remove it "
                                f"(distperf creates it 0700) or point DISTPERF_LOCK_DIR at a folder of yours")
    if st.st_uid != me:
        raise UnsafeFolderError(f"refusing the lock folder {_describe(path, st)}: it is not owned by "
                                f"{owner_name(me)}, so its owner controls the locks and GPU clock state in it; "
                                f"remove it or point DISTPERF_LOCK_DIR at a folder of yours (mode 0700)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolderError(f"refusing the lock folder {_describe(path, st)}: group or others may write "
                                f"to it; run chmod 700 {path}")


def check_shared_folder(path: str) -> None:
    """The shared job folder: ours or root's, and not writable by group/others unless sticky (like /tmp)."""
    try:
        st = os.stat(path)  # a symlink to the cluster's mount point is normal here; its target is checked
    except OSError as e:
        raise UnsafeFolderError(f"cannot use the shared folder {path}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolderError(f"the shared folder {path} is not a folder")
    if st.st_uid not in (os.geteuid(), 0):
        raise UnsafeFolderError(f"refusing the shared folder {_describe(path, st)} (--distperf-shared-dir): "
                                f"owned by another user, who could replace the job files; use a folder of "
                                f"yours on the shared file system")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeFolderError(f"refusing the shared folder {_describe(path, st)} (--distperf-shared-dir): "
                                f"group or others may write to it without the sticky bit, so they could "
                                f"swap a job's folder; run chmod 700 {path} (or chmod +t {path})")


def open_nofollow(path: str, flags: int, mode: int = 0o600) -> int:
    """os.open without following a symlink at `path` (UnsafeFolderError when one is there)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFolderError(f"refusing to open {path}: it is a symlink (distperf follows none in its lock "
                                    f"folder); remove it") from None
        raise
