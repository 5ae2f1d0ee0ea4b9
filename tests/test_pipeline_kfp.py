"""The default pipeline on kfp.local, and its compiled KFP IR.

- Whole runs of the default pipeline with ``heteroflow.pipelines.kfp.local.run_local`` (kfp.local,
  SubprocessRunner): every step, the run record, the archive and its lineage, a rerun that copies nothing
  and archives a new version, custom candidates, and the fallback routing under simulated devices and
  injected faults (device -> next candidate; permanent -> no retry, no fallback; transient -> retried).
- A golden test of the compiled YAML: ``default_pipeline()`` rendered by ``to_kfp`` and compiled with
  ``kfp.compiler.Compiler``, normalised (``sdkVersion`` dropped, every container ``image`` and every
  ``kfp==<version>`` replaced by a placeholder), parsed and compared *as data* with
  ``tests/golden/default_pipeline.yaml``. A difference fails with the key paths that differ.

  To regenerate the golden file after an intended change to the pipeline or the steps, run::

      HETEROFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_pipeline_kfp.py -k golden

  then review ``git diff tests/golden/default_pipeline.yaml`` and commit it.
- Key facts read from the compiled IR directly: each candidate's task asks for its candidate's accelerator,
  CPU and memory and has the candidate as an input (cache keys differ per device); every step task has its
  call's retry policy with the total window on a cluster; prewarm, plan and archive have caching off; a
  device failure routes to the next candidate, anything else to a fail task without retries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import torch

from kfp import compiler  # noqa: E402

from heteroflow.cache.prewarm import MANIFEST_NAME  # noqa: E402
from heteroflow.components.resources import Candidates, Resources, RetryPolicy  # noqa: E402
from heteroflow.components.core.runtime import KFP_CANDIDATE, candidate_from_json  # noqa: E402
from heteroflow.components.steps import DEFAULT_TRAIN_CANDIDATES  # noqa: E402
from heteroflow.pipelines.default import build_default_pipeline, default_pipeline  # noqa: E402
from heteroflow.pipelines.kfp.render import compile_pipeline, to_kfp  # noqa: E402
from heteroflow.pipelines.kfp.local import RunRecord, run_local  # noqa: E402

STEP_ORDER = tuple(c.name for c in default_pipeline().calls)
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
    archive = record.results.get("archive")
    archive_v1 = Path(archive["path"]) if archive else home / "archive" / "missing"
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
        return list(yaml.load_all(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml where built: same data, faster


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
    assert len(docs) in (1, 2), "a pipeline compiles to its IR and, with Kubernetes settings, a platform spec"
    return docs[0]


def _leaf_tasks(ir: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(dag name, task name, task) for every task that runs a container (not a sub-DAG, a condition or an
    importer)."""
    dags = {"root": ir["root"]["dag"], **{n: c["dag"] for n, c in ir["components"].items() if "dag" in c}}
    for dag_name, dag in dags.items():
        for task_name, task in dag["tasks"].items():
            comp = ir["components"][task["componentRef"]["name"]]
            if "executorLabel" in comp and "container" in ir["deploymentSpec"]["executors"][comp["executorLabel"]]:
                yield dag_name, task_name, task


