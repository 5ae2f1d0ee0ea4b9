"""A device kind registered at run time flows through every place that decides by kind, with no code edits:
resources and pod rendering, the plan's candidate choice, failure classification and fallback, Airflow pools,
the distributed backend and precision. Nothing in heteroflow names the kind; each test registers it and
unregisters it afterwards (:func:`heteroflow.components.devices.unregister`).

The kinds' facts come from ``shared/accelerators.md``: Cambricon MLU: extended resource ``cambricon.com/mlu``
[CB], PyTorch device ``mlu`` through ``import torch_mlu`` and backend ``cncl`` [TM]; Intel GPU: device ``xpu``
(built into PyTorch >= 2.5) [PX], backend ``xccl`` [PD], resource ``gpu.intel.com/xe`` [IN]. The failure
messages are the tests' own patterns (what a kind's author would list).
"""

# no `from __future__ import annotations`: KFP reads the component's annotations as types
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.components.core.failures import FailureClass, classify
from heteroflow.components.core.fallback import cannot_run, next_candidate
from heteroflow.components.devices import DeviceKind, FailurePattern, find, register, unregister
from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.plan import Inventory, plan
from heteroflow.components.resources import Candidates, Resources


def _mlu() -> DeviceKind:
    return DeviceKind(
        name="mlu", aliases=("cambricon",), description="a Cambricon MLU through torch_mlu",
        torch_device_type="mlu", torch_module="torch_mlu", device_noun="Cambricon MLU",
        distributed_backend="cncl", resource_name="cambricon.com/mlu",
        failure_patterns=(FailurePattern(rule="CNRT/CNCL runtime error", failure_class="device",
                                         messages=("CNRT error", "CNCL error"), exception_types=(RuntimeError,)),),
    )


def _xpu(bf16: bool | None) -> DeviceKind:
    return DeviceKind(name="xpu", torch_device_type="xpu", distributed_backend="xccl",
                      resource_name="gpu.intel.com/xe", bf16=bf16)


@pytest.fixture
def mlu() -> Iterator[DeviceKind]:
    kind = register(_mlu())
    try:
        yield kind
    finally:
        unregister(kind)
    assert find("mlu") is None and find("cambricon") is None


def test_resources_and_the_pod_render_the_kinds_resource(mlu: DeviceKind) -> None:
    from heteroflow.pipelines.k8s.resources import build_pod_resources

    res = Resources(kind="Cambricon", count=2, cpu="4", memory="8Gi")
    assert res.kind is mlu
    assert res.k8s_limits() == {"cpu": "4", "memory": "8Gi", "cambricon.com/mlu": "2"}
    assert (res.torch_device_type, res.distributed_backend) == ("mlu", "cncl")
    assert res.describe() == "mlu x2 (mlu), 4 CPU, 8Gi"
    assert Resources.from_dict(res.to_dict()) == res
    assert Resources.parse_spec("mlu:count=2,cpu=4,memory=8Gi") == res
    pod = build_pod_resources(res)
    assert pod.resources.limits["cambricon.com/mlu"] == "2" and pod.resources.requests["cambricon.com/mlu"] == "2"
    assert [(t.key, t.operator, t.effect) for t in pod.tolerations] == [("cambricon.com/mlu", "Exists", "NoSchedule")]


@pytest.mark.filterwarnings("ignore:The default base_image used by the @dsl.component:FutureWarning")
def test_a_kfp_task_asks_for_the_kinds_resource(mlu: DeviceKind, tmp_path: Path) -> None:
    """Compiled with KFP's compiler: the task's accelerator is the kind's extended resource and count."""
    import yaml
    from kfp import compiler, dsl

    from heteroflow.pipelines.kfp.resources import apply_resources

    @dsl.component(base_image="python:3.11")
    def echo(text: str) -> str:
        return text

    @dsl.pipeline(name="mlu-task")
    def pipeline() -> None:
        apply_resources(echo(text="x"), Resources(kind="mlu", count=2, cpu="4", memory="8Gi"))

    path = tmp_path / "mlu.yaml"
    compiler.Compiler().compile(pipeline, str(path))
    spec = next(iter(yaml.safe_load_all(path.read_text())))
    [executor] = spec["deploymentSpec"]["executors"].values()
    resources = executor["container"]["resources"]
    assert resources["accelerator"]["resourceType"] == "cambricon.com/mlu"
    assert str(resources["accelerator"]["resourceCount"]) == "2"


