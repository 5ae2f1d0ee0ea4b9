"""The Airflow rendering without running Airflow: the DAG's shape, trigger rules, pools, retries and params from
the Pipeline value; the fallback gate's decisions; the retry policy; kubernetes-mode pods built with the operator's
own ``build_pod_request_obj`` (no cluster), validated against the Kubernetes schema and compared with a golden file
and with the compiled KFP YAML. Runs of real Airflow are in ``tests/test_dags_airflow.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import tokenize
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

pytest.importorskip("airflow.providers.cncf.kubernetes", reason="the airflow extra is not installed")
from airflow.sdk import TriggerRule  # noqa: E402
from airflow.sdk.definitions.retry_policy import RetryAction  # noqa: E402
from airflow.sdk.exceptions import AirflowFailException, DownstreamTasksSkipped  # noqa: E402
from kubernetes import client  # noqa: E402

from heteroflow.components.devices.cluster import load_profile  # noqa: E402
from heteroflow.components.errors import InvalidParameter, InvalidResources  # noqa: E402
from heteroflow.components.placement.plan import Inventory  # noqa: E402
from heteroflow.components.resources import Resources, RetryPolicy  # noqa: E402
from heteroflow.components.core.runtime import TransientStepFailure  # noqa: E402
from heteroflow.dags.factory import build_dag  # noqa: E402
from heteroflow.dags.layout import (  # noqa: E402
    FAILURE_KEY,
    PREPARE_TASK,
    RECORD_TASK,
    Layout,
    airflow_params,
    pool_for,
    pools_for_inventory,
    safe_run_id,
    subset,
)
from heteroflow.dags.operators import FallbackGateOperator, StepRetryPolicy, retry_arguments  # noqa: E402
from heteroflow.dags.pods import PodStepOperator, route_of_pod, step_command  # noqa: E402
from heteroflow.dags.pools import load_inventory  # noqa: E402
from heteroflow.pipelines.default import default_pipeline  # noqa: E402
from heteroflow.pipelines.k8s.resources import build_pod_resources  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "examples" / "profiles"
GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_GOLDEN_ENV = "HETEROFLOW_UPDATE_GOLDEN"
K8S_VERSION = "1.33.0"
PROFILE_NAMES = sorted(p.stem for p in PROFILES.glob("*.yaml"))
IMAGE = "registry.example.com/heteroflow:0.1.0"


# --- the DAG's shape -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_dag() -> Any:
    return build_dag(default_pipeline(), "hf-shape")


def _ids(tasks: Any) -> set[str]:
    return {t.task_id for t in tasks}


def test_one_task_per_call_and_per_candidate_with_gates_and_a_join(local_dag: Any) -> None:
    assert set(local_dag.task_ids) == {
        PREPARE_TASK, "prewarm", "preprocess", "plan",
        "train.npu-0", "train.fallback-to-1", "train.gpu-1", "train.fallback-to-2", "train.cpu-2", "train.done",
        "evaluate", "archive", RECORD_TASK,
    }
    t = local_dag.task_dict
    # candidate 0 waits for what it reads and for the planner; a gate waits for the candidate before it only
    assert _ids(t["train.npu-0"].upstream_list) == {PREPARE_TASK, "preprocess", "plan"}
    assert _ids(t["train.fallback-to-1"].upstream_list) == {"train.npu-0"}
    assert _ids(t["train.gpu-1"].upstream_list) == {"train.fallback-to-1", "preprocess", "plan"}
    assert _ids(t["train.done"].upstream_list) == {"train.npu-0", "train.gpu-1", "train.cpu-2"}
    assert _ids(t["evaluate"].upstream_list) == {PREPARE_TASK, "preprocess", "plan", "train.done"}  # placed too
    assert _ids(t["archive"].upstream_list) == {PREPARE_TASK, "prewarm", "preprocess", "train.done", "evaluate"}
    # plan reads no artifact: it runs beside prewarm/preprocess, not after them
    assert _ids(t["plan"].upstream_list) == {PREPARE_TASK}
    assert _ids(t[RECORD_TASK].upstream_list) == set(local_dag.task_ids) - {RECORD_TASK}


def test_trigger_rules_gate_fallback_on_the_candidates_own_failure(local_dag: Any) -> None:
    t = local_dag.task_dict
    rules = {tid: t[tid].trigger_rule for tid in local_dag.task_ids}
    assert rules["train.npu-0"] == TriggerRule.ALL_SUCCESS
    assert rules["train.fallback-to-1"] == rules["train.fallback-to-2"] == TriggerRule.ALL_FAILED
    assert rules["train.gpu-1"] == rules["train.cpu-2"] == TriggerRule.NONE_FAILED
    assert rules["train.done"] == TriggerRule.ONE_SUCCESS
    assert rules["evaluate"] == TriggerRule.ALL_SUCCESS
    assert t[PREPARE_TASK].is_setup and t[RECORD_TASK].is_teardown
    assert t[RECORD_TASK].trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert not t[RECORD_TASK].on_failure_fail_dagrun  # the record never decides the run's state


def test_pools_and_slots_follow_the_candidates(local_dag: Any) -> None:
    t = local_dag.task_dict
    assert (t["train.npu-0"].pool, t["train.npu-0"].pool_slots) == ("heteroflow-npu", 1)
    assert (t["train.gpu-1"].pool, t["train.gpu-1"].pool_slots) == ("heteroflow-gpu", 1)
    for tid in ("train.cpu-2", "preprocess", "train.fallback-to-1", "train.done"):
        assert t[tid].pool == "default_pool", tid
    p = default_pipeline()
    p.replace("train", candidates=[Resources(accelerator="T4", count=2), Resources(accelerator="910B", count=8), "cpu"])
    dag = build_dag(p, "hf-pools")
    assert (dag.task_dict["train.gpu-0"].pool, dag.task_dict["train.gpu-0"].pool_slots) == ("heteroflow-gpu-nvidia-t4", 2)
    assert (dag.task_dict["train.npu-1"].pool, dag.task_dict["train.npu-1"].pool_slots) == ("heteroflow-npu", 8)
    assert build_dag(p, "hf-nopools", pools=False).task_dict["train.gpu-0"].pool == "default_pool"


def test_retries_come_from_the_calls_retry_policy(local_dag: Any) -> None:
    pipeline = default_pipeline()
    for call in pipeline.calls:
        tasks = Layout(pipeline)[call.name].candidates
        for tid in tasks:
            task = local_dag.task_dict[tid]
            r = call.retry
            assert task.retries == r.retries, tid
            assert task.retry_delay == timedelta(seconds=r.backoff_seconds), tid
            # Airflow 3.3: retry_exponential_backoff is a float multiplier (0 = off), not a bool
            assert isinstance(task.retry_exponential_backoff, float)
            assert task.retry_exponential_backoff == (r.factor if r.factor != 1 else 0.0), tid
            assert task.max_retry_delay == timedelta(seconds=r.max_delay_seconds), tid
            assert isinstance(task.retry_policy, StepRetryPolicy) and task.retry_policy.policy == r
    assert local_dag.task_dict["train.fallback-to-1"].retries == 0


def test_retry_arguments_of_a_policy_without_growth() -> None:
    args = retry_arguments(RetryPolicy(retries=3, backoff_seconds=2, factor=1, max_delay_seconds=2))
    assert (args["retries"], args["retry_delay"], args["retry_exponential_backoff"]) == (3, timedelta(seconds=2), 0.0)


def test_params_come_from_the_pipeline() -> None:
    pipeline = default_pipeline()
    dag = build_dag(pipeline, "hf-params", params={"epochs": 3})
    assert set(dag.params) == set(pipeline.params)
    epochs = dag.params.get_param("epochs")
    assert epochs.value == 3 and epochs.schema["type"] == "integer" and "unit: passes" in epochs.description
    lr = dag.params.get_param("learning_rate")
    assert lr.schema["type"] == "number" and lr.value == pipeline.params["learning_rate"].default
    uri = dag.params.get_param("dataset_uri")
    assert uri.value is None and uri.schema["type"] == ["string", "null"] and "(required)" in uri.description
    with pytest.raises(InvalidParameter, match=r"^params: unknown parameter\(s\) epoch \(did you mean 'epochs'\?\); valid: "):
        airflow_params(pipeline, {"epoch": 3})
    with pytest.raises(InvalidParameter, match=r"parameter epochs='3' is a string; valid: an integer"):
        airflow_params(pipeline, {"epochs": "3"})


TOY = '''
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step


def calibrate(model_dir: str, report_path: str, *, temperature_scale: float = 1.5) -> dict:
    """Write a calibration report.

    Args:
        model_dir: the model.
        report_path: the report.
        temperature_scale: softmax temperature (unit: ratio).
    """
    return {"temperature_scale": temperature_scale}


CALIBRATE = step(calibrate, inputs=[ArtifactSpec(name="model", type=ArtifactType.MODEL, param="model_dir")],
                 outputs=[ArtifactSpec(name="report", type=ArtifactType.METRICS, param="report_path")])
'''


def test_a_new_step_and_parameter_need_no_change_in_dags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "toy_calibrate.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    from toy_calibrate import CALIBRATE  # type: ignore[import-not-found]

    p = default_pipeline().copy("hf-calibrated")
    p.add(CALIBRATE, model=p["train"].outputs.model)
    dag = build_dag(p, "hf-calibrated")
    assert dag.params.get_param("temperature_scale").value == 1.5
    assert _ids(dag.task_dict["calibrate"].upstream_list) == {PREPARE_TASK, "train.done"}
    pods = build_dag(p, "hf-calibrated-k8s", mode="kubernetes", image=IMAGE, run_root="/runs", pod_kwargs=POD_KWARGS)
    assert "--param" in pods.task_dict["calibrate"].arguments
    assert any(a.startswith("temperature_scale=") for a in pods.task_dict["calibrate"].arguments)


def _string_literals(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as fh:
        for tok in tokenize.generate_tokens(fh.readline):
            if tok.type == tokenize.STRING and not tok.string.startswith(('"""', "'''", 'f"""')):
                try:
                    yield str(ast.literal_eval(tok.string))
                except (ValueError, SyntaxError):  # f-strings
                    yield tok.string


