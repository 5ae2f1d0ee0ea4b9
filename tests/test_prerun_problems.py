"""Every problem of a run in one message, before any step does work (issue #28, item 2).

The issue's inputs: a folder with three corrupt images (each run named the next one), a one-class data set
(refused at preprocess, after prewarm copied it), a bad ``model_args`` (refused at train, after preprocess).
Siblings found in the code: each step's check stopped at its first parameter (``check_train_params``,
``check_preprocess_params``), ``Pipeline.arguments`` / ``Pipeline.check`` at the first call, the CLI at the first
value that does not parse, and a model factory that needs an argument nobody gives failed only when train called it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from heteroflow.cache.errors import DatasetError
from heteroflow.components.errors import InvalidParameter, RunProblems
from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.default import default_pipeline
from heteroflow.pipelines.runs.records import prepare_arguments

CORRUPT = ("cat/broken.png", "dog/truncated.jpg", "dog/zero.png")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _image_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog"), corrupt: tuple[str, ...] = CORRUPT) -> Path:
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            Image.fromarray((rng.random((8, 8, 3)) * 255).astype("uint8")).save(root / c / f"{i}.png")
    for rel in corrupt:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"" if "zero" in rel else b"\x89PNG\r\n\x1a\n not the rest of a png")
    return root


def _one_class_table(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "visits.csv").write_text("age,score,label\n" + "".join(f"{20 + i},{i * 3 % 7},healthy\n" for i in range(40)))
    return path


def _nothing_ran(home: Path, run_dir: Path) -> None:
    copied = [p for p in home.rglob("*") if p.is_file()] if home.exists() else []
    assert not [p for p in copied if p.suffix in (".png", ".jpg", ".csv")], f"prewarm copied data: {copied}"
    assert not run_dir.exists(), "a run whose input has problems must not start"


# --- the inputs -------------------------------------------------------------------------------------


def test_three_corrupt_images_and_a_bad_model_args_come_in_one_message_before_prewarm(
    tmp_path: Path, heteroflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = _image_folder(tmp_path / "pets")
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", "--engine", "inprocess", "--dataset", str(data), "--output", str(run_dir),
        "--param", 'model_args={"hiden_units": 64}',
    ])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.count("error:") == 1, result.output
    message = _flat(result.output)
    assert "2 problems with this run" in message
    assert "takes no argument 'hiden_units'" in message and "hidden_units" in message
    assert f"3 images of 15 in image folder {data} cannot be decoded" in message
    for rel in CORRUPT:  # every corrupt image, not only the first
        assert f"{data}/{rel}" in message
    _nothing_ran(heteroflow_home, run_dir)


def test_a_one_class_table_is_refused_before_prewarm_copies_it(tmp_path: Path, heteroflow_home: Path) -> None:
    data = _one_class_table(tmp_path / "clinic")
    with pytest.raises(DatasetError) as caught:
        prepare_arguments(default_pipeline(), {"dataset_uri": str(data)})
    message = str(caught.value)
    assert not isinstance(caught.value, InvalidParameter)  # one problem, of the data set: raised as it is
    assert f"data set {data} has 1 class ('healthy') in class column 'label'" in message
    assert "a classifier needs at least 2" in message and "label_column" in message
    _nothing_ran(heteroflow_home, tmp_path / "no-run")


# --- siblings -----------------------------------------------------------------------------------------------


def test_a_one_class_image_folder_with_an_empty_class_folder_lists_both(tmp_path: Path) -> None:
    data = _image_folder(tmp_path / "birds", classes=("owl",), corrupt=())
    (data / "hawk").mkdir()
    (data / "hawk" / "notes.txt").write_text("photos to come\n")
    with pytest.raises(DatasetError) as caught:
        prepare_arguments(default_pipeline(), {"dataset_uri": str(data)})
    message = str(caught.value)
    assert message.startswith("2 problems with this run")
    assert f"class folder {data}/hawk has no images" in message
    assert f"image folder {data} has 1 class folder(s) (owl); a classifier needs at least 2" in message


def test_every_steps_parameters_and_the_data_set_come_together(tmp_path: Path) -> None:
    data = _one_class_table(tmp_path / "clinic")
    params = {"dataset_uri": str(data), "epochs": 0, "learning_rate": -1.0, "validation_fraction": 2.0,
              "missing": "guess"}
    with pytest.raises(RunProblems) as caught:
        prepare_arguments(default_pipeline(), params)
    problems = caught.value.problems
    assert isinstance(caught.value, InvalidParameter) and isinstance(caught.value, DatasetError)
    assert len(problems) == 5, problems
    for text in ("epochs=0 is out of range", "learning_rate=-1.0 is out of range", "validation_fraction=2.0 is out of range",
                 "missing='guess' is not valid; valid: error, impute, drop", "has 1 class ('healthy')"):
        assert sum(text in p for p in problems) == 1, (text, problems)
    assert str(caught.value).startswith("5 problems with this run (nothing was run; fix each and rerun):\n- ")


def test_a_model_factory_that_needs_an_argument_nobody_gives_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymodels.py").write_text(
        "import torch\n\ndef wide(num_classes, width, depth=2):\n    return torch.nn.Linear(4, num_classes)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from heteroflow.components.training.step import check_train_params

    with pytest.raises(InvalidParameter, match=r"mymodels:wide' cannot be called with what train gives it: it needs 'width'"):
        check_train_params(model_factory="mymodels:wide")
    check_train_params(model_factory="mymodels:wide", model_args='{"width": 8}')  # given: nothing to say
    with pytest.raises(InvalidParameter) as caught:  # several of train's parameters: each one named
        check_train_params(model_factory="mymodels:wide", model_args='{"width": 8, "heads": 2}', batch_size=0,
                           precision="fp64")
    message = str(caught.value)
    assert message.startswith("3 problems with train's parameters:")
    assert "takes no argument 'heads'; it takes: num_classes, width, depth" in message
    assert "batch_size=0 is out of range" in message and "precision='fp64' is unknown" in message


def test_the_cli_lists_every_unknown_name_and_bad_value_with_the_runs_own_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = _one_class_table(tmp_path / "clinic")
    result = CliRunner().invoke(app, [
        "run", "--engine", "inprocess", "--dataset", str(data),
        "--param", "epoch=3", "--param", "sead=1", "--param", "batch_size=lots", "--param", "test_fraction=1.5",
    ])
    assert result.exit_code == 2, result.output
    message = _flat(result.output)
    assert "4 problems with this run" in message
    assert "unknown parameters 'epoch', 'sead' (did you mean 'epochs' for 'epoch', 'seed' for 'sead'?); valid:" in message
    assert "batch_size='lots' is not a valid int" in message
    assert "test_fraction=1.5 is out of range" in message
    assert f"data set {data} has 1 class" in message
    assert not (tmp_path / "heteroflow-runs").exists()


def test_a_single_problem_keeps_its_own_error_and_message(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"^epochs=0 is out of range; valid: an integer >= 1$"):
        prepare_arguments(default_pipeline(), {"epochs": 0})


def test_preprocess_of_a_prewarmed_image_folder_names_every_unreadable_image(tmp_path: Path) -> None:
    # a remote data set is first read at preprocess (after prewarm): it too names them all, in the source's terms
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.data.preprocess import preprocess

    data = _image_folder(tmp_path / "pets")
    cached = prewarm(str(data), tmp_path / "cache")
    with pytest.raises(DatasetError) as caught:
        preprocess(cached.manifest_path, tmp_path / "shards", num_workers=1)
    message = str(caught.value)
    assert message.startswith(f"3 images of 15 in image folder {data} cannot be decoded")
    listed = [line for line in message.splitlines() if line.startswith("- ")]
    assert [line.split(" (")[0] for line in listed] == [f"- {data}/{rel}" for rel in CORRUPT]  # each once, in order
    assert all(f"{data}/{rel}" in message for rel in CORRUPT)
    assert not (tmp_path / "shards").exists()


def test_a_width_the_model_would_ignore_and_a_misspelled_model_argument_are_refused_before_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's findings: `-p hidden_units=32` with a model that takes no width trained as if unset, with no
    word; `model_args={"hidden_unit": 64}` got no "did you mean"; one problem read "1 problems"."""
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.components.training.step import check_train_params

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))  # digits_models, as the README does
    with pytest.raises(InvalidParameter, match=r"hidden_units=32 is not used: model digits_models:cnn takes no hidden_units "
                                               r"\(it takes: num_classes, input_shape, channels\); leave hidden_units at its default"):
        check_train_params(model_factory="digits_models:cnn", hidden_units=32)
    check_train_params(model_factory="digits_models:cnn")  # the default: nothing set, nothing refused
    check_train_params(model_factory="digits_models:mlp", hidden_units=32)  # a model that takes it
    with pytest.raises(InvalidParameter, match=r"takes no argument 'hidden_unit'; it takes: .*; did you mean 'hidden_units'\?$"):
        check_train_params(model_args='{"hidden_unit": 64}')
    with pytest.raises(InvalidParameter) as caught:
        check_train_params(model_args="{bad")
    assert "1 problems" not in str(caught.value)
