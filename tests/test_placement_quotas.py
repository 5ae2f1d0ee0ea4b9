"""Placement (the plan step and the simulator) reads every inventory form the parser reads, a new user's trial:

A. the shipped manifests inventory and the per-model/per-kind queue forms were refused ('valid for placement: a bare
   count of devices of any model', printing millicores and bytes); they are placed by, each amount in its own scope
   (a model, a device kind, any model, CPU, memory), as Kueue's nominalQuota per flavor and Volcano's capability are;
B. a node inventory without a CPU-only node failed the CPU-only evaluate step ('no model in the inventory can run
   it'); a CPU pod goes to any node with its CPU and memory free, as the Kubernetes scheduler places it; and a step
   asking for no device is not held by a device capability ('+0 would exceed it');
C. the plan step checked only a mixed candidate's first kind; every replica group is checked, on the count form and
   on a node inventory;
D. inventory and queue-state problems were found in the plan step (exit 1, after prewarm and preprocess ran); the
   run's up-front check finds them (exit 2, one line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.components.errors import InvalidParameter, NoCandidateAvailable
from heteroflow.components.placement.inventory import InvalidInventory, from_mapping, load_inventory
from heteroflow.components.placement.plan import Inventory, check_plan_params, plan, plan_on_nodes, plan_step
from heteroflow.components.placement.rounds import place_round
from heteroflow.components.placement.scoring import QUEUE_STATE_ENV
from heteroflow.components.placement.state import Job, PlacementState
from heteroflow.components.resources import Candidates, Resources

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS_INVENTORY = ROOT / "examples" / "manifests" / "inventory.yaml"

CHEAP2 = """\
version: 1
policy: throughput
nodes:
  - {name: a, devices: {nvidia-v100: 4}, cpu: 32, memory: 128Gi, cost_per_hour: 3}
  - {name: b, devices: {nvidia-t4: 4}, cpu: 32, memory: 128Gi, cost_per_hour: 1}
"""


def _plan(tmp_path: Path, inventory: str, **calls: list[str]) -> dict:
    placements = {call: Candidates(c).to_json() for call, c in calls.items()}
    return plan_step(str(tmp_path / "placement.json"), placements=json.dumps(placements), device_inventory=inventory).placements


def _placement(text: str, source: str = "q.yaml"):
    return load_inventory(source, text=text).for_placement()


# --- A: per-model and per-kind queues -----------------------------------------------------------------------


def test_the_plan_step_places_on_the_shipped_manifests_inventory(tmp_path: Path) -> None:
    # the trial's input: `heteroflow run --param device_inventory=examples/manifests/inventory.yaml` failed in plan
    placed = _plan(tmp_path, str(MANIFESTS_INVENTORY), train=["npu", "gpu", "cpu"], evaluate=["cpu:cpu=2,memory=4Gi"])
    assert placed["train"]["device_kind"] == "npu" and placed["train"]["nodes"] == ["npu-910b3-0"]
    assert placed["evaluate"]["nodes"] == ["cpu-0"]


def test_the_simulator_replays_on_the_shipped_manifests_inventory(tmp_path: Path) -> None:
    # the trial's input: `heteroflow simulate --trace ... --inventory examples/manifests/inventory.yaml`
    from heteroflow.pipelines.cli.main import app

    (tmp_path / "tp.csv").write_text("model,scale_factor,nvidia-a100-80gb,nvidia-t4,ascend-910b3\ntrain,4,36,10,28\n")
    (tmp_path / "jobs.csv").write_text("name,arrival_s,job_type,scale_factor,total_steps,queue\n"
                                       + "".join(f"j{i},0,train,4,36000,npu-training\n" for i in range(6)))
    result = CliRunner().invoke(app, ["simulate", "--trace", str(tmp_path / "jobs.csv"), "--inventory", str(MANIFESTS_INVENTORY),
                                      "--throughputs", str(tmp_path / "tp.csv"), "--policy", "static", "--explain", "20"])
    assert result.exit_code == 0, result.output
    assert "valid for placement" not in result.output
    # its guarantee, as the file writes it (cores and a memory quantity, not millicores and bytes)
    assert "(guarantee ascend-910b3=8, cpu=96, memory=768Gi; capability ascend-910b3=16)" in result.output


@pytest.mark.parametrize(("guarantee", "expected"), [
    ("{gpu: 2}", {"gpu": 2}),  # the trial's sibling: even a per-kind guarantee was refused
    ("{nvidia-t4: 2, cpu: 8, memory: 16Gi}", {"nvidia-t4": 2, "cpu": 8000, "memory": 16 * 2**30}),
    ("2", {"accelerators": 2}),  # the bare form, as before
])
def test_every_guarantee_form_is_placements(guarantee: str, expected: dict) -> None:
    inv = _placement(f"nodes:\n  - {{name: b, devices: {{nvidia-t4: 4}}}}\nqueues:\n  - {{name: q, guarantee: {guarantee}}}\n")
    assert inv.queues["q"].guaranteed() == expected


TWO_MODELS = """\
nodes:
  - {name: t4, devices: {nvidia-t4: 4}, cpu: 32, memory: 128Gi}
  - {name: v100, devices: {nvidia-v100: 4}, cpu: 32, memory: 128Gi}
