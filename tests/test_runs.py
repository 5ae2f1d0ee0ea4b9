"""``heteroflow runs`` (list, show, compare) over run folders of every engine, read as plain JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.runs.folders import find_runs, load_run, resolve_run, retries


def _run(folder: Path, run_id: str, started: float, **changes: Any) -> Path:
    record = {
        "run_id": run_id,
        "pipeline": "p",
        "status": "succeeded",
        "started_at": started,
        "wall_seconds": 5.0,
        "params": {"epochs": 3, "seed": 0},
        "steps": [
            {"name": "train", "status": "succeeded", "kind": "gpu", "accelerator": "nvidia-gpu", "simulated": True, "candidate": 1, "attempts": 2, "seconds": 2.0},
            {"name": "evaluate", "status": "succeeded", "kind": "cpu", "candidate": 0, "attempts": 1, "seconds": 0.1},
        ],
        "fallbacks": [{"step": "train", "candidate": 0, "kind": "npu", "accelerator": "ascend-910", "failure": "device", "reason": "npu gone"}],
        "metrics": {"evaluate": {"accuracy": 0.91}},
        "results": {},
        "placement": {},
    }
    record.update(changes)
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(record))
    return folder


def test_find_runs_reads_every_layout_newest_first(tmp_path: Path) -> None:
    _run(tmp_path / "runs" / "a", "a", 100.0)
    _run(tmp_path / "airflow-runs" / "my-dag" / "manual__2026", "manual__2026", 300.0)
    _run(tmp_path / "runs" / "b", "b", 200.0)
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "run.json").write_text("{not json")
    (tmp_path / "runs" / "going").mkdir()
    (tmp_path / "runs" / "going" / "driver.json").write_text("{}")
    runs = find_runs([tmp_path / "runs", tmp_path / "airflow-runs", tmp_path / "runs" / "a"])
    # "going" names no live driver process: it was killed, and is recorded as such when listed
    assert [(r["run_id"], r["status"]) for r in runs] == [("manual__2026", "succeeded"), ("b", "succeeded"), ("a", "succeeded"), ("going", "killed")]
    assert (tmp_path / "runs" / "going" / "run.json").is_file()


def test_resolve_run_by_id_prefix_or_folder(tmp_path: Path) -> None:
    _run(tmp_path / "20260101-000000-aaaa", "20260101-000000-aaaa", 1.0)
    _run(tmp_path / "20260101-000000-aabb", "20260101-000000-aabb", 2.0)
    assert resolve_run("20260101-000000-aab", [tmp_path])["run_id"] == "20260101-000000-aabb"
    assert resolve_run(str(tmp_path / "20260101-000000-aaaa"), [])["run_id"] == "20260101-000000-aaaa"
    with pytest.raises(InvalidParameter, match=r"matches 2 runs .*give more of the id"):
        resolve_run("20260101", [tmp_path])
    with pytest.raises(InvalidParameter, match=r"no run 'zzz' in .*newest runs: 20260101-000000-aabb"):
        resolve_run("zzz", [tmp_path])
    # an airflow engine run: its id is Airflow's, its folder the name `heteroflow run` printed (a new user's trial:
    # `runs show 20261204-232719-609e` said "no run")
    _run(tmp_path / "20261204-232719-609e", "manual__2026-12-04T23-27-22.978579-00-00", 3.0, run_dir=str(tmp_path / "20261204-232719-609e"))
    assert resolve_run("20261204-232719-609e", [tmp_path])["run_id"] == "manual__2026-12-04T23-27-22.978579-00-00"
    assert resolve_run("manual__2026", [tmp_path])["run_id"] == "manual__2026-12-04T23-27-22.978579-00-00"
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "driver.json").write_text("{not json")
    with pytest.raises(InvalidParameter, match=r"has no run.json \(its driver.json cannot be read"):
        load_run(tmp_path / "half")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(InvalidParameter, match=r"run folder .*nothing has no run.json; give a folder a run wrote"):
        load_run(tmp_path / "nothing")


def test_a_run_still_going_is_listed_running_and_a_killed_one_is_recorded_when_listed(tmp_path: Path) -> None:
    """Trial finding: a run killed with SIGKILL was missing from `heteroflow runs`, and `runs show <id>` said there
    was no such run, until the next run beside it wrote its record; that record had the time up to its last
    attempt's start (2.3 s of about 10), its steps in the order they started and none of the calls that never
    started. Now listing records it at once, in the pipeline's order with the others `not run`, with its time up to
    the last write in its folder; a run whose driver is alive is listed as running."""
    import os
    import subprocess
    import sys
    import time

    from heteroflow.components.core.telemetry import AttemptRecord, _write, attempt_file

    def folder(name: str, pid: int, started: float) -> Path:
        f = tmp_path / "runs" / name
        (f / "steps" / "prewarm").mkdir(parents=True)
        (f / "driver.json").write_text(json.dumps({"pid": pid, "run_id": name, "pipeline": "default", "params": {},
                                                   "started_at": started, "calls": ["prewarm", "plan", "preprocess", "train", "evaluate"]}))
        for step, t0, t1, status in (("plan", started + 0.1, started + 0.2, "succeeded"), ("prewarm", started + 0.15, started + 0.5, "succeeded"),
                                     ("preprocess", started + 0.6, started + 1.0, "succeeded"), ("train", started + 1.1, None, "running")):
            rec = AttemptRecord(step=step, attempt=1, status=status, kind="cpu", started_at=t0, ended_at=t1, pid=pid)
            _write(attempt_file(f, rec), rec)
        for p in f.rglob("*"):  # written when the run wrote them: its first second
            os.utime(p, (started + 1.0, started + 1.0))
        return f

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    started = time.time() - 20
    killed = folder("killed-run", int(dead.stdout), started)
    progress = killed / "steps" / "train" / "attempt-1.json"
    os.utime(progress, (started + 9.5, started + 9.5))  # the killed attempt last wrote its progress 9.5 s in
    live = folder("live-run", os.getpid(), started + 5)
    runs = {r["run_id"]: r for r in find_runs([tmp_path / "runs"])}
    k = runs["killed-run"]
    assert k["status"] == "killed" and 9.4 < k["wall_seconds"] < 9.6, k["wall_seconds"]
    assert [(s["name"], s["status"]) for s in k["steps"]] == [
        ("prewarm", "succeeded"), ("plan", "succeeded"), ("preprocess", "succeeded"), ("train", "killed"), ("evaluate", "not run")]
    assert json.loads((killed / "run.json").read_text())["status"] == "killed"
    r = runs["live-run"]
    assert r["status"] == "running" and [s["status"] for s in r["steps"]][3:] == ["running", "not run"]
    assert not (live / "run.json").exists(), "a run still going gets no record from a listing"
    assert resolve_run("live-run", [tmp_path / "runs"])["status"] == "running"
    assert load_run(killed)["status"] == "killed"


def test_retries_and_their_waits_come_from_the_attempt_records(tmp_path: Path) -> None:
    folder = _run(tmp_path / "r", "r", 1.0)
    steps = folder / "steps" / "train"
    steps.mkdir(parents=True)
    attempts = [
        {"attempt": 1, "status": "failed", "failure": "transient", "candidate": 0, "kind": "npu", "started_at": 10.0, "ended_at": 11.0},
        {"attempt": 2, "status": "failed", "failure": "device", "candidate": 0, "kind": "npu", "started_at": 21.0, "ended_at": 22.0},
        {"attempt": 3, "status": "succeeded", "candidate": 1, "kind": "gpu", "started_at": 22.5, "ended_at": 30.0},
    ]
    for a in attempts:
        (steps / f"attempt-{a['attempt']}.json").write_text(json.dumps(a))
    found = retries(load_run(folder))
    # the move to candidate 1 after the device failure is a fallback, not a retry
    assert [(r["attempt"], r["after"], r["wait_seconds"]) for r in found] == [(2, "transient", 10.0)]


def _cli(*args: str) -> Any:
    from heteroflow.pipelines.cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_runs_list_show_compare(tmp_path: Path) -> None:
    _run(tmp_path / "r1", "r1", 100.0)
    _run(tmp_path / "r2", "r2", 200.0, params={"epochs": 5, "seed": 0}, metrics={"evaluate": {"accuracy": 0.95}}, fallbacks=[],
         status="failed")
    listed = _cli("runs", "--root", str(tmp_path))
    assert listed.exit_code == 0, listed.output
    rows = _plain(listed.output)  # piped: plain columns, a header line and one line per run
    assert [r["run"] for r in rows] == ["r2", "r1"] and listed.output.splitlines()[0].startswith("run ")
    assert rows[1]["device"] == "train gpu (sim)" and rows[1]["accuracy"] == "0.9100"
    assert rows[1]["fallbacks"] == "train left npu (device)" and rows[0]["status"] == "failed"
    as_json = json.loads(_cli("runs", "--root", str(tmp_path), "--json").output)
    assert [(r["run_id"], r["status"], r["accuracy"]) for r in as_json] == [("r2", "failed", 0.95), ("r1", "succeeded", 0.91)]

    shown = _cli("runs", "--root", str(tmp_path), "show", "r1")
    assert shown.exit_code == 0, shown.output
    assert "run r1: succeeded" in shown.output
    assert "fallback: train left candidate 0 (npu) after a device failure: npu gone" in shown.output
    assert "evaluate.accuracy 0.91" in shown.output

    compared = _cli("runs", "--root", str(tmp_path), "compare", "r1", "r2")
    assert compared.exit_code == 0, compared.output
    rows = {r["field"]: list(r.values())[1:] for r in _plain(compared.output)}  # piped: plain columns
    assert rows["param epochs"] == ["3", "5", "*"]
    assert "param seed" not in rows  # equal: only with --all
    assert rows["evaluate.accuracy"] == ["0.91", "0.95", "*"]
    assert rows["status"] == ["succeeded", "failed", "*"]

    assert "run r1: succeeded" in _cli("runs", "show", "r1", "--root", str(tmp_path)).output  # --root after the command too
    missing = _cli("runs", "--root", str(tmp_path), "show", "nope")
    assert missing.exit_code == 2 and "no run 'nope'" in missing.output


def test_a_mixed_train_is_listed_by_its_kinds_and_compare_shows_its_compression(tmp_path: Path) -> None:
    groups = [{"kind": "gpu", "count": 1}, {"kind": "npu", "count": 1}]

    def mixed(options: dict[str, Any]) -> dict[str, Any]:
        resources = {"kind": "gpu", "count": 1, "replicas": groups, **({"mixed": options} if options else {})}
        return {"placement": {"train": {"index": 0, "resources": resources}}, "fallbacks": [],
                "results": {"train": {"device_kind": "gpu+npu", "mixed": {"kinds": ["gpu", "npu"]}}}}

    _run(tmp_path / "m1", "m1", 100.0, **mixed({}))
    _run(tmp_path / "m2", "m2", 200.0, **mixed({"compression": "topk", "topk_ratio": 0.05}))
    listed = json.loads(_cli("runs", "--root", str(tmp_path), "--json").output)
    assert [r["devices"] for r in listed] == ["train gpu+npu (sim)", "train gpu+npu (sim)"]  # not the first kind alone
    compared = _cli("runs", "--root", str(tmp_path), "compare", "m1", "m2")
    assert compared.exit_code == 0, compared.output
    rows = {r["field"]: list(r.values())[1:] for r in _plain(compared.output)}  # piped: plain columns
    assert rows["train candidate"] == ["gpu x1 (nvidia-gpu) + npu x1 (ascend-910)",
                                       "gpu x1 (nvidia-gpu) + npu x1 (ascend-910), compression=topk, topk_ratio=0.05", "*"]
    same = _cli("runs", "--root", str(tmp_path), "compare", "m1", "m1")
    assert "train candidate" not in same.output  # equal: only with --all
    assert "train candidate" in _cli("runs", "--root", str(tmp_path), "compare", "m1", "m1", "--all").output


# --- every engine ---------------------------------------------------------------------------------------------


def _airflow_run(home: Path, dags: Path, dag_id: str, conf: dict[str, Any], env: dict[str, str]) -> str:
    from heteroflow.components.core.failures import FAULT_ENV, SIMULATE_ENV

    full = {k: v for k, v in os.environ.items() if k not in (SIMULATE_ENV, FAULT_ENV)}
    full.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **env})
    airflow = str(Path(sys.executable).parent / "airflow")
    heteroflow = str(Path(sys.executable).parent / "heteroflow")
    # the device pools the DAG's tasks use: without them prepare-run fails the run at once (#16.14)
    # `home` holds a migrated database (the session's `airflow db migrate`: conftest.py migrated_airflow_home); no
    # `airflow dags reserialize`: `airflow dags test` parses the DAG file and syncs it to the database itself
    for cmd in ((heteroflow, "airflow", "pools"), (airflow, "dags", "test", dag_id, "-c", json.dumps(conf))):
        done = subprocess.run(list(cmd), env=full, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(cmd[1:])}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_runs_lists_kfp_local_inprocess_and_airflow_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_dir: Path, migrated_airflow_home: Callable[[Path], Path]
) -> None:
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    pytest.importorskip("kfp", reason="the kfp extra is not installed")
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess
    from heteroflow.pipelines.kfp.local import run_local

    monkeypatch.chdir(tmp_path)  # ./heteroflow-runs is a default root
    params = {"dataset_uri": str(digits_dir), "epochs": 1}
    kfp = run_local(params, run_dir=tmp_path / "heteroflow-runs" / "kfp-run", simulate_devices="npu,gpu", inject_faults="train@npu=device")
    inproc = run_inprocess(default_pipeline(), params, run_dir=tmp_path / "heteroflow-runs" / "inprocess-run")
    assert kfp.status == inproc.status == "succeeded"
    dags = tmp_path / "dags"
    dags.mkdir()
    # (Airflow's safe mode parses only files that mention "airflow" and "dag")
    (dags / "heteroflow_dags.py").write_text("# Airflow DAG file\nfrom heteroflow.dags.example_default import dag\n")
    output = _airflow_run(migrated_airflow_home(tmp_path / "airflow-home"), dags, "heteroflow-default", params, {})

    listed = _cli("runs", "--json")
    assert listed.exit_code == 0, listed.output
    runs = {Path(r["run_dir"]).relative_to(tmp_path).parts[0]: r for r in json.loads(listed.output)}
    assert set(runs) == {"heteroflow-runs", "hf-home"} and len(json.loads(listed.output)) == 3
    # keyed by folder: a run given --output has the id <folder name>-<new id> (#28.12)
    by_id = {Path(r["run_dir"]).name: r for r in json.loads(listed.output)}
    assert by_id["kfp-run"]["run_id"].startswith("kfp-run-") and by_id["inprocess-run"]["run_id"].startswith("inprocess-run-")
    for r in by_id.values():  # every engine's record names the data set and the archived model (#28.18)
        assert r["pipeline"] == "heteroflow-default" and r["dataset"] == digits_dir.name and r["error"] is None
        assert r["model"].startswith(f"{digits_dir.name}-mlp:v"), r
    assert by_id["kfp-run"]["status"] == "succeeded" and by_id["kfp-run"]["devices"].startswith("train gpu (sim)")
    assert by_id["kfp-run"]["fallbacks"] == ["train left npu (device)"]
    assert by_id["inprocess-run"]["status"] == "succeeded"
    airflow = [r for r in by_id.values() if "airflow-runs" in r["run_dir"]]
    assert len(airflow) == 1 and airflow[0]["status"] == "succeeded" and airflow[0]["accuracy"] > 0.5
    for r in by_id.values():  # every engine leaves its report too
        assert (Path(r["run_dir"]) / "report.html").is_file()
    compared = _cli("runs", "compare", "kfp-run", airflow[0]["run_id"])
    assert compared.exit_code == 0 and "train device" in compared.output
    # `airflow dags test` prints the same one-screen summary as `heteroflow run` (from the record-run task)
    record = airflow[0]["run_dir"]
    assert f"run succeeded in " in output and f"record: {record}/run.json" in output and f"report: {record}/report.html" in output
    assert "test accuracy: " in output and re.search(r"│ train +│ succeeded │", output)


def test_summary_text_of_a_failed_run(tmp_path: Path) -> None:
    from heteroflow.pipelines.cli.runs import summary_text

    folder = _run(tmp_path / "f", "f", 1.0, status="failed", steps=[
        {"name": "train", "status": "failed", "kind": "npu", "device": "cpu", "simulated": True, "candidate": 0, "attempts": 3,
         "seconds": 0.25, "failure": "transient", "error": "heteroflow.components.core.failures.InjectedTransientFault: storage timed out"},
    ])
    (folder / "steps" / "train").mkdir(parents=True)
    for n, (start, end) in enumerate([(10.0, 11.0), (16.0, 17.0), (27.0, 28.0)], 1):
        (folder / "steps" / "train" / f"attempt-{n}.json").write_text(json.dumps(
            {"attempt": n, "status": "failed", "failure": "transient", "candidate": 0, "kind": "npu", "started_at": start, "ended_at": end,
             "error": "heteroflow.components.core.failures.InjectedTransientFault: storage timed out"}))
    text = summary_text(load_run(folder))
    assert re.search(r"│ train +│ failed +│ npu \(simulated, on cpu\) +│ +3 │ +0\.25 │", text)
    assert "retries: 2, 15.0 s spent waiting of the run's 5.0 s" in text
    assert "  train attempt 3 on npu (candidate 0) after a transient failure, waited 10.0 s: storage timed out" in text
    assert "step train failed (transient failure): storage timed out" in text
    assert text.rstrip().endswith(f"run failed in 5.0 s; record: {folder}/run.json\nnext: heteroflow runs show {folder} (each attempt and its error)")


def test_run_ids_are_listed_whole_on_a_narrow_terminal(tmp_path: Path) -> None:
    """A fresh-user trial saw `202612…` at 80 columns: the id `runs show` takes was cut. It is never cut or wrapped."""
    from heteroflow.pipelines.cli.main import app

    run_id = "20261201-211808-e313"
    _run(tmp_path / run_id, run_id, 100.0)
    listed = CliRunner().invoke(app, ["runs", "--root", str(tmp_path)], env={"COLUMNS": "80"})
    assert listed.exit_code == 0, listed.output
    assert run_id in listed.output


# --- data set, model and error columns, --filter and --sort (#28.18) ---------------------------------------------


def _default_runs(root: Path) -> None:
    """Three runs of the default pipeline: only their data set, model and outcome tell them apart."""
    common = {"pipeline": "heteroflow-default", "fallbacks": []}
    _run(root / "a", "20261201-100000-aaaa", 100.0, **common, params={"dataset_uri": "/data/iris", "epochs": 3},
         results={"archive": {"name": "iris-mlp", "version": 2, "path": "/x"}}, metrics={"evaluate": {"accuracy": 0.97}})
    _run(root / "b", "20261201-110000-bbbb", 200.0, **common, params={"dataset_uri": "s3://bucket/digits/", "model": "my_models:cnn"},
         metrics={"evaluate": {"accuracy": 0.88}}, results={"archive": {"name": "digits-cnn", "version": 1, "path": "/y"}})
    _run(root / "c", "20261201-120000-cccc", 300.0, **common, status="failed", params={"dataset_uri": "/data/penguins"}, metrics={},
         steps=[{"name": "preprocess", "status": "failed", "kind": "cpu", "failure": "permanent",
                 "error": "heteroflow.cache.errors.DatasetError: class column 'species' not found; columns: a, b"},
                {"name": "train", "status": "not run"}, {"name": "archive", "status": "not run"}])  # a record lists every step


def _plain(output: str) -> list[dict[str, str]]:
    """Piped `runs` / `archive list` output: the header line's names start the columns; each row sliced there."""
    lines = [l for l in output.splitlines() if l.strip()]
    header = lines[0]
    names = re.findall(r"\S+(?: \S+)*", header)  # names may hold one space ("started UTC"); columns two
    starts = []
    for name in names:
        starts.append(header.index(name, starts[-1] + 1 if starts else 0))
    bounds = list(zip(starts, starts[1:] + [None]))
    return [{n: l[a:b].strip() for n, (a, b) in zip(names, bounds)} for l in lines[1:]]


