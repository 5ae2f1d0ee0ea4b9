"""Faults found trying heteroflow as a new user would (issue #8), each input kept as a test with a sibling:

1. live progress in a terminal; 5. one model-name rule; 8. one line, not a traceback, for user errors and a
pointer to the traceback for unexpected ones; 10. what a kill leaves behind is recovered; 11. lineage a user can
reach (``heteroflow archive list|show``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from heteroflow.pipelines.cli.main import app

HETEROFLOW = Path(sys.executable).with_name("heteroflow")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _script(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HETEROFLOW), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100", **(env or {})},
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# --- 1. live progress ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux `script` (a pseudo-terminal) is not installed here")
def test_the_steps_table_fills_in_live_in_a_terminal_with_trains_progress(
    digits_dir: Path, tmp_path: Path, pause_train_at_checkpoint
) -> None:
    """Issue input: ``script -qc "heteroflow run --param epochs=20" /dev/null`` showed no live table."""
    transcript = tmp_path / "typescript"
    # long enough (about 8 s of training) that the live table, refreshed 4 times a second from records written at
    # most twice a second, shows train's progress more than once on any machine: 12 epochs of 20 steps, a
    # checkpoint at the end of each, and train pausing 0.75 s after each checkpoint (a pause, not CPU work: 100
    # epochs of batches of 16 cost about 45 s of CPU for the same frames)
    command = (f"{HETEROFLOW} run --param epochs=12 --param batch_size=64 --param checkpoint_every_steps=20 "
               f"--dataset {digits_dir} --output {tmp_path / 'run'}")
    proc = subprocess.run(
        ["script", "-qec", command, str(transcript)],
        env={**os.environ, "COLUMNS": "140", "TERM": "xterm", **pause_train_at_checkpoint(1, seconds=0.75)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", transcript.read_text(errors="replace"))
    # the live table showed train running with its epoch, loss and throughput, before the final table
    live = re.findall(r"train\s*│\s*running.*?epoch (\d+)/12, loss [0-9.]+, [0-9,]+ samples/s", frames)
    assert live, "no live frame with train running and its progress"
    assert len(set(live)) > 1, f"the progress did not move: {live}"
    final = frames.rindex("run succeeded")
    assert frames.index("running") < final
    # sibling: the live table also showed the steps before train (prewarm running or succeeded) while it ran
    assert re.search(r"prewarm\s*│\s*(running|succeeded)", frames[: frames.index("running")] + frames)


# --- 5. one model-name rule -----------------------------------------------------------------------------

IRIS_ROWS = [
    (5.1, 3.5, 1.4, 0.2, 0), (4.9, 3.0, 1.4, 0.2, 0), (7.0, 3.2, 4.7, 1.4, 1), (6.4, 3.2, 4.5, 1.5, 1),
    (6.3, 3.3, 6.0, 2.5, 2), (5.8, 2.7, 5.1, 1.9, 2),
]


def _iris_like(folder: Path, copies: int = 12) -> Path:
    folder.mkdir(parents=True)
    lines = ["sepal_length,sepal_width,petal_length,petal_width,label"]
    for i in range(copies):
        for row in IRIS_ROWS:
            lines.append(",".join(f"{v + 0.01 * i:.2f}" if j < 4 else str(v) for j, v in enumerate(row)))
    (folder / "iris.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_model_name_default_is_one_rule_in_params_and_the_compiled_pipeline(tmp_path: Path) -> None:
    from heteroflow.components.models.archive import default_model_name
    from heteroflow.pipelines.default import default_pipeline

    listed = json.loads(CliRunner().invoke(app, ["params", "--json"]).stdout)["model_name"]
    assert listed["default"] == ""  # empty: derived from the data set folder at run time, everywhere
    assert "<data set folder name>-mlp" in listed["help"]
    assert default_pipeline().params["model_name"].default == ""
    assert default_model_name("/data/iris") == "iris-mlp"
    # siblings: a trailing slash, a URL, and a folder name that is not a valid model name as written
    assert default_model_name("/data/iris/") == "iris-mlp"
    assert default_model_name("s3://bucket/tables/Iris Data/") == "iris-data-mlp"
    assert default_model_name("http://alice:pw@host/d/wine_quality?x=1") == "wine_quality-mlp"
    # a new user's folders: 'café' made 'café-mlp', which archive refused after training; a name of no Latin
    # letter keeps the fallback; a run of other characters is one dash ('data--2024-mlp' before)
    from heteroflow.components.models.archive import check_model_name

    for folder, name in (("/tmp/café", "cafe-mlp"), ("/tmp/数据", "model-mlp"), ("/tmp/Data (2024)", "data-2024-mlp"),
                         ("/tmp/Ünïcode Tábles", "unicode-tables-mlp")):
        assert default_model_name(folder) == name
        check_model_name(name)
    assert default_model_name("/tmp/café", "mods:réseau") == "cafe-reseau"
    # a new user's trial: the README's digits_models:mlp archived as digits-mlp, the built-in model's name, and the
    # latest digits-mlp then needed examples/ on the path to load
    assert default_model_name("/data/digits", "digits_models:mlp") == "digits-digits_models-mlp"
    assert default_model_name("/data/digits", "heteroflow.components.training.loop:mlp") == default_model_name("/data/digits") == "digits-mlp"


def test_the_python_api_pipeline_archives_under_the_data_sets_name(tmp_path: Path) -> None:
    """Issue input: the README's "Compose in Python" pipeline run on an iris folder archived as digits-mlp."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    iris = _iris_like(tmp_path / "iris")
    record = run_inprocess(
        default_pipeline(train_candidates=["cpu:cpu=1"]), {"dataset_uri": str(iris), "epochs": 2}, run_dir=tmp_path / "run"
    )
    assert record.status == "succeeded", [(s.name, s.error) for s in record.steps]
    assert record.results["archive"]["name"] == "iris-mlp"
    assert Path(record.results["archive"]["path"]).parent.name == "iris-mlp"