def test_no_step_name_or_parameter_in_the_renderer() -> None:
    pipeline = default_pipeline()
    names = {c.name for c in pipeline.calls} | set(pipeline.params) | {c.step.ref for c in pipeline.calls}
    for module in ("factory.py", "layout.py", "operators.py", "pods.py", "pools.py", "cli.py"):
        found = sorted(names & set(_string_literals(ROOT / "dags" / module)))
        assert found == [], f"dags/{module} names {found}"


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(InvalidParameter, match=r"^mode='docker' is unknown; valid: local, kubernetes$"):
        build_dag(default_pipeline(), mode="docker")
    with pytest.raises(InvalidParameter, match=r"^kubernetes mode needs run_root"):
        build_dag(default_pipeline(), mode="kubernetes", image=IMAGE)
    with pytest.raises(InvalidParameter, match=r"^outlets: unknown call\(s\) nope; calls: prewarm, "):
        build_dag(default_pipeline(), outlets={"nope": []})
    with pytest.raises(InvalidParameter, match=r"no image for device kind 'gpu'"):
        build_dag(default_pipeline(), mode="kubernetes", run_root="/r", profile=PROFILES / "ascend-official.yaml", pod_kwargs=POD_KWARGS)
    with pytest.raises(InvalidParameter, match=r"pod_kwargs may not set cmds"):
        build_dag(default_pipeline(), mode="kubernetes", run_root="/r", image=IMAGE, pod_kwargs={"cmds": ["sh"]})


def test_the_pipeline_may_be_given_by_reference() -> None:
    dag = build_dag("heteroflow.pipelines.default:default_pipeline")
    assert dag.dag_id == "heteroflow-default" and "train.done" in dag.task_ids


def test_subset_keeps_the_calls_with_their_parameters() -> None:
    p = default_pipeline()
    sources = subset(p, ["prewarm"], name="hf-sources")
    assert [c.name for c in sources.calls] == ["prewarm"]
    assert sources.params["dataset_uri"].help == p.params["dataset_uri"].help
    assert sources["prewarm"].retry == p["prewarm"].retry
    with pytest.raises(InvalidParameter, match=r"^subset: preprocess reads prewarm.dataset; keep prewarm too$"):
        subset(p, ["preprocess"], name="hf-bad")


