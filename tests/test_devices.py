"""Device kinds as data (heteroflow.components.devices): the kind object, the registry, entry-point plugins and
the three built-in registrations."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.components.devices import accelerators
from heteroflow.components.devices import DeviceKind, FailurePattern, all_kinds, for_torch_device_type, get, register
from heteroflow.components.devices import registry as _registry
from heteroflow.components.errors import InvalidResources
from heteroflow.components.core.failures import FailureClass, classify, simulated_devices
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import Resources


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Registrations made in a test are undone after it."""
    all_kinds()
    kinds, aliases, state = dict(_registry._KINDS), dict(_registry._ALIASES), dict(_registry._state)
    try:
        yield
    finally:
        _registry._KINDS.clear()
        _registry._KINDS.update(kinds)
        _registry._ALIASES.clear()
        _registry._ALIASES.update(aliases)
        _registry._state.update(state)
        accelerators._default_accelerator.cache_clear()


# -- the built-ins ----------------------------------------------------------------------------------------------

BUILTIN = [
    # name, has_devices, torch type, module, backend, default accelerator, label keys, profiler activity
    ("cpu", False, "cpu", None, "gloo", None, (), None),
    ("gpu", True, "cuda", None, "nccl", "nvidia-gpu", ("nvidia.com/gpu.product",), "CUDA"),
    ("npu", True, "npu", "torch_npu", "hccl", "ascend-910", ("node.kubernetes.io/npu.chip.name",), None),
]


@pytest.mark.parametrize(("name", "has_devices", "dtype", "module", "backend", "accel", "labels", "activity"), BUILTIN,
                         ids=[b[0] for b in BUILTIN])
def test_builtin_kind_properties(name: str, has_devices: bool, dtype: str, module: str | None, backend: str,
                                 accel: str | None, labels: tuple[str, ...], activity: str | None) -> None:
    kind = get(name)
    assert (kind.has_devices, kind.torch_device_type, kind.torch_module, kind.distributed_backend) == (
        has_devices, dtype, module, backend)
    assert (kind.default_accelerator, kind.node_label_keys, kind.profiler_activity) == (accel, labels, activity)
    assert kind.simulated_device_type == "cpu"
    assert for_torch_device_type(dtype) is kind
    default = accelerators.default_accelerator(kind)
    assert (default.name if default else None) == accel
    if default is not None:
        assert default.kind is kind


def test_builtin_order_and_enum_like_access() -> None:
    assert list(DeviceKind) == list(all_kinds()) and len(DeviceKind) == len(all_kinds())
    assert [k.value for k in all_kinds()][:3] == ["cpu", "gpu", "npu"]
    assert DeviceKind.GPU is get("gpu") and DeviceKind("npu") is DeviceKind.NPU
    with pytest.raises(AttributeError):
        DeviceKind.NO_SUCH_KIND  # noqa: B018


def test_builtin_failure_patterns_classify_runtime_errors() -> None:
    assert classify(RuntimeError("CUDA error: invalid device ordinal")).cls is FailureClass.DEVICE
    assert classify(RuntimeError("CUDA error: device-side assert triggered")).cls is FailureClass.PERMANENT
    assert classify(RuntimeError("NPU out of memory. Tried to allocate 52.00 MiB")).rule == "NPU out of memory"
    assert classify(RuntimeError("HCCL timeout")).rule == "torch_npu/CANN/HCCL runtime error"
    assert classify(ValueError("CUDA error: but a ValueError")).cls is FailureClass.PERMANENT  # types are part of the rule


def test_gpu_and_npu_probe_answer_without_torch_when_no_driver_file_exists() -> None:
    for kind in (DeviceKind.GPU, DeviceKind.NPU):
        if any(os.path.exists(p) for p in kind.device_files):
            pytest.skip(f"this machine has the {kind} driver device file(s) {kind.device_files}: the no-driver answer cannot be observed here")
        probe = kind.probe()
        assert probe.count == 0 and "driver device file" in probe.note
    assert DeviceKind.CPU.probe().count == 1


