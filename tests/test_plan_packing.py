"""The plan step under a packing policy (components/placement/packplan.py, issue 30): a fractional GPU in a candidate
(``device_share``), FGD resolved from an inventory's ``policy:`` and the default for shared GPUs, the workload
distribution from a workload file or the run records (the record says which), every candidate's score and why the
winner won in the placement, run.json and the report; a fractional-GPU inventory and workload through
``heteroflow simulate`` and through a pipeline run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.fgd import FgdPolicy
from heteroflow.components.placement.inventory import load_inventory
from heteroflow.components.placement.packing import ranked
from heteroflow.components.placement.packplan import (
    _registry_models,
    cluster_of,
    recent_requests,
    request_of,
    resolve_policy,
)
from heteroflow.components.placement.podlists import read_pods
from heteroflow.components.placement.scoring import QUEUE_STATE_ENV
from heteroflow.components.placement.views import InvalidInventory
from heteroflow.components.resources import Candidates, Resources

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "shared_gpu"
INVENTORY = EXAMPLES / "inventory.yaml"
PODS = EXAMPLES / "pods.csv"
HAMI_PROFILE = json.dumps({"version": 1, "name": "hami", "vendors": {"nvidia": {"plugin": "hami", "labels": "gfd"}}})


@pytest.fixture(autouse=True)
def _no_ambient_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(QUEUE_STATE_ENV, raising=False)
    monkeypatch.delenv("HETEROFLOW_CLUSTER_PROFILE", raising=False)
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # no ./heteroflow-runs of the developer's


def _plan(tmp_path: Path, placements: dict[str, Candidates], inventory: str | Path = INVENTORY, **params: str):
    from heteroflow.components.core.runtime import LocalArtifact, run_step
    from heteroflow.components.placement.plan import PLAN

    out = run_step(PLAN, outputs={"placement": LocalArtifact(str(tmp_path / "p.json"))},
                   placements={k: v.to_json() for k, v in placements.items()},
                   params={"device_inventory": str(inventory), **params})
    assert out.status == "succeeded", out.reason
    return out.facts


# --- a fractional GPU in a candidate ----------------------------------------------------------------------------


def test_device_share_is_part_of_one_device_and_round_trips() -> None:
    r = Resources.parse_spec("gpu:device_share=0.5,accelerator=T4")
    assert r.device_share == 0.5 and r.device_share_milli == 500 and r.count == 1
    assert Resources.from_dict(r.to_dict()) == r and r.to_dict()["device_share"] == 0.5
    assert "share 0.5 of the device" in r.describe()
    assert Resources(kind="gpu", device_share="0.25") == Resources(kind="gpu", device_share=0.25)
    assert Resources(kind="gpu").device_share_milli is None and "device_share" not in Resources(kind="gpu").to_dict()
    # a share and a whole device of the same model are different fallbacks
    assert len(Candidates(["gpu:device_share=0.5", "gpu"])) == 2


@pytest.mark.parametrize(("spec", "message"), [
    ("gpu:device_share=1", r"device_share='1' is not part of one device; valid: a number with 0 < device_share < 1"),
    ("gpu:device_share=0", r"device_share='0' is not part of one device"),
    ("gpu:device_share=half", r"device_share='half' is not a number; valid: a number with 0 < device_share < 1"),
    ("gpu:count=2,device_share=0.5", r"device_share='0.5' with count=2, nodes=1: a share is part of one device; .* with count=1"),
    ("gpu:nodes=2,device_share=0.5", r"with count=1, nodes=2: a share is part of one device"),
    ("cpu:device_share=0.5", r"device_share='0.5' with kind='cpu': only a gpu/npu device can be shared"),
    ("gpu:device_share=0.0004", r"below a thousandth of a device"),
])
def test_a_bad_device_share_names_the_field(spec: str, message: str) -> None:
    with pytest.raises(InvalidResources, match=message):
        Resources.parse_spec(spec)


def test_a_candidate_becomes_a_request_vector() -> None:
    share = request_of(Resources.parse_spec("gpu:device_share=0.3,accelerator=T4,cpu=4,memory=10Gi"))
    assert (share.num_gpu, share.gpu_milli, share.models, share.cpu_milli, share.memory_mib) == (1, 300, ("nvidia-t4",), 4000, 10240)
    assert share.shared
    whole = request_of(Resources.parse_spec("gpu:count=2,accelerator=A100"))
    assert (whole.num_gpu, whole.gpu_milli, set(whole.models)) == (2, 1000, {"nvidia-a100-40gb", "nvidia-a100-80gb"})
    cpu = request_of(Resources.parse_spec("cpu:cpu=8,memory=1G"))
    assert (cpu.num_gpu, cpu.gpu_milli, cpu.models, cpu.memory_mib) == (0, 0, (), 954)  # 10^9 B rounded up to MiB
    spread = request_of(Resources.parse_spec("gpu:nodes=3"))
    assert (spread.num_gpu, spread.single_node, len(spread.workers())) == (3, False, 3)


# --- the policy name and the inventory ------------------------------------------------------------------------


def test_packing_policy_names_resolve_and_an_unknown_one_lists_both_kinds() -> None:
    assert resolve_policy("fgd")[0] == "packing" and resolve_policy("best-fit")[1].name == "bestfit"
    assert resolve_policy("throughput")[0] == "round" and resolve_policy("least-loaded")[0] == "round"
    assert resolve_policy("heteroflow.components.placement.fgd:FgdPolicy")[0] == "packing"
    inv = load_inventory(INVENTORY)
    assert inv.policy == "fgd" and inv.workload == str(PODS)
    with pytest.raises(InvalidInventory, match=r"inv.yaml:1: policy='tetris' is unknown; valid: placement policies .*listed.*; "
                                               r"packing policies .*bestfit.*fgd"):
        load_inventory("inv.yaml", text="policy: tetris\nnodes: [{name: a, devices: {t4: 1}}]\n")
    with pytest.raises(InvalidInventory, match=r"inv.yaml:2: workload=3; valid: the path of a pod list CSV"):
        load_inventory("inv.yaml", text="nodes: [{name: a, devices: {t4: 1}}]\nworkload: 3\n")
    with pytest.raises(InvalidInventory, match=r"inv.yaml:2: workload='gone.csv': no such file .*relative to the inventory's folder"):
        load_inventory("inv.yaml", text="nodes: [{name: a, devices: {t4: 1}}]\nworkload: gone.csv\n")


def test_a_packing_policy_needs_cpu_and_memory_per_node() -> None:
    inv = load_inventory("inv.yaml", text="policy: fgd\nnodes: [{name: a, devices: {t4: 2}}]\n").for_placement()
    with pytest.raises(InvalidInventory, match=r"node 'a' states no cpu and memory; a packing policy places by CPU, memory"):
        cluster_of(inv)
    # which one it lacks (a new user's trial: a node with cpu and no memory read 'no cpu or memory')
    inv = load_inventory("inv.yaml", text="policy: fgd\nnodes: [{name: a, devices: {t4: 2}, cpu: 8}]\n").for_placement()
    with pytest.raises(InvalidInventory, match=r"node 'a' states no memory; a packing policy places by CPU, memory"):
        cluster_of(inv)


# --- the plan step under FGD ----------------------------------------------------------------------------------


def test_plan_step_places_a_fractional_gpu_with_fgd_and_records_every_score(tmp_path: Path) -> None:
    cands = Candidates(["gpu:device_share=0.5,accelerator=T4", "gpu:accelerator=T4", "gpu:count=8,accelerator=v100", "cpu"])
    facts = _plan(tmp_path, {"train": cands})
    assert facts["policy"] == "fgd"
    placed = facts["placements"]["train"]
    assert placed["index"] == 0 and placed["resources"]["device_share"] == 0.5
    assert placed["packing"] == {"policy": "fgd", "candidates": "listed",
                                 "distribution": f"workload file {PODS} (200 requests)"}
    scores = placed["scores"]
    assert [s["candidate"] for s in scores] == [0, 1, 2, 3]
    assert [s["feasible"] for s in scores] == [True, True, False, True]
    assert scores[2]["reason"].startswith("no node of nvidia-v100 has 8 devices (most: 4)")
    assert all(s["basis"] == "fgd score" for s in scores if s["feasible"])
    assert scores[0]["gpu_milli"] == 500 and scores[0]["model"] == "nvidia-t4"
    # the score is FGD's, computed independently: minus the least fragmentation increase over the nodes
    inv = load_inventory(INVENTORY).for_placement()
    fgd = FgdPolicy([dataclasses.replace(r, models=_registry_models(r.models)) for r in read_pods(PODS)])
    best = [s for _n, s in ranked(request_of(cands[0]), cluster_of(inv), fgd) if s is not None]
    assert scores[0]["score"] == pytest.approx(max(best)) and len(best) == 3  # the three T4 nodes
    assert placed["nodes"] == scores[0]["nodes"] and placed["nodes"][0].startswith("sg-t4-")
    assert placed["why"] == f"the first listed that fits (an ordered candidate list; fgd chooses its node: {placed['nodes'][0]}, score {scores[0]['score']:.4g})"
    assert json.loads((tmp_path / "p.json").read_text())["train"]["scores"] == scores


def test_candidates_any_take_the_highest_score_and_each_call_sees_the_last(tmp_path: Path) -> None:
    cands = Candidates(["gpu:device_share=0.5,accelerator=T4", "gpu:accelerator=T4"], policy="any")
    facts = _plan(tmp_path, {c: cands for c in "abcdef"})
    placements = facts["placements"]
    for call, p in placements.items():
        feasible = [s for s in p["scores"] if s["feasible"]]
        top = max(feasible, key=lambda s: (s["score"], -s["candidate"]))
        assert p["index"] == top["candidate"] and p["packing"]["candidates"] == "any", call
        assert p["why"].startswith(("highest score", "the only feasible", "score")), p["why"]
    # each call sees what the earlier ones took: no T4 node (2 devices) is given more than it has
    per_node: dict[str, int] = {}
    for p in placements.values():
        share = p["resources"].get("device_share")
        per_node[p["nodes"][0]] = per_node.get(p["nodes"][0], 0) + (1000 if share is None else round(share * 1000))
    assert per_node and max(per_node.values()) <= 2000, per_node
    # a plan that runs out of T4s says which limit holds each candidate
    from heteroflow.components.errors import NoCandidateAvailable
    from heteroflow.components.placement.packplan import PackingPlanner

    planner = PackingPlanner(load_inventory(INVENTORY).for_placement(), "fgd")
    whole = Candidates(["gpu:accelerator=T4"])
    for i in range(6):
        planner.place(f"c{i}", whole)
    with pytest.raises(NoCandidateAvailable, match=r"candidate 0 \(gpu x1 \(nvidia-t4\).*\): insufficient resources: GPU 1000 requested, 0 free"):
        planner.place("c6", whole)


def test_fgd_is_the_default_for_shared_gpus_only(tmp_path: Path) -> None:
    text = "nodes:\n  - {name: t4, replicas: 2, devices: {model: t4, count: 2}, cpu: 32, memory: 128Gi}\n  - {name: c, cpu: 8, memory: 32Gi}\n"
    inv = tmp_path / "inv.yaml"
    inv.write_text(text)
    shared = _plan(tmp_path, {"train": Candidates(["gpu:device_share=0.25", "cpu"])}, inv)
    assert shared["policy"] == "fgd"
    assert shared["placements"]["train"]["packing"]["distribution"].startswith("the candidates being placed (2 requests: no workload")
    assert _plan(tmp_path, {"train": Candidates(["gpu", "cpu"])}, inv)["policy"] == "listed"
    # a workload file with shared requests makes the inventory a shared-GPU one
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,250\np1,1000,1024,1,1000\n")
    inv.write_text(text + "workload: pods.csv\n")
    facts = _plan(tmp_path, {"train": Candidates(["gpu", "cpu"])}, inv)
    assert facts["policy"] == "fgd" and facts["placements"]["train"]["packing"]["distribution"] == (
        f"workload file {tmp_path / 'pods.csv'} (2 requests)")
    # a named policy wins over the default, and a bad workload file is named
    inv.write_text(text + "policy: bestfit\n")
    facts = _plan(tmp_path, {"train": Candidates(["gpu:device_share=0.5"])}, inv)
    assert facts["policy"] == "bestfit" and "distribution" not in facts["placements"]["train"]["packing"]
    (tmp_path / "bad.csv").write_text("name,cpu_milli\np0,1000\n")
    inv.write_text(text + "workload: bad.csv\n")
    from heteroflow.components.core.runtime import LocalArtifact, run_step
    from heteroflow.components.placement.plan import PLAN

    out = run_step(PLAN, outputs={"placement": LocalArtifact(str(tmp_path / "p.json"))},
                   placements={"train": Candidates(["gpu"]).to_json()}, params={"device_inventory": str(inv)})
    assert out.status == "failed" and "missing column(s) memory_mib, num_gpu, gpu_milli" in out.reason


def test_the_distribution_comes_from_the_run_records_when_no_workload_file(tmp_path: Path) -> None:
    inv = load_inventory("inv.yaml", text="nodes: [{name: t4, devices: {t4: 2}, cpu: 8, memory: 32Gi}]\n").for_placement()
    runs = tmp_path / "heteroflow-runs"
    for i, res in enumerate([{"kind": "gpu", "count": 1, "device_share": 0.25}, {"kind": "gpu", "count": 1}]):
        (runs / f"run-{i}").mkdir(parents=True)
        (runs / f"run-{i}" / "run.json").write_text(json.dumps({"placement": {"train": {"index": 0, "resources": res}}}))
    (runs / "broken").mkdir()
    (runs / "broken" / "run.json").write_text("{not json")
    dist = recent_requests(inv, [], roots=[runs])
    assert dist.source == f"runs records under {runs} (2 requests from 2 runs)"
    assert sorted(r.gpu_milli for r in dist.requests) == [250, 1000]
    assert recent_requests(inv, [request_of(Resources(kind="cpu"))], roots=[tmp_path / "none"]).source.startswith(
        "the candidates being placed (1 requests")


def test_the_placed_pod_asks_hami_for_the_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_CLUSTER_PROFILE", HAMI_PROFILE)
    placed = _plan(tmp_path, {"train": Candidates(["gpu:device_share=0.5,accelerator=T4"])})["placements"]["train"]
    pod = placed["pod"]
    assert pod["requests"]["nvidia.com/gpu"] == "1" and pod["requests"]["nvidia.com/gpucores"] == "50"
    # half of the memory the T4 reports (a percentage: its 15360 MiB, not the data sheet's 16 GiB)
    assert pod["requests"]["nvidia.com/gpumem-percentage"] == "50" and pod["limits"] == pod["requests"]
    prefer = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
    assert prefer["matchExpressions"][0]["values"] == placed["nodes"]


def test_the_whole_device_policies_record_the_share_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_CLUSTER_PROFILE", HAMI_PROFILE)
    inv = tmp_path / "inv.yaml"
    inv.write_text("policy: throughput\nnodes: [{name: t4, devices: {t4: 2}}]\n")
    placed = _plan(tmp_path, {"train": Candidates(["gpu:device_share=0.3,accelerator=T4"])}, inv)["placements"]["train"]
    assert placed["scores"][0]["gpu_milli"] == 300 and placed["pod"]["requests"]["nvidia.com/gpucores"] == "30"


def test_the_report_shows_the_packing_scores_and_the_distribution(tmp_path: Path) -> None:
    from heteroflow.pipelines.runs.sections import _placement

    placed = _plan(tmp_path, {"train": Candidates(["gpu:device_share=0.5,accelerator=T4", "cpu"])})["placements"]["train"]
    html = _placement({"placement": {"train": placed}, "steps": []})
    assert "<th>score (fgd score)</th>" in html and "won: the first listed that fits" in html
    assert f"fgd workload distribution: workload file {PODS} (200 requests)" in html
    assert html.count("<tr>") == 3


def test_fgd_on_the_live_cluster(tmp_path: Path) -> None:
    if not os.environ.get("HETEROFLOW_KUBECONFIG"):
        pytest.skip("needs a live cluster: set HETEROFLOW_KUBECONFIG to its kubeconfig")
    facts = _plan(tmp_path, {"train": Candidates(["gpu:device_share=0.5", "cpu"])}, "kubernetes")
    placed = facts["placements"]["train"]
    assert facts["policy"] == "fgd" and placed["packing"]["policy"] == "fgd"
    assert [s["candidate"] for s in placed["scores"]] == [0, 1] and placed["why"]


# --- done-when of #30: through heteroflow simulate and a pipeline run ---------------------------------------------


def test_simulate_runs_the_shared_gpu_example_with_its_inventory_file() -> None:
    from heteroflow.pipelines.cli.main import app

    runner = CliRunner()
    for inventory in (EXAMPLES / "nodes.csv", INVENTORY):
        out = runner.invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(inventory), "--policy", "fgd",
                                  "--policy", "bestfit"])
        assert out.exit_code == 0, out.output
        assert "fgd: unallocated" in out.output and "bestfit: unallocated" in out.output
    gpus = sum(n.devices for n in load_inventory(INVENTORY).for_placement().nodes)
    assert f"of {gpus} GPUs" in out.output


@pytest.mark.slow
def test_a_pipeline_run_plans_a_fractional_gpu_with_fgd_and_reports_the_scores(tmp_path: Path) -> None:
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("heteroflow")
    env = {**os.environ, "HETEROFLOW_HOME": str(tmp_path / "home")}
    env.pop(QUEUE_STATE_ENV, None)
    out = subprocess.run([str(exe), "run", "--engine", "inprocess", "--param", f"device_inventory={INVENTORY}",
                          "-c", "gpu:device_share=0.5,accelerator=T4", "-c", "gpu:accelerator=T4", "-c", "cpu",
                          "--output", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    placed = record["placement"]["train"]
    assert placed["packing"]["policy"] == "fgd" and placed["packing"]["distribution"].startswith("workload file ")
    assert [s["candidate"] for s in placed["scores"]] == [0, 1, 2]
    assert all(s["basis"] == "fgd score" and isinstance(s["score"], float) for s in placed["scores"])
    assert placed["index"] == 0 and placed["scores"][0]["gpu_milli"] == 500
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'class="plan-scores"' in html and "<th>score (fgd score)</th>" in html
    assert "won: the first listed that fits" in html and "fgd workload distribution: workload file" in html
    # the next run learns the distribution from this run's record when the inventory names no workload file
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.read_text().replace("workload: pods.csv", ""))
    from heteroflow.components.placement.packplan import recent_requests as recent

    dist = recent(load_inventory(inv).for_placement(), [], roots=[tmp_path])
    assert dist.source == f"runs records under {tmp_path} ({len(record['placement'])} requests from 1 runs)"
    assert {r.name: r.gpu_milli for r in dist.requests}["run/train"] == 500
