"""`heteroflow prewarm` and `heteroflow cache status` (pipelines/cli/cache.py), through typer's CliRunner on an
app registered the way pipelines/cli/main.py registers them."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from heteroflow.cache.manifest import MANIFEST_NAME, Manifest
from heteroflow.pipelines.cli.cache import cache_app, prewarm_command

app = typer.Typer()
app.command("prewarm")(prewarm_command)
app.add_typer(cache_app, name="cache")
runner = CliRunner()


def test_prewarm_then_status(digits_dir: Path, tmp_path: Path, heteroflow_home: Path):
    out = tmp_path / "artifact"
    first = runner.invoke(app, ["prewarm", str(digits_dir), "--workers", "2", "--output", str(out)])
    assert first.exit_code == 0, first.output
    manifest = Manifest.load(out / MANIFEST_NAME)
    assert f"version {manifest.version}" in first.stdout
    assert f"copied {len(manifest.files)}" in first.stdout and "reused 0" in first.stdout
    assert Path(manifest.root).is_relative_to(heteroflow_home / "cache")
    again = runner.invoke(app, ["prewarm", str(digits_dir)])
    assert again.exit_code == 0 and "copied 0" in again.stdout and f"reused {len(manifest.files)}" in again.stdout

    status = runner.invoke(app, ["cache", "status"])
    assert status.exit_code == 0, status.output
    assert manifest.version in status.stdout and f"{len(manifest.files)}/{len(manifest.files)}" in status.stdout
    assert "100%" in status.stdout
    one = runner.invoke(app, ["cache", "status", str(digits_dir)])
    assert one.exit_code == 0 and manifest.version in one.stdout
    none = runner.invoke(app, ["cache", "status", "nothing-like-it"])
    assert none.exit_code == 2 and "no data set matching 'nothing-like-it'" in none.stdout


def test_prewarm_into_another_cache(digits_dir: Path, tmp_path: Path):
    result = runner.invoke(app, ["prewarm", str(digits_dir), "--cache", str(tmp_path / "tier")])
    assert result.exit_code == 0, result.output
    status = runner.invoke(app, ["cache", "status", "--cache", str(tmp_path / "tier")])
    assert "digits" in status.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["prewarm", "{tmp}/missing"], 2, "does not exist; give a folder (or fsspec URL) of data: tables (.csv, .tsv, .parquet, .npz), an image folder (one folder per class) or .pt tensors"),
        (["prewarm", "nosuch://b/d"], 2, "nosuch:// is not a known fsspec protocol"),
        (["prewarm", "{digits}", "--verify", "md5"], 2, "verify='md5' is not a verification mode; valid: size, stat, sha256"),
        (["prewarm", "{digits}", "--cache", "gs://b/c"], 2, "unknown cache scheme gs://"),
        (["prewarm", "{digits}", "--cache", "/proc/heteroflow-cache"], 2, "/proc/heteroflow-cache"),
        (["prewarm", "http://alice:s3cretPW@127.0.0.1:9/d/"], 1, "cannot reach the source"),
    ],
    ids=["missing-folder", "unknown-scheme", "bad-verify", "bad-cache-uri", "unwritable-cache", "unreachable"],
)
def test_errors_are_one_line(args: list[str], code: int, message: str, digits_dir: Path, tmp_path: Path):
    args = [a.format(tmp=tmp_path, digits=digits_dir) for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert all(len(line.split("\n")) == 1 for line in result.stderr.splitlines())
    assert "s3cretPW" not in result.output and "Traceback" not in result.output


def test_status_and_prune_read_a_killed_prewarms_journal_with_a_torn_last_line(digits_dir: Path, tmp_path: Path):
    """A review's input: a kill mid-write leaves a torn last journal line, which prewarm's resume ignores, but
    `cache status` and `cache prune` failed on it (`unexpected JSONDecodeError`, exit 1)."""
    import json

    from heteroflow.cache.layout import JOURNAL_NAME, STAGING_NAME

    tier = tmp_path / "tier"
    assert runner.invoke(app, ["prewarm", str(digits_dir), "--cache", str(tier)]).exit_code == 0
    [dataset] = [d for d in tier.iterdir() if d.is_dir()]
    (dataset / STAGING_NAME).mkdir()
    whole = json.dumps({"path": "a.csv", "bytes": 3, "sha256": "0" * 64, "source_key": "k", "mtime_ns": 1})
    (dataset / STAGING_NAME / JOURNAL_NAME).write_text(whole + "\n" + '{"path": "u.cs', encoding="utf-8")
    status = runner.invoke(app, ["cache", "status", "--cache", str(tier)])
    assert status.exit_code == 0, status.output
    from heteroflow.pipelines.cli.main import app as heteroflow_app

    prune = runner.invoke(heteroflow_app, ["cache", "prune", "--cache", str(tier), "--dry-run"])
    assert prune.exit_code == 0, prune.output
    from heteroflow.cache.status import cache_status

    [one] = [s for s in cache_status(str(tier)) if s.staged_files]
    assert one.staged_files == 1  # the whole line; the torn one is not a file
