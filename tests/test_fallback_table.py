"""One fallback rule, every engine: the same (failure, candidate, placement) cases give the same decisions in the
rule itself (:func:`heteroflow.components.core.fallback.next_candidate`), the in-process runner, the KFP rendering run
on kfp.local, and the Airflow fallback gate.

The step is a user's toy device-bound step (written into a temporary folder on ``PYTHONPATH``, as kfp.local's step
processes import it by name); the plan step places it against a stated inventory, the npu and gpu kinds are
simulated, and faults are injected per device kind (:mod:`heteroflow.components.core.failures`).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from heteroflow.components.core.fallback import Decision, next_candidate, retry_decision
from heteroflow.components.resources import Candidates, RetryPolicy
from heteroflow.components.core.telemetry import read_step_records

TOY = '''
from pathlib import Path

from heteroflow.components.placement.plan import PLAN
from heteroflow.components.resources import RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step
from heteroflow.pipelines.graph import Pipeline


def probe(out_path: str, *, device: str = "cpu") -> dict:
    """Write where it ran."""
    Path(out_path).write_text(device)
    return {"device": device}


PROBE = step(
    probe,
    outputs=[ArtifactSpec(name="result", type=ArtifactType.ARTIFACT, param="out_path")],
    candidates=["npu", "gpu", "cpu"],
    device_bound=True,
    device_param="device",
)


def table_pipeline():
    p = Pipeline("fallback-table")
    p.add(PLAN)
    p.add(PROBE, retry=RetryPolicy(retries=0))
    return p
'''

BOTH = {"npu": 1, "gpu": 1}
NO_GPU = {"npu": 1, "gpu": 0}

# (id, faults per device kind, the plan's inventory, candidates that run in order, the run's end)
CASES = [
    ("no-failure", {}, BOTH, [0], "succeeded"),
    ("device", {"npu": "device"}, BOTH, [0, 1], "succeeded"),
    ("device-gpu-not-in-placement", {"npu": "device"}, NO_GPU, [0, 2], "succeeded"),
    ("device-twice", {"npu": "device", "gpu": "device"}, BOTH, [0, 1, 2], "succeeded"),
    ("device-on-every-candidate", {"npu": "device", "gpu": "device", "cpu": "device"}, BOTH, [0, 1, 2], "failed"),
    ("permanent", {"npu": "permanent"}, BOTH, [0], "failed"),
    ("transient-retries-spent", {"npu": "transient:5"}, BOTH, [0], "failed"),
    ("permanent-after-a-fallback", {"npu": "device", "gpu": "permanent"}, BOTH, [0, 1], "failed"),
]
IDS = [c[0] for c in CASES]
KINDS = ["npu", "gpu", "cpu"]


def _route(faults: dict[str, str], k: int) -> str:
    return faults.get(KINDS[k], "succeeded").split(":")[0]


class _Call:
    name = "probe"
    candidates = Candidates(["npu", "gpu", "cpu"])
    device_bound = True


def _walk(decide: Any, faults: dict[str, str]) -> tuple[list[int], str]:
    """Candidates run in order and the end, asking ``decide(index, route)`` after each."""
    ran, k = [], 0
    while True:
        ran.append(k)
        route = _route(faults, k)
        target = decide(k, route)
        if route == "succeeded":
            return ran, "succeeded"
        if target is None:
            return ran, "failed"
        k = target


@pytest.fixture()
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    folder = tmp_path / "userpkg"
    folder.mkdir()
    (folder / "fallbacktoy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))  # for kfp.local's step processes
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HETEROFLOW_RUN_DIR", raising=False)
    import fallbacktoy

    yield fallbacktoy
    sys.modules.pop("fallbacktoy", None)


def _faults(faults: dict[str, str]) -> list[str]:
    return [f"probe@{kind}={cls}" for kind, cls in faults.items()]


def _ran(run_dir: str) -> list[int]:
    return [r.candidate for r in read_step_records(run_dir).get("probe", [])]


@pytest.mark.parametrize(("case", "faults", "placement", "ran", "end"), CASES, ids=IDS)
def test_the_rule(case: str, faults: dict[str, str], placement: dict[str, int], ran: list[int], end: str) -> None:
    def decide(k: int, route: str) -> int | None:
        d = next_candidate(_Call(), k, route, placement)
        assert isinstance(d, Decision)
        assert (d.action == "done") == (route == "succeeded")
        return d.target

    assert _walk(decide, faults) == (ran, end)


@pytest.mark.parametrize(("case", "faults", "placement", "ran", "end"), CASES, ids=IDS)
def test_the_airflow_gate(case: str, faults: dict[str, str], placement: dict[str, int], ran: list[int], end: str, toy: Any) -> None:
    pytest.importorskip("airflow", reason="Airflow is not installed (extra heteroflow[airflow])")
    from heteroflow.dags.layout import Layout
    from heteroflow.dags.operators import FallbackGateOperator

    p = toy.table_pipeline()
    layout = Layout(p)

    def decide(k: int, route: str) -> int | None:
        if route == "succeeded" or k + 1 >= len(KINDS):
            return None  # a success skips the later gates; the last candidate has no gate after it
        gate = FallbackGateOperator(task_id=f"g{k + 1}", pipeline=p, layout=layout, call_name="probe", candidate_index=k + 1)
        failure = {"failure": route, "reason": f"{route} on {KINDS[k]}", "candidate": k, "kind": KINDS[k]}
        return gate.decide(failure, placement)["target"]

    assert _walk(decide, faults) == (ran, end)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "faults", "placement", "ran", "end"), CASES, ids=IDS)
def test_the_inprocess_runner(case: str, faults: dict[str, str], placement: dict[str, int], ran: list[int], end: str, toy: Any, tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(
        toy.table_pipeline(),
        {"device_inventory": json.dumps(placement)},
        run_dir=tmp_path / "run",
        simulate_devices="npu",
        inject_faults=_faults(faults),
        sleep=lambda s: None,
    )
    assert (_ran(record.run_dir), record.status) == (ran, end)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "faults", "placement", "ran", "end"), CASES, ids=IDS)
def test_kfp_local(case: str, faults: dict[str, str], placement: dict[str, int], ran: list[int], end: str, toy: Any, tmp_path: Path) -> None:
    pytest.importorskip("kfp", reason="kfp is not installed (extra heteroflow[kfp])")
    from heteroflow.pipelines.kfp.local import run_local

    record = run_local(
        {"device_inventory": json.dumps(placement)},
        pipeline=toy.table_pipeline(),
        run_dir=tmp_path / "run",
        simulate_devices="npu",
        inject_faults=_faults(faults),
    )
    log = Path(record.run_dir, "kfp.log")
    assert (_ran(record.run_dir), record.status) == (ran, end), log.read_text()[-3000:] if log.is_file() else ""
    if end == "failed":
        assert record.step("probe").status == "failed"


def test_the_retry_rule() -> None:
    policy = RetryPolicy(retries=3, backoff_seconds=10, factor=2, max_delay_seconds=25, window_seconds=60)
    assert [retry_decision(policy, "transient", n) for n in range(4)] == [10, 20, 25, None]
    assert retry_decision(policy, "transient", 1, elapsed_seconds=45) is None  # 45 + 20 s starts after the window
    assert retry_decision(policy, "device", 0) is None  # a failed device never spends a retry
    assert retry_decision(policy, "permanent", 0) is None


def test_the_rule_rejects_what_is_not_a_route() -> None:
    with pytest.raises(ValueError, match="failure='oom' is not valid"):
        next_candidate(_Call(), 0, "oom")
    with pytest.raises(ValueError, match="out of range"):
        next_candidate(_Call(), 3, "device")
