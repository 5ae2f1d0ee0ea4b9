"""Command-line inputs a review found crashing or misreported, each with its own small input: ``simulate --json``
into a folder that does not exist yet or onto a folder, ``predict`` of a file that is not a numeric .npy, ``-o`` onto
a folder (the error named a temporary file), a run folder whose name holds ``[...]`` (rich markup ate it),
``cache prune`` of a data set that matches nothing, ``archive export NAME:2`` (not ``vN``) and ``manifests``
without ``--profile`` (it blamed a profile never given)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.pipelines.cli.main import app

ROOT = Path(__file__).resolve().parent.parent


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    return result.exit_code, " ".join(result.output.split())


def test_simulate_json_makes_its_folder_and_names_a_folder_in_its_way(tmp_path: Path) -> None:
    code, _ = _invoke(["simulate", "--trace", "gavel:12:6:0", "--policy", "fifo", "--json", str(tmp_path / "new" / "s.json")])
    assert code == 0 and (tmp_path / "new" / "s.json").is_file()  # was: unexpected FileNotFoundError, exit 1
    (tmp_path / "adir").mkdir()
    code, said = _invoke(["simulate", "--trace", "gavel:12:6:0", "--policy", "fifo", "--json", str(tmp_path / "adir")])
    assert code == 2 and f"error: cannot use {tmp_path / 'adir'}: a folder is there; give a file path" in said


def test_predict_of_a_file_that_is_no_numeric_npy_is_one_line(digits_model: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.npy").write_text("junk\n")
    code, said = _invoke(["predict", str(digits_model), str(tmp_path / "bad.npy")])
    assert code == 2 and f"error: {tmp_path / 'bad.npy'} is not a .npy array of numbers" in said and "unexpected" not in said


def test_output_onto_a_folder_names_the_folder_not_a_temporary_file(digits_model: Path, digits_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    table = sorted(digits_dir.glob("*.csv"))[0]
    code, said = _invoke(["predict", str(digits_model), str(table), "-o", str(tmp_path / "adir")])
    assert code == 2 and said.startswith(f"error: cannot use {tmp_path / 'adir'}: a folder is there; give a file path"), said
    from heteroflow.cache.atomic import atomic_write_bytes

    with pytest.raises(IsADirectoryError) as err:
        atomic_write_bytes(tmp_path / "adir", b"x")
    assert err.value.filename == str(tmp_path / "adir")


def test_the_run_summary_prints_a_folder_with_brackets_as_it_is(tmp_path: Path) -> None:
    """`--output "résumé [x]"` printed '.../résumé /report.html': rich read [x] as markup."""
    from heteroflow.pipelines.cli import summary
    from heteroflow.pipelines.runs.records import RunRecord

    folder = tmp_path / "résumé [x]"
    folder.mkdir()
    (folder / "report.html").write_text("<html></html>")
    record = RunRecord(run_id="r", pipeline="p", status="succeeded", run_dir=str(folder), started_at=0.0, wall_seconds=1.0,
                       params={}, steps=[], fallbacks=[], metrics={}, results={}, placement={})
    with summary.console.capture() as captured:
        summary._print_record(record, type("P", (), {"calls": []})())
    said = captured.get()
    assert f"report: {folder}/report.html" in said and f"record: {folder}/run.json" in said


def test_cache_prune_of_a_data_set_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    code, said = _invoke(["cache", "prune", "nomatch", "--dry-run", "--cache", str(tmp_path / "tier")])
    assert code == 2 and "no data set matching 'nomatch' in the cache tier" in said  # was: "nothing to prune", exit 0


@pytest.mark.parametrize("version", ["2", "vv1"])
def test_archive_export_reads_the_version_as_archive_show_does(tmp_path: Path, version: str) -> None:
    code, said = _invoke(["archive", "export", f"digits-mlp:{version}", "--format", "onnx", "-o", str(tmp_path / "m.onnx"),
                          "--root", str(tmp_path / "archive")])
    assert code == 2 and f"'digits-mlp:{version}': the version is written vN, e.g. digits-mlp:v2" in said


def test_manifests_without_a_profile_say_none_was_given(tmp_path: Path) -> None:
    code, said = _invoke(["manifests", "--inventory", str(ROOT / "examples" / "manifests" / "inventory.yaml"), "-o", str(tmp_path / "m")])
    assert code == 1
    assert "note: no train-0-npu.yaml: no --profile was given, and the default one names no image for npu; give --image, or --profile FILE with images.npu" in said
    assert "the profile names no image" not in said


def _a_run(tmp_path: Path) -> Path:
    """A runs folder holding one well-formed record."""
    import json

    root = tmp_path / "runs"
    good = root / "20261205-000000-good"
    good.mkdir(parents=True)
    record = {"run_id": good.name, "pipeline": "p", "status": "succeeded", "run_dir": str(good), "started_at": 1.0e9,
              "wall_seconds": 2.0, "params": {}, "steps": [{"name": "train", "status": "succeeded", "kind": "cpu", "candidate": 0}],
              "fallbacks": [], "metrics": {}, "results": {}, "placement": {}}
    (good / "run.json").write_text(json.dumps(record))
    return root


@pytest.mark.parametrize(("content", "why"), [
    ("", "is not valid JSON"),
    ('{"run_id": "c1", "steps": [1]}', "steps is not a list of objects"),
    ('{"run_id": "c1", "started_at": "yesterday"}', "started_at='yesterday' is not a number of seconds"),
])
def test_a_damaged_record_is_named_and_the_other_runs_still_list(tmp_path: Path, content: str, why: str) -> None:
    """A review's inputs: an empty run.json made `runs show ID` say "no run"; one record with "steps": [1] (or a
    started_at of text) made `heteroflow runs` fail for every run with an AttributeError (a TypeError)."""
    root = _a_run(tmp_path)
    bad = root / "20261205-000001-c1"
    bad.mkdir()
    (bad / "run.json").write_text(content)
    code, said = _invoke(["runs", "--root", str(root)])
    assert code == 0 and "20261205-000000-good" in said and f"note: left out {bad}" in said and why in said, said
    code, said = _invoke(["runs", "--root", str(root), "show", bad.name])
    assert code == 2 and why in said and "no run" not in said


def test_compare_shows_an_unknown_duration_as_runs_does(tmp_path: Path) -> None:
    """A record without wall_seconds read 'seconds 0' in compare, '-' in `runs` and `runs show`."""
    root = _a_run(tmp_path)
    other = root / "20261205-000002-nosec"
    other.mkdir()
    (other / "run.json").write_text('{"run_id": "20261205-000002-nosec", "status": "failed", "steps": []}')
    result = CliRunner().invoke(app, ["runs", "--root", str(root), "compare", "20261205-000000-good", other.name], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    [line] = [ln.split() for ln in result.output.splitlines() if ln.split()[:1] == ["seconds"]]
    assert line[1:3] == ["2", "-"], result.output


def test_simulate_on_an_inventory_of_unmeasured_models_says_how_to_give_throughputs(tmp_path: Path) -> None:
    """A new user's trial: the README's manifests inventory (A100, T4, 910B3) with a Gavel trace failed naming only
    the inventory; Gavel measured K80, P100 and V100."""
    code, said = _invoke(["simulate", "--trace", "gavel:12:6:0", "--inventory", str(ROOT / "examples" / "manifests" / "inventory.yaml")])
    assert code == 2 and "no model of the inventory can run it" in said
    assert "give --throughputs FILE, a CSV like Gavel's (model,scale_factor,<model>_steps_per_s" in said


def test_simulate_reads_a_pod_lists_model_names_as_the_inventory_yamls(tmp_path: Path) -> None:
    """A new user's trial: the shipped shared_gpu pods.csv on its own inventory.yaml (which point at each other) held
    12 pods "no node with model T4 (the inventory has nvidia-a100-80gb, nvidia-t4, nvidia-v100)", and alike for A100
    and V100M16|V100M32 (the Alibaba trace's names, registry aliases of nvidia-v100 now)."""
    import json

    out = tmp_path / "s.json"
    code, said = _invoke(["simulate", "--trace", str(ROOT / "examples" / "shared_gpu" / "pods.csv"),
                          "--inventory", str(ROOT / "examples" / "shared_gpu" / "inventory.yaml"), "--json", str(out)])
    assert code == 0 and "no node with model" not in said, said
    from heteroflow.components.devices.accelerators import find_accelerator

    assert find_accelerator("V100M32").name == find_accelerator("V100M16").name == "nvidia-v100"
    assert json.loads(out.read_text())["results"]
