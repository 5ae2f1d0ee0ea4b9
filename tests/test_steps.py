"""The step functions on small real data: datasets, preprocess, plan, train, evaluate, archive, telemetry, adapters."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import os
import re
import stat
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heteroflow.cache.errors import DatasetError
from heteroflow.cache.prewarm import MANIFEST_NAME, Manifest, cache_key, prewarm
from heteroflow.components.errors import (
    ArchiveError,
    CheckpointError,
    DeviceUnavailable,
    HeteroflowError,
    InvalidParameter,
    NoCandidateAvailable,
)
from heteroflow.components.resources import Candidates, DeviceKind, Resources

DIGITS_SAMPLES = 1797
DIGITS_FEATURES = 64


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The MLP is tiny: one intra-op thread is as fast, and immune to OpenMP spin-waits on a busy 2-core box."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ==========================================================================================================
# components.datasets
# ==========================================================================================================

from heteroflow.components.data.datasets import digits_source_dir, export_digits, read_table  # noqa: E402


def test_read_csv_string_labels(tmp_path: Path):
    f = tmp_path / "pets.csv"
    f.write_text("weight,height,label\n4.5,30,cat\n30,60,dog\n5,28,cat\n")
    t = read_table(f)
    assert list(t.frame.columns) == ["weight", "height", "label"]
    assert t.kinds == {"weight": "number", "height": "number", "label": "text"}
    np.testing.assert_allclose(t.frame[["weight", "height"]].to_numpy(float), [[4.5, 30], [30, 60], [5, 28]])
    assert t.frame["label"].tolist() == ["cat", "dog", "cat"]
    assert t.source == str(f)
    assert (t.format, t.named, t.csv.delimiter, t.csv.header) == ("csv", True, ",", True)


def test_read_csv_strips_names_and_skips_blank_lines(tmp_path: Path):
    f = tmp_path / "mid.csv"
    f.write_text("a, label ,b\n1,7,2\n\n3,8,4\n\n")
    t = read_table(f)
    assert list(t.frame.columns) == ["a", "label", "b"]
    np.testing.assert_array_equal(t.frame.to_numpy(float), [[1, 7, 2], [3, 8, 4]])
    assert t.blank_rows == 2
    assert t.frame.index.tolist() == [0, 2]  # positions in the file: messages name the right line
    assert t.where(2) == "mid.csv line 4"


def test_read_csv_numeric_looking_codes_are_numbers(tmp_path: Path):
    f = tmp_path / "codes.csv"
    f.write_text("a,label\n1,01\n2,2\n")
    t = read_table(f)
    assert t.kinds["label"] == "number"
    assert t.frame["label"].tolist() == [1, 2]


def test_read_csv_text_cell_in_a_number_column_keeps_it_text(tmp_path: Path):
    f = tmp_path / "bad.csv"
    f.write_text("a,b,label\n1,2,0\n1,oops,1\n")
    t = read_table(f)
    assert t.kinds["b"] == "text"
    assert t.frame["b"].tolist() == ["2", "oops"]


BAD_CSV = [
    ("", r"empty file"),
    ("a,label\n", r"no data rows"),
    ("label\n1\n", r"found 1 column \(no delimiter"),
    ("a,b\n1,2\n3,4,5,6\n", r"Expected 2 fields in line 3, saw 4 \(columns split by comma"),
]


@pytest.mark.parametrize(("text", "pattern"), BAD_CSV, ids=["empty", "header-only", "one-column", "ragged-long-row"])
def test_read_csv_invalid(tmp_path: Path, text: str, pattern: str):
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(DatasetError, match=re.escape(str(f)) + ".*" + pattern):
        read_table(f)


def test_read_csv_short_row_has_missing_cells(tmp_path: Path):
    f = tmp_path / "short.csv"
    f.write_text("a,b,label\n1,2\n3,4,5\n")
    t = read_table(f)
    assert t.frame["label"].isna().tolist() == [True, False]


def test_read_npz(tmp_path: Path):
    f = tmp_path / "img.npz"
    x = np.arange(5 * 4 * 4, dtype=np.int64).reshape(5, 4, 4)
    y = np.array([0, 1, 0, 1, 2])
    np.savez(f, x=x, y=y)
    t = read_table(f)
    assert list(t.frame.columns) == [f"x{i}" for i in range(16)] + ["label"]
    np.testing.assert_array_equal(t.frame.iloc[:, :16].to_numpy(), x.reshape(5, 16))
    assert t.frame["label"].tolist() == [0, 1, 0, 1, 2]
    assert (t.format, t.named) == ("npz", False)


def test_read_npz_alternative_names(tmp_path: Path):
    f = tmp_path / "alt.npz"
    np.savez(f, features=np.ones((2, 3)), labels=np.array(["a", "b"]))
    t = read_table(f)
    assert t.frame.shape == (2, 4)
    assert t.frame["label"].tolist() == ["a", "b"]


def test_read_npz_missing_arrays(tmp_path: Path):
    f = tmp_path / "nox.npz"
    np.savez(f, x=np.ones((2, 3)))
    with pytest.raises(DatasetError, match=re.escape(str(f)) + r".*needs arrays 'x' and 'y' \(found: x\)"):
        read_table(f)


def test_read_npz_missing_arrays_is_not_called_unreadable(tmp_path: Path):
    f = tmp_path / "nox.npz"
    np.savez(f, x=np.ones((2, 3)))
    with pytest.raises(DatasetError) as info:
        read_table(f)
    assert "not a readable" not in str(info.value)


def test_read_npz_shape_mismatch_and_garbage(tmp_path: Path):
    f = tmp_path / "mismatch.npz"
    np.savez(f, x=np.ones((3, 2)), y=np.zeros(2))
    with pytest.raises(DatasetError, match=r"'y' has shape \(2,\), expected \(3,\)"):
        read_table(f)
    g = tmp_path / "garbage.npz"
    g.write_bytes(b"this is not a zip file")
    with pytest.raises(DatasetError, match=r"garbage\.npz: not a readable \.npz file"):
        read_table(g)


def test_read_unsupported_suffix(tmp_path: Path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(DatasetError, match=r"unsupported file type '\.txt'"):
        read_table(f)


def test_export_digits_content(digits_dir: Path):
    from sklearn.datasets import load_digits

    parts = sorted(digits_dir.glob("*.csv"))
    assert [p.name for p in parts] == [f"digits-part-{i}.csv" for i in range(4)]
    rows = 0
    for p in parts:
        with open(p, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader)
            assert len(header) == DIGITS_FEATURES + 1
            assert header[-1] == "label"
            body = list(reader)
            assert all(len(r) == DIGITS_FEATURES + 1 for r in body)
            rows += len(body)
    assert rows == DIGITS_SAMPLES
    frames = [read_table(p).frame for p in parts]
    x = np.concatenate([f.iloc[:, :-1].to_numpy(np.float32) for f in frames])
    y = np.concatenate([f["label"].to_numpy() for f in frames])
    ref = load_digits()
    np.testing.assert_array_equal(x, ref.data.astype(np.float32))
    np.testing.assert_array_equal(y, ref.target)
    assert json.loads((digits_dir / "export.json").read_text()) == {"samples": 1797, "features": 64, "classes": 10}
    assert (digits_dir / "SOURCE.md").is_file()


def test_export_digits_default_location_and_idempotent(heteroflow_home: Path):
    first = export_digits()
    assert first == digits_source_dir() == heteroflow_home / "datasets" / "digits"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in first.iterdir()}
    content = _tree_bytes(first)
    again = export_digits()
    assert again == first
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in again.iterdir()} == before
    assert _tree_bytes(again) == content
    assert [p.name for p in first.parent.iterdir()] == ["digits"]  # no temporary folder left


def test_export_digits_replaces_an_interrupted_export(tmp_path: Path):
    dest = tmp_path / "digits"
    dest.mkdir()
    (dest / "digits-part-0.csv").write_text("half a file")
    export_digits(dest)
    assert (dest / "export.json").is_file()
    assert len(read_table(dest / "digits-part-0.csv").frame) > 400


# ==========================================================================================================
# components.preprocess
# ==========================================================================================================

from heteroflow.components.data.preprocess import SPLITS, load_split, preprocess, read_meta  # noqa: E402


def _scaler_of(out: Path) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale of the saved transformation's StandardScaler (digits: every column is a number)."""
    from heteroflow.components.data.tabular import load_transform

    transform, schema = load_transform(out)
    assert [c["kind"] for c in schema["columns"]] == ["number"] * DIGITS_FEATURES
    scaler = transform.named_transformers_["number"].named_steps["scale"]
    return scaler.mean_, scaler.scale_


