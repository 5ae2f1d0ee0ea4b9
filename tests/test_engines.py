"""Engines behind one interface (heteroflow.pipelines.engines.registry): the registry, an engine another package registers
through the ``heteroflow.engines`` entry point (a real dist-info on ``sys.path``), missing requirements, the ``kfp``
engine's submission (kfp's client faked at its boundary), and the ``airflow`` engine on a real Airflow with SQLite
(slow)."""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import heteroflow
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.core.failures import FAULT_ENV, SIMULATE_ENV
from heteroflow.pipelines.engines import registry as engines
from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.engines.registry import Engine, EngineUnavailable, engine_names, get_engine

PREWARM_ONLY = (
    "from heteroflow.components.steps import PREWARM\nfrom heteroflow.pipelines.graph import Pipeline\n\n"
    "p = Pipeline('prewarm-only')\np.add(PREWARM, source_uri=p.param('dataset_uri'))\n"
)

RECORDING_ENGINE = '''\
from heteroflow.pipelines.engines.registry import get_engine

CALLS = []


class RecordingEngine:
    name = "recording"
    description = "the in-process engine, recording what it was asked"
    extra = None
    modules = ()
    options = frozenset()

    def run(self, pipeline, params, *, run_dir, simulate_devices, inject_faults, on_progress, echo_engine_output, source=None, **options):
        CALLS.append({"pipeline": pipeline.name, "params": dict(params or {}), "run_dir": str(run_dir), "source": source, "options": options})
        return get_engine("inprocess").run(
            pipeline, params, run_dir=run_dir, simulate_devices=simulate_devices, inject_faults=inject_faults,
            on_progress=None, echo_engine_output=False, source=source,
        )


ENGINE = RecordingEngine  # a class: the registry instantiates it
'''


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as a process starts: builtin engines only, entry points not loaded yet."""
    monkeypatch.setattr(engines, "_REGISTRY", {k: v for k, v in engines._REGISTRY.items() if k in engines.BUILTIN_ENGINES})
    monkeypatch.setattr(engines, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(engines, "_BROKEN", {})


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: None) -> Iterator[Path]:
    """An installed distribution ``heteroflow-recording`` (a dist-info with entry_points.txt on sys.path) that
    registers the engine ``recording``, and the module ``prewarmonly`` (a one-step pipeline) beside it."""
    site = tmp_path / "site"
    dist = site / "heteroflow_recording-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: heteroflow-recording\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[heteroflow.engines]\nrecording = recording_engine:ENGINE\n")
    (site / "recording_engine.py").write_text(RECORDING_ENGINE)
    (site / "prewarmonly.py").write_text(PREWARM_ONLY)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    for name in (SIMULATE_ENV, FAULT_ENV):
        monkeypatch.delenv(name, raising=False)
    yield site
    for name in ("recording_engine", "prewarmonly"):
        sys.modules.pop(name, None)


def test_the_builtin_and_the_airflow_engines_are_registered(fresh_registry: None) -> None:
    names = engine_names()
    assert names[:3] == ("kfp-local", "inprocess", "kfp")
    assert "airflow" in names  # through this project's own entry point (pyproject.toml)
    for name in names:
        engine = get_engine(name, check=False)
        assert engine.name == name and engine.description and isinstance(engine, Engine)
        assert set(engine.options) <= set(engines.OPTIONAL_OPTIONS)
    assert type(get_engine("airflow", check=False)).__module__ == "heteroflow.dags.engine"


def test_loading_the_registry_imports_no_engine_runner(fresh_registry: None) -> None:
    engine_names()
    # each engine imports its runner when it runs; the console script relies on that
    import subprocess

    code = (
        "import sys; from heteroflow.pipelines.engines.registry import engine_names; engine_names(); "
        "print(sorted(m for m in ('kfp', 'airflow', 'heteroflow.pipelines.kfp.local', 'heteroflow.pipelines.engines.inprocess', 'typer') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_an_unknown_engine_is_refused_naming_the_registered_ones(fresh_registry: None) -> None:
    with pytest.raises(InvalidParameter, match=r"engine='kfp-locl' \(did you mean 'kfp-local'\?\) is unknown; valid: kfp-local, inprocess, kfp, airflow"):
        heteroflow.run(None, engine="kfp-locl")
    result = CliRunner().invoke(app, ["run", "--engine", "nope"])
    assert result.exit_code == 2
    assert "--engine: engine='nope' is unknown; valid: kfp-local, inprocess, kfp, airflow" in " ".join(result.output.split())


def test_an_engine_option_it_does_not_know_is_refused_listing_those_it_does(fresh_registry: None) -> None:
    with pytest.raises(InvalidParameter, match=r"engine='inprocess' has no option 'host'; valid engine options: sleep"):
        heteroflow.run(None, engine="inprocess", host="http://x")


def test_an_entry_point_engine_is_found_and_run_by_heteroflow_run(plugin: Path, digits_dir: Path, tmp_path: Path) -> None:
    assert "recording" in engine_names()
    record = heteroflow.run("prewarmonly:p", {"dataset_uri": str(digits_dir)}, engine="recording", run_dir=tmp_path / "run")
    assert record.status == "succeeded" and record.pipeline == "prewarm-only"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "succeeded"
    calls = sys.modules["recording_engine"].CALLS
    assert calls == [
        {"pipeline": "prewarm-only", "params": {"dataset_uri": str(digits_dir)}, "run_dir": str(tmp_path / "run"), "source": "prewarmonly:p", "options": {}}
    ]


def test_an_entry_point_engine_is_found_and_run_by_the_cli(plugin: Path, digits_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--engine", "recording", "--pipeline", "prewarmonly:p", "--dataset", str(digits_dir), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "run succeeded" in result.output
    assert [c["source"] for c in sys.modules["recording_engine"].CALLS] == ["prewarmonly:p"]
    listed = CliRunner().invoke(app, ["engines", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.output)}
    assert rows["recording"]["description"] == "the in-process engine, recording what it was asked"
    assert list(rows)[:3] == ["kfp-local", "inprocess", "kfp"]


def test_a_broken_entry_point_is_named_when_asked_for_and_breaks_no_other_engine(plugin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (plugin / "heteroflow_recording-0.1.dist-info" / "entry_points.txt").write_text(
        "[heteroflow.engines]\nrecorder = recording_engine:ENGINE\nmissing = no_such_module_here:ENGINE\n"
    )
    assert "recorder" not in engine_names() and "missing" not in engine_names() and "airflow" in engine_names()
    with pytest.raises(EngineUnavailable, match=r"engine='recorder' is registered but unusable: .* names an engine called 'recording'"):
        get_engine("recorder")
    with pytest.raises(EngineUnavailable, match=r"engine='missing' .* cannot be loaded: ModuleNotFoundError"):
        heteroflow.run(None, engine="missing")


def test_a_missing_requirement_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kfp" else real(name, *a))
    with pytest.raises(EngineUnavailable, match=r"engine='kfp-local' needs the module 'kfp', which is not installed; run: pip install 'heteroflow\[kfp\]'"):
        heteroflow.run(None, engine="kfp-local")
    with pytest.raises(EngineUnavailable, match=r"pip install 'heteroflow\[kfp\]'"):
        get_engine("kfp")
    assert get_engine("kfp", check=False).name == "kfp"  # listing needs nothing installed
    get_engine("inprocess")  # needs nothing
    result = CliRunner().invoke(app, ["run", "--engine", "kfp-local"])
    assert result.exit_code == 2
    assert "pip install 'heteroflow[kfp]'" in " ".join(result.output.split())
    listed = CliRunner().invoke(app, ["engines", "--json"])
    rows = {row["name"]: row for row in json.loads(listed.output)}
    assert rows["kfp"]["installed"] == "no: pip install 'heteroflow[kfp]'" and rows["inprocess"]["installed"] == "yes"


def test_options_an_engine_cannot_honour_are_said_and_ignored(plugin: Path, digits_dir: Path, tmp_path: Path) -> None:
    seen: list[Any] = []
    with pytest.warns(UserWarning, match="engine 'inprocess' ignores on_progress"):
        record = heteroflow.run("prewarmonly:p", {"dataset_uri": str(digits_dir)}, engine="inprocess", run_dir=tmp_path / "run", on_progress=seen.append)
    assert record.status == "succeeded" and seen == []


def test_the_kfp_engine_needs_a_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(engines.KFP_HOST_ENV, raising=False)
    # the command line has no engine options: the message names the variable it reads first (a new user's trial
    # read "pass host='http://...'", Python, at the shell)
    with pytest.raises(InvalidParameter, match=r"engine 'kfp' needs a Kubeflow Pipelines endpoint: set HETEROFLOW_KFP_HOST \(the command line reads it\), or pass host="):
        heteroflow.run(None, {"dataset_uri": "s3://b/d"}, engine="kfp", run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_kfp_engine_submits_the_compiled_pipeline_and_records_the_submission(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import kfp

    sent: list[dict[str, Any]] = []

    class FakeClient:  # kfp.Client's boundary: the real package and argument checks run before it
        def __init__(self, host: str, namespace: str | None = None) -> None:
            self.host = host

        def create_run_from_pipeline_package(self, path: str, arguments: dict[str, Any], **kwargs: Any) -> Any:
            sent.append({"host": self.host, "path": path, "arguments": arguments, **kwargs})
            return type("Run", (), {"run_id": "abc-123"})()

    monkeypatch.setattr(kfp, "Client", FakeClient)
    monkeypatch.setenv(engines.KFP_HOST_ENV, "http://kfp.example:8080")
    with pytest.warns(UserWarning, match="placeholder image"):
        record = heteroflow.run(None, {"dataset_uri": "s3://b/d", "epochs": 2}, engine="kfp", run_dir=tmp_path / "run", experiment="exp")
    assert record.status == "submitted" and record.steps == []
    assert record.results["kfp"] == {"host": "http://kfp.example:8080", "run_id": "abc-123", "url": "http://kfp.example:8080/#/runs/details/abc-123"}
    [call] = sent
    assert call["path"] == str(tmp_path / "run" / "pipeline.yaml") and call["experiment_name"] == "exp"
    assert call["arguments"]["dataset_uri"] == "s3://b/d" and call["arguments"]["epochs"] == 2  # typed from the package
    assert json.loads((tmp_path / "run" / "run.json").read_text())["results"]["kfp"]["run_id"] == "abc-123"
    heteroflow.run(None, {"dataset_uri": "s3://b/d"}, engine="kfp", run_dir=tmp_path / "run2", image="reg.example/hf:1")
    assert "reg.example/hf:1" in (tmp_path / "run2" / "pipeline.yaml").read_text()
    # the command line's way to name the image: HETEROFLOW_KFP_IMAGE (it submitted the placeholder, with a warning)
    monkeypatch.setenv(engines.KFP_IMAGE_ENV, "reg.example/hf:2")
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    result = CliRunner().invoke(app, ["run", "--engine", "kfp", "--dataset", "s3://b/d", "-o", str(tmp_path / "run3")], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "reg.example/hf:2" in (tmp_path / "run3" / "pipeline.yaml").read_text() and "placeholder image" not in result.output
    # a submission is not a failure: exit 0, no empty steps table, where to watch it (it exited 1 with a failure's hint)
    said = " ".join(result.output.split())
    assert "run submitted to http://kfp.example:8080 as run abc-123" in said and "┏" not in result.output
    assert "next: watch it in the Kubeflow UI: http://kfp.example:8080/#/runs/details/abc-123" in said


def test_the_airflow_engine_needs_the_pipeline_as_a_reference(tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    from heteroflow.pipelines.default import default_pipeline

    with pytest.raises(InvalidParameter, match=r"engine='airflow' builds the DAG in Airflow's own process, so it needs the pipeline as 'module:attribute'"):
        heteroflow.run(default_pipeline(), engine="airflow", run_dir=tmp_path / "run", airflow_home=tmp_path / "af")
    assert not (tmp_path / "af").exists()


@pytest.mark.slow
def test_the_airflow_engine_runs_the_default_pipeline_on_sqlite(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    for name in (SIMULATE_ENV, FAULT_ENV):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    record = heteroflow.run(None, {"dataset_uri": str(digits_dir), "epochs": 3}, engine="airflow", run_dir=run_dir)
    assert record.status == "succeeded", (run_dir / "airflow.log").read_text()[-4000:]
    assert Path(record.run_dir) == run_dir.resolve() and record.run_id.startswith("manual__")
    assert record.metrics["evaluate"]["accuracy"] >= 0.85
    assert [s.status for s in record.steps] == ["succeeded"] * len(record.steps) and record.step("archive").attempts == 1
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    # Airflow's own database (SQLite in AIRFLOW_HOME) holds the DAG run and its tasks
    with sqlite3.connect(tmp_path / "airflow" / "airflow.db") as db:
        state = db.execute("select state from dag_run where dag_id='heteroflow-engine-heteroflow-default'").fetchall()
        tasks = dict(db.execute("select task_id, state from task_instance where dag_id='heteroflow-engine-heteroflow-default'").fetchall())
    assert state == [("success",)], state
    assert tasks["record-run"] == tasks["archive"] == "success"
    # one Airflow process ran `db migrate`, then `dags test` (which serializes the DAG itself: no `dags reserialize`)
    log = (run_dir / "airflow.log").read_text()
    announced = [line.rsplit(": ", 1)[0] if line.endswith(", exit 0") else line for line in log.splitlines() if line.startswith("$ airflow ")]
    # quoted as a shell reads it: the line pastes into a terminal as it is
    # with this process's clock's logical date, which identifies Airflow's run (how a stopped run is found and ended)
    assert announced[:2] == ["$ airflow db migrate"] * 2 and len(announced) == 4 and announced[2] == announced[3], announced
    logical = re.fullmatch(r"""\$ airflow dags test heteroflow-engine-heteroflow-default (\S+) -c '\{"dataset_uri": "%s", "epochs": 3\}'"""
                           % re.escape(str(digits_dir)), announced[2])
    assert logical is not None, announced
    with sqlite3.connect(tmp_path / "airflow" / "airflow.db") as db:
        (stored,), = db.execute("select logical_date from dag_run where dag_id='heteroflow-engine-heteroflow-default'").fetchall()
    assert datetime.fromisoformat(stored).replace(tzinfo=None) == datetime.fromisoformat(logical[1]).replace(tzinfo=None), (stored, logical[1])
    assert "run succeeded in" not in log  # the engine's caller prints the summary once, not record-run inside Airflow


def test_an_airflow_command_that_fails_is_named_with_its_output_and_the_log(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`airflow db migrate` cannot open its database: the error names that command, its exit status and the log, and
    `dags test` never runs."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    from heteroflow.dags.engine import AirflowRunError

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path / 'no-such-folder' / 'airflow.db'}")
    run_dir = tmp_path / "run"
    with pytest.raises(AirflowRunError, match=r"^`airflow db migrate` failed \(exit 1\): sqlalchemy\.exc\.OperationalError: \(sqlite3\.OperationalError\) unable to open database file [^;]*; log: \S*airflow\.log$"):
        heteroflow.run(None, {"dataset_uri": str(digits_dir)}, engine="airflow", run_dir=run_dir, airflow_home=tmp_path / "airflow")
    log = (run_dir / "airflow.log").read_text()
    assert "$ airflow db migrate: " in log and "exit 1" in log and "$ airflow dags test" not in log
    assert not (run_dir / "run.json").exists()


def test_a_pipeline_value_held_by_a_module_is_found_for_the_airflow_engine_and_one_in_main_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new user's trial: `heteroflow.run(mymodule.p, engine='airflow')` was refused with a fixed example
    (`pipeline='mymodule:build'`), not the user's own attribute. A Pipeline that an importable module holds is
    found (`mymodule:p`); one defined in the script being run (`__main__`) is named, with what to do."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    import types

    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.dags.engine import _source_of

    held = default_pipeline()
    module = types.ModuleType("my_pipelines_mod")
    module.p = held  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_pipelines_mod", module)
    assert _source_of(held) == "my_pipelines_mod:p" and _source_of(default_pipeline()) is None

    loose = default_pipeline()
    monkeypatch.setattr(sys.modules["__main__"], "my_script_pipeline", loose, raising=False)
    with pytest.raises(InvalidParameter, match=r"'my_script_pipeline' is defined in __main__ \(the script you run\), which Airflow's "
                                               r"process cannot import; define it in a module and pass pipeline='module:my_script_pipeline'"):
        heteroflow.run(loose, engine="airflow", run_dir=tmp_path / "run", airflow_home=tmp_path / "af")
    assert not (tmp_path / "af").exists()


@pytest.mark.parametrize("record_run_wrote", [True, False])
def test_a_stopped_airflow_run_is_ended_in_airflow_as_heteroflows_record_says(
    digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_run_wrote: bool
) -> None:
    """A review: Ctrl-C after archive but before record-run marked Airflow's run failed ("interrupted ... rerun to
    resume") while heteroflow recorded it succeeded. The record is decided first; Airflow's run is ended as it says
    (success when every step had finished, failed when the run was interrupted)."""
    from heteroflow.dags import engine as engine_module
    from heteroflow.pipelines.runs.records import RunRecord

    ended: list[bool] = []
    monkeypatch.setattr(engine_module, "_end_stopped_run", lambda *a, succeeded=False, note=None: ended.append(succeeded))

    def stopped(commands, env, log_path, *, echo, timeout):  # type: ignore[no-untyped-def]
        if record_run_wrote:  # record-run had written the run's record (succeeded) when the stop came
            folder = Path(env[engine_module.RUN_DIR_ENV])
            RunRecord(run_id="r", pipeline="heteroflow-default", status="succeeded", started_at=1.0, wall_seconds=1.0,
                      params={}, steps=[], fallbacks=[], metrics={}, results={}, placement={}, run_dir=str(folder)).write()
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_module, "_run_airflow", stopped)
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    with pytest.raises(KeyboardInterrupt) as stop:
        heteroflow.run(None, {"dataset_uri": str(digits_dir)}, engine="airflow", run_dir=tmp_path / "run", airflow_home=str(tmp_path / "af"))
    record = stop.value.record  # type: ignore[attr-defined]
    assert record.status == ("succeeded" if record_run_wrote else "interrupted")
    assert ended == [record_run_wrote]


def test_the_airflow_engine_runs_the_default_pipeline_with_the_candidates_of_c(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: `heteroflow run --engine airflow -c cpu` was refused ("needs the pipeline as
    'module:attribute'"): -c made the default pipeline a value of this process. The engine imports the default
    pipeline in Airflow's process and gives its calls the value's candidates (written into the DAG file). Airflow's
    own commands are left out here (the slow test above runs them); the DAG file is loaded as Airflow would."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    from heteroflow.dags import engine as airflow_engine

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    for name in (SIMULATE_ENV, FAULT_ENV):
        monkeypatch.delenv(name, raising=False)
    ran: list[tuple[list[list[str]], dict[str, str]]] = []
    monkeypatch.setattr(airflow_engine, "_run_airflow", lambda commands, env, *a, **k: (ran.append((commands, env)), (0, "", commands[-1]))[1])
    result = CliRunner().invoke(app, ["run", "--engine", "airflow", "-c", "cpu", "--dataset", str(digits_dir), "-o", str(tmp_path / "run")])
    assert "needs the pipeline as 'module:attribute'" not in result.output
    assert ran and ran[0][0][-1][:2] == ["dags", "test"], result.output  # Airflow was started (faked: it wrote no record)
    (dag_file,) = (tmp_path / "airflow" / "heteroflow-engine-dags").glob("*.py")
    first_file = dag_file.read_text()

    def parsed(env: dict[str, str]) -> Any:  # the DAG file loaded as Airflow's DagBag imports it, in that run's process
        monkeypatch.setenv(airflow_engine.PLACEMENTS_ENV, env[airflow_engine.PLACEMENTS_ENV])
        scope: dict[str, Any] = {}
        exec(compile(dag_file.read_text(), str(dag_file), "exec"), scope)
        return scope["dag"]

    # train on the one candidate -c gave: one task (the default's three candidates make a task group of three)
    train = [t.task_id for t in parsed(ran[0][1]).tasks if t.task_id.split(".")[0] == "train"]
    assert train == ["train"], train
    # a review: the candidates were written into the one DAG file every run of the pipeline shares, so two runs at
    # once with other -c took each other's. They go in each run's own Airflow process's environment instead
    result = CliRunner().invoke(app, ["run", "--engine", "airflow", "-c", "npu", "-c", "cpu", "--dataset", str(digits_dir), "-o", str(tmp_path / "run2")])
    assert len(ran) == 2, result.output
    assert dag_file.read_text() == first_file and "cpu" not in first_file.split("engine_dag(")[1]
    second = [t.task_id for t in parsed(ran[1][1]).tasks if t.task_id.split(".")[0] == "train"]
    assert [t for t in second if t.split(".")[1].startswith(("npu", "cpu", "gpu"))] == ["train.npu-0", "train.cpu-1"], second
    assert [t.task_id for t in parsed(ran[0][1]).tasks if t.task_id.split(".")[0] == "train"] == ["train"]  # the first's own
    monkeypatch.delenv(airflow_engine.PLACEMENTS_ENV)
    default_dag = airflow_engine.engine_dag("heteroflow.pipelines.default:default_pipeline", "d")
    assert len([t for t in default_dag.tasks if t.task_id.startswith("train.")]) >= 3
