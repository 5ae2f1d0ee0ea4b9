"""The accelerator registry: facts per model (from shared/accelerators.md), names users write, families."""

from __future__ import annotations

import pytest

from heteroflow.components.devices.accelerators import (
    ACCELERATORS,
    ASCEND_310P,
    ASCEND_910,
    ASCEND_910B,
    ASCEND_910B3,
    GAUDI,
    NVIDIA_A100,
    NVIDIA_GPU,
    NVIDIA_T4,
    Accelerator,
    DeviceKind,
    find_accelerator,
)
from heteroflow.components.errors import InvalidResources

GiB = 2**30

# registry key -> (kind, official resource, HAMi resource, torch device, backend, bf16, memory GiB), as in
# shared/accelerators.md sections 1-5.
FACTS = {
    "nvidia-k80": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", False, 12),
    "nvidia-p100": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", False, 16),
    "nvidia-t4": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", False, 16),
    "nvidia-v100": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", False, 16),
    "nvidia-a10": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", True, 24),
    "nvidia-a100-40gb": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", True, 40),
    "nvidia-a100-80gb": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", True, 80),
    "nvidia-l4": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", True, 24),
    "nvidia-h100": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", True, 80),
    "nvidia-h200": ("gpu", "nvidia.com/gpu", "nvidia.com/gpu", "cuda", "nccl", True, 141),
    "ascend-910a": ("npu", "huawei.com/Ascend910", "huawei.com/Ascend910A", "npu", "hccl", False, 32),
    "ascend-910b2": ("npu", "huawei.com/Ascend910", "huawei.com/Ascend910B2", "npu", "hccl", True, 64),
    "ascend-910b3": ("npu", "huawei.com/Ascend910", "huawei.com/Ascend910B3", "npu", "hccl", True, 64),
    "ascend-910b4": ("npu", "huawei.com/Ascend910", "huawei.com/Ascend910B4", "npu", "hccl", True, 32),
    "ascend-910c": ("npu", "huawei.com/Ascend910", "huawei.com/Ascend910C", "npu", "hccl", True, 64),
    "ascend-310p": ("npu", "huawei.com/Ascend310P", "huawei.com/Ascend310P", "npu", "hccl", False, 24),
    "amd-mi250": ("gpu", "amd.com/gpu", "amd.com/gpu", "cuda", "nccl", True, 128),
    "amd-mi300x": ("gpu", "amd.com/gpu", "amd.com/gpu", "cuda", "nccl", True, 192),
    "gaudi1": ("npu", "habana.ai/gaudi", "habana.ai/gaudi", "hpu", "hccl", True, 32),
    "gaudi2": ("npu", "habana.ai/gaudi", "habana.ai/gaudi", "hpu", "hccl", True, 96),
    "gaudi3": ("npu", "habana.ai/gaudi", "habana.ai/gaudi", "hpu", "hccl", True, 128),
}


@pytest.mark.parametrize("key", sorted(FACTS))
def test_model_facts(key):
    kind, official, hami, device, backend, bf16, memory_gib = FACTS[key]
    a = ACCELERATORS[key]
    assert not a.is_family and a.models == (a,)
    assert a.kind is DeviceKind(kind)
    assert a.resource_name == a.resource_name_for("official") == official
    assert a.resource_name_for("hami") == hami
    assert (a.torch_device_type, a.distributed_backend, a.bf16) == (device, backend, bf16)
    assert a.device_memory_bytes == memory_gib * GiB


def test_every_model_is_in_the_fact_table():
    assert {k for k, a in ACCELERATORS.items() if not a.is_family} == set(FACTS)


NODE_LABELS = [
    (NVIDIA_T4, "gfd", ("Tesla-T4", "TESLA-T4")),  # [GFD] shows both spellings
    (NVIDIA_T4, "gke", ("nvidia-tesla-t4",)),
    (ACCELERATORS["nvidia-a100-40gb"], "gke", ("nvidia-tesla-a100",)),
    (ACCELERATORS["nvidia-a100-80gb"], "gke", ("nvidia-a100-80gb",)),
    (ACCELERATORS["nvidia-l4"], "gke", ("nvidia-l4",)),
    (ACCELERATORS["nvidia-h100"], "gke", ("nvidia-h100-80gb",)),
    (ACCELERATORS["nvidia-h200"], "gke", ("nvidia-h200-141gb",)),
    (ASCEND_910B3, "npu-chip-name", ("910B3",)),
    (ASCEND_310P, "npu-chip-name", ("310P3",)),
    (ACCELERATORS["amd-mi300x"], "amd-labeller", ("AMD_Instinct_MI300X_OAM",)),
]


@pytest.mark.parametrize(("accel", "convention", "values"), NODE_LABELS, ids=[f"{a.name}-{c}" for a, c, _ in NODE_LABELS])
def test_node_label_values(accel, convention, values):
    assert accel.node_labels[convention] == values


def test_undocumented_label_values_are_absent_not_guessed():
    assert "npu-chip-name" not in ACCELERATORS["ascend-910a"].node_labels
    assert "npu-chip-name" not in ACCELERATORS["ascend-910c"].node_labels
    assert "gke" not in ACCELERATORS["nvidia-a10"].node_labels
    assert not ACCELERATORS["gaudi2"].node_labels