def _all_splits(out: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {s: load_split(out, s) for s in SPLITS}


def test_digits_shards_counts_and_stratification(digits_shards: Path):
    meta = read_meta(digits_shards)
    splits = _all_splits(digits_shards)
    counts = {s: len(y) for s, (_, y) in splits.items()}
    assert counts == meta["counts"]
    assert sum(counts.values()) == DIGITS_SAMPLES
    assert meta["classes"] == [str(i) for i in range(10)]
    assert meta["num_features"] == DIGITS_FEATURES
    for s, (x, y) in splits.items():
        assert x.dtype == np.float32 and x.shape == (counts[s], DIGITS_FEATURES)
        assert y.dtype == np.int64
        assert set(np.unique(y).tolist()) == set(range(10)), f"{s} misses a class"
    # per class, the documented shares (rounded) go to test and validation
    all_y = np.concatenate([y for _, y in splits.values()])
    for c in range(10):
        n = int((all_y == c).sum())
        assert int((splits["test"][1] == c).sum()) == round(n * 0.15)
        assert int((splits["validation"][1] == c).sum()) == round(n * 0.15)


def test_train_split_is_standardised(digits_shards: Path):
    x_train, _ = load_split(digits_shards, "train")
    mean = x_train.astype(np.float64).mean(axis=0)
    std = x_train.astype(np.float64).std(axis=0)
    varying = std > 0
    assert varying.sum() >= 50  # most digit pixels vary
    np.testing.assert_allclose(mean, 0.0, atol=1e-4)
    np.testing.assert_allclose(std[varying], 1.0, atol=1e-3)
    assert np.all(x_train[:, ~varying] == 0.0)  # constant features become 0, not NaN
    assert np.isfinite(x_train).all()
    # validation/test use the train statistics: they are not themselves exactly standardised
    x_val, _ = load_split(digits_shards, "validation")
    assert np.isfinite(x_val).all()
    assert not np.allclose(x_val.mean(axis=0)[varying], 0.0, atol=1e-4)


def test_standardisation_uses_train_statistics(digits_dir: Path, tmp_path: Path):
    out = preprocess(digits_dir, tmp_path / "shards", seed=3, num_workers=1).output_dir
    mean, std = _scaler_of(out)
    x_test, _ = load_split(out, "test")
    raw = x_test * std + mean  # undo the normalisation: original integer pixels 0..16
    np.testing.assert_allclose(raw, np.round(raw), atol=1e-3)
    assert raw.min() >= -1e-3 and raw.max() <= 16 + 1e-3


def test_same_seed_same_shards(digits_dir: Path, tmp_path: Path):
    a = preprocess(digits_dir, tmp_path / "a", seed=7, num_workers=1)
    b = preprocess(digits_dir, tmp_path / "b", seed=7, num_workers=1)
    assert a.counts == b.counts
    ta, tb = _tree_bytes(a.output_dir), _tree_bytes(b.output_dir)
    assert sorted(ta) == sorted(tb)
    assert ta == tb  # byte for byte, meta.json included
    for s in SPLITS:
        for arr_a, arr_b in zip(load_split(a.output_dir, s), load_split(b.output_dir, s)):
            np.testing.assert_array_equal(arr_a, arr_b)


def test_different_seed_different_split(digits_dir: Path, tmp_path: Path):
    a = preprocess(digits_dir, tmp_path / "a", seed=1, num_workers=1)
    b = preprocess(digits_dir, tmp_path / "b", seed=2, num_workers=1)
    assert a.counts == b.counts  # same stratified sizes
    xa, ya = load_split(a.output_dir, "test")
    xb, yb = load_split(b.output_dir, "test")
    assert not np.array_equal(xa, xb)
    # not merely a reordering: a different set of samples
    def raw_rows(out: Path, x: np.ndarray) -> set[bytes]:
        mean, std = _scaler_of(out)
        pixels = np.rint(x * std + mean).astype(np.int64)
        return {row.tobytes() for row in pixels}

    assert raw_rows(a.output_dir, xa) != raw_rows(b.output_dir, xb)


def test_two_workers_same_result_as_one(digits_shards: Path, digits_dir: Path, tmp_path: Path):
    manifest = prewarm(str(digits_dir), tmp_path / "cache").manifest_path
    one = preprocess(manifest, tmp_path / "one", seed=0, num_workers=1)
    two = preprocess(manifest, tmp_path / "two", seed=0, num_workers=2)
    assert one.num_workers == 1
    assert two.num_workers == 2
    t1, t2 = _tree_bytes(one.output_dir), _tree_bytes(two.output_dir)
    assert t1 == t2
    # and identical to the session fixture (same digits, same seed, from another cache dir)
    assert {k: v for k, v in _tree_bytes(digits_shards).items() if k != "meta.json"} == {
        k: v for k, v in t1.items() if k != "meta.json"
    }


def test_preprocess_result_and_meta(digits_dir: Path, tmp_path: Path):
    manifest = prewarm(str(digits_dir), tmp_path / "cache").manifest
    r = preprocess(tmp_path / "cache", tmp_path / "shards", seed=0, num_workers=1, shard_size=500)
    assert r.output_dir == tmp_path / "shards"
    assert r.num_features == 64
    assert r.classes == tuple(str(i) for i in range(10))
    meta = read_meta(r.output_dir)
    assert meta["dataset_sha256"] == manifest.dataset_sha256
    assert meta["source_uri"] == str(digits_dir)
    assert meta["seed"] == 0
    # shards of at most shard_size samples
    assert meta["shards"]["train"] == [f"train-{k:05d}.npz" for k in range(math.ceil(r.counts["train"] / 500))]
    for s in SPLITS:
        for fname in meta["shards"][s]:
            with np.load(r.output_dir / fname) as d:
                assert 1 <= len(d["y"]) <= 500


def test_preprocess_replaces_output_and_leaves_no_temp(digits_dir: Path, tmp_path: Path):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "stale.npz").write_bytes(b"old")
    preprocess(digits_dir, out, num_workers=1)
    assert not (out / "stale.npz").exists()
    # The old version is swapped out at once and removed on a second thread (issue #32 item 1): gone once it ends.
    from heteroflow.cache.atomic import wait_for_removals

    assert wait_for_removals(timeout=60)
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]