def _table(output: str) -> list[dict[str, str]]:
    lines = [l for l in output.splitlines() if l.startswith("│") or l.startswith("┃")]
    head = [c.strip() for c in lines[0].split("┃")[1:-1]]
    return [dict(zip(head, (c.strip() for c in l.split("│")[1:-1]))) for l in lines[1:]]


def test_runs_lists_data_set_model_and_error_of_each_run(tmp_path: Path) -> None:
    """#28.18: every run showed as heteroflow-default with no data set, model or error."""
    from heteroflow.pipelines.cli.main import app

    _default_runs(tmp_path)
    listed = CliRunner().invoke(app, ["runs", "--root", str(tmp_path)], env={"COLUMNS": "260"})
    assert listed.exit_code == 0, listed.output
    rows = _plain(listed.output)
    assert [(r["run"], r["dataset"], r["model"], r["status"]) for r in rows] == [
        ("20261201-120000-cccc", "penguins", "penguins-mlp", "failed"),
        ("20261201-110000-bbbb", "digits", "digits-cnn:v1", "succeeded"),
        ("20261201-100000-aaaa", "iris", "iris-mlp:v2", "succeeded"),
    ]
    assert rows[0]["error"] == "preprocess (permanent): class column 'species' not found; columns: a, b"
    assert rows[1]["error"] == rows[2]["error"] == "-"
    as_json = json.loads(CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "--json"]).output)
    assert [(r["dataset_uri"], r["model"]) for r in as_json] == [
        ("/data/penguins", "penguins-mlp"), ("s3://bucket/digits/", "digits-cnn:v1"), ("/data/iris", "iris-mlp:v2")]


