"""A cached file edited between prewarm and preprocess, with its size kept and its mtime restored, is never read
stale (issue #28.14, the replay of a KFP cache report): preprocess checks every file it reads against the
manifest's sha256, for tables (the input) and for image folders (the sibling: the same data set view)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from heteroflow.cache.errors import CacheIntegrityError
from heteroflow.cache.prewarm import prewarm
from heteroflow.components.data.preprocess import preprocess


def _edit_in_place(path: Path) -> None:
    """Change one byte, keep the size, put the mtime back: what a size or stat check cannot see."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    at = len(data) // 2
    data[at] = (data[at] + 1) % 256 if data[at] not in (ord(","), ord("\n")) else data[at]
    if bytes(data) == path.read_bytes():
        data[-2] = (data[-2] + 1) % 256
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_a_cached_table_edited_with_size_and_mtime_kept_is_refused_by_preprocess(digits_dir: Path, tmp_path: Path) -> None:
    result = prewarm(str(digits_dir), tmp_path / "cache")
    victim = Path(result.manifest.root) / "digits-part-0.csv"
    _edit_in_place(victim)
    with pytest.raises(CacheIntegrityError, match=r"digits-part-0\.csv of data set .* differs from its manifest \(sha256\) "
                                                  r"in the cache .*; rerun prewarm to repair the cache, re-hashing what it reuses \(--verify sha256"):
        preprocess(result.manifest_path, tmp_path / "shards", num_workers=1)
    assert not (tmp_path / "shards").exists()
    assert prewarm(str(digits_dir), tmp_path / "cache").files_copied == 0  # the default stat check reuses it
    repaired = prewarm(str(digits_dir), tmp_path / "cache", verify="sha256")  # the fix the message gives
    assert repaired.files_copied == 1 and repaired.manifest.dataset_sha256 == result.manifest.dataset_sha256
    assert sum(preprocess(repaired.manifest_path, tmp_path / "shards", num_workers=1).counts.values()) > 0


def test_a_cached_image_edited_with_size_and_mtime_kept_is_refused_by_preprocess(tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "imgs"
    for k, name in enumerate(("cat", "dog")):
        (src / name).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(np.full((4, 4), 100 * k + i, dtype=np.uint8), mode="L").save(src / name / f"{i}.png")
    result = prewarm(str(src), tmp_path / "cache")
    _edit_in_place(Path(result.manifest.root) / "dog" / "3.png")
    with pytest.raises(CacheIntegrityError, match=r"dog/3\.png of data set .* differs from its manifest \(sha256\)"):
        preprocess(result.manifest_path, tmp_path / "shards", num_workers=1)
    assert not (tmp_path / "shards").exists()
