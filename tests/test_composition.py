"""Adding a step with a new parameter to a copy of the default pipeline is a change in one place: the parameter
shows up in ``heteroflow params``, in the compiled KFP YAML and in a kfp.local run, and no renderer is edited.

The toy step lives in a module written into a temporary folder and put on ``PYTHONPATH`` (kfp.local's step
processes import it by name, as a cluster image would import a user's package).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from heteroflow.pipelines.cli.main import app

TOY_MODULE = '''
"""A user's own step: writes a calibration report of a trained model."""
import json
from pathlib import Path

from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step
from heteroflow.pipelines.default import default_pipeline


def calibrate(model_dir: str, report_path: str, *, temperature_scale: float = 1.5) -> dict:
    """Write a calibration report for a trained model.

    Args:
        model_dir: train's model folder.
        report_path: where the report goes.
        temperature_scale: softmax temperature applied to the logits, > 0 (unit: ratio).
    """
    config = json.loads((Path(model_dir) / "model.json").read_text())
    report = {"temperature_scale": temperature_scale, "classes": len(config["classes"])}
    Path(report_path).write_text(json.dumps(report))
    return report


CALIBRATE = step(
    calibrate,
    inputs=[ArtifactSpec(name="model", type=ArtifactType.MODEL, param="model_dir")],
    outputs=[ArtifactSpec(name="report", type=ArtifactType.METRICS, param="report_path")],
)


def with_calibration():
    p = default_pipeline().copy("heteroflow-calibrated")
    p.add(CALIBRATE, model=p["train"].outputs.model)
    return p
