"""Inputs that are not what their name says (a new user's trial): a binary file named ``.csv`` is said to be one
(it read as text: "Expected 1 fields in line 3, saw 2 (columns split by comma...)"), and ``predict`` given a
folder of tables says it takes a file (it said "unsupported file type '(no suffix)'")."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.csvformat import sniff_csv
from heteroflow.components.data.datasets import read_table
from heteroflow.pipelines.cli.main import app

# bytes as a binary file holds them: a comma and line ends in the first lines, so that pandas parsed it as a table
BINARY = b"\x8a\x13\xfe\x02\n\x91\x7f\x05\n\x0e,\xc3\x19\n\x00\x00\x00\x07\xff\x10" + bytes(range(256)) * 4
NUL_SAID = "it holds a NUL byte (at byte 14), as binary files do (UTF-16 text without a byte-order mark does too: save it as UTF-8)"


def _said(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def test_the_reported_binary_file_parsed_as_a_table_before(tmp_path: Path) -> None:
    """The input of the report: pandas took it for a one-column table with a comma in line 3."""
    import pandas as pd

    bad = tmp_path / "x.csv"
    bad.write_bytes(BINARY)
    with pytest.raises(pd.errors.ParserError, match="Expected 1 fields in line 3, saw 2"):
        pd.read_csv(bad, encoding="latin-1", engine="c")


@pytest.mark.parametrize(("head", "said"), [
    (BINARY, NUL_SAID),
    (b"PK\x03\x04\x14\x00\x06\x00" + b"x" * 100, "it starts as a zip archive does (an Excel .xlsx workbook is one: save it as CSV)"),
    (b"\x1f\x8b\x08\x00" + b"x" * 100, "it starts as a gzip file does (decompress it first: gunzip)"),
    (b"PAR1" + b"x" * 100, "it starts as a Parquet file does (name it .parquet to read it)"),
])
def test_a_binary_file_named_csv_is_said_to_be_binary_with_its_name(tmp_path: Path, head: bytes, said: str) -> None:
    from heteroflow.components.data.csvformat import not_text

    bad = tmp_path / "x.csv"
    bad.write_bytes(head)
    expected = f"{bad}: not a text table: {said}; a .csv file must be text (a header row, then one sample per row)"
    assert not_text(head) == said
    with pytest.raises(DatasetError) as caught:
        read_table(bad)
    assert str(caught.value) == expected


def test_run_with_a_binary_csv_as_its_data_set_says_it_is_not_text(tmp_path: Path) -> None:
    for dataset in (tmp_path / "x.csv", tmp_path / "folder"):  # the file itself, and inside a folder of tables
        target = dataset if dataset.suffix else dataset / "part-2.csv"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(BINARY)
        if not dataset.suffix:
            (dataset / "part-1.csv").write_text("a,b,label\n1,2,x\n3,4,y\n")
        done = CliRunner().invoke(app, ["run", "--engine", "inprocess", "--dataset", str(dataset), "--output", str(tmp_path / f"run-{dataset.name}")],
                                  env={"COLUMNS": "400"})
        assert done.exit_code == 2, done.output
        assert f"error: {target}: not a text table: {NUL_SAID}; a .csv file must be text" in _said(done.output), done.output
        assert "Expected 1 fields" not in done.output


def test_text_that_only_looks_odd_is_still_read(tmp_path: Path) -> None:
    """No false alarm: UTF-16 with a byte-order mark (NULs in every other byte) and Latin-1 are text."""
    utf16 = tmp_path / "u16.csv"
    utf16.write_bytes(codecs.BOM_UTF16_LE + "a,b,label\n1,2,x\n3,4,y\n".encode("utf-16-le"))
    latin = tmp_path / "latin.csv"
    latin.write_bytes("name,b,label\nJos\xe9,2,x\nRen\xe9e,4,y\n".encode("latin-1"))
    assert sniff_csv(utf16).encoding == "utf-16" and len(read_table(utf16).frame) == 2
    assert sniff_csv(latin).encoding == "latin-1" and list(read_table(latin).frame["name"]) == ["José", "Renée"]


def test_simulate_with_a_binary_trace_or_node_list_names_the_file(tmp_path: Path) -> None:
    """Sibling: the trace and the Alibaba node list said "'utf-8' codec can't decode byte 0x8a in position 0"."""
    bad = tmp_path / "trace.csv"
    bad.write_bytes(BINARY)
    done = CliRunner().invoke(app, ["simulate", "--trace", str(bad)], env={"COLUMNS": "400"})
    assert done.exit_code == 2
    assert f"error: {bad}: not a text trace: {NUL_SAID}; a trace is a CSV (or Gavel's TSV) text file" in _said(done.output), done.output
    done = CliRunner().invoke(app, ["simulate", "--trace", "gavel:4:5:0", "--inventory", str(bad)], env={"COLUMNS": "400"})
    assert done.exit_code == 2
    assert f"error: {bad}: not a text file: {NUL_SAID}; a pod or node list is a CSV text file" in _said(done.output), done.output
    latin = tmp_path / "latin.csv"
    latin.write_bytes("name,arrival_s,job_type,scale_factor,total_steps\nj\xe9,0,ResNet-18,1,100\n".encode("latin-1"))
    done = CliRunner().invoke(app, ["simulate", "--trace", str(latin)], env={"COLUMNS": "400"})
    assert done.exit_code == 2
    assert f"error: {latin}: not UTF-8 text (invalid continuation byte at byte 50); save the trace as UTF-8" in _said(done.output), done.output


# --- predict: a file, not a folder -------------------------------------------------------------------------------


def test_predict_given_a_folder_of_tables_says_it_takes_one_file(digits_model: Path, digits_dir: Path, tmp_path: Path) -> None:
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.components.models.predict import load_archived

    tables = sorted(digits_dir.glob("*.csv"))
    assert len(tables) > 1
    done = CliRunner().invoke(app, ["predict", str(digits_model), str(digits_dir)], env={"COLUMNS": "400"})
    assert done.exit_code == 2, done.output
    assert _said(done.output) == (f"error: {digits_dir} is a folder; give one table file instead, e.g. {tables[0]} "
                                  f"(it holds {len(tables)} table files: predict each in turn)")
    assert "(no suffix)" not in done.output
    # sibling: a folder without tables (the Python API says the same)
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "readme.txt").write_text("no table here\n")
    with pytest.raises(InvalidParameter) as caught:
        load_archived(digits_model).predict(empty)
    assert str(caught.value) == (f"{empty} is a folder, and holds no table file; give one table file (.csv, .tsv, .parquet, "
                                 ".pq, .npz) with the columns the model was trained on")
    # a binary file named .csv, given to predict
    bad = tmp_path / "rows.csv"
    bad.write_bytes(BINARY)
    done = CliRunner().invoke(app, ["predict", str(digits_model), str(bad)], env={"COLUMNS": "400"})
    assert done.exit_code == 2 and f"error: {bad}: not a text table: {NUL_SAID}" in _said(done.output), done.output
    # and one of the folder's files, as the message says, predicts
    done = CliRunner().invoke(app, ["predict", str(digits_model), str(tables[0])], env={"COLUMNS": "400"})
    assert done.exit_code == 0 and done.output.splitlines()[0] == "prediction", done.output


def test_predict_given_a_folder_names_a_table_that_reads_as_its_example(digits_model: Path, tmp_path: Path) -> None:
    """Noticed at a new user's trial: a folder holding a binary ``a.csv`` beside a text ``b.csv`` named ``a.csv``
    as the file to give (which predict then refuses as not text). The example is now one that reads; a folder of
    binary ``.csv`` files only says that none of them is text."""
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "a.csv").write_bytes(BINARY)
    (folder / "b.csv").write_text("x0,x1\n1,2\n")
    done = CliRunner().invoke(app, ["predict", str(digits_model), str(folder)], env={"COLUMNS": "400"})
    assert done.exit_code == 2, done.output
    assert _said(done.output) == (f"error: {folder} is a folder; give one table file instead, e.g. {folder / 'b.csv'} "
                                  "(it holds 2 table files: predict each in turn)")
    (folder / "b.csv").unlink()
    done = CliRunner().invoke(app, ["predict", str(digits_model), str(folder)], env={"COLUMNS": "400"})
    assert done.exit_code == 2, done.output
    assert _said(done.output) == f"error: {folder} is a folder; give one table file instead (it holds one, and it is not text: a.csv: {NUL_SAID})"
