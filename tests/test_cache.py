"""Prewarm: copying a data set into the cache tier, its manifest, reruns, fsspec sources and atomicity."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

import heteroflow.cache.prewarm as prewarm_mod
from heteroflow.cache.errors import CacheIntegrityError, DatasetError, HeteroflowError
from heteroflow.cache.prewarm import MANIFEST_NAME, Manifest, cache_key, prewarm, sha256_file


def _files(root: Path) -> dict[str, bytes]:
    """Relative POSIX path -> content of every file under ``root``."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(root: Path) -> list[str]:
    """Names under ``root`` that look like temporary files."""
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.startswith(".") or p.name.endswith((".part", ".tmp"))
    ]


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


@pytest.fixture
def src(tmp_path: Path, digits_dir: Path) -> Path:
    """A private, writable copy of the digits folder."""
    dest = tmp_path / "src" / "digits"
    shutil.copytree(digits_dir, dest)
    return dest


def _touch_later(path: Path) -> None:
    """Move a file's mtime clearly forward, so a change is visible even on coarse timestamp clocks."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))


# --- a first prewarm --------------------------------------------------------------------------------------


def test_prewarm_copies_every_file_with_manifest(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    result = prewarm(str(digits_dir), cache)

    source = _files(digits_dir)
    assert len(source) >= 5  # 4 CSV parts + SOURCE.md + export.json
    assert result.files_copied == len(source)
    assert result.files_skipped == 0
    assert result.bytes_copied == sum(len(b) for b in source.values())
    assert result.manifest_path == cache / MANIFEST_NAME

    cached = _files(cache)
    assert cached.pop(MANIFEST_NAME)
    assert cached == source

    on_disk = json.loads((cache / MANIFEST_NAME).read_text())
    assert on_disk["source_uri"] == str(digits_dir)
    assert Path(on_disk["root"]) == cache.resolve()
    assert on_disk["total_bytes"] == result.bytes_copied
    assert [f["path"] for f in on_disk["files"]] == sorted(source)
    for entry in on_disk["files"]:
        assert not entry["path"].startswith("/")
        assert not Path(entry["path"]).is_absolute()
        local = cache / entry["path"]
        assert entry["bytes"] == local.stat().st_size == len(source[entry["path"]])
        assert entry["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
        assert entry["sha256"] == sha256_file(local)

    loaded = Manifest.load(cache / MANIFEST_NAME)
    assert loaded == result.manifest
    assert loaded.local_paths() == [cache.resolve() / p for p in sorted(source)]
    assert loaded.total_bytes == result.bytes_copied
    assert _leftovers(cache) == []


def test_dataset_sha256_is_stable_across_cache_dirs(digits_dir: Path, tmp_path: Path):
    a = prewarm(str(digits_dir), tmp_path / "cache-a")
    b = prewarm(str(digits_dir), tmp_path / "cache-b")
    assert a.manifest.dataset_sha256 == b.manifest.dataset_sha256
    assert len(a.manifest.dataset_sha256) == 64
    assert a.manifest.root != b.manifest.root
    # The identity is the documented digest over sorted (path, bytes, sha256), independent of the source.
    digest = hashlib.sha256()
    for f in sorted(a.manifest.files, key=lambda e: e.path):
        digest.update(f"{f.path}\0{f.bytes}\0{f.sha256}\n".encode())
    assert a.manifest.dataset_sha256 == digest.hexdigest()


def test_dataset_sha256_changes_with_content(src: Path, tmp_path: Path):
    before = prewarm(str(src), tmp_path / "cache-a").manifest.dataset_sha256
    (src / "digits-part-2.csv").write_text((src / "digits-part-2.csv").read_text() + "0," * 64 + "0\n")
    after = prewarm(str(src), tmp_path / "cache-b").manifest.dataset_sha256
    assert before != after


def test_subfolders_and_hidden_files(tmp_path: Path):
    src = tmp_path / "data"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "top.csv").write_text("a,label\n1,0\n")
    (src / "sub" / "deeper" / "x.npz").write_bytes(b"not really npz")
    (src / ".hidden").write_text("skip me")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("skip me too")
    result = prewarm(str(src), tmp_path / "cache")
    assert [f.path for f in result.manifest.files] == ["sub/deeper/x.npz", "top.csv"]
    assert (tmp_path / "cache" / "sub" / "deeper" / "x.npz").read_bytes() == b"not really npz"
    assert not (tmp_path / "cache" / ".hidden").exists()
    assert not (tmp_path / "cache" / ".git").exists()


def test_single_file_source(tmp_path: Path):
    f = tmp_path / "one.csv"
    f.write_text("a,b,label\n1,2,x\n")
    result = prewarm(str(f), tmp_path / "cache")
    assert [e.path for e in result.manifest.files] == ["one.csv"]
    assert (tmp_path / "cache" / "one.csv").read_bytes() == f.read_bytes()


# --- reruns -----------------------------------------------------------------------------------------------


def test_rerun_copies_nothing(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    n = len(first.manifest.files)
    before = {p: _stat(cache / p) for p in (f.path for f in first.manifest.files)}

    second = prewarm(str(digits_dir), cache)
    assert second.files_copied == 0
    assert second.files_skipped == n
    assert second.bytes_copied == 0
    assert second.manifest == first.manifest
    assert {p: _stat(cache / p) for p in before} == before
    assert _leftovers(cache) == []


def test_changed_source_file_is_the_only_one_recopied(src: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(src), cache)
    n = len(first.manifest.files)
    changed = src / "digits-part-1.csv"
    new_content = changed.read_text() + ",".join(["3"] * 64) + ",7\n"
    changed.write_text(new_content)
    _touch_later(changed)
    untouched = {f.path: _stat(cache / f.path) for f in first.manifest.files if f.path != "digits-part-1.csv"}

    second = prewarm(str(src), cache)
    assert second.files_copied == 1
    assert second.files_skipped == n - 1
    assert second.bytes_copied == len(new_content.encode())
    assert (cache / "digits-part-1.csv").read_text() == new_content
    entry = {f.path: f for f in second.manifest.files}["digits-part-1.csv"]
    assert entry.sha256 == hashlib.sha256(new_content.encode()).hexdigest()
    assert entry.bytes == len(new_content.encode())
    assert {p: _stat(cache / p) for p in untouched} == untouched
    assert second.manifest.dataset_sha256 != first.manifest.dataset_sha256


def test_same_size_source_change_is_recopied(src: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    prewarm(str(src), cache)
    changed = src / "digits-part-3.csv"
    data = bytearray(changed.read_bytes())
    i = data.index(b"pixel_0")
    data[i:i + 7] = b"PIXEL_0"
    changed.write_bytes(bytes(data))
    _touch_later(changed)

    second = prewarm(str(src), cache)
    assert second.files_copied == 1
    assert (cache / "digits-part-3.csv").read_bytes() == bytes(data)


def test_corrupted_cached_file_is_recopied(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    victim = cache / "digits-part-0.csv"
    good = victim.read_bytes()
    bad = bytes(b ^ 0x01 for b in good[:16]) + good[16:]
    assert len(bad) == len(good) and bad != good
    victim.write_bytes(bad)

    second = prewarm(str(digits_dir), cache)
    assert second.files_copied == 1
    assert second.files_skipped == len(first.manifest.files) - 1
    assert victim.read_bytes() == good
    assert second.manifest == first.manifest


def test_without_verify_a_same_size_corruption_is_trusted(digits_dir: Path, tmp_path: Path):
    """Documented: verify=False trusts the size only (and skips re-hashing)."""
    cache = tmp_path / "cache"
    prewarm(str(digits_dir), cache)
    victim = cache / "digits-part-0.csv"
    good = victim.read_bytes()
    victim.write_bytes(b"X" + good[1:])
    result = prewarm(str(digits_dir), cache, verify=False)
    assert result.files_copied == 0
    # and with verification it is repaired
    assert prewarm(str(digits_dir), cache).files_copied == 1
    assert victim.read_bytes() == good


def test_deleted_or_truncated_cached_file_is_recopied(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    prewarm(str(digits_dir), cache)
    (cache / "digits-part-2.csv").unlink()
    (cache / "digits-part-3.csv").write_bytes(b"short")
    result = prewarm(str(digits_dir), cache, verify=False)
    assert result.files_copied == 2
    assert _files(digits_dir) == {k: v for k, v in _files(cache).items() if k != MANIFEST_NAME}


def test_damaged_manifest_means_full_recopy(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    (cache / MANIFEST_NAME).write_text("{ not json")
    result = prewarm(str(digits_dir), cache)
    assert result.files_copied == len(first.manifest.files)
    assert Manifest.load(cache / MANIFEST_NAME) == first.manifest


# --- fsspec sources ---------------------------------------------------------------------------------------


@pytest.fixture
def memory_dir():
    fs = fsspec.filesystem("memory")
    root = f"/hf-test-{uuid.uuid4().hex}"
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_prewarm_from_memory_url(memory_dir, digits_dir: Path, tmp_path: Path):
    fs, root = memory_dir
    source = _files(digits_dir)
    for rel, data in source.items():
        with fs.open(f"{root}/digits/{rel}", "wb") as fh:
            fh.write(data)
    with fs.open(f"{root}/digits/nested/extra.csv", "wb") as fh:
        fh.write(b"a,label\n1,0\n")
    url = f"memory://{root.lstrip('/')}/digits"

    cache = tmp_path / "cache"
    result = prewarm(url, cache)
    expected = {**source, "nested/extra.csv": b"a,label\n1,0\n"}
    assert result.files_copied == len(expected)
    cached = _files(cache)
    cached.pop(MANIFEST_NAME)
    assert cached == expected
    assert result.manifest.source_uri == url
    assert sorted(f.path for f in result.manifest.files) == sorted(expected)
    for f in result.manifest.files:
        assert f.sha256 == hashlib.sha256(expected[f.path]).hexdigest()

    again = prewarm(url, cache)
    assert again.files_copied == 0
    assert again.files_skipped == len(expected)


def test_memory_and_local_sources_share_dataset_identity(memory_dir, digits_dir: Path, tmp_path: Path):
    fs, root = memory_dir
    for rel, data in _files(digits_dir).items():
        fs.pipe(f"{root}/d/{rel}", data)
    local = prewarm(str(digits_dir), tmp_path / "a")
    remote = prewarm(f"memory://{root.lstrip('/')}/d", tmp_path / "b")
    assert local.manifest.dataset_sha256 == remote.manifest.dataset_sha256


def test_missing_memory_source(memory_dir, tmp_path: Path):
    _, root = memory_dir
    with pytest.raises(DatasetError, match="does not exist"):
        prewarm(f"memory://{root.lstrip('/')}/nothing-here", tmp_path / "cache")


# --- bad sources ------------------------------------------------------------------------------------------


def test_missing_source_raises(tmp_path: Path):
    missing = tmp_path / "no-such-folder"
    with pytest.raises(DatasetError, match=r"no-such-folder.*does not exist"):
        prewarm(str(missing), tmp_path / "cache")
    assert not (tmp_path / "cache" / MANIFEST_NAME).exists()


@pytest.mark.parametrize("hidden_only", [False, True], ids=["empty", "only-hidden-files"])
def test_empty_source_raises(tmp_path: Path, hidden_only: bool):
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    if hidden_only:
        (empty / ".DS_Store").write_bytes(b"x")
    with pytest.raises(DatasetError, match=r"empty-folder.*is empty"):
        prewarm(str(empty), tmp_path / "cache")


def test_dataset_error_hierarchy():
    assert issubclass(DatasetError, ValueError)
    assert issubclass(DatasetError, HeteroflowError)
    assert issubclass(CacheIntegrityError, HeteroflowError)


def test_manifest_load_errors(tmp_path: Path):
    with pytest.raises(DatasetError, match="does not exist; run prewarm"):
        Manifest.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"hello": 1}')
    with pytest.raises(DatasetError, match="is not a heteroflow manifest"):
        Manifest.load(tmp_path / "bad.json")


def test_cache_key():
    a = cache_key("s3://bucket/datasets/digits/")
    assert a.startswith("digits-")
    assert len(a) == len("digits-") + 12
    assert a == cache_key("s3://bucket/datasets/digits/")
    assert a != cache_key("s3://other/datasets/digits/")
    assert cache_key("memory://x y/we?ird") == "we_ird-" + hashlib.sha256(b"memory://x y/we?ird").hexdigest()[:12]


# --- atomicity --------------------------------------------------------------------------------------------


def _assert_consistent(cache: Path) -> None:
    """No temp files; if a manifest exists every file it claims is complete and matches its hash."""
    assert _leftovers(cache) == []
    if (cache / MANIFEST_NAME).exists():
        manifest = Manifest.load(cache / MANIFEST_NAME)
        for entry, path in zip(manifest.files, manifest.local_paths()):
            assert path.stat().st_size == entry.bytes
            assert sha256_file(path) == entry.sha256


def test_failed_rename_leaves_no_partial_file(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    real_replace = os.replace
    calls: list[str] = []

    def flaky_replace(src, dst, *args, **kwargs):
        calls.append(os.fspath(dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device (simulated)")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(prewarm_mod.os, "replace", flaky_replace)
    with pytest.raises(OSError, match="simulated"):
        prewarm(str(digits_dir), cache)
    monkeypatch.setattr(prewarm_mod.os, "replace", real_replace)

    first, second = sorted(_files(digits_dir))[:2]
    assert calls[1] == str(cache / second)
    assert not (cache / second).exists()  # never visible under its final name
    assert (cache / first).read_bytes() == (digits_dir / first).read_bytes()  # the one renamed is complete
    assert not (cache / MANIFEST_NAME).exists()  # no manifest claims anything
    _assert_consistent(cache)

    result = prewarm(str(digits_dir), cache)  # a rerun completes the cache
    cached = _files(cache)
    cached.pop(MANIFEST_NAME)
    assert cached == _files(digits_dir)
    assert result.files_copied + result.files_skipped == len(cached)
    _assert_consistent(cache)


def test_failed_update_keeps_old_manifest_truthful(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    first = prewarm(str(src), cache)
    changed = src / "digits-part-1.csv"
    old_bytes = changed.read_bytes()
    changed.write_bytes(old_bytes + b"1," * 64 + b"1\n")
    _touch_later(changed)

    real_replace = os.replace

    def failing_replace(src_, dst, *args, **kwargs):
        if os.fspath(dst).endswith("digits-part-1.csv"):
            raise OSError(5, "I/O error (simulated)")
        return real_replace(src_, dst, *args, **kwargs)

    monkeypatch.setattr(prewarm_mod.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        prewarm(str(src), cache)
    assert (cache / "digits-part-1.csv").read_bytes() == old_bytes  # old complete copy, not a partial new one
    assert Manifest.load(cache / MANIFEST_NAME) == first.manifest
    _assert_consistent(cache)


def test_failed_fsync_leaves_no_partial_file(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    real_fsync = os.fsync
    count = {"n": 0}

    def flaky_fsync(fd):
        count["n"] += 1
        if count["n"] == 3:
            raise OSError(5, "fsync failed (simulated)")
        return real_fsync(fd)

    monkeypatch.setattr(prewarm_mod.os, "fsync", flaky_fsync)
    with pytest.raises(OSError, match="simulated"):
        prewarm(str(digits_dir), cache)
    third = sorted(_files(digits_dir))[2]
    assert not (cache / third).exists()
    assert not (cache / MANIFEST_NAME).exists()
    _assert_consistent(cache)


class _BrokenReader(io.BytesIO):
    """Returns the first half of the data, then fails like a dropped connection."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self._half = max(1, len(data) // 2)
        self._served = False

    def read(self, size: int = -1) -> bytes:
        if self._served:
            raise ConnectionResetError("connection reset mid-read (simulated)")
        self._served = True
        return super().read(self._half)


