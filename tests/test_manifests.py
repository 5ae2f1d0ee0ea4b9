"""Queue, flavor and training-job manifests (heteroflow.pipelines.k8s.manifests, `heteroflow manifests`).

- Every manifest validates against its real schema: the shipped CRDs (Volcano v1.15.1, Kueue v0.19.2, Kubeflow
  Trainer v1.9.4 / v2.3.0) with unknown fields rejected, and kubernetes-validate for the core pod templates.
- A golden file per example profile (tests/golden/manifests_<profile>.yaml) for the example inventory
  (examples/manifests/inventory.yaml). After an intended change, regenerate with
  ``HETEROFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_manifests.py -k golden`` and review the diff.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from heteroflow.cache.errors import InvalidCacheOption
from heteroflow.components.devices.cluster import DEFAULT_PROFILE, load_profile
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Candidates
from heteroflow.pipelines.k8s.manifests import (
    CPU_FLAVOR,
    ClusterInventory,
    InvalidInventory,
    flavor_order,
    kueue_manifests,
    load_inventory,
    render_all,
    training_job_manifests,
    validate,
    volcano_queues,
)

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "examples" / "manifests" / "inventory.yaml"
PROFILES = ROOT / "examples" / "profiles"
GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_GOLDEN_ENV = "HETEROFLOW_UPDATE_GOLDEN"
CANDIDATES = ["npu:accelerator=910b3", "gpu:accelerator=a100-80gb", "gpu:accelerator=t4", "cpu:cpu=8"]
PROFILE_NAMES = sorted(p.stem for p in PROFILES.glob("*.yaml"))


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _cq(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == name)


# --- golden files and schemas --------------------------------------------------------------------------------


def _render(profile_name: str, training_job: str = "trainjob") -> dict[str, list[dict[str, Any]]]:
    profile = dataclasses.replace(load_profile(PROFILES / f"{profile_name}.yaml"), training_job=training_job)
    return render_all(load_inventory(INVENTORY), Candidates(CANDIDATES), profile, workers=2, image="registry.example.com/heteroflow:train")


@pytest.mark.parametrize("profile_name", PROFILE_NAMES)
def test_golden_manifests_per_profile(profile_name: str) -> None:
    data = {"trainjob": _render(profile_name), "pytorchjob": _render(profile_name, "pytorchjob")}
    data = json.loads(json.dumps(data))
    golden = GOLDEN_DIR / f"manifests_{profile_name}.yaml"
    if os.environ.get(UPDATE_GOLDEN_ENV) == "1":
        header = (
            f"# render_all(examples/manifests/inventory.yaml, {CANDIDATES}, examples/profiles/{profile_name}.yaml) with\n"
            f"# training_job trainjob and pytorchjob. Regenerate: {UPDATE_GOLDEN_ENV}=1 .venv/bin/pytest tests/test_manifests.py -k golden\n"
        )
        golden.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
    expected = yaml.safe_load(golden.read_text())
    assert set(data) == set(expected)
    for job_kind in expected:
        assert list(data[job_kind]) == list(expected[job_kind])
        for name in expected[job_kind]:
            assert data[job_kind][name] == expected[job_kind][name], f"{profile_name}/{job_kind}/{name} differs from {golden.name}"


@pytest.mark.parametrize("profile_name", PROFILE_NAMES)
@pytest.mark.parametrize("training_job", ["trainjob", "pytorchjob"])
def test_every_manifest_kind_validates(profile_name: str, training_job: str) -> None:
    files = _render(profile_name, training_job)
    docs = [d for ds in files.values() for d in ds]
    for d in docs:
        validate(d)
    kinds = {d["kind"] for d in docs}
    assert {"Queue", "ResourceFlavor", "ClusterQueue", "LocalQueue"} <= kinds
    assert ("TrainJob" if training_job == "trainjob" else "PyTorchJob") in kinds


@pytest.mark.parametrize(
    ("kind", "path", "typo"),
    [
        ("ClusterQueue", ("spec",), "flavorFungibilty"),
        ("Queue", ("spec",), "reclaimabel"),
        ("ResourceFlavor", ("spec",), "nodeLabel"),
        ("LocalQueue", ("spec",), "clusterQueu"),
        ("TrainJob", ("spec", "trainer"), "numNode"),
        ("PodGroup", ("spec",), "minMembr"),
    ],
)
def test_unknown_fields_are_rejected(kind: str, path: tuple[str, ...], typo: str) -> None:
    docs = [d for ds in _render("ascend-official").values() for d in ds]
    doc = copy.deepcopy(next(d for d in docs if d["kind"] == kind))
    target = doc
    for key in path:
        target = target[key]
    target[typo] = 1
    with pytest.raises(InvalidCacheOption, match=typo):
        validate(doc)


def test_pytorchjob_pod_template_is_checked_as_a_core_pod_template() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    job = _render("nvidia-gfd", "pytorchjob")["train-1-gpu.yaml"][-1]
    validate(job)
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "lots"
    with pytest.raises((kubernetes_validate.ValidationError, InvalidCacheOption)):
        validate(bad)


# --- Kueue: flavors in candidate order, quotas ----------------------------------------------------------------


def test_cluster_queue_flavor_order_equals_candidate_order() -> None:
    inv = load_inventory(INVENTORY)
    for order in (CANDIDATES, ["gpu:accelerator=t4", "gpu:accelerator=a100-80gb", "npu:accelerator=910b3"]):
        expected = [
            {"npu:accelerator=910b3": "ascend-910b3", "gpu:accelerator=a100-80gb": "nvidia-a100-80gb", "gpu:accelerator=t4": "nvidia-t4"}[c]
            for c in order
            if not c.startswith("cpu")
        ]
        docs = kueue_manifests(inv, Candidates(order), DEFAULT_PROFILE)
        for cq in _by_kind(docs, "ClusterQueue"):
            cpu_group, accel_group = cq["spec"]["resourceGroups"]
            assert [f["name"] for f in cpu_group["flavors"]] == [CPU_FLAVOR]
            assert [f["name"] for f in accel_group["flavors"]] == expected, cq["metadata"]["name"]
            assert cq["spec"]["flavorFungibility"] == {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"}
            for f in accel_group["flavors"]:  # Kueue: each flavor lists the covered resources, in order
                assert [r["name"] for r in f["resources"]] == accel_group["coveredResources"]


def test_family_candidate_expands_to_its_models_in_the_inventory() -> None:
    inv = load_inventory(INVENTORY)
    # the default train candidates: any Ascend 910, else any NVIDIA, else 8 CPUs
    assert flavor_order(Candidates(["npu", "gpu", "cpu:cpu=8"]), inv) == ["ascend-910b3", "nvidia-t4", "nvidia-a100-80gb", CPU_FLAVOR]
    # models no candidate names come last, so queues keep their quota usable
    assert flavor_order(Candidates(["gpu:accelerator=t4"]), inv) == ["nvidia-t4", "nvidia-a100-80gb", "ascend-910b3"]


def test_quotas_guarantee_capability_reclaimable_and_shared_remainder() -> None:
    inv = load_inventory(INVENTORY)
    docs = kueue_manifests(inv, Candidates(CANDIDATES), DEFAULT_PROFILE)

    def quota(cq: dict[str, Any], flavor: str) -> dict[str, Any]:
        res = cq["spec"]["resourceGroups"][1]
        f = next(f for f in res["flavors"] if f["name"] == flavor)
        own = "huawei.com/Ascend910" if flavor.startswith("ascend") else "nvidia.com/gpu"
        others = [r for r in f["resources"] if r["name"] != own]
        assert all(r == {"name": r["name"], "nominalQuota": 0} for r in others)  # nothing of another vendor's resource
        return next(r for r in f["resources"] if r["name"] == own)

    assert quota(_cq(docs, "npu-training"), "ascend-910b3") == {"name": "huawei.com/Ascend910", "nominalQuota": 8, "borrowingLimit": 8}
    # gpu-training's kind-level 10 GPUs: a100 first (candidate order), up to what vision's 4 leave free
    assert quota(_cq(docs, "gpu-training"), "nvidia-a100-80gb")["nominalQuota"] == 10
    assert quota(_cq(docs, "gpu-training"), "nvidia-t4")["nominalQuota"] == 0
    # reclaimable: false -> it never borrows, so nothing of it can be reclaimed
    assert quota(_cq(docs, "vision"), "nvidia-a100-80gb") == {"name": "nvidia.com/gpu", "nominalQuota": 4, "borrowingLimit": 0}
    shared = _cq(docs, "heteroflow-shared")
    assert quota(shared, "nvidia-a100-80gb")["nominalQuota"] == 16 - 10 - 4
    assert quota(shared, "nvidia-t4")["nominalQuota"] == 4
    assert quota(shared, "ascend-910b3")["nominalQuota"] == 8
    total_cpu = sum(int(cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]) for cq in _by_kind(docs, "ClusterQueue"))
    assert total_cpu == 96 * 2 + 48 + 192 * 2 + 128  # the cohort's nominal quotas add up to the cluster
    assert {(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in _by_kind(docs, "LocalQueue")} == {
        ("ml", "npu-training"),
        ("ml", "gpu-training"),
        ("team-vision", "vision"),
    }


def test_resource_flavor_labels_follow_the_profile() -> None:
    inv = load_inventory(INVENTORY)

    def labels(profile_name: str) -> dict[str, Any]:
        docs = kueue_manifests(inv, Candidates(CANDIDATES), load_profile(PROFILES / f"{profile_name}.yaml"))
        return {d["metadata"]["name"]: d["spec"].get("nodeLabels") for d in _by_kind(docs, "ResourceFlavor")}

    assert labels("nvidia-gfd")["nvidia-t4"] == {"nvidia.com/gpu.product": "Tesla-T4"}
    assert labels("kueue-gke")["nvidia-t4"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    assert labels("ascend-official")["ascend-910b3"] == {"node.kubernetes.io/npu.chip.name": "910B3"}
    assert labels("ascend-hami")["ascend-910b3"] is None  # HAMi's huawei.com/Ascend910B3 picks the chip


def _kueue_transform(requests: dict[str, int], transformations: list[dict[str, Any]]) -> dict[str, int]:
    """What Kueue counts of a pod's requests under its ``resources.transformations`` (Kueue's ResourceTransformation:
    ``Replace`` drops the input, each output is the input times the ``multiplyBy`` resource's amount)."""
    out = dict(requests)
    for t in transformations:
        if t["input"] in requests:
            amount = requests[t["input"]] * requests.get(t.get("multiplyBy", ""), 1)
            if t["strategy"] == "Replace":
                del out[t["input"]]
            for name, factor in t["outputs"].items():
                out[name] = out.get(name, 0) + amount * int(factor)
    return out