def test_runs_filter_and_sort_by_the_new_columns(tmp_path: Path) -> None:
    from heteroflow.pipelines.cli.main import app

    _default_runs(tmp_path)

    def ids(*args: str) -> list[str]:
        done = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "--json", *args])
        assert done.exit_code == 0, done.output
        return [r["run_id"][-4:] for r in json.loads(done.output)]

    assert ids("--filter", "dataset=iris") == ["aaaa"]
    assert ids("--filter", "dataset=s3://bucket/*") == ["bbbb"]  # the URI matches too
    assert ids("--filter", "model=*-cnn:*") == ["bbbb"]
    assert ids("--filter", "error=*species*") == ["cccc"]
    assert ids("--filter", "error=-") == ["bbbb", "aaaa"]
    assert ids("--filter", "status!=succeeded") == ["cccc"]
    assert ids("--filter", "accuracy>=0.9") == ["aaaa"]
    assert ids("--filter", "pipeline=heteroflow-default", "--filter", "accuracy<0.9") == ["bbbb"]
    assert ids("--sort", "-accuracy") == ["aaaa", "bbbb", "cccc"]  # no accuracy: last
    assert ids("--sort", "accuracy") == ["bbbb", "aaaa", "cccc"]
    assert ids("--sort", "dataset") == ["bbbb", "aaaa", "cccc"]
    assert ids("--sort", "model", "--limit", "1") == ["bbbb"]
    assert ids("--sort", "started") == ["aaaa", "bbbb", "cccc"]