INVALID_PREPROCESS = [
    (dict(validation_fraction=1.0), r"^validation_fraction=1\.0 is out of range"),
    (dict(validation_fraction=-0.1), r"^validation_fraction=-0\.1 is out of range"),
    (dict(test_fraction=0.0), r"^test_fraction=0\.0 is out of range"),
    (dict(test_fraction=1.0), r"^test_fraction=1\.0 is out of range"),
    (dict(validation_fraction=0.5, test_fraction=0.5), r"^validation_fraction \+ test_fraction = 1\.0"),
    (dict(shard_size=-1), r"^shard_size=-1 is out of range"),
    (dict(num_workers=-1), r"^num_workers=-1 is out of range; valid: 0 \(every given core\) or more"),
]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    INVALID_PREPROCESS,
    ids=["val-1", "val-neg", "test-0", "test-1", "sum-1", "shard-neg", "workers-neg"],
)
def test_preprocess_invalid_parameters(digits_dir: Path, tmp_path: Path, kwargs: dict, pattern: str):
    with pytest.raises(InvalidParameter, match=pattern):
        preprocess(digits_dir, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_preprocess_zero_validation_is_allowed(digits_dir: Path, tmp_path: Path):
    r = preprocess(digits_dir, tmp_path / "out", validation_fraction=0.0, num_workers=1)
    assert r.counts["validation"] == 0
    assert len(load_split(r.output_dir, "validation")[1]) == 0
    assert r.counts["train"] + r.counts["test"] == DIGITS_SAMPLES


def test_preprocess_folder_without_data_files(tmp_path: Path):
    src = tmp_path / "docs"
    src.mkdir()
    (src / "README.md").write_text("no data here")
    with pytest.raises(DatasetError, match=r"docs has no \.csv, \.tsv, \.parquet or \.npz file"):
        preprocess(src, tmp_path / "out", num_workers=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match=r"empty is empty"):
        preprocess(empty, tmp_path / "out", num_workers=1)
    with pytest.raises(DatasetError, match=r"does not exist"):
        preprocess(tmp_path / "missing", tmp_path / "out", num_workers=1)


def test_preprocess_string_labels_and_npz(tmp_path: Path):
    src = tmp_path / "mixed"
    src.mkdir()
    rng = np.random.default_rng(0)
    names = np.array(["ant", "bee", "cat"])
    with open(src / "a.csv", "w") as fh:
        fh.write("f0,label,f1\n")
        for i in range(30):
            fh.write(f"{rng.normal()},{names[i % 3]},{rng.normal()}\n")
    np.savez(src / "b.npz", x=rng.normal(size=(30, 2)), y=names[np.arange(30) % 3])
    r = preprocess(src, tmp_path / "out", validation_fraction=0.2, test_fraction=0.2, num_workers=1)
    assert r.classes == ("ant", "bee", "cat")
    assert sum(r.counts.values()) == 60
    for s in SPLITS:
        assert set(load_split(r.output_dir, s)[1].tolist()) == {0, 1, 2}


def test_preprocess_data_errors(tmp_path: Path):
    too_few = tmp_path / "few"
    too_few.mkdir()
    # x is not a row id: values repeat and do not follow the row order
    (too_few / "a.csv").write_text("x,label\n" + "".join(f"{i % 7},0\n" for i in range(20)) + "98,1\n99,1\n")
    with pytest.raises(DatasetError, match=r"class '1' has 2 samples: too few to put at least one in test and one in train with validation_fraction=0\.3"):
        preprocess(too_few, tmp_path / "out", validation_fraction=0.3, test_fraction=0.3, num_workers=1)

    one_class = tmp_path / "one"
    one_class.mkdir()
    (one_class / "a.csv").write_text("x,label\n1,0\n2,0\n")
    with pytest.raises(DatasetError, match=r"has 1 class; a classifier needs at least 2"):
        preprocess(one_class, tmp_path / "out", num_workers=1)

    widths = tmp_path / "widths"
    widths.mkdir()
    (widths / "a.csv").write_text("x,label\n1,0\n")
    (widths / "b.csv").write_text("x,y,label\n1,2,1\n")
    with pytest.raises(DatasetError, match=r"b\.csv has 2 features but .*a\.csv has 1"):
        preprocess(widths, tmp_path / "out", num_workers=1)


def test_load_split_and_read_meta_errors(digits_shards: Path, tmp_path: Path):
    with pytest.raises(InvalidParameter, match=r"^split='training' is unknown; valid: train, validation, test"):
        load_split(digits_shards, "training")
    with pytest.raises(DatasetError, match=r"is not a preprocessed data set"):
        read_meta(tmp_path)


# ==========================================================================================================
# components.plan
# ==========================================================================================================

from heteroflow.components.placement.plan import Inventory, Placement, local_inventory, plan  # noqa: E402

GPU_CPU = Candidates([Resources(kind="gpu", count=1, memory="16Gi"), Resources(kind="cpu", cpu="4")])


def test_plan_gpu_present_chooses_gpu():
    inv = Inventory(devices={DeviceKind.CPU: 1, DeviceKind.GPU: 1, DeviceKind.NPU: 0})
    p = plan(GPU_CPU, inventory=inv)
    assert p.index == 0
    assert p.resources is GPU_CPU[0]
    assert p.device_kind == "gpu"
    assert p.torch_device == "cuda"
    assert p.passed_over == ()


def test_plan_gpu_absent_falls_back_to_cpu_and_says_why():
    why = "torch.cuda.is_available() is False"
    inv = Inventory(devices={DeviceKind.CPU: 1, DeviceKind.GPU: 0}, notes={DeviceKind.GPU: why})
    p = plan(GPU_CPU, inventory=inv)
    assert p.index == 1
    assert p.device_kind == "cpu"
    assert p.torch_device == "cpu"
    assert p.resources == Resources(kind="cpu", cpu="4")
    assert len(p.passed_over) == 1
    reason = p.passed_over[0]
    assert reason.startswith("candidate 0 (gpu x1 (nvidia-gpu)")
    assert "needs 1 gpu device(s)" in reason
    assert why in reason


def test_plan_not_enough_devices_is_passed_over():
    c = Candidates(["gpu:count=2", "gpu:count=1", "cpu"])
    inv = Inventory(devices={DeviceKind.CPU: 1, DeviceKind.GPU: 1})
    p = plan(c, inventory=inv)
    assert p.index == 1
    assert p.resources.count == 1
    assert p.device_kind == "gpu"
    assert p.passed_over == (f"candidate 0 ({c[0].describe()}): needs 2 gpu device(s); 1 gpu device(s) here",)


def test_plan_npu_candidate():
    c = Candidates(["npu:accelerator=ascend-310p", "cpu"])
    p = plan(c, inventory=Inventory(devices={DeviceKind.CPU: 1, DeviceKind.NPU: 8}))
    assert (p.index, p.device_kind, p.torch_device) == (0, "npu", "npu")


def test_plan_nothing_fits_lists_every_candidate():
    c = Candidates(["npu:count=1", "gpu:count=2"])
    inv = Inventory(
        devices={DeviceKind.CPU: 1, DeviceKind.GPU: 1},
        notes={DeviceKind.NPU: "torch_npu is not installed (Ascend NPUs need it)"},
    )
    with pytest.raises(NoCandidateAvailable) as info:
        plan(c, inventory=inv)
    message = str(info.value)
    assert message.startswith("no candidate can run here:")
    assert "candidate 0 (npu x1 (ascend-910)" in message
    assert "torch_npu is not installed" in message
    assert "candidate 1 (gpu x2 (nvidia-gpu)" in message
    assert "1 gpu device(s) here" in message
    assert issubclass(NoCandidateAvailable, HeteroflowError)


def test_plan_without_any_cpu_raises():
    with pytest.raises(NoCandidateAvailable, match=r"candidate 0 \(cpu, 1 CPU, 2Gi\): needs 1 cpu device\(s\); 0 cpu"):
        plan(Candidates(["cpu"]), inventory=Inventory(devices={}))


def test_plan_accepts_an_inventory_function():
    calls = []

    def probe() -> Inventory:
        calls.append(1)
        return Inventory(devices={DeviceKind.CPU: 1})

    p = plan(GPU_CPU, inventory=probe)
    assert calls == [1]
    assert p.index == 1
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["resources"] == GPU_CPU[1].to_dict()
    assert d["device_kind"] == "cpu"
    assert len(d["passed_over"]) == 1


def test_plan_with_the_real_local_inventory():
    import torch

    inv = local_inventory()
    assert inv.devices[DeviceKind.CPU] == 1
    p = plan(GPU_CPU)
    assert isinstance(p, Placement)
    if torch.cuda.is_available():
        assert p.device_kind == "gpu"
        assert p.torch_device == "cuda"
        assert inv.devices[DeviceKind.GPU] >= 1
    else:
        assert p.device_kind == "cpu"
        assert p.index == 1
        assert inv.devices[DeviceKind.GPU] == 0
        if Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists():
            assert "torch.cuda.is_available() is False" in p.passed_over[0]
        else:  # no driver device file: answered without importing torch
            assert "no GPU driver device file here" in p.passed_over[0]
    if importlib.util.find_spec("torch_npu") is None:
        assert inv.devices[DeviceKind.NPU] == 0
        assert any(t in inv.notes[DeviceKind.NPU] for t in ("torch_npu is not installed", "no Ascend driver device file"))


def test_the_local_inventory_does_not_import_torch_without_a_driver_device_file() -> None:
    """The plan step's probe costs no torch import on a machine with no accelerator driver (checked in a fresh
    interpreter); with a driver device file it asks PyTorch."""
    import subprocess
    import sys

    code = (
        "import sys, os\n"
        "from heteroflow.components.devices import all_kinds\n"
        "from heteroflow.components.placement.plan import local_inventory\n"
        "inv = local_inventory()\n"
        "driver = any(os.path.exists(p) for k in all_kinds() for p in k.device_files)\n"
        "print(driver, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    driver, imported = out == ["True", "True"] or out == ["True", "False"], out[1] == "True"
    assert imported == (out[0] == "True"), out


# ==========================================================================================================
# components.train / components.evaluate
# ==========================================================================================================

from heteroflow.components.models.evaluate import classification_report, evaluate  # noqa: E402
from heteroflow.components.training.step import load_model, train  # noqa: E402


@pytest.fixture(scope="module")
def trained_30(tmp_path_factory: pytest.TempPathFactory, digits_shards: Path):
    """A model trained for the default 30 epochs on the digits shards (once per module)."""
    root = tmp_path_factory.mktemp("trained-30")
    result = train(digits_shards, root / "model", epochs=30, checkpoint_root=root / "checkpoints")
    return result


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_train_few_epochs(digits_shards: Path, tmp_path: Path):
    ckpt_root = tmp_path / "checkpoints"
    result = train(
        digits_shards, tmp_path / "model", epochs=3, checkpoint_every_steps=10, checkpoint_root=ckpt_root
    )
    n_train = read_meta(digits_shards)["counts"]["train"]
    steps_per_epoch = math.ceil(n_train / 64)
    assert result.model_dir == tmp_path / "model"
    assert (result.model_dir / "model.pt").is_file()
    config = json.loads((result.model_dir / "model.json").read_text())
    assert config["in_features"] == 64
    assert config["num_classes"] == 10
    assert config["classes"] == [str(i) for i in range(10)]
    assert config["steps"] == 3 * steps_per_epoch
    assert config["params"]["epochs"] == 3
    # the device is recorded beside the parameters, not among them (the checkpoint key ignores devices: issue 14)
    assert "device_type" not in config["params"] and config["device"] == "cpu" and config["device_kind"] == "cpu"
    assert result.steps == 3 * steps_per_epoch
    assert result.resumed_from_step == 0
    assert result.checkpoints_written == (3 * steps_per_epoch - 1) // 10
    assert result.checkpoints_written > 0
    assert result.device == "cpu"
    assert result.validation_accuracy is not None and result.validation_accuracy > 0.8
    assert math.isfinite(result.final_loss) and result.final_loss > 0
    # checkpoints were written, then their folder removed once the model was complete
    assert ckpt_root.is_dir()
    assert list(ckpt_root.iterdir()) == []
    # nothing but the model folder beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "model"]
    model, cfg = load_model(result.model_dir)
    assert cfg == config
    assert not model.training


def test_train_default_checkpoint_root_is_under_home(digits_shards: Path, tmp_path: Path, heteroflow_home: Path):
    train(digits_shards, tmp_path / "model", epochs=1, checkpoint_every_steps=5)
    ckpts = heteroflow_home / "checkpoints"
    assert ckpts.is_dir()  # it was used ...
    assert list(ckpts.iterdir()) == []  # ... and cleaned up


def test_train_is_deterministic_on_cpu(digits_shards: Path, tmp_path: Path):
    import torch

    a = train(digits_shards, tmp_path / "a", epochs=1, seed=5, checkpoint_root=tmp_path / "c")
    b = train(digits_shards, tmp_path / "b", epochs=1, seed=5, checkpoint_root=tmp_path / "c")
    sa = torch.load(a.model_dir / "model.pt", weights_only=True)
    sb = torch.load(b.model_dir / "model.pt", weights_only=True)
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


INVALID_TRAIN = [
    (dict(epochs=0), r"^epochs=0 is out of range; valid: an integer >= 1"),
    (dict(epochs=-2), r"^epochs=-2 is out of range"),
    (dict(epochs=1.5), r"^epochs=1\.5 is out of range"),
    (dict(epochs=True), r"^epochs=True is out of range"),
    (dict(batch_size=0), r"^batch_size=0 is out of range"),
    (dict(hidden_units=0), r"^hidden_units=0 is out of range"),
    (dict(checkpoint_every_steps=0), r"^checkpoint_every_steps=0 is out of range"),
    (dict(learning_rate=0.0), r"^learning_rate=0\.0 is out of range"),
    (dict(device="quantum"), r"^device='quantum' is not a torch device"),
]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    INVALID_TRAIN,
    ids=["epochs-0", "epochs-neg", "epochs-float", "epochs-bool", "batch-0", "hidden-0", "ckpt-0", "lr-0", "device"],
)
def test_train_invalid_parameters(digits_shards: Path, tmp_path: Path, kwargs: dict, pattern: str):
    with pytest.raises(InvalidParameter, match=pattern):
        train(digits_shards, tmp_path / "model", **kwargs)
    assert not (tmp_path / "model").exists()


def test_train_on_cuda_without_cuda_raises_device_unavailable(digits_shards: Path, tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip(reason="cuda is available here: device='cuda' is usable, so DeviceUnavailable cannot be tested")
    with pytest.raises(DeviceUnavailable, match=r"^device='cuda': no CUDA device is available"):
        train(digits_shards, tmp_path / "model", device="cuda", epochs=1)
    assert not (tmp_path / "model").exists()
    assert issubclass(DeviceUnavailable, RuntimeError)


def test_train_on_npu_without_torch_npu_raises_device_unavailable(digits_shards: Path, tmp_path: Path):
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip(reason="torch_npu is installed here: an npu device may exist (npu environment)")
    with pytest.raises(DeviceUnavailable, match=r"^device='npu': torch_npu is not installed"):
        train(digits_shards, tmp_path / "model", device="npu", epochs=1)


def test_train_on_non_dataset_raises(tmp_path: Path):
    with pytest.raises(DatasetError, match="is not a preprocessed data set"):
        train(tmp_path, tmp_path / "model", epochs=1)


def test_load_model_missing(tmp_path: Path):
    with pytest.raises(CheckpointError, match="is not a heteroflow model"):
        load_model(tmp_path / "nothing")


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["seed0", "seed1", "seed2"])
def test_classification_report_matches_sklearn(seed: int):
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_score, recall_score

    rng = np.random.default_rng(seed)
    k = 6
    # class 5 is never predicted (precision 0/0) and class 4 never occurs (recall 0/0)
    y_true = rng.choice([0, 1, 2, 3, 5], size=200)
    y_pred = np.where(rng.random(200) < 0.6, y_true, rng.integers(0, 5, size=200))
    y_pred[y_pred == 5] = 0
    labels = list(range(k))
    acc, precision, recall, cm = classification_report(y_true, y_pred, k)
    assert acc == pytest.approx(accuracy_score(y_true, y_pred))
    np.testing.assert_allclose(precision, precision_score(y_true, y_pred, labels=labels, average=None, zero_division=0))
    np.testing.assert_allclose(recall, recall_score(y_true, y_pred, labels=labels, average=None, zero_division=0))
    np.testing.assert_array_equal(cm, confusion_matrix(y_true, y_pred, labels=labels))
    assert precision[5] == 0.0 and recall[4] == 0.0


def test_classification_report_perfect_and_empty():
    y = np.array([0, 1, 2, 2])
    acc, precision, recall, cm = classification_report(y, y, 3)
    assert acc == 1.0
    assert precision.tolist() == [1.0, 1.0, 1.0]
    assert recall.tolist() == [1.0, 1.0, 1.0]
    assert cm.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 2]]
    acc, precision, recall, cm = classification_report(np.array([], dtype=int), np.array([], dtype=int), 2)
    assert acc == 0.0
    assert cm.sum() == 0


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_evaluate_trained_model(trained_30, digits_shards: Path):
    result = evaluate(digits_shards, trained_30.model_dir)
    _, y_test = load_split(digits_shards, "test")
    assert result.accuracy >= 0.9
    assert result.samples == len(y_test) == read_meta(digits_shards)["counts"]["test"]
    assert result.classes == tuple(str(i) for i in range(10))
    assert set(result.precision) == set(result.recall) == set(result.classes)
    assert all(0.0 <= v <= 1.0 for v in [*result.precision.values(), *result.recall.values()])
    cm = np.array(result.confusion_matrix)
    assert cm.shape == (10, 10)
    assert cm.sum() == result.samples
    np.testing.assert_array_equal(cm.sum(axis=1), np.bincount(y_test, minlength=10))
    assert np.trace(cm) / cm.sum() == pytest.approx(result.accuracy)
    assert result.device == "cpu"
    d = result.to_dict()
    assert json.loads(json.dumps(d)) == json.loads(json.dumps(dataclasses.asdict(result)))


