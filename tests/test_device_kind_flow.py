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