@pytest.mark.parametrize(("args", "message"), [
    (["--filter", "colour=red"], "no column 'colour'; valid: run, started, status, pipeline, dataset, model, device, accuracy, seconds, error"),
    (["--filter", "dataset"], "is not KEY=PATTERN"),
    (["--filter", "model>3"], "> compares numbers; numeric columns: accuracy, seconds"),
    (["--filter", "accuracy>high"], "'high' is not a number"),
    (["--sort", "size"], "--sort 'size': no column 'size'; valid: run, started"),
])
def test_runs_bad_filter_or_sort_names_what_is_valid(tmp_path: Path, args: list[str], message: str) -> None:
    from heteroflow.pipelines.cli.main import app

    _default_runs(tmp_path)
    done = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), *args], env={"COLUMNS": "300"})
    assert done.exit_code == 2 and message in done.output, done.output


def test_runs_show_and_compare_name_the_data_set_and_model(tmp_path: Path) -> None:
    """#28.18 sibling: ``runs show`` and ``runs compare`` did not name them either."""
    from heteroflow.pipelines.cli.main import app

    _default_runs(tmp_path)
    shown = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "show", "20261201-100000"], env={"COLUMNS": "200"})
    assert "data set /data/iris, model iris-mlp:v2" in shown.output, shown.output
    compared = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "compare", "20261201-100000", "20261201-120000"], env={"COLUMNS": "200"})
    rows = {r["field"]: list(r.values())[1:] for r in _plain(compared.output)}  # piped: plain columns
    assert rows["dataset"] == ["/data/iris", "/data/penguins", "*"]
    assert rows["model"] == ["iris-mlp:v2", "penguins-mlp", "*"]



