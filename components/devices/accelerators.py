"""The accelerator registry: every model heteroflow can ask for, and how each engine and device plugin names it.

Each entry is a typed constant (flytekit-style) carrying what a renderer or the placement step needs: the
Kubernetes extended resource per device-plugin convention, the node label value that selects the model per
label convention, the taint its nodes usually carry, the PyTorch device type and ``torch.distributed``
backend, bf16 support and device memory. A *family* ("any NVIDIA", "any 910B") lists its member models and
has no memory of its own.

Every fact comes from ``shared/accelerators.md``; the comment beside each constant names its source keys
there (NVR/GFD/NVH/NVS: NVIDIA device plugin and feature discovery; GKE; CC: CUDA compute capabilities;
HM/HMV: HAMi; MCA/MCP/MCK: Ascend MindCluster; TN: torch_npu; AMD/RS: ROCm; HB/HD/HF: Intel Gaudi; PD/PH:
PyTorch docs). Values marked *unconfirmed* are not in that file and are named as such.

Conventions (chosen per vendor by a cluster profile, see :mod:`heteroflow.components.devices.cluster`):

- device plugin: ``official`` (NVIDIA k8s-device-plugin, Ascend MindCluster, ROCm, Habana) or ``hami``
  (HAMi). They differ for Ascend: MindCluster advertises one name, ``huawei.com/Ascend910``, for 910A,
  910B and A3 alike (the chip is only in the ``node.kubernetes.io/npu.chip.name`` label), while HAMi
  advertises one name per chip (``huawei.com/Ascend910B3``) [MCA, MCP, HM].
- node labels: ``gfd`` (``nvidia.com/gpu.product``, written by NVIDIA GPU feature discovery: the NVML name
  with spaces as ``-`` [GFD, NVS]), ``gke`` (``cloud.google.com/gke-accelerator`` [GKE]), ``npu-chip-name``
  (``node.kubernetes.io/npu.chip.name`` [MCK]), ``amd-labeller`` (``amd.com/gpu.product-name`` [AMD]) or
  ``none`` (the cluster offers no label that tells models apart).

Device memory is the vendor's nominal capacity in GiB (2^30 bytes); the usable part is a little smaller (GFD
reports a T4 as 15360 MiB [GFD]).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Mapping
from types import MappingProxyType

from heteroflow.components.devices import DeviceKind
from heteroflow.components.errors import InvalidResources

__all__ = [
    "ACCELERATORS",
    "ASCEND_310P",
    "ASCEND_910",
    "ASCEND_910A",
    "ASCEND_910B",
    "ASCEND_910B2",
    "ASCEND_910B3",
    "ASCEND_910B4",
    "ASCEND_910C",
    "AMD_GPU",
    "AMD_MI250",
    "AMD_MI300X",
    "Accelerator",
    "DeviceKind",
    "GAUDI",
    "GAUDI1",
    "GAUDI2",
    "GAUDI3",
    "LABEL_CONVENTIONS",
    "NVIDIA_A10",
    "NVIDIA_A100",
    "NVIDIA_A100_40GB",
    "NVIDIA_A100_80GB",
    "NVIDIA_GPU",
    "NVIDIA_H100",
    "NVIDIA_H200",
    "NVIDIA_L4",
    "NVIDIA_T4",
    "NVIDIA_V100",
    "PLUGIN_CONVENTIONS",
    "VENDORS",
    "default_accelerator",
    "find_accelerator",
    "label_conventions_for",
]

_GiB = 2**30


VENDORS = ("nvidia", "ascend", "amd", "gaudi")
"""Vendors a cluster profile configures, one device-plugin and one label convention each."""

PLUGIN_CONVENTIONS = ("official", "hami")
"""Device-plugin conventions: the vendor's own plugin, or HAMi."""

LABEL_CONVENTIONS: Mapping[str, tuple[str | None, tuple[str, ...]]] = MappingProxyType(
    {
        # convention: (node label key, vendors it applies to)
        "gfd": ("nvidia.com/gpu.product", ("nvidia",)),  # [GFD, NVR]
        "gke": ("cloud.google.com/gke-accelerator", ("nvidia",)),  # [GKE]
        "npu-chip-name": ("node.kubernetes.io/npu.chip.name", ("ascend",)),  # [MCK]
        "amd-labeller": ("amd.com/gpu.product-name", ("amd",)),  # [AMD]
        "none": (None, VENDORS),
    }
)
"""Node-label conventions: the label key each one uses to tell models apart, and the vendors it applies to."""