# --- 8. user errors are one line; unexpected errors point at their traceback ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "path"),
    [
        (["compile", "-o", "/proc/heteroflow/x.yaml"], "/proc/heteroflow"),  # the input
        (["run", "--output", "/proc/heteroflow/run"], "/proc/heteroflow"),  # sibling: the run folder
        (["archive", "list", "--root", "/proc/self/status"], None),  # sibling: a file where a folder is expected
    ],
    ids=["compile-unwritable", "run-folder-unwritable", "archive-root-is-a-file"],
)
def test_an_os_error_on_a_user_path_is_one_line(args: list[str], path: str | None, tmp_path: Path) -> None:
    proc = _script(args)
    assert "Traceback" not in proc.stdout + proc.stderr
    if path is None:  # nothing archived there: said in one line, exit 0
        assert proc.returncode == 0, proc.stderr
        assert "no archived model under /proc/self/status" in _flat(proc.stdout)
        return
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert path in lines[0]


@pytest.mark.slow
def test_an_unexpected_error_prints_one_line_and_where_its_traceback_is(tmp_path: Path) -> None:
    (tmp_path / "brokenpipeline.py").write_text("def build():\n    raise RuntimeError('boom in the user code')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    proc = _script(["params", "--pipeline", "brokenpipeline:build"], env=env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    # --debug is a global option: the hint puts it before the command (`params --debug` is "No such option")
    match = re.search(r"unexpected RuntimeError: boom in the user code \(traceback in (\S+); rerun as `heteroflow --debug params \.\.\.` to print it\)", lines[0])
    assert match, lines[0]
    assert "raise RuntimeError('boom in the user code')" in Path(match[1]).read_text()
    debug = _script(["--debug", "params", "--pipeline", "brokenpipeline:build"], env=env)
    assert "Traceback" in debug.stderr and debug.returncode == 1
    # a fresh-user trial put it after the command: accepted there too (click alone says "No such option")
    late = _script(["params", "--pipeline", "brokenpipeline:build", "--debug"], env=env)
    assert "Traceback" in late.stderr and "boom in the user code" in late.stderr and late.returncode == 1


def test_debug_is_hoisted_before_the_command_but_not_past_a_double_dash() -> None:
    from heteroflow.pipelines.cli.main import hoist_debug

    assert hoist_debug(["predict", "m", "x.csv", "--debug"]) == ["--debug", "predict", "m", "x.csv"]
    assert hoist_debug(["--debug", "runs"]) == ["--debug", "runs"]
    assert hoist_debug(["runs"]) == ["runs"]
    assert hoist_debug(["step", "train", "--", "--debug"]) == ["step", "train", "--", "--debug"]


# --- 10. what a kill leaves behind ---------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_of_the_run_takes_its_steps_with_it_and_the_next_run_recovers(
    digits_dir: Path, heteroflow_home: Path, tmp_path: Path, pause_train_at_checkpoint
) -> None:
    """Issue input: SIGKILL of `heteroflow run` during train left train running for minutes, holding the lock,
    its record `running`; the next run failed three times on the lock.

    Issue #16.2: this test was flaky (train could finish before the kill landed). Train now pauses right after
    its checkpoint of step 20 is written, the point the test waits for, so the kill always lands mid-training."""
    env = {**os.environ, "HETEROFLOW_HOME": str(heteroflow_home)}
    args = [str(HETEROFLOW), "run", "--param", "epochs=40", "--param", "checkpoint_every_steps=20", "--dataset", str(digits_dir)]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env={**env, **pause_train_at_checkpoint(20)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240  # a deadline to give up, not a timing the test depends on
    while not (info := _checkpoint_info(heteroflow_home)) or info["step"] < 20:
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        assert proc.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.2)
    trainer = _lock_holder(heteroflow_home)
    steps = psutil.Process(proc.pid).children(recursive=True)
    assert trainer in [p.pid for p in steps], "train runs in a step process under the run"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(steps, timeout=60)  # paused for 120 s: only the run's death can end it sooner
    assert alive == [], f"step processes outlived the killed run: {[p.cmdline()[:3] for p in alive]}"

    rerun = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    runs = sorted((tmp_path / "heteroflow-runs").iterdir())
    killed, second = (json.loads((r / "run.json").read_text()) for r in runs)
    assert killed["status"] == "killed"
    assert {s["name"]: s["status"] for s in killed["steps"]}["train"] == "killed"
    assert not (runs[0] / "tmp").exists()
    assert second["status"] == "succeeded"
    assert second["metrics"]["train"]["resumed_from_step"] == 20
    assert {s["name"]: s["attempts"] for s in second["steps"]}["train"] == 1  # no attempt lost on a lock


