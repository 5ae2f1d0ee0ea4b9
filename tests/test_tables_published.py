"""Issue #28 items 3 and 4: published tables as a new user has them (``tests/data``, sources in its README).

3: every column problem in the first message (the class column's and the features'); a guessed class column is
never silent about a column whose name or values make a better class, and is said in one line before any work,
listing the columns left out as row ids and those named like sample weights. 4: ``missing=impute`` says which
columns it filled and how many cells.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.preprocess import PREPROCESS, PreprocessResult, preprocess

DATA = Path(__file__).with_name("data")
LOGGER = "heteroflow.components.data.preprocess"
GUESS = "the last column, as none is named as a class (label, class, target, y, species, ...); set label_column to choose another"


def _copy(name: str, folder: Path, rename: tuple[str, str] | None = None) -> Path:
    folder.mkdir(parents=True)
    text = (DATA / name).read_text(encoding="utf-8")
    (folder / name).write_text(text.replace(*rename, 1) if rename else text, encoding="utf-8")
    return folder


def _prep(src: Path, out: Path, **params: Any) -> PreprocessResult:
    return preprocess(src, out, num_workers=1, **params)


def _error(src: Path, out: Path, **params: Any) -> str:
    with pytest.raises(DatasetError) as info:
        _prep(src, out, **params)
    return str(info.value)


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().removeprefix("preprocess: ") for r in caplog.records if r.name == LOGGER]


def _console(result: PreprocessResult) -> list[str]:
    """The lines the CLI prints for the step (its summary of the step's facts)."""
    return PREPROCESS.summary(PREPROCESS.facts(result))


# --- 3: Titanic as published -------------------------------------------------------------------------------


def test_titanic_as_published_names_every_column_problem_and_the_better_class_in_the_first_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _copy("titanic.csv", tmp_path / "titanic")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message = _error(src, tmp_path / "out")
    problems = message.split("\n- ")[1:]
    # the class column's problem and every feature's, in one message
    assert len(problems) == 3, message
    assert problems[0].startswith(f"class column 'Embarked' ({GUESS}; 'Survived' is named like one: label_column=Survived?) has 2 missing values, at titanic.csv line 42, line 43")
    assert problems[1].startswith("column 'Ticket' is mostly numbers (32 of 42 values) but holds text") and "drop_columns=Ticket" in problems[1]
    assert problems[2].startswith("missing values in 2 column(s): 'Age': 9 (at titanic.csv line 7,") and "'Cabin': 31 (at" in problems[2]
    # the guess was said in one line before the error, with the columns left out as row ids
    assert _said(caplog) == [
        f"class column: 'Embarked', {GUESS}; 'Survived' is named like one: label_column=Survived?; "
        "left out as row ids: 'PassengerId', 'Name'"
    ]


def test_titanic_following_only_missing_drop_still_names_survived_as_the_better_class(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _copy("titanic.csv", tmp_path / "titanic")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message = _error(src, tmp_path / "out", missing="drop")
    assert f"(class column 'Embarked': {GUESS}; 'Survived' is named like one: label_column=Survived?)" in message
    assert "column 'Ticket' is mostly numbers" in message
    assert "label_column=Survived?" in _said(caplog)[0]
    # the advice followed: Survived is the class, Embarked a feature
    r = _prep(src, tmp_path / "ok", label_column="Survived", drop_columns="Ticket,Cabin", missing="drop")
    assert r.report["class_column"] == "Survived" and "Embarked" in r.report["columns_used"]
    assert r.classes == ("0", "1")


def test_a_class_problem_given_by_label_column_comes_with_the_features_problems(tmp_path: Path) -> None:
    # sibling: a continuous class column (Fare) was raised alone, before any feature was looked at
    src = _copy("titanic.csv", tmp_path / "titanic")
    problems = _error(src, tmp_path / "out", label_column="Fare").split("\n- ")[1:]
    assert [p.split(" ", 2)[1] for p in problems] == ["column", "'Ticket'", "values"]
    assert problems[0].startswith("class column 'Fare' (label_column=Fare) looks continuous: 35 distinct values in 42 rows")
    assert "'Embarked': 2 (at titanic.csv line 42, line 43)" in problems[2]


# --- 3: Penguins and Adult as published --------------------------------------------------------------------


def test_penguins_as_published_take_species_not_year_and_say_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = _copy("penguins.csv", tmp_path / "penguins")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        r = _prep(src, tmp_path / "out", missing="drop")
    assert r.report["class_column"] == "species"
    assert r.classes == ("Adelie", "Chinstrap", "Gentoo")
    assert "year" in r.report["columns_used"]
    assert _said(caplog)[0] == "class column: 'species', the column named 'species'; set label_column to choose another"


def test_a_last_column_of_years_names_the_columns_whose_values_make_a_class(tmp_path: Path) -> None:
    # sibling: the same table with its class column not named as one: the last column (year) is no class
    src = _copy("penguins.csv", tmp_path / "penguins", rename=("species", "penguin"))
    message = _error(src, tmp_path / "out", missing="drop")  # 3 rows of 2009: too few for a split
    assert (
        f"(class column 'year': {GUESS}; its values look like years (2007..2009), not classes; columns whose values "
        "look like classes: 'penguin' (3 values), 'island' (3 values): label_column=penguin?)"
    ) in message
    r = _prep(src, tmp_path / "ok", missing="drop", label_column="penguin")
    assert r.classes == ("Adelie", "Chinstrap", "Gentoo")


def test_adult_as_published_lists_fnlwgt_as_a_weight_in_the_class_column_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _copy("adult.csv", tmp_path / "adult")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        r = _prep(src, tmp_path / "out", missing="drop")
    assert r.report["class_column"] == "income" and r.classes == ("<=50K", ">50K")
    weight = "'fnlwgt' looks like a sample weight, used as a feature: drop_columns=fnlwgt to leave it out"
    assert _said(caplog)[0] == f"class column: 'income', {GUESS}; {weight}"
    assert r.notices[0] == _said(caplog)[0]
    assert f"  notice: {weight}" in _console(r)
    # a class column given: no guess to say, the weight is still said
    r = _prep(src, tmp_path / "given", missing="drop", label_column="income", drop_columns="")
    assert weight in r.notices
    r = _prep(src, tmp_path / "dropped", missing="drop", drop_columns="fnlwgt")
    assert not any("weight" in n for n in r.notices)


# --- 4: missing=impute says what it filled ----------------------------------------------------------------


def test_missing_impute_on_adult_says_which_columns_and_how_many_cells(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _copy("adult.csv", tmp_path / "adult")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        r = _prep(src, tmp_path / "out", missing="impute")
    line = (
        "4 missing cells in 3 column(s) imputed (missing=impute): 'workclass' 1 (the most frequent value, 'Private'), "
        "'occupation' 1 (the most frequent value, 'Exec-managerial'), 'native-country' 2 (the most frequent value, "
        "'United-States'); each such column also gets a 0/1 'missing' indicator where the train split has a gap"
    )
    assert line in _said(caplog)
    assert f"  notice: {line}" in _console(r)
    assert r.report["notices"] == list(r.notices) and line in r.notices
    assert r.report["rows_used"] == 40


def test_missing_impute_of_numbers_says_the_median_used(tmp_path: Path) -> None:
    # sibling: numeric columns (median) and a text column in one line, with each column's count
    src = _copy("penguins.csv", tmp_path / "penguins")
    r = _prep(src, tmp_path / "out", missing="impute")
    line = next(n for n in r.notices if "imputed (missing=impute)" in n)
    assert line.startswith("7 missing cells in 5 column(s) imputed (missing=impute): 'bill_length_mm' 1 (the median value, ")
    assert "'sex' 3 (the most frequent value, 'female')" in line
    imputed = r.report["columns_imputed"]
    assert f"'body_mass_g' 1 (the median value, {imputed['body_mass_g']['value']:g})" in line
    # without a gap, nothing is said
    shutil.rmtree(src)
    r = _prep(_copy("penguins.csv", src, rename=("Adelie,Torgersen,NA,NA,NA,NA,NA,2007\n", "")), tmp_path / "gapless",
              missing="impute", drop_columns="sex")
    assert not any("imputed" in n for n in r.notices)