def label_conventions_for(vendor: str) -> tuple[str, ...]:
    """The node-label conventions that apply to ``vendor`` (``none`` last)."""
    return tuple(name for name, (_, vendors) in LABEL_CONVENTIONS.items() if vendor in vendors)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One accelerator model, or a family of models, and how every engine and device plugin names it.

    Attributes:
        name: registry key, e.g. ``"nvidia-t4"``, ``"ascend-910b3"``, ``"nvidia-gpu"`` (any NVIDIA).
        display_name: a human name, e.g. ``"NVIDIA T4"``, ``"any Ascend 910B"``.
        vendor: one of :data:`VENDORS`.
        kind: the device kind it belongs to.
        torch_device_type: the ``torch.device`` type that drives it (``"cuda"``, ``"npu"``, ``"hpu"``).
        distributed_backend: the ``torch.distributed`` backend for it (``"nccl"``, ``"hccl"``).
        bf16: whether it computes in bfloat16; None for a family whose members differ.
        device_memory_bytes: memory per device (nominal, bytes); None for a family.
        members: for a family, the registry keys of its models; empty for a model.
        resource_names: for a model, the Kubernetes extended resource per device-plugin convention
            (``{"official": "huawei.com/Ascend910", "hami": "huawei.com/Ascend910B3"}``).
        node_labels: for a model, the node label values that select it, per label convention
            (``{"gfd": ("Tesla-T4", "TESLA-T4"), "gke": ("nvidia-tesla-t4",)}``); a missing convention means
            no documented value.
        taint_keys: taints its nodes usually carry (``NoSchedule``); tolerated with ``Exists`` by default.
        aliases: other spellings users write (``T4``, ``NVIDIA_TESLA_T4``); matched case-insensitively with
            ``_`` and spaces read as ``-``.
    """

    name: str
    display_name: str
    vendor: str
    kind: DeviceKind
    torch_device_type: str
    distributed_backend: str
    bf16: bool | None = None
    device_memory_bytes: int | None = None
    members: tuple[str, ...] = ()
    resource_names: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, hash=False)
    node_labels: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, compare=False, hash=False)
    taint_keys: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def is_family(self) -> bool:
        """True for a family ("any NVIDIA"), False for one model."""
        return bool(self.members)

    @property
    def models(self) -> tuple[Accelerator, ...]:
        """The models this names: its members for a family, itself for a model."""
        if not self.members:
            return (self,)
        return tuple(ACCELERATORS[m] for m in self.members)

    def includes(self, other: Accelerator) -> bool:
        """Whether every model of ``other`` is one this names (a family includes its members and its
        sub-families; a model includes itself)."""
        mine = {m.name for m in self.models}
        return all(m.name in mine for m in other.models)

    def resource_name_for(self, plugin: str = "official") -> str:
        """The extended resource its device plugin advertises under ``plugin`` (see :data:`PLUGIN_CONVENTIONS`).

        Raises:
            InvalidResources: a family whose members have different names under ``plugin`` (HAMi names each
                Ascend chip), or an unknown convention.
        """
        if plugin not in PLUGIN_CONVENTIONS:
            raise InvalidResources(f"plugin={plugin!r} is unknown; valid: {', '.join(PLUGIN_CONVENTIONS)}")
        names = sorted({m.resource_names[plugin] for m in self.models})
        if len(names) != 1:
            chips = ", ".join(m.name for m in self.models)
            raise InvalidResources(
                f"accelerator={self.name!r} ({self.display_name}) has no single resource name under the {plugin!r} "
                f"device plugin, which names each model ({', '.join(names)}); valid: one model of {chips}"
            )
        return names[0]

    @property
    def resource_name(self) -> str:
        """The extended resource under the vendor's official device plugin (``nvidia.com/gpu``)."""
        return self.resource_name_for("official")


def _model(**kw: object) -> Accelerator:
    return Accelerator(**kw)  # type: ignore[arg-type]


