"""Portable models (#31.3): ONNX export of the built-in models and the example CNN, checked with onnx.checker, run
with onnxruntime on the CPU, predicting what PyTorch predicts; the archive's ``export_formats``, ``heteroflow archive
export`` and ``heteroflow predict --format onnx``."""

from __future__ import annotations

import csv
import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.models import onnx as hf_onnx

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

needs_onnx = pytest.mark.skipif(
    bool(hf_onnx.missing_onnx_packages()),
    reason=f"{', '.join(hf_onnx.missing_onnx_packages())} not installed (the onnx extra: pip install 'heteroflow[onnx]')",
)


def _model_dir(folder: Path, factory: str, args: dict, input_shape: list[int], classes: int) -> Path:
    """A model folder as train writes it (``model.pt``, ``model.json``) for a factory-built model with seeded weights."""
    import torch

    from heteroflow.components.training.factories import ModelSpec

    torch.manual_seed(0)
    spec = ModelSpec(ref=factory, args=args)
    model = spec.build()
    folder.mkdir(parents=True)
    torch.save(model.state_dict(), folder / "model.pt")
    config = {"format": 2, "model": spec.to_dict(), "input_shape": input_shape, "in_features": int(np.prod(input_shape)),
              "classes": [str(i) for i in range(classes)], "num_classes": classes, "data": {"kind": "tensors"}}
    (folder / "model.json").write_text(json.dumps(config))
    return folder


def _torch_logits(model_dir: Path, x: np.ndarray) -> np.ndarray:
    import torch

    from heteroflow.components.training.model_files import load_model

    model, _ = load_model(model_dir)
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


# --- parameters and missing packages (no onnx needed) ------------------------------------------------------


def test_export_formats_are_checked_and_named() -> None:
    from heteroflow.components.models.archive import ARCHIVE

    assert hf_onnx.parse_export_formats("") == ()
    assert hf_onnx.parse_export_formats(" ONNX, onnx ") == ("onnx",)
    with pytest.raises(InvalidParameter, match=r"export_formats='tflite'.*valid: onnx"):
        hf_onnx.parse_export_formats("tflite")
    with pytest.raises(InvalidParameter, match="export_formats"):
        ARCHIVE.check_params({"export_formats": "onnx,tflite"})


def test_a_run_with_a_bad_export_format_stops_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--param", "export_formats=tflite"])
    assert result.exit_code == 2 and "export_formats='tflite'" in result.output and "valid: onnx" in result.output
    assert not (tmp_path / "heteroflow-runs").exists()  # no run folder: nothing ran


