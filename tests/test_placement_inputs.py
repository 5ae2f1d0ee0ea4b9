"""Placement and inventory inputs a user can write, each a defect a review found with its own small input: the plan
step split a one-node job's devices across nodes, GPU feature discovery's A100/H100 labels read as no model, a
bound pod's non-integer extended or storage request crashed the live-cluster reader, guarantees above a kind's
capacity, for absent models or above a capability under another key were accepted, and aliases of one kind or
model overwrote each other instead of adding up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteroflow.components.errors import NoCandidateAvailable
from heteroflow.components.placement.plan import plan_step
from heteroflow.components.resources import Candidates

TWO_T4_NODES = """version: 1
nodes:
  - {name: a, devices: {t4: 4}, cpu: 16, memory: 64Gi}
  - {name: b, devices: {t4: 4}, cpu: 16, memory: 64Gi}
"""


def _plan(tmp_path: Path, candidates: list[str], inventory: str) -> dict:
    (tmp_path / "inv.yaml").write_text(inventory)
    plan_step(str(tmp_path / "p.json"), placements=json.dumps({"train": Candidates(candidates).to_json()}),
              device_inventory=str(tmp_path / "inv.yaml"))
    return json.loads((tmp_path / "p.json").read_text())["train"]


# --- a one-node job is one pod: its devices are on one node -----------------------------------------------------


def test_a_one_node_job_is_never_split_across_nodes(tmp_path: Path) -> None:
    """8 GPUs on one node (nodes=1, the default) on two nodes of 4: it was placed 'on 2 nodes' as one pod asking
    nvidia.com/gpu: 8, which no node can ever schedule."""
    with pytest.raises(NoCandidateAvailable, match=r"one pod: its 8 device\(s\) on one node, and no node has them free \(most on one node: 4\)"):
        _plan(tmp_path, ["gpu:count=8"], TWO_T4_NODES)
    assert _plan(tmp_path, ["gpu:count=8", "gpu:count=4"], TWO_T4_NODES)["nodes"] == ["a"]  # the next candidate fits one node
    # two nodes of 4 each, asked for as such (nodes=2): a worker a node
    assert sorted(_plan(tmp_path, ["gpu:count=4,nodes=2"], TWO_T4_NODES)["nodes"]) == ["a", "b"]
    # any count above one node's devices, not only twice a node
    with pytest.raises(NoCandidateAvailable, match="most on one node: 4"):
        _plan(tmp_path, ["gpu:count=6"], TWO_T4_NODES)


# --- the live cluster's nodes and pods ---------------------------------------------------------------------------


def _kubectl_node(name: str, labels: dict[str, str], gpus: int = 8) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}}}


@pytest.mark.parametrize(("label", "value", "model", "memory_gib"), [
    # GPU feature discovery's product names, as the registry lists them: read as no model before (CPU-only nodes)
    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB", "nvidia-a100-80gb", 80),
    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB", "nvidia-a100-40gb", 40),
    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", "nvidia-h100", 80),
    ("nvidia.com/gpu.product", "Tesla-T4", "nvidia-t4", 16),
    # sibling: a V100 32 GB is the V100 entry with the memory its label states (it read as 16 GiB)
    ("nvidia.com/gpu.product", "Tesla-V100-SXM2-32GB", "nvidia-v100", 32),
    # sibling: GKE's label was not read at all
    ("cloud.google.com/gke-accelerator", "nvidia-tesla-t4", "nvidia-t4", 16),
    ("cloud.google.com/gke-accelerator", "nvidia-h100-80gb", "nvidia-h100", 80),
])
def test_node_labels_of_every_convention_name_their_model(label: str, value: str, model: str, memory_gib: int) -> None:
    from heteroflow.components.placement.k8s_nodes import kubectl_nodes

    [node] = kubectl_nodes([_kubectl_node("n", {label: value})])
    assert (node.devices, node.device_memory_bytes) == ({model: 8}, memory_gib * 2**30)


def test_a_family_or_unknown_product_label_is_no_model() -> None:
    from heteroflow.components.placement.k8s_nodes import kubectl_nodes

    family, unknown = kubectl_nodes([_kubectl_node("f", {"nvidia.com/gpu.product": "A100"}),
                                     _kubectl_node("u", {"nvidia.com/gpu.product": "NVIDIA-Foo-9000"})])
    assert family.devices == unknown.devices == {}


def test_the_manifests_of_an_a100_h100_cluster_have_their_flavors(tmp_path: Path) -> None:
    """The review's input: ``heteroflow manifests`` on kubectl's nodes wrote only the cpu flavor and exited 0."""
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    nodes = {"kind": "List", "items": [_kubectl_node("a", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
                                       _kubectl_node("h", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})]}
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(tmp_path / "nodes.json"), "-c", "gpu", "--image", "img",
                                      "-o", str(tmp_path / "out")], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    import yaml

    flavors = {d["metadata"]["name"] for d in yaml.safe_load_all((tmp_path / "out" / "kueue.yaml").read_text()) if d["kind"] == "ResourceFlavor"}
    assert flavors == {"cpu", "nvidia-a100-80gb", "nvidia-h100"}


def test_bound_pods_requests_of_every_resource_are_counted_as_the_scheduler_counts_them() -> None:
    """A pod requesting ephemeral storage (``10Gi``) crashed the reader with a bare ValueError (``int('10Gi')``),
    so ``device_inventory=kubernetes`` said the cluster could not be read; siblings: init containers and the pod's
    overhead were not counted."""
    from kubernetes.client import V1Container, V1Node, V1NodeStatus, V1ObjectMeta, V1Pod, V1PodSpec, V1PodStatus, V1ResourceRequirements

    from heteroflow.components.placement.k8s_nodes import kubernetes_nodes

    def container(name: str, **requests: str) -> V1Container:
        return V1Container(name=name, resources=V1ResourceRequirements(requests={k.replace("_", "-"): v for k, v in requests.items()}))

    node = V1Node(metadata=V1ObjectMeta(name="gpu-1", labels={"nvidia.com/gpu.product": "Tesla-T4"}),
                  status=V1NodeStatus(allocatable={"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "ephemeral-storage": "500Gi"}))
    storage = V1Pod(spec=V1PodSpec(node_name="gpu-1", containers=[container("c", cpu="500m", ephemeral_storage="10Gi", hugepages_2Mi="1Gi")]),
                    status=V1PodStatus(phase="Running"))
    # app containers 2 CPU + 1 GPU; an init container asking 6 CPU holds 6 while it runs (the larger); overhead 250m
    init = V1Pod(spec=V1PodSpec(node_name="gpu-1", containers=[container("a", cpu="1", **{"nvidia.com/gpu": "1"}), container("b", cpu="1")],
                                init_containers=[container("i", cpu="6", memory="1Gi")], overhead={"cpu": "250m"}),
                 status=V1PodStatus(phase="Pending"))
    [n] = kubernetes_nodes([node], [storage, init])
    assert (n.model, n.devices, n.cpu_millicores, n.memory_bytes) == ("nvidia-t4", 3, 32000 - 500 - 6000 - 250, 127 * 2**30)


# --- guarantees, capabilities and aliases ------------------------------------------------------------------------


def _inventory(data: dict):
    from heteroflow.components.placement.inventory import from_mapping

    return from_mapping(data, source="inv.yaml")


V100_NODE = [{"name": "v", "devices": {"v100": 8}, "cpu": 32, "memory": "128Gi"}]


@pytest.mark.parametrize(("data", "message"), [
    # a kind's guarantee above its capacity in the per-kind form: Volcano got 10 GPUs guaranteed, Kueue 4
    ({"gpu": 4, "npu": 8, "cpu_cores": 64, "memory": "256Gi", "queues": [{"name": "q", "guarantee": {"gpu": 10}}]},
     "queues[0] (q): guarantee 10 of gpu is above the cluster's capacity of 4"),
    # sibling: the same in the per-model per-kind form still says it
    ({"gpu": {"t4": 4}, "queues": [{"name": "q", "guarantee": {"gpu": 10}}]}, "guarantee 10 of gpu is above the cluster's capacity of 4"),
    # a guarantee of a model no node has reserved the V100s for T4s that do not exist
    ({"nodes": V100_NODE, "queues": [{"name": "a", "guarantee": {"t4": 4}}]},
     "queues[0] (a): guarantee 4 of nvidia-t4, which no node has (the inventory's devices: nvidia-v100: 8)"),
    # guarantees above a capability given under a wider key: Volcano got guarantee 8 under capability 2
    ({"nodes": V100_NODE, "queues": [{"name": "q", "guarantee": {"t4": 4, "v100": 4}, "capability": {"gpu": 2}}]},
     "queues[0] (q): guarantee.nvidia-t4=4 + guarantee.nvidia-v100=4 is above its capability.gpu=2 (8 in all)"),
    ({"nodes": V100_NODE, "queues": [{"name": "q", "guarantee": {"v100": 4}, "capability": 2}]},
     "queues[0] (q): guarantee.nvidia-v100=4 is above its capability 2"),
    # aliases of one kind replaced each other (the T4s were gone)
    ({"gpu": {"t4": 4}, "cuda": {"v100": 2}}, "'gpu' and 'cuda' both name device kind 'gpu'; valid: each kind once"),
    ({"gpu": 4, "GPU": 2}, "'gpu' and 'GPU' both name device kind 'gpu'"),
    # the one-model devices form without a model was a CPU-only node
    ({"nodes": [{"name": "a", "devices": {"kind": "gpu", "count": 4}}]},
     "nodes[0].devices.model is missing: count=4 of kind 'gpu' needs the model of its devices"),
    ({"nodes": [{"name": "a", "devices": {"kind": "gpu", "model": "t5", "count": 0}}]}, "nodes[0].devices.model='t5' is unknown"),
    ({"nodes": V100_NODE, "queues": [{"name": "q", "namespaces": ["ml", "ml"]}]},
     "queues[0].namespaces[1]='ml' is listed twice; valid: each namespace once"),
    ({"version": True, "gpu": 4}, "version=True is unknown; valid: 1"),
    ({"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "a"}}, {"kind": "Node", "metadata": {"name": "a"}}]},
     "items[1].metadata.name='a' duplicates items[0]; node names are unique"),
])
def test_an_inventory_a_user_could_write_wrong_is_refused_naming_the_field(data: dict, message: str) -> None:
    from heteroflow.components.placement.views import InvalidInventory

    with pytest.raises(InvalidInventory) as err:
        _inventory(data)
    assert message in str(err.value) and str(err.value).startswith("inv.yaml"), str(err.value)


def test_what_fits_is_still_accepted_and_aliases_of_one_model_add_up() -> None:
    inv = _inventory({"nodes": V100_NODE, "queues": [{"name": "q", "guarantee": {"v100": 2, "nvidia-v100": 3}, "capability": {"gpu": 6}},
                                                     {"name": "r", "guarantee": {"gpu": 2}, "capability": 4}]})
    assert [dict(q.guarantee) for q in inv.queues] == [{"nvidia-v100": 5}, {"gpu": 2}]  # was {"nvidia-v100": 3}: the last won
    assert _inventory({"gpu": 4, "npu": 8, "queues": [{"name": "q", "guarantee": {"gpu": 4, "npu": 8}}]}).queues[0].guarantee == {"gpu": 4, "npu": 8}
    assert _inventory({"nodes": [{"name": "a", "devices": {"kind": "gpu", "count": 0}}]}).devices == {}


def test_a_packing_policy_refuses_a_node_whose_stated_device_memory_is_too_small(tmp_path: Path) -> None:
    """``policy: bestfit`` placed a 12 GiB job on V100s the node states have 8 GiB; ``policy: listed`` refused it."""
    node = "  - {name: v100small, devices: {kind: gpu, model: v100, count: 4, memory: 8Gi}, cpu: 32, memory: 128Gi}\n"
    big = "  - {name: v100big, devices: {kind: gpu, model: v100, count: 4, memory: 32Gi}, cpu: 32, memory: 128Gi}\n"
    for policy in ("bestfit", "fgd", "listed"):
        with pytest.raises(NoCandidateAvailable, match="12288 MiB of device memory \\(most: 8192 MiB\\)|with >= 12 GiB device memory"):
            _plan(tmp_path, ["gpu:device_memory=12Gi"], f"version: 1\npolicy: {policy}\nnodes:\n{node}")
        assert _plan(tmp_path, ["gpu:device_memory=12Gi"], f"version: 1\npolicy: {policy}\nnodes:\n{node}{big}")["nodes"] == ["v100big"]
        assert _plan(tmp_path, ["gpu:device_memory=8Gi"], f"version: 1\npolicy: {policy}\nnodes:\n{node}")["nodes"] == ["v100small"]


def test_a_count_form_inventory_file_places_as_the_same_text_inline(tmp_path: Path) -> None:
    """A new user's trial: `--param device_inventory=g4.yaml` holding `gpu: 4` was refused ("placement needs the
    node form"), while '{"gpu": 4}' inline and the Airflow pools read it."""
    (tmp_path / "g4.yaml").write_text("gpu: 4\nnpu: 2\n")
    plan_step(str(tmp_path / "p.json"), placements=json.dumps({"train": Candidates(["gpu:count=2", "cpu"]).to_json()}),
              device_inventory=str(tmp_path / "g4.yaml"))
    from_file = json.loads((tmp_path / "p.json").read_text())["train"]
    plan_step(str(tmp_path / "q.json"), placements=json.dumps({"train": Candidates(["gpu:count=2", "cpu"]).to_json()}),
              device_inventory='{"gpu": 4, "npu": 2}')
    inline = json.loads((tmp_path / "q.json").read_text())["train"]
    assert from_file["index"] == inline["index"] == 0 and from_file["device_kind"] == "gpu"
