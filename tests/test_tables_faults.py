"""Issue #16, "Tables": each fault's input as a test with the right outcome, plus a sibling of the same kind.

3: the class column guessed (never silently, a column named as a class preferred); 4: a `;` export with commas
in its cells and optional trailing `;`; 5: every line one quoted field; 6: a class column missing from one of two
files; 7: a row's features never depend on the rest of its batch; 8: integer parameters checked up front.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.datasets import read_table, sniff_csv
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.data.preprocess import CLASS_COLUMN_NAMES, PreprocessResult, preprocess


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _prep(src: Path, out: Path, **params: Any) -> PreprocessResult:
    return preprocess(src, out, num_workers=1, **params)


def _error(src: Path, out: Path, **params: Any) -> str:
    with pytest.raises(DatasetError) as info:
        _prep(src, out, **params)
    return " ".join(str(info.value).split())


# ==========================================================================================================
# 3: the class column
# ==========================================================================================================


def _mushroom_like(n: int = 400, seed: int = 3) -> str:
    """UCI mushroom's shape: `class` first (e/p), every column text, `habitat` last. odor decides the class
    (as in the real table, where odor alone is 98.5% accurate)."""
    rng = np.random.default_rng(seed)
    cls = rng.choice(["e", "p"], n)
    odor = np.where(cls == "e", rng.choice(["a", "l", "n"], n), rng.choice(["f", "s", "y"], n))
    cap = rng.choice(["x", "b", "s", "f"], n)
    habitat = rng.choice(["g", "l", "m", "p", "u", "w", "d"], n)
    lines = [f"{c},{s},{o},{h}\n" for c, s, o, h in zip(cls, cap, odor, habitat)]
    return "class,cap-shape,odor,habitat\n" + "".join(lines)


def test_a_first_column_named_class_is_the_class_and_the_guess_is_said_before_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "mushroom"
    _write(src, "agaricus-lepiota.csv", _mushroom_like())
    with caplog.at_level(logging.WARNING, logger="heteroflow.components.data.preprocess"):
        r = _prep(src, tmp_path / "out")
    assert r.report["class_column"] == "class"
    assert r.classes == ("e", "p")
    assert r.report["columns_used"] == ["cap-shape", "odor", "habitat"]  # habitat is a feature, class is not
    assert r.report["class_column_reason"] == "the column named 'class'"
    said = [rec.getMessage() for rec in caplog.records if "class column" in rec.getMessage()]
    assert said == ["preprocess: class column: 'class', the column named 'class'; set label_column to choose another"]
    assert r.notices[0] == said[0].removeprefix("preprocess: ")
    # the user's choice still wins, and is not a guess (no notice)
    r = _prep(src, tmp_path / "chosen", label_column="habitat")
    assert r.report["class_column"] == "habitat" and "class" in r.report["columns_used"]
    assert not any(n.startswith("class column") for n in r.notices)


@pytest.mark.parametrize(
    ("header", "expected", "reason"),
    [
        # a class name in any case, anywhere, wins over the last column
        ("sepal,Species,petal", "Species", "the column named 'Species'"),
        ("f1,target,f2", "target", "the column named 'target'"),
        # two class names: the one listed first in CLASS_COLUMN_NAMES, and the reason names the other
        ("target,f1,label", "label", "the column named 'label', preferred to 'target'"),
    ],
    ids=["species-any-case", "target-in-the-middle", "label-before-target"],
)
def test_a_column_named_as_a_class_wins_over_the_last_column(tmp_path: Path, header: str, expected: str, reason: str) -> None:
    rng = np.random.default_rng(5)
    names = header.split(",")
    rows = []
    for _ in range(120):
        y = int(rng.integers(0, 2))
        rows.append(",".join(str(y) if c == expected else f"{rng.normal() + 2 * y:.3f}" for c in names))
    src = tmp_path / "t"
    _write(src, "t.csv", header + "\n" + "\n".join(rows) + "\n")
    r = _prep(src, tmp_path / "out")
    assert r.report["class_column"] == expected
    assert r.report["class_column_reason"] == reason
    assert r.classes == ("0", "1")
    assert r.notices[0].startswith(f"class column: {expected!r}, {reason}")


def test_the_last_column_taken_as_the_class_names_a_column_named_like_one(tmp_path: Path) -> None:
    # no column is named as a class; `income_class` holds the word: the guess (the last column) says so
    rng = np.random.default_rng(6)
    lines = [f"{rng.integers(20, 60)},{'hi' if k % 2 else 'lo'},{k % 3}\n" for k in range(150)]
    src = tmp_path / "t"
    _write(src, "t.csv", "age,income_class,region\n" + "".join(lines))
    r = _prep(src, tmp_path / "out")
    assert r.report["class_column"] == "region"
    reason = r.report["class_column_reason"]
    assert reason.startswith("the last column, as none is named as a class (label, class, target, y, species, ...)")
    assert reason.endswith("'income_class' is named like one: label_column=income_class?")
    assert r.notices[0] == f"class column: 'region', {reason}"


def test_the_class_names_are_documented_in_the_parameter_help() -> None:
    import inspect

    doc = inspect.getdoc(preprocess) or ""
    line = next(x for x in doc.splitlines() if x.strip().startswith("label_column:"))
    for name in CLASS_COLUMN_NAMES[:7]:
        assert name in line


# ==========================================================================================================
# 6: files that disagree on their columns
# ==========================================================================================================


def _rows(n: int, seed: int, label: bool, columns: int = 4) -> str:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        y = int(rng.integers(0, 2))
        cells = [f"{rng.normal() + y:.3f}" for _ in range(columns)]
        out.append(",".join(cells + ([str(y)] if label else [])))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("without", ["b.csv", "a.csv"], ids=["second-file-lacks-it", "first-file-lacks-it"])
def test_a_class_column_missing_from_one_file_is_named(tmp_path: Path, without: str) -> None:
    src = tmp_path / "two"
    for name in ("a.csv", "b.csv"):
        has = name != without
        _write(src, name, ("x1,x2,x3,x4,label\n" if has else "x1,x2,x3,x4\n") + _rows(60, len(name), has))
    other = "a.csv" if without == "b.csv" else "b.csv"
    message = _error(src, tmp_path / "out")
    assert f"{without} has no column 'label', the class column of " in message
    assert f"{other} (the column named 'label')" in message
    assert "features but" not in message


def test_a_feature_column_missing_from_one_file_is_named(tmp_path: Path) -> None:
    src = tmp_path / "two"
    _write(src, "a.csv", "x1,x2,x3,label\n" + _rows(60, 1, True, columns=3))
    _write(src, "b.csv", "x1,x2,x9,label\n" + _rows(60, 2, True, columns=3))
    message = _error(src, tmp_path / "out")
    assert "b.csv lacks column(s) 'x3', which a.csv has; it has column(s) 'x9', which a.csv lacks" in message
    _write(src, "b.csv", "x1,x2,x3,x4,label\n" + _rows(60, 2, True, columns=4))
    message = _error(src, tmp_path / "out")
    assert "b.csv has 4 features but " in message and "a.csv has 3: b.csv has column(s) 'x4', which a.csv lacks" in message
    assert "(class column 'label': the column named 'label')" in message


def test_files_with_the_same_columns_in_another_order_keep_each_column_its_kind(tmp_path: Path) -> None:
    # the check of each column's kind pairs columns by name (it paired them by position)
    src = tmp_path / "two"
    _write(src, "a.csv", "n,t,label\n" + "".join(f"{k},{'ab'[k % 2]},{k % 2}\n" for k in range(40)))
    _write(src, "b.csv", "t,n,label\n" + "".join(f"{'ab'[k % 2]},{k},{k % 2}\n" for k in range(40)))
    r = _prep(src, tmp_path / "out", keep_columns="n")
    assert r.report["columns_numeric"] == ["n"] and r.report["columns_text"] == ["t"]
    assert r.report["rows_used"] == 80


# ==========================================================================================================
# 8: integer parameters checked up front
# ==========================================================================================================


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(seed=-5), r"^seed=-5 is out of range; valid: an integer from 0 to 4294967295$"),
        (dict(seed=2**40), r"^seed=1099511627776 is out of range"),
        (dict(seed=1.5), r"^seed=1\.5 is not an integer"),
        (dict(shard_size=2.5), r"^shard_size=2\.5 is not an integer; valid: 0 \(about 16 MiB per shard\) or more$"),
        (dict(max_categories=True), r"^max_categories=True is not an integer; valid: an integer >= 2$"),
    ],
    ids=["seed-negative", "seed-too-big", "seed-fraction", "shard-size-fraction", "max-categories-bool"],
)
def test_integer_parameters_of_preprocess_are_checked_before_reading(tmp_path: Path, kwargs: dict, pattern: str) -> None:
    from heteroflow.components.data.preprocess import PREPROCESS, check_preprocess_params

    with pytest.raises(InvalidParameter, match=pattern):
        check_preprocess_params(**kwargs)
    with pytest.raises(InvalidParameter, match=pattern):
        PREPROCESS.check_params(kwargs)  # what the engines call before running any step
    with pytest.raises(InvalidParameter, match=pattern):
        preprocess(tmp_path / "nowhere", tmp_path / "out", **kwargs)


def test_train_checks_its_seed_too() -> None:
    # the sibling: train seeds numpy's default_rng with seed + epoch, which refuses a negative seed mid-run
    from heteroflow.components.training.step import TRAIN, check_train_params

    with pytest.raises(InvalidParameter, match=r"^seed=-5 is out of range; valid: an integer from 0 to 4294967295$"):
        check_train_params(seed=-5)
    with pytest.raises(InvalidParameter, match=r"^seed=-5 is out of range"):
        TRAIN.check_params({"seed": -5})
    check_train_params(seed=0)
    check_train_params(seed=2**32 - 1)


def test_the_cli_refuses_a_negative_seed_before_any_step_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--param", "seed=-5", "--output", str(tmp_path / "run")])
    message = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "seed=-5 is out of range; valid: an integer from 0 to 4294967295" in message
    assert "expected non-negative integer" not in message
    assert not (tmp_path / "run" / "steps").exists()  # nothing ran: no prewarm


# ==========================================================================================================
# 4: a `;` export with commas in its date cells and an optional trailing `;`
# ==========================================================================================================

_MONTHS = ("January", "February", "March", "April", "May", "June")


def _export(n: int = 100, seed: int = 4, trailing_header: bool = False) -> tuple[str, str]:
    """(header line, body): `April 15, 2023;7.41;51;up` rows, every third ending with `;`."""
    rng = np.random.default_rng(seed)
    lines = []
    for k in range(n):
        y = k % 2
        row = f"{_MONTHS[k % 6]} {k % 28 + 1}, 2023;{rng.normal() + 2 * y:.2f};{rng.integers(1, 100)};{'up' if y else 'down'}"
        lines.append(row + (";" if k % 3 == 0 else ""))
    return "date;open;volume;label" + (";" if trailing_header else "") + "\n", "\n".join(lines) + "\n"


def test_a_semicolon_export_with_commas_in_dates_and_trailing_semicolons_without_a_header(tmp_path: Path) -> None:
    _, body = _export()
    path = _write(tmp_path, "export.csv", body)
    t = read_table(path)
    assert t.csv.delimiter == ";" and t.csv.trailing_delimiter
    assert not t.csv.header  # the first data row is data, not a header
    assert list(t.frame.columns) == ["column_1", "column_2", "column_3", "column_4"]
    assert len(t.frame) == 100
    assert t.frame["column_1"].iloc[0] == "January 1, 2023"
    assert t.kinds == {"column_1": "text", "column_2": "number", "column_3": "number", "column_4": "text"}
    reason = t.csv.reasons["delimiter"]
    assert reason.startswith("semicolon: 4 columns on 100% of the first 100 rows")
    assert reason.endswith("rows may end with a semicolon (an empty field after the last column, ignored)")
    assert t.describe()["trailing_delimiter"] is True


@pytest.mark.parametrize("trailing_header", [False, True], ids=["header", "header-ending-with-semicolon"])
@pytest.mark.parametrize("delimiter", ["auto", ";"], ids=["sniffed", "given"])
def test_a_semicolon_export_with_a_header_is_read_and_trains(tmp_path: Path, trailing_header: bool, delimiter: str) -> None:
    # the sibling: with delimiter=; (and any header one field shorter than a row) pandas took the first column
    # for the index, shifting every column left: `label` came out empty
    head, body = _export(trailing_header=trailing_header)
    src = tmp_path / "src"
    path = _write(src, "export.csv", head + body)
    t = read_table(path, delimiter=delimiter)
    assert list(t.frame.columns) == ["date", "open", "volume", "label"]
    assert t.frame.index.tolist() == list(range(100))
    assert t.frame["label"].notna().all() and t.frame["date"].iloc[3] == "April 4, 2023"
    r = _prep(src, tmp_path / "out", delimiter=delimiter, drop_columns="date")
    assert r.report["class_column"] == "label" and r.classes == ("down", "up")
    assert r.report["rows_used"] == 100 and r.report["columns_used"] == ["open", "volume"]


def test_a_field_after_the_last_column_is_an_error_not_dropped(tmp_path: Path) -> None:
    head, body = _export()
    lines = body.splitlines()
    lines[50] = lines[50] + ";surprise"  # one row, beyond the sample's view of the format: a real extra field
    path = _write(tmp_path, "export.csv", head + "\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"line 52 has a field after the last of the 4 columns \('surprise'\)"):
        read_table(path)


def test_a_header_one_name_short_is_an_error_not_a_shifted_table(tmp_path: Path) -> None:
    # every row has a value under a column the header does not name: pandas made the first column the index
    body = "".join(f"{k % 5},{k % 3},{k % 2},{k}\n" for k in range(40))
    path = _write(tmp_path, "short-header.csv", "a,b,label\n" + body)
    with pytest.raises(DatasetError, match=r"the header row names 3 column\(s\) but the rows below have more fields"):
        read_table(path)


# ==========================================================================================================
# 5: every line one quoted field
# ==========================================================================================================


def _quoted_wine(n: int = 60) -> str:
    """winequality-red.csv saved once more as a one-column table: each line quoted, its quotes doubled."""
    lines = ['"fixed acidity";"volatile acidity";"citric acid";"quality"']
    lines += [f"{7 + k % 5 / 10:.1f};{0.7 - k % 3 / 10:.1f};{k % 4 / 10:.1f};{5 + k % 2}" for k in range(n)]
    return "".join('"' + line.replace('"', '""') + '"\n' for line in lines)


@pytest.mark.parametrize("delimiter", ["auto", ";"], ids=["sniffed", "given"])
def test_every_line_one_quoted_field_says_so_and_what_reads_it(tmp_path: Path, delimiter: str) -> None:
    path = _write(tmp_path, "winequality-red.csv", _quoted_wine())
    assert path.read_text().startswith('"""fixed acidity"";""volatile acidity"";')
    with pytest.raises(DatasetError) as info:
        read_table(path, delimiter=delimiter)
    message = str(info.value)
    assert "found 1 column: every line is one quoted field (line 1: '\"\"\"fixed acidity\"\";" in message
    assert "inside the quotes, semicolon splits the lines into 4 columns" in message
    assert "Remove the outer quotes to read it: python -c " in message
    assert message.endswith(" winequality-red.csv > unquoted.csv")
    with pytest.raises(DatasetError, match="every line is one quoted field"):
        sniff_csv(path, delimiter=delimiter)  # said from the first 64 KiB, before the whole file is parsed


