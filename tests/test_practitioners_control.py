"""#31: output parameters, conditions, loops and sub-pipelines, and the practitioners' example pipelines that use
them (``examples/practitioners/tuning_fanout.py``, ``pipeline_of_pipelines.py``): each compiled by the real KFP
compiler and loaded back with kfp's loader, run on the local engines (in-process, kfp.local) and on a real Airflow
(slow), and rendered as an Airflow DAG whose pods validate against the Kubernetes schema.

The examples' steps import by module name (``practitioners.tuning_fanout``), so examples/ goes on ``sys.path`` here
and on ``PYTHONPATH`` for step processes (kfp.local, Airflow), as the README says.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step
from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.control import Collected, Elif, Else, If, ParallelFor
from heteroflow.pipelines.subpipelines import pipeline_input
from heteroflow.pipelines.graph import Pipeline

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

tuning = importlib.import_module("practitioners.tuning_fanout")
composed = importlib.import_module("practitioners.pipeline_of_pipelines")

KUBECONFIG = (
    "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\n"
    "users: [{name: none, user: {}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\n"
    "current-context: none\n"
)


# --- output parameters -----------------------------------------------------------------------------------------


class Pair(NamedTuple):
    best: str
    score: float


def _scalar(x: int = 1) -> float:
    """S.

    Args:
        x: x.
    """
    return x / 2


def _pair(x: int = 1) -> Pair:
    """P.

    Args:
        x: x.
    """
    return Pair("a" if x > 0 else "b", float(x))


def _facts(x: int = 1) -> dict:
    """F.

    Args:
        x: x.
    """
    return {"best": "z", "n": x}


def test_a_step_returns_output_parameters_from_its_annotation_or_returns() -> None:
    assert [(p.name, p.type) for p in step(_scalar).returns] == [("result", float)]
    assert [(p.name, p.type) for p in step(_pair).returns] == [("best", str), ("score", float)]
    assert step(_facts).returns == ()  # a dict return is the step's facts
    explicit = step(_facts, returns={"best": str})
    assert [(p.name, p.type) for p in explicit.returns] == [("best", str)]
    assert explicit.returned_values(explicit.to_facts(_facts(3))) == {"best": "z"}
    assert step(_pair).to_facts(_pair(-1)) == {"best": "b", "score": -1.0}
    with pytest.raises(InvalidParameter, match="returned no value for its output parameter 'missing'"):
        step(_facts, returns={"missing": int}).returned_values({"best": "z"})
    with pytest.raises(InvalidParameter, match="'x' is both an output parameter and an artifact or a parameter"):
        step(_facts, returns={"x": int})


def test_values_feed_parameters_of_their_type_and_conditions() -> None:
    p = Pipeline("values")
    pair = p.add(step(_pair, ref=f"{__name__}:_pair"), name="pair")
    assert repr(pair.outputs["best"]) == "pair.outputs['best']"
    with pytest.raises(InvalidParameter, match="has 2 output parameters .*use .outputs\\[NAME\\]"):
        pair.output
    with pytest.raises(InvalidParameter, match="parameter 'x' is an integer, but pair.outputs\\['best'\\] is a string"):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="half", x=pair.outputs["best"])
    with pytest.raises(InvalidParameter, match="has no output 'nope'; valid: best, score"):
        pair.outputs["nope"]
    with pytest.raises(InvalidParameter, match="is decided when the pipeline runs: use it in If"):
        bool(pair.outputs["best"] == "a")
    with If(pair.outputs["best"] == "a", name="is a"):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="half")
    with Elif(pair.outputs["score"] > 5):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="other")
    with Else():
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="last")
    assert [g.kind for c in p.calls for g in c.groups] == ["if", "elif", "else"]
    assert [len(g.branches) for c in p.calls for g in c.groups] == [0, 1, 2]
    with pytest.raises(InvalidParameter, match="Else must follow an If or Elif block directly"):
        Else()
    with pytest.raises(InvalidParameter, match="produced inside condition is a, so it may not exist outside it"):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="after", x=p["half"].output)


def test_loop_values_are_read_after_the_loop_only_through_collected() -> None:
    p = Pipeline("loops")
    with ParallelFor([1, 2, 3]) as x:
        half = p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="half", x=x)
    with pytest.raises(InvalidParameter, match="after the loop read it as Collected"):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="again", x=half.output)
    with pytest.raises(InvalidParameter, match="Collected\\(...\\) gives a list: annotate the parameter list"):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="again", x=Collected(half.output))
    with pytest.raises(InvalidParameter, match="the item of a loop this call is not inside"):
        p.add(step(_scalar, ref=f"{__name__}:_scalar"), name="outside", x=x)
    with pytest.raises(InvalidParameter, match="ParallelFor\\(\\[\\]\\): the list is empty"):
        ParallelFor([])
    with pytest.raises(InvalidParameter, match="every item must be a dict with it"):
        with ParallelFor([{"a": 1}, {"b": 2}]) as item:
            item.a


# --- the tuning fan-out ------------------------------------------------------------------------------------------


def _expected_best(folder: Path, learning_rates: list[float]) -> tuple[float, float]:
    """The best (learning rate, accuracy) computed by calling the example's functions directly."""
    data = folder / "data.npz"
    tuning.make_dataset(str(data))
    accuracies = []
    for i, lr in enumerate(learning_rates):
        model = folder / f"model-{i}.json"
        tuning.train(str(data), str(model), lr)
        accuracies.append(tuning.evaluate(str(data), str(model)))
    best = tuning.choose_best(accuracies, learning_rates)
    return best.best_learning_rate, best.best_accuracy


def test_tuning_fanout_compiles_with_kfp_and_loads_back(tmp_path: Path) -> None:
    from kfp.components import load_component_from_file

    from heteroflow.pipelines.kfp.render import compile_pipeline

    out = compile_pipeline(tuning.pipeline, tmp_path / "tuning.yaml")
    loaded = load_component_from_file(str(out))
    assert loaded.name == "tuning-fanout"
    ir = yaml.safe_load(out.read_text(encoding="utf-8").split("\n---\n")[0])
    root = ir["root"]["dag"]["tasks"]
    loop = next(t for t in root.values() if "parameterIterator" in t)
    assert loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--learning_rates"
    assert ir["root"]["inputDefinitions"]["parameters"]["learning_rates"]["parameterType"] == "LIST"
    assert ir["root"]["inputDefinitions"]["parameters"]["learning_rates"]["defaultValue"] == [1.0, 0.1, 0.001]
    every = [t for d in [ir["root"], *ir["components"].values()] for t in d.get("dag", {}).get("tasks", {}).values()]
    conditions = [t["triggerPolicy"]["condition"] for t in every if "triggerPolicy" in t]
    assert any("best_accuracy" in c and ">= 0.8" in c and not c.startswith("!") for c in conditions), conditions
    assert any(c.startswith("!") for c in conditions), conditions  # the Else
    chooser = root["choose-best"]["inputs"]["parameters"]["accuracies"]
    assert chooser["taskOutputParameter"]["outputParameterKey"] == "pipelinechannel--evaluate-result"  # Collected
    outputs = ir["components"]["comp-evaluate"]["outputDefinitions"]["parameters"]
    assert outputs["result"]["parameterType"] == "NUMBER_DOUBLE"
    # a cluster's condition reads the step's output; kfp.local's reads it through a value task (single return value)
    assert not any(name.startswith("comp-heteroflow-value") for name in ir["components"])
    from kfp import compiler

    from heteroflow.pipelines.kfp.render import to_kfp

    compiler.Compiler().compile(to_kfp(tuning.pipeline, local=True), str(tmp_path / "local.yaml"))
    local_ir = yaml.safe_load((tmp_path / "local.yaml").read_text(encoding="utf-8").split("\n---\n")[0])
    assert "comp-heteroflow-value-float" in local_ir["components"]