def test_source_read_failure_mid_file(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    real_open = LocalFileSystem.open

    def broken_open(self, path, mode="rb", *args, **kwargs):
        if mode == "rb" and str(path).endswith("digits-part-2.csv"):
            return _BrokenReader(Path(path).read_bytes())
        return real_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "open", broken_open)
    with pytest.raises(ConnectionResetError):
        prewarm(str(digits_dir), cache)
    assert not (cache / "digits-part-2.csv").exists()
    assert not (cache / MANIFEST_NAME).exists()
    _assert_consistent(cache)


def test_short_read_raises_cache_integrity_error(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A source that ends early (fewer bytes than its listed size) is not accepted into the cache."""
    cache = tmp_path / "cache"
    real_open = LocalFileSystem.open

    def short_open(self, path, mode="rb", *args, **kwargs):
        if mode == "rb" and str(path).endswith("digits-part-0.csv"):
            return io.BytesIO(Path(path).read_bytes()[:100])
        return real_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "open", short_open)
    with pytest.raises(CacheIntegrityError, match=r"copied 100 bytes of 'digits-part-0.csv' but the source has \d+"):
        prewarm(str(digits_dir), cache)
    assert not (cache / "digits-part-0.csv").exists()
    assert not (cache / MANIFEST_NAME).exists()
    _assert_consistent(cache)