def _checkpoint_info(home: Path) -> dict[str, int] | None:
    """The first train checkpoint's ``checkpoint.json`` under ``home``, or None while there is none."""
    for info in (home / "checkpoints").glob("*/checkpoint.json"):
        try:
            return json.loads(info.read_text())
        except (ValueError, OSError):  # being replaced right now
            return None
    return None


def _lock_holder(home: Path) -> int:
    """The pid train wrote into its checkpoint folder's lock file (``pid N``)."""
    text = next((home / "checkpoints").glob("*/.lock")).read_text()
    return int(text.split()[-1])


def test_a_killed_archive_leaves_no_incoming_folder_for_good(tmp_path: Path) -> None:
    """Issue input: SIGKILL of the archive step mid-copy left an `.incoming-*` folder for good."""
    from heteroflow.components.models.archive import archive

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.pt").write_bytes(b"weights")
    folder = tmp_path / "archive" / "m"
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = folder / f".incoming-{dead.pid}-abc123"  # what a killed writer leaves (read-only files inside)
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.pt").write_bytes(b"half")
    (stale / "model" / "model.pt").chmod(0o444)
    live = folder / f".incoming-{os.getpid()}-live"  # sibling: a writer that is still at work is left alone
    live.mkdir()
    result = archive(model, tmp_path / "archive", name="m", metrics={}, lineage={})
    assert result.version == 1
    assert not stale.exists()
    assert live.exists()


def test_a_stop_after_the_last_step_completed_records_the_run_as_succeeded(tmp_path: Path) -> None:
    """Issue input: SIGTERM while archive was finishing: the version was archived but the run said interrupted."""
    from heteroflow.components.core.telemetry import RUN_DIR_ENV, step_attempt
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.runs.records import build_record

    pipeline = default_pipeline()
    os.environ[RUN_DIR_ENV] = str(tmp_path)
    try:
        for call in pipeline.calls:
            with step_attempt(call.name):
                pass
    finally:
        del os.environ[RUN_DIR_ENV]
    done = build_record(pipeline, run_id="r", folder=tmp_path, started=0, wall_seconds=1, args={}, interrupted=True)
    assert done.status == "succeeded"
    # sibling: a stop before the last step completed is still an interruption
    (tmp_path / "steps" / "archive" / "attempt-1.json").unlink()
    assert build_record(pipeline, run_id="r", folder=tmp_path, started=0, wall_seconds=1, args={}, interrupted=True).status == "interrupted"