'''


@pytest.fixture()
def toy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    folder = tmp_path / "userpkg"
    folder.mkdir()
    (folder / "toysteps.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))  # for kfp.local's step processes
    yield "toysteps"
    sys.modules.pop("toysteps", None)


def test_the_new_parameter_is_listed_by_heteroflow_params(toy_module: str) -> None:
    result = CliRunner().invoke(app, ["params", "--json", "--pipeline", f"{toy_module}:with_calibration"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert listed["temperature_scale"] == {
        "type": "float",
        "default": 1.5,
        "unit": "ratio",
        "help": "softmax temperature applied to the logits, > 0.",
    }
    assert "epochs" in listed  # the default pipeline's parameters are all still there


def test_the_new_parameter_is_in_the_compiled_yaml(toy_module: str, tmp_path: Path) -> None:
    out = tmp_path / "calibrated.yaml"
    result = CliRunner().invoke(app, ["compile", "-o", str(out), "--pipeline", f"{toy_module}:with_calibration"])
    assert result.exit_code == 0, result.output
    ir = next(yaml.safe_load_all(out.read_text()))
    root = ir["root"]["inputDefinitions"]["parameters"]
    assert root["temperature_scale"]["defaultValue"] == 1.5
    assert root["temperature_scale"]["parameterType"] == "NUMBER_DOUBLE"
    calibrate = [c for name, c in ir["components"].items() if name.startswith("comp-calibrate")]
    assert calibrate, "no calibrate component"
    assert "temperature_scale" in calibrate[0]["inputDefinitions"]["parameters"]
    assert ir["pipelineInfo"]["name"] == "heteroflow-calibrated"


@pytest.mark.slow
def test_the_new_step_runs_on_kfp_local_with_the_parameter(toy_module: str, digits_dir: Path, tmp_path: Path) -> None:
    from heteroflow.pipelines.graph import load_pipeline
    from heteroflow.pipelines.kfp.local import run_local

    pipeline = load_pipeline(f"{toy_module}:with_calibration")
    record = run_local(
        {"dataset_uri": str(digits_dir), "epochs": 1, "temperature_scale": 2.5}, pipeline=pipeline, run_dir=tmp_path / "run"
    )
    assert record.status == "succeeded", [(s.name, s.status, s.error) for s in record.steps]
    assert [s.name for s in record.steps][-1] == "calibrate"
    assert record.results["calibrate"] == {"temperature_scale": 2.5, "classes": 10}
    assert record.metrics["calibrate"] == {"temperature_scale": 2.5, "classes": 10}
    assert record.params["temperature_scale"] == 2.5


@pytest.mark.parametrize("script", ["custom_composition.py", "kfp_dsl.py"])
def test_the_composition_examples_compile(script: str, tmp_path: Path) -> None:
    """The examples/ scripts a user copies from: each compiles its pipeline (running them is the README's job)."""
    import subprocess

    example = Path(__file__).resolve().parents[1] / "examples" / script
    out = tmp_path / "p.yaml"
    proc = subprocess.run([sys.executable, str(example), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ir = next(yaml.safe_load_all(out.read_text()))
    assert ir["pipelineInfo"]["name"] in ("digits-gpu-or-cpu", "train-and-announce")


# --- the README's compose example: one import line, `--pipeline mymodule:p` -----------------------------------


@pytest.fixture()
def readme_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n# mymodule\.py\n(.*?)```", readme, re.S)
    assert block, "the README's compose example (a python block starting with '# mymodule.py') is missing"
    source = block.group(1)
    assert [line for line in source.splitlines() if line.startswith("from heteroflow")] == [
        next(line for line in source.splitlines() if line.startswith("from heteroflow import "))
    ], "the example imports heteroflow in one line"
    folder = tmp_path / "userpkg"
    folder.mkdir()
    (folder / "mymodule.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    yield "mymodule"
    sys.modules.pop("mymodule", None)


def test_the_readme_example_lists_its_parameters_and_compiles(readme_module: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["params", "--pipeline", f"{readme_module}:p", "--json"])
    assert result.exit_code == 0, result.output
    assert "top_k" in result.output and "dataset_uri" in result.output
    result = CliRunner().invoke(app, ["compile", "--pipeline", f"{readme_module}:p", "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0, result.output
    ir = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    assert ir["pipelineInfo"]["name"] == "my-pipeline"


@pytest.mark.slow
def test_the_readme_example_runs_with_heteroflow_run(readme_module: str, digits_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "--pipeline", f"{readme_module}:p", "--dataset", str(digits_dir), "-p", "epochs=1", "-p", "top_k=2",
         "-o", str(tmp_path / "run")],
    )
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert [f["kind"] for f in record["fallbacks"]] == ["npu", "gpu"]  # no planner: the chain falls back at run time
    report = next(s for s in record["steps"] if s["name"] == "report")
    assert report["status"] == "succeeded" and report["details"] == {"files": 2}


def test_no_folder_of_the_examples_shadows_a_module(tmp_path: Path) -> None:
    """The README puts examples/ on PYTHONPATH (step processes import digits_models by name). A folder there named
    like a module is then imported in its place: examples/docker, a namespace package, hid the docker SDK that
    kfp.local imports, and every kfp.local run failed with "module 'docker' has no attribute 'DockerClient'"
    (found by a fresh-user trial). No folder of examples/ may be named like an importable module."""
    import subprocess

    examples = Path(__file__).resolve().parents[1] / "examples"
    names = sorted(p.name for p in examples.iterdir() if p.is_dir() and p.name.isidentifier())
    code = "import importlib.util, sys; print([n for n in sys.argv[1:] if importlib.util.find_spec(n) is not None])"
    found = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert found.stdout.strip() == "[]", f"folders of examples/ named like installed modules: {found.stdout.strip()}"
    for name in ("docker", "kfp", "torch", "airflow", "kubernetes", "heteroflow"):  # also when not installed here
        assert not (examples / name).exists(), name


def test_the_default_pipelines_model_name_suggests_model_factory_in_a_composed_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: `heteroflow run --pipeline custom_composition:build --param model=mymodels:tiny` said
    "unknown parameter 'model' (did you mean 'model_args'?)". The README's `--param model=` is the default
    pipeline's name for train's `model_factory`; a pipeline composed from the steps names it so, and says it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    result = CliRunner().invoke(app, ["run", "--pipeline", "custom_composition:build", "--param", "model=mymodels:tiny"])
    assert result.exit_code == 2, result.output
    assert "unknown parameter 'model' (did you mean 'model_factory'?)" in " ".join(result.output.split()), result.output