def test_runs_and_archive_list_fit_a_narrow_terminal_by_hiding_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh-user trial: at 80 columns the 11-column runs table wrapped every cell over several lines. On a terminal
    the least useful columns are hidden (as ``kubectl get`` does) and named; piped output keeps them all."""
    import io

    from rich.console import Console

    from heteroflow.pipelines.cli import archive as archive_cli
    from heteroflow.pipelines.cli import runs as runs_cli
    from heteroflow.pipelines.cli.main import app

    _default_runs(tmp_path)
    # piped (not a terminal): every column, as scripts read it
    assert set(_plain(_cli("runs", "--root", str(tmp_path)).output)[0]) >= {"pipeline", "fallbacks", "error", "dataset"}
    # ... plain columns whatever COLUMNS says: a header, one line per run, whole cells (rich alone squeezed it to 80;
    # a new user's `runs | head -3` showed a title, a border and the header: no run)
    piped = CliRunner().invoke(app, ["runs", "--root", str(tmp_path)], env={"COLUMNS": "80"}).output
    assert len(piped.splitlines()) == 4 and not any(c in piped for c in "│┃━─…")
    assert [r["run"] for r in _plain(piped)] == ["20261201-120000-cccc", "20261201-110000-bbbb", "20261201-100000-aaaa"]
    assert _plain(piped)[0]["error"] == "preprocess (permanent): class column 'species' not found; columns: a, b"
    out = io.StringIO()
    monkeypatch.setattr(runs_cli, "console", Console(file=out, force_terminal=True, width=80, color_system=None, soft_wrap=True))
    listed = CliRunner().invoke(app, ["runs", "--root", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    text = out.getvalue()
    rows = [r for r in _table(text) if r["run"]]  # the device column may wrap; nothing else does
    assert [r["run"] for r in rows] == ["20261201-120000-cccc", "20261201-110000-bbbb", "20261201-100000-aaaa"]
    assert [r["accuracy"] for r in rows] == ["-", "0.8800", "0.9700"]
    assert all(len(line) <= 80 for line in text.splitlines() if line.startswith(("│", "┃")))
    assert "pipeline" not in rows[0] and "fallbacks" not in rows[0]
    note = text.strip().splitlines()[-1]
    assert note.startswith("6 columns hidden at 80 columns: started UTC, pipeline, dataset, seconds, error, fallbacks"), note
    # a new user's 60-column terminal: the device column wrapped each run over 4 lines and cut the status to
    # "succe…"; the device and model columns go too, and every kept cell is whole on one line
    out.truncate(0), out.seek(0)
    monkeypatch.setattr(runs_cli, "console", Console(file=out, force_terminal=True, width=60, color_system=None, soft_wrap=True))
    assert CliRunner().invoke(app, ["runs", "--root", str(tmp_path)]).exit_code == 0
    text = out.getvalue()
    rows = _table(text)
    assert [(r["run"], r["status"], r["accuracy"]) for r in rows] == [
        ("20261201-120000-cccc", "failed", "-"), ("20261201-110000-bbbb", "succeeded", "0.8800"), ("20261201-100000-aaaa", "succeeded", "0.9700")]
    table_lines = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert not any("…" in line for line in table_lines) and all(len(line) <= 60 for line in table_lines), text
    assert "columns hidden at 60 columns: started UTC, pipeline, dataset, model, device" in " ".join(text.split()), text

    # archive list: the same, with `archive show` named for the hidden values
    from heteroflow.components.models.archive import archive_root_dir

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    folder = archive_root_dir(None)
    for version in (1, 2):
        lineage = {"archived_at": f"2026-12-0{version}T10:00:00Z", "device": "gpu (nvidia-gpu, simulated on cpu)",
                   "dataset": {"dataset_sha256": "ab" * 32}, "run_id": f"20261201-10000{version}-abcd"}
        vdir = folder / "digits-mlp" / f"v{version}"
        vdir.mkdir(parents=True)
        (vdir / "lineage.json").write_text(json.dumps(lineage))
        (vdir / "metrics.json").write_text(json.dumps({"accuracy": 0.9 + version / 100}))
    out = io.StringIO()
    monkeypatch.setattr(archive_cli, "console", Console(file=out, force_terminal=True, width=60, color_system=None, soft_wrap=True))
    listed = CliRunner().invoke(app, ["archive", "list", "--root", str(folder)])
    assert listed.exit_code == 0, listed.output
    text = out.getvalue()
    assert [(r["version"], r["accuracy"]) for r in _table(text)] == [("v1", "0.9100"), ("v2", "0.9200")]
    assert "3 columns hidden at 60 columns: device, data set, run" in text and "`heteroflow archive show MODEL` has all" in text
    # a fresh-user trial: the data set's column was hidden although it fit once the run's went (hidden after it)
    out.truncate(0), out.seek(0)
    monkeypatch.setattr(archive_cli, "console", Console(file=out, force_terminal=True, width=90, color_system=None, soft_wrap=True))
    assert CliRunner().invoke(app, ["archive", "list", "--root", str(folder)]).exit_code == 0
    text = out.getvalue()
    assert [r["data set"] for r in _table(text) if r["model"]] == ["abababab", "abababab"]  # the device column wraps
    assert "1 column hidden at 90 columns: run" in text


def test_a_parameter_model_args_replaced_says_what_the_model_used_in_the_report_and_compare(tmp_path: Path) -> None:
    """hidden_units left at its default (128) while model_args sets 64: the model had 64 units. The report's
    Parameters table and `runs compare` said 128 and, for two runs of 64 and 128 units, "no difference"."""
    from heteroflow.pipelines.runs.folders import model_overrides
    from heteroflow.pipelines.runs.report import render_report

    used = {"in_features": 64, "num_classes": 10, "input_shape": [64], "hidden_units": 64}
    narrow = _run(tmp_path / "n1", "n1", 100.0, params={"epochs": 3, "hidden_units": 128, "model_args": '{"hidden_units": 64}'},
                  results={"train": {"model": "heteroflow.components.training.loop:mlp", "model_args": used}})
    _run(tmp_path / "w1", "w1", 200.0, params={"epochs": 3, "hidden_units": 128, "model_args": ""},
         results={"train": {"model": "heteroflow.components.training.loop:mlp", "model_args": {**used, "hidden_units": 128}}})
    assert model_overrides(load_run(narrow)) == {"hidden_units": 64}
    assert model_overrides(load_run(tmp_path / "w1")) == {}  # the parameter's own value was used
    html = render_report(narrow)
    params = html.split("<h2>Parameters</h2>", 1)[1].split("</table>", 1)[0]
    row = next(r for r in params.split("<tr>") if "<th>hidden_units</th>" in r)
    assert "128" in row and "(not used: model_args set hidden_units=64)" in row
    assert params.count("not used") == 1  # epochs and model_args are shown as given

    compared = _cli("runs", "--root", str(tmp_path), "compare", "n1", "w1")
    assert compared.exit_code == 0, compared.output
    rows = {r["field"]: list(r.values())[1:] for r in _plain(compared.output)}  # piped: plain columns
    assert rows["param hidden_units"] == ["64 (model_args)", "128", "*"]  # a difference, not "equal: 128 and 128"

    # sibling: a parameter named for its step (train.seed beside preprocess.seed), and model_args in a user step's results
    _run(tmp_path / "s1", "s1", 300.0, params={"train.seed": 0, "preprocess.seed": 0},
         results={"train": {"model_args": {"seed": 5}}, "fit": {"model_args": "not a dict"}})
    assert model_overrides(load_run(tmp_path / "s1")) == {"train.seed": 5}


def test_a_dataset_factory_run_is_listed_and_reported_by_its_factory_not_the_prewarmed_folder(tmp_path: Path) -> None:
    """A new user's finding: a run with dataset_factory=mydata:blobs (3 classes) was listed with data set `digits`
    and its report's lineage named digits only, the folder the pipeline prewarmed and preprocessed but did not
    train on. Sibling: a run without a factory keeps its folder's name."""
    from heteroflow.pipelines.runs.report import render_report

    params = {"dataset_uri": "/data/digits", "dataset_factory": "mydata:blobs"}
    folder = _run(tmp_path / "f1", "f1", 100.0, params=params,
                  results={"prewarm": {"source_uri": "/data/digits", "dataset_sha256": "ab" * 32, "version": "v1", "files": 6}})
    _run(tmp_path / "p1", "p1", 50.0, params={"dataset_uri": "/data/digits"})
    rows = {r["run_id"]: r for r in json.loads(_cli("runs", "--root", str(tmp_path), "--json").output)}
    assert rows["f1"]["dataset"] == "mydata:blobs" and rows["f1"]["dataset_uri"] == "dataset_factory mydata:blobs"
    assert rows["p1"]["dataset"] == "digits" and rows["p1"]["dataset_uri"] == "/data/digits"
    filtered = json.loads(_cli("runs", "--root", str(tmp_path), "--json", "--filter", "dataset=*blobs").output)
    assert [r["run_id"] for r in filtered] == ["f1"]
    lineage = render_report(folder).split("<h2>Lineage</h2>", 1)[1].split("</ol>", 1)[0]
    first, second = lineage.split("<li>")[1:3]
    assert "dataset_factory <code>mydata:blobs</code>" in first and "not on the data set prewarmed and preprocessed" in first
    assert "data set <code>/data/digits</code>" in second