def test_safe_run_id() -> None:
    assert safe_run_id("manual__2026-01-01T00:00:00.123+00:00") == "manual__2026-01-01T00-00-00.123-00-00"
    assert safe_run_id("///") == "run"


# --- what a decision skips ----------------------------------------------------------------------------------------


def test_skip_lists_of_the_planner_a_success_and_a_gate() -> None:
    tasks = Layout(default_pipeline())["train"]
    c, g = tasks.candidates, tasks.gates
    assert tasks.passed_over(0) == []
    assert tasks.passed_over(2) == [c[0], c[1], g[1], g[2]]  # candidate 2 then starts without waiting for a gate
    assert tasks.after_success(0) == [c[1], c[2], g[1], g[2]]
    assert tasks.after_success(2) == []
    assert tasks.route(1, 1) == []  # open candidate 1
    assert tasks.route(1, 2) == [c[1], g[2]]  # pass over candidate 1, open candidate 2
    assert tasks.route(1, None) == [c[1], c[2], g[2]]  # stop
    assert Layout(default_pipeline()).planner_skips({"train": 1, "evaluate": 0}) == [c[0], g[1]]


def _gate(k: int = 1) -> FallbackGateOperator:
    p = default_pipeline()
    return FallbackGateOperator(task_id=f"g{k}", pipeline=p, layout=Layout(p), call_name="train", candidate_index=k)


DEVICE = {"failure": "device", "reason": "InjectedDeviceFault: boom", "candidate": 0, "kind": "npu"}


@pytest.mark.parametrize(
    ("failure", "inventory", "k", "decision", "target", "why"),
    [
        (DEVICE, None, 1, "fallback", 1, r"^candidate 0 \(npu, ascend-910\) failed on its device \(InjectedDeviceFault: boom\): falling back to candidate 1 \(gpu\)$"),
        (DEVICE, {"cpu": 1, "gpu": 0, "npu": 8}, 1, "fallback", 2, r"falling back to candidate 2 \(cpu\)$"),
        ({**DEVICE, "candidate": 1, "kind": "gpu"}, {"gpu": 4}, 2, "fallback", 2, r"^candidate 1 \(gpu, nvidia-gpu\)"),
        ({"failure": "permanent", "reason": "ValueError: bad"}, None, 1, "stop", None, r"failed permanently \(ValueError: bad\): not retried, no fallback$"),
        ({"failure": "transient", "reason": "TimeoutError: t"}, None, 1, "stop", None, r"transient failure after its retries"),
        (None, None, 1, "stop", None, r"did not run \(a task before it failed, or it could not start\): no fallback$"),
    ],
    ids=["device", "device-gpu-absent", "device-last-but-one", "permanent", "transient", "upstream-failed"],
)
def test_gate_opens_a_fallback_only_after_a_device_failure(failure, inventory, k, decision, target, why) -> None:
    got = _gate(k).decide(failure, inventory)
    assert (got["decision"], got["target"]) == (decision, target)
    assert re.search(why, got["why"]), got["why"]
    if inventory == {"cpu": 1, "gpu": 0, "npu": 8}:
        assert got["passed_over"] == ["candidate 1 (gpu x1 (nvidia-gpu), 8 CPU, 32Gi): the plan's inventory has 0 gpu device(s), needs 1"]


# --- retries ---------------------------------------------------------------------------------------------------------


def _transient(first_started_at: float | None = None) -> TransientStepFailure:
    exc = TransientStepFailure("step 'train' failed with a transient failure")
    exc.first_started_at = first_started_at  # type: ignore[attr-defined]
    return exc


def test_retry_policy_waits_exactly_the_steps_backoff() -> None:
    policy = StepRetryPolicy(RetryPolicy(retries=4, backoff_seconds=10, factor=3, max_delay_seconds=60, window_seconds=3600))
    waits = [policy.evaluate(_transient(), try_number=n, max_tries=5).retry_delay for n in (1, 2, 3)]
    assert waits == [timedelta(seconds=10), timedelta(seconds=30), timedelta(seconds=60)]  # min(10 * 3**n, 60)
    assert policy.evaluate(_transient(), try_number=1, max_tries=5).action is RetryAction.RETRY


def test_retry_policy_stops_at_the_window_and_leaves_other_errors_to_airflow() -> None:
    import time

    policy = StepRetryPolicy(RetryPolicy(retries=4, backoff_seconds=10, factor=1, max_delay_seconds=10, window_seconds=60))
    late = policy.evaluate(_transient(first_started_at=time.time() - 55), try_number=2, max_tries=5)
    assert late.action is RetryAction.FAIL and "after the retry window of 60 s" in late.reason
    early = policy.evaluate(_transient(first_started_at=time.time() - 5), try_number=2, max_tries=5)
    assert early.action is RetryAction.RETRY
    assert policy.evaluate(OSError("the API server is gone"), try_number=1, max_tries=5).action is RetryAction.DEFAULT
    assert StepRetryPolicy.deserialize(policy.serialize()).policy == policy.policy


# --- pools ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (Resources(kind="cpu", cpu="8"), (None, 1)),
        (Resources(kind="gpu", count=2), ("heteroflow-gpu", 2)),
        (Resources(accelerator="T4"), ("heteroflow-gpu-nvidia-t4", 1)),
        (Resources(accelerator="Ascend 910B3", count=4), ("heteroflow-npu-ascend-910b3", 4)),
        (Resources(accelerator="910B", count=8), ("heteroflow-npu", 8)),  # a family: any of its models
        (Resources(kind="gpu", device_memory="141Gi"), ("heteroflow-gpu-nvidia-h200", 1)),  # narrowed to one model
    ],
    ids=["cpu", "gpu-any", "t4", "910b3", "910b-family", "narrowed-by-memory"],
)
def test_pool_for(resources: Resources, expected: tuple[str | None, int]) -> None:
    assert pool_for(resources) == expected


