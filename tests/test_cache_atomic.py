"""cache/atomic.py (issue #8 item 10): replacing a folder never leaves a moment with neither version, and what
a killed writer leaves behind is recovered or cleaned by the next writer."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import heteroflow.cache.atomic as atomic
from heteroflow.cache.atomic import atomic_directory, atomic_file, atomic_write_bytes, recover_leftovers, wait_for_removals


def _write_version(target: Path, n: int) -> None:
    with atomic_directory(target) as tmp:
        for i in range(5):
            (tmp / f"f{i}").write_text(str(n))
        (tmp / "marker").write_text(str(n))


def test_replacing_a_folder_is_never_seen_missing(tmp_path: Path):
    """A reader polling the folder while it is replaced 200 times always finds one complete version."""
    target = tmp_path / "out"
    _write_version(target, 0)
    stop = threading.Event()
    seen: list[str] = []
    missing: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)  # a reader that holds the folder sees one version
            except FileNotFoundError:
                missing.append(1)
                continue
            try:
                def read(name: str) -> str:
                    with open(name, opener=lambda p, flags: os.open(p, flags, dir_fd=fd)) as fh:
                        return fh.read()

                marker = read("marker")
                if {read(f"f{i}") for i in range(5)} != {marker}:
                    seen.append("mixed")
                seen.append(marker)
            except FileNotFoundError:
                pass  # the reader held the old version while it was being removed after the swap: not a gap
            finally:
                os.close(fd)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for n in range(1, 201):
            _write_version(target, n)
    finally:
        stop.set()
        t.join()
    assert missing == []
    assert "mixed" not in seen
    assert len(set(seen)) > 5  # the reader did watch the replacements
    assert (target / "marker").read_text() == "200"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporaries left


def test_replacing_a_file_with_a_folder(tmp_path: Path):
    target = tmp_path / "out"
    target.write_text("an old file")
    _write_version(target, 1)
    assert target.is_dir() and (target / "marker").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_without_rename_exchange_the_two_rename_fallback_still_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "out"
    _write_version(target, 1)
    monkeypatch.setattr(atomic, "exchange_paths", lambda a, b: False)
    _write_version(target, 2)
    assert (target / "marker").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_error_inside_the_block_leaves_the_old_folder(tmp_path: Path):
    target = tmp_path / "out"
    _write_version(target, 1)
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(target) as tmp:
            (tmp / "marker").write_text("2")
            raise RuntimeError("boom")
    assert (target / "marker").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import heteroflow.cache.atomic as atomic

    target, where = Path(sys.argv[1]), sys.argv[2]
    if where == "between-renames":  # the fallback's window: the old version renamed aside, the new not yet in place
        atomic.exchange_paths = lambda a, b: False
        real_rename = os.rename
        def rename(src, dst):
            real_rename(src, dst)
            if str(dst).endswith(".old"):
                os.kill(os.getpid(), signal.SIGKILL)
        atomic.os.rename = rename
    with atomic.atomic_directory(target) as tmp:
        (tmp / "marker").write_text("new")
        (tmp / "big").write_bytes(b"x" * 100000)
        if where == "inside":
            os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _kill_writer(target: Path, where: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target), where], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_a_temporary_left_by_a_kill_is_cleaned_by_the_next_writer(tmp_path: Path):
    target = tmp_path / "out"
    _write_version(target, 1)
    _kill_writer(target, "inside")
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "out"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".out.") and leftovers[0].endswith(".tmp")
    assert (target / "marker").read_text() == "1"  # the old version is untouched
    _write_version(target, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (target / "marker").read_text() == "2"


def test_a_kill_between_the_fallback_renames_is_repaired(tmp_path: Path):
    target = tmp_path / "out"
    _write_version(target, 1)
    _kill_writer(target, "between-renames")
    assert not target.exists()  # the window the fallback has; the old version waits beside it
    [old] = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert (old / "marker").read_text() == "1"
    restored = recover_leftovers(target)
    assert old in restored
    assert (target / "marker").read_text() == "1"  # the next writer (or reader) gets the old version back
    _write_version(target, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_live_writers_temporary_is_left_alone(tmp_path: Path):
    target = tmp_path / "out"
    live = tmp_path / f".out.{atomic._host()}.{os.getppid()}.abcd1234.tmp"  # our parent process: alive
    live.mkdir()
    recover_leftovers(target)
    assert live.is_dir()


def test_atomic_file_permissions_and_leftovers(tmp_path: Path):
    target = tmp_path / "f.json"
    stale = tmp_path / f".f.json.{atomic._host()}.999999999.deadbeef.tmp"  # a pid that cannot be running
    stale.write_text("partial")
    old = os.umask(0o027)
    try:
        atomic_write_bytes(target, b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the umask's, not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]
    with pytest.raises(ValueError, match="nope"):
        with atomic_file(target) as fh:
            fh.write(b"half")
            raise ValueError("nope")
    assert target.read_bytes() == b"{}"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_the_old_folder_removed_later_is_gone_once_its_thread_ends(tmp_path: Path) -> None:
    """``remove_old_later`` (preprocess, issue #32): the new version is in place when the block ends; the old one,
    swapped out under a temporary name, is removed on a second thread, after which nothing else is left beside it."""
    target = tmp_path / "out"
    for version in ("old", "new"):
        with atomic_directory(target, remove_old_later=True) as tmp:
            (tmp / "version.txt").write_text(version)
            (tmp / "payload.bin").write_bytes(b"x" * 1000)
        assert (target / "version.txt").read_text() == version
    assert wait_for_removals(timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
