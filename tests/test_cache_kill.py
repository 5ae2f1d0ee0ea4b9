"""A prewarm killed with SIGKILL: nothing partial is ever visible, the previous version stays intact, a rerun
resumes without recopying what was finished; two prewarms at once give one correct copy."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from heteroflow.cache.dataset import open_dataset
from heteroflow.cache.manifest import MANIFEST_NAME, Manifest, ManifestEntry, dataset_digest, sha256_file
from heteroflow.cache.prewarm import STAGING_NAME, VERSIONS_DIR, dataset_cache_dir, prewarm, prewarm_dataset

# Runs one prewarm in a child process. argv: source, cache root, artifact dir, kill_before (copy number at
# which the child SIGKILLs itself, 0: never), workers, delay per file (seconds). Prints the facts as JSON.
_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    import heteroflow.cache.copying as copying
    import heteroflow.cache.prewarm as pm

    source, cache_root, out, kill_before, workers, delay = sys.argv[1:7]
    kill_before, workers, delay = int(kill_before), int(workers), float(delay)
    real = copying._copy_file  # called by copying._copy_all
    lock = threading.Lock()
    calls = [0]

    def copy(*args, **kwargs):
        with lock:
            calls[0] += 1
            n = calls[0]
        if kill_before and n == kill_before:
            os.kill(os.getpid(), signal.SIGKILL)
        if delay:
            time.sleep(delay)
        return real(*args, **kwargs)

    copying._copy_file = copy
    result = pm.prewarm_dataset(source, out, cache_root=cache_root, copy_threads=workers)
    print(json.dumps(result.facts()))
    """
)


def _run_child(source: Path, cache_root: Path, out: Path, *, kill_before: int = 0, workers: int = 1,
               delay: float = 0.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(source), str(cache_root), str(out), str(kill_before), str(workers), str(delay)],
        capture_output=True, text=True, timeout=300,
    )


def _start_child(source: Path, cache_root: Path, out: Path, *, workers: int = 2, delay: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(source), str(cache_root), str(out), "0", str(workers), str(delay)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _journal_lines(dataset_dir: Path) -> int:
    journal = dataset_dir / STAGING_NAME / ".heteroflow-journal.jsonl"
    return sum(1 for line in journal.read_text().splitlines() if line.endswith("}"))


def _no_temporaries(dataset_dir: Path) -> list[str]:
    return [str(p) for p in dataset_dir.rglob("*")
            if p.name.endswith((".tmp", ".part", ".old")) or p.name == STAGING_NAME or ".heteroflow-journal" in p.name]


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 files of 1-4 KB in 20 folders and two files of 50 MB (random bytes, seeded)."""
    root = tmp_path_factory.mktemp("big") / "tree"
    rng = random.Random(7)
    for i in range(2000):
        p = root / f"part-{i % 20:02d}" / f"rec-{i:05d}.csv"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randint(1024, 4096)))
    for i in range(2):
        (root / f"large-{i}.npz").write_bytes(rng.randbytes(50 * 1024 * 1024))
    return root


@pytest.mark.slow
def test_killed_prewarm_of_a_large_tree_resumes_without_recopying(big_tree: Path, tmp_path: Path):
    cache_root = tmp_path / "tier"
    dataset_dir = dataset_cache_dir(str(big_tree), str(cache_root))
    killed = _run_child(big_tree, cache_root, tmp_path / "a1", kill_before=1200, workers=4)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # nothing published: no version, no current manifest, only the private staging folder
    assert not (dataset_dir / VERSIONS_DIR).exists()
    assert not (dataset_dir / MANIFEST_NAME).exists()
    done = _journal_lines(dataset_dir)
    assert 1100 <= done < 1200  # up to workers-1 files were mid-copy at the kill

    result = prewarm_dataset(str(big_tree), str(tmp_path / "a2"), cache_root=str(cache_root))
    total = 2002
    assert result.files_skipped == done  # finished files are not copied again
    assert result.files_copied == total - done
    assert result.files_copied + result.files_skipped == len(result.manifest.files) == total
    root = Path(result.manifest.root)
    cached = {k: v for k, v in _tree(root).items() if k not in (MANIFEST_NAME, ".heteroflow-stat.json")}
    assert cached == _tree(big_tree)  # byte for byte
    open_dataset(tmp_path / "a2", verify="sha256")
    assert _no_temporaries(dataset_dir) == []


def test_changed_source_killed_reprewarm_keeps_the_old_version(tmp_path: Path):
    """The scenario of issue #7: prewarm 40 files, change them all, kill a second prewarm after 17; the old
    version stays readable and whole, a rerun completes the new one, and lineage names what was read."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}.csv").write_text(f"a,label\n{i},0\n")
    cache_root = tmp_path / "tier"
    dataset_dir = dataset_cache_dir(str(src), str(cache_root))
    old = prewarm_dataset(str(src), str(tmp_path / "run1"), cache_root=str(cache_root))

    for i in range(40):
        (src / f"f{i:02d}.csv").write_text(f"a,label\n{i},1\n{i + 100},1\n")
    killed = _run_child(src, cache_root, tmp_path / "run2", kill_before=18, workers=1)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _journal_lines(dataset_dir) == 17

    # the current version is still the old one, complete and unchanged
    assert Manifest.load(dataset_dir / MANIFEST_NAME) == old.manifest
    view = open_dataset(tmp_path / "run1", verify="sha256")
    assert view.version == old.version
    assert [p.read_text() for p in view.files] == [f"a,label\n{i},0\n" for i in range(40)]

    new = prewarm_dataset(str(src), str(tmp_path / "run2"), cache_root=str(cache_root))
    assert (new.files_skipped, new.files_copied) == (17, 23)
    assert new.version != old.version
    expected = dataset_digest([
        ManifestEntry(path=p.name, bytes=p.stat().st_size, sha256=sha256_file(p)) for p in sorted(src.iterdir())
    ])
    read = open_dataset(tmp_path / "run2", verify="sha256")
    assert read.lineage()["dataset_sha256"] == expected == new.manifest.dataset_sha256
    assert read.lineage()["version"] == new.version
    assert [p.read_text() for p in read.files] == [f"a,label\n{i},1\n{i + 100},1\n" for i in range(40)]
    # a run that holds the old artifact still reads the old version, whole
    assert open_dataset(tmp_path / "run1", verify="sha256").dataset_sha256 == old.manifest.dataset_sha256
    assert _no_temporaries(dataset_dir) == []