def test_evaluate_missing_model(digits_shards: Path, tmp_path: Path):
    with pytest.raises(CheckpointError, match="run train first"):
        evaluate(digits_shards, tmp_path / "no-model")


# ==========================================================================================================
# components.archive
# ==========================================================================================================

from heteroflow.components.models import archive as archive_mod  # noqa: E402
from heteroflow.components.models.archive import ARCHIVE, archive, code_version, list_versions  # noqa: E402


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.pt").write_bytes(os.urandom(2048))
    (d / "model.json").write_text(json.dumps({"architecture": "mlp", "classes": ["0", "1"]}))
    return d


def _snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _incoming(root: Path) -> list[Path]:
    return [p for p in root.rglob(".incoming-*")]


def test_archive_v1_then_v2_never_overwrites(model_dir: Path, tmp_path: Path):
    root = tmp_path / "archive"
    lineage = {"dataset": {"dataset_sha256": "abc"}, "device": "cpu"}
    v1 = archive(model_dir, root, name="digits-mlp", metrics={"accuracy": 0.9}, lineage=lineage)
    assert v1.version == 1
    assert v1.path == root / "digits-mlp" / "v1"
    before = _snapshot(v1.path)
    assert set(before) == {"model/model.pt", "model/model.json", "metrics.json", "lineage.json"}
    assert before["model/model.pt"][0] == (model_dir / "model.pt").read_bytes()

    (model_dir / "model.pt").write_bytes(b"a different model")
    v2 = archive(model_dir, root, name="digits-mlp", metrics={"accuracy": 0.95}, lineage=lineage)
    assert v2.version == 2
    assert v2.path == root / "digits-mlp" / "v2"
    assert _snapshot(v1.path) == before  # v1 unchanged byte for byte
    assert (v2.path / "model" / "model.pt").read_bytes() == b"a different model"
    assert json.loads((v2.path / "metrics.json").read_text()) == {"accuracy": 0.95}
    assert json.loads((v1.path / "metrics.json").read_text()) == {"accuracy": 0.9}
    assert list_versions(root, "digits-mlp") == [1, 2]
    assert list_versions(root, "other") == []
    assert _incoming(root) == []


