"""Issue #28, items 1, 5, 6 and 7: each fault's input as a test with the right outcome, plus a sibling of its kind.

1: an image folder's colour mode and size decided from the whole folder; 5: a `.data` table (UCI's suffix) read
or refused naming what reads it; 6: a data set path that is a symlink to its parent, a loop, or a link out of the
data set; 7: a `;` table whose rows end with `;` only after the first data row.
"""

from __future__ import annotations

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