@pytest.mark.parametrize("share", ["gpu:accelerator=t4,device_share=0.5", "gpu:accelerator=t4,device_share=0.25,device_memory=4Gi"])
def test_kueue_under_hami_covers_and_admits_a_gpu_share(tmp_path: Path, share: str) -> None:
    """A HAMi share asks for nvidia.com/gpucores and gpumem(-percentage) beside nvidia.com/gpu: with only
    nvidia.com/gpu covered, Kueue never admitted it. The ClusterQueues cover the totals Kueue's HAMi guide counts."""
    from heteroflow.components.devices.podplan import share_resources
    from heteroflow.components.resources import Resources
    from heteroflow.pipelines.k8s.manifests import HAMI_KUEUE_TOTALS, HAMI_KUEUE_TRANSFORMATIONS

    (tmp_path / "p.yaml").write_text("version: 1\nname: nvidia-hami\nvendors:\n  nvidia:\n    plugin: hami\n")
    hami = load_profile(tmp_path / "p.yaml")
    inv = load_inventory(INVENTORY)
    docs = kueue_manifests(inv, Candidates([share, "gpu:accelerator=a100-80gb", "cpu:cpu=8"]), hami)
    for doc in docs:
        validate(doc)
    asked = {k: int(v) for k, v in share_resources(Resources.parse_spec(share), hami).items()}
    assert "nvidia.com/gpucores" in asked
    counted = _kueue_transform(asked, HAMI_KUEUE_TRANSFORMATIONS["resources"]["transformations"])
    assert counted == {"nvidia.com/gpu": 1, "nvidia.com/total-gpucores": asked["nvidia.com/gpucores"],
                       **({"nvidia.com/total-gpumem": 4096} if "device_memory" in share else
                          {"nvidia.com/total-gpumem-percentage": asked["nvidia.com/gpumem-percentage"]})}

    group = _cq(docs, "gpu-training")["spec"]["resourceGroups"][1]
    assert set(counted) <= set(group["coveredResources"])  # each name Kueue counts is covered: it can be admitted
    gpu_q = {f["name"]: {r["name"]: r for r in f["resources"]} for f in group["flavors"]}
    # gpu-training's 10 guaranteed GPUs go to the T4 flavor first (candidate order): all 4 of the T4 node, each
    # 100 cores and 100 memory percent, and 16384 MiB (its data sheet)
    t4 = gpu_q["nvidia-t4"]
    assert {name: t4[name]["nominalQuota"] for name in ("nvidia.com/gpu", *HAMI_KUEUE_TOTALS.values())} == {
        "nvidia.com/gpu": 4, "nvidia.com/total-gpucores": 400, "nvidia.com/total-gpumem": 4 * 16384,
        "nvidia.com/total-gpumem-percentage": 400}
    assert all(counted[name] <= t4[name]["nominalQuota"] for name in counted)
    # a borrowing limit scales alike; the Ascend flavor counts none of them
    a100 = gpu_q["nvidia-a100-80gb"]
    assert a100["nvidia.com/gpu"]["nominalQuota"] == 6
    assert a100["nvidia.com/total-gpucores"] == {"name": "nvidia.com/total-gpucores", "nominalQuota": 600,
                                                "borrowingLimit": 100 * a100["nvidia.com/gpu"]["borrowingLimit"]}
    assert a100["nvidia.com/total-gpumem"]["nominalQuota"] == 6 * 81920
    assert all(gpu_q["ascend-910b3"][name]["nominalQuota"] == 0 for name in HAMI_KUEUE_TOTALS.values())
    shared = {f["name"]: {r["name"]: r for r in f["resources"]} for f in _cq(docs, "heteroflow-shared")["spec"]["resourceGroups"][1]["flavors"]}
    assert shared["nvidia-a100-80gb"]["nvidia.com/total-gpucores"]["nominalQuota"] == 100 * (16 - 6 - 4)
    # the command writes them and says what Kueue's own configuration needs (the transformations above)
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    result = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "--profile", str(tmp_path / "p.yaml"),
                                      "-c", share, "-c", "cpu", "--image", "img", "-o", str(tmp_path / "out")],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "ConfigMap kueue-manager-config" in result.output
    noted = yaml.safe_load(result.output[result.output.index("resources:"):])
    assert noted == HAMI_KUEUE_TRANSFORMATIONS
    # the official plugin cannot share: its queues cover the devices alone, as before
    plain = _cq(kueue_manifests(inv, Candidates(CANDIDATES), DEFAULT_PROFILE), "heteroflow-shared")["spec"]["resourceGroups"][1]
    assert not set(HAMI_KUEUE_TOTALS.values()) & set(plain["coveredResources"])