queues:
  - {name: q, capability: {nvidia-t4: 2, cpu: 6, memory: 20Gi}}
  - {name: k, capability: {gpu: 3}}
"""


def test_a_per_model_capability_holds_that_model_only() -> None:
    state = PlacementState(_placement(TWO_MODELS))
    first = place_round([Job(name="j1", count=2, kind="gpu", queue="q", models=frozenset({"nvidia-t4"}))], state, "listed")[0]
    assert first.placed and first.model == "nvidia-t4"
    held = place_round([Job(name="j2", count=1, kind="gpu", queue="q", models=frozenset({"nvidia-t4"}))], state, "listed")[0]
    assert held.explanation == "j2 waits: queue q uses 2 nvidia-t4 device(s) of its capability.nvidia-t4=2, +1 would exceed it"
    other = place_round([Job(name="j3", count=4, kind="gpu", queue="q")], state, "listed")[0]
    assert other.placed and other.model == "nvidia-v100"  # the t4 limit leaves the v100s to it


def test_a_per_kind_capability_counts_every_model_of_the_kind() -> None:
    state = PlacementState(_placement(TWO_MODELS))
    assert place_round([Job(name="j1", count=2, kind="gpu", queue="k")], state, "listed")[0].placed
    held = place_round([Job(name="j2", count=2, kind="gpu", queue="k")], state, "listed")[0]
    assert held.explanation == "j2 waits: queue k uses 2 gpu device(s) of its capability.gpu=3, +2 would exceed it"


def test_cpu_and_memory_capabilities_hold_in_the_users_units() -> None:
    state = PlacementState(_placement(TWO_MODELS))
    big = Job(name="j", count=1, kind="gpu", queue="q", cpu_millicores=8000)
    assert place_round([big], state, "listed")[0].explanation == "j waits: queue q's capability.cpu=6 is below the 8 CPU it needs"
    mem = Job(name="m", count=0, kind="cpu", queue="q", memory_bytes=24 * 2**30)
    assert place_round([mem], state, "listed")[0].explanation == (
        "m waits: queue q's capability.memory=20Gi is below the 24Gi of memory it needs")


def test_a_per_model_guarantee_reserves_that_model_for_its_queue() -> None:
    inv = _placement("nodes:\n  - {name: t4, devices: {nvidia-t4: 4}}\n  - {name: v100, devices: {nvidia-v100: 4}}\n"
                     "queues:\n  - {name: prod, guarantee: {nvidia-t4: 3}}\n  - {name: batch, reclaimable: false}\n")
    state = PlacementState(inv)
    t4 = place_round([Job(name="b1", count=2, kind="gpu", queue="batch", models=frozenset({"nvidia-t4"}))], state, "listed")[0]
    assert t4.explanation == ("b1 waits: 4 nvidia-t4 device(s) free, 3 guaranteed to other queues, and queue batch is "
                              "not reclaimable")
    v100 = place_round([Job(name="b2", count=4, kind="gpu", queue="batch")], state, "listed")[0]
    assert v100.placed and v100.model == "nvidia-v100" and not v100.borrowed


@pytest.mark.parametrize("policy", ["throughput", "static", "least-loaded", "gavel"])
def test_the_simulator_keeps_a_per_model_capability_after_a_job_stops(policy: str) -> None:
    # sibling: the simulator gave back a finished job's devices to the queue's count of any model only
    from heteroflow.components.placement.policies import gavel_throughputs
    from heteroflow.pipelines.simulate import SimJob, simulate

    table = gavel_throughputs()
    kind = "ResNet-18 (batch size 32)"
    inv = _placement("nodes:\n  - {name: g, replicas: 2, devices: {model: v100, count: 4}}\n"
                     "queues:\n  - {name: team, capability: {nvidia-v100: 2}}\n")
    hours = 3600 * table.of(kind, 1)["nvidia-v100"]
    jobs = [SimJob(name=f"j{i}", arrival=0.0, job_type=kind, scale_factor=1, steps=hours * (1 + i), queue="team",
                   model="nvidia-v100") for i in range(4)]
    r = simulate(jobs, inv, table, policy)
    _times, busy = r.timeline
    assert busy.sum(axis=1).max() == pytest.approx(2.0) and len(r.finish) == 4


def test_the_replay_and_packing_keep_a_limit_of_every_device_and_name_one_they_cannot_keep() -> None:
    # siblings: the JCT replay and a packing policy count a queue's devices of any model
    from heteroflow.components.placement.packplan import cluster_of
    from heteroflow.components.placement.policies import gavel_throughputs
    from heteroflow.pipelines.jct import replay
    from heteroflow.pipelines.simulate import SimJob

    table = gavel_throughputs()
    kind = "ResNet-18 (batch size 32)"
    nodes = "nodes:\n  - {name: g, replicas: 2, devices: {model: v100, count: 4}, cpu: 32, memory: 64Gi}\n"
    every = _placement(nodes + "queues:\n  - {name: team, capability: {gpu: 2, cpu: 8, memory: 16Gi}}\n")
    jobs = [SimJob(name=f"j{i}", arrival=0.0, job_type=kind, scale_factor=1, steps=3600 * table.of(kind, 1)["nvidia-v100"],
                   queue="team", model="nvidia-v100") for i in range(4)]
    _times, busy = replay(jobs, every, table, "fifo", sigma=0.5, seed=0).timeline
    assert busy.sum(axis=1).max() == pytest.approx(2.0)
    assert cluster_of(every).queues["team"].capability == {"gpu_milli": 2000, "cpu_milli": 8000, "memory_mib": 16384}
    some = _placement(nodes + "  - {name: t, devices: {nvidia-t4: 4}, cpu: 8, memory: 16Gi}\n"
                              "queues:\n  - {name: team, capability: {nvidia-t4: 2}}\n")
    with pytest.raises(InvalidInventory, match=r"^q\.yaml: queue team: capability\.nvidia-t4=2 holds only some of the devices "
                                               r"here \(nvidia-t4, of nvidia-v100, nvidia-t4\), and the JCT replay counts"):
        replay(jobs, some, table, "fifo", sigma=0.5, seed=0)
    with pytest.raises(InvalidInventory, match=r"and a packing policy counts a queue's devices of any model"):
        cluster_of(some)


@pytest.mark.parametrize(("used", "t4", "v100"), [
    ('{"q": {"nvidia-t4": 2}}', False, True),  # the model is known: the v100s are free to it
    ('{"q": {"gpu": 2}}', False, True),  # a kind's devices count against its models' limits (which one is not known)
    ('{"q": 3}', False, False),  # a bare count: against every device limit (the old form)
    ('{"q": {"nvidia-v100": 2}}', True, True),
])
def test_the_queue_state_gives_use_per_model(used: str, t4: bool, v100: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sibling: a queue state could only say how many devices a queue uses, so a per-model limit counted all of them
    inventory = tmp_path / "q.yaml"
    inventory.write_text("version: 1\nnodes:\n  - {name: t4, devices: {nvidia-t4: 4}, cpu: 32, memory: 128Gi}\n"
                         "  - {name: v100, devices: {nvidia-v100: 4}, cpu: 32, memory: 128Gi}\n"
                         "queues:\n  - {name: q, capability: {nvidia-t4: 2, nvidia-v100: 3, gpu: 5}}\n")
    monkeypatch.setenv(QUEUE_STATE_ENV, f'{{"queue": "q", "used": {used}}}')
    check_plan_params(device_inventory=str(inventory))
    for model, fits in (("t4", t4), ("v100", v100)):
        placed = _plan(tmp_path, str(inventory), train=[f"gpu:accelerator={model}", "cpu"])["train"]
        assert (placed["index"] == 0) is fits, placed["passed_over"]


def test_a_queue_state_amount_is_named_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.placement.scoring import QueueState

    with pytest.raises(InvalidParameter, match=r"^s: used\['q'\]\.cpu='lots' is not"):
        QueueState.from_mapping({"used": {"q": {"cpu": "lots"}}}, source="s")
    state = QueueState.from_mapping({"used": {"q": {"t4": 2, "cpu": "500m", "memory": "1Gi"}}}, source="s")
    assert state.used == {"q": 2} and state.used_by == {"q": {"nvidia-t4": 2, "cpu": 500, "memory": 2**30}}


# --- B: CPU pods on accelerator nodes ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["throughput", "listed", "least-loaded", "power-aware", "static"])
def test_a_cpu_step_runs_on_a_gpu_node_when_no_node_is_cpu_only(tmp_path: Path, policy: str) -> None:
    # the trial's input: cheap2.yaml, `-c gpu -c cpu`: 'step evaluate: no candidate can run on the node inventory'
    inventory = tmp_path / "cheap2.yaml"
    inventory.write_text(CHEAP2.replace("policy: throughput", f"policy: {policy}"))
    placed = _plan(tmp_path, str(inventory), train=["gpu", "cpu"], evaluate=["cpu:cpu=2,memory=4Gi"])
    assert placed["train"]["device_kind"] == "gpu"
    evaluate = placed["evaluate"]
    assert evaluate["device_kind"] == "cpu" and evaluate["nodes"][0] in ("a", "b")
    assert "the inventory lists no node without accelerators" in evaluate["explanation"]
    assert evaluate["pod"]["requests"] == {"cpu": "2", "memory": "4Gi"}


def test_a_cpu_only_node_is_preferred_and_a_cpu_job_needs_cpu_free() -> None:
    inv = _placement("nodes:\n  - {name: g, devices: {nvidia-t4: 4}, cpu: 32, memory: 64Gi}\n"
                     "  - {name: c, cpu: 4, memory: 16Gi}\n")
    state = PlacementState(inv)
    small = place_round([Job(name="s", count=0, kind="cpu", cpu_millicores=2000)], state, "listed")[0]
    assert small.node_names == ("c",)
    big = place_round([Job(name="b", count=0, kind="cpu", cpu_millicores=8000)], state, "listed")[0]
    assert big.node_names == ("g",) and "no node without accelerators has room" in big.explanation
    huge = place_round([Job(name="h", count=0, kind="cpu", cpu_millicores=64000)], state, "listed")[0]
    assert not huge.placed and huge.explanation.startswith("h waits: no node has 64 CPU and 0 of memory free")


def test_a_cpu_job_that_fits_nowhere_names_the_most_cpu_a_stating_node_has_free() -> None:
    """A node that states no CPU stands in with a huge free amount (not checked): it was named as the most CPU free
    ('most CPU free: 2305843009213693.951') when memory held the job everywhere."""
    inv = _placement("nodes:\n  - {name: c, cpu: 4, memory: 4Gi}\n  - {name: m, memory: 2Gi}\n")
    (held,) = place_round([Job(name="j", count=0, kind="cpu", cpu_millicores=1000, memory_bytes=8 * 2**30)], PlacementState(inv), "listed")
    assert not held.placed and held.explanation.endswith("(most CPU free: 4)"), held.explanation
    none = _placement("nodes:\n  - {name: m, memory: 2Gi}\n")
    (held,) = place_round([Job(name="j", count=0, kind="cpu", memory_bytes=8 * 2**30)], PlacementState(none), "listed")
    assert held.explanation.endswith("(most CPU free: not stated)"), held.explanation


def test_a_step_asking_for_no_device_is_not_held_by_a_device_capability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the trial's input: `queue team-a uses 6 of its capability 4, +0 would exceed it`
    inventory = tmp_path / "q.yaml"
    inventory.write_text(CHEAP2 + "queues:\n  - {name: team-a, guarantee: 2, capability: 4}\n")
    monkeypatch.setenv(QUEUE_STATE_ENV, '{"queue": "team-a", "used": {"team-a": 6}}')
    placed = _plan(tmp_path, str(inventory), train=["gpu", "cpu"], evaluate=["cpu:cpu=2,memory=4Gi"])
    assert placed["train"]["device_kind"] == "cpu"  # the gpu candidate is held: 6 + 1 > 4
    assert "queue team-a uses 6 of its capability 4, +1 would exceed it" in placed["train"]["passed_over"][0]
    assert placed["evaluate"]["device_kind"] == "cpu"


# --- C: mixed candidates -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("inventory", "candidate", "chosen", "reason"), [
    # the trial's inputs
    ('{"gpu": 4}', "gpu+npu", 1, "needs 1 npu device(s); 0 npu device(s) here"),
    ('{"npu": 4}', "gpu+npu", 1, "needs 1 gpu device(s); 0 gpu device(s) here"),
    ('{"gpu": 0, "npu": 2}', "gpu+npu:count=4", 1,
     "needs 1 gpu device(s); device_inventory lists 0 gpu device(s); and needs 4 npu device(s); 2 npu device(s) here"),
    # siblings: both kinds there; a group's model
    ('{"gpu": 2, "npu": 2}', "gpu:count=2+npu:count=2", 0, ""),
    ('{"gpu": {"t4": 2}, "npu": 2}', "gpu:accelerator=a100+npu", 1, "needs 1 x any NVIDIA A100 on one model; here: 2 gpu"),
])
def test_every_replica_group_of_a_mixed_candidate_is_checked(inventory: str, candidate: str, chosen: int, reason: str) -> None:
    placement = plan(Candidates([candidate, "cpu"]), inventory=Inventory.from_json(inventory))
    assert placement.index == chosen
    if reason:
        assert reason in placement.passed_over[0]
    else:
        assert placement.explanation.endswith("; 2 gpu device(s); 2 npu device(s)")


MIXED_NODES = """\
version: 1
nodes:
  - {name: g, devices: {nvidia-t4: 4}, cpu: 32, memory: 128Gi}
  - {name: n, devices: {ascend-910b3: 2}, cpu: 32, memory: 128Gi}