def test_tuning_fanout_runs_in_process(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    rates = [1.0, 0.1, 0.001]
    record = run_inprocess(tuning.pipeline, {"learning_rates": rates}, run_dir=tmp_path / "run")
    assert record.status == "succeeded"
    expected = _expected_best(tmp_path, rates)
    assert (record.results["choose_best"]["best_learning_rate"], record.results["choose_best"]["best_accuracy"]) == expected
    assert expected[1] >= 0.8
    archived = json.loads(Path(record.results["archive"]["archived"]).read_text(encoding="utf-8"))
    assert archived["learning_rate"] == expected[0]
    steps = {s.name: s for s in record.steps}
    # one iteration per item, each its own task with one attempt (they used to be counted as 3 attempts of train)
    assert steps["train"].attempts == 1 and steps["evaluate"].attempts == 1
    assert [(it.iteration, it.item, it.attempts, it.status) for it in steps["train"].iterations] == [
        (0, 1.0, 1, "succeeded"), (1, 0.1, 1, "succeeded"), (2, 0.001, 1, "succeeded")]
    assert [it.details for it in steps["train"].iterations] == [{"learning_rate": r} for r in rates]  # not the last one's only
    assert steps["not_good_enough"].status == "not run" and steps["make_dataset"].iterations == []
    assert sorted(p.name for p in (tmp_path / "run" / "artifacts" / "train").iterdir()) == ["0", "1", "2"]
    _check_fanout_records(tmp_path / "run", rates)


def _check_fanout_records(folder: Path, rates: list[float]) -> None:
    """What a tuning fan-out run leaves, whatever its engine: one attempt record per iteration (its index and item,
    attempt 1), run.json's per-iteration rows, and tables and a report that show ``train ×3`` with 1 attempt."""
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.folders import load_run
    from heteroflow.pipelines.runs.report import render_report

    for i, rate in enumerate(rates):
        rec = json.loads((folder / "steps" / "train" / f"iteration-{i}" / "attempt-1.json").read_text(encoding="utf-8"))
        assert (rec["attempt"], rec["iteration"], rec["item"], rec["status"]) == (1, i, rate, "succeeded")
    assert not list((folder / "steps" / "train").glob("attempt-*.json"))
    run = load_run(folder)
    train = next(s for s in run["steps"] if s["name"] == "train")
    assert (train["attempts"], [it["item"] for it in train["iterations"]]) == (1, rates)
    assert [r["attempt"] for r in run["attempts"]["train"]] == [1, 1, 1]
    text = summary_text(run)
    assert re.search(r"train ×3 +│ succeeded +│ cpu\S* +│ +1 │", text), text
    assert "train: 3 iterations: 3 succeeded" in text
    html = render_report(run)
    assert "<b>train ×3</b>" in html and "attempts: 1" in html and "<th>iteration</th>" in html
    assert "<td class=iteration>[1] 0.1</td>" in html


def test_tuning_fanout_takes_the_else_branch_in_process(tmp_path: Path) -> None:
    """A learning rate of 0 leaves the weights at zero: every row is predicted 0, about half are right."""
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(tuning.pipeline, {"learning_rates": [0.0]}, run_dir=tmp_path / "run")
    assert record.status == "succeeded"
    assert record.results["choose_best"]["best_accuracy"] < 0.8
    steps = {s.name: s for s in record.steps}
    assert steps["archive"].status == "not run"
    assert steps["not_good_enough"].status == "succeeded"
    assert not (tmp_path / "run" / "archive").exists()


@pytest.mark.slow
def test_tuning_fanout_runs_on_kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also the kfp.local loop patch (heteroflow.pipelines.kfp.loop_patch): train, inside the loop, reads the route of
    make_dataset, outside it; unpatched kfp 2.17 hands it the loop item and train does not run."""
    from heteroflow.pipelines.kfp.local import run_local

    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))
    rates = [1.0, 0.1, 0.001]
    record = run_local({"learning_rates": rates}, pipeline=tuning.pipeline, run_dir=tmp_path / "run")
    assert record.status == "succeeded", record
    expected = _expected_best(tmp_path, rates)
    assert (record.results["choose_best"]["best_learning_rate"], record.results["choose_best"]["best_accuracy"]) == expected
    steps = {s.name: s for s in record.steps}
    assert steps["train"].attempts == 1 and steps["train"].status == "succeeded"  # 3 iterations, 1 attempt each
    assert [(it.iteration, it.item, it.attempts) for it in steps["train"].iterations] == [(0, 1.0, 1), (1, 0.1, 1), (2, 0.001, 1)]
    assert steps["archive"].status == "succeeded" and steps["not_good_enough"].status == "not run"
    _check_fanout_records(tmp_path / "run", rates)  # the item: filled in from the loop's list by the record

    low = run_local({"learning_rates": [0.0]}, pipeline=tuning.pipeline, run_dir=tmp_path / "low")
    assert low.status == "succeeded"
    steps = {s.name: s for s in low.steps}
    assert steps["archive"].status == "not run" and steps["not_good_enough"].status == "succeeded"


@pytest.mark.slow
def test_kfp_local_skips_an_if_on_a_named_output_and_the_value_task_routes_it(tmp_path: Path) -> None:
    """The kfp 2.17 limit the rendering works around (pipelines/kfp/control.py): with two outputs, an If on the
    named one runs no branch on kfp.local; the same value passed on as a task's single return value does."""
    from kfp import dsl, local

    from heteroflow.pipelines.kfp.render import _exec_component

    produce = _exec_component(
        "def produce(score: OutputPath(float)) -> str:\n    with open(score, 'w') as f:\n        f.write('0.9')\n    return 'ok'\n",
        "produce", "python:3.11",
    )
    mark = _exec_component(
        "def mark(folder: str, name: str) -> str:\n    import os\n\n    open(os.path.join(folder, name), 'w').close()\n    return name\n",
        "mark", "python:3.11",
    )
    value = _exec_component("def heteroflow_value_float(value: float) -> float:\n    return value\n", "heteroflow_value_float", "python:3.11")

    folder = str(tmp_path)

    def both():  # no annotations: this module's are strings, which KFP does not read
        p = produce()
        with dsl.If(p.outputs["score"] > 0.5):
            mark(folder=folder, name="direct")
        v = value(value=p.outputs["score"])
        with dsl.If(v.output > 0.5):
            mark(folder=folder, name="routed")

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    dsl.pipeline(both, name="named-output-condition")()
    assert (tmp_path / "routed").exists()
    assert not (tmp_path / "direct").exists()  # if kfp.local learns this, the value tasks can go


def _airflow_dag(pipeline: Pipeline, tmp_path: Path, mode: str) -> Any:
    from heteroflow.dags.factory import build_dag

    if mode == "local":
        return build_dag(pipeline, mode="local", run_root=tmp_path)
    config = tmp_path / "kube.yaml"
    config.write_text(KUBECONFIG, encoding="utf-8")
    return build_dag(
        pipeline, mode="kubernetes", run_root="/mnt/runs", image="registry.example.com/heteroflow:0.1.0",
        pod_kwargs={"namespace": "ml", "in_cluster": False, "config_file": str(config)},
    )


def _validated_pods(dag: Any, items: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every pod of the DAG (a mapped task unmapped with its first item), validated against Kubernetes 1.33."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (the dev extra) is not installed: pods are not validated")
    from kubernetes import client

    from heteroflow.dags.pods import PodStepOperator

    api = client.ApiClient()
    pods = {}
    for task in dag.tasks:
        op = task.unmap({"loop_item": items[task.task_id]}) if type(task).__name__ == "MappedOperator" else task
        if isinstance(op, PodStepOperator):
            pod = api.sanitize_for_serialization(op.build_pod_request_obj())
            assert kubernetes_validate.validate(pod, "1.33.0", strict=True) == "1.33", task.task_id
            pods[task.task_id] = pod
    return pods


def test_tuning_fanout_renders_to_airflow(tmp_path: Path) -> None:
    from heteroflow.dags.control import ControlPodOperator, ControlStepOperator, LoopItemsOperator

    dag = _airflow_dag(tuning.pipeline, tmp_path, "local")
    tasks = dag.task_dict
    # the loop is a mapped task group: evaluate[i] depends on train[i] alone, as a KFP loop iteration's tasks do
    groups = {t: [g.group_id for g in tasks[t].iter_mapped_task_groups()] for t in ("train", "evaluate", "choose_best")}
    assert groups == {"train": ["trials"], "evaluate": ["trials"], "choose_best": []}
    assert type(dag.task_group_dict["trials"]).__name__ == "MappedTaskGroup"
    assert isinstance(tasks["trials-items"], LoopItemsOperator)  # the list parameter, known when the run starts
    assert "trials-items" in tasks["train"].upstream_task_ids
    assert {"choose_best", "make_dataset"} <= tasks["archive"].upstream_task_ids
    assert "evaluate" in tasks["choose_best"].upstream_task_ids
    assert isinstance(tasks["archive"], ControlStepOperator) and isinstance(tasks["not_good_enough"], ControlStepOperator)
    assert dag.params["learning_rates"] == [1.0, 0.1, 0.001]

    kube = _airflow_dag(tuning.pipeline, tmp_path, "kubernetes")
    pods = _validated_pods(kube, {"train": 0.1, "evaluate": 0.1})
    assert set(pods) == {"make_dataset", "train", "evaluate", "choose_best", "archive", "not_good_enough"}
    assert isinstance(kube.task_dict["archive"], ControlPodOperator)


def test_a_pods_arguments_get_its_values_and_its_instance_folder() -> None:
    from heteroflow.dags.control import pod_arguments
    from heteroflow.dags.pods import step_command

    p = tuning.pipeline
    _, args = step_command(p, p["evaluate"], None)
    mapped = pod_arguments(p, p["evaluate"], args, {}, 2)
    outside = f"data={'{{'}"  # make_dataset's artifact keeps its folder: it is not in the loop
    assert any(a.startswith(outside) and a.endswith("/artifacts/make_dataset/data") for a in mapped)
    assert any(a.startswith("model=") and a.endswith("/artifacts/train/2/model") for a in mapped)
    _, args = step_command(p, p["choose_best"], None)
    with_values = pod_arguments(p, p["choose_best"], args, {"accuracies": [0.5, 0.75]}, None)
    assert with_values[-2:] == ["--param", "accuracies=[0.5, 0.75]"]


# --- the pipeline of pipelines -----------------------------------------------------------------------------------


def test_pipeline_of_pipelines_compiles_to_nested_dags(tmp_path: Path) -> None:
    from kfp.components import load_component_from_file

    from heteroflow.pipelines.kfp.render import compile_pipeline

    out = compile_pipeline(composed.pipeline, tmp_path / "composed.yaml")
    assert load_component_from_file(str(out)).name == "pipeline-of-pipelines"
    ir = yaml.safe_load(out.read_text(encoding="utf-8").split("\n---\n")[0])
    root = ir["root"]["dag"]["tasks"]
    subs = {name: t["componentRef"]["name"] for name, t in root.items() if "dag" in ir["components"][t["componentRef"]["name"]]}
    assert sorted(subs.values()) == ["comp-data-pipeline", "comp-training-pipeline"]
    data = ir["components"]["comp-data-pipeline"]
    assert sorted(data["dag"]["tasks"]) == ["data-make-dataset", "data-standardize", "heteroflow-check"]
    training = ir["components"]["comp-training-pipeline"]
    assert "artifacts" in training["inputDefinitions"]  # the data set, an input artifact of the nested DAG
    report = root["report"]["inputs"]["parameters"]
    assert report["accuracy"]["taskOutputParameter"]["producerTask"] in subs
    assert report["rows"]["taskOutputParameter"]["producerTask"] in subs


def test_a_sub_pipeline_with_inputs_runs_only_inside_another() -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    with pytest.raises(InvalidParameter, match="has input artifact\\(s\\) data; it runs only as a sub-pipeline"):
        run_inprocess(composed.training_pipeline, {})
    outer = Pipeline("outer")
    with pytest.raises(InvalidParameter, match="needs its input artifact\\(s\\) data bound"):
        outer.add(composed.training_pipeline, name="training")
    data = outer.add(composed.data_pipeline, name="data")
    with pytest.raises(InvalidParameter, match="has no output 'shards'; valid: data, rows"):
        data.outputs.shards
    with pytest.raises(InvalidParameter, match="input 'data' is a Dataset, but"):
        bad = Pipeline("bad-input")
        model = pipeline_input(bad, "data", ArtifactType.MODEL)
        bad.add(step(_takes_data, name="takes_data", inputs=[ArtifactSpec(name="data", type=ArtifactType.DATASET, param="path")]), data=model)


def _takes_data(path: str) -> dict:
    return {}


def test_pipeline_of_pipelines_runs_in_process(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(composed.pipeline, {"learning_rate": 0.1}, run_dir=tmp_path / "run")
    assert record.status == "succeeded"
    assert [s.name for s in record.steps] == ["data__make_dataset", "data__standardize", "training__train", "training__evaluate", "report"]
    assert record.results["data__standardize"] == {"rows": 400, "features": 2}
    accuracy = record.results["training__evaluate"]["result"]
    assert record.results["report"]["result"] == f"trained on 400 rows: test accuracy {accuracy:.3f}"
    assert 0.5 < accuracy <= 1.0


@pytest.mark.slow
def test_pipeline_of_pipelines_runs_on_kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess
    from heteroflow.pipelines.kfp.local import run_local

    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))
    record = run_local({}, pipeline=composed.pipeline, run_dir=tmp_path / "run")
    assert record.status == "succeeded", record
    same = run_inprocess(composed.pipeline, {}, run_dir=tmp_path / "inprocess")
    assert record.results["report"] == same.results["report"]  # deterministic steps: the same line either way


