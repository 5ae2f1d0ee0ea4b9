"""``heteroflow archive prune`` / ``cache prune`` (keep the newest N, never what a kept run's lineage names without
--force), ``load_archived("name:vN")`` and ``archive show`` printing class names literally."""

from __future__ import annotations

import csv
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.runs.folders import prune_archive, prune_cache


def _cli(*args: str) -> Any:
    from heteroflow.pipelines.cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def _archive(root: Path, name: str, versions: range) -> None:
    for v in versions:
        folder = root / name / f"v{v}"
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "weights.pt").write_bytes(b"w" * 10)
        (folder / "lineage.json").write_text(json.dumps({"run_id": f"run-{v}", "dataset": {"version": f"data-{v}"}}))
        (folder / "metrics.json").write_text("{}")
        for p in folder.rglob("*"):
            if p.is_file():
                p.chmod(stat.S_IRUSR)  # archived files are read-only


def _run_naming(runs: Path, run_id: str, model: str, version: int, data_version: str, *, path: str = "/somewhere",
                existing: bool = False, started_at: float = 1.0) -> None:
    folder = runs / run_id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "run_id": run_id, "status": "succeeded", "started_at": started_at,
        "results": {"prewarm": {"version": data_version, "dataset_sha256": "x"},
                    "archive": {"name": model, "version": version, "path": path, **({"existing": True} if existing else {})}},
    }))


def test_archive_prune_names_the_run_that_archived_a_version_not_the_newest_that_named_it(tmp_path: Path) -> None:
    """A review's reading: v1 was kept "as run B archived it" where B, the newest, had found the same model archived
    (its lineage said run A); a run of another archive root named it alike. All still keep it."""
    root, runs = tmp_path / "archive", tmp_path / "runs"
    _archive(root, "m", range(1, 3))
    here = str(root / "m" / "v1")
    _run_naming(runs, "run-a", "m", 1, "d", path=here, started_at=1.0)
    _run_naming(runs, "run-b", "m", 1, "d", path=here, existing=True, started_at=2.0)
    [entry] = prune_archive(1, archive_root=root, roots=[runs], dry_run=True)
    assert entry["action"] == "kept" and entry["reason"].startswith("run run-a archived it (its lineage names m:v1)")
    only_b = tmp_path / "runs-b"
    _run_naming(only_b, "run-b", "m", 1, "d", path=here, existing=True)
    assert prune_archive(1, archive_root=root, roots=[only_b], dry_run=True)[0]["reason"].startswith(
        "run run-b uses it (it found the same model archived)")
    elsewhere = tmp_path / "runs-c"
    _run_naming(elsewhere, "run-c", "m", 1, "d", path="/mnt/other/archive/m/v1")
    [kept] = prune_archive(1, archive_root=root, roots=[elsewhere], dry_run=True)
    assert kept["action"] == "kept" and kept["reason"].startswith("run run-c names m:v1 of the archive at /mnt/other/archive")


def test_archive_prune_keeps_the_newest_and_what_runs_name(tmp_path: Path) -> None:
    root, runs = tmp_path / "archive", tmp_path / "runs"
    _archive(root, "m", range(1, 6))
    _run_naming(runs, "kept-run", "m", 2, "data-2", path=str(root / "m" / "v2"))
    dry = prune_archive(2, archive_root=root, roots=[runs], dry_run=True)
    assert [(e["version"], e["action"]) for e in dry] == [(1, "would remove"), (2, "kept"), (3, "would remove")]
    assert sorted(p.name for p in (root / "m").iterdir()) == ["v1", "v2", "v3", "v4", "v5"]
    done = prune_archive(2, archive_root=root, roots=[runs])
    assert [(e["version"], e["action"]) for e in done] == [(1, "removed"), (2, "kept"), (3, "removed")]
    assert "run kept-run archived it" in done[1]["reason"]
    assert sorted(p.name for p in (root / "m").iterdir()) == ["v2", "v4", "v5"]  # nothing half removed is left
    assert [(e["version"], e["action"]) for e in prune_archive(2, archive_root=root, roots=[runs], force=True)] == [(2, "removed")]
    assert sorted(p.name for p in (root / "m").iterdir()) == ["v4", "v5"]
    with pytest.raises(InvalidParameter, match=r"keep=0 is not valid; valid: a whole number >= 1"):
        prune_archive(0, archive_root=root, roots=[runs])
    with pytest.raises(InvalidParameter, match=r"no archived model 'nope'.*archived: m"):
        prune_archive(1, model="nope", archive_root=root, roots=[runs])


def test_archive_prune_command(tmp_path: Path) -> None:
    root, runs = tmp_path / "archive", tmp_path / "runs"
    _archive(root, "m", range(1, 4))
    _run_naming(runs, "r", "m", 1, "d")
    result = _cli("archive", "prune", "--keep", "1", "--root", str(root), "--runs-root", str(runs))
    assert result.exit_code == 0, result.output
    assert "kept: m:v1" in result.output and "removed: m:v2" in result.output and "removed 1, kept 1" in result.output
    # what to do about the kept ones (a trial's --keep 3 removed nothing: every version was named by a run)
    assert "remove the runs you no longer need (heteroflow runs lists them, with their folders), or add --force" in " ".join(result.output.split())
    assert _cli("archive", "prune", "--keep", "0", "--root", str(root)).exit_code == 2


