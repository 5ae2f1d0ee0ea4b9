"""The default pipeline on kfp.local, and its compiled KFP IR.

- Whole runs of the default pipeline with ``heteroflow.pipelines.local.run_local`` (kfp.local,
  SubprocessRunner): every step, the run record, the archive and its lineage, a rerun that copies nothing
  and archives a new version, and custom candidates.
- A golden test of the compiled YAML: ``build_default_pipeline()`` compiled with ``kfp.compiler.Compiler``,
  normalised (``sdkVersion`` dropped, every container ``image`` and every ``kfp==<version>`` replaced by a
  placeholder), parsed and compared *as data* with ``tests/golden/default_pipeline.yaml``. A difference
  fails with the key paths that differ.

  To regenerate the golden file after an intended change to the pipeline or the components, run::

      HETEROFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_pipeline_kfp.py -k golden

  then review ``git diff tests/golden/default_pipeline.yaml`` and commit it.
- Key facts read from the compiled IR directly: each branch's train (and evaluate) task asks for its
  candidate's accelerator, CPU and memory; every step task has its StepSpec's retry policy; prewarm, plan
  and archive have caching off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import torch

from kfp import compiler  # noqa: E402

from heteroflow.cache.prewarm import MANIFEST_NAME  # noqa: E402
from heteroflow.components.resources import Candidates, Resources  # noqa: E402
from heteroflow.components.spec import DEFAULT_STEPS, DEFAULT_TRAIN_CANDIDATES  # noqa: E402
from heteroflow.pipelines.default import build_default_pipeline  # noqa: E402
from heteroflow.pipelines.local import STEP_ORDER, RunRecord, run_local  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "default_pipeline.yaml"
UPDATE_GOLDEN_ENV = "HETEROFLOW_UPDATE_GOLDEN"

no_cuda = pytest.mark.skipif(
    torch.cuda.is_available() or importlib.util.find_spec("torch_npu") is not None,
    reason="a CUDA device (or torch_npu) is present here, so the plan may place training on it, not on cpu",
)

# kfp.local notes that it ignores resources (a known engine fact, see DESIGN.md); keep the output readable.
pytestmark = pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning")


# --- helpers ----------------------------------------------------------------------------------------------


def _tree_digest(root: Path) -> dict[str, tuple[str, int]]:
    """relative path -> (sha256, mode) of every file under root."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@dataclasses.dataclass