def test_pipeline_of_pipelines_renders_to_airflow(tmp_path: Path) -> None:
    dag = _airflow_dag(composed.pipeline, tmp_path, "local")
    assert {"data__standardize", "training__train"} <= dag.task_dict["training__evaluate"].upstream_task_ids
    assert {"data__standardize", "training__evaluate"} <= dag.task_dict["report"].upstream_task_ids
    groups = {name: sorted(group.children) for name, group in dag.task_group_dict.items()}
    assert groups == {"data": ["data__make_dataset", "data__standardize"], "training": ["training__evaluate", "training__train"]}
    pods = _validated_pods(_airflow_dag(composed.pipeline, tmp_path, "kubernetes"), {})
    assert set(pods) == {"data__make_dataset", "data__standardize", "training__train", "training__evaluate", "report"}


# --- a real Airflow ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("airflow", reason="Airflow (the airflow extra) is not installed")
    return tmp_path_factory.mktemp("airflow-home")


@pytest.mark.slow
@pytest.mark.parametrize("source", ["practitioners.tuning_fanout:pipeline", "practitioners.pipeline_of_pipelines:pipeline"])
def test_the_examples_run_on_airflow(source: str, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`airflow dags test` on SQLite: XCom carries the values, the loop is mapped (one train per item), the branch not
    taken is skipped, and the results equal the in-process run's."""
    from heteroflow.pipelines.engines.inprocess import run_inprocess
    from heteroflow.pipelines.engines.runner import run

    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))
    record = run(source, {}, engine="airflow", run_dir=tmp_path / "run", airflow_home=str(airflow_home))
    assert record.status == "succeeded", (tmp_path / "run" / "airflow.log").read_text(encoding="utf-8")[-4000:]
    pipeline = tuning.pipeline if "tuning" in source else composed.pipeline
    same = run_inprocess(pipeline, {}, run_dir=tmp_path / "inprocess")
    looped = {c.name for c in pipeline.calls if any(g.kind == "loop" for g in c.groups)}
    for name, facts in same.results.items():
        if name != "archive" and name not in looped:  # its path names the run folder; a loop's last instance varies
            assert record.results[name] == facts, name
    if "tuning" in source:
        steps = {s.name: s for s in record.steps}
        assert steps["train"].attempts == 1 and len(steps["train"].iterations) == 3  # three mapped instances, 1 try each
        assert [(it.iteration, it.item, it.attempts) for it in steps["train"].iterations] == [(0, 1.0, 1), (1, 0.1, 1), (2, 0.001, 1)]
        assert steps["not_good_enough"].status == "not run"
        log = (tmp_path / "run" / "airflow.log").read_text(encoding="utf-8")
        assert "branch 'not accurate enough' is not taken" in log