# --- Volcano queues and gang-scheduled jobs ------------------------------------------------------------------


def test_volcano_queues() -> None:
    queues = {q["metadata"]["name"]: q["spec"] for q in volcano_queues(load_inventory(INVENTORY), load_profile(PROFILES / "ascend-official.yaml"))}
    assert queues["npu-training"] == {
        "weight": 1,
        "reclaimable": True,
        "capability": {"huawei.com/Ascend910": "16"},
        "guarantee": {"resource": {"cpu": "96", "huawei.com/Ascend910": "8", "memory": "768Gi"}},
    }
    assert queues["gpu-training"]["guarantee"]["resource"]["nvidia.com/gpu"] == "10"
    assert queues["vision"]["reclaimable"] is False


def test_gang_scheduling_per_profile_and_job_kind() -> None:
    official = dataclasses.replace(load_profile(PROFILES / "ascend-official.yaml"), training_job="trainjob")
    pg, job = training_job_manifests("npu:accelerator=910b3,count=8", workers=4, name="t", profile=official)
    assert (pg["kind"], pg["spec"]["minMember"], pg["spec"]["queue"]) == ("PodGroup", 4, "default")
    assert pg["spec"]["minResources"]["huawei.com/Ascend910"] == "32"
    assert (job["spec"]["trainer"]["numNodes"], job["spec"]["trainer"]["numProcPerNode"]) == (4, 8)
    pod_meta = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
    assert pod_meta["annotations"]["scheduling.k8s.io/group-name"] == "t"

    (pj,) = training_job_manifests(
        "npu:accelerator=910b3,count=8", workers=4, name="t", profile=dataclasses.replace(official, training_job="pytorchjob")
    )
    assert pj["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4, "queue": "default"}
    assert (pj["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"], pj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]) == (1, 3)
    assert pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["schedulerName"] == "volcano"

    kueue = load_profile(PROFILES / "kueue-gke.yaml")
    (kj,) = training_job_manifests("gpu:accelerator=t4,count=2", workers=2, name="k", profile=kueue, image="img")
    assert kj["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-ml"}  # Kueue admits the whole job
    for d in (pg, job, pj, kj):
        validate(d)


