"""The step-level options practitioners write in KFP (issue #31), with #28.19-20: env vars, volumes (CreatePVC /
mount_pvc / DeletePVC, an existing PVC, a ConfigMap or Secret as files), ``.after()``, ``base_image`` and
``packages_to_install``, a request without a limit, ``pipeline_root`` and display names, dashed call names, KFP's
parameter spellings, ``retry_on="any"``.

The two example pipelines of ``examples/practitioners`` (``pvc_training``, ``env_secrets``) are compiled with the
real KFP compiler and loaded back with KFP's loader, rendered as Airflow pods validated by kubernetes-validate, and
run on the local engines (slow)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from heteroflow import ArtifactSpec, ArtifactType, Pipeline, Resources, RetryPolicy, step
from heteroflow.components.core.mounts import MOUNTS_ENV, local_path
from heteroflow.components.errors import HeteroflowError, InvalidParameter, InvalidResources
from heteroflow.pipelines.kfp.render import compile_pipeline, kfp_param_names
from heteroflow.pipelines.volumes import PVC, ConfigMapVolume, CreatePVC, SecretVolume, local_mounts

PRACTITIONERS = Path(__file__).resolve().parents[1] / "examples" / "practitioners"
K8S_VERSION = "1.33.0"
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@pytest.fixture()
def examples(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``examples/practitioners`` on sys.path and PYTHONPATH (step processes import the examples by name)."""
    monkeypatch.syspath_prepend(str(PRACTITIONERS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PRACTITIONERS), os.environ.get("PYTHONPATH", "")]))
    import env_secrets
    import pvc_training

    class Examples:
        pvc = pvc_training
        etl = env_secrets

    return Examples