def test_archived_files_are_read_only(model_dir: Path, tmp_path: Path):
    result = archive(model_dir, tmp_path / "archive", name="m", metrics={}, lineage={})
    files = [p for p in result.path.rglob("*") if p.is_file()]
    assert len(files) == 4
    for p in files:
        assert p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) == 0, p
    if os.geteuid() != 0:  # root ignores permission bits
        with pytest.raises(PermissionError):
            (result.path / "metrics.json").write_text("tampered")


def test_archive_lineage_record(model_dir: Path, tmp_path: Path):
    lineage = {"dataset": {"dataset_sha256": "f00d", "files": 6}, "train": {"epochs": 3}, "device": "cuda:0"}
    result = archive(model_dir, tmp_path / "archive", name="model.v_1-x", metrics={"accuracy": 1.0}, lineage=lineage)
    on_disk = json.loads((result.path / "lineage.json").read_text())
    assert on_disk == result.lineage
    for key, value in lineage.items():
        assert on_disk[key] == value
    assert on_disk["version"] == 1
    assert on_disk["code"] == code_version()
    assert set(on_disk["code"]) == {"heteroflow", "git_commit"}
    assert on_disk["code"]["heteroflow"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", on_disk["archived_at"])
    assert lineage == {"dataset": {"dataset_sha256": "f00d", "files": 6}, "train": {"epochs": 3}, "device": "cuda:0"}


@pytest.mark.parametrize(
    "name",
    ["Digits", "", "-model", ".hidden", "a/b", "../escape", "with space", "x" * 64],
    ids=["upper", "empty", "leading-dash", "leading-dot", "slash", "dotdot", "space", "too-long"],
)
def test_archive_bad_name(model_dir: Path, tmp_path: Path, name: str):
    with pytest.raises(InvalidParameter, match=r"^(model_name=.* is not a valid model name|name is empty)"):
        archive(model_dir, tmp_path / "archive", name=name, metrics={}, lineage={})
    assert not (tmp_path / "archive").exists()


def test_archive_missing_model_dir(tmp_path: Path):
    with pytest.raises(ArchiveError, match=r"model folder .*nope does not exist"):
        archive(tmp_path / "nope", tmp_path / "archive", name="m", metrics={}, lineage={})
    assert list_versions(tmp_path / "archive", "m") == []


def test_archive_takes_next_version_when_another_writer_wins(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = tmp_path / "archive"
    real_rename = os.rename
    raced = []

    def racing_rename(src, dst):
        if not raced and Path(dst).name == "v1":
            raced.append(dst)
            Path(dst).mkdir()
            (Path(dst) / "theirs.txt").write_text("another writer's v1")
        return real_rename(src, dst)

    monkeypatch.setattr(archive_mod.os, "rename", racing_rename)
    result = archive(model_dir, root, name="m", metrics={}, lineage={})
    assert raced
    assert result.version == 2
    assert (root / "m" / "v1" / "theirs.txt").read_text() == "another writer's v1"
    assert sorted(p.name for p in (root / "m" / "v1").iterdir()) == ["theirs.txt"]
    assert json.loads((result.path / "lineage.json").read_text())["version"] == 2
    assert _incoming(root) == []


def test_archive_failure_leaves_no_incoming_folder(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "archive"

    def broken_rename(src, dst):
        raise PermissionError(13, "Permission denied (simulated)")

    monkeypatch.setattr(archive_mod.os, "rename", broken_rename)
    with pytest.raises(PermissionError, match="simulated"):
        archive(model_dir, root, name="m", metrics={}, lineage={})
    assert _incoming(root) == []
    assert list_versions(root, "m") == []


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_archive_a_trained_model(trained_30, tmp_path: Path):
    result = archive(trained_30.model_dir, tmp_path / "archive", name="digits", metrics={"accuracy": 0.97}, lineage={})
    model, config = load_model(result.path / "model")
    assert config["num_classes"] == 10
    assert _tree_bytes(result.path / "model") == _tree_bytes(trained_30.model_dir)


def _real_archive(model_dir: Path, root: Path, run_id: str) -> Any:
    """What another run's archive step leaves: a complete version with its lineage."""
    return archive(model_dir, root, name="m", metrics={}, lineage={"run_id": run_id})


def test_sigterm_after_the_archive_rename_then_an_identical_rerun_keeps_one_version(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """#28.8: a stop after the rename, before the step's bookkeeping, made the identical rerun archive v2."""
    import signal

    root = tmp_path / "archive"
    real_rename = os.rename

    def rename_then_sigterm(src, dst):
        real_rename(src, dst)
        os.kill(os.getpid(), signal.SIGTERM)  # the CLI's handler turns it into KeyboardInterrupt

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    monkeypatch.setattr(archive_mod.os, "rename", rename_then_sigterm)
    try:
        with pytest.raises(KeyboardInterrupt):
            archive(model_dir, root, name="m", metrics={"accuracy": 0.9}, lineage={"run_id": "first"})
    finally:
        signal.signal(signal.SIGTERM, previous)
        monkeypatch.setattr(archive_mod.os, "rename", real_rename)
    assert list_versions(root, "m") == [1]
    before = _snapshot(root / "m" / "v1")

    again = archive(model_dir, root, name="m", metrics={"accuracy": 0.9}, lineage={"run_id": "rerun"})
    assert (again.version, again.existing, again.path) == (1, True, root / "m" / "v1")
    assert again.lineage["run_id"] == "first" and again.lineage["model_sha256"] == archive_mod.content_sha256(model_dir)
    assert list_versions(root, "m") == [1]
    assert _snapshot(root / "m" / "v1") == before
    assert _incoming(root) == []
    assert ARCHIVE.summarize(ARCHIVE.to_facts(again)) == [
        f"archived: {root / 'm' / 'v1'} (version 1, already archived: the same model)"
    ]


def test_a_version_archived_before_hashes_were_recorded_is_recognised_by_its_files(model_dir: Path, tmp_path: Path):
    """#28.8 sibling: an archive written before ``model_sha256`` existed is hashed from its files."""
    root = tmp_path / "archive"
    old = root / "m" / "v1"
    shutil.copytree(model_dir, old / "model")
    (old / "lineage.json").write_text(json.dumps({"version": 1, "run_id": "old"}))
    result = archive(model_dir, root, name="m", metrics={}, lineage={})
    assert (result.version, result.existing) == (1, True)
    (model_dir / "model.pt").write_bytes(b"retrained")
    assert archive(model_dir, root, name="m", metrics={}, lineage={}).version == 2


def test_two_identical_runs_archiving_at_once_give_one_version(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """#28.8 sibling: the other writer claims v1 with the same model between our look and our rename."""
    root = tmp_path / "archive"
    real_rename = os.rename
    twin = tmp_path / "twin"
    shutil.copytree(model_dir, twin)

    def racing_rename(src, dst):
        if Path(dst).name == "v1" and not Path(dst).exists():
            monkeypatch.setattr(archive_mod.os, "rename", real_rename)
            _real_archive(twin, root, "other")
        return real_rename(src, dst)

    monkeypatch.setattr(archive_mod.os, "rename", racing_rename)
    result = archive(model_dir, root, name="m", metrics={}, lineage={"run_id": "mine"})
    assert (result.version, result.existing, result.lineage["run_id"]) == (1, True, "other")
    assert list_versions(root, "m") == [1]
    assert _incoming(root) == []


def test_a_run_that_loses_the_version_to_another_says_which_run_took_it(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """#28.9: the second of two runs archiving at once took v2 silently."""
    root = tmp_path / "archive"
    real_rename = os.rename
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "model.pt").write_bytes(b"their model")

    def racing_rename(src, dst):
        if Path(dst).name == "v1" and not Path(dst).exists():
            monkeypatch.setattr(archive_mod.os, "rename", real_rename)
            _real_archive(theirs, root, "run-x")
        return real_rename(src, dst)

    monkeypatch.setattr(archive_mod.os, "rename", racing_rename)
    result = archive(model_dir, root, name="m", metrics={}, lineage={"run_id": "mine"})
    taken_at = json.loads((root / "m" / "v1" / "lineage.json").read_text())["archived_at"]
    expected = f"archived as v2: v1 was taken by run run-x at {taken_at}"
    assert (result.version, result.existing, result.note) == (2, False, expected)
    assert json.loads((result.path / "lineage.json").read_text())["version_note"] == expected
    facts = ARCHIVE.to_facts(result)
    assert facts["note"] == expected  # the step's facts: the run record's details
    assert ARCHIVE.summarize(facts) == [f"archived: {result.path} (version 2)", expected]  # the console
    assert list_versions(root, "m") == [1, 2]
    assert (root / "m" / "v1" / "model" / "model.pt").read_bytes() == b"their model"


def test_a_version_taken_by_an_unknown_writer_is_named_so(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """#28.9 sibling: a v1 with no readable lineage (not heteroflow's) still gets a note, naming no run."""
    root = tmp_path / "archive"
    real_rename = os.rename

    def racing_rename(src, dst):
        if Path(dst).name == "v1" and not Path(dst).exists():
            Path(dst).mkdir()
            (Path(dst) / "theirs.txt").write_text("x")
        return real_rename(src, dst)

    monkeypatch.setattr(archive_mod.os, "rename", racing_rename)
    result = archive(model_dir, root, name="m", metrics={}, lineage={})
    assert result.note == "archived as v2: v1 was taken by another writer"


# ==========================================================================================================
# components.telemetry
# ==========================================================================================================

from heteroflow.components.core.telemetry import RUN_DIR_ENV, read_step_records, step_attempt  # noqa: E402


def test_step_attempt_records_each_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    step_dir = run_dir / "steps" / "train"

    with step_attempt("train", device="cuda") as rec:
        running = json.loads((step_dir / "attempt-1.json").read_text())
        rec.details = {"samples_per_second": 123.0}
        rec.compute_seconds = 0.5
    assert running["status"] == "running"
    assert running["attempt"] == 1
    first = json.loads((step_dir / "attempt-1.json").read_text())
    assert first["status"] == "succeeded"
    assert first["device"] == "cuda"
    assert first["details"] == {"samples_per_second": 123.0}
    assert first["compute_seconds"] == 0.5
    assert first["error"] is None
    assert first["seconds"] is not None and first["seconds"] >= 0
    assert first["ended_at"] >= first["started_at"] > 0

    with pytest.raises(RuntimeError, match="boom"):
        with step_attempt("train", device="cuda"):
            raise RuntimeError("boom")
    second = json.loads((step_dir / "attempt-2.json").read_text())
    assert second["attempt"] == 2
    assert second["status"] == "failed"
    assert second["error"] == "RuntimeError: boom"

    records = read_step_records(run_dir)
    assert list(records) == ["train"]
    assert [(r.attempt, r.status) for r in records["train"]] == [(1, "succeeded"), (2, "failed")]
    # no temp files; the failed attempt's whole traceback beside its record
    assert sorted(p.name for p in step_dir.iterdir()) == ["attempt-1.json", "attempt-2.json", "attempt-2.traceback.txt"]
    assert second["traceback_file"] == str(step_dir / "attempt-2.traceback.txt")


def test_step_attempt_writes_nothing_without_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with step_attempt("prewarm") as rec:
        pass
    assert rec.attempt == 1
    assert rec.status == "succeeded"
    with pytest.raises(ValueError):
        with step_attempt("prewarm") as rec2:
            raise ValueError("bad")
    assert rec2.attempt == 1
    assert rec2.status == "failed"
    assert sorted(tmp_path.rglob("*")) == before
    assert read_step_records(tmp_path) == {}


# ==========================================================================================================
# the shipped Steps, run through the shared runtime (what every engine calls)
# ==========================================================================================================

from heteroflow.components.placement.plan import plan_step  # noqa: E402
from heteroflow.components.core.runtime import LocalArtifact, run_step  # noqa: E402
from heteroflow.components.steps import PLAN, PREPROCESS, PREWARM  # noqa: E402


def test_prewarm_step(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "run"))
    dataset = LocalArtifact(str(tmp_path / "artifacts" / "dataset"))
    cache_root = tmp_path / "cache-tier"
    out = run_step(PREWARM, params={"source_uri": str(digits_dir), "cache_root": str(cache_root)}, outputs={"dataset": dataset})
    assert out.status == "succeeded", out.reason
    facts = out.facts

    cache_dir = cache_root / cache_key(str(digits_dir))
    manifest = Manifest.load(Path(dataset.path) / MANIFEST_NAME)
    assert manifest == Manifest.load(cache_dir / MANIFEST_NAME)
    n = len(list(digits_dir.iterdir()))
    assert facts["files"] == n
    assert facts["files_copied"] == n
    assert facts["files_skipped"] == 0
    assert facts["dataset_sha256"] == manifest.dataset_sha256
    assert facts["total_bytes"] == manifest.total_bytes == facts["bytes_copied"]
    assert Path(facts["cache_dir"]) == cache_dir.resolve() / "versions" / manifest.version  # the version's folder
    assert facts["source_uri"] == str(digits_dir)

    again = run_step(
        PREWARM, params={"source_uri": str(digits_dir), "cache_root": str(cache_root)}, outputs={"dataset": str(tmp_path / "d2")}
    )
    assert again.facts["files_copied"] == 0
    assert again.facts["files_skipped"] == n

    records = read_step_records(tmp_path / "run")["prewarm"]
    assert [(r.attempt, r.status) for r in records] == [(1, "succeeded"), (2, "succeeded")]
    assert records[0].details["files_copied"] == n
    assert records[1].details["files_copied"] == 0
    assert records[0].compute_seconds is not None


def test_prewarm_step_default_cache_root(digits_dir: Path, tmp_path: Path, heteroflow_home: Path):
    out = run_step(PREWARM, params={"source_uri": str(digits_dir)}, outputs={"dataset": str(tmp_path / "ds")})
    expected = heteroflow_home / "cache" / cache_key(str(digits_dir))
    assert Path(out.facts["cache_dir"]).parent.parent == expected.resolve()  # <data set folder>/versions/<version>
    assert (expected / MANIFEST_NAME).is_file()


def test_prewarm_step_failure_is_recorded_and_classified_permanent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "run"))
    dataset = LocalArtifact(str(tmp_path / "ds"))
    out = run_step(PREWARM, params={"source_uri": str(tmp_path / "missing"), "cache_root": str(tmp_path / "c")}, outputs={"dataset": dataset})
    assert (out.status, out.failure, out.exit_code) == ("failed", "permanent", 3)
    assert "does not exist" in out.reason
    records = read_step_records(tmp_path / "run")["prewarm"]
    assert [(r.attempt, r.status, r.failure) for r in records] == [(1, "failed", "permanent")]
    assert "DatasetError: data set" in records[0].error
    assert dataset.metadata == {}


def _prewarmed(digits_dir: Path, tmp_path: Path) -> str:
    ds = str(tmp_path / "ds")
    assert run_step(PREWARM, params={"source_uri": str(digits_dir), "cache_root": str(tmp_path / "cache")}, outputs={"dataset": ds}).status == "succeeded"
    return ds


def test_preprocess_step(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dataset = _prewarmed(digits_dir, tmp_path)
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "run"))
    shards = LocalArtifact(str(tmp_path / "artifacts" / "shards"))
    out = run_step(
        PREPROCESS,
        params={"validation_fraction": 0.15, "test_fraction": 0.15, "seed": 0, "num_workers": 1},
        inputs={"dataset": dataset},
        outputs={"shards": shards},
    )
    facts = out.facts
    assert sum(facts["counts"].values()) == DIGITS_SAMPLES
    assert facts["num_features"] == 64
    assert facts["num_classes"] == 10
    assert facts["num_workers"] == 1
    meta = read_meta(shards.path)
    assert meta["counts"] == facts["counts"]
    assert meta["dataset_sha256"] == Manifest.load(Path(dataset) / MANIFEST_NAME).dataset_sha256
    records = read_step_records(tmp_path / "run")["preprocess"]
    assert [(r.attempt, r.status) for r in records] == [(1, "succeeded")]
    assert records[0].details == facts


def test_preprocess_step_zero_workers_means_all_cores(digits_dir: Path, tmp_path: Path):
    from heteroflow.components.data.preprocess import available_cpus

    dataset = _prewarmed(digits_dir, tmp_path)
    out = run_step(
        PREPROCESS,
        params={"validation_fraction": 0.2, "test_fraction": 0.1, "seed": 4, "num_workers": 0},
        inputs={"dataset": dataset},
        outputs={"shards": str(tmp_path / "shards")},
    )
    assert out.facts["num_workers"] == min(available_cpus(), 4)  # at most one process per CSV part
    assert sum(out.facts["counts"].values()) == DIGITS_SAMPLES


def test_preprocess_step_invalid_parameter_is_permanent(digits_dir: Path, tmp_path: Path):
    dataset = _prewarmed(digits_dir, tmp_path)
    shards = LocalArtifact(str(tmp_path / "shards"))
    out = run_step(
        PREPROCESS, params={"validation_fraction": 0.1, "test_fraction": 0.0}, inputs={"dataset": dataset}, outputs={"shards": shards}
    )
    assert (out.status, out.failure) == ("failed", "permanent")
    assert out.reason.startswith("InvalidParameter: test_fraction=0.0 is out of range")
    assert shards.metadata == {}
    assert not Path(shards.path).exists()


def test_plan_step_places_each_call(tmp_path: Path):
    import torch

    placement = LocalArtifact(str(tmp_path / "placement.json"))
    placements = {
        "train": Candidates(["gpu:count=1,memory=16Gi", "cpu:cpu=2"]).to_json(),
        "evaluate": Candidates(["cpu:cpu=1"]).to_json(),
    }
    out = run_step(PLAN, outputs={"placement": placement}, placements=placements)
    assert out.status == "succeeded", out.reason
    decision = json.loads(Path(placement.path).read_text())
    assert decision == out.facts["placements"]
    expected = 0 if torch.cuda.is_available() else 1
    assert out.facts["indices"] == {"train": expected, "evaluate": 0}
    if expected == 1:
        assert "candidate 0" in decision["train"]["passed_over"][0]


def test_preprocess_rejects_a_class_too_small_for_the_test_split(tmp_path: Path):
    src = tmp_path / "tiny-class"
    src.mkdir()
    # class 1 has 3 samples: 15% of 3 rounds to 0, so it would be absent from test (no per-class metrics for it)
    (src / "a.csv").write_text("x,label\n" + "".join(f"{i % 7},0\n" for i in range(40)) + "97,1\n98,1\n99,1\n")
    with pytest.raises(DatasetError, match=r"class '1' has 3 samples: too few to put at least one in test"):
        preprocess(src, tmp_path / "out", num_workers=1)
    assert not (tmp_path / "out").exists()


def test_archive_skips_a_stray_file_named_like_a_version(tmp_path: Path):
    from heteroflow.components.models.archive import archive

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.pt").write_bytes(b"weights")
    (tmp_path / "archive" / "m").mkdir(parents=True)
    (tmp_path / "archive" / "m" / "v1").write_text("not an archive version")
    result = archive(model, tmp_path / "archive", name="m", metrics={}, lineage={})
    assert result.version == 2
    assert (tmp_path / "archive" / "m" / "v1").read_text() == "not an archive version"


def test_whole_float_labels_become_integer_classes(tmp_path: Path):
    src = tmp_path / "floats"
    src.mkdir()
    rows = "".join(f"{i % 7},{'0.000000000000000000e+00' if i % 2 else '3.0'}\n" for i in range(40))
    (src / "a.csv").write_text("a,label\n" + rows)
    r = preprocess(src, tmp_path / "out", num_workers=1)
    assert r.classes == ("0", "3")
    assert r.report["class_counts"] == {"0": 20, "3": 20}
    (src / "a.csv").write_text("a,label\n" + rows + "40,2.5e0\n")
    with pytest.raises(DatasetError, match=r"class column 'label' \(the column named 'label'\) looks continuous: .*2\.5"):
        preprocess(src, tmp_path / "out", num_workers=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"gpu": 2}', {DeviceKind.CPU: 1, DeviceKind.GPU: 2}),
        ('{"npu": 8, "gpu": 0}', {DeviceKind.CPU: 1, DeviceKind.NPU: 8, DeviceKind.GPU: 0}),
        ("{}", {DeviceKind.CPU: 1}),
    ],
    ids=["gpu", "npu-and-no-gpu", "cpu-only"],
)
def test_inventory_from_json(text: str, expected: dict) -> None:
    assert dict(Inventory.from_json(text).devices) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nope", "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        ('{"tpu": 1}', r"^device_inventory: unknown field 'tpu', and not a device kind \(did you mean 'npu'\?\)"),
        ('{"gpu": -1}', r"^device_inventory: gpu=-1 is not a device count"),
        ('{"gpu": 1.5}', r"^device_inventory: gpu=1.5 is not a device count"),
    ],
    ids=["not-json", "not-object", "unknown-kind", "negative", "fraction"],
)
def test_inventory_from_json_rejects(text: str, match: str) -> None:
    with pytest.raises(InvalidParameter, match=match):
        Inventory.from_json(text)