# --- bad input ---------------------------------------------------------------------------------------------


BAD_INVENTORIES = [
    ({"nodes": [{"name": "a", "devices": {"nvidia-z9000": 1}}]}, r"nvidia-z9000"),
    ({"nodes": [{"name": "a", "devices": {"t4": -1}}]}, r"nodes\[0\]\.devices\.t4=-1 is not a device count; valid: an integer >= 0"),
    ({"nodes": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}, r"nodes\[2\]\.name='a' duplicates nodes\[0\]"),
    (
        {"nodes": [{"name": "a", "devices": {"t4": 4}}], "queues": [{"name": "q1", "guarantee": {"t4": 3}}, {"name": "q2", "guarantee": {"t4": 2}}]},
        r"queues guarantee 5 of nvidia-t4 \(q1: 3, q2: 2\), above the capacity 4",
    ),
    (
        {"gpu": {"t4": 4, "a100-80gb": 2}, "queues": [{"name": "q", "guarantee": {"gpu": 7}}]},
        r"queues guarantee 7 of gpu \(q: 7\), above the capacity 6",
    ),
    ({"cpu_cores": 8, "queues": [{"name": "q", "guarantee": {"cpu": 12}}]}, r"12 of cpu .* above the capacity 8"),
    ({"gpu": {"t4": 4}, "queues": [{"name": "q", "guarantee": {"t4": 3}, "capability": {"t4": 2}}]}, r"guarantee\.nvidia-t4=3 is above its capability"),
    ({"gpu": {"nvidia-gpu": 4}}, r"a family .*one model"),
    ({"npu": {"t4": 1}}, r"is a gpu model, not a npu one"),
    ({"nodes": [], "gpus": 3}, r"unknown field 'gpus'.*valid: version, nodes, queues"),
    ({"gpu": 2, "queues": [{"name": "Bad_Name"}]}, r"queues\[0\]\.name='Bad_Name' is not a name"),
    ({"gpu": 2, "queues": [{"name": "q"}, {"name": "q"}]}, r"queues\[1\]\.name='q' is taken"),
    (None, r"the file is empty"),
]