def test_pools_for_an_inventory(tmp_path: Path) -> None:
    f = tmp_path / "inventory.yaml"
    f.write_text("gpu: {a100-80gb: 2, t4: 4}\nnpu: 8\n")
    pools = pools_for_inventory(load_inventory(f))
    assert {k: v[0] for k, v in pools.items()} == {
        "heteroflow-gpu": 6, "heteroflow-gpu-nvidia-a100-80gb": 2, "heteroflow-gpu-nvidia-t4": 4, "heteroflow-npu": 8,
    }
    assert {k: v[0] for k, v in pools_for_inventory(Inventory.from_json("{}")).items()} == {"heteroflow-gpu": 0, "heteroflow-npu": 0}


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (None, r"^inventory .*missing.yaml: cannot be read \(No such file or directory\)$"),
        ("gpu: [1, 2", r"^inventory .*inv.yaml: not valid YAML or JSON \(line 1, column 11: expected ',' or '\]', but got '<stream end>' \(while parsing a flow sequence at line 1, column 6\)\)$"),
        ("gpu: 1\n  npu: 2\n", r"^inventory .*inv.yaml: not valid YAML or JSON \(line 2, column 6: mapping values are not allowed here\)$"),
        ("- 1\n", r"^inventory .*inv.yaml: an inventory is a mapping of device kind -> count \(or model -> count\), not list$"),
        ("# only a comment\n", r"^inventory .*inv.yaml: the file is empty; valid: a mapping of device kind -> count"),
        ("gpu: {a100: 2}\n", r"names 'a100', a family"),
        ("tpu: 4\n", r"tpu"),
    ],
    ids=["missing", "not-yaml", "bad-indent", "not-mapping", "empty", "family", "unknown-kind"],
)
def test_bad_inventories_are_clear_errors(tmp_path: Path, text: str | None, pattern: str) -> None:
    f = tmp_path / ("missing.yaml" if text is None else "inv.yaml")
    if text is not None:
        f.write_text(text)
    with pytest.raises(InvalidParameter, match=pattern):
        load_inventory(f)


@pytest.mark.parametrize("text", [None, "gpu: [1, 2", "gpu: 1\n  npu: 2\n", "gpu: 1\ngpu: 2\n", "", "gpu: 2\x00\xff"],
                         ids=["missing", "not-yaml", "bad-indent", "twice", "empty", "not-utf8"])
def test_airflow_pools_and_the_placement_commands_word_a_bad_inventory_alike(tmp_path: Path, text: str | None) -> None:
    """`heteroflow airflow pools` and the placement commands (manifests, simulate) read one file: the same fault
    reads the same after the file's name (it was "is not YAML or JSON: ..." in one and "not valid YAML or JSON
    (...)" in the other)."""
    from heteroflow.components.placement.inventory import InvalidInventory
    from heteroflow.components.placement.inventory import load_inventory as placement_inventory

    f = tmp_path / "inv.yaml"
    if text is not None:
        f.write_bytes(text.encode("latin-1"))
    with pytest.raises(InvalidParameter) as pools:
        load_inventory(f)
    with pytest.raises(InvalidInventory) as placement:
        placement_inventory(f)
    tail = str(placement.value).split(f"{f}", 1)[1]
    assert str(pools.value) == f"inventory {f}{tail}" or (text == "" and "the file is empty" in tail and "the file is empty" in str(pools.value))


# --- kubernetes mode: pods -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig naming an unreachable server: the operators build pods without a cluster."""
    path = tmp_path_factory.mktemp("kube") / "config.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: none, user: {}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\n"
        "current-context: none\n"
    )
    return path


POD_KWARGS: dict[str, Any] = {"namespace": "ml", "in_cluster": False}


def _pipeline() -> Any:
    """The default pipeline with train candidates every example profile can ask for (the default's "any Ascend
    910" is several resources under HAMi, see below): one chip, one GPU model with a memory limit, the CPU."""
    p = default_pipeline()
    p.replace(
        "train",
        candidates=[
            Resources(accelerator="Ascend 910B3", cpu="8", memory="32Gi"),
            Resources(accelerator="T4", cpu="8", memory="32Gi", memory_limit="64Gi"),
            Resources(kind="cpu", cpu="8", memory="16Gi"),
        ],
    )
    return p


def _k8s_dag(profile: str, kubeconfig: Path, pipeline: Any = None) -> Any:
    return build_dag(
        pipeline or _pipeline(),
        f"hf-{profile}",
        mode="kubernetes",
        profile=PROFILES / f"{profile}.yaml",
        image=IMAGE,
        run_root="/mnt/heteroflow-runs",
        pod_kwargs={**POD_KWARGS, "config_file": str(kubeconfig)},
    )


def _pods(dag: Any) -> dict[str, dict[str, Any]]:
    api = client.ApiClient()
    return {
        t.task_id: api.sanitize_for_serialization(t.build_pod_request_obj())
        for t in dag.tasks
        if isinstance(t, PodStepOperator)
    }


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_pod_validates(profile: str, kubeconfig: Path) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (the dev extra) is not installed: pods are not validated")
    pods = _pods(_k8s_dag(profile, kubeconfig))
    assert pods
    for tid, pod in pods.items():
        assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True) == "1.33", tid


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_pod_carries_its_candidate(profile: str, kubeconfig: Path) -> None:
    dag = _k8s_dag(profile, kubeconfig)
    pods = _pods(dag)
    cluster = load_profile(PROFILES / f"{profile}.yaml")
    pipeline = _pipeline()
    layout = Layout(pipeline)
    assert set(pods) == {tid for c in pipeline.calls for tid in layout[c.name].candidates}
    for call in pipeline.calls:
        for k, tid in enumerate(layout[call.name].candidates):
            pod = pods[tid]
            want = build_pod_resources(call.candidates[k], cluster)
            spec, meta = pod["spec"], pod["metadata"]
            base = spec["containers"][0]
            assert base["name"] == "base" and base["command"][:2] == ["heteroflow", "step"]
            assert base["resources"] == client.ApiClient().sanitize_for_serialization(want.resources), tid
            assert base["image"] == (want.image or IMAGE)
            assert (spec.get("nodeSelector") or {}) == want.node_selector
            assert (spec.get("tolerations") or []) == client.ApiClient().sanitize_for_serialization(want.tolerations)
            assert spec.get("schedulerName") == cluster.scheduler_name
            for key, value in want.labels.items():
                assert meta["labels"][key] == value
            assert (meta.get("annotations") or {}) == want.annotations
            assert base["terminationMessagePolicy"] == "FallbackToLogsOnError"
            assert meta["namespace"] == "ml" and spec["restartPolicy"] == "Never"