def test_plan_step_uses_a_stated_inventory(tmp_path: Path) -> None:
    """On a cluster the plan pod has no accelerator: a stated inventory places training on the GPU candidate."""
    result = plan_step(
        str(tmp_path / "placement"),
        placements=json.dumps({"train": Candidates(["npu", "gpu", "cpu"]).to_json()}),
        device_inventory='{"gpu": 1}',
    )
    chosen = result.placements["train"]
    assert (result.indices["train"], chosen["torch_device"]) == (1, "cuda")
    assert chosen["passed_over"][0].endswith("needs 1 npu device(s); 0 npu device(s) here")
    assert json.loads((tmp_path / "placement").read_text())["train"]["index"] == 1


# --- placement by accelerator model ------------------------------------------------------------------------

MIXED = '{"gpu": {"t4": 4, "a100-80gb": 1}, "npu": {"910b3": 8, "310p": 4}}'


def test_inventory_counts_devices_per_model() -> None:
    inv = Inventory.from_json(MIXED)
    assert dict(inv.devices) == {DeviceKind.CPU: 1, DeviceKind.GPU: 5, DeviceKind.NPU: 12}
    assert dict(inv.models[DeviceKind.GPU]) == {"nvidia-t4": 4, "nvidia-a100-80gb": 1}
    assert inv.describe(DeviceKind.NPU) == "12 npu device(s): 4 x ascend-310p, 8 x ascend-910b3"