# -- the kind object --------------------------------------------------------------------------------------------


def test_a_kind_is_its_name_as_a_string() -> None:
    gpu = DeviceKind.GPU
    assert gpu == "gpu" and hash(gpu) == hash("gpu") and {"gpu": 1}[gpu] == 1
    assert str(gpu) == "gpu" and f"{gpu}" == "gpu" and f"{gpu:>4}" == " gpu"
    assert json.dumps({"kind": gpu, gpu: 2}) == '{"kind": "gpu", "gpu": 2}'
    assert type(gpu.value) is str and gpu.value == "gpu"
    assert repr(gpu) == "DeviceKind('gpu')"
    assert pickle.loads(pickle.dumps(gpu)) is gpu and copy.deepcopy(gpu) is gpu and copy.copy(gpu) is gpu
    with pytest.raises(AttributeError, match="read-only"):
        gpu.distributed_backend = "gloo"  # type: ignore[misc]


@pytest.mark.parametrize(("text", "name"), [("cuda", "gpu"), (" GPU ", "gpu"), ("Ascend", "npu"), ("CPU", "cpu")])
def test_aliases_and_case_parse_to_the_kind(text: str, name: str) -> None:
    assert DeviceKind.parse(text) is get(name)
    assert Resources(kind=text).kind is get(name)


@pytest.mark.parametrize("value", ["tpu", "", 3, None])
def test_an_unknown_kind_names_the_field_and_lists_the_kinds(value: object) -> None:
    with pytest.raises(InvalidResources, match=r"^train kind=.* is not a device kind; valid kinds: cpu, gpu, npu"):
        DeviceKind.parse(value, field="train kind")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"name": "TPU"}, "name"), ({"name": ""}, "name"), ({"name": "a,b"}, "name"), ({"name": "x", "aliases": "y"}, "aliases")],
)
def test_defining_a_kind_checks_its_fields(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidResources, match=field):
        DeviceKind(**kw)


def test_failure_pattern_checks_its_class() -> None:
    with pytest.raises(InvalidResources, match="failure_class='fatal' is unknown; valid: device, transient, permanent"):
        FailurePattern(rule="r", failure_class="fatal", messages=("x",))
    with pytest.raises(InvalidResources, match="neither messages nor torch_types"):
        FailurePattern(rule="r", failure_class="device")


# -- registering ------------------------------------------------------------------------------------------------


def _xpu() -> DeviceKind:
    return DeviceKind(
        name="xpu", aliases=("intel-gpu",), torch_device_type="xpu", resource_name="gpu.intel.com/i915",
        failure_patterns=(FailurePattern(rule="XPU runtime error", failure_class="device",
                                         messages=("UR_RESULT_ERROR_DEVICE_LOST",), exception_types=(RuntimeError,)),),
    )


def test_a_registered_kind_works_where_kinds_are_accepted(clean_registry: None) -> None:
    xpu = register(_xpu())
    assert DeviceKind.parse("Intel-GPU") is xpu and DeviceKind.XPU is xpu and xpu in list(DeviceKind)
    res = Resources(kind="xpu", count=2, cpu="4", memory="8Gi")
    assert res.k8s_limits() == {"cpu": "4", "memory": "8Gi", "gpu.intel.com/i915": "2"}
    assert (res.torch_device_type, res.describe()) == ("xpu", "xpu x2 (xpu), 4 CPU, 8Gi")
    assert Resources.from_dict(res.to_dict()) == res and res.to_dict()["kind"] == "xpu"
    failure = classify(RuntimeError("UR_RESULT_ERROR_DEVICE_LOST on device 0"))
    assert (failure.cls, failure.rule) == (FailureClass.DEVICE, "XPU runtime error")
    assert simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "xpu"}) == {"xpu": ""}
    from heteroflow.components.placement.plan import local_inventory

    inv = local_inventory()  # no driver file, no probe hook: counted 0 without importing torch, and says why
    assert inv.devices[xpu] == 0 and "cannot detect xpu devices" in inv.notes[xpu]
    with pytest.raises(InvalidParameter, match="the CPU is always present; simulate gpu, npu or xpu"):
        simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "cpu"})


