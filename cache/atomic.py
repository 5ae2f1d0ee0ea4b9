"""Writes that are visible complete or not at all.

A file or folder is written under a temporary name beside its target (same filesystem), made durable, then
renamed into place (``rename(2)`` is atomic on POSIX). Replacing an existing *folder* uses Linux's
``renameat2(RENAME_EXCHANGE)``, which swaps the new folder and the old one in one step, so the target path
always names one complete version; the old version, now under the temporary name, is removed afterwards.
Where the filesystem or platform has no exchange (``EINVAL``/``ENOSYS``: e.g. some network filesystems,
macOS), the old folder is first renamed aside to ``.<name>.<owner>.old`` and the new one renamed into place; a
kill between those two renames leaves the old version under that name, and the next writer (or
:func:`recover_leftovers`) renames it back before doing anything else.

Temporary names carry their owner: ``.<name>.<host>.<pid>.<random>.tmp`` (``.old`` for a displaced old
version). A writer first cleans the leftovers of earlier writers of the same target whose process is gone
(same host, pid no longer running) or that are older than :data:`STALE_AFTER_S` (another host), so a temporary
left by a SIGKILL never stays for good. Files are created with the process umask's permissions (``0o666 &
~umask``, like ``open()``), not ``mkstemp``'s 0600, and folders with ``0o777 & ~umask``, not ``mkdtemp``'s 0700
(:func:`make_temp_dir` is ``mkdtemp`` with that mode), so shared cache and archive folders stay readable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "STALE_AFTER_S",
    "atomic_directory",
    "atomic_file",
    "atomic_write_bytes",
    "wait_for_removals",
    "exchange_paths",
    "current_umask",
    "fsync_dir",
    "make_temp_dir",
    "recover_leftovers",
    "sync_filesystem",
]

STALE_AFTER_S = 24 * 3600  # temporaries of another host older than this are taken as abandoned (seconds)
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where Linux says it (``/proc/self/status``, Linux >= 4.7);
    elsewhere set and restored at once under a lock."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def make_temp_dir(parent: str | os.PathLike[str], prefix: str = ".tmp-") -> Path:
    """``tempfile.mkdtemp(prefix=prefix, dir=parent)`` with the mode a plain ``mkdir`` gives (``0o777 & ~umask``),
    not 0700: a folder later renamed into a shared place (an archive version, a cache version) stays readable to
    those the umask lets read it. Same-filesystem as ``parent``, so it can be renamed into place atomically."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o777 & ~current_umask())
    return path


def _host() -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())[:40] or "host"


def _temp_name(target: Path, kind: str) -> Path:
    # os.urandom(4).hex() is secrets.token_hex(4) without importing secrets (hmac, hashlib) into every step process
    return target.with_name(f".{target.name}.{_host()}.{os.getpid()}.{os.urandom(4).hex()}.{kind}")


def _owner_gone(path: Path) -> bool:
    """True when the temporary ``path`` belongs to no running writer (see the module docstring)."""
    parts = path.name.rsplit(".", 4)  # [".<name>", host, pid, random, kind]
    if len(parts) != 5 or not parts[2].isdigit():
        return False
    host, pid = parts[1], int(parts[2])
    if host != _host():
        try:
            return time.time() - path.lstat().st_mtime > STALE_AFTER_S
        except FileNotFoundError:
            return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recover_leftovers(path: str | os.PathLike[str]) -> list[Path]:
    """Clean what killed writers of ``path`` left beside it: restore a displaced old version when ``path`` is
    missing, remove their temporaries. Temporaries of live writers are left alone.

    Returns:
        The paths removed or restored.
    """
    target = Path(path)
    parent = target.parent
    if not parent.is_dir():
        return []
    done: list[Path] = []
    prefix = f".{target.name}."
    for entry in sorted(parent.iterdir()):
        if not entry.name.startswith(prefix) or not entry.name.endswith((".tmp", ".old")):
            continue
        if not _owner_gone(entry):
            continue
        if entry.name.endswith(".old") and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.rename(entry, target)
                done.append(entry)
                continue
        _remove(entry)
        done.append(entry)
    return done


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder, so a rename or a new entry in it survives a power cut (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_filesystem(path: str | os.PathLike[str]) -> None:
    """Flush every dirty page and inode of the filesystem that holds ``path`` to stable storage, once.

    Linux ``syncfs(2)`` (the filesystem of ``path`` only); elsewhere ``os.sync()`` (all filesystems). One call
    replaces an fsync per file when many files were written (the cost ``cp -r`` + ``sync`` pays).
    """
    import ctypes  # here: a step process that writes records only needs it not (~2 ms of its start)

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def exchange_paths(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap two existing paths atomically (``renameat2(RENAME_EXCHANGE)``).

    Returns:
        False where the platform or filesystem cannot (nothing changed); True when swapped.

    Raises:
        OSError: any other failure (e.g. a path is missing).
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))