def test_onnx_without_its_packages_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = hf_onnx.importlib.util.find_spec
    monkeypatch.setattr(hf_onnx.importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(InvalidParameter, match=r"export_formats=onnx needs onnxruntime installed: pip install 'heteroflow\[onnx\]'"):
        hf_onnx.check_export_formats("onnx")
    hf_onnx.check_export_formats("")  # PyTorch's files only: nothing to install
    with pytest.raises(InvalidParameter, match="onnxruntime"):
        hf_onnx.OnnxRunner("whatever.onnx")


# --- export: every built-in model and the example CNN -------------------------------------------------------

FACTORIES = {
    "builtin-mlp": ("heteroflow.components.training.factories:mlp", {"in_features": 64, "num_classes": 10, "hidden_units": 32}, [64]),
    "builtin-mlp-images": ("heteroflow.components.training.factories:mlp",
                           {"in_features": 64, "num_classes": 10, "hidden_units": 32, "input_shape": [1, 8, 8]}, [1, 8, 8]),
    "example-mlp": ("digits_models:mlp", {"in_features": 64, "num_classes": 10, "hidden_units": 16}, [64]),
    "example-cnn": ("digits_models:cnn", {"num_classes": 10, "input_shape": [1, 8, 8], "channels": 8}, [1, 8, 8]),
}


@needs_onnx
@pytest.mark.slow  # the dynamo exporter's first use imports torch.export and onnxscript (~20 s here)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_the_onnx_export_computes_what_pytorch_computes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    monkeypatch.syspath_prepend(str(EXAMPLES))
    factory, args, shape = FACTORIES[name]
    model_dir = _model_dir(tmp_path / "model", factory, args, shape, 10)
    done = hf_onnx.export_onnx(model_dir, tmp_path / "out" / "model.onnx")
    assert done.exporter == "dynamo" and done.notice is None and done.input_shape == tuple(shape)
    onnx.checker.check_model(str(done.path), full_check=True)
    proto = onnx.load(str(done.path))
    assert [i.name for i in proto.graph.input] == ["features"] and [o.name for o in proto.graph.output] == ["logits"]
    runner = hf_onnx.OnnxRunner(done.path)
    rng = np.random.default_rng(1)
    for batch in (1, 37):  # the batch axis is dynamic
        x = rng.random((batch, *shape), dtype=np.float32)
        got, want = runner.logits(x), _torch_logits(model_dir, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    assert sorted(p.name for p in done.path.parent.iterdir()) == ["model.onnx"]  # no temporary file left
    record = done.record(relative_to=tmp_path)
    assert record["path"] == "out/model.onnx" and record["input"]["shape"] == ["batch", *shape]
    assert "preprocessed features" in record["input"]["takes"] and record["sha256"] and record["opset"] >= 13


@needs_onnx
def test_a_failing_dynamo_export_falls_back_to_torchscript_with_a_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    factory, args, shape = FACTORIES["builtin-mlp"]
    model_dir = _model_dir(tmp_path / "model", factory, args, shape, 10)

    def refuse(*a: object, **k: object) -> None:
        raise RuntimeError("no decomposition for aten::made_up")

    monkeypatch.setattr(hf_onnx, "_export_dynamo", refuse)
    with pytest.warns(RuntimeWarning, match=r"dynamo exporter failed \(RuntimeError: no decomposition for aten::made_up\): used the TorchScript"):
        done = hf_onnx.export_onnx(model_dir, tmp_path / "m.onnx")
    assert done.exporter == "torchscript" and "made_up" in (done.notice or "") and done.record()["notice"] == done.notice
    x = np.random.default_rng(2).random((5, 64), dtype=np.float32)
    np.testing.assert_allclose(hf_onnx.OnnxRunner(done.path).logits(x), _torch_logits(model_dir, x), rtol=1e-4, atol=1e-5)
    # without onnxscript the dynamo exporter is not tried at all
    real = hf_onnx.importlib.util.find_spec
    monkeypatch.setattr(hf_onnx.importlib.util, "find_spec", lambda n, *a: None if n == "onnxscript" else real(n, *a))
    with pytest.warns(RuntimeWarning, match="onnxscript is not installed"):
        assert hf_onnx.export_onnx(model_dir, tmp_path / "m2.onnx").exporter == "torchscript"


@needs_onnx
def test_export_never_replaces_a_file(tmp_path: Path) -> None:
    factory, args, shape = FACTORIES["builtin-mlp"]
    model_dir = _model_dir(tmp_path / "model", factory, args, shape, 10)
    target = tmp_path / "m.onnx"
    target.write_bytes(b"mine")
    with pytest.raises(InvalidParameter, match="exists; ONNX export never replaces a file"):
        hf_onnx.export_onnx(model_dir, target)
    assert target.read_bytes() == b"mine" and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "model"]


# --- archive, load_archived and the CLI on a trained table model ---------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> dict[str, Path]:
    """digits prewarmed, preprocessed, the built-in MLP trained (3 epochs) and evaluated: archive's inputs."""
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.models.evaluate import evaluate
    from heteroflow.components.training.step import train

    root = tmp_path_factory.mktemp("onnx-trained")
    home = os.environ.get("HETEROFLOW_HOME")
    os.environ["HETEROFLOW_HOME"] = str(root / "home")  # checkpoints of this module's training
    try:
        warmed = prewarm(str(digits_dir), root / "cache")
        dataset, shards = warmed.manifest_path.parent, root / "shards"
        preprocess(warmed.manifest_path, shards, seed=0, num_workers=1)
        train(shards, root / "model", epochs=3, hidden_units=32, loader_workers=0)
        metrics = root / "eval.json"
        metrics.write_text(json.dumps(evaluate(shards, root / "model").to_dict()))
    finally:
        if home is None:
            os.environ.pop("HETEROFLOW_HOME", None)
        else:
            os.environ["HETEROFLOW_HOME"] = home
    return {"dataset": dataset, "shards": shards, "model": root / "model", "metrics": metrics}


def _archive(trained: dict[str, Path], tmp_path: Path, root: Path, **params: str):
    from heteroflow.components.models.archive import archive_step

    return archive_step(str(trained["dataset"]), str(trained["shards"]), str(trained["model"]), str(trained["metrics"]),
                        str(tmp_path / "archived.json"), archive_root=str(root), model_name="digits-mlp", **params)


@needs_onnx
@pytest.mark.slow
def test_an_archived_onnx_export_predicts_raw_rows_as_pytorch_does(trained: dict[str, Path], digits_dir: Path, tmp_path: Path) -> None:
    from heteroflow.components.models.predict import load_archived

    root = tmp_path / "archive"
    result = _archive(trained, tmp_path, root, export_formats="onnx")
    formats = result.lineage["formats"]
    assert sorted(formats) == ["onnx", "pytorch"] and formats["pytorch"]["path"] == "model"
    assert formats["onnx"]["path"] == "onnx/model.onnx" and formats["onnx"]["exporter"] == "dynamo"
    assert formats["onnx"]["input"]["shape"] == ["batch", 64] and "transform.joblib" in formats["onnx"]["input"]["takes"]
    onnx_file = result.path / "onnx" / "model.onnx"
    assert onnx_file.is_file() and not onnx_file.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)  # archived: read-only
    on_disk = json.loads((result.path / "lineage.json").read_text())
    assert on_disk["formats"] == formats and on_disk["model_sha256"] == result.lineage["model_sha256"]

    rows = sorted(digits_dir.glob("*.csv"))[0]
    torch_model = load_archived(result.path)
    onnx_model = load_archived(result.path, format="onnx")
    assert onnx_model.format == "onnx" and torch_model.format == "pytorch"
    assert onnx_model._model is None  # ONNX prediction builds no PyTorch model
    want, got = torch_model.predict_proba(rows), onnx_model.predict_proba(rows)
    assert len(want) > 100
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert (onnx_model.predict(rows) == torch_model.predict(rows)).all()
    assert (load_archived(str(result.path / "model"), format="onnx").predict(rows) == torch_model.predict(rows)).all()

    # the same model again: the same version, nothing rewritten
    again = _archive(trained, tmp_path, root, export_formats="onnx")
    assert again.existing and again.version == result.version and again.note is None