def _column(text: str, name: str) -> list[str]:
    """A boxed table's column ``name``, each row's fragments (folded or wrapped over lines) joined without spaces."""
    lines = [l for l in text.splitlines() if l[:1] in "┃│"]
    head_lines = [l for l in lines if l.startswith("┃")]
    heads = [" ".join(parts).split() for parts in zip(*[[c.strip() for c in l.split("┃")[1:-1]] for l in head_lines])]
    index = [" ".join(h) for h in heads].index(name)
    rows: list[str] = []
    for line in (l for l in lines if l.startswith("│")):
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[0] or not rows:
            rows.append(cells[index])
        else:  # a continuation line of the row above
            rows[-1] += cells[index]
    return [r.replace(" ", "") for r in rows]


def test_runs_show_piped_prints_plain_columns_and_a_narrow_terminal_cuts_no_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: `heteroflow runs show RUN | cat` printed a box cut at 80 columns (the error `heterof…`, the
    device `(ascend…`), where `heteroflow runs` and `archive list` print plain columns. Piped it prints plain columns
    now, every cell whole; in a terminal it keeps rich's table, folds the device and the error over lines (never
    `…`) and hides the least useful columns, named, where even that does not fit."""
    import io

    from rich.console import Console

    from heteroflow.pipelines.cli import runs as runs_cli
    from heteroflow.pipelines.cli.main import app

    error = "class column 'species' not found in /data/penguins/part-0001.csv; columns: a, b"
    _run(tmp_path / "c", "20261201-120000-cccc", 300.0, status="failed", fallbacks=[], steps=[
        {"name": "prewarm", "status": "succeeded", "kind": "cpu", "candidate": 0, "attempts": 1, "seconds": 0.2},
        {"name": "preprocess", "status": "failed", "kind": "npu", "accelerator": "ascend-910", "simulated": True, "candidate": 0,
         "attempts": 1, "seconds": 1.5, "failure": "permanent", "error": f"heteroflow.cache.errors.DatasetError: {error}"}])
    piped = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "show", "20261201-120000"], env={"COLUMNS": "80"})
    assert piped.exit_code == 0, piped.output
    lines = piped.output.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("step "))
    rows = _plain("\n".join(lines[start:start + 3]))
    assert [(r["step"], r["status"], r["device"], r["error"]) for r in rows] == [
        ("prewarm", "succeeded", "cpu", "-"), ("preprocess", "failed", "npu (ascend-910, simulated, on cpu)", error)]
    assert not any(c in piped.output for c in "│┃━─…")

    for width in (80, 60):
        out = io.StringIO()
        monkeypatch.setattr(runs_cli, "console", Console(file=out, force_terminal=True, width=width, color_system=None, soft_wrap=True))
        assert CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "show", "20261201-120000"]).exit_code == 0
        text = out.getvalue()
        table = [l for l in text.splitlines() if l[:1] in "┏┃┡│└"]
        assert table and all(len(l) <= width for l in table) and "…" not in text, text
        assert _column(text, "error") == ["-", error.replace(" ", "")], text
        assert _column(text, "device") == ["cpu", "npu(ascend-910,simulated,oncpu)"], text
        assert _column(text, "step") == ["prewarm", "preprocess"] and _column(text, "status") == ["succeeded", "failed"]
        hidden = "candidate" if width == 80 else "candidate, attempts, seconds"
        assert f"hidden at {width} columns: {hidden} (a wider terminal shows them; --json has all)" in text, text


def test_the_other_tables_fold_a_long_cell_in_a_narrow_terminal_and_compare_prints_plain_columns_piped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Siblings of `runs show`'s cut cells: `runs compare`, `engines` and `heteroflow run`'s steps table ended a long
    cell in `…` at a narrow terminal; each folds it now. `runs compare` piped prints plain columns, as `runs` does."""
    import io

    from rich.console import Console

    from heteroflow.pipelines.cli import main as main_cli
    from heteroflow.pipelines.cli import runs as runs_cli
    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.cli.summary import _steps_table
    from heteroflow.pipelines.runs.records import StepSummary

    _default_runs(tmp_path)
    args = ["runs", "--root", str(tmp_path), "compare", "20261201-100000", "20261201-120000"]
    piped = CliRunner().invoke(app, args, env={"COLUMNS": "80"}).output
    rows = {r["field"]: r for r in _plain(piped)}
    assert rows["error"]["20261201-120000-cccc"] == "preprocess (permanent): class column 'species' not found; columns: a, b"
    assert rows["dataset"]["differs"] == "*" and not any(c in piped for c in "│┃━─…")
    out = io.StringIO()
    monkeypatch.setattr(runs_cli, "console", Console(file=out, force_terminal=True, width=50, color_system=None, soft_wrap=True))
    assert CliRunner().invoke(app, args).exit_code == 0
    assert "…" not in out.getvalue() and "species'" in out.getvalue(), out.getvalue()

    out = io.StringIO()
    monkeypatch.setattr(main_cli, "console", Console(file=out, force_terminal=True, width=40, color_system=None, soft_wrap=True))
    assert CliRunner().invoke(app, ["engines"]).exit_code == 0
    assert "…" not in out.getvalue() and "kfp-loc" in out.getvalue(), out.getvalue()

    out = io.StringIO()
    step = StepSummary(name="train", status="succeeded", device="cpu", kind="gpu", accelerator="nvidia-a100-80gb",
                       simulated=True, candidate=1, attempts=2, seconds=3.0)
    Console(file=out, width=60, color_system=None).print(_steps_table([step]))
    assert "…" not in out.getvalue(), out.getvalue()
    assert _column(out.getvalue(), "device") == ["gpu(nvidia-a100-80gb,simulated,oncpu)[candidate1]"], out.getvalue()


