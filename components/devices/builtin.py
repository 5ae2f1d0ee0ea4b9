"""The built-in device kinds: ``cpu``, ``gpu`` (CUDA: NVIDIA, and AMD through ROCm builds), ``npu`` (Ascend
through torch_npu).

Sources (keys of ``shared/accelerators.md``): PyTorch device types and backends [PD, PH, TN]; extended resources
and default families [NVR, MCA]; node labels [GFD, MCK]; device files of the NVIDIA, ROCm (KFD) and Ascend
drivers; error messages of CUDA, NCCL, torch_npu and CANN as they appear in the PyTorch and torch_npu sources.
"""

from __future__ import annotations

from typing import Any

from heteroflow.components.devices.kind import DeviceKind, FailurePattern, Probe

__all__ = ["BUILTINS", "CPU", "GPU", "NPU"]


def _cuda_probe(kind: DeviceKind, torch: Any) -> Probe:
    if not torch.cuda.is_available():
        cpu_only = not (torch.version.cuda or torch.version.hip)
        return Probe(0, "torch.cuda.is_available() is False"
                        + (f" (torch {torch.__version__} is a CPU-only build)" if cpu_only else ""))
    return Probe(int(torch.cuda.device_count()), "", kind.device_names(torch))


def _cuda_names(torch: Any) -> list[str]:
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


CPU = DeviceKind(
    name="cpu",
    description="the host CPU (always present; a candidate of it asks for cores and memory, no devices)",
    has_devices=False,
    torch_device_type="cpu",
    distributed_backend="gloo",  # [PD]
)

GPU = DeviceKind(
    name="gpu",
    aliases=("cuda",),
    description="a CUDA device: NVIDIA, or AMD Instinct through a ROCm build of PyTorch",
    torch_device_type="cuda",  # ROCm builds drive AMD GPUs as 'cuda' too [PD, PH]
    device_noun="CUDA device",
    distributed_backend="nccl",  # RCCL inside on ROCm [PD]
    default_accelerator="nvidia-gpu",
    node_label_keys=("nvidia.com/gpu.product",),  # [GFD]
    device_files=("/dev/nvidiactl", "/dev/kfd"),  # the NVIDIA driver's control device; AMD's KFD driver
    driver_name="GPU",
    synchronizes=True,
    profiler_activity="CUDA",
    tracks_peak_memory=True,
    failure_patterns=(
        FailurePattern(
            rule="CUDA device-side assert (a bug in a kernel's input)",
            failure_class="permanent",
            messages=("device-side assert triggered",),
        ),
        FailurePattern(
            rule="CUDA/NCCL driver or runtime error",
            failure_class="device",
            messages=(
                "CUDA error:",
                "No CUDA GPUs are available",
                "Found no NVIDIA driver on your system",
                "CUDA driver initialization failed",
                "Torch not compiled with CUDA enabled",
                "NCCL error",
                "CUDA-capable device",
            ),
            exception_types=(RuntimeError, AssertionError),
            torch_types=("AcceleratorError",),  # torch >= 2.8 raises it for CUDA runtime errors
        ),
    ),
    probe_hook=_cuda_probe,
    model_names_hook=_cuda_names,
)

NPU = DeviceKind(
    name="npu",
    aliases=("ascend",),
    description="an AI accelerator that is not a GPU: Ascend through torch_npu",
    torch_device_type="npu",  # [TN]
    torch_module="torch_npu",  # registers the 'npu' device type with torch [TN]
    device_noun="Ascend NPU",
    distributed_backend="hccl",  # [TN]
    default_accelerator="ascend-910",
    node_label_keys=("node.kubernetes.io/npu.chip.name",),  # [MCK]
    device_files=("/dev/davinci_manager",),  # the Ascend driver's management device (/dev/davinci<N> per chip)
    driver_name="Ascend",
    failure_patterns=(
        FailurePattern(
            rule="NPU out of memory",
            failure_class="device",
            messages=("NPU out of memory",),
            exception_types=(RuntimeError,),
        ),
        FailurePattern(
            rule="torch_npu/CANN/HCCL runtime error",
            failure_class="device",
            messages=("NPU function error:", "HCCL", "PTA call acl api failed", "The device is unavailable"),
            exception_types=(RuntimeError,),
        ),
    ),
)

BUILTINS = (CPU, GPU, NPU)
"""The built-in kinds, in the order the registry lists them."""