@pytest.mark.parametrize(("data", "message"), BAD_INVENTORIES, ids=[m[:30] for _, m in BAD_INVENTORIES])
def test_bad_inventory_is_a_clear_error(data: Any, message: str) -> None:
    with pytest.raises(InvalidInventory, match=message):
        ClusterInventory.from_dict(data, source="inv.yaml")


def test_todays_inventory_format_is_accepted() -> None:
    inv = ClusterInventory.from_dict({"gpu": {"a100-80gb": 2, "t4": 4}, "npu": 8, "cpu": 1}, source="inv.json")
    assert dict(inv.devices) == {"nvidia-a100-80gb": 2, "nvidia-t4": 4, "npu": 8}
    assert inv.capacity("gpu") == 6
    with pytest.raises(InvalidInventory, match="CPU or memory capacity is unknown"):
        kueue_manifests(inv, Candidates(["gpu"]), DEFAULT_PROFILE)
    inv = ClusterInventory.from_dict({"gpu": {"t4": 4}, "npu": 8, "cpu_cores": 64, "memory": "256Gi"})
    docs = kueue_manifests(inv, Candidates(["npu", "gpu"]), DEFAULT_PROFILE)
    assert [f["name"] for f in _cq(docs, "heteroflow-shared")["spec"]["resourceGroups"][1]["flavors"]] == ["npu", "nvidia-t4"]
    for d in docs:
        validate(d)