def test_the_plan_chooses_or_passes_over_the_kind_by_its_count(mlu: DeviceKind) -> None:
    candidates = Candidates(["mlu:count=2", "cpu"])
    chosen = plan(candidates, inventory=Inventory.from_mapping({"mlu": 4}))
    assert (chosen.index, chosen.device_kind, chosen.torch_device) == (0, "mlu", "mlu")
    assert "4 mlu device(s)" in chosen.explanation
    fallen = plan(candidates, inventory=Inventory.from_mapping({"mlu": 1}))
    assert (fallen.index, fallen.device_kind, fallen.torch_device) == (1, "cpu", "cpu")
    assert fallen.passed_over == ("candidate 0 (mlu x2 (mlu), 1 CPU, 2Gi): needs 2 mlu device(s); 1 mlu device(s) here",)


def test_its_failures_classify_as_device_and_fall_back(mlu: DeviceKind) -> None:
    failure = classify(RuntimeError("CNRT error: the device is lost (code 100)"))
    assert (failure.cls, failure.rule) == (FailureClass.DEVICE, "CNRT/CNCL runtime error")
    assert classify(ValueError("CNRT error: in a ValueError")).cls is FailureClass.PERMANENT  # the pattern's types hold

    class Call:
        name = "train"
        candidates = Candidates(["mlu:count=2", "gpu", "cpu"])
        device_bound = True

    decision = next_candidate(Call(), 0, "device", {"mlu": 2, "gpu": 0}, reason=failure.rule)
    assert (decision.action, decision.target) == ("fallback", 2)
    assert decision.passed_over == ("candidate 1 (gpu x1 (nvidia-gpu), 1 CPU, 2Gi): the plan's inventory has 0 gpu device(s), needs 1",)
    assert cannot_run(Resources(kind="mlu", count=2), {"mlu": 1}) == "the plan's inventory has 1 mlu device(s), needs 2"
    assert cannot_run(Resources(kind="mlu", count=2), {"mlu": 2}) is None


def test_airflow_pools_count_the_kinds_devices(mlu: DeviceKind) -> None:
    pytest.importorskip("airflow", reason="Airflow is not installed (extra heteroflow[airflow])")
    from heteroflow.dags.layout import pool_for
    from heteroflow.dags.pools import pool_plan

    pools = pool_plan(Inventory.from_mapping({"mlu": 8, "gpu": 2}))
    assert pools["heteroflow-mlu"] == (8, "heteroflow: one slot per mlu device (any model)")
    assert pools["heteroflow-gpu"][0] == 2 and "heteroflow-cpu" not in pools
    assert pool_for(Resources(kind="mlu", count=4)) == ("heteroflow-mlu", 4)  # a pool pool_plan makes
    assert pool_for(Resources(kind="cpu")) == (None, 1)


def test_the_distributed_backend_is_the_kinds(mlu: DeviceKind) -> None:
    from heteroflow.components.training.rendezvous import backend_for

    assert backend_for("mlu") == "cncl" and backend_for(["mlu", "mlu"]) == "cncl"
    assert backend_for(["mlu", "cuda"]) == "gloo"  # CNCL and NCCL groups cannot span each other's devices


@pytest.mark.parametrize(("bf16", "auto", "bf16_candidate"), [(True, "bfloat16", True), (None, "float16", False)])
def test_precision_follows_the_kinds_bf16(bf16: bool | None, auto: str, bf16_candidate: bool) -> None:
    """``auto`` is bf16 on a kind that states bf16, else what torch answers (this CPU build: no XPU, no bf16);
    a ``precision="bf16"`` candidate of the kind is valid only when the kind states bf16."""
    import torch

    from heteroflow.components.training.precision import resolve_precision

    kind = register(_xpu(bf16))
    try:
        res_bf16 = Resources(kind="xpu")
        assert res_bf16.accelerator_spec.bf16 is bf16
        if bf16_candidate:
            assert Resources(kind="xpu", precision="bf16").accelerator_models[0].bf16
        else:
            with pytest.raises(InvalidResources, match="precision='bf16' on accelerator='xpu'"):
                Resources(kind="xpu", precision="bf16")
        device = torch.device(kind.torch_device_type)
        assert resolve_precision("auto", device) is getattr(torch, auto)
        assert resolve_precision("auto", device, bf16=res_bf16.accelerator_spec.bf16) is getattr(torch, auto)
        assert resolve_precision("auto", torch.device("cpu")) is None
    finally:
        unregister(kind)