# --- loops over a step's list, dict items, a loop inside a sub-pipeline -------------------------------------------

_LOOP_MODULE = '''
from heteroflow.components.core.retry import RetryPolicy
from heteroflow.components.core.step import step


def sizes(n: int = 3) -> list:
    """The sizes to try.

    Args:
        n: how many.
    """
    return [2 ** i for i in range(n)]


def square(x: int, scale: float = 1.0) -> float:
    """x squared, scaled.

    Args:
        x: a number.
        scale: a factor.
    """
    return float(x * x) * scale


def signed() -> list:
    """Two numbers, the second negative.
    """
    return [4.0, -1.0]


def words() -> list:
    """Two items, the second not a number.
    """
    return [3, "four"]


def slow_square(x: int, marker_dir: str) -> float:
    """x squared, after a second; a file named after x says it finished.

    Args:
        x: a number.
        marker_dir: where the file goes.
    """
    import os
    import time

    time.sleep(1.0)
    open(os.path.join(marker_dir, f"done-{x}"), "w").close()
    return float(x * x)


def root(x: float) -> float:
    """The square root.

    Args:
        x: a number >= 0.
    """
    return x ** 0.5


def _check_root(x: float = 0.0) -> None:
    from heteroflow.components.errors import InvalidParameter

    if x < 0:
        raise InvalidParameter(f"parameter x={x} is negative; valid: >= 0")


def total(values: list) -> float:
    """The sum.

    Args:
        values: the numbers.
    """
    return float(sum(values))


def flaky(x: int, marker_dir: str) -> float:
    """x, after one reset connection (a transient failure) on the first attempt for x == 2.

    Args:
        x: a number.
        marker_dir: where that first failure is remembered.
    """
    import os

    marker = os.path.join(marker_dir, f"failed-{x}")
    if x == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        raise ConnectionResetError("connection reset by peer")
    return float(x)


def picky(x: float, bad: float = -1.0) -> float:
    """x, unless it is the bad one (a ValueError: a permanent failure).

    Args:
        x: a number.
        bad: the number refused.
    """
    if x == bad:
        raise ValueError(f"{x} is the bad one")
    return float(x)


SIZES = step(sizes)
SIGNED = step(signed)
WORDS = step(words)
ROOT = step(root, check=_check_root)
SQUARE = step(square)
SLOW_SQUARE = step(slow_square)
TOTAL = step(total)
FLAKY = step(flaky, retry=RetryPolicy(retries=2, backoff_seconds=0.5))
PICKY = step(picky)


def failing_iteration():
    """A loop whose iteration 1 (item -1.0) fails its first call; the loop's second call reads the first's value."""
    from heteroflow.pipelines.control import Collected, ParallelFor
    from heteroflow.pipelines.graph import Pipeline

    p = Pipeline("failing-iteration")
    with ParallelFor([4.0, -1.0, 9.0]) as x:
        picked = p.add(PICKY, x=x)
        squares = p.add(SQUARE, x=2, scale=picked.output)
    p.add(TOTAL, values=Collected(squares.output))
    return p
'''