def test_load_inventory_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInventory, match=r"missing\.yaml: cannot be read"):
        load_inventory(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(InvalidInventory, match=r"bad\.yaml: not valid YAML"):
        load_inventory(bad)
    # a mis-indented key: where it is, as an editor counts, on one line (PyYAML's text said `in "<unicode string>"`)
    bad.write_text("gpu: 1\n  npu: 2\n")
    with pytest.raises(InvalidInventory, match=r"bad\.yaml: not valid YAML or JSON \(line 2, column 6: mapping values are not allowed here\)$"):
        load_inventory(bad)
    with pytest.raises(InvalidResources, match="workers=0"):
        training_job_manifests("gpu", workers=0, name="x", image="i")


# --- the command -------------------------------------------------------------------------------------------


def test_cli_writes_valid_manifests(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    out = tmp_path / "out"
    args = ["manifests", "--inventory", str(INVENTORY), "--profile", str(PROFILES / "nvidia-gfd.yaml"), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, *sum((["-c", c] for c in CANDIDATES), []), "--command", "heteroflow step train --param epochs=3"])
    assert result.exit_code == 0, result.output
    job = list(yaml.safe_load_all((out / "train-1-gpu.yaml").read_text()))[-1]
    assert job["spec"]["trainer"]["command"] == ["heteroflow", "step", "train", "--param", "epochs=3"]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["kueue.yaml", "train-1-gpu.yaml", "train-2-gpu.yaml", "volcano-queues.yaml"]
    import subprocess
    import sys

    proc = subprocess.run([str(Path(sys.executable).with_name("heteroflow")), *args[:-1], str(tmp_path / "out2"),
                           *sum((["-c", c] for c in CANDIDATES), [])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # the npu candidate gets no job (the profile names no npu image), and the command says so
    assert "note: no train-0-npu.yaml: the profile names no image for npu (images.npu)" in " ".join(proc.stderr.split())
    for p in out.iterdir():
        for doc in yaml.safe_load_all(p.read_text()):
            validate(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"nodes": [{"name": "a", "devices": {"t4": -2}}]}))
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(bad), "-o", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "nodes[0].devices.t4=-2 is not a device count" in result.output


def test_the_placement_inventory_form_is_accepted() -> None:
    """The node form of the placement work (issue 19): one model per node with replicas, costs and power, and
    queues whose guarantee/capability count devices of any model, with a priority."""
    data = yaml.safe_load(
        """
        version: 1
        policy: throughput
        nodes:
          - {name: v100-node, replicas: 3, devices: {kind: gpu, model: v100, count: 4, memory: 16Gi}, cpu: 32,
             memory: 244Gi, cost_per_hour: 9.92, idle_watts: 300, busy_watts: 250, datasets: [imagenet]}
          - {name: t4-node, devices: {kind: gpu, model: t4, count: 4}, cpu: 16, memory: 64Gi}
          - {name: cpu-node, cpu: 64, memory: 256Gi}
        queues:
          - {name: research, guarantee: 8, capability: 12, priority: 2, reclaimable: true}
          - {name: prod, guarantee: 6, priority: 5, reclaimable: false}
        throughputs: {train: {v100: 10.0}}
        """
    )
    inv = ClusterInventory.from_dict(data, source="placement.yaml")
    assert dict(inv.devices) == {"nvidia-v100": 12, "nvidia-t4": 4}
    assert [n.name for n in inv.nodes][:3] == ["v100-node-0", "v100-node-1", "v100-node-2"]
    assert (inv.cpu_millicores, inv.capacity("accelerators")) == (3 * 32_000 + 16_000 + 64_000, 16)
    queues = {q["metadata"]["name"]: q["spec"] for q in volcano_queues(inv)}
    assert queues["research"] == {
        "weight": 1, "reclaimable": True, "priority": 2, "capability": {"nvidia.com/gpu": "12"},
        "guarantee": {"resource": {"nvidia.com/gpu": "8"}},
    }
    docs = kueue_manifests(inv, Candidates(["gpu:accelerator=t4", "gpu:accelerator=v100"]), DEFAULT_PROFILE)
    for d in docs:
        validate(d)

    def nominal(cq: str) -> dict[str, int]:
        group = _cq(docs, cq)["spec"]["resourceGroups"][1]
        return {f["name"]: f["resources"][0]["nominalQuota"] for f in group["flavors"]}

    # 8 + 6 devices of any model spread in flavor order (t4 first); what is left goes to the shared queue
    assert nominal("research") == {"nvidia-t4": 4, "nvidia-v100": 4}
    assert nominal("prod") == {"nvidia-t4": 0, "nvidia-v100": 6}
    assert nominal("heteroflow-shared") == {"nvidia-t4": 0, "nvidia-v100": 2}
    with pytest.raises(InvalidInventory, match=r"queues guarantee 17 of accelerators \(research: 8, prod: 9\), above the capacity 16"):
        ClusterInventory.from_dict({**data, "queues": [data["queues"][0], {"name": "prod", "guarantee": 9}]})
    with pytest.raises(InvalidInventory, match=r"nodes\[0\]\.devices\.kind='npu' but nvidia-v100 is a gpu model"):
        ClusterInventory.from_dict({"nodes": [{"name": "a", "devices": {"kind": "npu", "model": "v100", "count": 1}}]})
