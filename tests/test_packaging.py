"""Packaging: the wheel holds the four mapped packages under the ``heteroflow`` package (whose own ``__init__``, the
public API, is mapped from pipelines/_root/), its metadata declares
the console script and the extras, and the layout keeps bare ``components`` / ``pipelines`` unimportable.

The wheel is built from a copy of the git-tracked files (so the build writes nothing into the checkout) with
``python -m build --wheel --no-isolation`` when setuptools and build are importable here (no network needed),
else with an isolated build (needs the package index).
"""

from __future__ import annotations

import configparser
import email.parser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("cache", "components", "pipelines", "dags")
ROOT_FOLDER = "pipelines/_root/"
"""Where ``heteroflow/__init__.py`` comes from (pyproject.toml's package-dir)."""
CRD_DATA = "cache/data/crds"
"""Where the shipped CRD files, their README and licence live (package data of heteroflow.cache)."""
EXTRAS = {"kfp", "airflow", "torch", "alluxio", "s3", "http", "dev", "sim", "onnx", "all"}


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.fail("git is not installed; the tracked files cannot be listed")
    proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{REPO} is not a git checkout ({proc.stderr.strip()}); run the tests from a clone")
    return [f for f in proc.stdout.split("\0") if f]


@pytest.fixture(scope="module")
def tracked() -> list[str]:
    return _tracked_files()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory, tracked: list[str]) -> Path:
    """Build the wheel from a copy of the tracked files; return its path."""
    if importlib.util.find_spec("build") is None:
        pytest.fail("the 'build' package is not installed; install the 'dev' extra (see the README)")
    src = tmp_path_factory.mktemp("src")
    for rel in tracked:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.append("--no-isolation")
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    wheels = list(out.glob("heteroflow-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _dist_info_file(wheel: Path, names: set[str], name: str) -> str:
    matches = [n for n in names if n.endswith(f".dist-info/{name}") and n.count("/") == 1]
    assert len(matches) == 1, f"{name} in {sorted(names)}"
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(matches[0]).decode("utf-8")


@pytest.mark.slow
def test_every_tracked_module_is_in_the_wheel_under_heteroflow(tracked: list[str], wheel_names: set[str]) -> None:
    modules = [f for f in tracked if f.endswith(".py") and f.split("/", 1)[0] in PACKAGE_FOLDERS and not f.startswith(ROOT_FOLDER)]
    assert {m.split("/", 1)[0] for m in modules} == set(PACKAGE_FOLDERS)
    missing = [m for m in modules if f"heteroflow/{m}" not in wheel_names]
    assert missing == [], f"tracked modules missing from the wheel: {missing}"
    for folder in PACKAGE_FOLDERS:
        assert f"heteroflow/{folder}/__init__.py" in wheel_names
        assert f"heteroflow/{folder}/py.typed" in wheel_names
    # heteroflow itself is a regular package whose __init__ (the one-import public API) comes from ROOT_FOLDER,
    # a folder inside pipelines/ (the top-level folders are fixed); that folder is not shipped a second time.
    assert "heteroflow/__init__.py" in wheel_names
    assert not any(n.startswith(f"heteroflow/{ROOT_FOLDER}") for n in wheel_names)
    top = {n.split("/", 1)[0] for n in wheel_names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"heteroflow"}
    assert not any(n.startswith(("heteroflow/tests/", "tests/", "heteroflow/examples/")) for n in wheel_names)


@pytest.mark.slow
def test_the_crd_schemas_and_their_licence_are_in_the_wheel(tracked: list[str], wheel_names: set[str]) -> None:
    from heteroflow.cache.crds import CRD_FILES, SCHEMA_DIR

    assert SCHEMA_DIR.parts[-3:] == tuple(CRD_DATA.split("/")), "the loader reads the folder that is shipped"
    for name in [*CRD_FILES.values(), "README.md", "LICENSE-Apache-2.0.txt"]:
        assert f"heteroflow/{CRD_DATA}/{name}" in wheel_names, name
    shipped = [f for f in tracked if f.startswith(f"{CRD_DATA}/")]
    assert len(shipped) == len(CRD_FILES) + 2, shipped  # every CRD, its README and its licence: nothing unlisted
    missing = [f for f in shipped if f"heteroflow/{f}" not in wheel_names]
    assert missing == [], f"tracked CRD data missing from the wheel: {missing}"
    assert not any(n.startswith("heteroflow/cache/schemas/") for n in wheel_names), "the old folder is gone"


def test_test_servers_are_not_part_of_the_package(tracked: list[str]) -> None:
    """The HTTP and S3 test servers heteroflow's own tests use live in tests/ (tests/servers.py), not in a runtime
    package, so a wheel never ships them."""
    assert "tests/servers.py" in tracked
    in_packages = [f for f in tracked if f.split("/", 1)[0] in PACKAGE_FOLDERS and f.endswith(".py")
                   and ("ThreadedMotoServer" in (REPO / f).read_text(encoding="utf-8")
                        or "SimpleHTTPRequestHandler" in (REPO / f).read_text(encoding="utf-8"))]
    assert in_packages == [], f"test servers inside the runtime packages: {in_packages}"
    assert importlib.util.find_spec("heteroflow.cache.testing") is None


@pytest.mark.slow
def test_the_wheel_holds_no_test_servers(wheel_names: set[str]) -> None:
    assert "heteroflow/cache/testing.py" not in wheel_names
    assert not any(n.endswith("/servers.py") for n in wheel_names)


@pytest.mark.slow
def test_wheel_entry_point_is_the_cli(wheel: Path, wheel_names: set[str]) -> None:
    parser = configparser.ConfigParser()
    parser.read_string(_dist_info_file(wheel, wheel_names, "entry_points.txt"))
    assert dict(parser["console_scripts"]) == {"heteroflow": "heteroflow.pipelines.cli.script:console_script"}


@pytest.mark.slow
def test_wheel_metadata_lists_extras_and_a_torch_range(wheel: Path, wheel_names: set[str]) -> None:
    from packaging.requirements import Requirement

    meta = email.parser.Parser().parsestr(_dist_info_file(wheel, wheel_names, "METADATA"))
    assert meta["Name"] == "heteroflow"
    assert set(meta.get_all("Provides-Extra") or []) >= EXTRAS
    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    torch_reqs = [r for r in requirements if r.name == "torch"]
    assert len(torch_reqs) == 1, [str(r) for r in torch_reqs]
    torch_req = torch_reqs[0]
    assert {(s.operator, s.version) for s in torch_req.specifier} == {(">=", "2.4")}, "torch must be a range, not a pin"
    assert torch_req.marker is not None and torch_req.marker.evaluate({"extra": "torch"})
    assert not torch_req.marker.evaluate({"extra": ""}), "torch is an extra, not a base dependency"
    for r in requirements:
        assert all(s.operator != "==" for s in r.specifier), f"{r} pins an exact version"
    extras_of_all = {e for r in requirements if r.name == "heteroflow" for e in r.extras}
    assert extras_of_all == {"torch", "kfp", "airflow", "alluxio", "s3", "http", "sim", "onnx"}


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _python_facts(code: str, cwd: Path) -> Any:
    """What ``code``, run in a fresh interpreter in ``cwd``, prints as JSON (it must succeed)."""
    proc = _python(code, cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("bare", ["components", "pipelines", "cache", "dags"])
def test_bare_folder_names_are_not_importable(tmp_path: Path, bare: str) -> None:
    proc = _python(
        f"try:\n    import {bare}\nexcept ModuleNotFoundError as e:\n    print('MNF', e.name)\n"
        f"else:\n    print('IMPORTED', {bare}.__file__)\n",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"MNF {bare}"


@pytest.mark.slow
def test_namespace_import_works_without_torch_kfp_or_airflow(tmp_path: Path) -> None:
    facts = _python_facts(
        "import sys, json\n"
        "import heteroflow.components.resources as r\n"
        "print(json.dumps({'file': r.__file__, 'heavy': sorted(m for m in ('torch', 'kfp', 'airflow') if m in sys.modules),"
        " 'ns_file': getattr(sys.modules['heteroflow'], '__file__', None),"
        " 'loaded': sorted(m for m in sys.modules if m.startswith('heteroflow.pipelines'))}))\n",
        tmp_path,
    )
    assert facts["heavy"] == [], f"importing heteroflow.components.resources imported {facts['heavy']}"
    assert Path(facts["file"]).name == "resources.py"
    assert Path(facts["ns_file"]).parts[-3:] == ("pipelines", "_root", "__init__.py"), facts["ns_file"]
    assert facts["loaded"] == [], "importing a subpackage must not import the public API's modules (they resolve lazily)"


@pytest.mark.slow
def test_the_public_api_is_one_import(tmp_path: Path) -> None:
    facts = _python_facts(
        "import sys, json\n"
        "from heteroflow import step, Pipeline, Resources, Candidates, RetryPolicy, default_pipeline, run, compile\n"
        "import heteroflow\n"
        "print(json.dumps({'all': sorted(heteroflow.__all__), 'run': run.__module__, 'compile': compile.__name__,"
        " 'heavy': sorted(m for m in ('torch', 'kfp', 'airflow') if m in sys.modules)}))\n",
        tmp_path,
    )
    assert {"step", "Pipeline", "Resources", "Candidates", "RetryPolicy", "default_pipeline", "run", "compile"} <= set(facts["all"])
    assert (facts["run"], facts["compile"]) == ("heteroflow.pipelines.engines.runner", "compile_pipeline")
    assert "airflow" not in facts["heavy"]


def test_the_placement_data_and_their_licences_are_in_the_wheel(wheel_names: set[str]) -> None:
    for name in ("data/README.md", "data/gavel/LICENSE", "data/gavel/derived_isolated_throughputs.csv",
                 "data/alibaba_pai/LICENSE.CC-BY-4.0", "data/alibaba_pai/pai_machine_spec.csv"):
        assert f"heteroflow/components/placement/{name}" in wheel_names


def test_defining_a_pipeline_and_starting_the_cli_import_no_numpy_pandas_torch_kfp_or_airflow(tmp_path: Path) -> None:
    """The command line, a pipeline definition and the shipped steps' modules import numpy and friends only when a
    step runs (Airflow's advice for DAG files, which its scheduler imports over and over; and ``heteroflow run``'s
    start is on every run's critical path). The steps' functions import them when called."""
    facts = _python_facts(
        "import sys, json\n"
        "import heteroflow.pipelines.cli.main, heteroflow.components.steps\n"
        "from heteroflow import Pipeline, default_pipeline\n"
        "p = default_pipeline()\n"
        "from heteroflow.components.training.step import check_train_params\n"
        "check_train_params(epochs=2)  # what a run checks before anything runs (it imports the training module)\n"
        "from heteroflow.components.data.preprocess import stratified_split\n"
        "heavy = sorted(m for m in ('numpy', 'pandas', 'torch', 'kfp', 'airflow', 'matplotlib', 'sklearn') if m in sys.modules)\n"
        "split = stratified_split(__import__('numpy').array([0, 1] * 10), validation_fraction=0.2, test_fraction=0.2, seed=0,"
        " too_few=ValueError)\n"
        "print(json.dumps({'heavy': heavy, 'calls': [c.name for c in p.calls], 'test': len(split['test'])}))\n",
        tmp_path,
    )
    assert facts["heavy"] == [], f"defining the default pipeline imported {facts['heavy']}"
    assert facts["calls"] == ["prewarm", "preprocess", "plan", "train", "evaluate", "archive"]
    assert facts["test"] == 4, "a step's function imports numpy itself when called"