def test_a_step_running_when_the_run_was_interrupted_is_interrupted_everywhere(tmp_path: Path) -> None:
    """A new user's finding: after Ctrl-C the summary table and run.json said the running step was "killed" (red)
    while the report's attempts said "interrupted". A step caught running by the stop is "interrupted" in the
    record too; one whose process died while the run went on (no stop) is still "killed"."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.runs.records import build_record

    pipeline = default_pipeline()
    for n, name in enumerate(("prewarm", "preprocess", "plan", "train")):
        running = name == "train"  # the attempt record as the step process left it when the stop came
        record = {"step": name, "attempt": 1, "status": "running" if running else "succeeded", "pid": os.getpid(),
                  "started_at": float(n), "ended_at": None if running else n + 0.5, "kind": "cpu"}
        (tmp_path / "steps" / name).mkdir(parents=True)
        (tmp_path / "steps" / name / "attempt-1.json").write_text(json.dumps(record))
    # sibling: the same records in a run that ended without a stop (the engine gave up): train was killed
    ended = build_record(pipeline, run_id="r", folder=tmp_path, started=0, wall_seconds=1, args={}, interrupted=False)
    assert ended.status == "failed" and ended.step("train").status == "killed"
    stopped = build_record(pipeline, run_id="r", folder=tmp_path, started=0.5, wall_seconds=10.0, args={}, interrupted=True)
    assert stopped.status == "interrupted"
    assert {s.name: s.status for s in stopped.steps} == {"prewarm": "succeeded", "preprocess": "succeeded", "plan": "succeeded",
                                                         "train": "interrupted", "evaluate": "not run", "archive": "not run"}
    # the attempt's own record is closed too (a step process stopped by the run's SIGTERM left it "running", with no
    # end and no seconds, which the report's attempts table showed as "-")
    closed = json.loads((tmp_path / "steps" / "train" / "attempt-1.json").read_text())
    assert (closed["status"], closed["ended_at"], closed["seconds"]) == ("interrupted", 10.5, 7.5)
    assert stopped.step("train").seconds == 7.5
    assert json.loads((tmp_path / "steps" / "plan" / "attempt-1.json").read_text())["status"] == "succeeded"  # untouched


# --- 11. lineage a user can reach ------------------------------------------------------------------------


@pytest.fixture()
def archived(tmp_path: Path) -> Path:
    from heteroflow.components.models.archive import archive

    model = tmp_path / "model"
    model.mkdir()
    root = tmp_path / "archive"
    for accuracy, run in ((0.91, "20261129-100000-aaaa"), (0.95, "20261129-110000-bbbb")):
        (model / "model.pt").write_bytes(f"weights of {run}".encode())  # two models (#28.8: the same one is one version)
        archive(
            model,
            root,
            name="iris-mlp",
            metrics={"accuracy": accuracy, "precision": {"0": 1.0}},
            lineage={"run_id": run, "dataset": {"source_uri": "/data/iris", "dataset_sha256": "f00dcafe" * 8}, "device": "cpu"},
        )
    return root


def test_archive_list_shows_every_version_with_its_run(archived: Path) -> None:
    result = CliRunner().invoke(app, ["archive", "list", "--root", str(archived)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(r"^iris-mlp +v1 +.*0\.9100.*20261129-100000-aaaa$", result.output, re.M)  # piped: plain columns
    assert re.search(r"^iris-mlp +v2 +.*0\.9500.*20261129-110000-bbbb$", result.output, re.M)


def test_archive_show_gives_metrics_lineage_and_the_run(archived: Path) -> None:
    latest = CliRunner().invoke(app, ["archive", "show", "iris-mlp", "--root", str(archived)], env={"COLUMNS": "200"})
    assert latest.exit_code == 0, latest.output
    assert "iris-mlp v2" in latest.output and "20261129-110000-bbbb" in latest.output and "0.9500" in latest.output
    first = CliRunner().invoke(app, ["archive", "show", "iris-mlp:v1", "--root", str(archived)], env={"COLUMNS": "200"})
    assert "20261129-100000-aaaa" in first.output and "/data/iris" in first.output and "precision[0]" in first.output
    # piped (a trial found boxed tables with JSON wrapped inside their cells): plain columns, each value whole on its line
    narrow = CliRunner().invoke(app, ["archive", "show", "iris-mlp:v1", "--root", str(archived)], env={"COLUMNS": "60"})
    assert not any(c in narrow.output for c in "│┃━─…"), narrow.output
    assert re.search(r"^data set sha256 +f00dcafe{8}$".replace("f00dcafe{8}", "(f00dcafe){8}"), narrow.output, re.M), narrow.output
    assert re.search(r"^precision\[0\] +\d\.\d{4}$", narrow.output, re.M), narrow.output


@pytest.mark.parametrize(
    ("target", "message"),
    [("nosuch", "no archived model 'nosuch'"), ("iris-mlp:v9", "iris-mlp has no version v9; versions: v1, v2"), ("iris-mlp:2", "the version is written vN")],
    ids=["unknown-model", "unknown-version", "bad-version-form"],
)
def test_archive_show_errors_list_what_exists(archived: Path, target: str, message: str) -> None:
    result = CliRunner().invoke(app, ["archive", "show", target, "--root", str(archived)])
    assert result.exit_code == 2
    assert message in _flat(result.output)


# --- rerunning the same command (an --output folder) resumes --------------------------------------------


def test_rerunning_into_an_unfinished_runs_folder_sets_it_aside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Trial input: after Ctrl-C, `heteroflow run -o DIR` said "rerun the same command", and the same command
    then failed with "already holds a run"."""
    from heteroflow.pipelines.runs.records import prepare_run_dir

    interrupted = tmp_path / "int"
    (interrupted / "steps").mkdir(parents=True)
    (interrupted / "run.json").write_text('{"status": "interrupted"}')
    assert prepare_run_dir(interrupted) == interrupted.resolve()
    assert list(interrupted.iterdir()) == []
    assert json.loads((tmp_path / "int.previous-1" / "run.json").read_text())["status"] == "interrupted"
    assert f"run folder {interrupted} held a run that did not succeed (interrupted): moved aside to {tmp_path / 'int.previous-1'}" in capsys.readouterr().err

    # sibling: a killed run (driver gone, no run.json) first gets its record, then is set aside too
    killed = tmp_path / "k9"
    (killed / "steps" / "train").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (killed / "driver.json").write_text(json.dumps({"pid": dead.pid, "run_id": "k9", "pipeline": "p", "params": {}, "started_at": 0}))
    (killed / "steps" / "train" / "attempt-1.json").write_text(
        json.dumps({"step": "train", "attempt": 1, "status": "running", "pid": dead.pid, "started_at": 1.0})
    )
    prepare_run_dir(killed)
    record = json.loads((tmp_path / "k9.previous-1" / "run.json").read_text())
    assert record["status"] == "killed" and record["steps"][0]["status"] == "killed"