def test_two_prewarms_at_once_give_one_copy(tmp_path: Path):
    src = tmp_path / "src"
    for i in range(60):
        p = src / f"d{i % 3}" / f"f{i:03d}.csv"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"a,label\n{i},{i % 2}\n" * 50)
    cache_root = tmp_path / "tier"
    first = _start_child(src, cache_root, tmp_path / "o1", delay=0.02)
    second = _start_child(src, cache_root, tmp_path / "o2", delay=0.02)
    outs = []
    for proc in (first, second):
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert sorted(o["files_copied"] for o in outs) == [0, 60]  # one copied, the other waited and reused it
    assert outs[0]["version"] == outs[1]["version"]
    dataset_dir = dataset_cache_dir(str(src), str(cache_root))
    assert [p.name for p in (dataset_dir / VERSIONS_DIR).iterdir()] == [outs[0]["version"]]
    for out in ("o1", "o2"):
        view = open_dataset(tmp_path / out, verify="sha256")
        assert {p.relative_to(view.root).as_posix(): p.read_bytes() for p in view.files} == _tree(src)
    assert _no_temporaries(dataset_dir) == []


def test_staging_of_another_source_content_is_discarded(tmp_path: Path):
    """Files a killed prewarm staged from an older source content are not taken into the new version."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}.csv").write_text(f"a,label\n{i},0\n")
    cache_root = tmp_path / "tier"
    killed = _run_child(src, cache_root, tmp_path / "o", kill_before=6, workers=1)
    assert killed.returncode == -signal.SIGKILL
    for i in range(10):
        (src / f"f{i}.csv").write_text(f"a,label\n{i},9\n")
        st = (src / f"f{i}.csv").stat()
        os.utime(src / f"f{i}.csv", ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))
    result = prewarm(str(src), dataset_cache_dir(str(src), str(cache_root)))
    assert (result.files_copied, result.files_skipped) == (10, 0)
    assert all(p.read_text().endswith(",9\n") for p in result.manifest.local_paths())