"""


def test_a_mixed_candidate_on_a_node_inventory_places_every_group(tmp_path: Path) -> None:
    inventory = tmp_path / "mixed.yaml"
    inventory.write_text(MIXED_NODES)
    placed = _plan(tmp_path, str(inventory), train=["gpu:count=2+npu:count=2", "cpu"])["train"]
    assert placed["index"] == 0 and placed["nodes"] == ["g", "n"]
    short = _plan(tmp_path, str(inventory), train=["gpu+npu:count=4", "cpu"])["train"]
    assert short["index"] == 1
    assert "its npu x4 replicas: needs 4 free device(s) of one model among ascend-910b3; most free: 2" in short["passed_over"][0]
    gpu_only = tmp_path / "gpu.yaml"
    gpu_only.write_text(CHEAP2)
    assert _plan(tmp_path, str(gpu_only), train=["gpu+npu", "cpu"])["train"]["index"] == 1  # was placed on gpu+npu


def test_a_mixed_candidate_under_a_packing_policy_places_every_group(tmp_path: Path) -> None:
    # sibling: FGD and the other packing policies turned a candidate into its first group's request only
    inventory = tmp_path / "mixed.yaml"
    inventory.write_text(MIXED_NODES.replace("version: 1", "version: 1\npolicy: bestfit"))
    short = _plan(tmp_path, str(inventory), train=["gpu+npu:count=4", "cpu"])["train"]
    assert short["index"] == 1 and "its npu x4 replicas: " in short["passed_over"][0]
    placed = _plan(tmp_path, str(inventory), train=["gpu:count=2+npu:count=2", "cpu"])["train"]
    assert placed["index"] == 0 and placed["nodes"] == ["g", "n"]


# --- D: found before the run ---------------------------------------------------------------------------------


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    from heteroflow.pipelines.cli.main import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--engine", "inprocess", *args])
    return result.exit_code, result.output


def test_a_packing_inventory_node_without_memory_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = tmp_path / "sg_nomem.yaml"
    inventory.write_text("version: 1\npolicy: fgd\nnodes:\n  - {name: sg-t4, replicas: 3, devices: {model: t4, count: 2}, cpu: 32}\n")
    code, output = _run(tmp_path, monkeypatch, "--param", f"device_inventory={inventory}", "-c", "gpu:device_share=0.5", "-c", "cpu")
    assert code == 2, output
    assert output == (f"error: {inventory}: node 'sg-t4-0' states no memory; a packing policy places by CPU, memory and "
                      "device shares: give each node cpu and memory, or name a placement policy (e.g. policy: throughput)\n")
    assert not (tmp_path / "heteroflow-runs").exists()


QA = "version: 1\nnodes:\n  - {name: a, devices: {nvidia-v100: 4}, cpu: 32, memory: 128Gi}\nqueues:\n  - {name: team-a, guarantee: 2, capability: 4}\n"


@pytest.mark.parametrize(("state", "message"), [
    ("not json", "HETEROFLOW_QUEUE_STATE='not json' is neither JSON nor a readable file (No such file or directory); valid: "
                 'inline JSON like {"queue": "team-a", "used": {"team-a": 6}}, or the path of a file holding it'),
    ('{"queue":"team-b"}', "HETEROFLOW_QUEUE_STATE: queue='team-b' is not in INV; valid: default, team-a"),
    ('{"used": -3}', "HETEROFLOW_QUEUE_STATE='{\"used\": -3}': used=-3 is not an object of queue -> devices in use"),
    ('{"used": {"team-a": -3}}', "HETEROFLOW_QUEUE_STATE='{\"used\": {\"team-a\": -3}}': used['team-a']=-3 is not a device "
                                 "count; valid: an integer >= 0, or amounts per model, device kind, cpu and memory "
                                 '({"nvidia-t4": 2, "cpu": 8})'),
], ids=["not-json", "unknown-queue", "used-negative", "used-count-negative"])
def test_a_bad_queue_state_is_refused_before_the_run(state: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = tmp_path / "qa.yaml"
    inventory.write_text(QA)
    monkeypatch.setenv(QUEUE_STATE_ENV, state)
    code, output = _run(tmp_path, monkeypatch, "--param", f"device_inventory={inventory}")
    assert code == 2, output
    assert output == f"error: {message.replace('INV', str(inventory))}\n"
    assert not (tmp_path / "heteroflow-runs").exists()
    with pytest.raises(InvalidParameter):  # the step, run on its own (KFP, Airflow), says the same
        _plan(tmp_path, str(inventory), train=["gpu"])


def test_a_queue_state_may_list_queues_the_inventory_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review: a state naming a queue the inventory does not list in ``used`` (Volcano's ``root``, as a state
    copied from a live cluster does) was refused before the run (exit 2), where it ran before the check was added.
    It limits nothing here; the run's own queue must still be the inventory's (the test above)."""
    inventory = tmp_path / "qa.yaml"
    inventory.write_text(QA)
    monkeypatch.setenv(QUEUE_STATE_ENV, '{"queue": "team-a", "used": {"root": 3, "team-a": 1}}')
    check_plan_params(device_inventory=str(inventory))
    placed = _plan(tmp_path, str(inventory), train=["gpu"])
    assert placed["train"]["index"] == 0 and placed["train"]["device_kind"] == "gpu", placed
    monkeypatch.setenv(QUEUE_STATE_ENV, '{"queue": "team-a", "used": {"root": 3, "team-a": 4}}')  # team-a's own use still counts
    (tmp_path / "full").mkdir()
    assert _plan(tmp_path / "full", str(inventory), train=["gpu", "cpu"])["train"]["index"] == 1