def test_a_step_that_never_ran_shows_the_same_attempts_in_the_summary_runs_show_and_the_report(tmp_path: Path) -> None:
    """A new user's trial: after a failed run, evaluate and archive (never run) had `-` attempts in the run's summary
    and `0` in `runs show` (and the report's step graph): every view says `-` now; a step that ran keeps its count."""
    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.report import render_report

    _run(tmp_path / "f", "20261201-130000-ffff", 400.0, status="failed", fallbacks=[], steps=[
        {"name": "train", "status": "failed", "kind": "cpu", "candidate": 0, "attempts": 1, "seconds": 0.1, "failure": "permanent",
         "error": "ValueError: bad"},
        {"name": "evaluate", "status": "not run", "candidate": None, "attempts": 0, "seconds": None}])
    shown = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "show", "20261201-130000"], env={"COLUMNS": "80"}).output
    lines = shown.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("step "))
    assert [(r["step"], r["attempts"]) for r in _plain("\n".join(lines[start:start + 3]))] == [("train", "1"), ("evaluate", "-")]
    summary = {r["step"]: r["attempts"] for r in _table(summary_text(load_run(tmp_path / "f")))}
    assert summary == {"train": "1", "evaluate": "-"}
    graph = render_report(load_run(tmp_path / "f")).split('data-step="evaluate"', 1)[1].split("</div>", 1)[0]
    assert "attempts: -" in graph and "attempts: 0" not in graph


def test_waits_of_loop_iterations_that_retried_side_by_side_are_not_worded_as_time_of_the_run(tmp_path: Path) -> None:
    """A new user's trial: "retries: 3, 20.3 s spent waiting of the run's 16.0 s": the waits of loop iterations that
    ran side by side were summed and set against the wall time. The sum is named as such now, beside the time at
    least one retry was waiting (the union of the waits, from the attempt records), which the wall time bounds;
    the summary, `runs show` and the report say the same."""
    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.report import render_report

    folder = _run(tmp_path / "loop", "20261201-140000-llll", 500.0, wall_seconds=18.0, fallbacks=[], steps=[
        {"name": "train", "status": "succeeded", "kind": "cpu", "candidate": 0, "attempts": 3, "seconds": 3.0,
         "iterations": [{"iteration": 0, "item": 0.1, "status": "succeeded", "attempts": 2},
                        {"iteration": 1, "item": 0.01, "status": "succeeded", "attempts": 3}]}])
    spans = {0: [(0.0, 1.0, "failed"), (6.0, 7.0, "succeeded")],  # waited 1 -> 6
             1: [(0.0, 1.2, "failed"), (6.3, 7.0, "failed"), (17.4, 18.0, "succeeded")]}  # 1.2 -> 6.3, 7 -> 17.4
    for i, attempts_of in spans.items():
        where = folder / "steps" / "train" / f"iteration-{i}"
        where.mkdir(parents=True)
        for n, (start, end, status) in enumerate(attempts_of, 1):
            (where / f"attempt-{n}.json").write_text(json.dumps(
                {"attempt": n, "iteration": i, "status": status, "failure": "transient" if status == "failed" else None,
                 "candidate": 0, "kind": "cpu", "started_at": 1000 + start, "ended_at": 1000 + end, "error": "timed out"}))
    said = ("20.5 s spent waiting, summed over the retries (loop iterations waited side by side); "
            "15.7 s of the run's 18.0 s with at least one waiting")
    assert f"retries: 3, {said}" in summary_text(load_run(folder))
    shown = CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "show", "20261201-140000"], env={"COLUMNS": "300"}).output
    assert f"retries: 3, {said}" in shown, shown
    html = render_report(load_run(folder))
    assert said.replace("'", "&#x27;") in html and "20.5 s over 3 retries" not in html


def test_a_fallback_inside_a_loop_is_named_with_its_iteration() -> None:
    """The fallback lines of the summary and `runs show` said `fallback: train left candidate 0` for a fallback in
    loop iteration 1 (the other views say `train[1]`)."""
    from heteroflow.pipelines.runs.folders import fallback_step

    assert fallback_step({"step": "train", "iteration": 1}) == "train[1]"
    assert fallback_step({"step": "train", "iteration": 2, "outer_iterations": [0]}) == "train[0][2]"
    assert fallback_step({"step": "train"}) == "train"


@pytest.mark.parametrize(("elapsed", "said"), [
    (17.8, "run succeeded in 5.0 s (17.8 s with the airflow engine's start-up); record: "),
    (6.9, "run succeeded in 5.0 s; record: "),  # within 2 s (or a quarter) of the record's time: not said (kfp.local's start)
    (None, "run succeeded in 5.0 s; record: "),
])
def test_the_summary_says_the_engines_start_up_beside_the_records_time(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                        elapsed: float | None, said: str) -> None:
    """A new user's trial: `heteroflow run --engine airflow` said "run succeeded in 6.4 s" after 19.7 s; the record
    times the DAG's run, not Airflow's start-up before it. The command's own wait is said beside it."""
    from heteroflow.dags.engine import _read_record
    from heteroflow.pipelines.cli.summary import _print_record
    from heteroflow.pipelines.default import default_pipeline

    folder = _run(tmp_path / "r", "r", 100.0, fallbacks=[], steps=[], run_dir=str(tmp_path / "r"))
    _print_record(_read_record(folder / "run.json"), default_pipeline(), elapsed=elapsed, engine="airflow")
    out = " ".join(capsys.readouterr().out.split())
    assert f"{said}{folder}/run.json" in out, out


AIRFLOW_RUN_ID = "manual__2026-12-05T01-13-26.141476-00-00-heteroflow-engine-heteroflow-default"


def _terminal(monkeypatch: pytest.MonkeyPatch, module: Any, width: int) -> Any:
    import io

    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(module, "console", Console(file=out, force_terminal=True, width=width, color_system=None, soft_wrap=True))
    return out


def _header(text: str) -> list[str]:
    """The header's column names, those drawn zero wide as "" (`┃┃`); a table without its outer edge too."""
    lines = text.splitlines()
    line = next((l for l in lines if l.startswith("┃")), None)
    if line is None:  # no outer edge: the line above the header's rule
        line = lines[next(i for i, l in enumerate(lines) if l.startswith("━")) - 1]
    return [c.strip() for c in line.strip("┃ ").split("┃")]