def _create(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, suffix: str = ".tmp", durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` when the ``with`` block ends without error (after fsync of the
    file and, after the rename, of its folder, when ``durable``). Permissions: ``0o666 & ~umask``.

    On an error (or an exception raised by the block itself) the temporary file is removed and ``path`` is
    left as it was. A temporary left by a killed writer of ``path`` is removed by the next one.

    Args:
        path: the file to write.
        suffix: kept for callers of the earlier API; temporaries now always end in ``.tmp``.
        durable: fsync the file and its folder (survives a power cut); False: atomic visibility only (records
            that cost nothing to lose).
    """
    del suffix
    target = Path(path)
    if target.is_dir():  # os.replace's error named the temporary file ('.adir.vm.8292.6faba2ae.tmp: Is a directory')
        raise IsADirectoryError(errno.EISDIR, "a folder is there; give a file path", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_leftovers(target)
    tmp = _temp_name(target, "tmp")
    fd = _create(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one
    (``durable``: fsync before the rename)."""
    with atomic_file(path, durable=durable) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], *, remove_old_later: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; when the block ends without error its content is made
    durable and it replaces ``path`` (an existing folder or file there is swapped out in one atomic step where
    the filesystem allows, see the module docstring, then removed). On an error the temporary folder is removed
    and ``path`` is left as it was. Leftovers of killed writers of ``path`` are recovered first.

    Args:
        remove_old_later: remove the old version (already out of ``path``, under a temporary name) on a
            second thread instead of before returning; the interpreter waits for it at exit (a non-daemon
            thread), and a process killed meanwhile leaves a temporary that the next writer removes. Preprocess
            uses it: removing the previous shards took 0.1-0.3 s of its run (issue #32).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_leftovers(target)
    tmp = _temp_name(target, "tmp")
    tmp.mkdir()
    try:
        yield tmp
        sync_filesystem(tmp)
        _publish_directory(tmp, target, remove=_remove_later if remove_old_later else _remove)
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(target.parent)


_REMOVALS: list[threading.Thread] = []


def _remove_later(path: Path) -> None:
    """:func:`_remove` on a non-daemon thread (the interpreter joins it at exit; :func:`wait_for_removals`)."""
    thread = threading.Thread(target=_remove, args=(path,), name=f"remove {path.name}", daemon=False)
    _REMOVALS[:] = [t for t in _REMOVALS if t.is_alive()]
    _REMOVALS.append(thread)
    thread.start()


def wait_for_removals(timeout: float | None = None) -> bool:
    """Wait until the old versions that ``atomic_directory(..., remove_old_later=True)`` hands to a second thread
    are removed (at most ``timeout`` seconds each). Returns whether none is still being removed."""
    for thread in list(_REMOVALS):
        thread.join(timeout)
    return not any(t.is_alive() for t in _REMOVALS)


def _publish_directory(tmp: Path, target: Path, remove: Callable[[Path], None] = _remove) -> None:
    """Put the complete folder ``tmp`` at ``target``; never leaves ``target`` missing when it existed before
    (except in the documented two-rename fallback, which :func:`recover_leftovers` repairs). The old version is
    handed to ``remove`` once out of ``target``."""
    if not os.path.lexists(target):
        try:
            os.rename(tmp, target)
            return
        except OSError as exc:  # a concurrent writer put something there meanwhile
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                raise
    if exchange_paths(tmp, target):
        remove(tmp)  # tmp now holds the old version
        return
    old = _temp_name(target, "old")
    os.rename(target, old)
    os.rename(tmp, target)
    remove(old)