@needs_onnx
@pytest.mark.slow
def test_archive_without_onnx_then_export_and_predict_from_the_command_line(
    trained: dict[str, Path], digits_dir: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from heteroflow.components.models.predict import load_archived
    from heteroflow.pipelines.cli.main import app

    root = tmp_path / "archive"
    plain = _archive(trained, tmp_path, root)
    assert sorted(plain.lineage["formats"]) == ["pytorch"] and not (plain.path / "onnx").exists()
    with pytest.raises(InvalidParameter, match="holds no ONNX export; archive with --param export_formats=onnx"):
        load_archived(plain.path, format="onnx")
    # the same model, asked for with onnx: v1 stays as it is (versions never change) and a new version holds the
    # export, so `predict digits-mlp:v2 --format onnx` works (it said "already archived" and predict's advice looped)
    asked = _archive(trained, tmp_path, root, export_formats="onnx")
    assert not asked.existing and asked.version == 2 and asked.note == "the same model as v1, which was archived without onnx"
    assert sorted(asked.lineage["formats"]) == ["onnx", "pytorch"] and asked.lineage["same_model_as"] == "v1"
    assert (asked.path / "onnx" / "model.onnx").is_file() and sorted(plain.lineage["formats"]) == ["pytorch"]
    assert load_archived(asked.path, format="onnx") is not None
    assert _archive(trained, tmp_path, root, export_formats="onnx").version == 2  # and then: already archived, v2
    before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))

    runner = CliRunner()
    out = tmp_path / "digits.onnx"
    result = runner.invoke(app, ["archive", "export", "digits-mlp:v1", "--format", "onnx", "-o", str(out), "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert f"exported digits-mlp:v1 to {out}" in " ".join(result.output.split())
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == before  # the archived version untouched
    again = runner.invoke(app, ["archive", "export", "digits-mlp", "-o", str(out), "--root", str(root)])
    assert again.exit_code == 2 and "exists; ONNX export never replaces a file" in " ".join(again.output.split())

    inside = runner.invoke(app, ["archive", "export", "digits-mlp:v1", "-o", str(plain.path / "model" / "m.onnx"), "--root", str(root)])
    assert inside.exit_code == 2 and "is inside the archive" in " ".join(inside.output.split())
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == before

    rows = sorted(digits_dir.glob("*.csv"))[0]
    target = tmp_path / "pred.csv"
    res = runner.invoke(app, ["predict", str(plain.path), str(rows), "--proba", "-o", str(target)])
    assert res.exit_code == 0, res.output
    table = list(csv.reader(target.open()))
    assert table[0] == ["prediction"] + [f"p_{d}" for d in range(10)] and len(table) > 100
    assert [r[0] for r in table[1:]] == [str(c) for c in load_archived(plain.path).predict(rows)]
    assert all(abs(sum(float(p) for p in r[1:]) - 1) < 1e-4 for r in table[1:])
    # v1 holds no ONNX file: predict says how to get one, and does not guess the copy exported above
    res = runner.invoke(app, ["predict", "digits-mlp:v1", str(rows), "--format", "onnx", "--root", str(root)])
    assert res.exit_code == 2 and "holds no ONNX export" in " ".join(res.output.split())
    # ... and does not send the user back to the export just made (a new user went round in that circle)
    said = " ".join(res.output.split())
    assert "heteroflow run --param export_formats=onnx" in said and "predict with --format pytorch" in said
    assert "writes a standalone .onnx file for other runtimes; predict reads archived versions" in said


@needs_onnx
@pytest.mark.slow
def test_predict_command_gives_the_same_classes_with_onnx(trained: dict[str, Path], digits_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    root = tmp_path / "archive"
    _archive(trained, tmp_path, root, export_formats="onnx")
    rows = sorted(digits_dir.glob("*.csv"))[0]
    runner = CliRunner()
    outputs = {}
    for fmt in ("pytorch", "onnx"):
        res = runner.invoke(app, ["predict", "digits-mlp:v1", str(rows), "--format", fmt, "--root", str(root)])
        assert res.exit_code == 0, res.output
        outputs[fmt] = res.output.splitlines()
    assert outputs["onnx"] == outputs["pytorch"] and outputs["onnx"][0] == "prediction" and len(outputs["onnx"]) > 100
    bad = runner.invoke(app, ["predict", "digits-mlp:v1", str(rows), "--format", "tflite", "--root", str(root)])
    assert bad.exit_code == 2 and "format='tflite'; valid: pytorch, onnx" in bad.output


@needs_onnx
@pytest.mark.slow
def test_the_example_cnn_trained_on_images_predicts_pngs_alike_with_onnx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.models.archive import archive_step
    from heteroflow.components.models.evaluate import evaluate
    from heteroflow.components.models.predict import load_archived
    from heteroflow.components.training.step import train

    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("digits_models", None)
    import digits_models  # type: ignore[import-not-found]

    images = digits_models.export_digits_images(tmp_path / "digits-images")
    warmed = prewarm(str(images), tmp_path / "cache")
    dataset = warmed.manifest_path.parent
    preprocess(warmed.manifest_path, tmp_path / "shards", seed=0, num_workers=1)
    train(tmp_path / "shards", tmp_path / "model", epochs=2, model_factory="digits_models:cnn", loader_workers=0)
    (tmp_path / "eval.json").write_text(json.dumps(evaluate(tmp_path / "shards", tmp_path / "model").to_dict()))
    result = archive_step(str(dataset), str(tmp_path / "shards"), str(tmp_path / "model"), str(tmp_path / "eval.json"),
                          str(tmp_path / "archived.json"), archive_root=str(tmp_path / "archive"), export_formats="onnx")
    assert result.lineage["formats"]["onnx"]["input"]["shape"] == ["batch", 1, 8, 8]
    pngs = sorted((images / "3").glob("*.png"))[:20] + sorted((images / "7").glob("*.png"))[:20]
    want = load_archived(result.path).predict_proba(pngs)
    got = load_archived(result.path, format="onnx").predict_proba(pngs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


# --- the README's section, as written ----------------------------------------------------------------------------


def _readme_commands() -> list[list[str]]:
    import re
    import shlex

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("### Portable models (ONNX)"):]
    section = section[: section.index("\n#", 1)]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    return [shlex.split(line.split("  #")[0]) for line in block.splitlines() if line.strip()]


@needs_onnx
@pytest.mark.slow
def test_the_readme_onnx_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_dir: Path) -> None:
    import shutil

    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    lines = _readme_commands()
    commands = [c for c in lines if c[0] == "heteroflow"]
    assert [c[:3] for c in commands] == [["heteroflow", "run", "--param"], ["heteroflow", "archive", "export"], ["heteroflow", "predict", "digits-mlp"]]
    # the rows to predict: the README copies a file of the sample the main job exported; here, of the same data set
    (copy,) = [c for c in lines if c[0] != "heteroflow"]
    assert copy[0] == "cp" and copy[1].endswith("/datasets/digits/digits-part-0.csv") and copy[2] == "digits.csv", copy
    assert (digits_dir / "digits-part-0.csv").is_file()
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(digits_dir / "digits-part-0.csv", tmp_path / "digits.csv")  # a file of raw rows, as trained on
    runner = CliRunner()
    outputs = []
    for command in commands:
        result = runner.invoke(app, command[1:])
        assert result.exit_code == 0, (command, result.output)
        outputs.append(result.output)
    assert "formats: onnx, pytorch" in " ".join(outputs[0].split())
    assert (tmp_path / "digits-mlp.onnx").is_file()
    rows = outputs[2].splitlines()
    assert rows[0] == "prediction," + ",".join(f"p_{d}" for d in range(10)) and len(rows) > 100
    pytorch = runner.invoke(app, ["predict", "digits-mlp:v1", "digits.csv", "--proba"])
    assert pytorch.exit_code == 0
    assert [r.split(",")[0] for r in pytorch.output.splitlines()] == [r.split(",")[0] for r in rows]
    show = runner.invoke(app, ["archive", "show", "digits-mlp:v1"])
    import re

    cells = re.sub(r"[\s│]", "", show.output)  # the table folds long values over lines
    assert "formatsonnx:onnx/model.onnx(inputfeatures['batch',64]float32:preprocessedfeatures" in cells and ");pytorch:model" in cells
