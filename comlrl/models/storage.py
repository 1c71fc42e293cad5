"""Storage faults as one clear error: a read-only or full disk, a quota, missing permissions.

Whatever library a write goes through, its failure reaches the user as a ``StorageError`` (an
``OSError`` with the original ``errno``) whose message names what was being written, the path, the
cause and the fix, instead of torch's "[enforce fail at inline_container.cc] unexpected pos",
safetensors' "I/O error ... (os error 28)" or a bare "[Errno 30]". ``storage_fault`` recognises
those three shapes; ``writing(path, what)`` converts inside its block; ``check_writable`` refuses a
folder that cannot be written before anything starts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from typing import Callable, Iterator, List, Optional, Union

CAUSES = {
    errno.ENOSPC: ("the disk is full", "free some space (or choose a folder on another disk)"),
    errno.EDQUOT: ("the disk quota is used up", "free some space within your quota (or choose another disk)"),
    errno.EROFS: ("the file system is read-only", "choose a folder on a writable disk"),
    errno.EACCES: ("permission denied", "choose a folder you may write to (or change its permissions)"),
    errno.EPERM: ("the operation is not permitted", "choose a folder you may write to"),
    errno.EIO: ("an I/O error of the disk", "check the disk, or choose a folder on another one"),
    errno.EFBIG: ("the file is larger than the file system allows", "choose a folder on another file system"),
}
_ERRNO_IN_TEXT = re.compile(r"(?:os error|\[Errno) (\d+)")
LOW_SPACE_BYTES = 1 << 20


class StorageError(OSError):
    """A write failed for a reason of the disk (see the module docstring); ``errno`` is the cause's."""

    def __init__(self, message: str, code: Optional[int] = None, path: Optional[str] = None):
        super().__init__(message)
        self.errno = code
        self.filename = path

    def __str__(self) -> str:
        return self.args[0]


def _existing(path: str) -> str:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def storage_fault(error: BaseException, path: str) -> Optional[int]:
    """The errno of a storage fault behind ``error`` (raised while writing under ``path``), else None."""
    if isinstance(error, StorageError):
        return error.errno
    if isinstance(error, OSError) and error.errno in CAUSES:
        return error.errno
    match = _ERRNO_IN_TEXT.search(str(error))
    if match and int(match.group(1)) in CAUSES:
        return int(match.group(1))
    if isinstance(error, RuntimeError) and "unexpected pos" in str(error):  # torch's zip writer after a short write
        try:
            if shutil.disk_usage(_existing(path)).free < LOW_SPACE_BYTES:
                return errno.ENOSPC
        except OSError:
            return None
    return None


def storage_error(code: int, path: str, what: str, after: str = "") -> StorageError:
    cause, fix = CAUSES.get(code, (os.strerror(code), "choose another folder"))
    return StorageError(f"Could not write {what} to {path}: {cause} ({os.strerror(code)}).{after} Fix: {fix}.", code, path)


@contextlib.contextmanager
def writing(path: str, what: str, after: Union[str, Callable[[], str]] = "") -> Iterator[None]:
    """Inside the block a storage fault becomes a ``StorageError`` about ``what`` at ``path`` (``after``: a
    sentence on what is left, e.g. that earlier checkpoints are untouched, or a function that writes it);
    other errors pass unchanged."""
    try:
        yield
    except BaseException as error:
        code = storage_fault(error, path)
        if code is None or isinstance(error, StorageError):
            raise
        raise storage_error(code, path, what, after() if callable(after) else after) from error


def check_writable(path: str, what: str) -> None:
    """Refuse (``StorageError``, before anything is written) a folder path under which nothing can be
    created: the nearest existing folder on it is read-only or not writable for this user."""
    probe = _existing(os.fspath(path))
    if not os.path.isdir(probe):
        return  # a file on the way is refused by check_folder_path with its own message
    if not os.access(probe, os.W_OK | os.X_OK):
        code = errno.EROFS if _read_only_mount(probe) else errno.EACCES
        where = "" if probe == os.path.abspath(path) else f" (its nearest existing folder {probe})"
        cause, fix = CAUSES[code]
        raise StorageError(f"{what} {path!r} cannot be written{where}: {cause}. Fix: {fix}.", code, path)


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def created_dirs(path: str) -> List[str]:
    """The folders ``os.makedirs(path)`` would create, deepest first (for removing them again)."""
    missing = []
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        missing.append(probe)
        probe = os.path.dirname(probe)
    return missing


def remove_empty(folders: List[str]) -> None:
    """Remove each of ``folders`` (deepest first) that exists and is empty."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return
