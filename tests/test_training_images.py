"""Issue 14, "Your data": image folders (PNG files written from the scikit-learn digits), a user CNN from a module
outside the package through the default pipeline, archive, ``archive show`` and ``load_archived(...).predict``;
the cache tier caches any files; readers name what they cannot read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from heteroflow.cache.errors import DatasetError

torch = pytest.importorskip("torch", reason="train needs PyTorch (the 'torch' extra)")
pytest.importorskip("PIL", reason="the image-folder reader needs Pillow (the 'torch' extra)")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HETEROFLOW = Path(sys.executable).with_name("heteroflow")


@pytest.fixture(scope="module")
def digits_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits as 8x8 grayscale PNG files, one folder per digit (examples/digits_models.py)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import digits_models  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLES))
    return digits_models.export_digits_images(tmp_path_factory.mktemp("img") / "digits-images")


@pytest.fixture()
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
def test_a_user_cnn_on_an_image_folder_through_the_default_pipeline_archives_and_predicts(
    digits_images: Path, tmp_path: Path, examples_on_path: None, heteroflow_home: Path
) -> None:
    from heteroflow.components.models.predict import load_archived
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(
        default_pipeline(train_candidates=["cpu:cpu=1"]),
        {"dataset_uri": str(digits_images), "model": "digits_models:cnn", "epochs": 12, "model_name": "digits-cnn"},
        run_dir=tmp_path / "run",
    )
    assert record.status == "succeeded", [(s.name, s.error) for s in record.steps]
    train = record.results["train"]
    assert train["model"] == "digits_models:cnn" and train["model_args"]["input_shape"] == [1, 8, 8]
    assert [h["epoch"] for h in train["history"]] == list(range(1, 13))
    assert record.metrics["evaluate"]["accuracy"] >= 0.90
    archived = Path(record.results["archive"]["path"])
    lineage = json.loads((archived / "lineage.json").read_text())
    assert lineage["model"] == {"factory": "digits_models:cnn", "args": {"num_classes": 10, "input_shape": [1, 8, 8]}}

    show = subprocess.run([str(HETEROFLOW), "archive", "show", "digits-cnn"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert show.returncode == 0, show.stderr
    assert "digits_models:cnn" in show.stdout

    model = load_archived(archived)
    assert isinstance(model.model, torch.nn.Module) and model.kind == "image_folder"
    files = sorted(digits_images.glob("*/*.png"))[::5]  # every fifth image, all classes
    predicted = model.predict(files)
    truth = np.array([int(p.parent.name) for p in files])
    assert (predicted == truth).mean() >= 0.90
    # arrays of pixels work too, decoded the way training decoded files
    from PIL import Image

    pixels = np.stack([np.asarray(Image.open(p)) for p in files[:20]])
    assert (model.predict(pixels) == predicted[:20]).all()
    # the command line on a folder of images: each prediction beside its file (a new user could not match the rows)
    import shutil

    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    few = tmp_path / "few"
    for p in files[:6]:
        (few / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, few / p.parent.name / p.name)
    done = CliRunner().invoke(app, ["predict", str(archived), str(few)], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    rows = [line.split(",") for line in done.output.strip().splitlines()]
    expected = sorted(f"{p.parent.name}/{p.name}" for p in files[:6])
    assert rows[0] == ["file", "prediction"] and [r[0] for r in rows[1:]] == expected
    by_file = dict(zip([f"{p.parent.name}/{p.name}" for p in files[:6]], model.predict(files[:6])))
    assert [r[1] for r in rows[1:]] == [str(model.classes[by_file[f]]) if hasattr(model, "classes") else str(by_file[f]) for f in expected]


def test_prewarm_caches_a_folder_of_arbitrary_binary_files(tmp_path: Path) -> None:
    from heteroflow.cache.prewarm import prewarm

    src = tmp_path / "blobs"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(os.urandom(3000))
    (src / "y.bin").write_bytes(b"\x00\x01\x02")
    result = prewarm(str(src), tmp_path / "cache")
    manifest = json.loads(Path(result.manifest_path).read_text())
    assert sorted(f["path"] for f in manifest["files"]) == ["a/x.bin", "y.bin"]
    cached = Path(manifest["root"])
    assert (cached / "a" / "x.bin").read_bytes() == (src / "a" / "x.bin").read_bytes()

    # the reader, not the cache tier, says what it cannot read, naming the format
    from heteroflow.components.data.preprocess import preprocess

    with pytest.raises(DatasetError, match=r"no reader reads \.bin files; readers: tables .* image folders"):
        preprocess(result.manifest_path, tmp_path / "shards", num_workers=1)


def test_the_cli_prewarm_takes_binary_files(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    src = tmp_path / "blobs"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(100))
    result = CliRunner().invoke(app, ["prewarm", str(src)])
    assert result.exit_code == 0, result.output


def _image_folder(root: Path, classes: dict[str, int]) -> Path:
    from PIL import Image

    for k, (name, n) in enumerate(classes.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):  # class k is a flat grey of about 120 * k: easy to tell apart
            Image.fromarray(np.full((4, 4), min(255, 120 * k + i), dtype=np.uint8), mode="L").save(root / name / f"{i}.png")
    return root


def test_an_undecodable_image_is_named_before_training(tmp_path: Path) -> None:
    from heteroflow.components.data.preprocess import preprocess

    root = _image_folder(tmp_path / "imgs", {"cat": 10, "dog": 10})
    (root / "dog" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(DatasetError, match=r"image .*dog/broken\.png cannot be decoded"):
        preprocess(str(root), tmp_path / "shards", num_workers=1)


def test_a_class_folder_with_no_images_is_named(tmp_path: Path) -> None:
    from heteroflow.components.data.preprocess import preprocess

    root = _image_folder(tmp_path / "imgs", {"cat": 10, "dog": 10})
    (root / "bird").mkdir()
    (root / "bird" / "notes.txt").write_text("no images here")
    with pytest.raises(DatasetError, match=r"class folder .*bird has no images"):
        preprocess(str(root), tmp_path / "shards", num_workers=1)


def test_an_image_folder_splits_stratified_and_trains_with_the_builtin_mlp(tmp_path: Path) -> None:
    from heteroflow.components.models.evaluate import evaluate
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.training.step import train

    root = _image_folder(tmp_path / "imgs", {"cat": 20, "dog": 20})
    result = preprocess(str(root), tmp_path / "shards", num_workers=1, seed=3)
    assert result.classes == ("cat", "dog") and sum(result.counts.values()) == 40 and result.num_features == 16
    meta = json.loads((tmp_path / "shards" / "meta.json").read_text())
    assert meta["data_kind"] == "image_folder" and meta["sample_shape"] == [1, 4, 4]
    for split in ("train", "validation", "test"):
        assert {c for _, c in meta["splits"][split]} == {0, 1}  # every class in every split
    out = train(tmp_path / "shards", tmp_path / "m", epochs=2, loader_workers=0, checkpoint_root=str(tmp_path / "ck"))
    assert out.steps > 0
    assert evaluate(tmp_path / "shards", tmp_path / "m").samples == result.counts["test"]


@pytest.mark.parametrize(("bad", "message"), [
    ("x_nan", r"x holds missing \(NaN\) or infinite values in 2 sample\(s\), first at row\(s\) 5, 6; a feature must be a finite number"),
    ("y_nan", r"y \(the class\) is missing \(NaN\) or infinite in 1 sample\(s\), first at row\(s\) 7; every sample needs its class"),
])
def test_pt_tensors_with_nan_or_inf_are_refused_as_a_tables_cells_are(tmp_path: Path, bad: str, message: str) -> None:
    """A review's input: NaN and inf in x went into train.pt and validation.pt silently, and a NaN class in y was a
    bare ``KeyError: nan``."""
    from heteroflow.components.data.preprocess import preprocess

    x = torch.randn(60, 3, generator=torch.Generator().manual_seed(0))
    y = (torch.arange(60) % 2).float()
    if bad == "x_nan":
        x[5, 1], x[6, 0] = float("nan"), float("inf")
    else:
        y[7] = float("nan")
    (tmp_path / "t").mkdir()
    torch.save({"x": x, "y": y}, tmp_path / "t" / "part.pt")
    with pytest.raises(DatasetError, match=message):
        preprocess(str(tmp_path / "t"), tmp_path / "shards", num_workers=1)


def test_pt_tensors_and_a_dataset_factory_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.data.readers import open_splits
    from heteroflow.components.training.step import train

    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 2, 3, generator=g)
    y = torch.arange(60) % 3
    (tmp_path / "t").mkdir()
    torch.save({"x": x, "y": y}, tmp_path / "t" / "part.pt")
    preprocess(str(tmp_path / "t"), tmp_path / "shards", num_workers=1)
    splits = open_splits(tmp_path / "shards")
    assert splits.kind == "tensors" and splits.input_shape == (2, 3) and splits.classes == ("0", "1", "2")
    assert train(tmp_path / "shards", tmp_path / "m", epochs=1, checkpoint_root=str(tmp_path / "ck")).steps > 0

    (tmp_path / "userdata.py").write_text(
        "import torch\n"
        "class DS(torch.utils.data.Dataset):\n"
        "    classes = ['a', 'b']\n"
        "    def __init__(self, n): self.n = n\n"
        "    def __len__(self): return self.n\n"
        "    def __getitem__(self, i): return torch.full((5,), float(i % 2)), i % 2\n"
        "def make(split):\n"
        "    return DS(40 if split == 'train' else 10)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = train(tmp_path / "shards", tmp_path / "m2", epochs=20, batch_size=8, learning_rate=0.01,
                dataset_factory="userdata:make", loader_workers=0,
                checkpoint_root=str(tmp_path / "ck"))
    assert out.validation_accuracy == 1.0
    with pytest.raises(Exception, match=r"dataset_factory 'nosuchmod_q:make': cannot import"):
        train(tmp_path / "shards", tmp_path / "m3", dataset_factory="nosuchmod_q:make")