def _container(ir: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    label = ir["components"][task["componentRef"]["name"]]["executorLabel"]
    return ir["deploymentSpec"]["executors"][label]["container"]


def _candidate_of(task: dict[str, Any]) -> tuple[int, Resources] | None:
    """The candidate a device-bound task runs on (its ``heteroflow_candidate`` constant), or None."""
    params = task.get("inputs", {}).get("parameters", {})
    constant = params.get(KFP_CANDIDATE, {}).get("runtimeValue", {}).get("constant")
    return candidate_from_json(constant) if constant else None


def _step_of(ir: dict[str, Any], task: dict[str, Any]) -> str:
    """The call a leaf task runs: the generated component's function name (``train``), or ``heteroflow_fail``."""
    label = ir["components"][task["componentRef"]["name"]]["executorLabel"]
    args = ir["deploymentSpec"]["executors"][label]["container"]["args"]
    return args[args.index("--function_to_execute") + 1]


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
    assert record.step("train").candidate == len(DEFAULT_TRAIN_CANDIDATES) - 1
    assert record.step("evaluate").device == "cpu"
    assert record.placement["train"]["torch_device"] == "cpu"
    assert record.placement["train"]["index"] == len(DEFAULT_TRAIN_CANDIDATES) - 1
    assert len(record.placement["train"]["passed_over"]) == len(DEFAULT_TRAIN_CANDIDATES) - 1
    assert record.placement["evaluate"]["index"] == 0
    assert record.fallbacks == []
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

    assert record.metrics["evaluate"]["accuracy"] > 0.8
    assert record.metrics["train"]["steps"] == record.step("train").details["steps"] > 0
    assert record.metrics["train"]["resumed_from_step"] == 0

    archive = record.results["archive"]
    archive_path = Path(archive["path"])
    assert archive_path.is_dir()
    assert archive_path == first_run.home / "archive" / "digits-mlp" / "v1"
    assert archive["version"] == 1
    lineage = json.loads((archive_path / "lineage.json").read_text(encoding="utf-8"))
    prewarm = record.step("prewarm").details
    manifest = json.loads(Path(prewarm["cache_dir"], MANIFEST_NAME).read_text(encoding="utf-8"))
    assert lineage["dataset"]["dataset_sha256"] == manifest["dataset_sha256"] == prewarm["dataset_sha256"]
    assert lineage["dataset"]["source_uri"] == first_run.params["dataset_uri"]
    assert lineage["device"] == "cpu"
    assert lineage["version"] == 1
    assert lineage["run_id"] == record.run_id
    assert (archive_path / "metrics.json").is_file()
    assert (archive_path / "model" / "model.pt").is_file()
    # The checkpoint folder is gone once training completed.
    checkpoints = first_run.home / "checkpoints"
    assert not checkpoints.exists() or list(checkpoints.iterdir()) == []


@pytest.mark.slow
def test_rerun_copies_nothing_and_archives_the_same_model_as_the_same_version(
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

    # #28.8: the rerun reuses the cached model, and the same model (same content hash) is one version
    assert record.results["archive"]["version"] == 1 and record.results["archive"]["existing"] is True
    assert Path(record.results["archive"]["path"]) == first_run.home / "archive" / "digits-mlp" / "v1"
    assert first_run.archive_v1_digest, "the first run archived nothing"
    assert _tree_digest(first_run.archive_v1) == first_run.archive_v1_digest, "archive v1 changed"


@pytest.mark.slow
@no_cuda
def test_custom_candidates_run_on_the_cpu_candidate(digits_dir: Path, tmp_path: Path) -> None:
    candidates = Candidates(["gpu", "cpu:cpu=2"])
    record = run_local(params={"epochs": 2, "dataset_uri": str(digits_dir)}, run_dir=tmp_path / "run", candidates=candidates)
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    placed = record.placement["train"]
    assert placed["index"] == 1
    assert placed["device_kind"] == "cpu"
    assert placed["resources"]["cpu"] == "2"
    assert len(placed["passed_over"]) == 1 and "gpu" in placed["passed_over"][0]
    assert (record.step("train").device, record.step("train").kind, record.step("train").candidate) == ("cpu", "cpu", 1)
    assert all(s.attempts == 1 for s in record.steps)


# --- fallback on kfp.local: simulated devices and injected faults ----------------------------------------

SIMULATED = "npu,gpu"


@pytest.mark.slow
def test_device_failure_on_npu_falls_back_to_gpu_and_the_run_succeeds(digits_dir: Path, tmp_path: Path) -> None:
    record = run_local(
        {"epochs": 10, "dataset_uri": str(digits_dir)},
        run_dir=tmp_path / "run",
        simulate_devices=SIMULATED,
        inject_faults="train@npu=device",
    )
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    train = record.step("train")
    assert (train.kind, train.candidate, train.simulated, train.attempts) == ("gpu", 1, True, 2)
    assert record.placement["train"]["index"] == 0  # plan placed it on the (simulated) npu first
    assert record.fallbacks == [
        {
            "step": "train",
            "candidate": 0,
            "kind": "npu",
            "accelerator": "ascend-910",
            "failure": "device",
            "reason": record.fallbacks[0]["reason"],
        }
    ]
    assert "InjectedDeviceFault" in record.fallbacks[0]["reason"]
    assert record.metrics["evaluate"]["accuracy"] >= 0.90
    assert record.testing == {"HETEROFLOW_SIMULATE_DEVICES": SIMULATED, "HETEROFLOW_INJECT_FAULT": "train@npu=device"}
    on_disk = json.loads(Path(record.run_dir, "run.json").read_text())
    assert on_disk["status"] == "succeeded" and on_disk["fallbacks"][0]["kind"] == "npu"


@pytest.mark.slow
def test_permanent_failure_in_train_fails_at_once_without_fallback(digits_dir: Path, tmp_path: Path) -> None:
    record = run_local(
        {"epochs": 2, "dataset_uri": str(digits_dir)},
        run_dir=tmp_path / "run",
        simulate_devices=SIMULATED,
        inject_faults="train@npu=permanent",
    )
    assert record.status == "failed"
    train = record.step("train")
    assert (train.status, train.failure, train.attempts, train.kind) == ("failed", "permanent", 1, "npu")
    assert "InjectedPermanentFault" in train.error
    records = sorted(p.name for p in Path(record.run_dir, "steps", "train").iterdir())
    assert records == ["attempt-1.json", "attempt-1.traceback.txt"], "no retry and no other candidate ran"
    assert "InjectedPermanentFault" in Path(train.traceback_file).read_text()
    assert record.step("evaluate").status == "not run"
    assert record.fallbacks == []
    log = Path(record.run_dir, "kfp.log").read_text()
    assert "failed (permanent; not retried)" in log


@pytest.mark.slow
def test_permanent_failure_in_preprocess_runs_no_train(digits_dir: Path, tmp_path: Path) -> None:
    record = run_local(
        {"epochs": 2, "dataset_uri": str(digits_dir)},
        run_dir=tmp_path / "run",
        simulate_devices=SIMULATED,
        inject_faults="preprocess@cpu=permanent",
    )
    assert record.status == "failed"
    assert (record.step("preprocess").status, record.step("preprocess").attempts) == ("failed", 1)
    for name in ("train", "evaluate", "archive"):  # everything that reads what preprocess makes
        assert record.step(name).status == "not run", name
    assert record.step("plan").status in ("succeeded", "not run")  # plan reads nothing of it: it may run
    assert not Path(record.run_dir, "steps", "train").exists()


@pytest.mark.slow
def test_transient_failures_are_retried_on_the_same_candidate(digits_dir: Path, tmp_path: Path) -> None:
    pipeline = default_pipeline()
    # the same routing with a short backoff, so the test does not wait the default 10 s + 20 s
    pipeline.replace("train", retry=RetryPolicy(retries=2, backoff_seconds=1, factor=1, max_delay_seconds=1))
    record = run_local(
        {"epochs": 2, "dataset_uri": str(digits_dir)},
        pipeline=pipeline,
        run_dir=tmp_path / "run",
        simulate_devices=SIMULATED,
        inject_faults="train@npu=transient:2",
    )
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    train = record.step("train")
    assert (train.kind, train.candidate, train.attempts) == ("npu", 0, 3)
    attempts = [json.loads(p.read_text()) for p in sorted(Path(record.run_dir, "steps", "train").glob("attempt-*.json"))]
    assert [(a["status"], a["failure"], a["kind"]) for a in attempts] == [
        ("failed", "transient", "npu"),
        ("failed", "transient", "npu"),
        ("succeeded", None, "npu"),
    ]
    assert record.fallbacks == []


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


def test_every_candidate_task_asks_for_its_candidates_resources(default_ir: dict[str, Any]) -> None:
    seen: dict[str, set[int]] = {}
    pipeline = default_pipeline()
    for _, _, task in _leaf_tasks(default_ir):
        placed = _candidate_of(task)
        step = _step_of(default_ir, task)
        if step in ("train", "evaluate"):
            assert placed is not None, f"{step} task has no candidate input"
        if placed is None:
            continue
        index, cand = placed
        assert cand == pipeline[step].candidates[index]
        seen.setdefault(step, set()).add(index)
        res = _container(default_ir, task)["resources"]
        cpu = cand.k8s_requests()["cpu"]
        assert res["resourceCpuLimit"] == res["resourceCpuRequest"] == cpu
        assert res["resourceMemoryLimit"] == res["resourceMemoryRequest"] == cand.k8s_requests()["memory"]
        accel = cand.accelerator_spec
        if accel is None:
            assert "accelerator" not in res, f"{step} on a cpu candidate asks for an accelerator: {res.get('accelerator')}"
        else:
            assert res["accelerator"]["resourceType"] == accel.resource_name
            assert res["accelerator"]["resourceCount"] == str(cand.count)
    assert seen == {"train": {0, 1, 2}, "evaluate": {0}}


def test_accelerator_tasks_tolerate_their_device_plugins_taint(tmp_path: Path) -> None:
    docs = _compile(build_default_pipeline(), tmp_path / "d.yaml")
    ir, platform = docs[0], docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for _, _, task in _leaf_tasks(ir):
        placed = _candidate_of(task)
        label = ir["components"][task["componentRef"]["name"]]["executorLabel"]
        tolerations = platform.get(label, {}).get("tolerations", [])
        if placed is None or placed[1].accelerator_spec is None:
            assert tolerations == [], label
        else:
            assert {"key": placed[1].accelerator_spec.resource_name, "operator": "Exists", "effect": "NoSchedule"} in tolerations


def _conditions(ir: dict[str, Any]) -> list[str]:
    return [
        c["triggerPolicy"]["condition"].replace("\n", " ")
        for comp in [ir["root"], *ir["components"].values()]
        for c in comp.get("dag", {}).get("tasks", {}).values()
        if "triggerPolicy" in c
    ]


def test_placement_routes_on_the_plan_output_into_the_chain(default_ir: dict[str, Any]) -> None:
    conditions = _conditions(default_ir)
    assert any("heteroflow_placed_train" in c and c.endswith("== 'to-0'") for c in conditions), conditions
    for k in range(1, len(DEFAULT_TRAIN_CANDIDATES)):  # later levels route on the level before (a OneOf)
        assert any("oneof" in c and c.endswith(f"== 'to-{k}'") for c in conditions), k


def test_a_device_failure_routes_to_the_next_candidate_and_anything_else_fails(default_ir: dict[str, Any]) -> None:
    conditions = _conditions(default_ir)
    assert all(re.search(r"== 'to-\d+'\)?$", c) for c in conditions), conditions  # the only branches: fallback targets
    checks = [t for _, _, t in _leaf_tasks(default_ir) if _step_of(default_ir, t) == "heteroflow_check"]
    assert len(checks) == 1, "one check task fails the run with the failed step's message"
    params = checks[0]["inputs"]["parameters"]
    assert sorted(params) == sorted(f"route_{c.name}" for c in default_pipeline().calls)
    assert "retryPolicy" not in checks[0], "the check task must not be retried"


def _is_step(step: str) -> bool:
    return not step.startswith("heteroflow_")


def test_every_step_task_has_its_calls_retry_policy_with_the_total_window(default_ir: dict[str, Any]) -> None:
    pipeline = default_pipeline()
    seen: dict[str, int] = {}
    for dag_name, task_name, task in _leaf_tasks(default_ir):
        step = _step_of(default_ir, task)
        if not _is_step(step):
            assert "retryPolicy" not in task, f"{step} must not be retried"
            continue
        retry = pipeline[step].retry
        policy = task.get("retryPolicy")
        assert policy is not None, f"{dag_name}/{task_name} has no retry policy"
        assert policy["maxRetryCount"] == retry.retries
        assert policy["backoffDuration"] == f"{round(retry.backoff_seconds)}s"
        assert policy["backoffFactor"] == float(retry.factor)
        # on a cluster, backoff_max_duration is Argo's total window, not the per-wait cap
        assert policy["backoffMaxDuration"] == f"{round(retry.window_seconds)}s"
        assert policy["backoffMaxDuration"] != "300s"
        seen[step] = seen.get(step, 0) + 1
    # one task per call, one per candidate of a fallback chain: nothing is copied into another call's branch
    n = len(DEFAULT_TRAIN_CANDIDATES)
    assert seen == {"prewarm": 1, "preprocess": 1, "plan": 1, "train": n, "evaluate": 1, "archive": 1}
    assert pipeline["train"].retry.window_seconds == 24 * 3600


def test_caching_is_off_for_prewarm_plan_archive_and_the_bookkeeping_tasks(default_ir: dict[str, Any]) -> None:
    for dag_name, task_name, task in _leaf_tasks(default_ir):
        step = _step_of(default_ir, task)
        enabled = task.get("cachingOptions", {}).get("enableCache", False)
        if step in ("prewarm", "plan", "archive") or not _is_step(step):
            assert enabled is False, f"{dag_name}/{task_name}: caching must be off for {step}"
        else:
            assert enabled is True, f"{dag_name}/{task_name}: caching expected on for {step}"


def test_only_fallback_candidates_sit_in_condition_groups_named_for_their_chain(default_ir: dict[str, Any]) -> None:
    root = default_ir["root"]["dag"]["tasks"]
    top = {_step_of(default_ir, t) for n, _, t in _leaf_tasks(default_ir) if n == "root"}
    assert {"prewarm", "preprocess", "plan", "evaluate", "archive", "heteroflow_check"} <= top
    nested = {_step_of(default_ir, t) for n, _, t in _leaf_tasks(default_ir) if n != "root"}
    assert nested == {"train", "heteroflow_skip_train"}, nested
    names = {c["taskInfo"]["name"] for comp in default_ir["components"].values() for c in comp.get("dag", {}).get("tasks", {}).values()}
    assert {"train: npu -> gpu -> cpu [npu-0]", "train: npu -> gpu -> cpu [gpu-1]", "train: npu -> gpu -> cpu [cpu-2]"} <= names
    depth = max(len([d for d in default_ir["components"] if d.startswith("comp-condition")]), 0)
    assert depth <= 3 * len(DEFAULT_TRAIN_CANDIDATES)  # per level: the branches, the If and the Else group
    # archive reads train's model through the chosen candidate's import, not from a branch
    assert any(t["componentRef"]["name"].startswith("comp-importer") for t in root.values())


def _lines(pipeline: Any, path: Path) -> int:
    """Lines of what ``compile_pipeline`` (and ``heteroflow compile``) writes: what users upload."""
    compile_pipeline(pipeline, path)
    return len(path.read_text(encoding="utf-8").splitlines())


def test_the_compiled_pipeline_is_small_and_grows_linearly_with_candidates(tmp_path: Path) -> None:
    kinds = ["npu", "gpu", "cpu:cpu=2", "cpu:cpu=4", "cpu:cpu=8"]
    sizes = [_lines(default_pipeline(train_candidates=Candidates(kinds[:n])), tmp_path / f"c{n}.yaml") for n in range(1, 6)]
    three = _lines(default_pipeline(train_candidates=Candidates(["npu", "gpu", "cpu"])), tmp_path / "three.yaml")
    # Issue #15's target: <= 2,500 lines (8,080 before the flat rendering). compile_pipeline writes 2,270 (1..5:
    # 1,248, 1,936, 2,270, 2,603, 2,944): a chain's candidates read the call's parameters as one JSON input made
    # by its top-level arguments task, so each level's condition groups declare one channel for them, not one per
    # parameter (KFP declares every channel a group's tasks read); the levels' skip tasks share one component.
    assert three <= 2500, three
    steps = [b - a for a, b in zip(sizes[1:], sizes[2:])]  # from 2 candidates on, each adds one level
    assert max(steps) - min(steps) <= 10, sizes  # linear: every further candidate adds the same
    assert max(steps) <= 360, sizes  # one level: the candidate task, its groups and OneOfs (~335 lines)


def _resolved(docs: list[Any]) -> dict[str, Any]:
    """The root DAG with every componentRef replaced by its component and every executorLabel by its executor
    and kfp-kubernetes settings (recursively): what runs, whatever the specs are named."""
    ir = docs[0]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}

    def component(name: str) -> dict[str, Any]:
        comp = dict(ir["components"][name])
        if "executorLabel" in comp:
            label = comp.pop("executorLabel")
            comp["executor"] = (ir["deploymentSpec"]["executors"][label], platform.get(label))
        if "dag" in comp:
            comp["dag"] = dag(comp["dag"])
        return comp

    def dag(d: dict[str, Any]) -> dict[str, Any]:
        tasks = {n: {**t, "componentRef": component(t["componentRef"]["name"])} for n, t in d["tasks"].items()}
        return {**d, "tasks": tasks}

    rest = {k: v for k, v in ir.items() if k not in ("components", "deploymentSpec")}
    return {**rest, "root": {**ir["root"], "dag": dag(ir["root"]["dag"])}}


def test_compile_pipeline_writes_the_same_pipeline_with_identical_specs_shared(tmp_path: Path) -> None:
    from google.protobuf import json_format
    from kfp import components
    from kfp.pipeline_spec import pipeline_spec_pb2

    from heteroflow.pipelines.graph import SecretEnv

    pipeline = default_pipeline(train_candidates=Candidates(["npu", "gpu", "cpu:cpu=2", "cpu:cpu=4"]))
    pipeline.replace("prewarm", secrets=[SecretEnv("s3-creds", {"AWS_ACCESS_KEY_ID": "access_key"})])
    kfp_docs = _compile(to_kfp(pipeline), tmp_path / "kfp.yaml")
    written = compile_pipeline(pipeline, tmp_path / "written.yaml")
    text = written.read_text(encoding="utf-8")
    docs = list(yaml.safe_load_all(text))
    assert _resolved(docs) == _resolved(kfp_docs)  # every task runs what it ran, with the same settings
    ir = docs[0]
    # the levels' skip tasks share one component and executor; the candidates keep their own (resources differ)
    skips = {t["componentRef"]["name"] for _, _, t in _leaf_tasks(ir) if _step_of(ir, t) == "heteroflow_skip_train"}
    assert skips == {"comp-heteroflow-skip-train"}
    trains = [t for _, _, t in _leaf_tasks(ir) if _step_of(ir, t) == "train"]
    assert len({ir["components"][t["componentRef"]["name"]]["executorLabel"] for t in trains}) == len(trains) == 4
    assert len(ir["components"]) < len(kfp_docs[0]["components"])
    # nothing dangles, nothing is left unused
    dags = [ir["root"], *ir["components"].values()]
    assert {t["componentRef"]["name"] for c in dags for t in c.get("dag", {}).get("tasks", {}).values()} == set(ir["components"])
    labels = {c["executorLabel"] for c in ir["components"].values() if "executorLabel" in c}
    assert labels == set(ir["deploymentSpec"]["executors"])
    assert set(docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]) <= labels
    # it is KFP IR: the protobuf messages take it with unknown fields rejected, and KFP loads it
    json_format.ParseDict(ir, pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False)
    json_format.ParseDict(docs[1], pipeline_spec_pb2.PlatformSpec(), ignore_unknown_fields=False)
    loaded = components.load_component_from_file(str(written))
    assert set(loaded.pipeline_spec.root.input_definitions.parameters) == set(to_kfp(pipeline).pipeline_spec.root.input_definitions.parameters)
    assert text.startswith("# PIPELINE DEFINITION\n# Name: heteroflow-default\n")  # KFP's header comments kept