@pytest.mark.parametrize(("width", "shown", "note"), [
    # a new user's trial, after an airflow engine run: `status` and `accuracy` drawn zero wide (`┳┳┓`, `│││`) and
    # not counted in the note; the 77-character id leaves room for nothing else at 80 columns
    (80, ["run"], "10 columns hidden at 80 columns: started UTC, status, pipeline, dataset, model, device, accuracy, seconds, "
                  "error, fallbacks (a wider terminal shows them; --json has all)"),
    (100, ["run", "status"], "9 columns hidden at 100 columns: started UTC, pipeline, dataset, model, device, accuracy, "
                             "seconds, error, fallbacks"),
    (120, ["run", "status", "model", "accuracy"], "7 columns hidden at 120 columns: started UTC, pipeline, dataset, device, "
                                                  "seconds, error, fallbacks"),
])
def test_a_long_run_id_hides_whole_columns_by_priority_never_draws_one_zero_wide(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int, shown: list[str], note: str) -> None:
    from heteroflow.pipelines.cli import runs as runs_cli
    from heteroflow.pipelines.cli.main import app

    _run(tmp_path / "heteroflow-default" / AIRFLOW_RUN_ID, AIRFLOW_RUN_ID, 1_764_900_000.0, pipeline="heteroflow-default",
         params={"dataset_uri": "/data/iris"}, results={"archive": {"name": "iris-mlp", "version": 2, "path": "/x"}})
    _run(tmp_path / "b", "20261201-100000-aaaa", 1_764_800_000.0, pipeline="heteroflow-default")
    out = _terminal(monkeypatch, runs_cli, width)
    assert CliRunner().invoke(app, ["runs", "--root", str(tmp_path)]).exit_code == 0
    text = out.getvalue()
    assert _header(text) == shown, text
    assert not any(s in text for s in ("┳┳", "││", "╇╇", "┴┴")), text
    lines = text.splitlines()
    assert any(AIRFLOW_RUN_ID in l for l in lines), text  # whole, on one line
    assert all(len(l) <= width for l in lines if not l.startswith(tuple("0123456789"))), text
    assert " ".join(text.split()).count(note) == 1, text


def test_the_runs_show_table_hides_a_column_that_does_not_fit_rather_than_draw_it_zero_wide(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Siblings: a step of yours with a long name left `runs show` no room for its status, drawn zero wide."""
    from heteroflow.pipelines.cli import runs as runs_cli
    from heteroflow.pipelines.cli.main import app

    step = "load_the_customer_churn_tables_and_join_them_with_billing"  # 57 characters: room for the status
    _run(tmp_path / "r", "20261201-100000-aaaa", 100.0, fallbacks=[], steps=[
        {"name": step, "status": "succeeded", "kind": "cpu", "candidate": 0, "attempts": 1, "seconds": 0.2}])
    out = _terminal(monkeypatch, runs_cli, 80)
    assert CliRunner().invoke(app, ["runs", "--root", str(tmp_path), "show", "20261201-100000"]).exit_code == 0
    text = out.getvalue()
    assert _header(text) == ["step", "status"], text
    assert step in text and not any(s in text for s in ("┳┳", "││")), text
    assert "5 columns hidden at 80 columns: device, candidate, attempts, seconds, error (a wider" in " ".join(text.split()), text


def test_runs_shows_no_model_for_a_pipeline_without_an_archive_step(tmp_path: Path) -> None:
    """A new user's trial: `runs` listed `messy-mlp` for a pipeline composed without an archive step (the name it
    would have had, but such a run archives nothing). A run of the default pipeline that failed before archiving
    still shows the name its model will have."""
    from heteroflow.pipelines.cli.runs_rows import run_row
    from heteroflow.pipelines.runs.folders import load_run

    _run(tmp_path / "n", "no-archive", 100.0, params={"dataset_uri": "/data/messy"},
         steps=[{"name": "preprocess", "status": "succeeded"}, {"name": "train", "status": "succeeded"}])
    _run(tmp_path / "f", "failed-before", 200.0, status="failed", params={"dataset_uri": "/data/messy"},
         steps=[{"name": "train", "status": "failed"}, {"name": "archive", "status": "not run"}])
    models = {r["run_id"]: r["model"] for r in (run_row(load_run(tmp_path / f)) for f in ("n", "f"))}
    assert models == {"no-archive": None, "failed-before": "messy-mlp"}, models


def report(files: int) -> dict:
    """A step of a user's, named as the run's own report line is.

    Args:
        files: how many.
    """
    return {"files": files}


def test_a_step_named_report_is_not_taken_for_the_runs_report_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new user's trial: a step named `report` printed `report: files 4` beside the run's own `report: <path>`.
    Its summary line says it is a step's; another step's line is as it was."""
    from heteroflow.components.core.step import step
    from heteroflow.dags.engine import _read_record
    from heteroflow.pipelines.cli.summary import _print_record
    from heteroflow.pipelines.graph import Pipeline

    p = Pipeline("p")
    p.add(step(report), files=p.param("files"))
    p.add(step(report, name="count"), files=p.param("files"))
    folder = _run(tmp_path / "r", "r", 100.0, fallbacks=[], steps=[], run_dir=str(tmp_path / "r"),
                  results={"report": {"files": 4}, "count": {"files": 4}})
    (folder / "report.html").write_text("<html></html>")
    _print_record(_read_record(folder / "run.json"), p)
    lines = capsys.readouterr().out.splitlines()
    assert "step report: files 4" in lines and "count: files 4" in lines, lines
    assert [line for line in lines if line.startswith("report:")] == [f"report: {folder}/report.html"]


def test_the_placement_line_says_a_training_took_a_kept_model_rather_than_resumed() -> None:
    """A review: a rerun whose train took the model an earlier run finished (not trained again) said 'candidate 2 ->
    cpu; resumed from step 600' in its placement line, as if it had trained from a checkpoint. The sibling, a real
    resume, still says so."""
    from heteroflow.pipelines.runs.folders import ran_on

    run = {"steps": [{"name": "train", "status": "succeeded", "kind": "cpu", "device": "cpu", "candidate": 2}],
           "placement": {"train": {"index": 2}},
           "results": {"train": {"resumed_from_step": 600, "steps": 600, "reused_model": "/ck/abc/finished"}}}
    assert ran_on(run, "train") == "candidate 2 -> cpu; took the model an earlier run finished (600 steps)"
    del run["results"]["train"]["reused_model"]
    assert ran_on(run, "train") == "candidate 2 -> cpu; resumed from step 600"
