"""Whole runs from remote data sets (issue #11): an HTTP folder served on 127.0.0.1 by Python's ``http.server``,
and an S3 bucket on moto's server mode (a local S3-compatible test server, not AWS) with the credentials in the
environment. A URL that carries a password runs with a warning, and the password appears in no file under the
run folder or the heteroflow home, nor in the command's output. Bad sources fail as permanent errors without
spending retries; an unreachable host is retried as transient, then fails; nothing half-cached is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servers import files_containing, s3_test_server, serve_folder

HETEROFLOW = Path(sys.executable).with_name("heteroflow")
PASSWORD = "s3cretPW"


def _run(args: list[str], home: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HETEROFLOW), *args],
        cwd=cwd,
        env={**os.environ, "HETEROFLOW_HOME": str(home), "COLUMNS": "120", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture()
def served(digits_dir: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "www"
    (root / "digits").mkdir(parents=True)
    for f in digits_dir.glob("*.csv"):
        (root / "digits" / f.name).write_bytes(f.read_bytes())
    (root / "notes").mkdir()
    (root / "notes" / "README.txt").write_text("no data here\n")
    with serve_folder(root, auth=("alice", PASSWORD)) as base:
        yield base


@pytest.mark.slow
def test_a_run_from_an_http_folder_with_a_password_in_the_url_writes_the_password_nowhere(served: str, tmp_path: Path) -> None:
    home, run_dir = tmp_path / "home", tmp_path / "run"
    url = served.replace("http://", f"http://alice:{PASSWORD}@") + "/digits/"
    proc = _run(["run", "--dataset", url, "--param", "epochs=10", "--output", str(run_dir)], home, tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert record["metrics"]["evaluate"]["accuracy"] >= 0.9
    assert record["params"]["dataset_uri"] == served.replace("http://", "http://***@") + "/digits/"
    assert "warning:" in proc.stderr and "carries credentials" in proc.stderr  # says the safer way
    assert PASSWORD not in output
    assert files_containing([run_dir, home], PASSWORD) == []
    assert (run_dir / "kfp.log").read_text().count("***@") > 0  # the task inputs were logged, redacted


@pytest.mark.slow
def test_a_run_from_s3_with_credentials_in_the_environment(digits_dir: Path, tmp_path: Path) -> None:
    with s3_test_server({"s3://tables/digits": digits_dir}, secret_key="s3-test-secret-7f3a") as endpoint:
        assert endpoint.startswith("http://127.0.0.1:")
        home, run_dir = tmp_path / "home", tmp_path / "run"
        proc = _run(["run", "--dataset", "s3://tables/digits", "--param", "epochs=10", "--output", str(run_dir)], home, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["metrics"]["evaluate"]["accuracy"] >= 0.9
    assert record["results"]["prewarm"]["source_uri"] == "s3://tables/digits"
    assert files_containing([run_dir, home], "s3-test-secret-7f3a") == []


@pytest.mark.parametrize(
    ("path", "message"),
    [("nothing-here/", "404"), ("notes/", "has no .csv, .tsv, .parquet or .npz file (found: README.txt)")],
    ids=["404-folder", "no-data-files"],
)
def test_a_bad_http_source_is_refused_before_anything_runs(served: str, tmp_path: Path, path: str, message: str) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    url = served.replace("http://", f"http://alice:{PASSWORD}@") + "/" + path
    result = CliRunner().invoke(app, ["run", "--dataset", url, "--output", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert PASSWORD not in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("auth", "path", "failure"),
    [(True, "nothing-here/", "permanent"), (False, "digits/", "permanent")],
    ids=["404", "wrong-credentials-403"],
)
def test_bad_sources_are_permanent_failures_of_the_prewarm_step(
    served: str, tmp_path: Path, auth: bool, path: str, failure: str
) -> None:
    """On an engine without the CLI's up-front check (Airflow, a KFP server), the step itself fails at once."""
    from heteroflow.components.data.prewarm import PREWARM
    from heteroflow.components.core.runtime import run_step

    userinfo = f"alice:{PASSWORD}@" if auth else "alice:wrong@"
    url = served.replace("http://", f"http://{userinfo}") + "/" + path
    out = run_step(
        PREWARM,
        params={"source_uri": url, "cache_root": str(tmp_path / "tier")},
        outputs={"dataset": str(tmp_path / "ds")},
        run_dir=tmp_path / "run",
    )
    assert (out.status, out.failure) == ("failed", failure)
    assert PASSWORD not in (out.reason or "")
    assert not list((tmp_path / "tier").rglob("*.csv")), "something was left half-cached"


def test_a_folder_without_readable_data_is_cached_and_the_reader_fails_permanently(served: str, tmp_path: Path) -> None:
    """Issue 14: the cache tier caches any files (bytes and versions); the reader names the format it cannot read."""
    from heteroflow.components.data.preprocess import PREPROCESS
    from heteroflow.components.data.prewarm import PREWARM
    from heteroflow.components.core.runtime import run_step

    url = served.replace("http://", f"http://alice:{PASSWORD}@") + "/notes/"
    out = run_step(PREWARM, params={"source_uri": url, "cache_root": str(tmp_path / "tier")},
                   outputs={"dataset": str(tmp_path / "ds")}, run_dir=tmp_path / "run")
    assert out.status == "succeeded", out.reason
    pre = run_step(PREPROCESS, params={"num_workers": 1}, inputs={"dataset": str(tmp_path / "ds")},
                   outputs={"shards": str(tmp_path / "shards")}, run_dir=tmp_path / "run")
    assert (pre.status, pre.failure) == ("failed", "permanent")
    assert "no reader reads .txt files" in (pre.reason or "") and PASSWORD not in (pre.reason or "")


def test_an_unreachable_host_is_retried_as_transient_then_fails_clearly(tmp_path: Path) -> None:
    from heteroflow.components.resources import RetryPolicy
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    pipeline = default_pipeline()
    pipeline.replace("prewarm", retry=RetryPolicy(retries=2, backoff_seconds=1, max_delay_seconds=1))
    waits: list[float] = []
    record = run_inprocess(
        pipeline,
        {"dataset_uri": "http://127.0.0.1:9/digits/", "cache_root": str(tmp_path / "tier")},
        run_dir=tmp_path / "run",
        sleep=waits.append,
    )
    prewarm = record.step("prewarm")
    assert record.status == "failed"
    assert (prewarm.attempts, prewarm.failure) == (3, "transient")
    assert waits == [1.0, 1.0]
    assert "127.0.0.1:9" in prewarm.error
    assert record.step("preprocess").status == "not run"
    assert not list((tmp_path / "tier").rglob("*.csv"))
