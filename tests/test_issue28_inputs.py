"""Issue #28, items 1, 5, 6 and 7: each fault's input as a test with the right outcome, plus a sibling of its kind.

1: an image folder's colour mode and size decided from the whole folder; 5: a `.data` table (UCI's suffix) read
or refused naming what reads it; 6: a data set path that is a symlink to its parent, a loop, or a link out of the
data set; 7: a `;` table whose rows end with `;` only after the first data row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.datasets import read_table


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


# ==========================================================================================================
# 7: a trailing `;` after the first data row
# ==========================================================================================================


@pytest.mark.parametrize("delimiter", ["auto", ";"], ids=["sniffed", "given"])
def test_a_trailing_semicolon_after_the_first_data_row_is_read(tmp_path: Path, delimiter: str) -> None:
    # the input: pandas took the field count from the header row (3), so line 3's `3;4;y;` had "4 fields"
    path = _write(tmp_path, "t.csv", "a;b;c\n1;2;x\n3;4;y;\n5;6;x;\n7;8;y\n")
    t = read_table(path, delimiter=delimiter)
    assert t.csv.trailing_delimiter
    assert list(t.frame.columns) == ["a", "b", "c"]
    assert t.frame["a"].tolist() == [1, 3, 5, 7] and t.frame["c"].tolist() == ["x", "y", "x", "y"]


def test_a_trailing_semicolon_beyond_the_sample_is_read_and_said(tmp_path: Path) -> None:
    # the sibling: the only row that ends with `;` lies past the 64 KiB the format is decided from
    rows = [f"{k};{k % 7};{'xy'[k % 2]}" + (";" if k == 6000 else "") for k in range(8000)]
    path = _write(tmp_path, "t.csv", "a;b;label\n" + "\n".join(rows) + "\n")
    assert path.stat().st_size > 1 << 16
    t = read_table(path)
    assert len(t.frame) == 8000 and list(t.frame.columns) == ["a", "b", "label"]
    assert t.csv.trailing_delimiter
    assert t.csv.reasons["delimiter"].endswith(
        "; line 6002 ends with a semicolon (an empty field after the last column, ignored)"
    )


def test_a_real_field_after_the_last_column_beyond_the_sample_is_still_an_error(tmp_path: Path) -> None:
    rows = [f"{k};{k % 7};{'xy'[k % 2]}" + (";z" if k == 6000 else "") for k in range(8000)]
    path = _write(tmp_path, "t.csv", "a;b;label\n" + "\n".join(rows) + "\n")
    with pytest.raises(DatasetError, match=r"line 6002 has a field after the last of the 3 columns \('z'\)"):
        read_table(path)
    rows[6000] += ";"  # two fields more: not a trailing delimiter
    path.write_text("a;b;label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"Expected 3 fields in line 6002, saw 5 \(columns split by semicolon"):
        read_table(path)


# ==========================================================================================================
# 5: a `.data` file (UCI's suffix) is a table: say so, and what reads it
# ==========================================================================================================


def _uci(folder: Path) -> Path:
    rows = [f"{5 + k % 3}.{k % 10},{3 + k % 2}.{k % 7},{1 + k % 4}.0,0.{k % 9},Iris-{'setosa' if k % 2 else 'virginica'}" for k in range(60)]
    _write(folder, "iris.data", "\n".join(rows) + "\n\n")
    _write(folder, "iris.names", "1. Title: Iris Plants Database\n")
    _write(folder, "adult.names", "Adult data, extracted by Barry Becker, from the 1994 census.\n>50K, <=50K.\n")
    return folder


def test_a_uci_data_file_is_named_as_a_table_with_the_rename_that_reads_it(tmp_path: Path) -> None:
    from heteroflow.components.data.preprocess import preprocess

    src = _uci(tmp_path / "iris")
    hint = "iris.data is a table (comma-separated, 5 columns, no header row) by its content: rename it to iris.csv to read it"
    for source in (src, src / "iris.data"):
        with pytest.raises(DatasetError) as info:
            preprocess(source, tmp_path / "out", num_workers=1)
        assert hint in str(info.value)
        assert "names is a" not in str(info.value)  # prose with a comma in its first line is no table
    with pytest.raises(DatasetError, match=re.escape(f"unsupported file type '.data'; {hint}; supported formats")):
        read_table(src / "iris.data")
    (src / "iris.data").rename(src / "iris.csv")  # what the message says reads it
    r = preprocess(src, tmp_path / "out", num_workers=1)
    assert r.report["class_column"] == "column_5" and set(r.classes) == {"Iris-setosa", "Iris-virginica"}


def test_a_tab_separated_txt_file_is_named_as_a_table_too(tmp_path: Path) -> None:
    # the sibling: any suffix no reader claims whose content a reader recognises
    from heteroflow.components.data.datasets import data_files

    path = _write(tmp_path / "d", "measurements.txt", "a\tb\tlabel\n" + "".join(f"{k}\t{k % 3}\t{'xy'[k % 2]}\n" for k in range(30)))
    with pytest.raises(DatasetError) as info:
        data_files([path], where="d")
    assert "measurements.txt is a table (tab-separated, 3 columns, a header row) by its content: rename it to " \
        "measurements.csv to read it" in str(info.value)


# ==========================================================================================================
# 6: a symlink to the data set's parent folder, symlink loops, links out of the data set
# ==========================================================================================================

_CSV = "a,b,label\n" + "".join(f"{k},{k % 3},{'xy'[k % 2]}\n" for k in range(20))


def test_a_symlink_to_the_parent_folder_is_skipped_naming_where_it_leads(tmp_path: Path) -> None:
    # the input: `data/up -> ..` led out of the data set into its parent, whose `data/` (a real folder, reached
    # through the link) closed the loop; `readlink` of it said "Invalid argument" from inside the listing
    from heteroflow.cache.listing import list_dataset
    from heteroflow.components.data.preprocess import preprocess

    box = tmp_path / "box"
    data = box / "data"
    _write(data, "t.csv", _CSV)
    (data / "up").symlink_to("..", target_is_directory=True)
    listing = list_dataset(str(data))
    assert [f.path for f in listing.files] == ["t.csv"]
    reasons = {s.path: s.reason for s in listing.skipped}
    assert reasons == {"up/": f"symlink loop: leads to {box.resolve()}, a folder the data set is inside (..)"}
    r = preprocess(data, tmp_path / "out", num_workers=1)
    assert r.report["rows_used"] == 20
    # the data set path itself a symlink to the folder it is in: that folder, its own link skipped as a loop
    listing = list_dataset(str(data / "up" / "data" / "up"))
    assert [f.path for f in listing.files] == ["data/t.csv"]
    assert {s.path: s.reason for s in listing.skipped} == {"data/up/": "symlink loop: leads back to a folder it is inside (..)"}


def test_a_symlink_loop_as_the_data_set_or_inside_it_is_named_with_its_links(tmp_path: Path) -> None:
    # the sibling: a loop of two links was "a broken symlink (to b)" as the data set, "unreadable" inside it
    from heteroflow.cache.listing import list_dataset

    data = tmp_path / "data"
    _write(data, "t.csv", _CSV)
    (data / "a").symlink_to("b")
    (data / "b").symlink_to("a")
    with pytest.raises(DatasetError, match=re.escape(f"data set {data / 'a'} is a symlink loop (a -> b -> a); point it at")):
        list_dataset(str(data / "a"))
    reasons = {s.path: s.reason for s in list_dataset(str(data)).skipped}
    assert reasons["a"] == "unreadable symlink (Too many levels of symbolic links: a symlink loop, a -> b -> a)"
    assert reasons["b"] == "unreadable symlink (Too many levels of symbolic links: a symlink loop, b -> a -> b)"


def test_a_link_out_of_the_data_set_that_cannot_be_read_is_named_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the sibling: "cannot read folder /elsewhere/private" did not say which link of the data set led there
    import os

    from heteroflow.cache import listing as listing_module

    data, shared = tmp_path / "data", tmp_path / "shared"
    _write(data, "t.csv", _CSV)
    _write(shared / "private", "s.csv", _CSV)
    (data / "more").symlink_to(shared, target_is_directory=True)
    real_scandir = os.scandir

    def scandir(path: os.PathLike[str] | str):  # as for a folder without read permission (tests may run as root)
        if Path(path).name == "private":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(listing_module.os, "scandir", scandir)
    with pytest.raises(DatasetError) as info:
        listing_module.list_dataset(str(data))
    assert str(info.value).startswith(
        f"cannot read folder {data / 'more' / 'private'} (reached through the symlink more -> {shared}) of data set {data}: permission denied"
    )


# ==========================================================================================================
# 1: an image folder's colour mode and size decided from every image, not its first file
# ==========================================================================================================


def _images(root: Path, spec: dict[str, list[tuple[str, tuple[int, int]]]]) -> Path:
    """PNG files: ``{class: [(mode, (width, height)), ...]}``, named 00.png, 01.png, ... in each class folder."""
    pil = pytest.importorskip("PIL.Image")
    for cls, images in spec.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for k, (mode, size) in enumerate(images):
            colour = (40 * k % 255, 90, 200) if mode == "RGB" else 40 * k % 255
            pil.new(mode, size, colour).save(root / cls / f"{k:02d}.png")
    return root


def test_a_colour_folder_whose_first_image_is_greyscale_trains_in_colour_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the input: cat/00.png, the first file read, is greyscale; every other image is RGB: it trained on greyscale
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.data.readers import open_splits

    src = _images(tmp_path / "pets", {"cat": [("L", (8, 8))] + [("RGB", (8, 8))] * 5, "dog": [("RGB", (8, 8))] * 6})
    with caplog.at_level("WARNING", logger="heteroflow.components.data.preprocess"):
        r = preprocess(src, tmp_path / "out", num_workers=1, validation_fraction=0.2, test_fraction=0.2)
    line = (
        "images: colour (RGB) 8x8, what 11 of 12 images are (12 have that size); 1 greyscale (L) (e.g. cat/00.png) "
        "differ; converted when read (mixed_images=convert; mixed_images=error refuses them)"
    )
    assert r.report["sample_shape"] == [3, 8, 8] and r.notices == (line,)
    assert r.report["image_decision"]["other_mode"] == 1 and r.report["image_decision"]["other_size"] == 0
    assert f"preprocess: {line}" in caplog.messages
    splits = open_splits(tmp_path / "out")
    x, _ = splits.train[0]
    assert tuple(x.shape) == (3, 8, 8)  # the greyscale one too, converted
    with pytest.raises(DatasetError) as info:
        preprocess(src, tmp_path / "out2", num_workers=1, validation_fraction=0.2, test_fraction=0.2, mixed_images="error")
    assert "1 greyscale (L) (e.g. cat/00.png) differ; mixed_images=error refuses them" in str(info.value)
    assert not (tmp_path / "out2").exists()


def test_the_image_size_is_the_one_most_images_have_not_the_first_ones(tmp_path: Path) -> None:
    # the sibling: the size came from the first file too (a 64x64 thumbnail first made every image 64x64)
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.errors import InvalidParameter

    src = _images(tmp_path / "pets", {"cat": [("L", (64, 64))] + [("L", (16, 12))] * 5, "dog": [("L", (16, 12))] * 5 + [("L", (20, 20))]})
    r = preprocess(src, tmp_path / "out", num_workers=1, validation_fraction=0.2, test_fraction=0.2)
    assert r.report["sample_shape"] == [1, 12, 16]
    assert r.notices[0].startswith(
        "images: greyscale (L) 16x12, what 12 of 12 images are (10 have that size); 2 of another size "
        "(e.g. cat/00.png: 64x64) differ; converted when read"
    )
    with pytest.raises(DatasetError, match=r"2 of another size \(e\.g\. cat/00\.png: 64x64\) differ; mixed_images=error"):
        preprocess(src, tmp_path / "out2", num_workers=1, validation_fraction=0.2, test_fraction=0.2, mixed_images="error")
    with pytest.raises(InvalidParameter, match="mixed_images='resize' is not valid; valid: convert, error"):
        preprocess(src, tmp_path / "out3", mixed_images="resize")


def test_a_folder_of_one_mode_and_size_says_none_differs(tmp_path: Path) -> None:
    from heteroflow.components.data.preprocess import preprocess

    src = _images(tmp_path / "pets", {"cat": [("RGB", (8, 8))] * 5, "dog": [("RGB", (8, 8))] * 5})
    r = preprocess(src, tmp_path / "out", num_workers=1, validation_fraction=0.2, test_fraction=0.2, mixed_images="error")
    assert r.notices == ("images: colour (RGB) 8x8, what 10 of 10 images are (10 have that size); none differs",)
