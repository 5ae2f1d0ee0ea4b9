"""Run records and run folders (heteroflow.pipelines.runs.records), the same for every engine: one truth about how a run
ended (#16.19), no pointer to an engine log that does not exist (#16.21), and the module layout (#15.3).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.steps import PREWARM
from heteroflow.pipelines.graph import Pipeline

ROOT = Path(__file__).resolve().parent.parent


def _prewarm_only() -> Pipeline:
    p = Pipeline("prewarm-only")
    p.add(PREWARM, source_uri=p.param("dataset_uri"))
    return p


def _signal_while_recording(monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    """Deliver ``signum`` to this process while the run's record is built: the moment the last step has finished
    and the run is being recorded (the race of #16.19, made certain)."""
    from heteroflow.pipelines.runs import records

    original = records.build_record

    def build(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signum)
        return original(*args, **kwargs)

    monkeypatch.setattr(records, "build_record", build)


@pytest.fixture()
def sigterm_stops_like_the_cli() -> Any:
    """The CLI's handler: SIGTERM raises KeyboardInterrupt (the run stops like Ctrl-C)."""

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    yield
    signal.signal(signal.SIGTERM, previous)


def _assert_one_truth(record: Any) -> None:
    from heteroflow.pipelines.runs.records import prepare_run_dir

    on_disk = json.loads(Path(record.run_dir, "run.json").read_text())
    assert record.status == on_disk["status"] == "succeeded"
    with pytest.raises(InvalidParameter, match="already holds a run that succeeded"):
        prepare_run_dir(Path(record.run_dir))  # a rerun is refused, and that is now what the run said too


@pytest.mark.slow
def test_sigterm_as_the_kfp_local_run_is_recorded_ends_it_succeeded(
    digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_stops_like_the_cli: Any
) -> None:
    pytest.importorskip("kfp", reason="kfp is not installed (extra heteroflow[kfp])")
    from heteroflow.pipelines.kfp import local

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    _signal_while_recording(monkeypatch, signal.SIGTERM)
    record = local.run_local({"dataset_uri": str(digits_dir)}, pipeline=_prewarm_only(), run_dir=tmp_path / "run")
    _assert_one_truth(record)  # no KeyboardInterrupt: the CLI prints the run and exits 0


@pytest.mark.slow
def test_ctrl_c_as_the_inprocess_run_is_recorded_ends_it_succeeded(
    digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from heteroflow.pipelines.engines import inprocess

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    _signal_while_recording(monkeypatch, signal.SIGINT)
    record = inprocess.run_inprocess(_prewarm_only(), {"dataset_uri": str(digits_dir)}, run_dir=tmp_path / "run")
    _assert_one_truth(record)


@pytest.mark.slow
def test_ctrl_c_during_an_inprocess_step_records_the_run_interrupted(
    digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from heteroflow.pipelines.engines import inprocess

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(inprocess, "run_call", stop)
    with pytest.raises(KeyboardInterrupt) as stopped:
        inprocess.run_inprocess(_prewarm_only(), {"dataset_uri": str(digits_dir)}, run_dir=tmp_path / "run")
    record = stopped.value.record  # type: ignore[attr-defined]
    assert json.loads(Path(record.run_dir, "run.json").read_text())["status"] == record.status == "interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["inprocess", "kfp-local"])
def test_a_failed_run_names_an_engine_log_only_if_there_is_one(engine: str, digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "kfp-local":
        pytest.importorskip("kfp", reason="kfp is not installed (extra heteroflow[kfp])")
    from heteroflow.pipelines.cli.main import app

    module = tmp_path / "userpkg"
    module.mkdir()
    (module / "prewarmonly.py").write_text(
        "from heteroflow.components.steps import PREWARM\nfrom heteroflow.pipelines.graph import Pipeline\n\n"
        "p = Pipeline('prewarm-only')\np.add(PREWARM, source_uri=p.param('dataset_uri'))\n"
    )
    monkeypatch.syspath_prepend(str(module))
    monkeypatch.setenv("PYTHONPATH", str(module))
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app,
        ["run", "--engine", engine, "--pipeline", "prewarmonly:p", "--dataset", str(digits_dir), "-o", str(tmp_path / "run"),
         "--inject-fault", "prewarm@cpu=permanent"],
    )
    sys.modules.pop("prewarmonly", None)
    assert result.exit_code == 1, result.output
    assert "run failed" in result.output
    # the last line says what to look at next: `runs show` of this run (its folder: -o is outside ./heteroflow-runs)
    # and the engine's log in the run folder, where the engine wrote one (a new user's trial: nothing said so)
    last = result.output.splitlines()[-1]
    shown = f"next: heteroflow runs show {tmp_path / 'run'} (each attempt and its error)"
    if engine == "inprocess":
        assert last == shown, "the in-process engine writes no engine log"  # the input of #16.21
    else:
        assert last.startswith(shown + "; the engine's log: ") and Path(last.split("; the engine's log: ")[1]).is_file()
        assert Path(last.split("; the engine's log: ")[1]).parent == tmp_path / "run"  # the sibling: it exists
    again = CliRunner().invoke(app, last.removeprefix("next: heteroflow ").split(" (")[0].split())
    assert again.exit_code == 0 and "prewarm" in again.output and "permanent" in again.output, again.output


def test_a_succeeded_run_names_the_commands_that_follow_with_its_own_id_and_model(digits_dir: Path, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: the default run's summary ended without saying what to do next. Its last line names
    `runs show <run id>` (found under ./heteroflow-runs) and, where the run archived a model, `archive show <model>:vN`
    (with --root where the run's archive is not the default one); each command works as printed."""
    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.folders import load_run

    module = tmp_path / "userpkg"
    module.mkdir()
    (module / "prewarmonly2.py").write_text(
        "from heteroflow.components.steps import PREWARM\nfrom heteroflow.pipelines.graph import Pipeline\n\n"
        "p = Pipeline('prewarm-only')\np.add(PREWARM, source_uri=p.param('dataset_uri'))\n"
    )
    monkeypatch.syspath_prepend(str(module))
    monkeypatch.setenv("PYTHONPATH", str(module))
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--engine", "inprocess", "--pipeline", "prewarmonly2:p", "--dataset", str(digits_dir)])
    sys.modules.pop("prewarmonly2", None)
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "heteroflow-runs").iterdir()
    assert result.output.splitlines()[-1] == f"next: heteroflow runs show {folder.name}"  # nothing archived: no archive show
    assert CliRunner().invoke(app, ["runs", "show", folder.name]).exit_code == 0

    run = load_run(folder)
    run["results"] = {"archive": {"name": "digits-mlp", "version": 3, "path": str(tmp_path / "home" / "archive" / "digits-mlp" / "v3")}}
    assert summary_text(run).splitlines()[-1] == f"next: heteroflow runs show {folder.name}; heteroflow archive show digits-mlp:v3"
    run["results"]["archive"]["path"] = str(tmp_path / "mine" / "digits-mlp" / "v3")  # archive_root=mine
    assert summary_text(run).splitlines()[-1].endswith(f"heteroflow archive show digits-mlp:v3 --root {tmp_path / 'mine'}")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_only_the_kfp_local_entry_points_import_the_kfp_local_runner() -> None:
    users = sorted(
        str(p.relative_to(ROOT))
        for folder in ("cache", "components", "pipelines", "dags")
        for p in (ROOT / folder).rglob("*.py")
        if "heteroflow.pipelines.kfp.local" in _imports(p)
    )
    assert users == ["pipelines/engines/registry.py"], users  # the kfp-local engine (registry); records live in records.py


@pytest.mark.slow
def test_a_stop_while_a_failed_run_is_recorded_leaves_it_failed(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.pipelines.engines import inprocess

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    _signal_while_recording(monkeypatch, signal.SIGINT)
    record = inprocess.run_inprocess(
        _prewarm_only(), {"dataset_uri": str(digits_dir)}, run_dir=tmp_path / "run", inject_faults="prewarm@cpu=permanent"
    )
    assert json.loads(Path(record.run_dir, "run.json").read_text())["status"] == record.status == "failed"


def test_every_engine_writes_its_record_through_the_records_module() -> None:
    for module in ("pipelines/kfp/local.py", "pipelines/engines/inprocess.py", "dags/operators.py"):
        assert "heteroflow.pipelines.runs.records" in _imports(ROOT / module), module


def test_two_runs_whose_output_folders_share_a_name_get_different_ids(tmp_path: Path) -> None:
    """#28.12: the id was the last part of --output, so a/out and b/out collided (records, Prometheus files)."""
    from heteroflow.pipelines.runs.folders import resolve_run
    from heteroflow.pipelines.runs.records import start_run

    first, first_id, _ = start_run(_prewarm_only(), tmp_path / "a" / "out", {})
    second, second_id, _ = start_run(_prewarm_only(), tmp_path / "b" / "out", {})
    assert first != second and first_id != second_id
    assert first_id.startswith("out-") and second_id.startswith("out-")
    assert json.loads((first / "driver.json").read_text())["run_id"] == first_id
    assert json.loads((second / "driver.json").read_text())["run_id"] == second_id
    for folder, run_id in ((first, first_id), (second, second_id)):
        (folder / "driver.json").unlink()
        (folder / "run.json").write_text(json.dumps({"run_id": run_id, "pipeline": "prewarm-only", "status": "succeeded"}))
    assert resolve_run(first_id, [tmp_path / "a", tmp_path / "b"])["run_dir"] == str(first)
    assert resolve_run(second_id, [tmp_path / "a", tmp_path / "b"])["run_dir"] == str(second)
