"""The plan step at run time: every candidate scored (components/placement/scoring.py) from the inventory, the
queue state and the profile's step times; the run record and report say why the winner won; the placed pod asks
for the chosen model (node affinity) and, for a fractional GPU, HAMi's resources (components/placement/podplace.py)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.errors import InvalidParameter, InvalidResources
from heteroflow.components.placement.inventory import load_inventory
from heteroflow.components.placement.policies import Policy
from heteroflow.components.placement.scoring import (
    QUEUE_STATE_ENV,
    QueueState,
    score_candidates,
    step_seconds_per_model,
    winner,
)
from heteroflow.components.resources import Candidates, Resources

INVENTORY = """\
nodes:
  - {name: k80, replicas: 2, devices: {model: k80, count: 4}}
  - {name: v100, devices: {model: v100, count: 4}}
  - {name: cpu-0, cpu: 32, memory: 128Gi}
queues:
  - {name: team-a, capability: 4}
  - {name: team-b, guarantee: 2}
throughputs:
  train: {k80: 2.0, v100: 8.0}
"""
CANDIDATES = Candidates(["gpu:accelerator=k80", "gpu:accelerator=v100,count=2", "gpu:accelerator=v100,count=8", "cpu"])


def _inv():
    return load_inventory("inv.yaml", text=INVENTORY).for_placement()


def _profile(**kw) -> dict:
    return {"format": 1, "operators": [], "samples_per_second": 10.0, **kw}


def test_step_times_come_from_the_profile_scaled_by_the_table() -> None:
    times = step_seconds_per_model(_profile(step_seconds=0.3, device_model="k80"), {"nvidia-k80": 2.0, "nvidia-v100": 8.0})
    assert times["nvidia-k80"] == (0.3, "profiled")
    assert times["nvidia-v100"][0] == pytest.approx(0.075) and "x table ratio 0.25" in times["nvidia-v100"][1]
    assert step_seconds_per_model(None, {"nvidia-v100": 4.0}) == {"nvidia-v100": (0.25, "throughput table")}
    assert step_seconds_per_model(_profile(step_seconds=1.5, device="cpu"), None) == {"cpu": (1.5, "profiled")}
    merged = step_seconds_per_model(_profile(step_seconds_by_model={"v100": 0.1, "T4": 0.4}), None)
    assert merged == {"nvidia-v100": (0.1, "profiled"), "nvidia-t4": (0.4, "profiled")}


def test_every_candidate_is_scored_and_the_limit_that_holds_one_is_named() -> None:
    scores = score_candidates(CANDIDATES, _inv(), QueueState(queue="team-a", used={"team-a": 1}),
                              _profile(step_seconds=0.3, device_model="nvidia-k80"), call="train")
    assert [s.candidate for s in scores] == [0, 1, 2, 3]
    k80, v100, big, cpu = scores
    assert k80.feasible and k80.model == "nvidia-k80" and k80.score == pytest.approx(1 / 0.3)
    assert v100.feasible and v100.model == "nvidia-v100" and v100.step_seconds == pytest.approx(0.075)
    assert v100.nodes == ("v100",) and "est. 0.075 s/step (profiled on nvidia-k80 x table ratio 0.25)" in v100.reason
    assert not big.feasible and big.score == -math.inf
    assert big.reason == "queue team-a's capability 4 is below the 8 device(s) it needs"
    assert cpu.feasible and cpu.model == "cpu" and cpu.score == 0.0 and "no step time known for cpu" in cpu.reason
    index, why = winner(scores, policy="throughput")
    assert index == 1 and why == "highest score 13.33 (est. steps/s on nvidia-v100) vs 3.333 for candidate 0 (nvidia-k80): 4.00x"
    assert winner(scores, policy="listed") == (0, "the first listed that fits")
    # the queue's usage counts: with 3 of 4 in use, two V100s no longer fit under the capability
    held = score_candidates(CANDIDATES, _inv(), QueueState(queue="team-a", used={"team-a": 3}), None, call="train")
    assert held[1].reason == "queue team-a uses 3 of its capability 4, +2 would exceed it"
    assert winner(held) == (0, "highest score 2 (est. steps/s on nvidia-k80) vs 0 for candidate 3 (cpu): unlike it, a known step time")
    assert json.loads(json.dumps([s.to_dict() for s in held]))[1]["score"] is None


def test_no_feasible_candidate_and_unknown_step_times() -> None:
    inv = load_inventory("i.yaml", text="nodes:\n  - {name: t4, devices: {model: t4, count: 1}}\n").for_placement()
    scores = score_candidates(Candidates(["gpu:accelerator=v100", "gpu:accelerator=t4,count=2"]), inv, None, None)
    assert winner(scores) is None
    assert [s.feasible for s in scores] == [False, False]
    two = score_candidates(Candidates(["gpu:accelerator=t4", "gpu"]), inv, None, None)
    assert winner(two)[0] == 0 and "no step time is known" in winner(two)[1]


class FewestLeft(Policy):
    """A node-level policy scoring a candidate by how few devices it leaves free on its node (best fit): the
    ``candidate_score`` hook a fragmentation-aware policy plugs into."""

    name = "fewest-left"

    def candidate_score(self, job, decision, state):
        node = decision.nodes[0][0]
        return -float(state.free[node])


def test_a_policy_can_score_candidates_itself() -> None:
    inv = load_inventory("i.yaml", text="nodes:\n  - {name: a, devices: {model: v100, count: 8}}\n"
                                        "  - {name: b, devices: {model: t4, count: 2}}\n").for_placement()
    scores = score_candidates(Candidates(["gpu:accelerator=v100", "gpu:accelerator=t4"]), inv, None, None, policy=FewestLeft())
    assert [s.score for s in scores] == [-7.0, -1.0]  # free devices left on the chosen node, negated
    assert winner(scores) == (1, "highest score -1 (fewest-left score on nvidia-t4) vs -7 for candidate 0 (nvidia-v100): higher by 6")


def test_queue_state_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(QUEUE_STATE_ENV, raising=False)
    assert QueueState.from_env() == QueueState()
    path = tmp_path / "q.json"
    path.write_text('{"queue": "team-b", "used": {"team-a": 2}}')
    monkeypatch.setenv(QUEUE_STATE_ENV, str(path))
    assert QueueState.from_env() == QueueState(queue="team-b", used={"team-a": 2})
    monkeypatch.setenv(QUEUE_STATE_ENV, '{"queue": "a", "used": {"a": -1}}')
    with pytest.raises(InvalidParameter, match=r"used\['a'\]=-1 is not a device count; valid: an integer >= 0"):
        QueueState.from_env()
    monkeypatch.setenv(QUEUE_STATE_ENV, '{"queues": "a"}')
    with pytest.raises(InvalidParameter, match=r"unknown field\(s\) 'queues'; valid: queue, used"):
        QueueState.from_env()


def test_plan_step_records_scores_and_why_in_the_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.core.runtime import LocalArtifact, run_step
    from heteroflow.components.placement.plan import PLAN

    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(_profile(step_seconds=0.3, device_model="nvidia-k80", device="cuda:0")))
    monkeypatch.setenv(QUEUE_STATE_ENV, '{"queue": "team-a", "used": {"team-a": 1}}')
    out = run_step(PLAN, outputs={"placement": LocalArtifact(str(tmp_path / "p.json"))},
                   placements={"train": CANDIDATES.to_json()},
                   params={"device_inventory": str(inv), "training_profile": str(prof)})
    assert out.status == "succeeded", out.reason
    assert out.facts["policy"] == "throughput"  # a profile makes the step times count (the inventory names no policy)
    placed = out.facts["placements"]["train"]
    assert placed["index"] == 1
    assert [s["candidate"] for s in placed["scores"]] == [0, 1, 2, 3]
    assert placed["scores"][2] == {"candidate": 2, "score": None, "feasible": False,
                                   "reason": "queue team-a's capability 4 is below the 8 device(s) it needs"}
    assert placed["why"].startswith("highest score 13.33 (est. steps/s on nvidia-v100)")
    assert placed["pod"]["requests"]["nvidia.com/gpu"] == "2"
    term = placed["pod"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.product", "operator": "In",
                                         "values": ["Tesla-V100-SXM2-16GB", "Tesla-V100-PCIE-16GB"]}]
    assert json.loads((tmp_path / "p.json").read_text())["train"]["why"] == placed["why"]

    # the report shows each candidate's score and why the winner won
    from heteroflow.pipelines.runs.sections import _placement

    html = _placement({"placement": {"train": placed}, "steps": []})
    assert "won: highest score 13.33" in html and "<table class=\"plan-scores\">" in html
    assert "queue team-a&#x27;s capability 4 is below the 8 device(s) it needs" in html
    assert html.count("<tr>") == 5  # the header and four candidates


def test_plan_step_without_a_cluster_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.placement.plan import check_plan_params

    monkeypatch.delenv("HETEROFLOW_KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InvalidParameter, match=r"device_inventory=kubernetes reads the live cluster, and none is configured: set HETEROFLOW_KUBECONFIG"):
        check_plan_params(device_inventory="kubernetes")


@pytest.mark.skipif(not os.environ.get("HETEROFLOW_KUBECONFIG"), reason="needs a live cluster: set HETEROFLOW_KUBECONFIG to its kubeconfig")
def test_plan_step_scores_candidates_on_the_live_cluster(tmp_path: Path) -> None:
    from heteroflow.components.placement.plan import plan_step

    result = plan_step(str(tmp_path / "p.json"), placements=json.dumps({"train": Candidates(["gpu", "cpu"]).to_json()}),
                       device_inventory="kubernetes")
    placed = result.placements["train"]
    assert [s["candidate"] for s in placed["scores"]] == [0, 1]
    assert placed["why"]


# --- the placed pod ------------------------------------------------------------------------------------------

HAMI = ClusterProfile.from_dict({"version": 1, "name": "hami", "vendors": {"nvidia": {"plugin": "hami", "labels": "gfd"}}})


def _validate(plan) -> None:
    import kubernetes_validate

    container = {"name": "train", "image": "heteroflow:0.1.0", "resources": {"requests": plan.requests, "limits": plan.limits}}
    spec = {"containers": [container], "affinity": plan.affinity}
    if plan.node_selector:
        spec["nodeSelector"] = plan.node_selector
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"}, "spec": spec}, "1.30.0", strict=True)


def test_placed_pod_requires_the_chosen_model_and_prefers_the_chosen_node() -> None:
    from heteroflow.components.placement.podplace import placed_pod_plan

    plan = placed_pod_plan(Resources(kind="gpu", accelerator="nvidia-gpu"), model="nvidia-t4", nodes=("t4-1",), profile=HAMI)
    node = plan.affinity["nodeAffinity"]
    [term] = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4", "TESLA-T4"]}]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["t4-1"]}]}}]
    assert plan.requests["nvidia.com/gpu"] == "1" and "nvidia.com/gpucores" not in plan.requests
    _validate(plan)
    with pytest.raises(InvalidResources, match=r"model='nvidia-v100' is not one candidate .* accepts; valid: .*nvidia-t4"):
        placed_pod_plan(Resources(kind="gpu", accelerator="t4"), model="nvidia-v100")


def test_a_fractional_gpu_asks_for_hami_cores_and_memory() -> None:
    from heteroflow.components.placement.podplace import HAMI_CORES, HAMI_MEMORY, placed_pod_plan

    plan = placed_pod_plan(Resources(kind="gpu", accelerator="v100"), model="nvidia-v100", gpu_milli=300, profile=HAMI)
    assert plan.limits["nvidia.com/gpu"] == plan.requests["nvidia.com/gpu"] == "1"
    assert plan.limits[HAMI_CORES] == "30"  # percent of the device's compute
    assert plan.limits["nvidia.com/gpumem-percentage"] == "30" and HAMI_MEMORY not in plan.limits  # of what the V100 reports
    stated = placed_pod_plan(Resources(kind="gpu", accelerator="v100", device_memory="4Gi"), model="nvidia-v100", gpu_milli=250,
                             profile=HAMI)
    assert (stated.requests[HAMI_CORES], stated.requests[HAMI_MEMORY]) == ("25", "4096")  # the request's own memory
    _validate(plan)
    from heteroflow.components.devices.podplan import DefaultProfileWarning

    import warnings

    with warnings.catch_warnings(record=True) as caught, pytest.raises(
            InvalidResources, match=r"uses the 'official' NVIDIA device plugin, which cannot share a GPU; valid: a profile with vendors.nvidia.plugin: hami"):
        warnings.simplefilter("always")
        placed_pod_plan(Resources(kind="gpu", accelerator="v100"), model="nvidia-v100", gpu_milli=300)
    assert not [w for w in caught if issubclass(w.category, DefaultProfileWarning)]  # the refusal alone, no warning first
    with pytest.raises(InvalidResources, match=r"gpu_milli=0 is not thousandths of one device"):
        placed_pod_plan(Resources(kind="gpu", accelerator="v100"), model="nvidia-v100", gpu_milli=0, profile=HAMI)
    with pytest.raises(InvalidResources, match=r"a fractional request is part of one device; valid: count=1"):
        placed_pod_plan(Resources(kind="gpu", accelerator="v100", count=2), model="nvidia-v100", gpu_milli=500, profile=HAMI)
    with pytest.raises(InvalidResources, match=r"fractional requests are rendered for NVIDIA GPUs under HAMi"):
        placed_pod_plan(Resources(kind="npu", accelerator="ascend-910b3"), model="ascend-910b3", gpu_milli=500, profile=HAMI)
    assert np.isclose(float(plan.limits[HAMI_CORES]) / 100, 0.3)


@pytest.mark.slow
def test_a_pipeline_run_records_and_reports_the_plan_scores(tmp_path: Path) -> None:
    import subprocess
    import sys

    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: t4, replicas: 2, devices: {model: t4, count: 4}}\n"
                   "  - {name: v100, devices: {model: v100, count: 8}}\n  - {name: cpu, cpu: 32, memory: 128Gi}\n"
                   "throughputs:\n  train: {t4: 2.0, v100: 5.0}\n")
    prof = tmp_path / "profile.json"  # as `heteroflow profile` writes it, taken on a T4
    prof.write_text(json.dumps(_profile(step_seconds=0.4, device="cuda:0", device_model="nvidia-t4")))
    exe = Path(sys.executable).with_name("heteroflow")
    env = {**os.environ, "HETEROFLOW_HOME": str(tmp_path / "home")}
    env.pop(QUEUE_STATE_ENV, None)
    out = subprocess.run([str(exe), "run", "--engine", "inprocess", "--param", f"device_inventory={inv}",
                          "--param", f"training_profile={prof}", "--output", str(tmp_path / "run")],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    placed = record["placement"]["train"]
    chosen = next(s for s in placed["scores"] if s["candidate"] == placed["index"])
    assert chosen["model"] == "nvidia-v100" and chosen["step_seconds"] == pytest.approx(0.4 * 2.0 / 5.0)
    assert placed["why"].startswith("highest score 6.25 (est. steps/s on nvidia-v100)")
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'class="plan-scores"' in html and "won: highest score 6.25" in html
