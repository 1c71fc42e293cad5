"""Exporting trained entities as ordinary Hugging Face folders, never clobbering what exists.

Each folder is written into a hidden staging directory beside its target and renamed into place,
so a crash mid-save leaves either the old folder or the new one, never a mix.

Temporary directories and files are created private (``tempfile`` uses 0700 / 0600) and
safetensors writes its files 0600; everything that is published gets the permissions an ordinary
``mkdir`` / ``open`` would have given under the process umask (``apply_umask``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Callable, Iterator, Optional, Sequence

from comlrl.models.storage import check_writable, created_dirs, remove_empty, writing


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (``/proc/self/status``);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str) -> None:
    """Give ``path`` (and, for a directory, everything under it) the mode an ordinary ``mkdir`` (0777)
    or ``open`` (0666, 0777 for files with an execute bit) gets under the current umask. Symbolic
    links are left alone."""
    mask = current_umask()

    def fix(target: str, is_dir: bool) -> None:
        if os.path.islink(target):
            return
        executable = is_dir or bool(os.stat(target).st_mode & 0o111)
        os.chmod(target, (0o777 if executable else 0o666) & ~mask)

    fix(path, os.path.isdir(path))
    if os.path.isdir(path) and not os.path.islink(path):
        for directory, dirs, files in os.walk(path):
            for name in dirs:
                fix(os.path.join(directory, name), True)
            for name in files:
                fix(os.path.join(directory, name), False)


def make_temp_dir(parent: str, prefix: str, suffix: str = "") -> str:
    """``tempfile.mkdtemp`` in ``parent`` with an ordinary directory mode (not 0700)."""
    path = tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent)
    apply_umask(path)
    return path


def make_temp_file(parent: str, prefix: str, suffix: str = "") -> str:
    """An empty new file from ``tempfile.mkstemp`` in ``parent`` (closed), with an ordinary mode."""
    handle, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=parent)
    os.close(handle)
    apply_umask(path)
    return path


def check_folder_path(path: str, what: str) -> None:
    """Refuse (ValueError, before anything is written) a folder path that is a file or lies under one:
    ``what`` names the argument in the message (``"output_dir"``, ``"save_model(path)"``, ...). A folder that
    cannot be written (read-only disk, no permission) is refused too (``StorageError``)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"{what} must be a folder path (a non-empty str), got {path!r}. Give the folder to write into, "
                         f"e.g. 'runs/my-run'.")
    path = os.fspath(path)
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    if not os.path.isdir(probe):
        where = "is a file" if probe == os.path.abspath(path) else f"lies under the file {probe!r}"
        raise ValueError(f"{what} {path!r} {where}; a folder is needed there. Choose another path (or move the file away).")
    check_writable(path, what)


def _non_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and bool(os.listdir(path))


def check_target_free(path: str, overwrite: bool) -> None:
    """Raise FileExistsError when ``path`` holds something and ``overwrite`` is False."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"{path} exists and is not a directory; choose another output_dir.")
    if _non_empty_dir(path) and not overwrite:
        raise FileExistsError(
            f"{path} already exists and is not empty; refusing to overwrite it. Choose a new output_dir, "
            f"or call save_model(..., overwrite=True) to replace it."
        )


def write_dir_atomically(path: str, write: Callable[[str], None], overwrite: bool = False, what: str = "the model") -> None:
    """Run ``write(staging_dir)`` and move the result to ``path`` in one rename. A failure leaves ``path`` as
    it was (folders made for it removed again); a full or read-only disk is a ``StorageError`` about ``what``."""
    check_target_free(path, overwrite)
    parent = os.path.dirname(os.path.abspath(path))
    made = created_dirs(parent)
    kept = " Nothing was saved there; what the folder held before is unchanged."
    try:
        with writing(path, what, kept):
            os.makedirs(parent, exist_ok=True)
            _write_staged(path, parent, write)
    except BaseException:
        remove_empty(made)
        raise


def _write_staged(path: str, parent: str, write: Callable[[str], None]) -> None:
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=parent)
    backup: Optional[str] = None
    try:
        write(staging)
        apply_umask(staging)
        if os.path.exists(path):
            backup = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old.", dir=parent)
            os.rmdir(backup)
            os.replace(path, backup)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if backup is not None and not os.path.exists(path):
            os.replace(backup, path)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


@contextlib.contextmanager
def all_or_nothing(targets: Sequence[str]) -> Iterator[None]:
    """Folders written together (a team's ``agent_i``): when the block fails, the ones among ``targets`` that
    did not exist before it are removed again, with folders made for them that are left empty, so a
    failed save never leaves half a team behind (what existed before stays)."""
    new = [target for target in targets if not os.path.exists(target)]
    made = sorted({folder for target in targets for folder in created_dirs(os.path.dirname(os.path.abspath(target)))},
                  key=len, reverse=True)
    try:
        yield
    except BaseException:
        for target in new:
            shutil.rmtree(target, ignore_errors=True)
        remove_empty(made)
        raise


def save_pretrained_dir(
    path: str, model: Any, tokenizer: Any = None, overwrite: bool = False, extra: Optional[Callable[[str], None]] = None,
    state_dict: Optional[dict] = None,
) -> None:
    """``model.save_pretrained`` (+ tokenizer, + ``extra(dir)``) into ``path`` atomically;
    ``state_dict`` replaces the model's own (the full weights of a sharded model)."""

    def write(staging: str) -> None:
        model.save_pretrained(staging, **({"state_dict": state_dict} if state_dict is not None else {}))
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(staging)
        if extra is not None:
            extra(staging)

    write_dir_atomically(path, write, overwrite)


def write_into_dir(path: str, write: Callable[[str], None], overwrite: bool = False) -> None:
    """Run ``write(staging_dir)`` and move each entry it made into ``path`` (which may already hold
    other files). An entry whose name exists in ``path`` is refused unless ``overwrite``; nothing
    is moved until every name has been checked. A full or read-only disk is a ``StorageError``."""
    made = created_dirs(path)
    try:
        with writing(path, "the model", " Nothing new was moved into it; what it held before is unchanged."):
            os.makedirs(path, exist_ok=True)
            _write_into(path, write, overwrite)
    except BaseException:
        remove_empty(made)
        raise


def _write_into(path: str, write: Callable[[str], None], overwrite: bool) -> None:
    staging = tempfile.mkdtemp(prefix=".staging.", dir=path)
    try:
        write(staging)
        apply_umask(staging)
        names = sorted(os.listdir(staging))
        taken = [name for name in names if os.path.lexists(os.path.join(path, name))]
        if taken and not overwrite:
            raise FileExistsError(
                f"{path} already holds {taken}; refusing to overwrite them. Choose a new output_dir, or call "
                f"save_model(..., overwrite=True) to replace them."
            )
        for name in names:
            target = os.path.join(path, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            elif os.path.lexists(target):
                os.remove(target)
            os.replace(os.path.join(staging, name), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