def test_registering_refuses_a_taken_name_or_alias(clean_registry: None) -> None:
    with pytest.raises(InvalidResources, match="device kind 'gpu' is already registered"):
        register(DeviceKind(name="gpu"))
    with pytest.raises(InvalidResources, match="alias 'cuda' of device kind 'xpu' already names 'gpu'"):
        register(DeviceKind(name="xpu", aliases=("cuda",)))
    with pytest.raises(InvalidResources, match="is not a DeviceKind"):
        register("tpu")  # type: ignore[arg-type]


def _dist(tmp_path: Path, module: str, body: str, entry: str) -> Path:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[heteroflow.devices]\n{entry}\n")
    return tmp_path


def _run(code: str, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_an_entry_point_registers_a_kind_lazily_and_once(tmp_path: Path) -> None:
    path = _dist(tmp_path, "hf_fpga", """
        from heteroflow.components.devices import DeviceKind
        CALLS = []
        def kinds():
            CALLS.append(1)
            return [DeviceKind(name="fpga", aliases=("alveo",), resource_name="xilinx.com/fpga")]
        """, "fpga = hf_fpga:kinds")
    out = _run("""
        import json, sys
        from heteroflow.components.devices import DeviceKind, registry
        before = registry._state["plugins"]
        gpu = DeviceKind.parse("gpu")                 # a built-in: no entry point loaded yet
        after_builtin = registry._state["plugins"]
        fpga = DeviceKind.parse("Alveo")              # unknown: load the entry points
        DeviceKind.parse("fpga"); list(DeviceKind)    # loaded once
        import hf_fpga
        print(json.dumps([before, after_builtin, fpga.value, fpga.resource_name, len(hf_fpga.CALLS),
                          [k.value for k in DeviceKind]]))
        """, path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [False, False, "fpga", "xilinx.com/fpga", 1, ["cpu", "gpu", "npu", "fpga"]]


def test_a_broken_entry_point_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = _dist(tmp_path, "hf_broken", "raise ImportError('no such driver')\n", "broken = hf_broken:KIND")
    out = _run("""
        from heteroflow.components.devices import DeviceKind
        print([k.value for k in DeviceKind])
        """, path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['cpu', 'gpu', 'npu']"
    assert "device-kind plugin 'broken = hf_broken:KIND' (heteroflow.devices) not loaded: no such driver" in out.stderr


def test_the_gpu_probe_counts_cuda_devices_per_registry_model() -> None:
    from types import SimpleNamespace

    from heteroflow.components.placement.plan import _registry_models

    names = ["NVIDIA H200", "NVIDIA H200", "Tesla T4"]
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: len(names), get_device_name=names.__getitem__)
    torch = SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda="12.4", hip=None), __version__="2.8.0")
    probe = DeviceKind.GPU.probe_hook(DeviceKind.GPU, torch)
    assert (probe.count, probe.note, probe.names) == (3, "", tuple(names))
    assert _registry_models(probe.names) == {"nvidia-h200": 2, "nvidia-t4": 1}
    assert _registry_models(("Some Future GPU",)) is None  # then only the count is known
    cpu_only = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False), version=SimpleNamespace(cuda=None, hip=None),
                               __version__="2.8.0+cpu")
    probe = DeviceKind.GPU.probe_hook(DeviceKind.GPU, cpu_only)
    assert (probe.count, probe.note) == (0, "torch.cuda.is_available() is False (torch 2.8.0+cpu is a CPU-only build)")