def test_the_count_form_does_not_read_the_queue_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(QUEUE_STATE_ENV, "not json")
    check_plan_params(device_inventory='{"gpu": 1}')  # queues are a node inventory's


def test_a_node_without_a_name_says_it_has_none() -> None:
    with pytest.raises(InvalidInventory, match=r"^inv: nodes\[0\] has no name; valid: name: a non-empty string"):
        from_mapping({"nodes": [{"devices": {"t4": 1}}]}, source="inv")
    with pytest.raises(InvalidInventory, match=r"^inv: nodes\[0\]\.name=3; valid: a non-empty string"):
        from_mapping({"nodes": [{"name": 3}]}, source="inv")


def test_manifests_says_which_capacity_the_inventory_lacks(tmp_path: Path) -> None:
    from heteroflow.pipelines.cli.main import app

    inventory = tmp_path / "inv.yaml"
    inventory.write_text("nodes:\n  - {name: a, devices: {nvidia-t4: 2}, memory: 64Gi}\n")
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(inventory), "--profile",
                                      str(ROOT / "examples" / "profiles" / "nvidia-gfd.yaml"), "-o", str(tmp_path / "out")])
    assert "note: no kueue.yaml: the inventory states no CPU capacity" in result.output, result.output


def test_no_candidate_error_still_names_each_candidate(tmp_path: Path) -> None:
    inventory = tmp_path / "gpu.yaml"
    inventory.write_text("version: 1\nnodes:\n  - {name: a, devices: {nvidia-v100: 1}, cpu: 1, memory: 1Gi}\n")
    with pytest.raises(NoCandidateAvailable, match=r"candidate 0 \(cpu, 2 CPU, 4Gi\): no node has 2 CPU and 4Gi of memory free"):
        _plan(tmp_path, str(inventory), evaluate=["cpu:cpu=2,memory=4Gi"])


