"""The one inventory parser (heteroflow.components.placement.inventory): every form, kubectl JSON, errors, and the views the
plan step, the manifests and the simulator take of one parsed value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteroflow.components.devices.accelerators import DeviceKind
from heteroflow.components.errors import InvalidParameter, InvalidResources
from heteroflow.components.placement.inventory import (
    ANY_DEVICES,
    ClusterInventory,
    InvalidInventory,
    PlacementInputError,
    from_mapping,
    load_inventory,
)

ROOT = Path(__file__).resolve().parent.parent

NODES = """\
version: 1
policy: throughput
nodes:
  - name: v100
    replicas: 2
    devices: {kind: gpu, model: v100, count: 4}
    cpu: 32
    memory: 128Gi
    cost_per_hour: 9.92
    datasets: [imagenet]
    labels: {zone: a}
    taints: [{key: dedicated, value: ml, effect: NoSchedule}]
  - {name: npu-0, devices: {ascend-910b3: 8}, cpu: 192, memory: 1536Gi}
  - {name: cpu-0, cpu: 64, memory: 256Gi}
queues:
  - {name: research, guarantee: 8, capability: 12, priority: 2}
  - {name: prod, reclaimable: false}
throughputs:
  train: {v100: 10.0, 910b3: 6.0}
"""

KUBECTL = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "Tesla-T4", "zone": "b"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "15500m", "memory": "60Gi", "nvidia.com/gpu": "4"},
                       "capacity": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}},
        },
        {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "npu-1", "labels": {"node.kubernetes.io/npu.chip.name": "910B3"}},
            "status": {"capacity": {"cpu": "192", "memory": "1536Gi", "huawei.com/Ascend910": "8"}},
        },
        {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "cpu-1", "labels": {"kubernetes.io/os": "linux"}},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
        },
    ],
}


def test_per_kind_counts_and_per_model_counts() -> None:
    inv = from_mapping({"gpu": 4, "npu": 0}, source="inv.json")
    assert dict(inv.devices) == {"gpu": 4, "npu": 0}
    assert inv.devices_per_kind() == {DeviceKind.CPU: 1, DeviceKind.GPU: 4, DeviceKind.NPU: 0}
    assert inv.models_per_kind() == {}
    inv = from_mapping({"gpu": {"t4": 4, "a100-80gb": 2}, "NPU": {"910b3": 8}, "cpu": 2, "cpu_cores": 64,
                        "memory": "256Gi"}, source="inv.json")
    assert dict(inv.devices) == {"nvidia-t4": 4, "nvidia-a100-80gb": 2, "ascend-910b3": 8}
    assert inv.devices_per_kind() == {DeviceKind.CPU: 2, DeviceKind.GPU: 6, DeviceKind.NPU: 8}
    assert inv.models_per_kind() == {DeviceKind.GPU: {"nvidia-t4": 4, "nvidia-a100-80gb": 2},
                                     DeviceKind.NPU: {"ascend-910b3": 8}}
    assert (inv.cpu_millicores, inv.memory_bytes) == (64_000, 256 * 2**30)
    assert inv.capacity("gpu") == 6 and inv.capacity(ANY_DEVICES) == 14


def test_nodes_queues_labels_taints_and_throughputs() -> None:
    inv = load_inventory("inv.yaml", text=NODES)
    assert [n.name for n in inv.nodes] == ["v100-0", "v100-1", "npu-0", "cpu-0"]
    v100 = inv.nodes[0]
    assert dict(v100.devices) == {"nvidia-v100": 4} and v100.device_memory_bytes == 16 * 2**30
    assert dict(v100.labels) == {"zone": "a"}
    assert v100.taints == ({"key": "dedicated", "value": "ml", "effect": "NoSchedule"},)
    assert dict(inv.nodes[3].devices) == {} and inv.nodes[3].cpu_millicores == 64_000
    assert dict(inv.devices) == {"nvidia-v100": 8, "ascend-910b3": 8}
    assert inv.cpu_millicores == (32 + 32 + 192 + 64) * 1000
    assert [(q.name, dict(q.guarantee), dict(q.capability), q.reclaimable) for q in inv.queues] == [
        ("research", {ANY_DEVICES: 8}, {ANY_DEVICES: 12}, True), ("prod", {}, {}, False)]
    assert inv.throughputs == {"train": {"nvidia-v100": 10.0, "ascend-910b3": 6.0}}
    assert inv.devices_per_kind() == {DeviceKind.CPU: 1, DeviceKind.GPU: 8, DeviceKind.NPU: 8}
    # the simulator's view: one model per node, queues counting devices of any model
    view = inv.for_placement()
    assert [(n.name, n.kind, n.model, n.devices) for n in view.nodes] == [
        ("v100-0", "gpu", "nvidia-v100", 4), ("v100-1", "gpu", "nvidia-v100", 4), ("npu-0", "npu", "ascend-910b3", 8),
        ("cpu-0", "cpu", "cpu", 0)]
    assert view.capacity() == {"nvidia-v100": 8, "ascend-910b3": 8, "cpu": 0}
    assert (view.queues["research"].guarantee, view.queues["research"].capability, view.queues["prod"].capability) == (8, 12, None)
    assert view.policy == "throughput"


def test_kubectl_get_nodes_json(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps(KUBECTL))
    inv = load_inventory(path)
    gpu, npu, cpu = inv.nodes
    assert (gpu.name, dict(gpu.devices), gpu.cpu_millicores, gpu.memory_bytes) == ("gpu-1", {"nvidia-t4": 4}, 15_500, 60 * 2**30)
    assert gpu.labels["zone"] == "b" and gpu.taints == ({"key": "nvidia.com/gpu", "effect": "NoSchedule"},)
    assert dict(npu.devices) == {"ascend-910b3": 8}  # capacity where allocatable is absent
    assert dict(cpu.devices) == {} and cpu.cpu_millicores == 8000
    assert dict(inv.devices) == {"nvidia-t4": 4, "ascend-910b3": 8}
    assert [n.model for n in inv.for_placement().nodes] == ["nvidia-t4", "ascend-910b3", "cpu"]
    with pytest.raises(InvalidInventory, match=r"nodes\.json: items\[0\]\.metadata has no name; valid: a non-empty string"):
        from_mapping({"kind": "List", "items": [{"kind": "Node", "metadata": {}}]}, source="nodes.json")


def test_kubernetes_api_nodes_share_the_kubectl_reading() -> None:
    from kubernetes.client import V1Node, V1NodeSpec, V1NodeStatus, V1ObjectMeta, V1Taint

    from heteroflow.components.placement.inventory import kubernetes_nodes

    assert kubernetes_nodes([]) == []
    node = V1Node(metadata=V1ObjectMeta(name="npu-1", labels={"node.kubernetes.io/npu.chip.name": "910B3"}),
                  spec=V1NodeSpec(taints=[V1Taint(key="huawei.com/Ascend910", effect="NoSchedule")]),
                  status=V1NodeStatus(allocatable={"cpu": "8", "memory": "32Gi", "huawei.com/Ascend910": "8"}))
    [n] = kubernetes_nodes([node])
    assert (n.kind, n.model, n.devices, n.cpu_millicores) == ("npu", "ascend-910b3", 8, 8000)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (("count: 4}", "count: four}"), r"inv\.yaml:6: nodes\[0\]\.devices\.count='four' is not a count .*valid: an integer >= 0"),
        (("cpu: 32", "cpu: lots"), r"inv\.yaml:4: .*nodes\[0\]\.cpu"),
        (("effect: NoSchedule", "effect: Never"), r"inv\.yaml:4: nodes\[0\]\.taints\[0\]\.effect='Never'; valid: NoSchedule, PreferNoSchedule, NoExecute"),
        (("{ascend-910b3: 8}", "{ascend-910b3: -8}"), r"inv\.yaml:13: nodes\[1\]\.devices\.ascend-910b3=-8 is not a device count"),
        (("datasets: [imagenet]", "datasetz: [imagenet]"), r"inv\.yaml:10: nodes\[0\] key 'datasetz' is unknown; valid: busy_watts, .*taints"),
        (("{name: prod, reclaimable: false}", "{name: prod, weight: 0}"), r"inv\.yaml:17: queues\[1\]\.weight=0; valid: an integer >= 1"),
    ],
    ids=["count", "cpu", "taint-effect", "negative-model-count", "unknown-key", "queue-weight"],
)
def test_a_bad_node_or_queue_names_line_node_and_field(edit: tuple[str, str], match: str) -> None:
    assert edit[0] in NODES
    with pytest.raises(InvalidInventory, match=match):
        load_inventory("inv.yaml", text=NODES.replace(edit[0], edit[1], 1))


def test_one_error_type_that_existing_except_clauses_catch() -> None:
    assert issubclass(InvalidInventory, PlacementInputError) and issubclass(InvalidInventory, InvalidResources)
    assert issubclass(InvalidInventory, ValueError)
    # the file named once, one "valid" (a new user's trial read `inv: unknown field 'tpu': inv key='tpu' is not a device
    # kind; valid kinds: ...; did you mean 'npu'?; valid: version, ...`)
    with pytest.raises(InvalidInventory, match=r"^inv: unknown field 'tpu', and not a device kind \(did you mean 'npu'\?\); valid: version, nodes, .*, or a device kind: cpu, gpu, npu$") as info:
        from_mapping({"tpu": 1}, source="inv")
    assert str(info.value).count("inv") == 1 and str(info.value).count("valid:") == 1
    with pytest.raises(InvalidInventory, match=r"^inv: unknown field 'node', and not a device kind \(did you mean 'nodes'\?\); valid: "):
        from_mapping({"node": []}, source="inv")  # sibling: a misspelt field is suggested as the kinds are
    with pytest.raises(InvalidInventory, match=r"inv: placement needs the node form"):
        from_mapping({"gpu": 2}, source="inv").for_placement()
    multi = from_mapping({"nodes": [{"name": "mix", "devices": {"t4": 2, "v100": 2}}]}, source="inv")
    with pytest.raises(InvalidInventory, match=r"nodes\[0\] \(mix\)\.devices has 2 models .*one model per node"):
        multi.for_placement()
    keyed = from_mapping({"nodes": [{"name": "a", "devices": {"t4": 2}}], "queues": [{"name": "q", "guarantee": {"t4": 1}}]}, source="inv")
    # a per-model guarantee is placement's too (it was refused: 'valid for placement: a bare count')
    queue = keyed.for_placement().queues["q"]
    assert queue.guaranteed() == {"nvidia-t4": 1} and queue.guarantee == 1 and queue.capability is None


def test_the_legacy_entry_points_return_equal_values(tmp_path: Path) -> None:
    from heteroflow.components.placement import policies as placement
    from heteroflow.components.placement import plan
    from heteroflow.dags import pools
    from heteroflow.pipelines.k8s import manifests

    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(NODES)
    parsed = load_inventory(nodes)
    assert manifests.load_inventory(nodes) == parsed
    assert manifests.ClusterInventory is ClusterInventory
    assert placement.load_inventory(nodes) == parsed.for_placement() == plan.cluster_inventory(str(nodes))
    assert placement.inventory_from_mapping(json.loads(json.dumps(parsed_yaml(NODES))), source=str(nodes)) == parsed.for_placement()

    per_kind = tmp_path / "kinds.yaml"
    per_kind.write_text("gpu: {a100-80gb: 2, t4: 4}\nnpu: 8\n")
    text = '{"gpu": {"a100-80gb": 2, "t4": 4}, "npu": 8}'
    from_pools, from_plan = pools.load_inventory(per_kind), plan.Inventory.from_json(text)
    assert (from_pools.devices, from_pools.models) == (from_plan.devices, from_plan.models)
    assert dict(from_plan.devices) == {DeviceKind.CPU: 1, DeviceKind.GPU: 6, DeviceKind.NPU: 8}
    assert dict(manifests.load_inventory(per_kind).devices) == {"nvidia-a100-80gb": 2, "nvidia-t4": 4, "npu": 8}
    # the plan step reports the same errors, as its own InvalidParameter
    with pytest.raises(InvalidParameter, match=r"^device_inventory: gpu\.t4=-1 is not a device count"):
        plan.Inventory.from_json('{"gpu": {"t4": -1}}')
    with pytest.raises(InvalidInventory, match=r"kinds\.yaml:1: gpu\.t4=-1 is not a device count"):
        manifests.load_inventory(_write(per_kind, "gpu: {t4: -1}\n"))


def test_the_example_inventory_gives_the_plan_view_and_the_placement_view_with_its_queues() -> None:
    inv = load_inventory(ROOT / "examples" / "manifests" / "inventory.yaml")
    assert inv.devices_per_kind() == {DeviceKind.CPU: 1, DeviceKind.GPU: 20, DeviceKind.NPU: 16}
    assert [q.name for q in inv.queues] == ["npu-training", "gpu-training", "vision"]
    # per-model and per-kind quotas are placement's too (a new user's trial: 'valid for placement: a bare count')
    queues = inv.for_placement().queues
    assert queues["npu-training"].guaranteed() == {"ascend-910b3": 8, "cpu": 96_000, "memory": 768 * 2**30}
    assert queues["npu-training"].limits() == {"ascend-910b3": 16} and queues["npu-training"].guarantee == 8
    assert queues["gpu-training"].limits() == {"gpu": 20} and queues["vision"].reclaimable is False
    nodes_only = ClusterInventory(devices=inv.devices, nodes=inv.nodes, source=inv.source)
    assert {n.model for n in nodes_only.for_placement().nodes} == {"nvidia-a100-80gb", "nvidia-t4", "ascend-910b3", "cpu"}


def parsed_yaml(text: str) -> object:
    import yaml

    return yaml.safe_load(text)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    # a new user's trial: "inv-str.yaml:1: /tmp/trial-w/inv-str.yaml['gpu']='two'" named the file twice
    ("gpu: two\n", "{f}:1: gpu='two' is not a device count; valid: an integer >= 0"),
    ("gpu: {t4: -1}\n", "{f}:1: gpu.t4=-1 is not a device count; valid: an integer >= 0"),
    ("gpu: {a100: 2}\n", "{f}:1: gpu names 'a100', a family (any NVIDIA A100); an inventory counts devices of one "
                         "model: nvidia-a100-40gb, nvidia-a100-80gb"),
    # siblings: a bad cpu_cores or memory named neither the file nor the line
    ("gpu: 2\ncpu_cores: lots\n", "{f}:2: cpu_cores='lots' is not a Kubernetes quantity; valid: cores as a number or a "
                                   "Kubernetes quantity such as 500m, 0.5, 2 or 16"),
    ("gpu: 2\nmemory: big\n", "{f}:2: memory='big' is not a Kubernetes quantity; valid:"),
], ids=["count", "model-count", "family", "cpu_cores", "memory"])
def test_a_per_kind_inventory_error_names_the_file_once_then_the_field(tmp_path: Path, text: str, message: str) -> None:
    """The file is named once (with its line), then the field as the inventory spells it; in each command that
    reads an inventory."""
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    inv = _write(tmp_path / "inv-str.yaml", text)
    expected = message.format(f=inv)
    with pytest.raises(InvalidInventory) as caught:
        load_inventory(inv)
    assert str(caught.value).startswith(expected), str(caught.value)
    assert str(caught.value).count("inv-str.yaml") == 1
    for args in (["simulate", "--trace", "gavel:4:5:0", "--inventory", str(inv)], ["manifests", "--inventory", str(inv), "-o", str(tmp_path / "out")]):
        done = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
        assert done.exit_code == 2 and f"error: {expected}" in done.output, (args, done.output)
    # the plan step's device_inventory, a file or inline
    from heteroflow.components.placement.plan import check_plan_params

    with pytest.raises(InvalidParameter) as plan_error:
        check_plan_params(device_inventory=str(inv))
    assert str(plan_error.value).startswith(expected) and str(plan_error.value).count("inv-str.yaml") == 1
