"""Prewarm into the local cache tier: versions, manifests, reruns, verification, leftovers, disk space, locks,
and the reader API that checks what it reads."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import uuid
from pathlib import Path

import fsspec
import pytest

import heteroflow.cache.prewarm as prewarm_mod
from heteroflow.cache.dataset import open_dataset
from heteroflow.cache.errors import (
    CacheIntegrityError,
    CacheSpaceError,
    DatasetError,
    HeteroflowError,
    InvalidCacheOption,
    SourceUnavailable,
)
from heteroflow.cache.prewarm import (
    MANIFEST_NAME,
    STAGING_NAME,
    VERSIONS_DIR,
    Manifest,
    cache_key,
    check_source,
    dataset_cache_dir,
    prewarm,
    prewarm_dataset,
    sha256_file,
)
from heteroflow.cache.progress import Progress, report_progress
from heteroflow.cache.status import cache_status


def _files(root: Path) -> dict[str, bytes]:
    """Relative POSIX path -> content of every non-hidden file under ``root`` (heteroflow's manifest excluded)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts) and p.name != MANIFEST_NAME
    }


def _leftovers(dataset_dir: Path) -> list[str]:
    """Temporaries and staging left in a data set's cache folder (``.lock`` and the versions' stat index are ours)."""
    allowed = {".lock", ".heteroflow-stat.json"}
    return sorted(
        str(p.relative_to(dataset_dir))
        for p in dataset_dir.rglob("*")
        if (p.name.startswith(".") and p.name not in allowed) or p.name.endswith((".part", ".tmp", ".old"))
    )


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _touch_later(path: Path) -> None:
    """Move a file's mtime clearly forward, so a change is visible even on coarse timestamp clocks."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))


@pytest.fixture
def src(tmp_path: Path, digits_dir: Path) -> Path:
    """A private, writable copy of the digits folder."""
    dest = tmp_path / "src" / "digits"
    shutil.copytree(digits_dir, dest)
    return dest


def _assert_version_intact(manifest: Manifest) -> None:
    """Every file the manifest names is in its version folder with the right size and sha256."""
    for entry, path in zip(manifest.files, manifest.local_paths()):
        assert path.stat().st_size == entry.bytes, entry.path
        assert sha256_file(path) == entry.sha256, entry.path


# --- a first prewarm --------------------------------------------------------------------------------------


def test_prewarm_copies_every_file_into_a_version(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    result = prewarm(str(digits_dir), cache)

    source = _files(digits_dir)
    assert len(source) >= 5  # 4 CSV parts + SOURCE.md + export.json
    assert result.files_copied == len(source)
    assert result.files_skipped == 0
    assert result.bytes_copied == sum(len(b) for b in source.values())
    version_dir = cache / VERSIONS_DIR / result.version
    assert result.version == result.manifest.dataset_sha256[:16]
    assert result.manifest_path == version_dir / MANIFEST_NAME
    assert Path(result.manifest.root) == version_dir.resolve()
    assert _files(version_dir) == source

    # The data set folder's manifest.json is the current version's (the publish step)
    assert Manifest.load(cache / MANIFEST_NAME) == Manifest.load(version_dir / MANIFEST_NAME) == result.manifest
    on_disk = json.loads((cache / MANIFEST_NAME).read_text())
    assert on_disk["format"] == 2
    assert on_disk["source_uri"] == str(digits_dir)
    assert on_disk["version"] == result.version
    assert on_disk["backend"] == "local"
    assert on_disk["total_bytes"] == result.bytes_copied
    assert [f["path"] for f in on_disk["files"]] == sorted(source)
    for entry in on_disk["files"]:
        local = version_dir / entry["path"]
        assert entry["bytes"] == local.stat().st_size == len(source[entry["path"]])
        assert entry["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
    assert result.manifest.local_paths() == [version_dir.resolve() / p for p in sorted(source)]
    assert _leftovers(cache) == []
    assert not (cache / STAGING_NAME).exists()


def test_cached_files_get_the_umask_permissions(digits_dir: Path, tmp_path: Path):
    old = os.umask(0o022)
    try:
        result = prewarm(str(digits_dir), tmp_path / "cache")
    finally:
        os.umask(old)
    for path in [*result.manifest.local_paths(), result.manifest_path, tmp_path / "cache" / MANIFEST_NAME]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_dataset_sha256_is_stable_across_cache_dirs(digits_dir: Path, tmp_path: Path):
    a = prewarm(str(digits_dir), tmp_path / "cache-a")
    b = prewarm(str(digits_dir), tmp_path / "cache-b")
    assert a.manifest.dataset_sha256 == b.manifest.dataset_sha256
    assert a.version == b.version
    assert a.manifest.root != b.manifest.root
    digest = hashlib.sha256()
    for f in sorted(a.manifest.files, key=lambda e: e.path):
        digest.update(f"{f.path}\0{f.bytes}\0{f.sha256}\n".encode())
    assert a.manifest.dataset_sha256 == digest.hexdigest()


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
    root = Path(result.manifest.root)
    assert (root / "sub" / "deeper" / "x.npz").read_bytes() == b"not really npz"
    assert not (root / ".hidden").exists() and not (root / ".git").exists()
    assert sorted(result.skipped_entries) == [".git/ (hidden: the name starts with '.')", ".hidden (hidden: the name starts with '.')"]
    assert result.facts()["entries_not_taken"] == 2


def test_single_file_source(tmp_path: Path):
    f = tmp_path / "one.csv"
    f.write_text("a,b,label\n1,2,x\n")
    result = prewarm(str(f), tmp_path / "cache")
    assert [e.path for e in result.manifest.files] == ["one.csv"]
    assert (Path(result.manifest.root) / "one.csv").read_bytes() == f.read_bytes()


# --- reruns -----------------------------------------------------------------------------------------------


def test_rerun_copies_nothing(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    n = len(first.manifest.files)
    before = {p: _stat(p) for p in first.manifest.local_paths()}
    second = prewarm(str(digits_dir), cache)
    assert (second.files_copied, second.files_skipped, second.bytes_copied) == (0, n, 0)
    assert second.manifest == first.manifest
    assert {p: _stat(p) for p in before} == before
    assert sorted(p.name for p in (cache / VERSIONS_DIR).iterdir()) == [first.version]
    assert _leftovers(cache) == []


def test_changed_source_makes_a_new_version_and_keeps_the_old(src: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(src), cache)
    n = len(first.manifest.files)
    changed = src / "digits-part-1.csv"
    new_content = changed.read_text() + ",".join(["3"] * 64) + ",7\n"
    changed.write_text(new_content)
    _touch_later(changed)
    old_paths = {p: _stat(p) for p in first.manifest.local_paths()}

    second = prewarm(str(src), cache)
    assert second.version != first.version
    assert (second.files_copied, second.files_skipped) == (1, n - 1)
    assert second.bytes_copied == len(new_content.encode())
    new_root = Path(second.manifest.root)
    assert (new_root / "digits-part-1.csv").read_text() == new_content
    # The published old version was not touched, and is still whole
    assert {p: _stat(p) for p in old_paths} == old_paths
    _assert_version_intact(first.manifest)
    # Unchanged files are shared (hard links), not copied again
    assert (new_root / "digits-part-0.csv").stat().st_ino == (Path(first.manifest.root) / "digits-part-0.csv").stat().st_ino
    assert Manifest.load(cache / MANIFEST_NAME) == second.manifest
    entry = {f.path: f for f in second.manifest.files}["digits-part-1.csv"]
    assert entry.sha256 == hashlib.sha256(new_content.encode()).hexdigest()


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
    assert (Path(second.manifest.root) / "digits-part-3.csv").read_bytes() == bytes(data)


def test_corrupted_cached_file_is_detected_and_recopied(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    victim = Path(first.manifest.root) / "digits-part-0.csv"
    good = victim.read_bytes()
    bad = bytes(b ^ 0x01 for b in good[:16]) + good[16:]
    victim.write_bytes(bad)
    with pytest.raises(CacheIntegrityError, match=r"digits-part-0.csv .*differs from its manifest.*rerun prewarm"):
        open_dataset(cache, verify="sha256")

    second = prewarm(str(digits_dir), cache)  # default verify="stat": the write changed the file's mtime
    assert (second.files_copied, second.files_skipped) == (1, len(first.manifest.files) - 1)
    assert (Path(second.manifest.root) / "digits-part-0.csv").read_bytes() == good
    assert second.manifest.dataset_sha256 == first.manifest.dataset_sha256
    open_dataset(cache, verify="sha256")


def test_verify_modes_on_a_corruption_that_keeps_size_and_mtime(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    victim = Path(first.manifest.root) / "digits-part-0.csv"
    good = victim.read_bytes()
    st = victim.stat()
    victim.write_bytes(b"X" + good[1:])
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: same size, same mtime
    assert prewarm(str(digits_dir), cache, verify="size").files_copied == 0
    assert prewarm(str(digits_dir), cache, verify="stat").files_copied == 0
    assert prewarm(str(digits_dir), cache, verify="sha256").files_copied == 1
    assert (Path(Manifest.load(cache / MANIFEST_NAME).root) / "digits-part-0.csv").read_bytes() == good


def test_deleted_or_truncated_cached_file_is_recopied(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    root = Path(first.manifest.root)
    (root / "digits-part-2.csv").unlink()
    (root / "digits-part-3.csv").write_bytes(b"short")
    with pytest.raises(CacheIntegrityError, match=r"digits-part-2.csv .*missing from the cache"):
        open_dataset(cache)
    result = prewarm(str(digits_dir), cache, verify="size")
    assert result.files_copied == 2
    assert _files(Path(result.manifest.root)) == _files(digits_dir)


def test_damaged_manifest_means_full_recopy(digits_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm(str(digits_dir), cache)
    (cache / MANIFEST_NAME).write_text("{ not json")
    result = prewarm(str(digits_dir), cache)
    assert result.files_copied == len(first.manifest.files)
    assert Manifest.load(cache / MANIFEST_NAME) == result.manifest
    assert result.manifest.dataset_sha256 == first.manifest.dataset_sha256


def test_old_versions_beyond_keep_are_removed(src: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    versions = []
    for i in range(4):
        (src / "extra.csv").write_text(f"a,label\n{i},0\n")
        _touch_later(src / "extra.csv")
        versions.append(prewarm(str(src), cache, keep_versions=2).version)
    assert len(set(versions)) == 4
    assert sorted(p.name for p in (cache / VERSIONS_DIR).iterdir()) == sorted(versions[-2:])
    with pytest.raises(InvalidCacheOption, match=r"keep_versions=0 is out of range"):
        prewarm(str(src), cache, keep_versions=0)


def test_legacy_layout_is_migrated_without_recopying(digits_dir: Path, tmp_path: Path):
    """A cache folder in the first layout (files directly in it, manifest without a version) is reused."""
    cache = tmp_path / "cache"
    cache.mkdir()
    entries = []
    for rel, data in _files(digits_dir).items():
        (cache / rel).write_bytes(data)
        entries.append({"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source_key": "x"})
    listing_key = prewarm_mod.list_dataset(str(digits_dir)).files
    for e, f in zip(entries, listing_key):
        e["source_key"] = f.key
    (cache / MANIFEST_NAME).write_text(json.dumps({
        "version": 1, "source_uri": str(digits_dir), "root": str(cache), "dataset_sha256": "0" * 64, "files": entries,
    }))
    result = prewarm(str(digits_dir), cache)
    assert result.files_copied == 0
    assert result.files_skipped == len(entries)
    assert sorted(p.name for p in cache.iterdir()) == [".lock", MANIFEST_NAME, VERSIONS_DIR]
    _assert_version_intact(result.manifest)


# --- the step-level function, the reader and the up-front check -------------------------------------------


def test_prewarm_dataset_writes_the_artifact_and_facts(digits_dir: Path, tmp_path: Path):
    out = tmp_path / "artifact"
    result = prewarm_dataset(str(digits_dir), str(out), cache_root=str(tmp_path / "tier"))
    assert Manifest.load(out / MANIFEST_NAME) == result.manifest
    assert Path(result.manifest.root).parent.parent == dataset_cache_dir(str(digits_dir), str(tmp_path / "tier"))
    facts = result.facts()
    assert facts["version"] == result.version
    assert facts["files"] == facts["files_copied"] == len(_files(digits_dir))
    assert facts["source_uri"] == str(digits_dir)
    assert json.loads(json.dumps(facts)) == facts  # JSON-ready

    view = open_dataset(out)
    assert view.version == result.version
    assert view.dataset_sha256 == result.manifest.dataset_sha256
    assert [p.name for p in view.data_files] == [f"digits-part-{i}.csv" for i in range(4)]
    assert view.lineage()["version"] == result.version


def test_prewarm_dataset_default_cache_root(digits_dir: Path, tmp_path: Path, heteroflow_home: Path):
    result = prewarm_dataset(str(digits_dir), str(tmp_path / "out"))
    assert (heteroflow_home / "cache" / cache_key(str(digits_dir)) / MANIFEST_NAME).is_file()
    assert Path(result.manifest.root).is_relative_to(heteroflow_home / "cache")


def test_prewarm_dataset_args_are_documented_pipeline_parameters():
    """Every keyword parameter with a default is str/int/float/bool and has a one-line ``name: help`` entry."""
    import inspect

    doc = prewarm_dataset.__doc__ or ""
    for name, p in inspect.signature(prewarm_dataset).parameters.items():
        if p.default is inspect.Parameter.empty:
            continue
        assert type(p.default) in (str, int, float, bool), name
        assert f"\n        {name}: " in doc, name


def test_open_dataset_of_a_plain_folder_uses_the_one_listing(tmp_path: Path):
    src = tmp_path / "plain"
    (src / ".ipynb_checkpoints").mkdir(parents=True)
    (src / ".ipynb_checkpoints" / "x-checkpoint.csv").write_text("a,label\n1,0\n")
    (src / "x.csv").write_text("a,label\n1,0\n")
    view = open_dataset(src, verify="sha256")
    assert view.relative == ("x.csv",)
    assert view.manifest is None and view.version == ""
    assert view.dataset_sha256 is not None and len(view.dataset_sha256) == 64


def test_open_dataset_of_a_removed_version(src: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = prewarm_dataset(str(src), str(tmp_path / "run1"), cache_root=str(cache), keep_versions=1)
    (src / "extra.csv").write_text("a,label\n1,0\n")
    prewarm_dataset(str(src), str(tmp_path / "run2"), cache_root=str(cache), keep_versions=1)
    with pytest.raises(DatasetError, match=rf"version {first.version} of data set .* is no longer in the cache.*rerun prewarm"):
        open_dataset(tmp_path / "run1")


def test_check_source_copies_nothing(digits_dir: Path, tmp_path: Path, heteroflow_home: Path):
    check_source(str(digits_dir))
    assert not (heteroflow_home / "cache").exists()
    with pytest.raises(DatasetError, match="does not exist"):
        check_source(str(tmp_path / "missing"))


def test_progress_is_reported(digits_dir: Path, tmp_path: Path):
    seen: list[Progress] = []
    with report_progress(seen.append):
        prewarm_dataset(str(digits_dir), str(tmp_path / "out"), cache_root=str(tmp_path / "c"))
    copying = [p for p in seen if p.phase == "copying"]
    assert copying[-1].files_done == copying[-1].files_total == len(_files(digits_dir))
    assert copying[-1].bytes_done == sum(len(b) for b in _files(digits_dir).values())
    assert seen[-1].phase == "done"


def test_cache_status(src: Path, tmp_path: Path):
    cache = tmp_path / "tier"
    prewarm_dataset(str(src), str(tmp_path / "a"), cache_root=str(cache))
    (src / "extra.csv").write_text("a,label\n1,0\n")
    second = prewarm_dataset(str(src), str(tmp_path / "b"), cache_root=str(cache))
    (Path(second.manifest.root) / "extra.csv").unlink()
    [status] = cache_status(str(cache), "digits")
    assert [v.current for v in status.versions] == [True, False]
    assert status.versions[0].version == second.version
    assert status.files_total == len(second.manifest.files)
    assert status.files_cached == status.files_total - 1
    assert 0 < status.cached_fraction < 1
    assert cache_status(str(cache), "nothing-like-it") == []


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
        fs.pipe(f"{root}/digits/{rel}", data)
    fs.pipe(f"{root}/digits/nested/extra.csv", b"a,label\n1,0\n")
    fs.pipe(f"{root}/digits/.ipynb_checkpoints/x-checkpoint.csv", b"a,label\n1,0\n")
    url = f"memory://{root.lstrip('/')}/digits"

    cache = tmp_path / "cache"
    result = prewarm(url, cache)
    expected = {**source, "nested/extra.csv": b"a,label\n1,0\n"}
    assert result.files_copied == len(expected)
    assert _files(Path(result.manifest.root)) == expected
    assert result.manifest.source_uri == url
    again = prewarm(url, cache)
    assert (again.files_copied, again.files_skipped) == (0, len(expected))


def test_memory_and_local_sources_share_dataset_identity(memory_dir, digits_dir: Path, tmp_path: Path):
    fs, root = memory_dir
    for rel, data in _files(digits_dir).items():
        fs.pipe(f"{root}/d/{rel}", data)
    local = prewarm(str(digits_dir), tmp_path / "a")
    remote = prewarm(f"memory://{root.lstrip('/')}/d", tmp_path / "b")
    assert local.manifest.dataset_sha256 == remote.manifest.dataset_sha256


# --- bad input --------------------------------------------------------------------------------------------


def test_missing_source_leaves_nothing(tmp_path: Path):
    with pytest.raises(DatasetError, match=r"no-such-folder.*does not exist"):
        prewarm(str(tmp_path / "no-such-folder"), tmp_path / "cache" / "d")
    assert not (tmp_path / "cache" / "d").exists()


def test_missing_memory_source(memory_dir, tmp_path: Path):
    _, root = memory_dir
    with pytest.raises(DatasetError, match="does not exist"):
        prewarm(f"memory://{root.lstrip('/')}/nothing-here", tmp_path / "cache")


@pytest.mark.parametrize("hidden_only", [False, True], ids=["empty", "only-hidden-files"])
def test_empty_source_raises(tmp_path: Path, hidden_only: bool):
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    if hidden_only:
        (empty / ".DS_Store").write_bytes(b"x")
    with pytest.raises(DatasetError, match=r"empty-folder is empty") as err:
        prewarm(str(empty), tmp_path / "cache")
    if hidden_only:
        assert ".DS_Store (hidden" in str(err.value)


def test_unknown_scheme_and_missing_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(DatasetError, match=r"nosuch:// is not a known fsspec protocol"):
        prewarm("nosuch://bucket/data", tmp_path / "cache")
    from fsspec.registry import known_implementations

    monkeypatch.setitem(known_implementations, "fakefs",
                        {"class": "heteroflow_no_such_package.FakeFS", "err": "Install heteroflow-no-such-package"})
    from heteroflow.cache import sources

    monkeypatch.setitem(sources._PACKAGES, "fakefs", "heteroflow-no-such-package")
    with pytest.raises(DatasetError, match=r"driver for fakefs:// is not installed; pip install heteroflow-no-such-package"):
        check_source("fakefs://bucket/data")
    assert not (tmp_path / "cache").exists()


def test_not_enough_disk_space(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = shutil.disk_usage
    monkeypatch.setattr(prewarm_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(CacheSpaceError, match=r"not enough free space .* needs .* \(\d+ bytes\), 1000 B \(1000 bytes\) are free"):
        prewarm(str(digits_dir), tmp_path / "cache" / "d")
    assert not (tmp_path / "cache" / "d").exists()


def test_manifest_entry_that_escapes_the_root(digits_dir: Path, tmp_path: Path):
    result = prewarm(str(digits_dir), tmp_path / "cache")
    data = json.loads(result.manifest_path.read_text())
    data["files"][0]["path"] = "../../outside.csv"
    bad = tmp_path / "bad" / MANIFEST_NAME
    bad.parent.mkdir()
    bad.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=r"entry '../../outside.csv' escapes the data set root"):
        Manifest.load(bad)
    with pytest.raises(DatasetError, match="escapes the data set root"):
        open_dataset(bad.parent)


def test_manifest_load_errors(tmp_path: Path):
    with pytest.raises(DatasetError, match="does not exist; run prewarm"):
        Manifest.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"hello": 1}')
    with pytest.raises(DatasetError, match="is not a heteroflow manifest"):
        Manifest.load(tmp_path / "bad.json")


def test_bad_options(digits_dir: Path, tmp_path: Path):
    with pytest.raises(InvalidCacheOption, match=r"verify='md5' is not a verification mode; valid: size, stat, sha256"):
        prewarm(str(digits_dir), tmp_path / "c", verify="md5")
    with pytest.raises(InvalidCacheOption, match=r"workers=-1 is out of range"):
        prewarm(str(digits_dir), tmp_path / "c", workers=-1)
    with pytest.raises(InvalidCacheOption, match=r"verify='quick' is not a read check"):
        open_dataset(digits_dir, verify="quick")


def test_error_hierarchy():
    assert issubclass(DatasetError, ValueError) and issubclass(DatasetError, HeteroflowError)
    assert issubclass(CacheIntegrityError, HeteroflowError)
    assert issubclass(SourceUnavailable, ConnectionError) and issubclass(SourceUnavailable, HeteroflowError)


def test_cache_key():
    a = cache_key("s3://bucket/datasets/digits/")
    assert a.startswith("digits-") and len(a) == len("digits-") + 12
    assert a == cache_key("s3://bucket/datasets/digits")  # trailing slash: same data set
    assert a != cache_key("s3://other/datasets/digits/")
    # credentials do not change the data set, and never reach the folder name
    assert cache_key("http://alice:pw@h/d/") == cache_key("http://bob:other@h/d") != cache_key("http://h/e")
    assert cache_key("https://h/x/digits/?X-Amz-Signature=abc").startswith("digits-")
    assert cache_key("memory://x y/we?ird") == "we-" + hashlib.sha256(b"memory://x y/we?ird").hexdigest()[:12]


# --- failures mid-copy ------------------------------------------------------------------------------------


class _BrokenReader(io.BytesIO):
    """Returns the first half of the data, then fails like a dropped connection."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self._half = max(1, len(data) // 2)
        self._served = False

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        if self._served:
            raise ConnectionResetError("connection reset mid-read (simulated)")
        self._served = True
        return super().read(self._half)