def _compiled(pipeline: Pipeline, path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    from kfp import components

    written = compile_pipeline(pipeline, path)
    docs = list(yaml.safe_load_all(written.read_text(encoding="utf-8")))
    loaded = components.load_component_from_file(str(written))  # KFP's own loader takes it
    return docs[0], (docs[1] if len(docs) > 1 else {}), loaded


def _executor(ir: dict[str, Any], task: str) -> tuple[str, dict[str, Any]]:
    component = ir["components"][ir["root"]["dag"]["tasks"][task]["componentRef"]["name"]]
    label = component["executorLabel"]
    return label, ir["deploymentSpec"]["executors"][label]["container"]


# --- KFP -------------------------------------------------------------------------------------------------------


def test_the_pvc_pipeline_compiles_with_create_mount_and_delete_pvc(examples: Any, tmp_path: Path) -> None:
    ir, platform, loaded = _compiled(examples.pvc.pipeline, tmp_path / "pvc.yaml")
    tasks = ir["root"]["dag"]["tasks"]
    assert loaded.pipeline_spec.pipeline_info.display_name == "PVC-backed training"
    assert ir["defaultPipelineRoot"] == "minio://mlpipeline/v2/artifacts"
    create = next(n for n, t in tasks.items() if t["taskInfo"]["name"].startswith("create PVC workspace"))
    delete = next(n for n, t in tasks.items() if t["taskInfo"]["name"].startswith("delete PVC workspace"))
    create_spec = ir["components"][tasks[create]["componentRef"]["name"]]
    assert tasks[create]["inputs"]["parameters"]["size"]["runtimeValue"]["constant"] == "1Gi"
    assert tasks[create]["inputs"]["parameters"]["pvc_name_suffix"]["runtimeValue"]["constant"] == "-workspace"
    assert ir["deploymentSpec"]["executors"][create_spec["executorLabel"]]["container"]["image"] == "argostub/createpvc"
    # every call mounts the claim CreatePVC made, at the path the pipeline gave
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for call in ("download", "train-model", "evaluate"):
        label, _ = _executor(ir, call)
        (mount,) = executors[label]["pvcMount"]
        assert mount["mountPath"] == "/mnt/workspace"
        assert mount["pvcNameParameter"]["taskOutputParameter"] == {"outputParameterKey": "name", "producerTask": create}
        assert create in tasks[call]["dependentTasks"]
    # DeletePVC runs after every call that mounts it
    assert {"download", "train-model", "evaluate"} <= set(tasks[delete]["dependentTasks"])
    # .after(): train-model reads nothing from download, yet starts after it (and evaluate after train-model)
    assert "download" in tasks["train-model"]["dependentTasks"] and "train-model" in tasks["evaluate"]["dependentTasks"]
    # base_image, a request without a CPU limit, retry_on="any" with its policy, the default policy written out
    _, train = _executor(ir, "train-model")
    assert train["image"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert train["resources"]["cpuRequest"] == 2 and "cpuLimit" not in train["resources"]
    assert {"name": "HETEROFLOW_RETRY_ON", "value": "any"} in train["env"]
    assert tasks["train-model"]["retryPolicy"]["maxRetryCount"] == 1
    assert tasks["download"]["retryPolicy"] == {
        "backoffDuration": "5s", "backoffFactor": 2.0, "backoffMaxDuration": "3600s", "maxRetryCount": 2,
    }
    # integer defaults are integers in the YAML (#28.20), floats stay floats
    root = ir["root"]["inputDefinitions"]["parameters"]
    assert root["rows"]["defaultValue"] == 256 and isinstance(root["rows"]["defaultValue"], int)
    assert isinstance(root["learning_rate"]["defaultValue"], float)
    assert tasks["download"]["taskInfo"]["name"] == "download the data set"


def test_the_env_and_secrets_pipeline_compiles_with_env_secret_and_config_map_settings(examples: Any, tmp_path: Path) -> None:
    ir, platform, _ = _compiled(examples.etl.pipeline, tmp_path / "etl.yaml")
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    label, extract = _executor(ir, "extract")
    assert {"name": "SOURCE_REGION", "value": "eu-north-1"} in extract["env"]
    label, transform = _executor(ir, "transform")
    assert {"name": "UNITS", "value": "imperial"} in transform["env"]
    assert executors[label]["configMapAsVolume"][0]["configMapName"] == "etl-config"
    assert executors[label]["configMapAsVolume"][0]["mountPath"] == "/etc/etl"
    assert "pip install" in " ".join(transform["command"]) and "pyarrow>=15" in " ".join(transform["command"])
    label, load = _executor(ir, "load-warehouse")  # a dashed call name is a KFP task name as it is
    settings = executors[label]
    assert settings["secretAsEnv"][0]["secretName"] == "warehouse-db"
    assert {e["envVar"]: e["secretKey"] for e in settings["secretAsEnv"][0]["keyToEnv"]} == {
        "WAREHOUSE_USER": "username", "WAREHOUSE_PASSWORD": "password",
    }
    assert settings["secretAsVolume"][0] == {
        "mountPath": "/var/run/secrets/warehouse", "optional": False, "secretName": "warehouse-token",
        "secretNameParameter": {"runtimeValue": {"constant": "warehouse-token"}},
    }
    assert {"name": "WAREHOUSE_HOST", "value": "warehouse.internal:5432"} in load["env"]
    assert "MOUNTS" not in json.dumps(ir)  # the local folders stay out of a cluster's pipeline


def test_no_task_of_a_fallback_chain_is_shown_with_a_generic_name(tmp_path: Path) -> None:
    """#28.19: KFP names an If/Else pair's group condition-branches-N and an importer importer-N; the UI shows
    taskInfo.name, which now names the call (and a sibling: every task and group, in every sub-DAG)."""
    from heteroflow.pipelines.default import default_pipeline

    pipeline = default_pipeline(train_candidates=["gpu:count=1", "cpu:cpu=2"])
    ir, _, _ = _compiled(pipeline, tmp_path / "default.yaml")
    dags = [ir["root"], *ir["components"].values()]
    shown = [t["taskInfo"]["name"] for d in dags for t in d.get("dag", {}).get("tasks", {}).values()]
    assert shown and not [n for n in shown if re.fullmatch(r"(condition-branches|condition|importer)(-\d+)?", n)], shown
    assert "train: gpu -> cpu [cpu-1 or not]" in shown and "train: model (from the candidate that ran)" in shown


def test_a_fallback_chain_mounts_a_created_pvc_in_every_candidate_and_delete_waits_for_its_importers(tmp_path: Path) -> None:
    """The candidates of a chain sit in condition groups: the claim's name reaches them as a group input, and
    DeletePVC waits for the tasks after the chain (its importers), which nothing inside a group may be named by."""
    from heteroflow.pipelines.default import default_pipeline

    pipeline = default_pipeline(train_candidates=["gpu:count=1", "cpu:cpu=2"])
    checkpoints = CreatePVC("ckpt", size="2Gi")
    pipeline.replace("train", volumes={"/mnt/ckpt": checkpoints}, env={"TORCH_HOME": "/mnt/ckpt/torch"})
    pipeline.replace("evaluate", volumes={"/mnt/ckpt": checkpoints})
    ir, platform, _ = _compiled(pipeline, tmp_path / "chain.yaml")
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = [e for label, e in executors.items() if label.startswith("exec-train")]
    assert len(train) == 2 and all(e["pvcMount"][0]["mountPath"] == "/mnt/ckpt" for e in train)
    tasks = ir["root"]["dag"]["tasks"]
    (delete,) = [n for n, t in tasks.items() if t["taskInfo"]["name"].startswith("delete PVC ckpt")]
    importers = [n for n, t in tasks.items() if t["taskInfo"]["name"].endswith("(from the candidate that ran)")]
    assert len(importers) == 2 and set(importers) | {"evaluate"} <= set(tasks[delete]["dependentTasks"])


# --- Airflow ---------------------------------------------------------------------------------------------------


@pytest.fixture()
def kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig naming an unreachable server: the operators build pods without a cluster."""
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: none, user: {}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\n"
        "current-context: none\n"
    )
    return path


def _pods(pipeline: Pipeline, kubeconfig: Path) -> tuple[Any, dict[str, dict[str, Any]]]:
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    from kubernetes import client

    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.pods import PodStepOperator

    dag = build_dag(
        pipeline,
        mode="kubernetes",
        image="registry.example.com/heteroflow:0.1.0",
        run_root="/mnt/heteroflow-runs",
        pod_kwargs={"namespace": "ml", "in_cluster": False, "config_file": str(kubeconfig)},
    )
    api = client.ApiClient()
    pods = {t.task_id: api.sanitize_for_serialization(t.build_pod_request_obj()) for t in dag.tasks if isinstance(t, PodStepOperator)}
    return dag, pods


def _validate(obj: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the dev extra) is not installed")
    assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.33"


def test_the_pvc_pipeline_renders_to_airflow_with_a_claim_per_run(examples: Any, kubeconfig: Path) -> None:
    from heteroflow.dags.volumes import claim_name, manifests

    dag, pods = _pods(examples.pvc.pipeline, kubeconfig)
    assert set(pods) == {"download", "train-model", "evaluate"}
    for pod in pods.values():
        _validate(pod)
        (volume,) = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
        (mount,) = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["mountPath"] == "/mnt/workspace"
        assert volume["persistentVolumeClaim"]["claimName"] == claim_name("workspace")
    # the claim's name, rendered for a run, is a Kubernetes name; the claim validates
    rendered = jinja2.Template(claim_name("workspace")).render(
        dag=type("D", (), {"dag_id": "pvc-training"}), run_id="manual__2026-12-03T09:00:00.123456+00:00"
    )
    assert _DNS.match(rendered) and rendered.endswith("-workspace") and rendered.startswith("hf-pvc-training-manual--2026")
    (claim,) = manifests(examples.pvc.pipeline, {"workspace": rendered})
    _validate(claim)
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    # created before the first call that mounts it, deleted after all of them whatever they ended with
    create, delete = dag.get_task("create-pvc-workspace"), dag.get_task("delete-pvc-workspace")
    assert {t.task_id for t in create.downstream_list} >= {"download", "train-model", "evaluate"}
    assert {t.task_id for t in delete.upstream_list} == {"download", "train-model", "evaluate"}
    assert delete.trigger_rule == "all_done"
    assert yaml.safe_load(create.yaml_conf)["metadata"]["name"] == claim_name("workspace")
    # .after() is an edge; image and the request without a CPU limit reach the pod
    assert "download" in {t.task_id for t in dag.get_task("train-model").upstream_list}
    train = pods["train-model"]["spec"]["containers"][0]
    assert train["image"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert train["resources"]["requests"]["cpu"] == "2" and "cpu" not in train["resources"]["limits"]
    assert dag.get_task("download").task_display_name == "download the data set"
    assert dag.dag_display_name == "PVC-backed training"


def test_the_env_and_secrets_pipeline_renders_to_airflow_pods(examples: Any, kubeconfig: Path) -> None:
    _, pods = _pods(examples.etl.pipeline, kubeconfig)
    for pod in pods.values():
        _validate(pod)
    env = {c["name"]: c for c in pods["extract"]["spec"]["containers"][0]["env"]}
    assert env["SOURCE_REGION"]["value"] == "eu-north-1"
    transform = pods["transform"]["spec"]
    (cm,) = [v for v in transform["volumes"] if "configMap" in v]
    assert cm["configMap"]["name"] == "etl-config"
    assert {"mountPath": "/etc/etl", "name": cm["name"]} in transform["containers"][0]["volumeMounts"]
    command = transform["containers"][0]["command"]
    assert command[:2] == ["sh", "-ec"] and "'pyarrow>=15'" in command[2] and command[4:6] == ["heteroflow", "step"]
    load = pods["load-warehouse"]["spec"]
    env = {c["name"]: c for c in load["containers"][0]["env"]}
    assert env["WAREHOUSE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"key": "password", "name": "warehouse-db"}
    assert env["WAREHOUSE_HOST"]["value"] == "warehouse.internal:5432"
    (secret,) = [v for v in load["volumes"] if "secret" in v]
    assert secret["secret"]["secretName"] == "warehouse-token"


# --- the API: what is refused, and how -------------------------------------------------------------------------


@step
def touch(tag: str = "x", seed: int = 0) -> dict:
    """Write the tag into the workspace."""
    local_path("/mnt/work/tag.txt").write_text(tag, encoding="utf-8")
    return {"tag": tag}


def test_dashed_call_names_are_accepted_and_their_parameters_have_one_kfp_spelling() -> None:
    p = Pipeline("dashes")
    p.add(touch, name="train-large")
    p.add(touch, name="train-small")
    assert "train-large.seed" in p.params
    assert kfp_param_names(p)["train-large.seed"] == "train_large_seed"
    assert p.kfp_spellings["train_large_seed"] == "train-large.seed"
    # either spelling is accepted (#28.20)
    args = p.arguments({"train_large_seed": 7, "train-small.seed": 3})
    assert args["train-large.seed"] == 7 and args["train-small.seed"] == 3
    with pytest.raises(InvalidParameter, match="same name in KFP"):
        p.add(touch, name="train_large")
    for bad in ("train-", "train--large", "prepare-run", "-x"):
        with pytest.raises(InvalidParameter, match="not valid"):
            p.add(touch, name=bad)


def test_heteroflow_params_shows_the_kfp_spellings_and_each_calls_retries() -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    result = CliRunner().invoke(app, ["params", "--pipeline", "heteroflow.pipelines.default:default_pipeline"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "preprocess.seed = preprocess_seed" in text
    assert "archive: Retries: 2 retries (transient failures), 5 s apart x2" in text
    listed = json.loads(CliRunner().invoke(app, ["params", "--json", "--pipeline", "heteroflow.pipelines.default:default_pipeline"]).stdout)
    assert listed["preprocess.seed"]["kfp_name"] == "preprocess_seed" and "kfp_name" not in listed["epochs"]
    assert listed["epochs"]["default"] == int(listed["epochs"]["default"]) and isinstance(listed["epochs"]["default"], int)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"env": {"1BAD": "x"}}, "not an environment variable name"),
        ({"env": {"HETEROFLOW_RUN_DIR": "x"}}, "set by heteroflow"),
        ({"env": {"A": ["list"]}}, "valid: a string"),
        ({"volumes": {"relative/path": PVC("data")}}, "absolute path"),
        ({"volumes": {"/mnt/a": PVC("data"), "/mnt/a/b": PVC("other")}}, "inside '/mnt/a'"),
        ({"volumes": {"/mnt/a": "data"}}, "valid: CreatePVC, PVC, ConfigMapVolume, SecretVolume"),
        ({"after": ["later"]}, "not an earlier call"),
        ({"packages_to_install": ["heteroflow[all]"]}, "not on PyPI"),
        ({"packages_to_install": "timm"}, "not a list"),
        ({"base_image": ""}, "not a non-empty string"),
    ],
    ids=["env-name", "env-reserved", "env-value", "mount-relative", "mount-nested", "volume-type", "after-later", "pkg-heteroflow", "pkg-str", "image-empty"],
)
def test_a_bad_step_option_is_refused_naming_the_field(options: dict[str, Any], message: str) -> None:
    p = Pipeline("bad-options")
    with pytest.raises(InvalidParameter, match=re.escape(message)):
        p.add(touch, **options)


def test_bad_volume_values_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidParameter, match="size='lots'"):
        CreatePVC("work", size="lots")
    with pytest.raises(InvalidParameter, match="access_modes"):
        CreatePVC("work", size="1Gi", access_modes=("ReadWriteSometimes",))
    with pytest.raises(InvalidParameter, match="is not valid"):
        CreatePVC("Work_Space", size="1Gi")
    with pytest.raises(InvalidParameter, match="not a Kubernetes name"):
        ConfigMapVolume("Bad_Name")
    with pytest.raises(InvalidParameter, match="no '/'"):
        SecretVolume("token", local_files={"a/b": "x"})


def test_after_a_later_call_is_refused_by_every_renderer() -> None:
    """``Call.after`` may name any call; a renderer refuses one that is not before it (a sibling of add(after=))."""
    from heteroflow.pipelines.volumes import run_after

    p = Pipeline("order")
    first = p.add(touch, name="first")
    second = p.add(touch, name="second")
    first.after(second)
    with pytest.raises(InvalidParameter, match=r"after\('second'\): not a call before it"):
        run_after(p, first)
    with pytest.raises(InvalidParameter, match="cannot run after itself"):
        second.after(second)


def test_a_local_engine_refuses_a_volume_it_cannot_stand_in_for_naming_itself_and_the_alternative(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    p = Pipeline("no-claim")
    p.add(touch, volumes={"/mnt/work": PVC("shared-data")})
    with pytest.raises(InvalidParameter, match=r"the inprocess engine cannot mount the existing PVC 'shared-data'.*local_path="):
        run_inprocess(p, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything ran
    call = Pipeline("cm").add(touch, volumes={"/etc/cfg": ConfigMapVolume("cfg")})
    with pytest.raises(InvalidParameter, match=r"the kfp-local engine cannot read the ConfigMap 'cfg'.*local_files="):
        local_mounts(call, engine="kfp-local")
    assert local_mounts(Pipeline("cm2").add(touch, volumes={"/etc/cfg": ConfigMapVolume("cfg", optional=True)}), engine="x")


def test_an_existing_pvc_with_a_local_path_is_that_folder_on_a_local_run(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    shared = tmp_path / "shared"
    p = Pipeline("claim")
    p.add(touch, tag="hello", volumes={"/mnt/work": PVC("shared-data", local_path=str(shared))}, env={"MODE": "test"})
    record = run_inprocess(p, run_dir=tmp_path / "run", sleep=lambda s: None)
    assert record.status == "succeeded"
    assert (shared / "tag.txt").read_text() == "hello"  # an existing claim outlives the run
    assert MOUNTS_ENV not in os.environ and "MODE" not in os.environ  # the call's environment was the call's only


def test_local_path_maps_the_longest_mount_and_leaves_other_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HETEROFLOW_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(MOUNTS_ENV, json.dumps({"/mnt": "volumes/a", "/mnt/data": "/abs/b"}))
    assert local_path("/mnt/data/x/y.csv") == Path("/abs/b/x/y.csv")
    assert local_path("/mnt/other") == tmp_path / "volumes" / "a" / "other"
    assert local_path("/mnt/database") == tmp_path / "volumes" / "a" / "database"  # not under /mnt/data
    assert local_path("/etc/hosts") == Path("/etc/hosts")
    monkeypatch.delenv(MOUNTS_ENV)
    assert local_path("/mnt/data/x") == Path("/mnt/data/x")  # a pod: the volume is mounted there


def test_a_request_without_a_limit_round_trips_and_reaches_kubernetes_without_a_limit() -> None:
    from heteroflow.pipelines.k8s.resources import plan_pod

    r = Resources(kind="cpu", cpu="2", cpu_limit="none", memory="4Gi", memory_limit="none")
    assert r.k8s_requests() == {"cpu": "2", "memory": "4Gi"} and r.k8s_limits() == {}
    assert Resources.from_dict(r.to_dict()) == r and r.to_dict()["cpu_limit"] == "none"
    assert Resources.parse_spec("cpu:cpu=2,cpu_limit=none") == Resources(kind="cpu", cpu="2", cpu_limit="none")
    assert "2 CPU (no limit)" in r.describe()
    assert plan_pod(r, None).limits == {}
    assert Resources(kind="cpu", cpu="2") != Resources(kind="cpu", cpu="2", cpu_limit="none")
    with pytest.raises(InvalidResources, match="cpu_limit"):
        Resources(kind="cpu", cpu="2", cpu_limit="nothing")


# --- retry_on="any" ----------------------------------------------------------------------------------------------

_TRIES: dict[str, int] = {}


@step
def flaky(key: str = "a", fail_times: int = 1) -> dict:
    """Fail with a bug-like error (a permanent failure) the first ``fail_times`` attempts."""
    _TRIES[key] = _TRIES.get(key, 0) + 1
    if _TRIES[key] <= fail_times:
        raise ValueError(f"attempt {_TRIES[key]} of {key} fails")
    return {"attempts": _TRIES[key]}


@pytest.mark.parametrize(("retry_on", "status", "attempts"), [("transient", "failed", 1), ("any", "succeeded", 2)])
def test_retry_on_any_retries_a_permanent_failure_and_the_default_does_not(retry_on: str, status: str, attempts: int, tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    key = f"{retry_on}-{tmp_path.name}"
    p = Pipeline("retry-any")
    p.add(flaky, key=key, retry=RetryPolicy(retries=2, backoff_seconds=1, retry_on=retry_on))
    record = run_inprocess(p, run_dir=tmp_path / "run", sleep=lambda s: None)
    assert record.status == status and record.step("flaky").attempts == attempts == _TRIES[key]


def test_retry_on_is_checked_and_described() -> None:
    with pytest.raises(InvalidResources, match="retry_on='sometimes' is unknown; valid: 'transient', 'any'"):
        RetryPolicy(retry_on="sometimes")
    assert RetryPolicy().describe() == "2 retries (transient failures), 5 s apart x2 (at most 300 s), within 3600 s"
    assert RetryPolicy(retries=0).describe() == "no retries"
    assert RetryPolicy(retry_on="any").retries_failure("permanent") and not RetryPolicy().retries_failure("permanent")
    assert not RetryPolicy(retry_on="any").retries_failure("device")  # a device failure still falls back


def test_an_airflow_step_task_retries_a_permanent_failure_only_with_retry_on_any() -> None:
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    from airflow.sdk.exceptions import AirflowFailException

    from heteroflow.components.core.runtime import TransientStepFailure
    from heteroflow.dags.layout import Layout
    from heteroflow.dags.operators import StepOperator

    for retry_on, raised in (("transient", AirflowFailException), ("any", TransientStepFailure)):
        p = Pipeline("airflow-retry")
        p.add(flaky, retry=RetryPolicy(retries=1, retry_on=retry_on))
        op = StepOperator(task_id="flaky", pipeline=p, layout=Layout(p), call_name="flaky")
        result = {"route": "permanent", "reason": "ValueError: bug", "kind": "cpu"}
        ti = type("TI", (), {"xcom_push": lambda self, **kw: None})()
        with pytest.raises(raised):
            op.finish({"ti": ti}, result)


# --- local runs (slow) -------------------------------------------------------------------------------------------


def _check_pvc_run(record: Any) -> None:
    assert record.status == "succeeded", [(s.name, s.status, s.error) for s in record.steps]
    assert [s.name for s in record.steps] == ["download", "train-model", "evaluate"]
    evaluated = record.metrics["evaluate"]
    assert evaluated["mse"] < 0.01 and abs(evaluated["w1"] - 3) < 0.05 and abs(evaluated["w2"] + 2) < 0.05
    assert not Path(record.run_dir, "volumes").exists()  # the PVC lived for the run only


def _check_etl_run(record: Any) -> None:
    assert record.status == "succeeded", [(s.name, s.status, s.error) for s in record.steps]
    assert record.results["extract"]["region"] == "eu-north-1"
    assert record.results["transform"]["columns"] == "city,temperature_c"
    assert record.results["load-warehouse"] == {"loaded": 12, "user": "etl-bot", "token_chars": len("local-stand-in-token")}
    (written,) = [f for f in Path(record.run_dir).rglob("clean") if f.is_file() and "transform" in str(f)]  # engines differ
    clean = written.read_text().splitlines()
    assert clean[:2] == ["city,temperature_c", "oslo,23.0"]  # UNITS=imperial reached transform: -5 C is 23 F
    assert not Path(record.run_dir, "volumes").exists()


@pytest.mark.slow
def test_the_example_pipelines_run_in_process(examples: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    monkeypatch.setenv("WAREHOUSE_USER", "etl-bot")
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "not-a-real-one")
    _check_pvc_run(run_inprocess(examples.pvc.pipeline, run_dir=tmp_path / "pvc"))
    with pytest.warns(UserWarning, match="the inprocess engine does not install packages_to_install"):
        record = run_inprocess(examples.etl.pipeline, run_dir=tmp_path / "etl")
    _check_etl_run(record)


@pytest.mark.slow
def test_the_example_pipelines_run_on_kfp_local(examples: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.pipelines.kfp.local import run_local

    monkeypatch.setenv("WAREHOUSE_USER", "etl-bot")
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "not-a-real-one")
    _check_pvc_run(run_local(pipeline=examples.pvc.pipeline, run_dir=tmp_path / "pvc"))
    with pytest.warns(UserWarning, match="kfp.local does not install packages_to_install"):
        record = run_local(pipeline=examples.etl.pipeline, run_dir=tmp_path / "etl")
    _check_etl_run(record)


@pytest.mark.slow
def test_a_missing_secret_variable_fails_the_load_step_not_the_run_setup(examples: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locally a Secret's variables come from the environment: without them the step that needs them fails, with its
    own message, after the steps before it ran."""
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    monkeypatch.delenv("WAREHOUSE_USER", raising=False)
    monkeypatch.delenv("WAREHOUSE_PASSWORD", raising=False)
    record = run_inprocess(examples.etl.pipeline, run_dir=tmp_path / "etl", sleep=lambda s: None)
    assert record.status == "failed"
    assert record.step("transform").status == "succeeded"
    assert "WAREHOUSE_USER" in (record.step("load-warehouse").error or "")



@pytest.mark.slow
def test_the_env_and_secrets_pipeline_runs_on_airflow_local_mode(examples: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real Airflow 3 on SQLite (``airflow dags test``, local mode): each step task gets its env and volume folders,
    ``record-run`` deletes the folders."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    import heteroflow

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("WAREHOUSE_USER", "etl-bot")
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "not-a-real-one")
    monkeypatch.chdir(PRACTITIONERS)
    record = heteroflow.run("env_secrets:pipeline", engine="airflow", run_dir=tmp_path / "run")
    log = tmp_path / "run" / "airflow.log"
    assert record.status == "succeeded", log.read_text()[-4000:] if log.exists() else record
    _check_etl_run(record)


def test_the_cli_takes_a_parameter_in_kfp_spelling(tmp_path: Path) -> None:
    """#28.20's sibling: ``--param preprocess_seed=3`` is ``preprocess.seed`` (an unknown name is still refused)."""
    from heteroflow.pipelines.cli.main import _coerced
    from heteroflow.pipelines.default import default_pipeline

    pipeline = default_pipeline()
    assert _coerced(pipeline, {"preprocess_seed": "3", "train.seed": "4"}, None) == {"preprocess.seed": 3, "train.seed": 4}
    with pytest.raises(HeteroflowError, match="unknown parameter 'preprocess_sed'"):
        _coerced(pipeline, {"preprocess_sed": "3"}, str(tmp_path))