def test_usual_tolerations():
    assert NVIDIA_T4.taint_keys == ("nvidia.com/gpu",)
    assert ASCEND_910B3.taint_keys == ("huawei.com/Ascend910",)
    assert ACCELERATORS["amd-mi300x"].taint_keys == ()  # none documented


NAMES = [
    ("T4", "nvidia-t4"),
    ("t4", "nvidia-t4"),
    ("NVIDIA_TESLA_T4", "nvidia-t4"),  # KFP/Vertex accelerator type
    ("nvidia-tesla-t4", "nvidia-t4"),  # GKE label value
    ("Tesla T4", "nvidia-t4"),
    ("A100", "nvidia-a100"),  # either A100
    ("NVIDIA_TESLA_A100", "nvidia-a100-40gb"),  # GKE's nvidia-tesla-a100 is the 40 GB part
    ("a100-80gb", "nvidia-a100-80gb"),
    ("H200", "nvidia-h200"),
    ("nvidia.com/gpu", "nvidia-gpu"),
    ("ascend-910b3", "ascend-910b3"),
    ("Ascend910B3", "ascend-910b3"),
    ("huawei.com/Ascend910B3", "ascend-910b3"),  # HAMi resource name
    ("910B", "ascend-910b"),
    ("910", "ascend-910"),
    ("huawei.com/Ascend910", "ascend-910"),  # MindCluster resource name: any 910
    ("310P", "ascend-310p"),
    ("MI300X", "amd-mi300x"),
    ("intel-gaudi", "gaudi"),
    ("Gaudi 2", "gaudi2"),
]


@pytest.mark.parametrize(("name", "key"), NAMES, ids=[n for n, _ in NAMES])
def test_find_accelerator_by_the_names_users_write(name, key):
    assert find_accelerator(name) is ACCELERATORS[key]


def test_find_accelerator_passes_an_accelerator_through():
    assert find_accelerator(NVIDIA_T4) is NVIDIA_T4


@pytest.mark.parametrize(
    ("name", "close"),
    [("A200", "nvidia-h200, nvidia-a100"), ("ascend-910b5", "ascend-910b"), ("T5", None), (42, None)],
    ids=["A200", "910b5", "T5", "int"],
)
def test_unknown_name_lists_close_matches_and_every_key(name, close):
    with pytest.raises(InvalidResources) as info:
        find_accelerator(name, field="candidates[0].accelerator")
    message = str(info.value)
    assert message.startswith(f"candidates[0].accelerator={name!r} is unknown")
    if close:
        assert f"close matches: {close}" in message
    assert message.endswith("valid: " + ", ".join(sorted(ACCELERATORS)))


def test_families_include_members_and_models_include_themselves():
    for b in ("ascend-910b2", "ascend-910b3", "ascend-910b4"):
        assert ASCEND_910B.includes(ACCELERATORS[b])
        assert ASCEND_910.includes(ACCELERATORS[b])
    assert not ASCEND_910B.includes(ACCELERATORS["ascend-910a"])
    assert ASCEND_910.includes(ASCEND_910B) and not ASCEND_910B.includes(ASCEND_910)
    assert not ASCEND_910.includes(ASCEND_310P)
    assert ASCEND_910B3.includes(ASCEND_910B3) and not ASCEND_910B3.includes(ASCEND_910B)
    for key, accel in ACCELERATORS.items():
        assert accel.includes(accel)
        if accel.vendor == "nvidia":
            assert NVIDIA_GPU.includes(accel), key
        else:
            assert not NVIDIA_GPU.includes(accel), key
    assert NVIDIA_A100.includes(ACCELERATORS["nvidia-a100-80gb"]) and not NVIDIA_A100.includes(NVIDIA_T4)
    assert {m.name for m in GAUDI.models} == {"gaudi1", "gaudi2", "gaudi3"}


def test_family_attributes():
    assert NVIDIA_GPU.device_memory_bytes is None and NVIDIA_GPU.is_family
    assert NVIDIA_GPU.bf16 is None  # T4/V100 lack it, the rest have it
    assert ASCEND_910B.bf16 is True
    assert (ASCEND_910.torch_device_type, ASCEND_910.distributed_backend, ASCEND_910.kind) == ("npu", "hccl", DeviceKind.NPU)
    assert ASCEND_910.resource_name == "huawei.com/Ascend910"
    assert NVIDIA_GPU.resource_name == "nvidia.com/gpu"


def test_a_family_has_no_single_hami_name_for_ascend_chips():
    with pytest.raises(InvalidResources, match=r"^accelerator='ascend-910b' \(any Ascend 910B\) has no single resource name under the 'hami' device plugin.*valid: one model of ascend-910b2, ascend-910b3, ascend-910b4"):
        ASCEND_910B.resource_name_for("hami")
    with pytest.raises(InvalidResources, match=r"^plugin='nvidia' is unknown; valid: official, hami"):
        NVIDIA_T4.resource_name_for("nvidia")


def test_registry_entries_are_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        NVIDIA_T4.bf16 = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        ACCELERATORS["x"] = NVIDIA_T4  # type: ignore[index]
    with pytest.raises(TypeError):
        NVIDIA_T4.resource_names["official"] = "x"  # type: ignore[index]
    assert isinstance(NVIDIA_T4, Accelerator)


def test_importing_the_registry_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, heteroflow.components.resources, heteroflow.components.devices.accelerators, heteroflow.components.devices.cluster;"
        "heavy = [m for m in ('torch', 'kfp', 'airflow', 'kubernetes', 'pandas', 'yaml') if m in sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