class FirstRun:
    home: Path
    params: dict[str, Any]
    record: RunRecord
    archive_v1: Path
    archive_v1_digest: dict[str, tuple[str, int]]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> FirstRun:
    """One run of the default pipeline (5 epochs on digits) with its own HETEROFLOW_HOME, shared by the module."""
    home = tmp_path_factory.mktemp("kfp-home")
    params = {"epochs": 5, "dataset_uri": str(digits_dir)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HETEROFLOW_HOME", str(home))
        mp.delenv("HETEROFLOW_RUN_DIR", raising=False)
        record = run_local(params=params, run_dir=tmp_path_factory.mktemp("kfp-run") / "run")
    archive_v1 = Path(record.archive["path"]) if record.archive else home / "archive" / "missing"
    digest = _tree_digest(archive_v1) if archive_v1.is_dir() else {}
    return FirstRun(home=home, params=params, record=record, archive_v1=archive_v1, archive_v1_digest=digest)


def _engine_log(record: RunRecord) -> str:
    log = Path(record.run_dir, "kfp.log")
    return log.read_text(errors="replace")[-4000:] if log.is_file() else "(no kfp.log)"


def _steps(record: RunRecord) -> str:
    return ", ".join(f"{s.name}={s.status}/{s.attempts}" for s in record.steps)


def _normalise(node: Any) -> Any:
    """Drop sdkVersion; replace container images and kfp version pins with placeholders (recursively)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "sdkVersion":
                continue
            if key == "image" and isinstance(value, str):
                out[key] = "<IMAGE>"
            else:
                out[key] = _normalise(value)
        return out
    if isinstance(node, list):
        return [_normalise(v) for v in node]
    if isinstance(node, str):
        return re.sub(r"\b(kfp[a-z_-]*)==[^\s'\"&;,]+", r"\1==<VERSION>", node)
    return node


def _compile(pipeline: Any, path: Path) -> list[Any]:
    compiler.Compiler().compile(pipeline, str(path))
    with open(path, encoding="utf-8") as fh:
        return list(yaml.safe_load_all(fh))


def _diff(expected: Any, actual: Any, path: str = "$") -> Iterator[str]:
    """Each difference as 'key path: expected ... != actual ...', in document order."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            sub = f"{path}.{key}"
            if key not in actual:
                yield f"{sub}: missing in the compiled pipeline (golden has {expected[key]!r:.200})"
            elif key not in expected:
                yield f"{sub}: not in the golden file (compiled has {actual[key]!r:.200})"
            else:
                yield from _diff(expected[key], actual[key], sub)
    elif isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            yield f"{path}: list length {len(expected)} in golden != {len(actual)} compiled"
        for i, (e, a) in enumerate(zip(expected, actual)):
            yield from _diff(e, a, f"{path}[{i}]")
    elif expected != actual or type(expected) is not type(actual):
        yield f"{path}: golden {expected!r:.300} != compiled {actual!r:.300}"


def _ir(docs: list[Any]) -> dict[str, Any]:
    assert len(docs) == 1, "the default pipeline compiles to one YAML document (no platform spec)"
    return docs[0]


def _leaf_tasks(ir: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(dag name, task name, task) for every task that runs a container (not a sub-DAG or a condition)."""
    dags = {"root": ir["root"]["dag"], **{n: c["dag"] for n, c in ir["components"].items() if "dag" in c}}
    for dag_name, dag in dags.items():
        for task_name, task in dag["tasks"].items():
            comp = ir["components"][task["componentRef"]["name"]]
            if "executorLabel" in comp:
                yield dag_name, task_name, task


def _container(ir: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    label = ir["components"][task["componentRef"]["name"]]["executorLabel"]
    return ir["deploymentSpec"]["executors"][label]["container"]


def _branch_dags(ir: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-candidate sub-pipelines, by component name (``comp-train-on-<kind>-<index>``)."""
    return {n: c["dag"] for n, c in ir["components"].items() if n.startswith("comp-train-on-") and "dag" in c}


# --- whole runs on kfp.local ------------------------------------------------------------------------------


@pytest.mark.slow
@no_cuda
def test_default_pipeline_runs_every_step_once_and_records_the_run(first_run: FirstRun) -> None:
    record = first_run.record
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    assert [s.name for s in record.steps] == list(STEP_ORDER)
    for step in record.steps:
        assert step.status == "succeeded", f"{step.name}: {step.error}"
        assert step.attempts == 1, f"{step.name} ran {step.attempts} attempts"
    assert record.step("train").device == "cpu"
    assert record.step("evaluate").device == "cpu"
    assert record.placement["torch_device"] == "cpu"
    assert record.placement["index"] == len(DEFAULT_TRAIN_CANDIDATES) - 1
    assert len(record.placement["passed_over"]) == len(DEFAULT_TRAIN_CANDIDATES) - 1
    assert record.params["epochs"] == 5

    run_json = Path(record.run_dir, "run.json")
    assert run_json.is_file()
    assert json.loads(run_json.read_text(encoding="utf-8")) == json.loads(json.dumps(record.to_dict(), default=str))
    for name in STEP_ORDER:
        assert Path(record.run_dir, "steps", name, "attempt-1.json").is_file()
        assert not Path(record.run_dir, "steps", name, "attempt-2.json").exists()
    # the steps' scratch folder (their TMPDIR, where kfp writes each component's source) is gone
    assert not Path(record.run_dir, "tmp").exists()
    assert os.environ.get("TMPDIR") != str(Path(record.run_dir, "tmp"))  # restored after the run

    assert record.metrics["accuracy"] > 0.8
    assert record.metrics["train_steps"] == record.step("train").details["steps"] > 0
    assert record.metrics["train_resumed_from_step"] == 0

    archive_path = Path(record.archive["path"])
    assert archive_path.is_dir()
    assert archive_path == first_run.home / "archive" / "digits-mlp" / "v1"
    assert record.archive["version"] == 1
    lineage = json.loads((archive_path / "lineage.json").read_text(encoding="utf-8"))
    prewarm = record.step("prewarm").details
    manifest = json.loads(Path(prewarm["cache_dir"], MANIFEST_NAME).read_text(encoding="utf-8"))
    assert lineage["dataset"]["dataset_sha256"] == manifest["dataset_sha256"] == prewarm["dataset_sha256"]
    assert lineage["dataset"]["source_uri"] == first_run.params["dataset_uri"]
    assert lineage["device"] == "cpu"
    assert lineage["version"] == 1
    assert (archive_path / "metrics.json").is_file()
    assert (archive_path / "model" / "model.pt").is_file()
    # The checkpoint folder is gone once training completed.
    checkpoints = first_run.home / "checkpoints"
    assert not checkpoints.exists() or list(checkpoints.iterdir()) == []


@pytest.mark.slow
def test_rerun_copies_nothing_and_archives_a_new_version(
    first_run: FirstRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert first_run.record.status == "succeeded", _steps(first_run.record)
    monkeypatch.setenv("HETEROFLOW_HOME", str(first_run.home))
    record = run_local(params=first_run.params, run_dir=tmp_path / "run2")
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"

    prewarm = record.step("prewarm").details
    assert prewarm["files_copied"] == 0
    assert prewarm["bytes_copied"] == 0
    assert prewarm["files_skipped"] == prewarm["files"] > 0
    assert prewarm["dataset_sha256"] == first_run.record.step("prewarm").details["dataset_sha256"]

    assert record.archive["version"] == 2
    assert Path(record.archive["path"]) == first_run.home / "archive" / "digits-mlp" / "v2"
    assert first_run.archive_v1_digest, "the first run archived nothing"
    assert _tree_digest(first_run.archive_v1) == first_run.archive_v1_digest, "archive v1 changed"


@pytest.mark.slow
@no_cuda
def test_custom_candidates_run_on_the_cpu_branch(digits_dir: Path, tmp_path: Path) -> None:
    candidates = Candidates(["gpu", "cpu:cpu=2"])
    record = run_local(params={"epochs": 2, "dataset_uri": str(digits_dir)}, run_dir=tmp_path / "run", candidates=candidates)
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    assert record.placement["index"] == 1
    assert record.placement["device_kind"] == "cpu"
    assert record.placement["resources"]["cpu"] == "2"
    assert len(record.placement["passed_over"]) == 1 and "gpu" in record.placement["passed_over"][0]
    assert record.step("train").device == "cpu"
    assert record.step("train").details["device_kind"] == "cpu"
    assert all(s.attempts == 1 for s in record.steps)


# --- compiled IR ------------------------------------------------------------------------------------------


def test_compiled_default_pipeline_matches_golden(tmp_path: Path) -> None:
    actual = _normalise(_compile(build_default_pipeline(), tmp_path / "default.yaml"))
    if os.environ.get(UPDATE_GOLDEN_ENV) == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        header = (
            "# Golden compiled IR of build_default_pipeline(), normalised by tests/test_pipeline_kfp.py\n"
            f"# (sdkVersion dropped, images and kfp versions replaced). Regenerate: {UPDATE_GOLDEN_ENV}=1 pytest "
            "tests/test_pipeline_kfp.py -k golden\n"
        )
        GOLDEN.write_text(header + yaml.safe_dump_all(actual, sort_keys=True, width=120), encoding="utf-8")
    assert GOLDEN.is_file(), f"{GOLDEN} is missing; create it with {UPDATE_GOLDEN_ENV}=1"
    with open(GOLDEN, encoding="utf-8") as fh:
        expected = list(yaml.safe_load_all(fh))
    differences = list(_diff(expected, actual))
    if differences:
        shown = "\n  ".join(differences[:15])
        more = f"\n  ... and {len(differences) - 15} more" if len(differences) > 15 else ""
        pytest.fail(
            f"compiled pipeline differs from {GOLDEN.name} at {len(differences)} place(s); first: {differences[0]}\n  "
            f"{shown}{more}\nIf the change is intended, rerun with {UPDATE_GOLDEN_ENV}=1 and review the diff.",
            pytrace=False,
        )


def test_normaliser_replaces_images_versions_and_drops_sdk_version() -> None:
    raw = {
        "sdkVersion": "kfp-2.17.3",
        "deploymentSpec": {"executors": {"e": {"container": {"image": "reg.example/x:1", "command": ["pip install 'kfp==2.17.3' && run"]}}}},
    }
    assert _normalise(raw) == {
        "deploymentSpec": {"executors": {"e": {"container": {"image": "<IMAGE>", "command": ["pip install 'kfp==<VERSION>' && run"]}}}}
    }


def test_golden_does_not_depend_on_the_image(tmp_path: Path) -> None:
    default = _normalise(_compile(build_default_pipeline(), tmp_path / "a.yaml"))
    other = _normalise(_compile(build_default_pipeline(image="registry.example.com/heteroflow:9.9.9"), tmp_path / "b.yaml"))
    assert list(_diff(default, other)) == []


@pytest.fixture(scope="module")
def default_ir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _ir(_compile(build_default_pipeline(), tmp_path_factory.mktemp("ir") / "default.yaml"))


# kind -> (accelerator resource type or None, cpu, memory) of the default train candidates.
_EXPECTED_TRAIN_RESOURCES = {
    "npu": ("huawei.com/Ascend910", "8", "32Gi"),
    "gpu": ("nvidia.com/gpu", "8", "32Gi"),
    "cpu": (None, "8", "16Gi"),
}


@pytest.mark.parametrize("step", ["train", "evaluate"])
def test_each_branch_asks_for_its_candidates_resources(default_ir: dict[str, Any], step: str) -> None:
    branches = _branch_dags(default_ir)
    expected_names = {f"comp-train-on-{r.kind.value}-{i}" for i, r in enumerate(DEFAULT_TRAIN_CANDIDATES)}
    assert set(branches) == expected_names
    for i, cand in enumerate(DEFAULT_TRAIN_CANDIDATES):
        kind = cand.kind.value
        accel, cpu, memory = _EXPECTED_TRAIN_RESOURCES[kind]
        task = branches[f"comp-train-on-{kind}-{i}"]["tasks"][step]
        res = _container(default_ir, task)["resources"]
        assert res["resourceCpuLimit"] == res["resourceCpuRequest"] == cpu
        assert res["cpuLimit"] == cand.cpu_millicores / 1000
        assert res["resourceMemoryLimit"] == res["resourceMemoryRequest"] == memory
        assert res["memoryLimit"] == cand.memory_bytes / 1e9
        if accel is None:
            assert "accelerator" not in res, f"{kind} branch {step} asks for an accelerator: {res.get('accelerator')}"
        else:
            assert res["accelerator"]["resourceType"] == accel
            assert res["accelerator"]["resourceCount"] == str(cand.count) == "1"


def test_the_branch_condition_routes_on_the_plan_index(default_ir: dict[str, Any]) -> None:
    root = default_ir["root"]["dag"]["tasks"]
    conditions = {t["taskInfo"]["name"]: t for t in root.values() if "triggerPolicy" in t}
    assert set(conditions) == {f"placed-on-{r.kind.value}-{i}" for i, r in enumerate(DEFAULT_TRAIN_CANDIDATES)}
    for name, task in conditions.items():
        index = int(name.rsplit("-", 1)[1])
        assert task["triggerPolicy"]["condition"].replace("\n", " ").endswith(f"== {index}")
        assert "plan" in task["dependentTasks"]


def test_every_step_task_has_its_retry_policy(default_ir: dict[str, Any]) -> None:
    seen: dict[str, int] = {}
    for dag_name, task_name, task in _leaf_tasks(default_ir):
        step = task["taskInfo"]["name"]
        assert step in DEFAULT_STEPS, f"{dag_name}/{task_name}: unknown step {step!r}"
        retry = DEFAULT_STEPS[step].retry
        policy = task.get("retryPolicy")
        assert policy is not None, f"{dag_name}/{task_name} has no retry policy"
        assert policy["maxRetryCount"] == retry.retries
        assert policy["backoffDuration"] == f"{int(retry.backoff_seconds)}s"
        assert policy["backoffFactor"] == float(retry.factor)
        assert policy["backoffMaxDuration"] == f"{int(retry.max_delay_seconds)}s"
        seen[step] = seen.get(step, 0) + 1
    n = len(DEFAULT_TRAIN_CANDIDATES)
    assert seen == {"prewarm": 1, "preprocess": 1, "plan": 1, "train": n, "evaluate": n, "archive": n}


def test_caching_is_off_for_prewarm_plan_and_archive(default_ir: dict[str, Any]) -> None:
    for dag_name, task_name, task in _leaf_tasks(default_ir):
        step = task["taskInfo"]["name"]
        enabled = task.get("cachingOptions", {}).get("enableCache", False)
        if step in ("prewarm", "plan", "archive"):
            assert enabled is False, f"{dag_name}/{task_name}: caching must be off for {step}"
        else:
            assert DEFAULT_STEPS[step].cacheable
            assert enabled is True, f"{dag_name}/{task_name}: caching expected on for {step}"


def test_device_kind_is_an_input_of_train_so_cache_keys_differ_per_device(default_ir: dict[str, Any]) -> None:
    for i, cand in enumerate(DEFAULT_TRAIN_CANDIDATES):
        kind = cand.kind.value
        params = _branch_dags(default_ir)[f"comp-train-on-{kind}-{i}"]["tasks"]["train"]["inputs"]["parameters"]
        assert params["device_kind"]["runtimeValue"]["constant"] == kind
        assert params["torch_device"]["runtimeValue"]["constant"] == cand.torch_device_type


def test_custom_candidates_compile_with_their_resources(tmp_path: Path) -> None:
    candidates = Candidates(["gpu", "cpu:cpu=2"])
    ir = _ir(_compile(build_default_pipeline(candidates=candidates), tmp_path / "custom.yaml"))
    branches = _branch_dags(ir)
    assert set(branches) == {"comp-train-on-gpu-0", "comp-train-on-cpu-1"}
    gpu = _container(ir, branches["comp-train-on-gpu-0"]["tasks"]["train"])["resources"]
    assert gpu["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert gpu["accelerator"]["resourceCount"] == "1"
    cpu = _container(ir, branches["comp-train-on-cpu-1"]["tasks"]["train"])["resources"]
    assert "accelerator" not in cpu
    assert cpu["resourceCpuLimit"] == "2"
    assert cpu["resourceMemoryLimit"] == Resources(kind="cpu").k8s_requests()["memory"] == "2Gi"
    plan = ir["root"]["dag"]["tasks"]["plan"]
    constant = plan["inputs"]["parameters"]["candidates_json"]["runtimeValue"]["constant"]
    assert Candidates.from_json(constant).to_json() == candidates.to_json()


@pytest.mark.slow
@no_cuda
def test_two_runs_in_one_fresh_process(digits_dir: Path, tmp_path: Path) -> None:
    """run_local points the steps' TMPDIR into the run folder and removes it; the calling process must keep its
    own temporary folder, so a second run in the same (fresh, tempfile-unprimed) interpreter works."""
    code = (
        "import sys\n"
        "from heteroflow.pipelines.local import run_local\n"
        "for i in range(2):\n"
        "    r = run_local({'epochs': 1, 'dataset_uri': sys.argv[1]}, run_dir=f'{sys.argv[2]}/run{i}')\n"
        "    print(r.status)\n"
    )
    env = {**os.environ, "HETEROFLOW_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(digits_dir), str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["succeeded", "succeeded"]