# --- the calls of one plan run at different times: CPU and memory are not held across them -------------------

G8 = "nodes:\n  - {name: g0, devices: {nvidia-t4: 4}, cpu: 8, memory: 64Gi}\n"


@pytest.mark.parametrize("policy", ["", "policy: bestfit\n"])
def test_evaluates_cpu_is_not_held_against_trains(tmp_path: Path, policy: str) -> None:
    # the review's input: `-c gpu:cpu=8 -c cpu` on one T4 node with 8 CPU; evaluate, placed first, kept its CPU
    # and train fell back to cpu ('most free: 0; nodes with devices free lack its 8 CPU')
    inventory = tmp_path / "g8.yaml"
    inventory.write_text(policy + G8)
    placed = _plan(tmp_path, str(inventory), evaluate=["cpu:cpu=2,memory=4Gi"], train=["gpu:cpu=8", "cpu"])
    assert placed["evaluate"]["device_kind"] == "cpu"
    assert placed["train"]["device_kind"] == "gpu" and placed["train"]["nodes"] == ["g0"]
    assert placed["train"]["passed_over"] == []


def test_devices_still_stay_taken_across_the_calls_of_a_plan(tmp_path: Path) -> None:
    inventory = tmp_path / "g8.yaml"
    inventory.write_text(G8)
    placed = _plan(tmp_path, str(inventory), a=["gpu:count=4,cpu=1"], b=["gpu:count=1,cpu=1", "cpu"])
    assert placed["a"]["device_kind"] == "gpu" and placed["b"]["device_kind"] == "cpu"


