"""``heteroflow submit``: a compiled pipeline sent to a Kubeflow Pipelines endpoint with ``kfp.Client``.

The end-to-end test needs a KFP API endpoint: it runs when ``HETEROFLOW_KFP_HOST`` is set (e.g.
``http://localhost:8080`` through ``kubectl port-forward svc/ml-pipeline-ui 8080:80 -n kubeflow``) and is skipped
with that reason otherwise. The input checks run everywhere: nothing is sent for a bad package or argument.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.default import default_pipeline
from heteroflow.pipelines.kfp.render import compile_pipeline
from heteroflow.pipelines.kfp.submit import SubmitError, submit_package


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_pipeline(default_pipeline(), tmp_path_factory.mktemp("pkg") / "default.yaml")


def test_a_missing_package_says_how_to_make_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["submit", str(tmp_path / "none.yaml"), "--host", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "does not exist; compile one with `heteroflow compile -o" in " ".join(result.output.split())


def test_a_file_that_is_not_a_compiled_pipeline_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: text\n")
    result = CliRunner().invoke(app, ["submit", str(bad), "--host", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "is not a compiled KFP pipeline" in result.output
    # not YAML at all: where, on one line (PyYAML's own text named the file `"<unicode string>"` over four lines)
    bad.write_text("root: {a: [1\n")
    result = CliRunner().invoke(app, ["submit", str(bad), "--host", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "is not a compiled KFP pipeline (line 2, column 1: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 1, column 11))" in said, said
    assert "unicode string" not in said


def test_unknown_and_mistyped_run_arguments_are_refused_before_sending(package: Path) -> None:
    result = CliRunner().invoke(app, ["submit", str(package), "--host", "http://127.0.0.1:9", "-p", "nosuch=1"])
    assert result.exit_code == 2
    assert "unknown run argument 'nosuch'; valid:" in result.output and "epochs" in result.output
    # a new user's trial: a near miss (the pipeline's parameter is dataset_uri) suggested nothing
    result = CliRunner().invoke(app, ["submit", str(package), "--host", "http://127.0.0.1:9", "-p", "dataset_url=x"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "unknown run argument 'dataset_url' (did you mean 'dataset_uri'?); valid:" in " ".join(result.output.split()), result.output
    result = CliRunner().invoke(app, ["submit", str(package), "--host", "http://127.0.0.1:9", "-p", "epochs=many"])
    assert result.exit_code == 2
    assert "epochs='many' is not a valid NUMBER_INTEGER" in result.output


def test_an_unreachable_endpoint_is_one_clear_error(package: Path) -> None:
    with pytest.raises(SubmitError, match=r"cannot submit .* to http://127.0.0.1:9"):
        submit_package(package, host="http://127.0.0.1:9", arguments={"dataset_uri": "s3://b/d"})


@pytest.mark.skipif(not os.environ.get("HETEROFLOW_KFP_HOST"), reason="HETEROFLOW_KFP_HOST is not set: no KFP endpoint to submit to")
def test_submit_creates_a_run_on_a_real_endpoint(package: Path) -> None:
    host = os.environ["HETEROFLOW_KFP_HOST"]
    dataset = os.environ.get("HETEROFLOW_KFP_DATASET_URI", "s3://heteroflow-test/digits")
    result = submit_package(package, host=host, arguments={"dataset_uri": dataset, "epochs": "1"})
    from kfp import Client

    run = Client(host=host).get_run(result["run_id"])
    assert run.run_id == result["run_id"]
