"""The one way forkpoint writes files: atomic replace, checked writes, the user's umask, clear errors.

`write_atomic` writes a temp file in the target folder (locked while it is written, so a cleaner can
tell a live writer's temp file from a dead one's), fsyncs it, gives it the mode a plain `open()` would
(0666 minus the umask; an existing target keeps its mode), renames it over the target and fsyncs the
folder. Readers see the old file or the whole new one, never a part. `append_line` appends one whole
line under an exclusive lock, checking every `os.write` and undoing a partial write.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from core.errors import WriteError

STALE_TEMP_SECONDS = 2.0  # an unlocked temp file older than this belongs to a dead writer
_TEMP_RE = re.compile(r"^\.(tmp-.*|.+\.[A-Za-z0-9_]{6,}\.tmp)$")  # ".tmp-*" (old stores) or ".<name>.<rand>.tmp"

_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EFBIG: "the file-size limit was reached",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOENT: "the folder does not exist",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EISDIR: "the path is a folder",
    errno.EEXIST: "a part of the path is a file, not a folder",
}


def os_error_reason(exc: OSError) -> str:
    """A short plain reason for an OSError ("the disk is full", ...)."""
    return _REASONS.get(exc.errno or 0, exc.strerror or type(exc).__name__)


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # not thread-safe, hence only the fallback
    os.umask(mask)
    return mask


def file_mode(target: Path | None = None) -> int:
    """Mode for a new file: that of an existing `target`, else 0666 minus the umask (as `open()` gives)."""
    if target is not None:
        try:
            return stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            pass
    return 0o666 & ~current_umask()


def fsync_dir(path: Path) -> None:
    """fsync a folder so that a rename or unlink in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, looping over short writes (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[n:]


def write_atomic(path: str | os.PathLike[str], write: Callable[[Any], None], binary: bool = False,
                 what: str = "file") -> os.stat_result:
    """Write `path` through `write(fh)` atomically; returns the new file's stat.

    Raises WriteError (also an OSError) naming the file and the reason (disk full, no permission, ...);
    the target is then untouched and no temp file is left behind.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:80]}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise WriteError(f"Cannot write {what} {path}: {os_error_reason(exc)}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # marks the temp file as live until this process closes it or dies
        os.fchmod(fd, file_mode(path))
        kwargs: dict[str, Any] = {} if binary else {"encoding": "utf-8", "newline": ""}
        with os.fdopen(fd, "wb" if binary else "w", **kwargs) as fh:
            write(fh)
            fh.flush()  # buffered files loop over short writes; errors surface here at the latest
            os.fsync(fh.fileno())
            st = os.fstat(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(f"Cannot write {what} {path}: {os_error_reason(exc)}; it was not written") from exc
        raise
    try:
        fsync_dir(path.parent)
    except OSError:  # the file is in place; only its durability across a power cut is less certain
        pass
    return st


def append_line(path: Path, line: bytes, mode: int | None = None) -> None:
    """Append one line (with its newline) under an exclusive lock, whole or not at all.

    A previous writer killed mid-line left no newline: start on a fresh line so this one stays whole.
    A failed or partial write is truncated away. Raises OSError on failure.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666 if mode is None else mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one whole line per append, even across processes
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            line = b"\n" + line
        try:
            write_all(fd, line if line.endswith(b"\n") else line + b"\n")
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)  # closing releases the lock


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of write_atomic's temp files (or an older store's `.tmp-*`)."""
    return bool(_TEMP_RE.match(name))


def temp_name_of(target: str) -> re.Pattern[str]:
    """The names `write_atomic` gives its temp files for a target named `target`."""
    return re.compile(re.escape(f".{target[:80]}.") + r"[A-Za-z0-9_]{6,}\.tmp")


def temp_files(folder: Path, targets: Iterable[str] | None = None) -> Iterator[tuple[Path, bool]]:
    """(path, stale) for each temp file in `folder` (only those of `targets`' names, when given): stale
    when no live writer holds it."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    patterns = None if targets is None else [temp_name_of(t) for t in targets]
    now = time.time()
    for entry in entries:
        if not is_temp_name(entry.name):
            continue
        if patterns is not None and not any(p.fullmatch(entry.name) for p in patterns):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked_by_other = False
            except BlockingIOError:
                locked_by_other = True
            old = now - os.fstat(fd).st_mtime > STALE_TEMP_SECONDS
        finally:
            os.close(fd)
        yield Path(entry.path), (not locked_by_other) and old


def clean_temp_files(folder: Path, targets: Iterable[str] | None = None) -> tuple[list[Path], list[Path]]:
    """Delete stale temp files in `folder` (only those of `targets`' names, when given); returns
    (removed, kept: live or not removable). An export calls it for its own file names, so a killed
    export's half-written temp file goes away on the next export to that place."""
    removed: list[Path] = []
    kept: list[Path] = []
    for path, stale in temp_files(folder, targets):
        if stale:
            try:
                path.unlink()
                removed.append(path)
                continue
            except FileNotFoundError:
                continue
            except OSError:
                pass
        kept.append(path)
    return removed, kept


def make_folders(folder: str | os.PathLike[str]) -> list[Path]:
    """Create `folder` and its missing parents; returns the ones created, deepest first (for `remove_empty`)."""
    folder = Path(folder)
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"Cannot create the folder {folder}: {os_error_reason(exc)}") from exc
    return missing


def remove_empty(folders: Iterable[Path]) -> None:
    """Remove the folders a failed writer created (deepest first), each only while it is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (someone else's files) or gone: leave it and everything above it


def write_folder(target: str | os.PathLike[str], fill: Callable[[Path], None], what: str = "output") -> Path:
    """Fill a fresh temp folder beside `target`, then move its files into `target` (made if missing): a writer
    that fails leaves no empty folder and no part of its files, and `target`'s other files are kept."""
    target = Path(target)
    created = make_folders(target.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name[:80]}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        remove_empty(created)
        raise WriteError(f"Cannot write the {what} {target}: {os_error_reason(exc)}") from exc
    try:
        fill(tmp)
        os.chmod(tmp, 0o777 & ~current_umask())
        if not target.exists():
            os.rename(tmp, target)
        else:
            for item in sorted(tmp.iterdir()):
                os.replace(item, target / item.name)
            tmp.rmdir()
        fsync_dir(target.parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(created)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(f"Cannot write the {what} {target}: {os_error_reason(exc)}") from exc
        raise
    return target