def test_most_free_counts_the_devices_a_nodes_cpu_holds(tmp_path: Path) -> None:
    inventory = tmp_path / "g4.yaml"
    inventory.write_text(G8.replace("cpu: 8", "cpu: 4"))
    placed = _plan(tmp_path, str(inventory), train=["gpu:cpu=8", "cpu"])
    assert placed["train"]["device_kind"] == "cpu"
    assert "most free: 4; nodes with devices free lack its 8 CPU" in placed["train"]["passed_over"][0]


# --- CPU and memory per pod: a mixed group's replicas, a multi-node candidate's workers ----------------------

TWO = ("nodes:\n  - {name: g0, devices: {nvidia-t4: 4}, cpu: 32, memory: 64Gi}\n"
       "  - {name: g1, devices: {nvidia-t4: 4}, cpu: 32, memory: 64Gi}\n  - {name: c0, cpu: 32, memory: 64Gi}\n")


@pytest.mark.parametrize("policy", ["", "policy: bestfit\n"])
def test_a_mixed_groups_cpu_is_asked_per_replica_pod_on_the_node_it_runs_on(tmp_path: Path, policy: str) -> None:
    # the review's input: `-c 'gpu:count=8,cpu=6+cpu' -c cpu`: 'lack its 48 CPU or 16Gi of memory' (every node was
    # asked for all 8 replicas' CPU), and bestfit's 'its gpu x8 replicas: no node ... has 8 devices (most: 4)'
    inventory = tmp_path / "two.yaml"
    inventory.write_text(policy + TWO)
    placed = _plan(tmp_path, str(inventory), train=["gpu:count=8,cpu=6+cpu", "cpu"], evaluate=["cpu"])
    assert placed["train"]["index"] == 0 and placed["train"]["passed_over"] == []
    assert {"g0", "g1"} <= set(placed["train"]["nodes"])