_NV = dict(
    vendor="nvidia",
    kind=DeviceKind.GPU,
    torch_device_type="cuda",  # [PD]
    distributed_backend="nccl",  # [PD]
    resource_names=MappingProxyType({"official": "nvidia.com/gpu", "hami": "nvidia.com/gpu"}),  # [NVR, HMV]
    taint_keys=("nvidia.com/gpu",),  # tolerate nvidia.com/gpu Exists NoSchedule [NVR, NVH]
)

# NVIDIA. bf16 iff compute capability >= 8.0 [CC, PC]. gfd values are NVML names with spaces as '-' [NVS]; the
# ones other than Tesla-T4/TESLA-T4 and A100-SXM4-40GB [GFD] are unconfirmed (NVML product names).
NVIDIA_T4 = _model(
    name="nvidia-t4", display_name="NVIDIA T4", bf16=False, device_memory_bytes=16 * _GiB,  # CC 7.5; 16 GB [CC, GT]
    node_labels=MappingProxyType({"gfd": ("Tesla-T4", "TESLA-T4"), "gke": ("nvidia-tesla-t4",)}),  # [GFD, GKE]
    aliases=("T4", "tesla-t4", "nvidia-tesla-t4", "NVIDIA_TESLA_T4"),
    **_NV,
)
NVIDIA_K80 = _model(
    # CC 3.7; 12 GB per GPU (a K80 board carries two GPUs, each its own CUDA device) [CC, GT]; Gavel's oldest type
    name="nvidia-k80", display_name="NVIDIA K80", bf16=False, device_memory_bytes=12 * _GiB,
    node_labels=MappingProxyType({"gfd": ("Tesla-K80",), "gke": ("nvidia-tesla-k80",)}),  # unconfirmed
    aliases=("K80", "tesla-k80", "nvidia-tesla-k80", "NVIDIA_TESLA_K80"),
    **_NV,
)
NVIDIA_P100 = _model(
    # CC 6.0; 16 GB (a 12 GB PCIe part exists: not modelled) [CC, GT]
    name="nvidia-p100", display_name="NVIDIA P100 16 GB", bf16=False, device_memory_bytes=16 * _GiB,
    node_labels=MappingProxyType({"gfd": ("Tesla-P100-PCIE-16GB", "Tesla-P100-SXM2-16GB"), "gke": ("nvidia-tesla-p100",)}),  # unconfirmed
    aliases=("P100", "tesla-p100", "nvidia-tesla-p100", "NVIDIA_TESLA_P100"),
    **_NV,
)
NVIDIA_V100 = _model(
    # CC 7.0; 16 GB (a 32 GB part exists, pytorch/pytorch#124996: not modelled) [CC, PC, GT]
    name="nvidia-v100", display_name="NVIDIA V100 16 GB", bf16=False, device_memory_bytes=16 * _GiB,
    node_labels=MappingProxyType({"gfd": ("Tesla-V100-SXM2-16GB", "Tesla-V100-PCIE-16GB")}),  # unconfirmed
    # V100M16 / V100M32: the Alibaba 2023 GPU cluster trace's gpu_spec names (the 32 GB part reads as this entry,
    # as a Tesla-V100-SXM2-32GB node label does, with its own memory where a node states it)
    aliases=("V100", "tesla-v100", "nvidia-tesla-v100", "NVIDIA_TESLA_V100", "V100M16", "V100M32"),
    **_NV,
)
NVIDIA_A10 = _model(
    name="nvidia-a10", display_name="NVIDIA A10", bf16=True, device_memory_bytes=24 * _GiB,  # CC 8.6; 24 GB unconfirmed
    node_labels=MappingProxyType({"gfd": ("NVIDIA-A10",)}),  # unconfirmed
    aliases=("A10", "NVIDIA_A10"),
    **_NV,
)
NVIDIA_A100_40GB = _model(
    name="nvidia-a100-40gb", display_name="NVIDIA A100 40 GB", bf16=True, device_memory_bytes=40 * _GiB,  # [CC, GKE]
    node_labels=MappingProxyType(
        {
            "gfd": ("A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),  # first [GFD], others unconfirmed
            "gke": ("nvidia-tesla-a100",),  # [GKE]
        }
    ),
    aliases=("A100-40GB", "a100-40g", "nvidia-tesla-a100", "NVIDIA_TESLA_A100"),
    **_NV,
)
NVIDIA_A100_80GB = _model(
    name="nvidia-a100-80gb", display_name="NVIDIA A100 80 GB", bf16=True, device_memory_bytes=80 * _GiB,  # [CC, GKE]
    node_labels=MappingProxyType(
        {"gfd": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"), "gke": ("nvidia-a100-80gb",)}  # gfd unconfirmed; [GKE]
    ),
    aliases=("A100-80GB", "a100-80g", "NVIDIA_A100_80GB"),
    **_NV,
)
NVIDIA_L4 = _model(
    name="nvidia-l4", display_name="NVIDIA L4", bf16=True, device_memory_bytes=24 * _GiB,  # CC 8.9; 24 GB [CC, GCE]
    node_labels=MappingProxyType({"gfd": ("NVIDIA-L4",), "gke": ("nvidia-l4",)}),  # gfd unconfirmed; [GKE]
    aliases=("L4", "NVIDIA_L4"),
    **_NV,
)
NVIDIA_H100 = _model(
    name="nvidia-h100", display_name="NVIDIA H100 80 GB", bf16=True, device_memory_bytes=80 * _GiB,  # CC 9.0 [CC, GKE]
    node_labels=MappingProxyType(
        {"gfd": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"), "gke": ("nvidia-h100-80gb",)}  # gfd unconfirmed; [GKE]
    ),
    aliases=("H100", "h100-80gb", "NVIDIA_H100_80GB"),
    **_NV,
)
NVIDIA_H200 = _model(
    name="nvidia-h200", display_name="NVIDIA H200 141 GB", bf16=True, device_memory_bytes=141 * _GiB,  # [CC, GKE]
    node_labels=MappingProxyType({"gfd": ("NVIDIA-H200",), "gke": ("nvidia-h200-141gb",)}),  # gfd unconfirmed; [GKE]
    aliases=("H200", "h200-141gb", "NVIDIA_H200_141GB"),
    **_NV,
)
_NVIDIA_MODELS = (NVIDIA_K80, NVIDIA_P100, NVIDIA_T4, NVIDIA_V100, NVIDIA_A10, NVIDIA_A100_40GB, NVIDIA_A100_80GB, NVIDIA_L4, NVIDIA_H100, NVIDIA_H200)

_ASCEND = dict(
    vendor="ascend",
    kind=DeviceKind.NPU,
    torch_device_type="npu",  # via torch_npu [TN]
    distributed_backend="hccl",  # [TN]
)


def _ascend(chip: str, hami: str, official: str, label: str | None, bf16: bool, memory_gib: int, **kw: object) -> Accelerator:
    return _model(
        name=f"ascend-{chip.lower()}",
        display_name=f"Ascend {chip}",
        bf16=bf16,
        device_memory_bytes=memory_gib * _GiB,
        resource_names=MappingProxyType({"official": official, "hami": hami}),  # [MCA, MCP] / [HM, HMV]
        node_labels=MappingProxyType({"npu-chip-name": (label,)} if label else {}),  # [MCK]
        # The MindCluster DaemonSet tolerates a NoSchedule taint named after its resource [MCP]; whether nodes
        # carry it is unconfirmed, and tolerating an absent taint is harmless.
        taint_keys=(official,),
        aliases=(chip, f"ascend{chip}", f"huawei-ascend{chip}", hami),
        **_ASCEND,
        **kw,
    )


# Ascend. bf16 iff the torch_npu SoC is >= Ascend910B1 [TN]; memory [TN, HM]. npu.chip.name values 910B1..4 and
# 310P3 [MCK]; the 910A and 910C (A3) values are not documented there.
ASCEND_910A = _ascend("910A", "huawei.com/Ascend910A", "huawei.com/Ascend910", None, False, 32)
ASCEND_910B2 = _ascend("910B2", "huawei.com/Ascend910B2", "huawei.com/Ascend910", "910B2", True, 64)
ASCEND_910B3 = _ascend("910B3", "huawei.com/Ascend910B3", "huawei.com/Ascend910", "910B3", True, 64)
ASCEND_910B4 = _ascend("910B4", "huawei.com/Ascend910B4", "huawei.com/Ascend910", "910B4", True, 32)
# 910C: bf16 if its SoC is Ascend910_93xx (unconfirmed); 64 GB per NPU [TN, HM].
ASCEND_910C = _ascend("910C", "huawei.com/Ascend910C", "huawei.com/Ascend910", None, True, 64, )
ASCEND_310P = _ascend(
    "310P", "huawei.com/Ascend310P", "huawei.com/Ascend310P", "310P3", False, 24,  # 310P3: no bf16, 24 GB [TN, HM]
)
_ASCEND_MODELS = (ASCEND_910A, ASCEND_910B2, ASCEND_910B3, ASCEND_910B4, ASCEND_910C, ASCEND_310P)

# AMD Instinct: ROCm builds of PyTorch drive them as 'cuda' [PH] with nccl (RCCL inside) [RP]; bf16 on any ROCm
# [PC]; memory 128 GiB (two GCDs) / 192 GiB [RS]; resource amd.com/gpu [AMD, HM]; no taint documented [AMD].
_AMD = dict(
    vendor="amd",
    kind=DeviceKind.GPU,
    torch_device_type="cuda",
    distributed_backend="nccl",
    bf16=True,
    resource_names=MappingProxyType({"official": "amd.com/gpu", "hami": "amd.com/gpu"}),
)
AMD_MI250 = _model(
    name="amd-mi250", display_name="AMD Instinct MI250", device_memory_bytes=128 * _GiB,
    aliases=("MI250", "instinct-mi250"), **_AMD,  # amd.com/gpu.product-name value not documented
)
AMD_MI300X = _model(
    name="amd-mi300x", display_name="AMD Instinct MI300X", device_memory_bytes=192 * _GiB,
    node_labels=MappingProxyType({"amd-labeller": ("AMD_Instinct_MI300X_OAM",)}),  # [AMD]
    aliases=("MI300X", "instinct-mi300x"), **_AMD,
)
_AMD_MODELS = (AMD_MI250, AMD_MI300X)

# Intel Gaudi: device 'hpu' via habana_frameworks, backend 'hccl' [HD]; one resource name for every generation
# [HB]; no node label or taint documented; bf16 on all, 32 / 96 / 128 GB [HF].
_GAUDI = dict(
    vendor="gaudi",
    kind=DeviceKind.NPU,
    torch_device_type="hpu",
    distributed_backend="hccl",
    bf16=True,
    resource_names=MappingProxyType({"official": "habana.ai/gaudi", "hami": "habana.ai/gaudi"}),
)
GAUDI1 = _model(name="gaudi1", display_name="Intel Gaudi 1", device_memory_bytes=32 * _GiB, aliases=("gaudi-1", "hl-205"), **_GAUDI)
GAUDI2 = _model(name="gaudi2", display_name="Intel Gaudi 2", device_memory_bytes=96 * _GiB, aliases=("gaudi-2", "hl-225"), **_GAUDI)
GAUDI3 = _model(name="gaudi3", display_name="Intel Gaudi 3", device_memory_bytes=128 * _GiB, aliases=("gaudi-3",), **_GAUDI)
_GAUDI_MODELS = (GAUDI1, GAUDI2, GAUDI3)


def _family(name: str, display_name: str, members: tuple[Accelerator, ...], aliases: tuple[str, ...]) -> Accelerator:
    first = members[0]
    bf16 = {m.bf16 for m in members}
    return Accelerator(
        name=name,
        display_name=display_name,
        vendor=first.vendor,
        kind=first.kind,
        torch_device_type=first.torch_device_type,
        distributed_backend=first.distributed_backend,
        bf16=bf16.pop() if len(bf16) == 1 else None,
        device_memory_bytes=None,
        members=tuple(m.name for m in members),
        taint_keys=tuple(dict.fromkeys(k for m in members for k in m.taint_keys)),
        aliases=aliases,
    )


NVIDIA_GPU = _family("nvidia-gpu", "any NVIDIA GPU", _NVIDIA_MODELS, ("nvidia", "any-nvidia", "nvidia.com/gpu"))
NVIDIA_A100 = _family("nvidia-a100", "any NVIDIA A100", (NVIDIA_A100_40GB, NVIDIA_A100_80GB), ("A100", "any-a100"))
ASCEND_910 = _family(
    "ascend-910", "any Ascend 910",
    (ASCEND_910A, ASCEND_910B2, ASCEND_910B3, ASCEND_910B4, ASCEND_910C),
    ("910", "ascend910", "any-910", "huawei.com/Ascend910"),
)
ASCEND_910B = _family(
    "ascend-910b", "any Ascend 910B", (ASCEND_910B2, ASCEND_910B3, ASCEND_910B4), ("910B", "ascend910b", "any-910b")
)
AMD_GPU = _family("amd-gpu", "any AMD Instinct", _AMD_MODELS, ("amd", "any-amd", "amd.com/gpu"))
GAUDI = _family("gaudi", "any Intel Gaudi", _GAUDI_MODELS, ("intel-gaudi", "any-gaudi", "habana.ai/gaudi"))

ACCELERATORS: Mapping[str, Accelerator] = MappingProxyType(
    {
        a.name: a
        for a in (
            *_NVIDIA_MODELS, NVIDIA_GPU, NVIDIA_A100,
            *_ASCEND_MODELS, ASCEND_910, ASCEND_910B,
            *_AMD_MODELS, AMD_GPU,
            *_GAUDI_MODELS, GAUDI,
        )
    }
)
"""Every model and family, by registry key."""


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _build_index() -> Mapping[str, str]:
    index: dict[str, str] = {}
    for accel in ACCELERATORS.values():
        for spelling in (accel.name, accel.display_name, *accel.aliases):
            key = _normalise(spelling)
            other = index.setdefault(key, accel.name)
            if other != accel.name:  # pragma: no cover - a registry bug, caught by the registry tests
                raise RuntimeError(f"accelerator alias {spelling!r} names both {other} and {accel.name}")
    return MappingProxyType(index)


_INDEX = _build_index()


def find_accelerator(name: str | Accelerator, *, field: str = "accelerator") -> Accelerator:
    """Look up a model or family by its registry key or any alias users write.

    Matching ignores case and reads ``_`` and spaces as ``-``: ``T4``, ``NVIDIA_TESLA_T4``, ``nvidia-tesla-t4``,
    ``A100`` (the family of both A100s), ``ascend-910b3``, ``910B`` (any 910B), ``nvidia.com/gpu`` (any NVIDIA).

    Args:
        name: what the user wrote, or an :class:`Accelerator` (returned as is).
        field: the field name reported in errors.

    Returns:
        The registry entry.

    Raises:
        InvalidResources: no entry has that name; the message lists close matches and every registry key.
    """
    if isinstance(name, Accelerator):
        return name
    if isinstance(name, str):
        found = _INDEX.get(_normalise(name))
        if found is not None:
            return ACCELERATORS[found]
        close = difflib.get_close_matches(_normalise(name), list(_INDEX), n=6, cutoff=0.6)
        names = list(dict.fromkeys(_INDEX[c] for c in close))
        hint = f"; close matches: {', '.join(names)}" if names else ""
    else:
        hint = ""
    raise InvalidResources(f"{field}={name!r} is unknown{hint}; valid: {', '.join(sorted(ACCELERATORS))}")


def default_accelerator(kind: DeviceKind | str) -> Accelerator | None:
    """The accelerator a candidate of ``kind`` asks for when it names none.

    The kind's :attr:`~heteroflow.components.devices.DeviceKind.default_accelerator` registry key (``gpu``: any
    NVIDIA, ``npu``: any Ascend 910); for a kind the registry does not know (a plugin's ``tpu``) with a
    :attr:`~heteroflow.components.devices.DeviceKind.resource_name`, one model standing for the whole kind,
    named after it, whose extended resource is that name under every device-plugin convention; None for the
    CPU, or a kind with neither.

    Raises:
        InvalidResources: ``kind`` is not a registered kind.
    """
    return _default_accelerator(DeviceKind.parse(kind))


@functools.lru_cache(maxsize=None)
def _default_accelerator(kind: DeviceKind) -> Accelerator | None:
    if not kind.has_devices:
        return None
    if kind.default_accelerator is not None:
        return find_accelerator(kind.default_accelerator, field=f"device kind {kind.value!r}: default_accelerator")
    if kind.resource_name is None:
        return None
    return Accelerator(
        name=kind.value,
        display_name=f"any {kind.value}",
        vendor=kind.value,
        kind=kind,
        torch_device_type=kind.torch_device_type,
        distributed_backend=kind.distributed_backend,
        bf16=kind.bf16,
        resource_names=MappingProxyType({p: kind.resource_name for p in PLUGIN_CONVENTIONS}),
        taint_keys=(kind.resource_name,),
    )