@pytest.mark.parametrize(
    ("candidates", "index", "why"),
    [
        # a family ("any 910B") matches its member 910B3
        ([Resources(kind="npu", accelerator="910B", count=8), "cpu"], 0, None),
        # 310P only: the 910B3s do not count, and the 4 310Ps are too few
        ([Resources(kind="npu", accelerator="310P", count=8), "cpu"], 1, "needs 8 x Ascend 310P on one model"),
        # both A100s are one family, but only one 80 GB device is here
        ([Resources(kind="gpu", accelerator="A100", count=2), "cpu"], 1, "needs 2 x any NVIDIA A100 on one model"),
        # device memory: the T4s (16 GB) are passed over, the A100 80 GB fits
        ([Resources(kind="gpu", count=1, device_memory="40Gi"), "cpu"], 0, None),
        ([Resources(kind="gpu", count=2, device_memory="40Gi"), "cpu"], 1, "with >= 40Gi device memory"),
    ],
    ids=["family-910b", "310p-too-few", "a100-family-too-few", "memory-fits-a100", "memory-too-few"],
)
def test_plan_matches_the_model_and_device_memory(candidates, index: int, why: str | None) -> None:
    placed = plan(Candidates(candidates), inventory=Inventory.from_json(MIXED))
    assert placed.index == index
    if why is not None:
        assert why in placed.passed_over[0]
        assert "here: " in placed.passed_over[0]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"gpu": {"nosuch-gpu": 1}}', r"^device_inventory: gpu model='nosuch-gpu' is unknown"),
        ('{"npu": {"910B": 8}}', r"names '910B', a family .*ascend-910b2"),
        ('{"gpu": {"910b3": 8}}', r"names '910b3', a npu model"),
        ('{"gpu": {"t4": -1}}', r"^device_inventory: gpu\.t4=-1 is not a device count"),
    ],
    ids=["unknown-model", "family", "wrong-kind", "negative"],
)
def test_inventory_models_rejected(text: str, match: str) -> None:
    with pytest.raises(InvalidParameter, match=match):
        Inventory.from_json(text)


def test_a_simulated_model_is_placed_by_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.placement.plan import current_inventory

    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "npu:ascend-310p")
    inv = current_inventory("")
    assert dict(inv.models[DeviceKind.NPU]) == {"ascend-310p": 8}
    placed = plan(Candidates([Resources(kind="npu", accelerator="910B3"), "npu:accelerator=310P", "cpu"]), inventory=inv)
    assert placed.index == 1
    assert "needs 1 x Ascend 910B3" in placed.passed_over[0]