def test_a_mixed_group_takes_per_node_its_replicas_cpu_there() -> None:
    state = PlacementState(_placement(TWO))
    placed = plan_on_nodes("train", Candidates([Resources.parse_spec("gpu:count=8,cpu=6+cpu")]), state)
    assert placed.nodes == ("g0", "g1", "c0")
    assert state.free.tolist() == [0, 0, 0] and state.cpu_free.tolist() == [8000, 8000, 31000]  # 4 pods x 6 CPU a node


def test_a_mixed_group_gets_only_the_pods_the_nodes_cpu_holds() -> None:
    state = PlacementState(_placement(TWO.replace("cpu: 32", "cpu: 16")))
    with pytest.raises(NoCandidateAvailable, match=r"most free: 8; pods of 1 device\(s\), 6 CPU and 2Gi of memory each: "
                                                   r"the nodes hold 4 device\(s\) of them"):
        plan_on_nodes("train", Candidates([Resources.parse_spec("gpu:count=8,cpu=6+cpu")]), state)


def test_a_multi_node_candidate_takes_distinct_nodes_each_with_its_cpu() -> None:
    # the review's input: gpu:count=1,nodes=2,cpu=10 was placed on g0 alone, its CPU taken once: ('g0',) [6000 16000]
    n2 = "nodes:\n  - {name: g0, devices: {nvidia-t4: 4}, cpu: 16, memory: 64Gi}\n  - {name: g1, devices: {nvidia-t4: 4}, cpu: 16, memory: 64Gi}\n"
    state = PlacementState(_placement(n2))
    placed = plan_on_nodes("train", Candidates([Resources.parse_spec("gpu:count=1,nodes=2,cpu=10")]), state)
    assert placed.nodes == ("g0", "g1")
    assert state.cpu_free.tolist() == [6000, 6000] and state.free.tolist() == [3, 3]
    with pytest.raises(NoCandidateAvailable, match=r"pods of 1 device\(s\), 10 CPU and 2Gi of memory each on distinct nodes: "
                                                   r"the nodes hold 2 device\(s\) of them"):
        plan_on_nodes("train", Candidates([Resources.parse_spec("gpu:count=1,nodes=3,cpu=10")]), PlacementState(_placement(n2)))
