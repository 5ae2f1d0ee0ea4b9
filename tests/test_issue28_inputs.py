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