@pytest.mark.slow
def test_the_command_the_message_gives_reads_the_quoted_file(tmp_path: Path) -> None:
    import shlex
    import subprocess
    import sys

    path = _write(tmp_path, "winequality-red.csv", _quoted_wine())
    with pytest.raises(DatasetError) as info:
        read_table(path)
    command = str(info.value).split("Remove the outer quotes to read it: ", 1)[1]
    argv = shlex.split(command.split(" > ", 1)[0])
    assert argv[0] == "python"
    out = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    fixed = _write(tmp_path, "unquoted.csv", out)
    t = read_table(fixed)
    assert list(t.frame.columns) == ["fixed acidity", "volatile acidity", "citric acid", "quality"]
    assert len(t.frame) == 60 and t.kinds["quality"] == "number"


def test_a_wrong_delimiter_given_names_the_one_that_reads_the_file(tmp_path: Path) -> None:
    # the sibling: delimiter=, on a `;` file said only "found 1 column (delimiter=',')"
    path = _write(tmp_path, "semi.csv", "a;b;label\n" + "".join(f"{k};{k % 3};{k % 2}\n" for k in range(30)))
    with pytest.raises(DatasetError) as info:
        read_table(path, delimiter=",")
    message = str(info.value)
    assert "found 1 column (delimiter=',' splits no sampled line, line 1: 'a;b;label')" in message
    assert message.endswith("semicolon splits the lines into 3 columns: set delimiter=;")