def test_source_read_failure_mid_file_is_transient_and_resumable(memory_dir, digits_dir: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch):
    fs, root = memory_dir
    for rel, data in _files(digits_dir).items():
        fs.pipe(f"{root}/d/{rel}", data)
    url = f"memory://{root.lstrip('/')}/d"
    cache = tmp_path / "cache"
    real_open = type(fs).open

    def broken_open(self, path, mode="rb", *args, **kwargs):
        if mode == "rb" and str(path).endswith("digits-part-2.csv"):
            return _BrokenReader(fs.cat_file(path))
        return real_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(type(fs), "open", broken_open)
    with pytest.raises(SourceUnavailable, match=r"cannot reach the source .*connection reset mid-read"):
        prewarm(url, cache, workers=1)
    assert not (cache / MANIFEST_NAME).exists()  # nothing published
    assert not (cache / VERSIONS_DIR).exists()
    monkeypatch.setattr(type(fs), "open", real_open)
    result = prewarm(url, cache, workers=1)
    assert result.files_copied + result.files_skipped == len(_files(digits_dir))
    assert result.files_skipped >= 2  # the files finished before the failure were kept and not read again
    _assert_version_intact(result.manifest)
    assert _leftovers(cache) == []


def test_short_read_raises_cache_integrity_error(memory_dir, digits_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    """A source that ends early (fewer bytes than its listed size) is not accepted into the cache."""
    fs, root = memory_dir
    for rel, data in _files(digits_dir).items():
        fs.pipe(f"{root}/d/{rel}", data)
    cache = tmp_path / "cache"
    real_open = type(fs).open

    def short_open(self, path, mode="rb", *args, **kwargs):
        if mode == "rb" and str(path).endswith("digits-part-0.csv"):
            return io.BytesIO(fs.cat_file(path)[:100])
        return real_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(type(fs), "open", short_open)
    with pytest.raises(CacheIntegrityError, match=r"copied 100 bytes of 'digits-part-0.csv' but the source has \d+"):
        prewarm(f"memory://{root.lstrip('/')}/d", cache)
    assert not (cache / MANIFEST_NAME).exists()
    assert not (cache / STAGING_NAME / "digits-part-0.csv").exists()  # the short copy is not kept for a resume


@pytest.mark.parametrize(("url", "package"), [("gs://bucket/digits/", "gcsfs"), ("az://container/digits/", "adlfs")])
def test_gcs_and_azure_without_their_driver(url: str, package: str):
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        pytest.skip(reason=f"{package} is installed in this environment, so its driver is not missing")
    with pytest.raises(DatasetError, match=rf"the fsspec driver for \w+:// is not installed; pip install {package}$"):
        check_source(url)


def test_http_without_aiohttp_names_the_extra_that_installs_it(monkeypatch: pytest.MonkeyPatch):
    """A new user's trial: the README's first command installs no HTTP driver, and the message named aiohttp, which
    no extra installed; the `http` extra does now (and `all` holds it)."""
    import sys

    for name in [m for m in sys.modules if m == "aiohttp" or m.startswith(("aiohttp.", "fsspec.implementations.http"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # import aiohttp fails, as where it is not installed
    loaded = sys.modules["fsspec.registry"]._registry  # fsspec keeps the classes it loaded: an earlier test's http one
    for protocol in ("http", "https"):
        if protocol in loaded:
            monkeypatch.delitem(loaded, protocol)
    with pytest.raises(DatasetError, match=r"the fsspec driver for http:// is not installed; pip install 'heteroflow\[http\]' \(aiohttp\)$"):
        check_source("http://127.0.0.1:9/d/")
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("aiohttp") for r in extras["http"]) and "http" in extras["all"][0]


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 * 2**30, "5.0 GiB"),
    (3 * 2**50, "3072.0 TiB"), (1023.7, "1023 B"), (-2048, "-2.0 KiB"),
])
def test_format_bytes_is_the_one_byte_format_of_cache_messages(n: float, text: str) -> None:
    from heteroflow.cache.progress import format_bytes

    assert format_bytes(n) == text