def test_a_stated_inventory_keeps_its_counts_when_its_kinds_are_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: ``-c npu:count=2 --param device_inventory='{"npu": 1}' --simulate-devices npu,gpu`` was
    placed on npu: the simulation replaced the stated one npu by 8 (and added 8 gpus). A stated inventory describes
    the cluster; the simulation only lets a kind's steps run on this CPU. Without a stated one, the simulated kinds
    still appear (the sibling: the README's rehearsals)."""
    from heteroflow.components.placement.plan import current_inventory

    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "npu,gpu")
    inv = current_inventory('{"npu": 1}')
    assert inv.devices.get(DeviceKind.NPU) == 1 and not inv.devices.get(DeviceKind.GPU) and inv.simulated == (DeviceKind.NPU,)
    placed = plan(Candidates(["npu:count=2", "gpu", "cpu"]), inventory=inv)
    assert placed.index == 2, placed
    assert "needs 2 npu device(s)" in placed.passed_over[0], placed.passed_over
    local = current_inventory("")
    assert local.devices[DeviceKind.NPU] == local.devices[DeviceKind.GPU] == 8
    assert plan(Candidates(["npu:count=2", "gpu", "cpu"]), inventory=local).index == 0


def test_a_model_trained_on_a_dataset_factorys_data_is_archived_under_the_factorys_name(
        digits_shards: Path, digits_model: Path, tmp_path: Path):
    """A new user's run with ``dataset_factory=mydata:blobs`` on the default data set archived its model as the
    next ``digits-mlp``, which then failed on digits' rows: the factory's function name stands for the folder's."""
    import shutil

    from heteroflow.cache.prewarm import MANIFEST_NAME
    from heteroflow.components.models.archive import archive_step, default_model_name

    manifest = digits_shards.parent / "cache" / MANIFEST_NAME  # the conftest's prewarm
    (tmp_path / "eval.json").write_text("{}")

    def archived(model: Path) -> str:
        return archive_step(str(manifest.parent), str(digits_shards), str(model), str(tmp_path / "eval.json"),
                            str(tmp_path / "archived.json"), archive_root=str(tmp_path / "archive")).name

    theirs = tmp_path / "theirs"
    shutil.copytree(digits_model, theirs)
    config = json.loads((theirs / "model.json").read_text())
    config["params"]["dataset_factory"] = "mydata:blobs"
    (theirs / "model.json").write_text(json.dumps(config))
    assert archived(digits_model) == "digits-mlp" and archived(theirs) == "blobs-mlp"
    # the sibling: a factory's dotted attribute, and the runs list's name for a run that was not archived
    assert default_model_name("/data/digits", "digits_models:cnn", "pkg.data:Loaders.wine") == "wine-cnn"


def test_a_dataset_factorys_model_carries_neither_the_runs_table_transformation_nor_its_lineage(
        digits_shards: Path, digits_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Left from a new user's run with ``dataset_factory`` on the default data set: the model folder and the archive
    held digits' fitted transformation and class column, and the archive's lineage named digits (its sha256, its
    preprocess), though the model never saw a row of it. Now: no transformation, the factory as the data, and the
    archived model predicts the factory's samples. Sibling: model.json's hidden_units is what the model was built
    with (model_args), not train's default."""
    from typer.testing import CliRunner

    from heteroflow.cache.prewarm import MANIFEST_NAME, Manifest
    from heteroflow.components.models.archive import archive_step
    from heteroflow.components.models.predict import load_archived
    from heteroflow.components.training.step import train
    from heteroflow.pipelines.cli.main import app

    (tmp_path / "blobdata_f42.py").write_text(
        "import torch\n"
        "class Blobs(torch.utils.data.Dataset):\n"
        "    classes = ['low', 'high']\n"
        "    def __init__(self, n): self.n = n\n"
        "    def __len__(self): return self.n\n"
        "    def __getitem__(self, i): return torch.full((4,), float(i % 2) * 2 - 1), i % 2\n"
        "def make(split):\n"
        "    return Blobs(48 if split == 'train' else 16)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert any(digits_shards.glob("transform*"))  # the run's table has a fitted transformation to leave out
    out = train(digits_shards, tmp_path / "model", epochs=3, batch_size=8, learning_rate=0.01, loader_workers=0,
                dataset_factory="blobdata_f42:make", model_args='{"hidden_units": 16}', checkpoint_root=str(tmp_path / "ck"))
    config = json.loads((out.model_dir / "model.json").read_text())
    assert config["transformation"] is None and config["label_column"] is None
    assert not [p.name for p in out.model_dir.iterdir() if p.name.startswith("transform")]
    assert config["data"]["kind"] == "factory" and config["hidden_units"] == 16 == config["model"]["args"]["hidden_units"]
    from heteroflow.components.training.step import TRAIN, _train_facts, _trained_on_factory

    facts = _train_facts(out)  # the run's summary says which data trained the model (preprocess's line names digits)
    assert facts["dataset_factory"] == "blobdata_f42:make"
    assert TRAIN.summarize(facts)[0] == "train: trained on dataset_factory blobdata_f42:make's samples, not on the preprocessed data set"
    assert _trained_on_factory(digits_model) is None and _trained_on_factory(tmp_path / "no-model") is None  # siblings

    manifest = digits_shards.parent / "cache" / MANIFEST_NAME
    (tmp_path / "eval.json").write_text("{}")
    archived = archive_step(str(manifest.parent), str(digits_shards), str(out.model_dir), str(tmp_path / "eval.json"),
                            str(tmp_path / "archived.json"), archive_root=str(tmp_path / "archive"))
    lineage = json.loads((archived.path / "lineage.json").read_text())
    prewarmed = Manifest.load(manifest).source_uri
    assert lineage["dataset"] == {"dataset_factory": "blobdata_f42:make", "not_trained_on": prewarmed}
    assert "preprocess" not in lineage and archived.name == "make-mlp"  # named by the factory function
    assert lineage["data"]["kind"] == "factory"
    model = load_archived(archived.path)
    assert list(model.predict(np.array([[-1.0] * 4, [1.0] * 4], dtype=np.float32))) == ["low", "high"]
    (tmp_path / "rows.csv").write_text("a,b,c,d\n1,1,1,1\n")  # a user's table for a model that takes samples
    with pytest.raises(InvalidParameter, match=r"rows.csv: this model was trained on dataset_factory blobdata_f42:make's samples "
                                               r"of shape \(4,\), not on a table's rows or images; give it an array of shape \(n, \*that shape\)"):
        model.predict(str(tmp_path / "rows.csv"))
    said = CliRunner().invoke(app, ["predict", f"{archived.name}:v{archived.version}", str(tmp_path / "rows.csv"),
                                    "--root", str(tmp_path / "archive")], env={"COLUMNS": "300"})
    assert said.exit_code == 2 and "a .npy file" in said.output, said.output
    shown = CliRunner().invoke(app, ["archive", "show", f"{archived.name}:v{archived.version}", "--root", str(tmp_path / "archive")],
                               env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "dataset_factory blobdata_f42:make" in shown.output
    model_row = next(l for l in shown.output.splitlines() if l.startswith("model "))  # the arguments it was built with (piped: plain)
    assert '"hidden_units": 16' in model_row and '"factory": "heteroflow.components.training.loop:mlp"' in model_row


def test_a_rehearsals_model_is_archived_as_simulated(digits_dir: Path, tmp_path: Path, heteroflow_home: Path) -> None:
    """Trial finding: every rehearsal (`--simulate-devices gpu`) archived a new version listed with device `cpu`, while
    `heteroflow runs` said `gpu (sim)`: nothing told a real model from a rehearsal's. The model records the simulated
    kinds, and the archive's lineage (shown by `archive list` and `archive show`) says `gpu (simulated, on cpu)`."""
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    p = default_pipeline()
    p.replace("train", candidates=["gpu"])
    record = run_inprocess(p, {"dataset_uri": str(digits_dir), "epochs": 1, "model_name": "rehearsed"},
                           run_dir=tmp_path / "run", simulate_devices="gpu")
    assert record.status == "succeeded", record.error
    lineage = json.loads((heteroflow_home / "archive" / "rehearsed" / "v1" / "lineage.json").read_text())
    assert lineage["device"] == "gpu (simulated, on cpu)" and lineage["simulated"] == ["gpu"], lineage
    listed = CliRunner().invoke(app, ["archive", "list"])
    assert "gpu (simulated, on cpu)" in listed.stdout, listed.stdout