def test_a_finished_or_live_run_is_never_set_aside(tmp_path: Path) -> None:
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.pipelines.runs.records import prepare_run_dir

    done = tmp_path / "done"
    done.mkdir()
    (done / "run.json").write_text('{"status": "succeeded"}')
    with pytest.raises(InvalidParameter, match="already holds a run that succeeded"):
        prepare_run_dir(done)
    live = tmp_path / "live"
    live.mkdir()
    (live / "driver.json").write_text(json.dumps({"pid": os.getpid()}))
    with pytest.raises(InvalidParameter, match=r"holds a run that is still going \(pid"):
        prepare_run_dir(live)
    with pytest.raises(InvalidParameter, match=r"cannot create the run folder /proc/hf-out: .*give --output a folder you can write"):
        prepare_run_dir(Path("/proc/hf-out"))


# --- an error in the user's own code says where -----------------------------------------------------------------


@pytest.mark.slow
def test_an_error_in_your_model_factory_names_the_factory_and_keeps_its_traceback(digits_dir: Path, heteroflow_home: Path,
                                                                                  tmp_path: Path) -> None:
    """A new user's finding: a model factory that failed (the image CNN on the 64-column digits table) printed only
    "ValueError: not enough values to unpack (expected 3, got 1)", and no traceback was kept anywhere, --debug
    or not. The failed attempt now keeps its whole traceback beside its record, the summary names that file, and
    the error says which factory was called with what."""
    (tmp_path / "mymodels_u42.py").write_text(
        "import torch\n"
        "def cnn(input_shape, num_classes):\n"
        "    c, h, w = input_shape\n"
        "    return torch.nn.Conv2d(c, num_classes, 3)\n"
    )
    done = subprocess.run(
        [str(HETEROFLOW), "run", "--engine", "inprocess", "--dataset", str(digits_dir), "-p", "model=mymodels_u42:cnn",
         "--output", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "250", "HETEROFLOW_HOME": str(heteroflow_home), "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "step train failed (permanent failure): ValueError: not enough values to unpack (expected 3, got 1)" in out
    assert "(raised by model_factory mymodels_u42:cnn called with input_shape=(64,), num_classes=10)" in out
    where = tmp_path / "run" / "steps" / "train" / "attempt-1.traceback.txt"
    assert f"traceback: {where}" in out
    text = where.read_text()
    assert 'mymodels_u42.py", line 3, in cnn' in text and "c, h, w = input_shape" in text  # the user's own line
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    train = next(s for s in record["steps"] if s["name"] == "train")
    assert train["traceback_file"] == str(where)


def test_a_failed_attempt_keeps_its_traceback_and_a_succeeded_or_interrupted_one_writes_none(tmp_path: Path,
                                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.core.telemetry import RUN_DIR_ENV, read_step_records, step_attempt
    from heteroflow.pipelines.runs.records import StepSummary

    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))

    def inner() -> None:
        raise RuntimeError("token=https://user:secret@example.com/x broke")

    with pytest.raises(RuntimeError), step_attempt("fit"):
        inner()
    with step_attempt("fit"):
        pass
    with pytest.raises(KeyboardInterrupt), step_attempt("other"):
        raise KeyboardInterrupt
    records = read_step_records(tmp_path)
    failed, succeeded = records["fit"]
    assert failed.traceback_file == str(tmp_path / "steps" / "fit" / "attempt-1.traceback.txt")
    text = Path(failed.traceback_file).read_text()
    assert "in inner" in text and "secret" not in text  # credentials in a URL are redacted, as in the record
    assert succeeded.traceback_file is None and records["other"][0].traceback_file is None
    assert sorted(p.name for p in (tmp_path / "steps" / "fit").iterdir()) == ["attempt-1.json", "attempt-1.traceback.txt", "attempt-2.json"]
    # the summary points at the last failure's traceback while the step has not succeeded
    assert StepSummary.from_records("fit", [failed]).traceback_file == failed.traceback_file
    assert StepSummary.from_records("fit", [failed, succeeded]).traceback_file is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # the input: a factory whose items are bare numbers, not (input, label) pairs
        ("return [0.5, 1.5, 2.5]", r"item 0 of split 'train' is a float; valid: a pair \(input tensor or array, integer class index\)"),
        ("return [(torch.zeros(4), 0.5)] * 4", r"item 0 of split 'train' has label a float; valid: a pair"),
        ("return [([0.0] * 4, 1)] * 4", r"item 0 of split 'train' has input a list of 4 items; valid: a pair"),
        ("return [(torch.zeros(4), 1, 'extra')] * 4", r"item 0 of split 'train' is a tuple of 3 items"),
        ("return [] if split == 'validation' else [(torch.zeros(4), 1)] * 4", r"returned an empty Dataset for split 'validation'"),
    ],
    ids=["bare-numbers", "float-label", "list-input", "triple", "empty-split"],
)
def test_a_dataset_factory_whose_items_are_not_input_label_pairs_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                                    body: str, message: str) -> None:
    from heteroflow.components.data.readers import open_splits
    from heteroflow.components.errors import InvalidParameter

    module = f"userdata_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(f"import torch\ndef make(split):\n    {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidParameter, match=message):
        open_splits(tmp_path, dataset_factory=f"{module}:make")


def test_pairs_with_an_integer_label_of_any_kind_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.data.readers import open_splits

    (tmp_path / "userdata_okpairs.py").write_text(
        "import numpy as np, torch\n"
        "def make(split):\n"
        "    return [(torch.zeros(4), torch.tensor(1)), (np.zeros(4, dtype=np.float32), np.int64(0))] * 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    splits = open_splits(tmp_path, dataset_factory="userdata_okpairs:make")
    assert splits.input_shape == (4,) and splits.classes == ("0", "1")