def test_cache_prune_keeps_current_and_named_versions(tmp_path: Path, digits_dir: Path) -> None:
    import os
    import time

    from heteroflow.cache.prewarm import cache_key, prewarm
    from heteroflow.cache.status import cache_status

    cache, src = tmp_path / "cache", tmp_path / "src"
    src.mkdir()
    first = (digits_dir / sorted(os.listdir(digits_dir))[0]).read_text()
    versions = []
    for i in range(4):  # four versions of a changing data set
        (src / "data.csv").write_text(first + "\n".join([first.splitlines()[1]] * (i + 1)) + "\n")
        versions.append(prewarm(str(src), cache / cache_key(str(src)), keep_versions=10).manifest.version)
        time.sleep(0.01)
    assert len(set(versions)) == 4
    runs = tmp_path / "runs"
    _run_naming(runs, "uses-second", "m", 1, versions[1])
    out = prune_cache(2, cache_root=str(cache), roots=[runs], archive_root=tmp_path / "no-archive")
    assert {e["version"]: e["action"] for e in out} == {versions[1]: "kept", versions[0]: "removed"}
    left = {v.version for s in cache_status(str(cache)) for v in s.versions}
    assert left == {versions[3], versions[2], versions[1]}
    out = prune_cache(1, cache_root=str(cache), roots=[runs], archive_root=tmp_path / "no-archive", force=True)
    assert {e["version"] for e in out if e["action"] == "removed"} == {versions[2], versions[1]}
    current = [v for s in cache_status(str(cache)) for v in s.versions]
    assert [(v.version, v.current) for v in current] == [(versions[3], True)]
    result = _cli("cache", "prune", "--cache", str(cache), "--keep", "1")
    assert result.exit_code == 0 and "nothing to prune" in result.output


@pytest.mark.slow
def test_bracketed_class_names_archive_show_and_load_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run on iris with class names like ``[setosa]``: ``archive show`` prints them literally,
    ``load_archived("iris-mlp:v1")`` predicts them, and ``archive prune`` keeps the version the run names."""
    from sklearn.datasets import load_iris

    from heteroflow.components.models.predict import load_archived
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    data = tmp_path / "iris"
    data.mkdir()
    iris = load_iris()
    with open(data / "iris.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sepal_length", "sepal_width", "petal_length", "petal_width", "label"])
        for x, y in zip(iris.data, iris.target):
            w.writerow([*x, f"[{iris.target_names[y]}]"])
    monkeypatch.chdir(tmp_path)
    for n in (1, 2):
        # a different number of epochs each: a different model, a new version (#28.8: the same model is one version)
        record = run_inprocess(default_pipeline(), {"dataset_uri": str(data), "epochs": 1 + n}, run_dir=tmp_path / "heteroflow-runs" / f"run-{n}")
        assert record.status == "succeeded"
    shown = _cli("archive", "show", "iris-mlp:v1")
    assert shown.exit_code == 0, shown.output
    for name in ("[setosa]", "[versicolor]", "[virginica]"):
        assert f"precision[{name}]" in shown.output and f"recall[{name}]" in shown.output
    model = load_archived("iris-mlp:v1")
    assert set(model.classes) == {"[setosa]", "[versicolor]", "[virginica]"}
    assert model.predict([dict(zip(["sepal_length", "sepal_width", "petal_length", "petal_width"], iris.data[0]))])[0] == "[setosa]"
    assert load_archived("iris-mlp").model_dir == tmp_path / "hf-home" / "archive" / "iris-mlp" / "v2" / "model"
    with pytest.raises(InvalidParameter, match=r"iris-mlp has no version v7; versions: v1, v2"):
        load_archived("iris-mlp:v7")
    result = _cli("archive", "prune", "iris-mlp", "--keep", "1")
    assert result.exit_code == 0 and "kept: iris-mlp:v1" in result.output  # run-1 (kept in ./heteroflow-runs) names it
    import shutil

    shutil.rmtree(tmp_path / "heteroflow-runs" / "run-1")
    assert "removed: iris-mlp:v1" in _cli("archive", "prune", "iris-mlp", "--keep", "1").output


def test_archive_show_prints_class_names_literally(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    _archive(root, "iris-mlp", range(1, 2))
    metrics = root / "iris-mlp" / "v1" / "metrics.json"
    metrics.chmod(stat.S_IRUSR | stat.S_IWUSR)
    metrics.write_text(json.dumps({"accuracy": 0.9, "precision": {"[setosa]": 1.0, "[bold]x": 0.5}, "recall": {"[setosa]": 0.75, "[bold]x": 0.25}}))
    result = _cli("archive", "show", "iris-mlp:v1", "--root", str(root))
    assert result.exit_code == 0, result.output
    assert "precision[[setosa]]" in result.output and "recall[[bold]x]" in result.output
