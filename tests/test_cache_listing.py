"""One view of which files a data set holds (issue #8 item 4): the up-front check, prewarm and the reader
agree, on local folders and over HTTP alike, about symlinks, hidden folders and what is skipped."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.cache.dataset import open_dataset
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.listing import list_dataset
from heteroflow.cache.prewarm import check_source, prewarm_dataset

CSV = "a,b,label\n1,2,x\n3,4,y\n"


def _all_views(folder: Path, tmp_path: Path) -> dict[str, list[str]]:
    """The files the up-front check's listing, prewarm and the reader (plain folder and artifact) each take."""
    check_source(str(folder))
    result = prewarm_dataset(str(folder), str(tmp_path / "artifact"), cache_root=str(tmp_path / "tier"))
    return {
        "listing": [f.path for f in list_dataset(str(folder)).files],
        "prewarm": [e.path for e in result.manifest.files],
        "reader (plain folder)": list(open_dataset(folder).relative),
        "reader (artifact)": list(open_dataset(tmp_path / "artifact", verify="sha256").relative),
    }


def test_a_folder_whose_only_file_is_a_symlink_to_a_csv_elsewhere(tmp_path: Path):
    """Issue #8 item 4, first input: the check passed, then prewarm failed four times with "is empty"."""
    elsewhere = tmp_path / "elsewhere" / "real.csv"
    elsewhere.parent.mkdir()
    elsewhere.write_text(CSV)
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "link.csv").symlink_to(elsewhere)
    views = _all_views(folder, tmp_path)
    assert set(map(tuple, views.values())) == {("link.csv",)}, views
    cached = open_dataset(tmp_path / "artifact").files[0]
    assert cached.read_text() == CSV and not cached.is_symlink()  # the content, not a link, is cached


def test_ipynb_checkpoints_are_not_taken(tmp_path: Path):
    """Issue #8 item 4, second input: `.ipynb_checkpoints/x-checkpoint.csv` was accepted, then broke preprocess."""
    folder = tmp_path / "data"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    (folder / ".ipynb_checkpoints" / "x-checkpoint.csv").write_text("garbage\n")
    (folder / "x.csv").write_text(CSV)
    views = _all_views(folder, tmp_path)
    assert set(map(tuple, views.values())) == {("x.csv",)}, views
    assert [str(s) for s in list_dataset(str(folder)).skipped] == [".ipynb_checkpoints/ (hidden: the name starts with '.')"]


def test_only_hidden_data_is_an_error_that_says_what_was_skipped(tmp_path: Path):
    folder = tmp_path / "data"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    (folder / ".ipynb_checkpoints" / "x-checkpoint.csv").write_text(CSV)
    (folder / "README.md").write_text("notes")
    for call in (check_source, lambda u: open_dataset(u)):
        with pytest.raises(DatasetError, match=r"has no \.csv, \.tsv, \.parquet or \.npz file \(found: README.md\); skipped: "
                                               r"\.ipynb_checkpoints/ \(hidden: the name starts with '\.'\)"):
            call(str(folder))
    # Issue 14: the cache tier itself caches any files (formats belong to the readers and the run's up-front check)
    result = prewarm_dataset(str(folder), str(tmp_path / "o"), cache_root=str(tmp_path / "t"))
    assert result.facts()["files"] == 1


def test_macos_resource_forks_are_not_data(tmp_path: Path):
    """Sibling found: an archive unpacked from macOS holds `._x.csv` AppleDouble files (binary, .csv suffix)
    and a `__MACOSX/` folder of them; `._` files are hidden, so none is taken."""
    folder = tmp_path / "data"
    (folder / "__MACOSX").mkdir(parents=True)
    (folder / "x.csv").write_text(CSV)
    (folder / "._x.csv").write_bytes(b"\x00\x05\x16\x07Mac OS X        ")
    (folder / "__MACOSX" / "._x.csv").write_bytes(b"\x00\x05\x16\x07Mac OS X        ")
    views = _all_views(folder, tmp_path)
    assert set(map(tuple, views.values())) == {("x.csv",)}, views


def test_symlinked_folders_loops_and_broken_links(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "s.csv").write_text(CSV)
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.csv").write_text(CSV)
    (folder / "more").symlink_to(shared, target_is_directory=True)  # followed
    (folder / "sub" / "up").symlink_to("..", target_is_directory=True)  # a loop: skipped
    (folder / "gone.csv").symlink_to(tmp_path / "nowhere.csv")  # broken: skipped
    (folder / "self").symlink_to("self")  # a link to itself: skipped
    os.mkfifo(folder / "pipe.csv")  # not a regular file: skipped
    listing = list_dataset(str(folder))
    assert [f.path for f in listing.files] == ["a.csv", "more/s.csv"]
    reasons = {s.path: s.reason for s in listing.skipped}
    assert reasons["sub/up/"].startswith("symlink loop")
    assert reasons["gone.csv"].startswith("broken symlink to ")
    assert reasons["self"].startswith("unreadable symlink")
    assert reasons["pipe.csv"] == "not a regular file"
    views = _all_views(folder, tmp_path)
    assert set(map(tuple, views.values())) == {("a.csv", "more/s.csv")}, views


def test_a_top_level_manifest_is_heteroflows_own(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "x.csv").write_text(CSV)
    (folder / "sub").mkdir()
    (folder / "sub" / "manifest.json").write_text("{}")  # only the top-level name is reserved
    prewarm_dataset(str(folder), str(tmp_path / "o"), cache_root=str(tmp_path / "t"))
    (folder / "manifest.json").write_text("{}")
    listing = list_dataset(str(folder))
    assert [f.path for f in listing.files] == ["sub/manifest.json", "x.csv"]
    assert [s.path for s in listing.skipped] == ["manifest.json"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served by Python's http.server on 127.0.0.1 (a thread), and its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


def test_http_listing_agrees_with_the_local_one(served: tuple[Path, str], tmp_path: Path):
    root, base = served
    folder = root / "data"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    (folder / ".ipynb_checkpoints" / "x-checkpoint.csv").write_text("garbage\n")
    (folder / "sub").mkdir()
    (folder / "x.csv").write_text(CSV)
    (folder / "sub" / "y.csv").write_text(CSV)
    (folder / "sub" / "up").symlink_to("..", target_is_directory=True)  # the server follows it: a loop over HTTP
    local = list_dataset(str(folder))
    for url in (f"{base}/data/", f"{base}/data"):
        remote = list_dataset(url)
        assert [f.path for f in remote.files] == [f.path for f in local.files] == ["sub/y.csv", "x.csv"]
        assert [f.bytes for f in remote.files] == [f.bytes for f in local.files]
        reasons = {s.path: s.reason for s in remote.skipped}
        assert reasons[".ipynb_checkpoints/"].startswith("hidden")
        assert reasons["sub/up/"].startswith("looks like a symlink loop")