@pytest.mark.slow
@pytest.mark.parametrize(
    ("faults", "trained", "fallbacks"),
    [(None, ("npu", 0, 1), []), ("train@npu=device", ("gpu", 1, 2), ["npu"])],
    ids=["npu-then-two-skips", "npu-fails-gpu-trains-one-skip"],
)
def test_the_written_pipeline_runs_on_kfp_local(
    faults: str | None,
    trained: tuple[str, int, int],
    fallbacks: list[str],
    digits_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The file compile_pipeline writes runs, its levels' skip tasks sharing one component: with npu training,
    the gpu and cpu levels both skip; with npu failing (a device error), gpu trains and the cpu level skips."""
    from kfp import components

    from heteroflow.pipelines.kfp import render as kfp_render

    written = compile_pipeline(default_pipeline(), tmp_path / "written.yaml")
    loaded = components.load_component_from_file(str(written))
    monkeypatch.setattr(kfp_render, "to_kfp", lambda pipeline, **_: loaded)  # run_local runs the written file
    params = {"epochs": 2, "dataset_uri": str(digits_dir)}
    record = run_local(params, run_dir=tmp_path / "run", simulate_devices=SIMULATED, inject_faults=faults)
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    train = record.step("train")
    assert (train.kind, train.candidate, train.attempts) == trained
    assert [f["kind"] for f in record.fallbacks] == fallbacks
    assert record.step("archive").status == "succeeded"
    log = Path(record.run_dir, "kfp.log").read_text(errors="replace")
    skipped = re.findall(r"Executing task \S*'heteroflow-skip-train'", log)  # kfp.local names a task by its component
    assert len(skipped) == len(DEFAULT_TRAIN_CANDIDATES) - 1 - trained[1], log[-3000:]  # each level after the trained


def test_independent_calls_do_not_wait_for_each_other(tmp_path: Path) -> None:
    from heteroflow.components.steps import PREWARM
    from heteroflow.pipelines.graph import Pipeline

    p = Pipeline("two-sources")
    p.add(PREWARM, name="first", source_uri=p.param("first_uri"))
    p.add(PREWARM, name="second", source_uri=p.param("second_uri"))
    ir = _ir(_compile(to_kfp(p), tmp_path / "two.yaml"))
    tasks = ir["root"]["dag"]["tasks"]
    steps = {_step_of(ir, t): t for _, _, t in _leaf_tasks(ir)}
    assert "dependentTasks" not in steps["first"] and "dependentTasks" not in steps["second"]


def test_the_candidate_is_an_input_so_cache_keys_differ_per_device(default_ir: dict[str, Any]) -> None:
    constants = {
        json.dumps(candidate_from_json(t["inputs"]["parameters"][KFP_CANDIDATE]["runtimeValue"]["constant"])[1].to_dict())
        for _, _, t in _leaf_tasks(default_ir)
        if _step_of(default_ir, t) == "train"
    }
    assert len(constants) == len(DEFAULT_TRAIN_CANDIDATES)


def test_custom_candidates_compile_with_their_resources(tmp_path: Path) -> None:
    candidates = Candidates(["gpu", "cpu:cpu=2"])
    ir = _ir(_compile(build_default_pipeline(candidates=candidates), tmp_path / "custom.yaml"))
    trains = {}
    for _, _, task in _leaf_tasks(ir):
        if _step_of(ir, task) == "train":
            index, cand = _candidate_of(task)
            trains[index] = _container(ir, task)["resources"]
            assert cand == candidates[index]
    assert trains[0]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert trains[0]["accelerator"]["resourceCount"] == "1"
    assert "accelerator" not in trains[1]
    assert trains[1]["resourceCpuLimit"] == "2"
    assert trains[1]["resourceMemoryLimit"] == Resources(kind="cpu").k8s_requests()["memory"] == "2Gi"
    plan = next(t for _, _, t in _leaf_tasks(ir) if _step_of(ir, t) == "plan")
    constant = json.loads(plan["inputs"]["parameters"]["heteroflow_placements"]["runtimeValue"]["constant"])
    assert Candidates.from_json(constant["train"]) == candidates


@pytest.mark.slow
@no_cuda
def test_two_runs_in_one_fresh_process(digits_dir: Path, tmp_path: Path) -> None:
    """run_local points the steps' TMPDIR into the run folder and removes it; the calling process must keep its
    own temporary folder, so a second run in the same (fresh, tempfile-unprimed) interpreter works."""
    code = (
        "import sys\n"
        "from heteroflow.pipelines.kfp.local import run_local\n"
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


def test_a_calls_secrets_become_environment_variables_of_its_pods_on_a_cluster(tmp_path: Path) -> None:
    from heteroflow.pipelines.graph import SecretEnv

    pipeline = default_pipeline()
    pipeline.replace("prewarm", secrets=[SecretEnv("s3-creds", {"AWS_ACCESS_KEY_ID": "access_key", "AWS_SECRET_ACCESS_KEY": "secret_key"})])
    docs = _compile(to_kfp(pipeline), tmp_path / "s.yaml")
    ir, platform = docs[0], docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    prewarm = next(t for _, _, t in _leaf_tasks(ir) if _step_of(ir, t) == "prewarm")
    label = ir["components"][prewarm["componentRef"]["name"]]["executorLabel"]
    secret = platform[label]["secretAsEnv"][0]
    assert secret["secretName"] == "s3-creds"
    assert {e["envVar"]: e["secretKey"] for e in secret["keyToEnv"]} == {"AWS_ACCESS_KEY_ID": "access_key", "AWS_SECRET_ACCESS_KEY": "secret_key"}
    assert "s3-creds" not in json.dumps(ir["root"])  # a name in the platform spec, never a run parameter


@pytest.mark.parametrize(
    ("secret", "env", "match"),
    [("S3 creds", {"A": "k"}, "is not a Kubernetes Secret name"), ("s3", {}, "env is empty"), ("s3", {"1A": "k"}, "is not an environment variable name")],
    ids=["bad-name", "no-env", "bad-env-var"],
)
def test_secret_env_errors(secret: str, env: dict, match: str) -> None:
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.pipelines.graph import SecretEnv

    with pytest.raises(InvalidParameter, match=match):
        SecretEnv(secret, env)


SLEEPY = '''
import time

from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step


@step(outputs=[ArtifactSpec(name="out", type=ArtifactType.ARTIFACT, param="out_path")])
def nap(out_path: str, *, seconds: float = 1.0) -> dict:
    """Sleep, then write the start and end times.

    Args:
        out_path: output file.
        seconds: how long (unit: s).
    """
    start = time.time()
    time.sleep(seconds)
    with open(out_path, "w") as fh:
        fh.write(f"{start} {time.time()}")
    return {"slept": seconds}
'''


@pytest.mark.slow
def test_two_independent_calls_run_at_the_same_time_on_kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.core.telemetry import read_step_records
    from heteroflow.pipelines.graph import Pipeline

    folder = tmp_path / "userpkg"
    folder.mkdir()
    (folder / "sleepy.py").write_text(SLEEPY)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    import sleepy

    p = Pipeline("two-naps")
    p.add(sleepy.nap, name="left", seconds=2.0)
    p.add(sleepy.nap, name="right", seconds=2.0)
    record = run_local({}, pipeline=p, run_dir=tmp_path / "run")
    sys.modules.pop("sleepy", None)
    assert record.status == "succeeded", f"{_steps(record)}\n{_engine_log(record)}"
    records = read_step_records(record.run_dir)
    (left,), (right,) = records["left"], records["right"]
    # the intervals the two steps ran in overlap: neither waited for the other
    assert max(left.started_at, right.started_at) < min(left.ended_at, right.ended_at), (left, right)


def test_the_engine_log_keeps_every_line_whole_when_parallel_tasks_print_at_once(tmp_path: Path) -> None:
    """kfp.local prints each task's subprocess lines from that task's thread (``print(line, end='')``) and its
    logging handlers write beside them; with parallel tasks these writers meet in one ``kfp.log``. CI once read
    a ``kfp.log`` that was not valid UTF-8 (a multi-byte character cut apart by concurrent writes); lines were
    lost or merged too. Every line written must arrive whole, and the file must decode."""
    import logging
    import threading

    from heteroflow.pipelines.kfp.local import _Redacting

    path = tmp_path / "kfp.log"
    lines_per_writer, writers = 4000, 4
    with open(path, "w", encoding="utf-8") as fh:
        stream = _Redacting(fh)
        handler = logging.StreamHandler(stream)  # the path kfp's own log lines take

        def printer(i: int) -> None:
            for n in range(lines_per_writer):
                print(f"task {i} line {n}: train → gpu… ✓\n", end="", file=stream)

        def logger() -> None:
            for n in range(lines_per_writer):
                handler.emit(logging.LogRecord("kfp", logging.INFO, __file__, 0, f"task log line {n}: ok ✓", None, None))

        threads = [threading.Thread(target=printer, args=(i,)) for i in range(writers)]
        threads.append(threading.Thread(target=logger))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stream.flush()
    lines = path.read_bytes().decode("utf-8").splitlines()  # raises on a cut character
    printed = {f"task {i} line {n}: train → gpu… ✓" for i in range(writers) for n in range(lines_per_writer)}
    logged = {f"task log line {n}: ok ✓" for n in range(lines_per_writer)}
    assert len(lines) == len(printed) + len(logged)
    assert set(lines) == printed | logged


@pytest.mark.parametrize("given", [None, "heteroflow.pipelines.default:default_pipeline"])
def test_compiling_something_not_a_pipeline_names_the_argument(given: Any, tmp_path: Path) -> None:
    """The sibling of build_dag(None, ...) (a new user's trial): heteroflow.compile(None, ...) and to_kfp(None)
    said "'NoneType' object has no attribute 'calls'"."""
    import heteroflow
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.pipelines.kfp.render import to_kfp

    with pytest.raises(InvalidParameter, match=r"^pipeline=.* is not a heteroflow Pipeline; valid: a Pipeline \(the default pipeline: "):
        to_kfp(given)
    with pytest.raises(InvalidParameter, match=r"^pipeline=.* is not a heteroflow Pipeline"):
        heteroflow.compile(given, tmp_path / "p.yaml")
    assert not (tmp_path / "p.yaml").exists()