@pytest.fixture()
def loop_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Steps in a module of their own, importable by step processes (PYTHONPATH)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "hf_loop_steps.py").write_text(_LOOP_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    sys.modules.pop("hf_loop_steps", None)
    return importlib.import_module("hf_loop_steps")


def test_loops_over_a_list_output_dict_items_and_inside_a_sub_pipeline(loop_steps: Any, tmp_path: Path) -> None:
    from kfp.components import load_component_from_file

    from heteroflow.pipelines.engines.inprocess import run_inprocess
    from heteroflow.pipelines.kfp.render import compile_pipeline

    p = Pipeline("loops")
    sizes = p.add(loop_steps.SIZES)
    with ParallelFor(sizes.output) as size:
        squares = p.add(loop_steps.SQUARE, x=size)
    p.add(loop_steps.TOTAL, name="first", values=Collected(squares.output))
    with ParallelFor([{"x": 3, "scale": 0.5}, {"x": 4, "scale": 2.0}], name="pairs") as item:
        scaled = p.add(loop_steps.SQUARE, name="scaled", x=item.x, scale=item.scale)
    second = p.add(loop_steps.TOTAL, name="second", values=Collected(scaled.output))
    inner = Pipeline("inner")
    with ParallelFor([1, 2, 3], parallelism=2) as x:
        squared = inner.add(loop_steps.SQUARE, x=x, scale=inner.param("scale", default=1.0))
    inner.set_outputs(total=inner.add(loop_steps.TOTAL, values=Collected(squared.output)).output)
    sub = p.add(inner, name="sub", scale=10.0)
    with If(sub.outputs.total > second.output, name="sub wins"):
        p.add(loop_steps.TOTAL, name="winner", values=[1.0])

    out = compile_pipeline(p, tmp_path / "loops.yaml")
    assert load_component_from_file(str(out)).name == "loops"
    text = out.read_text(encoding="utf-8")
    assert "parallelismLimit: 2" in text and "parameterExpressionSelector" in text  # item.x of a dict item

    record = run_inprocess(p, {}, run_dir=tmp_path / "run")
    assert record.status == "succeeded"
    assert record.results["first"]["result"] == 1.0 + 4.0 + 16.0  # sizes 1, 2, 4
    assert record.results["second"]["result"] == 9 * 0.5 + 16 * 2.0
    assert record.results["sub__total"]["result"] == 10.0 * (1 + 4 + 9)
    assert {s.name: s.status for s in record.steps}["winner"] == "succeeded"  # 140 > 36.5
    # each iteration recorded apart, with its item: a list output's, a dict item, a loop inside a sub-pipeline
    assert [(it.item, it.attempts) for it in record.step("square").iterations] == [(1, 1), (2, 1), (4, 1)]
    assert [it.item for it in record.step("scaled").iterations] == [{"x": 3, "scale": 0.5}, {"x": 4, "scale": 2.0}]
    assert [it.iteration for it in record.step("sub__square").iterations] == [0, 1, 2]


@pytest.mark.slow
def test_loops_run_on_kfp_local(loop_steps: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.kfp.local import run_local

    p = Pipeline("loops-local")
    sizes = p.add(loop_steps.SIZES)
    with ParallelFor(sizes.output) as size:
        squares = p.add(loop_steps.SQUARE, x=size)
    first = p.add(loop_steps.TOTAL, name="first", values=Collected(squares.output))
    with ParallelFor([{"x": 3, "scale": 0.5}, {"x": 4, "scale": 2.0}], name="pairs") as item:
        scaled = p.add(loop_steps.SQUARE, name="scaled", x=item.x, scale=item.scale)
    second = p.add(loop_steps.TOTAL, name="second", values=Collected(scaled.output))
    with If(first.output > second.output, name="first wins"):
        p.add(loop_steps.TOTAL, name="winner", values=[1.0])
    with Else(name="second wins"):
        p.add(loop_steps.TOTAL, name="loser", values=[2.0])
    record = run_local({}, pipeline=p, run_dir=tmp_path / "run")
    assert record.status == "succeeded", record
    assert record.results["first"]["result"] == 21.0
    assert record.results["second"]["result"] == 36.5
    steps = {s.name: s.status for s in record.steps}
    assert steps["winner"] == "not run" and steps["loser"] == "succeeded"
    # kfp.local's iterations: the index from the task's folder, the item filled in from the loop's list
    assert [(it.iteration, it.item, it.attempts) for it in record.step("square").iterations] == [(0, 1, 1), (1, 2, 1), (2, 4, 1)]
    assert [it.item for it in record.step("scaled").iterations] == [{"x": 3, "scale": 0.5}, {"x": 4, "scale": 2.0}]


def _flaky_pipeline(loop_steps: Any, marker_dir: Path) -> Pipeline:
    p = Pipeline("flaky-loop")
    with ParallelFor([1, 2, 3]) as x:
        p.add(loop_steps.FLAKY, x=x, marker_dir=str(marker_dir))
    return p


def _check_flaky_run(folder: Path) -> None:
    """Iteration 1 (item 2) failed once and was retried: 2 attempts on that iteration only, none on the others;
    the retry is that iteration's, and every view says so."""
    from heteroflow.pipelines.cli.runs import retry_lines, summary_text
    from heteroflow.pipelines.runs.folders import load_run, retries
    from heteroflow.pipelines.runs.report import render_report

    first = json.loads((folder / "steps" / "flaky" / "iteration-1" / "attempt-1.json").read_text(encoding="utf-8"))
    assert (first["status"], first["failure"], first["iteration"], first["item"]) == ("failed", "transient", 1, 2)
    assert json.loads((folder / "steps" / "flaky" / "iteration-1" / "attempt-2.json").read_text(encoding="utf-8"))["status"] == "succeeded"
    assert [p.name for p in (folder / "steps" / "flaky" / "iteration-0").iterdir()] == ["attempt-1.json"]
    run = load_run(folder)
    flaky = run["steps"][0]
    assert (flaky["status"], flaky["attempts"]) == ("succeeded", 2)
    assert [(it["item"], it["attempts"], it["status"]) for it in flaky["iterations"]] == [(1, 1, "succeeded"), (2, 2, "succeeded"), (3, 1, "succeeded")]
    found = retries(run)
    assert [(r["iteration"], r["attempt"], r["after"]) for r in found] == [((1,), 2, "transient")]
    lines = retry_lines(folder)
    assert any(re.match(r"  flaky\[1\] attempt 2 on cpu( \(candidate 0\))? after a transient failure", line) for line in lines), lines
    assert not any("candidate None" in line for line in lines)  # a step without candidates (trial: in-process)
    text = summary_text(run)
    assert re.search(r"flaky ×3 +│ succeeded +│ cpu +│ +2 │", text), text
    assert "flaky: 3 iterations: 3 succeeded; [1] 2 attempts" in text
    html = render_report(run)
    assert "<td class=iteration>[1] 2</td><td class=num>2</td>" in html  # iteration 1's second attempt
    assert "<td class=iteration>[2] 3</td><td class=num>1</td>" in html  # iteration 2's first: not a 4th attempt
    assert "candidate None" not in html


def test_a_retried_loop_iteration_counts_its_own_attempts_in_process(loop_steps: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    (tmp_path / "marks").mkdir()
    record = run_inprocess(_flaky_pipeline(loop_steps, tmp_path / "marks"), {}, run_dir=tmp_path / "run", sleep=lambda s: None)
    assert record.status == "succeeded"
    assert [it.attempts for it in record.step("flaky").iterations] == [1, 2, 1]
    _check_flaky_run(tmp_path / "run")


@pytest.mark.slow
def test_a_retried_loop_iteration_counts_its_own_attempts_on_kfp_local(loop_steps: Any, tmp_path: Path) -> None:
    """kfp.local retries the failed iteration's task (its retry policy, compiled); the step process finds its
    iteration from kfp.local's task folder (``for-loop-<n>-iteration-<i>``)."""
    from heteroflow.pipelines.kfp.local import run_local

    (tmp_path / "marks").mkdir()
    record = run_local({}, pipeline=_flaky_pipeline(loop_steps, tmp_path / "marks"), run_dir=tmp_path / "run")
    assert record.status == "succeeded", record
    assert [it.attempts for it in record.step("flaky").iterations] == [1, 2, 1]
    _check_flaky_run(tmp_path / "run")


def _check_failing_iteration_run(record: Any) -> None:
    """KFP's loop semantics: iterations are independent, so iterations 0 and 2 run to their end although iteration 1
    failed; the calls after the failed one in iteration 1 do not run (shown ``not run``); the loop fails once every
    iteration ran and what reads it (``total``, Collected) does not run."""
    assert record.status == "failed"
    picky = record.step("picky")
    assert [(it.iteration, it.item, it.status) for it in picky.iterations] == [(0, 4.0, "succeeded"), (1, -1.0, "failed"), (2, 9.0, "succeeded")]
    assert picky.status == "failed" and "-1.0 is the bad one" in (picky.iterations[1].error or "")
    square = record.step("square")
    assert [(it.iteration, it.status) for it in square.iterations] == [(0, "succeeded"), (1, "not run"), (2, "succeeded")]
    assert [it.details.get("result") for it in square.iterations] == [16.0, None, 36.0]
    assert record.step("total").status == "not run"
    folder = Path(record.run_dir)
    assert sorted(p.parent.name for p in (folder / "steps" / "square").glob("iteration-*/attempt-*.json")) == ["iteration-0", "iteration-2"]
    # no step-level result of a loop step (it was its last iteration's: square 36.0): each iteration carries its own
    saved = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    assert "square" not in saved["results"] and "picky" not in saved["results"]
    assert [s["details"] for s in saved["steps"] if s["name"] in ("picky", "square")] == [{}, {}]


def _shown_run(folder: Path) -> str:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    shown = CliRunner().invoke(app, ["runs", "show", str(folder)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    return shown.output


def test_runs_show_gives_a_loop_steps_results_per_iteration(loop_steps: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    run_inprocess(loop_steps.failing_iteration(), {}, run_dir=tmp_path / "run")
    text = _shown_run(tmp_path / "run")
    assert "results of square ×3:\n  [0] 4.0: result 16\n  [1] -1.0: not run\n  [2] 9.0: result 36\n" in text, text
    assert "results of picky ×3:\n  [0] 4.0: result 4\n  [1] -1.0: failed\n  [2] 9.0: result 9\n" in text, text


def test_a_run_record_whose_loop_step_has_its_last_iterations_results_still_reads(tmp_path: Path) -> None:
    """run.json written before a loop step lost its step-level result (``results`` and ``details``: the last
    iteration's): it loads, and ``runs show`` gives each iteration's results."""
    from heteroflow.pipelines.runs.records import StepSummary

    folder = tmp_path / "old"
    folder.mkdir()
    its = [{"iteration": i, "item": x, "status": "succeeded", "attempts": 1, "details": {"result": x * x}} for i, x in enumerate([2.0, 3.0])]
    old_step = {"name": "square", "status": "succeeded", "device": "cpu", "attempts": 1, "details": {"result": 9.0}, "iterations": its}
    (folder / "run.json").write_text(json.dumps({"run_id": "old-2", "pipeline": "loops", "status": "succeeded", "run_dir": str(folder),
                                                 "started_at": 1.0, "wall_seconds": 2.0, "params": {}, "steps": [old_step],
                                                 "fallbacks": [], "metrics": {}, "results": {"square": {"result": 9.0}}, "placement": {}}))
    summary = StepSummary.from_dict(old_step)
    assert (summary.details, [it.details for it in summary.iterations]) == ({"result": 9.0}, [{"result": 4.0}, {"result": 9.0}])
    assert "results of square ×2:\n  [0] 2.0: result 4\n  [1] 3.0: result 9\n" in _shown_run(folder)


def test_a_failed_loop_iteration_leaves_the_others_running_in_process(loop_steps: Any, tmp_path: Path) -> None:
    """The in-process engine stopped at iteration 1's failure: iteration 2 never ran and was not shown at all,
    where kfp.local (and Airflow's mapped instances) ran it."""
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    _check_failing_iteration_run(run_inprocess(loop_steps.failing_iteration(), {}, run_dir=tmp_path / "run"))


@pytest.mark.slow
def test_a_failed_loop_iteration_leaves_the_others_running_on_kfp_local(loop_steps: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.kfp.local import run_local

    _check_failing_iteration_run(run_local({}, pipeline=loop_steps.failing_iteration(), run_dir=tmp_path / "run"))


@pytest.mark.slow
def test_a_failed_loop_iteration_leaves_the_others_running_on_airflow(loop_steps: Any, airflow_home: Path, tmp_path: Path) -> None:
    """Airflow mapped each call of the loop on its own, so every ``square`` instance waited for every ``picky``
    instance: iteration 1's failure left iterations 0 and 2's ``square`` upstream_failed (not run), where kfp.local
    ran them. The loop is now a mapped task group: an instance depends on its own iteration's instances only."""
    from heteroflow.pipelines.engines.runner import run

    record = run("hf_loop_steps:failing_iteration", {}, engine="airflow", run_dir=tmp_path / "run", airflow_home=str(airflow_home))
    _check_failing_iteration_run(record)


def _check_counted_fault_per_iteration(record: Any) -> None:
    """``flaky@cpu=transient:1`` on a loop of three: each iteration's first attempt fails (the injected fault) and
    its retry succeeds. The count was shared: only the iteration that happened to run first failed (on kfp.local,
    whichever its parallel tasks reached first)."""
    assert record.status == "succeeded"
    flaky = record.step("flaky")
    assert [(it.iteration, it.attempts, it.status) for it in flaky.iterations] == [(0, 2, "succeeded"), (1, 2, "succeeded"), (2, 2, "succeeded")]
    for i in range(3):
        first = json.loads((Path(record.run_dir) / "steps" / "flaky" / f"iteration-{i}" / "attempt-1.json").read_text(encoding="utf-8"))
        assert (first["status"], first["failure"]) == ("failed", "transient") and "injected by HETEROFLOW_INJECT_FAULT" in first["error"]


def _counted_fault_pipeline(loop_steps: Any, marker_dir: Path) -> Pipeline:
    p = Pipeline("counted-fault")
    with ParallelFor([1, 3, 5]) as x:  # none is 2: flaky never fails by itself
        p.add(loop_steps.FLAKY, x=x, marker_dir=str(marker_dir))
    return p


def test_a_counted_fault_counts_per_iteration_in_process(loop_steps: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(_counted_fault_pipeline(loop_steps, tmp_path), {}, run_dir=tmp_path / "run",
                           inject_faults=["flaky@cpu=transient:1"], sleep=lambda s: None)
    _check_counted_fault_per_iteration(record)


@pytest.mark.slow
def test_a_counted_fault_counts_per_iteration_on_kfp_local(loop_steps: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.kfp.local import run_local

    record = run_local({}, pipeline=_counted_fault_pipeline(loop_steps, tmp_path), run_dir=tmp_path / "run",
                       inject_faults=["flaky@cpu=transient:1"])
    _check_counted_fault_per_iteration(record)


def test_a_run_record_from_before_iterations_were_recorded_still_reads(tmp_path: Path) -> None:
    """run.json and attempt records written before loop iterations were recorded apart (no ``iterations``, no
    ``iteration``): the record loads, its steps table and report render, and nothing is taken for an iteration."""
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.folders import load_run, retries
    from heteroflow.pipelines.runs.records import StepSummary
    from heteroflow.pipelines.runs.report import render_report

    folder = tmp_path / "old"
    (folder / "steps" / "train").mkdir(parents=True)
    old_step = {"name": "train", "status": "succeeded", "device": "cpu", "kind": "cpu", "attempts": 3, "seconds": 0.5,
                "details": {"learning_rate": 0.001}, "traceback_file": None}
    (folder / "run.json").write_text(json.dumps({"run_id": "old-1", "pipeline": "tuning-fanout", "status": "succeeded",
                                                 "run_dir": str(folder), "started_at": 1.0, "wall_seconds": 2.0, "params": {},
                                                 "steps": [old_step], "fallbacks": [], "metrics": {}, "results": {}, "placement": {}}))
    for n in (1, 2, 3):
        (folder / "steps" / "train" / f"attempt-{n}.json").write_text(json.dumps(
            {"step": "train", "attempt": n, "status": "succeeded", "device": "cpu", "started_at": float(n), "ended_at": n + 0.1, "seconds": 0.1}))
    run = load_run(folder)
    assert [r["attempt"] for r in run["attempts"]["train"]] == [1, 2, 3] and retries(run) == []
    summary = StepSummary.from_dict(old_step)
    assert (summary.attempts, summary.iterations) == (3, [])
    assert re.search(r"│ train +│ succeeded +│ cpu +│ +3 │", summary_text(run))
    html = render_report(run)
    assert "<b>train</b>" in html and "<th>iteration</th>" not in html


def test_the_loop_patch_keeps_an_iterations_outside_inputs() -> None:
    """kfp 2.17's create_parameter_loop_iteration_task_spec hands every task-output input of an iteration the loop
    item (what heteroflow.pipelines.kfp.loop_patch works around); patched, only the item's input gets it."""
    from kfp.local.orchestrator import task_spec_utils
    from kfp.pipeline_spec import pipeline_spec_pb2

    from heteroflow.pipelines.kfp.loop_patch import LOOP_INPUTS, loop_inputs

    spec = pipeline_spec_pb2.PipelineTaskSpec()
    spec.parameter_iterator.item_input = "pipelinechannel--rates-loop-item"
    spec.parameter_iterator.items.input_parameter = "pipelinechannel--rates"
    spec.inputs.parameters["pipelinechannel--rates"].component_input_parameter = "rates"
    route = spec.inputs.parameters["pipelinechannel--make-Output"].task_output_parameter
    route.producer_task, route.output_parameter_key = "make", "Output"

    def iteration() -> pipeline_spec_pb2.PipelineTaskSpec:
        return task_spec_utils.create_parameter_loop_iteration_task_spec(spec, 0.1, "for-loop-2")

    assert LOOP_INPUTS.current()  # the internal is still there
    unpatched = iteration().inputs.parameters["pipelinechannel--make-Output"]
    assert unpatched.runtime_value.constant.number_value == 0.1  # the kfp behaviour: the route became the item
    with loop_inputs():
        patched = iteration().inputs.parameters
    assert patched["pipelinechannel--make-Output"].task_output_parameter.producer_task == "make"
    assert patched["pipelinechannel--rates-loop-item"].runtime_value.constant.number_value == 0.1
    assert task_spec_utils.create_parameter_loop_iteration_task_spec is not None and iteration().inputs.parameters[
        "pipelinechannel--make-Output"].runtime_value.constant.number_value == 0.1  # undone after the context


def test_a_loop_item_the_step_would_refuse_stops_the_run_before_any_work(loop_steps: Any, tmp_path: Path) -> None:
    """Trial input (issue #32's new-user trial): `-p 'learning_rates=[1.0, "x", 0.001]'` on the tuning fan-out ran
    iterations 0 and 2 and failed iteration 1 mid-run, recorded nowhere on kfp.local (the run failed with no reason)
    and as a usage error after work on the in-process engine. The items of a loop over a pipeline parameter or a
    literal list are now checked as the step parameter they feed, with the pipeline's parameters, before anything."""
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    args = tuning.pipeline.arguments({"learning_rates": [1.0, "x", 0.001]})
    with pytest.raises(InvalidParameter, match=r"parameter learning_rates\[1\] = 'x' goes to train's learning_rate: .*valid: a number"):
        tuning.pipeline.check(args)
    tuning.pipeline.check(tuning.pipeline.arguments({"learning_rates": [1.0, 2, 0.001]}))  # an int is a float: passes

    # sibling: a literal list of dict items, one field of the wrong type and one item without the field
    p = Pipeline("pairs")
    with ParallelFor([{"x": 3, "scale": 0.5}, {"x": "four", "scale": 2.0}], name="pairs") as item:
        p.add(loop_steps.SQUARE, name="scaled", x=item.x, scale=item.scale)
    with pytest.raises(InvalidParameter, match=r"the ParallelFor list\[1\] = 'four' goes to scaled's x"):
        run_inprocess(p, {}, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "steps").exists()  # nothing ran
    # and a list parameter of dict items, one without the field the loop reads
    q = Pipeline("pairs-param")
    with ParallelFor(q.param("pairs", default=[{"x": 3}])) as item:
        q.add(loop_steps.SQUARE, name="scaled", x=item.x)
    with pytest.raises(InvalidParameter, match=r"parameter pairs\[1\] = \{'y': 4\} has no key 'x', which scaled's x takes"):
        q.check(q.arguments({"pairs": [{"x": 3}, {"y": 4}]}))
    q.check(q.arguments({"pairs": [{"x": 3}, {"x": 4}]}))


def test_an_empty_list_for_a_loop_a_later_step_collects_from_is_refused_before_anything_runs(
        loop_steps: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: `-p learning_rates=[]` on the tuning fan-out ran make_dataset, no trial, and failed inside
    choose_best (`ValueError: max() arg is an empty sequence`), naming no parameter. KFP runs no iteration for an
    empty list, so a loop stays legal with one; but one whose outputs a later step collects (Collected) is refused
    before anything runs, naming the parameter, that it is empty, and what is valid. A loop nobody collects from
    still runs no iteration and the run succeeds."""
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    said = (r"learning_rates=\[\] is empty: loop trials would run no iteration, and choose_best's accuracies collects "
            r"evaluate\.outputs\['result'\] from it \(Collected\) into an empty list; valid: a list of at least one item")
    with pytest.raises(InvalidParameter, match=said):
        tuning.pipeline.check(tuning.pipeline.arguments({"learning_rates": []}))
    tuning.pipeline.check(tuning.pipeline.arguments({"learning_rates": [0.1]}))  # one item: fine
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["run", "--engine", "inprocess", "--pipeline", "practitioners.tuning_fanout:pipeline",
                                    "-p", "learning_rates=[]"])
    assert done.exit_code == 2 and re.search(said, " ".join(done.output.split())), done.output
    assert not (tmp_path / "heteroflow-runs").exists()  # nothing ran

    q = Pipeline("no-collector")
    with ParallelFor(q.param("xs", default=[4.0])) as x:
        q.add(loop_steps.ROOT, x=x)
    q.check(q.arguments({"xs": []}))
    record = run_inprocess(q, {"xs": []}, run_dir=tmp_path / "run")
    assert record.status == "succeeded" and record.step("root").iterations == []


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_loop_item_on_both_engines_with_no_run_folder(tmp_path: Path) -> None:
    import os
    import subprocess

    exe = Path(sys.executable).with_name("heteroflow")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")])}
    for engine in ("kfp-local", "inprocess"):
        done = subprocess.run([str(exe), "run", "--engine", engine, "--pipeline", "practitioners.tuning_fanout:pipeline",
                               "-p", 'learning_rates=[1.0, "x", 0.001]'], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, (engine, done.stdout[-2000:], done.stderr[-2000:])
        assert "learning_rates[1] = 'x' goes to train's learning_rate" in done.stderr
        assert not (tmp_path / "heteroflow-runs").exists() or not any((tmp_path / "heteroflow-runs").iterdir())


@pytest.mark.slow
def test_a_step_without_parameters_feeds_a_loop_on_kfp_local_and_a_failed_iteration_is_recorded(loop_steps: Any, tmp_path: Path) -> None:
    """Found while checking the trial input above: a step with no parameters and no artifacts (``signed()``)
    rendered ``def signed(\n    ,\n)`` and failed to compile for KFP. Its output list now feeds a loop on kfp.local;
    the iteration whose item has no real square root fails (its result is not a float), recorded as that
    iteration's failed, permanent attempt. The same item in a parameter list is refused by the step's own check
    before anything runs."""
    from heteroflow.pipelines.kfp.local import run_local
    from heteroflow.pipelines.kfp.render import compile_pipeline

    p = Pipeline("bad-item")
    with ParallelFor(p.add(loop_steps.SIGNED).output) as x:
        p.add(loop_steps.ROOT, x=x)
    text = compile_pipeline(p, tmp_path / "bad-item.yaml").read_text(encoding="utf-8")  # was a SyntaxError
    assert "comp-signed:" in text and "def signed(" in text
    record = run_local({}, pipeline=p, run_dir=tmp_path / "run")
    assert record.status == "failed" and record.step("signed").status == "succeeded"
    roots = record.step("root")
    assert roots.status == "failed"
    assert [(it.iteration, it.item, it.status) for it in roots.iterations] == [(0, 4.0, "succeeded"), (1, -1.0, "failed")]
    assert "parameter result=" in (roots.iterations[1].error or "") and "is a complex; valid: a number" in roots.iterations[1].error
    attempt = json.loads((tmp_path / "run" / "steps" / "root" / "iteration-1" / "attempt-1.json").read_text())
    assert (attempt["status"], attempt["failure"], attempt["iteration"]) == ("failed", "permanent", 1)

    q = Pipeline("bad-param-item")
    with ParallelFor(q.param("xs", default=[4.0])) as x:
        q.add(loop_steps.ROOT, x=x)
    with pytest.raises(InvalidParameter, match=r"parameter xs\[1\] = -1.0 goes to root's x: parameter x=-1.0 is negative"):
        q.check(q.arguments({"xs": [4.0, -1.0]}))


@pytest.mark.slow
def test_a_loop_item_kfp_local_cannot_hand_its_task_fails_the_run_instead_of_passing_for_success(loop_steps: Any, tmp_path: Path) -> None:
    """Found with the trial input above: an output list item kfp.local cannot coerce to the step's parameter type
    ("four" for an int) fails that iteration's task before any step of it runs, so no attempt record says so; the
    calls of a loop may legitimately not run (an empty list), and the run was recorded as succeeded. kfp.local's
    own pipeline failure now fails the run, naming the task and kfp.log."""
    from heteroflow.pipelines.kfp.local import run_local

    p = Pipeline("uncoercible-item")
    with ParallelFor(p.add(loop_steps.WORDS).output) as x:
        p.add(loop_steps.SQUARE, x=x)
    record = run_local({}, pipeline=p, run_dir=tmp_path / "run")
    assert record.status == "failed", (record.error, [(s.name, s.status) for s in record.steps])
    assert "kfp.local could not run its task for-loop-1-iteration-1; no step of it ran (see kfp.log" in (record.error or "")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"
    assert "invalid literal for int() with base 10: 'four'" in (tmp_path / "run" / "kfp.log").read_text(encoding="utf-8")


@pytest.mark.slow
def test_an_iteration_kfp_local_cannot_hand_its_task_leaves_the_others_running(loop_steps: Any, tmp_path: Path) -> None:
    """Found by CI (the test above failed once, naming iteration 0): kfp.local raises the coercion error of
    iteration 1's task in the thread running that iteration's steps, and the run handled any exception there as
    Ctrl-C: it stopped every task and killed the step processes of the iterations running beside it, so iteration
    0 (item 3, a good item) failed too and the run blamed it. Now iteration 0 runs to its end and succeeds, and
    the error names the iteration whose item was bad."""
    from heteroflow.pipelines.kfp.local import run_local

    markers = tmp_path / "markers"
    markers.mkdir()
    p = Pipeline("uncoercible-beside-a-slow-one")
    with ParallelFor(p.add(loop_steps.WORDS).output) as x:
        p.add(loop_steps.SLOW_SQUARE, x=x, marker_dir=str(markers))
    record = run_local({}, pipeline=p, run_dir=tmp_path / "run")
    assert record.status == "failed"
    assert "kfp.local could not run its task for-loop-1-iteration-1; no step of it ran" in (record.error or "")
    assert (markers / "done-3").exists()  # iteration 0's step was not killed
    squares = record.step("slow_square")
    # iteration 1 never started a step: shown not run, with its item
    assert [(it.iteration, it.item, it.status) for it in squares.iterations] == [(0, 3, "succeeded"), (1, "four", "not run")]
    attempt = json.loads((tmp_path / "run" / "steps" / "slow_square" / "iteration-0" / "attempt-1.json").read_text())
    assert attempt["status"] == "succeeded"


def test_runs_show_says_what_a_step_of_yours_returned(tmp_path: Path) -> None:
    """Trial finding: after the tuning fan-out, neither the summary nor `runs show` said what choose_best chose
    (best_learning_rate, best_accuracy were in run.json alone). `runs show` prints a step's results when they are a
    few plain values; the shipped steps' facts (lists, tables, paths) stay out of it."""
    folder = tmp_path / "tuned"
    folder.mkdir()
    steps = [{"name": n, "status": "succeeded", "device": "cpu", "attempts": 1} for n in ("choose_best", "preprocess")]
    (folder / "run.json").write_text(json.dumps({
        "run_id": "tuned-1", "pipeline": "tuning", "status": "succeeded", "run_dir": str(folder), "started_at": 1.0,
        "wall_seconds": 2.0, "params": {}, "steps": steps, "fallbacks": [], "metrics": {}, "placement": {},
        "results": {"choose_best": {"best_learning_rate": 0.001, "best_accuracy": 0.98999},
                    "preprocess": {"num_features": 64, "counts": {"train": 10}}}}))
    text = _shown_run(folder)
    assert "results of choose_best: best_learning_rate 0.001, best_accuracy 0.99\n" in text, text
    assert "results of preprocess" not in text