def test_a_header_without_the_rows_delimiter_says_what_the_header_lacks(tmp_path: Path) -> None:
    # the old message contradicted itself: "found 1 column (comma: 2 columns on 100% ...)"
    path = _write(tmp_path, "h.csv", "a b\n" + "".join(f"{k},{k % 2}\n" for k in range(30)))
    with pytest.raises(DatasetError) as info:
        read_table(path, header="true")
    message = str(info.value)
    assert "the header row names 1 column(s) but the rows below have more fields (columns split by comma)" in message


# ==========================================================================================================
# 7: a row's features never depend on the rest of its batch
# ==========================================================================================================


def _rooms_table(folder: Path, n: int = 300, seed: int = 0) -> Path:
    """A text column `room` holding A1, 101, 102 (and a few empty cells); the class is room == 101."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rooms = rng.choice(["A1", "101", "102", ""], n, p=[0.55, 0.2, 0.2, 0.05])
    flag = rng.choice(["true", "false"], n)
    frame = pd.DataFrame({"x": rng.normal(size=n).round(3), "room": rooms, "flag": flag, "label": (rooms == "101").astype(int)})
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "rooms.csv", index=False)
    return folder


@pytest.fixture(scope="module")
def rooms_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from heteroflow.components.training.step import train

    root = tmp_path_factory.mktemp("rooms")
    r = preprocess(_rooms_table(root / "src"), root / "shards", num_workers=1, missing="impute")
    return train(r.output_dir, root / "model", epochs=20, checkpoint_root=root / "ckpt").model_dir


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_room_101_is_predicted_the_same_whatever_else_is_in_the_batch(rooms_model: Path) -> None:
    import pandas as pd

    from heteroflow.components.models.predict import load_archived

    model = load_archived(rooms_model)
    assert model.schema["columns"][1] == {"name": "room", "kind": "text", "categories": ["101", "102", "A1"]}
    alone = model.predict_proba(pd.DataFrame({"x": [0.1], "room": [101], "flag": ["true"]}))[0]
    assert alone[1] > 0.9  # room 101 is class 1
    # another row with an empty room: pandas makes the column float (101.0)
    # (features are compared exactly; probabilities to float32 rounding, as a batch of 2 multiplies differently)
    features = model.features(pd.DataFrame({"x": [0.1], "room": [101], "flag": ["true"]}))[0]
    with_gap = pd.DataFrame({"x": [0.1, 0.2], "room": [101, None], "flag": ["true", "false"]})
    np.testing.assert_array_equal(model.features(with_gap)[0], features)
    np.testing.assert_allclose(model.predict_proba(with_gap)[0], alone, rtol=0, atol=1e-6)
    as_dicts = [{"x": 0.1, "room": 101, "flag": "true"}, {"x": 0.2, "flag": "false"}]
    np.testing.assert_array_equal(model.features(as_dicts)[0], features)
    for cell in ("101", " 101 ", 101.0, np.int64(101), np.float32(101)):
        got = model.features(pd.DataFrame({"x": [0.1], "room": [cell], "flag": ["true"]}))[0]
        np.testing.assert_array_equal(got, features, err_msg=repr(cell))


def _features(model_dir: Path, rows: Any) -> np.ndarray:
    from heteroflow.components.data.tabular import load_transform, prepare_rows

    transform, schema = load_transform(model_dir)
    return np.asarray(transform.transform(prepare_rows(rows, schema)), dtype=np.float32)


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_a_true_false_cell_keeps_its_features_beside_a_value_never_seen(rooms_model: Path) -> None:
    # the sibling: "true" became "True" (the trained value) only when every cell of the batch was true/false
    import pandas as pd

    alone = _features(rooms_model, pd.DataFrame({"x": [0.1], "room": ["A1"], "flag": ["true"]}))[0]
    beside = _features(rooms_model, pd.DataFrame({"x": [0.1, 0.2], "room": ["A1", "A1"], "flag": ["true", "maybe"]}))
    np.testing.assert_array_equal(beside[0], alone)
    names = __import__("json").loads((rooms_model / "transform.json").read_text())["features"]
    assert alone[names.index("flag=True")] == 1.0
    assert beside[1][names.index("flag=True")] == 0 and beside[1][names.index("flag=False")] == 0  # never seen
    for cell in ("TRUE", True, np.bool_(True)):
        got = _features(rooms_model, pd.DataFrame({"x": [0.1], "room": ["A1"], "flag": [cell]}))[0]
        np.testing.assert_array_equal(got, alone, err_msg=repr(cell))


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_a_file_whose_room_cells_are_all_numbers_reads_them_as_the_trained_text(rooms_model: Path, tmp_path: Path) -> None:
    # the sibling in files: read_table turns a column of numbers into floats; one file with an A1 kept it text
    from heteroflow.components.models.predict import load_archived

    model = load_archived(rooms_model)
    only_numbers = _write(tmp_path, "a.csv", "x,room,flag\n0.1,101,true\n0.2,,false\n")  # floats: 101.0, NaN
    mixed = _write(tmp_path, "b.csv", "x,room,flag\n0.1,101,true\n0.2,A1,false\n")
    np.testing.assert_array_equal(model.features(only_numbers)[0], model.features(mixed)[0])
    assert model.predict(only_numbers)[0] == 1


def test_a_number_column_given_as_text_or_beside_a_gap_keeps_each_row(rooms_model: Path) -> None:
    import pandas as pd

    alone = _features(rooms_model, pd.DataFrame({"x": [0.25], "room": ["A1"], "flag": ["true"]}))[0]
    for x in (["0.25", None], ["0.25", "?"], [" 0.25", 1], [np.float32(0.25), np.nan]):
        got = _features(rooms_model, pd.DataFrame({"x": x, "room": ["A1", "101"], "flag": ["true", "false"]}))[0]
        np.testing.assert_allclose(got, alone, rtol=0, atol=1e-6, err_msg=repr(x))


def test_text_cells_match_a_trained_value_by_meaning_only_when_one_fits() -> None:
    from heteroflow.components.data.tabular import text_cells

    got = text_cells([101.0, "1.50", "7", None, "NA", "x"], ["101", "1.5", "07", "7.0", "x"]).tolist()
    # "7" stays "7": two trained values ("07" and "7.0") have its value, so neither is chosen
    assert got[:3] == ["101", "1.5", "7"] and got[5] == "x"
    assert got[3] != got[3] and got[4] != got[4]  # missing (NaN)
    assert text_cells(["3,5"], ["3,50", "x"], decimal=",").tolist() == ["3,50"]


# ==========================================================================================================
# 22: the vectorised one-hot transform gives scikit-learn's output, value for value
# ==========================================================================================================


def test_one_hot_codes_transforms_exactly_as_scikit_learns_encoder() -> None:
    from sklearn.preprocessing import OneHotEncoder

    from heteroflow.components.data.tabular import OneHotCodes

    rng = np.random.default_rng(7)
    train = np.stack([rng.integers(0, 5, 500), rng.choice([0, 2, 9], 500), rng.integers(0, 1, 500)], axis=1)
    codes = np.stack([rng.integers(-2, 7, 300), rng.integers(-2, 11, 300), rng.integers(-2, 2, 300)], axis=1)  # unseen too
    ours = OneHotCodes(handle_unknown="ignore", sparse_output=False, dtype=np.float32).fit(train)
    theirs = OneHotEncoder(handle_unknown="ignore", sparse_output=False, dtype=np.float32).fit(train)
    got, want = ours.transform(codes), theirs.transform(codes)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape == (300, 5 + 3 + 1)
    np.testing.assert_array_equal(got, want)
    assert got.sum() < 300 * 3  # some codes were never seen: rows with zeros in that column's block
    # float codes (after the imputer) go to scikit-learn's own transform
    np.testing.assert_array_equal(ours.transform(codes.astype(np.float64)), want)


def test_a_column_text_in_one_file_and_numbers_in_another_is_text_in_both(tmp_path: Path) -> None:
    # the sibling at training: a file whose rooms are all numbers (one with a gap: floats) was an error
    # ("holds text values in a.csv but number values in b.csv"); its cells are now the text they were
    src = tmp_path / "two"
    rng = np.random.default_rng(9)
    a = "".join(f"{rng.normal():.2f},{r},{int(r == '101')}\n" for r in rng.choice(["A1", "101", "102"], 120, p=[0.8, 0.1, 0.1]))
    b = "".join(f"{rng.normal():.2f},{r},{int(r == '101')}\n" for r in rng.choice(["101", "102", ""], 40, p=[0.45, 0.45, 0.1]))
    _write(src, "a.csv", "x,room,label\n" + a)
    _write(src, "b.csv", "x,room,label\n" + b)
    assert read_table(src / "b.csv").kinds["room"] == "number"
    r = _prep(src, tmp_path / "out", missing="impute")
    assert r.report["columns_text"] == ["room"]
    assert r.report["columns_encoded"] == {"room": 3}  # A1, 101, 102: never "101.0"
    # issue #28 item 4's sibling: a decision on the user's cells is said, not silent
    assert "column 'room' read as text in every file: it holds numbers in b.csv, text in a.csv" in r.notices
    assert any(n.startswith("missing cells in 1 column(s) imputed (missing=impute): 'room' ", n.index(" ") + 1) for n in r.notices)
    import json

    schema = json.loads((r.output_dir / "transform.json").read_text())
    assert schema["columns"][1]["categories"] == ["101", "102", "A1"]


@pytest.mark.parametrize("gap", [False, True])
def test_a_class_column_numbers_in_one_file_and_text_in_another_is_one_class_per_value(tmp_path: Path, gap: bool) -> None:
    """A review's input: labels 0/1 in a.csv, 0/1/other in b.csv trained five classes ('0', '0', '1', '1', 'other'):
    the class column became text but its numbers stayed numbers, and 0 and '0' factorized apart. With a gap in
    a.csv (missing=drop: its labels read as floats) the classes were '0', '0.0', '1', '1.0', 'other'."""
    src = tmp_path / "two"
    _write(src, "a.csv", "f,g,label\n" + "".join(f"{i},{i * 2 % 7},{'' if gap and i == 3 else i % 2}\n" for i in range(40)))
    _write(src, "b.csv", "f,g,label\n" + "".join(f"{i},{i * 3 % 7},{['0', '1', 'other'][i % 3]}\n" for i in range(40)))
    r = _prep(src, tmp_path / "out", missing="drop")
    assert r.classes == ("0", "1", "other")


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int8", "int16", "uint64"])
def test_a_small_integer_parquet_column_is_not_taken_for_a_row_id(tmp_path: Path, dtype: str) -> None:
    """A review's input: a uint8 pixel column of a Parquet file was dropped as 'whole numbers that increase with the
    row order' (np.diff of unsigned values wraps a step down to a large step up); the same column as int64 or CSV was
    kept. Sibling: int8/int16 steps overflow alike."""
    import pandas as pd

    src = tmp_path / "pq"
    src.mkdir()
    n = 60
    pd.DataFrame({"pixel": np.array([(i * 7) % 11 for i in range(n)], dtype=dtype),
                  "b": np.linspace(0, 1, n), "label": [i % 2 for i in range(n)]}).to_parquet(src / "t.parquet")
    r = _prep(src, tmp_path / "out")
    assert "pixel" not in r.report.get("columns_dropped", {}) and r.num_features == 2
    # a real row id of the same small type is still left out
    pd.DataFrame({"row": np.arange(n, dtype=dtype), "b": np.linspace(0, 1, n), "label": [i % 2 for i in range(n)]}).to_parquet(src / "t.parquet")
    assert "row" in _prep(src, tmp_path / "out2").report["columns_dropped"]


@pytest.mark.parametrize("cells", [[["a", "b"], ["c"]], [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}]], ids=["list", "struct"])
def test_a_nested_parquet_column_is_named_with_the_way_out(tmp_path: Path, cells: list) -> None:
    """A review's input: a Parquet list column failed preprocess with a bare ``TypeError: unhashable type:
    'numpy.ndarray'`` (pandas' factorize), naming no column; a struct column is its sibling."""
    import pandas as pd

    src = tmp_path / "nested"
    src.mkdir()
    pd.DataFrame({"tags": cells * 15, "b": np.linspace(0, 1, 30), "label": [i % 2 for i in range(30)]}).to_parquet(src / "t.parquet")
    message = _error(src, tmp_path / "out")
    assert "column 'tags' holds object values, which are neither numbers nor text; drop_columns=tags" in message
    assert _prep(src, tmp_path / "out", drop_columns="tags").num_features == 1  # the way out the message gives


@pytest.mark.parametrize(("header", "trailing"), [("a,a,label", ""), ("a,a ,label", ""), ("a,a,label,", ","), ("x,a,b,a,label", "")])
def test_a_header_naming_a_column_twice_is_an_error_however_it_is_spaced(tmp_path: Path, header: str, trailing: str) -> None:
    """A review's input: 'a,a,label' trained on 'a' and 'a.1' (pandas renames a repeated name), while 'a,a ,label'
    and 'a,a,label,' were refused; now all three say it."""
    cells = header.count(",") + 1 - bool(trailing)
    rows = "".join(",".join(str((i * (j + 2)) % 7) for j in range(cells - 1)) + f",{i % 2}{trailing}\n" for i in range(30))
    src = tmp_path / "dup"
    _write(src, "t.csv", header + "\n" + rows)
    assert "the header names column 'a' twice; give each column its own name" in _error(src, tmp_path / "out")


def test_a_column_named_like_a_renamed_duplicate_is_kept(tmp_path: Path) -> None:
    src = tmp_path / "named"
    _write(src, "t.csv", "a,a.1,label\n" + "".join(f"{i % 5},{i % 3},{i % 2}\n" for i in range(30)))
    assert _prep(src, tmp_path / "out").num_features == 2


@pytest.mark.parametrize("cell", ["0x{i}F", "{i}", "Nan"], ids=["hex", "plain", "nan-spelling"])
def test_a_column_has_one_kind_whichever_reader_reads_the_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cell: str) -> None:
    """A review's input: pyarrow's fast reader took 0x1F cells (and NaN spelled nAn, +nan) for numbers, pandas and
    the archived model's row check for text; training then made a number column the model refused at prediction."""
    from heteroflow.components.data import arrowcsv

    rows = "".join(f"{cell.format(i=i % 5)},{i * 0.5},{i % 2}\n" for i in range(60))
    src = tmp_path / "t"
    path = _write(src, "t.csv", "code,b,label\n" + rows)
    fast = read_table(path).kinds["code"]
    monkeypatch.setattr(arrowcsv, "ENABLED", False)
    assert read_table(path).kinds["code"] == fast == ("number" if cell == "{i}" else "text")