def test_a_candidate_the_profile_cannot_ask_for_fails_when_the_dag_is_built(kubeconfig: Path) -> None:
    with pytest.raises(InvalidResources, match=r"^accelerator='ascend-910' \(any Ascend 910\) is several resources under the 'hami'"):
        _k8s_dag("ascend-hami", kubeconfig, default_pipeline())


def test_queue_label_annotation_and_scheduler(kubeconfig: Path) -> None:
    kueue = _pods(_k8s_dag("kueue-gke", kubeconfig))["train.gpu-1"]
    assert kueue["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert kueue["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    assert kueue["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}
    volcano = _pods(_k8s_dag("ascend-official", kubeconfig, default_pipeline()))["train.npu-0"]
    assert volcano["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "default"}
    assert volcano["spec"]["schedulerName"] == "volcano"
    assert volcano["spec"]["containers"][0]["image"] == "registry.example.com/heteroflow:cann8"
    assert volcano["spec"]["containers"][0]["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    assert volcano["spec"]["tolerations"] == [{"effect": "NoSchedule", "key": "huawei.com/Ascend910", "operator": "Exists"}]
    p = default_pipeline()
    p.replace("train", candidates=[Resources(accelerator="Ascend 910B3", cpu="8", memory="32Gi"), "cpu"])
    chip = _pods(_k8s_dag("ascend-official", kubeconfig, p))["train.npu-0"]
    assert chip["spec"]["nodeSelector"] == {"node.kubernetes.io/npu.chip.name": "910B3"}


def test_every_try_gets_a_new_pod_name(kubeconfig: Path) -> None:
    op = _k8s_dag("nvidia-gfd", kubeconfig).task_dict["train.gpu-1"]
    names = {op.build_pod_request_obj().metadata.name for _ in range(3)}
    assert len(names) == 3
    assert all(re.fullmatch(r"hf-nvidia-gfd-train-gpu-1-[a-z0-9]{8}", n) for n in names), names


class _TI:
    """A task instance as templates and operators see it: XCom from the prepare-run task."""

    def __init__(self, prep: dict[str, Any]) -> None:
        self.prep = prep
        self.pushed: dict[str, Any] = {}
        self.map_index = -1

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.prep if task_ids == PREPARE_TASK else None

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_the_pod_command_renders_to_a_heteroflow_step_command(kubeconfig: Path) -> None:
    pipeline = _pipeline()
    args = pipeline.arguments({"dataset_uri": "s3://bucket/data", "epochs": 7})
    dag = _k8s_dag("nvidia-gfd", kubeconfig)
    op = dag.task_dict["train.gpu-1"]
    context = {"ti": _TI({"run_dir": "/mnt/r/1", "run_id": "r1", "args": args})}
    rendered = op.render_template(op.arguments, context)
    pairs = dict(zip(rendered[::2], rendered[1::2]))
    assert op.cmds == ["heteroflow", "step", "heteroflow.components.training.step:TRAIN"]
    assert pairs["--call"] == "train" and pairs["--run-dir"] == "/mnt/r/1"
    assert pairs["--outcome"] == "/airflow/xcom/return.json"
    params = dict(v.split("=", 1) for f, v in zip(rendered[::2], rendered[1::2]) if f == "--param")
    assert params["epochs"] == "7" and params["learning_rate"] == str(args["learning_rate"])
    assert set(params) == set(pipeline["train"].step.param_names)
    assert "--input" in rendered and "shards=/mnt/r/1/artifacts/preprocess/shards" in rendered
    assert "model=/mnt/r/1/artifacts/train/model" in rendered
    candidate = json.loads(pairs["--candidate"])
    assert candidate["index"] == 1 and candidate["resources"]["kind"] == "gpu"
    assert op.render_template(op.env_vars, context)[0].value == "r1"
    plan = dag.task_dict["plan"].render_template(dag.task_dict["plan"].arguments, context)
    assert json.loads(plan[plan.index("--placements") + 1]) == pipeline.placements()


def test_a_constant_bound_at_the_call_is_passed_literally() -> None:
    from heteroflow.components.steps import PREPROCESS, PREWARM
    from heteroflow.pipelines.graph import Pipeline

    p = Pipeline("hf-const")
    data = p.add(PREWARM, source_uri=p.param("dataset_uri"))
    p.add(PREPROCESS, dataset=data.outputs.dataset, test_fraction=0.2)
    cmds, args = step_command(p, p["preprocess"], None)
    assert cmds[-1] == "heteroflow.components.data.preprocess:PREPROCESS" and "--candidate" not in args
    op = build_dag(p, "hf-const", mode="kubernetes", image=IMAGE, run_root="/r", pod_kwargs=POD_KWARGS).task_dict["preprocess"]
    rendered = op.render_template(op.arguments, {"ti": _TI({"run_dir": "/r/1", "run_id": "1", "args": p.arguments({"dataset_uri": "x"})})})
    assert "test_fraction=0.2" in rendered and "test_fraction" not in p.params


# --- kubernetes mode: failures read from the pod ------------------------------------------------------------------


def _pod(*, exit_code: int | None = None, message: str = "", phase: str = "Failed", unschedulable: bool = False) -> Any:
    statuses = []
    if exit_code is not None:
        statuses = [
            client.V1ContainerStatus(
                name="base", image="i", image_id="", ready=False, restart_count=0,
                state=client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=exit_code, message=message, reason="Error")),
            )
        ]
    conditions = [client.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message="0/3 nodes are available: 3 Insufficient huawei.com/Ascend910.")] if unschedulable else []
    return client.V1Pod(status=client.V1PodStatus(phase=phase, container_statuses=statuses, conditions=conditions))


def _gated(queue: str | None) -> Any:
    """A pod Kueue holds (issue #28.16): Pending, PodScheduled=False with reason SchedulingGated."""
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else None
    condition = client.V1PodCondition(type="PodScheduled", status="False", reason="SchedulingGated",
                                      message="Scheduling is blocked due to non-empty scheduling gates")
    return client.V1Pod(metadata=client.V1ObjectMeta(labels=labels),
                        status=client.V1PodStatus(phase="Pending", conditions=[condition]))


OUTCOME_LINE = json.dumps({"status": "failed", "failure": "device", "reason": "RuntimeError: NPU function error: aclrtGetDeviceCount"})


@pytest.mark.parametrize(
    ("pod", "route", "reason"),
    [
        (_pod(exit_code=4, message=OUTCOME_LINE + "\nstep train failed (device): ..."), "device", "RuntimeError: NPU function error: aclrtGetDeviceCount"),
        (_pod(exit_code=3, message="step train failed (permanent): ValueError: bad"), "permanent", "step train failed (permanent): ValueError: bad"),
        (_pod(exit_code=2, message="error: unknown parameter"), "permanent", "error: unknown parameter"),
        (_pod(exit_code=5, message=""), "transient", "container base exited with code 5 (Error)"),
        (_pod(exit_code=137), "transient", "container base exited with code 137 (Error)"),
        (_pod(exit_code=1, message="Traceback ..."), None, "Traceback ..."),
        (_pod(phase="Pending", unschedulable=True), "device", "the pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient huawei.com/Ascend910."),
        (_pod(phase="Pending"), None, ""),
        (_gated(queue="team-a"), "device", "the pod is held by Kueue in queue 'team-a' (SchedulingGated): the queue did "
                                           "not admit it before the schedule timeout"),
        (_gated(queue=None), "device", "the pod is held by a scheduling gate (no Kueue queue label) (SchedulingGated): "
                                       "the queue did not admit it before the schedule timeout"),
    ],
    ids=["device", "permanent", "usage", "transient", "killed", "other-exit", "unschedulable", "pending", "kueue-gated",
         "gated-without-queue"],
)
def test_route_of_a_pod(pod: Any, route: str | None, reason: str) -> None:
    assert route_of_pod(pod) == (route, reason)


def test_pod_operator_ends_like_the_local_task(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own ending, with KubernetesPodOperator.execute replaced (no cluster): a pod that exits 4
    leaves a device failure in XCom and fails without retry; a succeeded planner pod skips what it passed over."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk.exceptions import AirflowException

    dag = _k8s_dag("ascend-official", kubeconfig)
    train = dag.task_dict["train.npu-0"]

    def fail(self: Any, context: Any) -> Any:
        self.remote_pod = _pod(exit_code=4, message=OUTCOME_LINE)
        raise AirflowException("Pod returned a failure.")

    monkeypatch.setattr(KubernetesPodOperator, "execute", fail)
    ti = _TI({})
    with pytest.raises(AirflowFailException, match=r"failed on candidate 0 \(npu\) with a device failure: RuntimeError: NPU function error"):
        train.execute({"ti": ti})
    assert ti.pushed[FAILURE_KEY]["route"] == "device" and ti.pushed[FAILURE_KEY]["candidate"] == 0

    outcome = {"status": "succeeded", "facts": {"indices": {"train": 2}, "inventory": {"cpu": 1}}, "outputs": {"placement": {"path": "/r/p", "metadata": {}}}}
    monkeypatch.setattr(KubernetesPodOperator, "execute", lambda self, context: outcome)
    ti = _TI({})
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        dag.task_dict["plan"].execute({"ti": ti})
    assert set(skipped.value.tasks) == {"train.npu-0", "train.gpu-1", "train.fallback-to-1", "train.fallback-to-2"}
    assert ti.pushed["return_value"]["outputs"] == {"placement": "/r/p"}


# --- golden pods ---------------------------------------------------------------------------------------------------


def _normalise_pod(pod: dict[str, Any]) -> dict[str, Any]:
    pod = json.loads(json.dumps(pod))
    pod["metadata"]["name"] = re.sub(r"-[a-z0-9]{8}$", "-<suffix>", pod["metadata"]["name"])
    labels = pod["metadata"].get("labels") or {}
    if "airflow_version" in labels:
        labels["airflow_version"] = "<VERSION>"
    return pod


def _diff(expected: Any, actual: Any, path: str = "$") -> Iterator[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in actual:
                yield f"{path}.{key}: missing in the rendered pods"
            elif key not in expected:
                yield f"{path}.{key}: not in the golden file ({actual[key]!r:.200})"
            else:
                yield from _diff(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (e, a) in enumerate(zip(expected, actual)):
            yield from _diff(e, a, f"{path}[{i}]")
    elif expected != actual:
        yield f"{path}: golden {expected!r:.200} != rendered {actual!r:.200}"


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_golden_pods(profile: str, kubeconfig: Path) -> None:
    actual = {tid: _normalise_pod(pod) for tid, pod in sorted(_pods(_k8s_dag(profile, kubeconfig)).items())}
    golden = GOLDEN_DIR / f"airflow_pods_{profile}.yaml"
    if os.environ.get(UPDATE_GOLDEN_ENV) == "1":
        header = (
            f"# Golden Airflow pods of the default pipeline (train candidates: 910B3, T4, CPU) in kubernetes mode with\n# examples/profiles/{profile}.yaml, "
            "built by KubernetesPodOperator.build_pod_request_obj (pod-name suffix and Airflow version normalised).\n"
            f"# Regenerate: {UPDATE_GOLDEN_ENV}=1 pytest tests/test_dags.py -k golden\n"
        )
        golden.write_text(header + yaml.safe_dump(actual, sort_keys=True, width=120), encoding="utf-8")
    assert golden.is_file(), f"{golden} is missing; create it with {UPDATE_GOLDEN_ENV}=1"
    expected = yaml.safe_load(golden.read_text(encoding="utf-8"))
    differences = list(_diff(expected, actual))
    assert not differences, f"{len(differences)} difference(s) from {golden.name}; first: " + "\n".join(differences[:10])


# --- the same candidates in KFP and in Airflow ----------------------------------------------------------------------


def _kfp_tasks(path: Path, call: str) -> dict[int, dict[str, Any]]:
    """Per candidate index of ``call``: its compiled KFP task's resources and kfp-kubernetes settings."""
    docs = list(yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml where built: same data, faster
    spec = docs[0]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}
    out: dict[int, dict[str, Any]] = {}

    def walk(dag: dict[str, Any]) -> None:
        for name, task in dag["tasks"].items():
            comp = spec["components"][task["componentRef"]["name"]]
            if "dag" in comp:
                walk(comp["dag"])
                continue
            candidate = task.get("inputs", {}).get("parameters", {}).get("heteroflow_candidate")
            if candidate is None or not re.fullmatch(rf"{call}(-\d+)?", name):
                continue
            index = json.loads(candidate["runtimeValue"]["constant"])["index"]
            executor = comp["executorLabel"]
            res = spec["deploymentSpec"]["executors"][executor]["container"].get("resources", {})
            k8s = platform.get(executor, {})
            requests = {"cpu": res.get("resourceCpuRequest"), "memory": res.get("resourceMemoryRequest")}
            limits = {"cpu": res.get("resourceCpuLimit"), "memory": res.get("resourceMemoryLimit")}
            if "accelerator" in res:
                requests[res["accelerator"]["resourceType"]] = limits[res["accelerator"]["resourceType"]] = res["accelerator"]["resourceCount"]
            seen = {
                "requests": {k: v for k, v in requests.items() if v is not None},
                "limits": {k: v for k, v in limits.items() if v is not None},
                "node_selector": (k8s.get("nodeSelector") or {}).get("labels", {}),
                "tolerations": k8s.get("tolerations", []),
                "labels": (k8s.get("podMetadata") or {}).get("labels", {}),
                "annotations": (k8s.get("podMetadata") or {}).get("annotations", {}),
            }
            assert out.setdefault(index, seen) == seen, "every copy of a candidate's task asks for the same"

    walk(spec["root"]["dag"])
    return out


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_the_same_candidates_ask_the_same_in_kfp_and_in_airflow(profile: str, kubeconfig: Path, tmp_path: Path) -> None:
    pytest.importorskip("kfp", reason="the kfp extra is not installed")
    from heteroflow.pipelines.kfp.render import compile_pipeline

    pipeline = _pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # schedulerName: KFP cannot set it (the Airflow pods do)
        compiled = compile_pipeline(pipeline, tmp_path / "p.yaml", image=IMAGE, profile=load_profile(PROFILES / f"{profile}.yaml"))
    kfp = _kfp_tasks(compiled, "train")
    pods = _pods(_k8s_dag(profile, kubeconfig))
    layout = Layout(pipeline)
    assert sorted(kfp) == list(range(len(pipeline["train"].candidates)))
    for index, tid in enumerate(layout["train"].candidates):
        pod = pods[tid]
        base = pod["spec"]["containers"][0]
        labels = {k: v for k, v in pod["metadata"]["labels"].items() if not k.startswith("airflow_")}
        airflow = {
            "requests": base["resources"].get("requests", {}),
            "limits": base["resources"].get("limits", {}),
            "node_selector": pod["spec"].get("nodeSelector") or {},
            "tolerations": pod["spec"].get("tolerations") or [],
            "labels": labels,
            "annotations": pod["metadata"].get("annotations") or {},
        }
        assert kfp[index] == airflow, f"candidate {index} ({tid})"


# --- the command line and imports ------------------------------------------------------------------------------------


def test_cli_and_layout_import_no_airflow() -> None:
    import subprocess
    import sys

    code = "import sys, heteroflow.dags, heteroflow.dags.cli, heteroflow.dags.layout; print(sorted(m for m in ('airflow', 'torch', 'kfp') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_airflow_command_group_is_registered() -> None:
    import subprocess
    import sys
    from importlib.metadata import entry_points

    assert {e.name: e.value for e in entry_points(group="heteroflow.cli")}.get("airflow") == "heteroflow.dags.cli:app"
    done = subprocess.run([str(Path(sys.executable).with_name("heteroflow")), "airflow", "pools", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--inventory" in done.stdout


@pytest.mark.parametrize(
    ("args", "loaded"),
    [(["--help"], True), (["airflow", "--help"], True), (["--debug", "airflow", "pools", "--help"], True),
     (["run", "--help"], False), (["--debug", "runs", "--help"], False), (["params"], False)],
)
def test_plugins_are_loaded_only_when_the_command_line_may_name_one(args: list[str], loaded: bool) -> None:
    """A built-in command (``heteroflow run``) does not load the plugins' command groups (``heteroflow airflow``
    imports its DAG code); the top-level help and a plugin's command do, and the help lists them."""
    import subprocess
    import sys

    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', 'heteroflow.dags.cli' in sys.modules))\n"
        f"sys.argv = ['heteroflow', *{args!r}]\n"
        "from heteroflow.pipelines.cli.script import console_script\n"
        "console_script()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"LOADED {loaded}"), done.stdout[-300:]
    if args == ["--help"]:
        assert "airflow" in done.stdout


def test_a_calls_secrets_reach_its_pod_as_secret_key_refs(kubeconfig: Path) -> None:
    from heteroflow.pipelines.graph import SecretEnv

    p = _pipeline()
    p.replace("prewarm", secrets=[SecretEnv("s3-creds", {"AWS_ACCESS_KEY_ID": "access_key", "AWS_SECRET_ACCESS_KEY": "secret_key"})])
    pods = _pods(_k8s_dag("nvidia-gfd", kubeconfig, p))
    env = {e["name"]: e for e in pods["prewarm"]["spec"]["containers"][0]["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "access_key"}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "secret_key"}
    assert "HETEROFLOW_RUN_ID" in env
    other = {e["name"] for e in pods["preprocess"]["spec"]["containers"][0]["env"]}
    assert "AWS_ACCESS_KEY_ID" not in other  # only the call that asked for it


def test_the_runs_conf_takes_a_short_name_for_every_call_that_shares_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`airflow dags test ... -c '{"seed": 1}'` sets preprocess.seed and train.seed, as `heteroflow run --param
    seed=1` does (#15.5); a qualified name beside it wins for its call; a typo is still refused, listing the short
    names too."""
    import types

    monkeypatch.setattr("heteroflow.dags.pools.check_pools", lambda *a, **k: None)  # no Airflow database here
    pipeline = default_pipeline()
    dag = build_dag(pipeline, "hf-conf", run_root=str(tmp_path))
    prepare = dag.get_task(PREPARE_TASK)
    defaults = {name: (None if p.required else p.default) for name, p in pipeline.params.items()}

    def execute(conf: dict[str, Any]) -> dict[str, Any]:
        params = {**defaults, **{k: v for k, v in conf.items() if k in pipeline.params}}  # what Airflow merges
        context = {"run_id": f"manual__{len(conf)}", "params": params, "dag_run": types.SimpleNamespace(conf=conf)}
        prepare.local = False  # arguments checked, no data set read
        return prepare.execute(context)["args"]

    args = execute({"dataset_uri": "s3://bucket/digits", "seed": 3})
    assert (args["preprocess.seed"], args["train.seed"]) == (3, 3)
    args = execute({"dataset_uri": "s3://bucket/digits", "seed": 3, "train.seed": 5})
    assert (args["preprocess.seed"], args["train.seed"]) == (3, 5)
    with pytest.raises(AirflowFailException, match=r"unknown parameter\(s\) sead in the run's conf \(did you mean 'seed'\?\); valid: .*\bseed\b"):
        execute({"dataset_uri": "s3://bucket/digits", "sead": 3})


def test_two_dags_scheduled_at_the_same_time_record_different_run_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#28.12 sibling: the run id was Airflow's, unique only within a DAG: two DAGs scheduled at 03:00 both ran
    ``scheduled__...T03:00:00+00:00`` and their records and Prometheus files collided."""
    import types

    monkeypatch.setattr("heteroflow.dags.pools.check_pools", lambda *a, **k: None)  # no Airflow database here
    pipeline = default_pipeline()
    defaults = {name: (None if p.required else p.default) for name, p in pipeline.params.items()}
    params = {**defaults, "dataset_uri": "s3://bucket/digits"}
    airflow_id = "scheduled__2026-12-01T03:00:00+00:00"
    seen = []
    for dag_id in ("hf-a", "hf-b"):
        prepare = build_dag(pipeline, dag_id, run_root=str(tmp_path)).get_task(PREPARE_TASK)
        prepare.local = False  # arguments checked, no data set read
        seen.append(prepare.execute({"run_id": airflow_id, "params": params, "dag_run": types.SimpleNamespace(conf={})}))
    assert [s["run_id"] for s in seen] == [f"scheduled__2026-12-01T03-00-00-00-00-{d}" for d in ("hf-a", "hf-b")]
    assert seen[0]["run_dir"] != seen[1]["run_dir"]


@pytest.mark.parametrize("operator", ["local", "pod"])
def test_both_step_operators_take_the_call_through_one_init(operator: str) -> None:
    """StepEnding's ``__init__`` (the one both step operators use) sets the call and stays under Airflow's
    argument check: a missing call argument is refused by name, and the operator's own arguments still apply."""
    from heteroflow.dags.operators import StepEnding, StepOperator

    cls = StepOperator if operator == "local" else PodStepOperator
    extra = {} if operator == "local" else {"image": "img", "name": "p"}
    p = default_pipeline()
    layout = Layout(p)
    op = cls(task_id="t", pipeline=p, layout=layout, call_name="train", candidate_index=1, retries=2, **extra)
    assert isinstance(op, StepEnding)
    assert (op.pipeline, op.layout, op.call_name, op.candidate_index, op.retries) == (p, layout, "train", 1, 2)
    assert cls(task_id="u", pipeline=p, layout=layout, call_name="prewarm", **extra).candidate_index is None
    if operator == "pod":
        assert op.image == "img"
    with pytest.raises(TypeError, match="missing keyword argument 'call_name'"):
        cls(task_id="v", pipeline=p, layout=layout, **extra)


@pytest.mark.parametrize("given", [None, 3, default_pipeline().placements()])
def test_build_dag_of_something_not_a_pipeline_names_the_argument(given: Any) -> None:
    """A new user's trial: build_dag(None, ...) said "'NoneType' object has no attribute 'calls'"."""
    with pytest.raises(InvalidParameter, match=r"^pipeline=.* is not a heteroflow Pipeline; valid: a Pipeline or 'module:attribute' "
                                               r"of one \(the default pipeline: default_pipeline\(\)"):
        build_dag(given, "d")
    assert build_dag("heteroflow.pipelines.default:default_pipeline", "d").dag_id == "d"  # a reference still works


@pytest.mark.parametrize("given", [None, "ACTIVE"])
def test_a_local_step_task_sets_passive_openmp_waits_before_its_step_imports_torch(monkeypatch: pytest.MonkeyPatch, given: str | None) -> None:
    """A new user's trial: train under `airflow dags test` was 2-5x slower than under `heteroflow run` beside a busy
    core (7,817-9,750 samples/s against 18,421-52,995), because only the heteroflow command set
    OMP_WAIT_POLICY=PASSIVE; an Airflow task runs the step in its own process. A value the user set is kept."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if given:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    train = build_dag(default_pipeline(), "hf-omp").task_dict["train.cpu-2"]
    with pytest.raises(AirflowFailException, match="left no run folder"):  # it sets the policy before anything else
        train.execute({"ti": _TI({})})
    assert os.environ["OMP_WAIT_POLICY"] == (given or "PASSIVE")


def test_ctrl_c_in_a_local_step_task_stops_the_run_without_a_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: Ctrl-C during `airflow dags test` was retried by Airflow in the same process (the run went
    on, or failed on a torch import the stop had left half done). The task now fails without a retry, saying how to
    resume."""
    from heteroflow.components.core import runtime

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime, "run_step", stopped)
    pipeline = default_pipeline()
    train = build_dag(pipeline, "hf-ctrl-c").task_dict["train.cpu-2"]
    prep = {"run_dir": str(tmp_path), "run_id": "r1", "args": pipeline.arguments({"dataset_uri": str(tmp_path)})}
    with pytest.raises(AirflowFailException, match=r"train: interrupted \(Ctrl-C\); the run stops here. Trigger the DAG again to resume"):
        train.execute({"ti": _TI(prep)})


def test_the_pools_read_an_inventorys_workload_relative_to_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: `heteroflow airflow pools --inventory examples/shared_gpu/inventory.yaml` from the repo
    root failed ("workload='pods.csv': no such file"): the pools looked for it in the working folder, the plan step
    and simulate in the inventory's."""
    from heteroflow.dags.pools import pool_plan

    example = Path(__file__).resolve().parents[1] / "examples" / "shared_gpu" / "inventory.yaml"
    monkeypatch.chdir(tmp_path)  # anywhere but the inventory's folder
    pools = pool_plan(load_inventory(example))
    assert pools["heteroflow-gpu-nvidia-t4"][0] > 0