def test_unregister_refuses_builtin_and_unknown_kinds() -> None:
    with pytest.raises(InvalidResources, match="'gpu' is built in"):
        unregister("cuda")
    with pytest.raises(InvalidResources, match="'mlu' is not registered"):
        unregister("mlu")


# --- the device set-up of a replica, and the host kind, asked of the kind object ---------------------------


class _Recorder:
    """A fake ``torch.<type>`` namespace: records ``set_device`` calls."""

    def __init__(self, available: bool = True) -> None:
        self.calls: list[int] = []
        self.available = available

    def set_device(self, index: int) -> None:
        self.calls.append(index)

    def is_available(self) -> bool:
        return self.available


@pytest.fixture
def xpu() -> Iterator[DeviceKind]:
    kind = register(_xpu(None))
    try:
        yield kind
    finally:
        unregister(kind)


def test_set_device_imports_the_kinds_module_and_selects_the_index(mlu: DeviceKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin kind's set_device imports its torch module first (which registers the device type), then calls
    ``torch.<type>.set_device``; torch's device-agnostic API when the namespace has none; nothing on the host."""
    import sys
    import types

    from heteroflow.components.errors import DeviceUnavailable

    with pytest.raises(DeviceUnavailable, match="torch_mlu is not installed"):
        mlu.set_device(0, torch=types.SimpleNamespace(mlu=_Recorder()))
    monkeypatch.setitem(sys.modules, "torch_mlu", types.ModuleType("torch_mlu"))
    fake = types.SimpleNamespace(mlu=_Recorder())
    mlu.set_device(2, torch=fake)
    assert fake.mlu.calls == [2]
    mlu.set_device(1, device_type="cpu", torch=fake)  # a simulated replica runs on the host: nothing to select
    DeviceKind.host().set_device(3, torch=fake)
    assert fake.mlu.calls == [2]

    picked: list[int] = []
    current = types.SimpleNamespace(type="mlu")
    accelerator = types.SimpleNamespace(is_available=lambda: True, current_accelerator=lambda: current,
                                        set_device_index=picked.append)
    mlu.set_device(5, torch=types.SimpleNamespace(accelerator=accelerator))  # no torch.mlu.set_device
    assert picked == [5]


def test_ddp_device_ids_and_torch_device_come_from_the_kind(xpu: DeviceKind) -> None:
    import torch

    assert xpu.torch_device(3) == torch.device("xpu", 3) and xpu.torch_device() == torch.device("xpu")
    assert xpu.torch_device(3, device_type="cpu") == torch.device("cpu")  # simulated on the host
    assert xpu.ddp_device_ids(torch.device("xpu", 3)) == [3]
    assert xpu.ddp_device_ids(torch.device("xpu")) is None  # no index: DDP takes the current device
    assert xpu.ddp_device_ids(torch.device("cpu")) is None
    host = DeviceKind.host()
    assert host.is_host and not xpu.is_host
    assert host.torch_device(3) == torch.device("cpu") and host.ddp_device_ids(torch.device("cpu")) is None


def test_a_mixed_replica_selects_its_kinds_device_at_its_local_rank(xpu: DeviceKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """components/training/mixed.py's set-up: a replica of a plugin kind calls that kind's set_device with its
    local rank and builds its kind group on the kind's backend; a simulated replica of it stays on the host."""
    import torch

    from heteroflow.components.training import mixed
    from heteroflow.components.training.hierarchy import Hierarchy

    seen: list[tuple[str, str | None]] = []

    class Built(Exception):
        pass

    def build(kind: str, *, kind_backend: str | None = None) -> None:
        seen.append((kind, kind_backend))
        raise Built

    recorder = _Recorder()
    monkeypatch.setattr(torch.xpu, "set_device", recorder.set_device)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # _train sets one thread: not this process's
    monkeypatch.setattr(Hierarchy, "build", staticmethod(build))
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv(mixed.DEVICE_ENV, "xpu")
    with pytest.raises(Built):
        mixed._train(None, "xpu", 1.0, None)  # type: ignore[arg-type]  # stops where the groups are built
    assert recorder.calls == [3] and seen == [("xpu", "xccl")]
    monkeypatch.setenv(mixed.DEVICE_ENV, "cpu")  # the same kind simulated on the host
    with pytest.raises(Built):
        mixed._train(None, "xpu", 1.0, None)  # type: ignore[arg-type]
    assert recorder.calls == [3] and seen[-1] == ("xpu", "gloo")


def test_a_distributed_worker_selects_its_kinds_device(xpu: DeviceKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """components/training/worker.py: the worker of local rank 1 on a plugin kind's devices selects device 1
    through the kind, before it resolves its function."""
    import sys

    import torch

    from heteroflow.components.training.worker import _run_worker

    recorder = _Recorder()
    monkeypatch.setattr(torch.xpu, "set_device", recorder.set_device)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    payload = {"device_types": ["xpu", "xpu"], "deterministic": False, "sys_path": list(sys.path),
               "function": "heteroflow_no_such_module_for_this_test:fn"}
    with pytest.raises(ModuleNotFoundError, match="heteroflow_no_such_module_for_this_test"):
        _run_worker(payload, 1)
    assert recorder.calls == [1]


@pytest.mark.parametrize(("backend", "device_type", "ids", "relay"),
                         [("gloo", "xpu", [1], True), ("xccl", "xpu", [1], False), ("gloo", "cpu", None, False)])
def test_ddp_of_a_worker_relays_through_the_host_in_the_hosts_backend(
        xpu: DeviceKind, monkeypatch: pytest.MonkeyPatch, backend: str, device_type: str, ids: list[int] | None,
        relay: bool) -> None:
    """A plugin kind's rank in a group of the host kind's backend (gloo, mixed device types) reduces host
    copies; in its own backend it reduces on the device; a host rank has no device ids."""
    import torch

    from heteroflow.components.training import worker

    made: dict[str, object] = {}

    class FakeDDP:
        def __init__(self, module: object, **kwargs: object) -> None:
            made.update(kwargs)

        def register_comm_hook(self, state: object, hook: object) -> None:
            made["hook"] = hook

    def comm_hook(compression: str, **kwargs: object) -> tuple[object, object]:
        made.update(kwargs)
        return None, "hook"

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", FakeDDP)
    monkeypatch.setattr(worker, "comm_hook", comm_hook)
    ctx = worker.DistributedContext(rank=1, local_rank=1, world_size=2, backend=backend, device_type=device_type,
                                    device_index=1)
    ctx.ddp(torch.nn.Linear(2, 2))
    assert (made["device_ids"], made["relay_through_cpu"], made["hook"]) == (ids, relay, "hook")


def test_the_host_kind_stays_the_builtin_cpu(xpu: DeviceKind) -> None:
    """A plugin kind that asks for no devices is a host kind too, but the host (the default kind, the kind every
    inventory has, the world group's backend across kinds) stays the built-in cpu."""
    from heteroflow.components.devices import cross_kind_backend, host_kind
    from heteroflow.components.placement.inventory import from_mapping
    from heteroflow.components.training.step import _where

    vhost = register(DeviceKind(name="vhost", has_devices=False, torch_device_type="cpu", distributed_backend="mpi"))
    try:
        assert vhost.is_host and host_kind() is DeviceKind.host() is DeviceKind.CPU
        assert cross_kind_backend() == "gloo"
        assert Resources().kind is DeviceKind.CPU
        assert from_mapping({"xpu": 4}, source="test").devices_per_kind() == {DeviceKind.CPU: 1, xpu: 4}
    finally:
        unregister(vhost)
    assert _where({"device_kind": "xpu", "device": "cpu"}) == "xpu (simulated, on cpu)"
    assert _where({"device_kind": "xpu", "device": "xpu:0"}) == "xpu (on xpu:0)"


def test_resolve_device_asks_torch_about_a_kind_torch_has_no_module_for() -> None:
    """components/training/device.py: a plugin kind whose device type torch has no ``torch.<type>`` module for
    is not the host: torch's device-agnostic API answers whether it is here (on this CPU machine: not)."""
    import torch

    from heteroflow.components.errors import DeviceUnavailable
    from heteroflow.components.training.device import resolve_device

    assert getattr(torch, "ve", None) is None  # NEC's vector engine: a device type torch parses, with no module
    kind = register(DeviceKind(name="vector", torch_device_type="ve"))
    try:
        with pytest.raises(DeviceUnavailable, match="no ve device is available"):
            resolve_device("ve:1")
        assert resolve_device("cpu") == torch.device("cpu")
    finally:
        unregister(kind)
