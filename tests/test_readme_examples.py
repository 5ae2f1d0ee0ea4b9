"""The README's extension-point examples (section "Extension points") run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _examples() -> list[str]:
    text = README.read_text()
    section = text[text.index("### Extension points") :]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_there_is_one_example_per_extension_point() -> None:
    assert len(_examples()) == 4


def test_the_device_kind_example_defines_a_kind_every_rendering_can_use() -> None:
    from heteroflow.components.devices import DeviceKind

    scope: dict = {}
    exec(_examples()[0], scope)  # noqa: S102 - our own README
    tpu = scope["TPU"]
    assert isinstance(tpu, DeviceKind) and tpu == "tpu" and tpu.distributed_backend == "xla"


def test_the_engine_example_is_an_engine_the_registry_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from heteroflow.pipelines.engines import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    scope: dict = {}
    exec(_examples()[1], scope)  # noqa: S102
    engine = registry.register_engine(scope["Recording"]())
    assert registry.get_engine("recording") is engine and "recording" in registry.engine_names()
    # it says the run's folder (it printed 'running heteroflow-default in None': run_dir is None without -o)
    import types

    class Inprocess:
        name, description, extra, modules, options = "inprocess", "fake", None, (), frozenset()

        def run(self, pipeline, params, *, run_dir, **kwargs):
            return types.SimpleNamespace(run_dir=str(tmp_path / "heteroflow-runs" / "r1"))

    monkeypatch.setitem(registry._REGISTRY, "inprocess", Inprocess())
    from heteroflow.pipelines.default import default_pipeline

    record = engine.run(default_pipeline(), {}, run_dir=None, simulate_devices=None, inject_faults=None, on_progress=None, echo_engine_output=False)
    assert record.run_dir == str(tmp_path / "heteroflow-runs" / "r1")
    assert capsys.readouterr().out == f"ran heteroflow-default in {tmp_path / 'heteroflow-runs' / 'r1'}\n"


def test_the_reader_example_reads_a_table(tmp_path: Path) -> None:
    scope: dict = {}
    exec(_examples()[2], scope)  # noqa: S102
    reader = scope["JsonLines"]()
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1, "label": "x"}\n{"a": 2, "label": "y"}\n')
    assert reader.sniff(path)
    table = reader.read(path)
    assert list(table.frame.columns) == ["a", "label"] and len(table.frame) == 2 and table.format == "jsonl"


def test_the_policy_example_is_a_policy_get_policy_takes() -> None:
    from heteroflow.components.placement.policies import Policy, get_policy

    scope: dict = {}
    exec(_examples()[3], scope)  # noqa: S102
    policy = get_policy(scope["Cheapest"]())
    assert isinstance(policy, Policy) and policy.name == "cheapest"
    # two V100 nodes alike but for their price: the cheaper one gets the job (least-loaded would tie-break on cost too,
    # but only after load: here the cheaper node is also the busier one)
    from heteroflow.components.placement.policies import Job, PlacementState, load_inventory, place_round

    inv = load_inventory("inv.yaml", text=(
        "nodes:\n"
        "  - {name: dear, devices: {kind: gpu, model: v100, count: 4}, cost_per_hour: 9.0}\n"
        "  - {name: cheap, devices: {kind: gpu, model: v100, count: 4}, cost_per_hour: 1.0}\n"
    ))
    state = PlacementState(inv)
    assert place_round([Job(name="first", count=2)], state, "least-loaded")[0].node_names == ("cheap",)
    assert place_round([Job(name="second", count=1)], state, "least-loaded")[0].node_names == ("dear",)
    assert place_round([Job(name="third", count=1)], state, policy)[0].node_names == ("cheap",)
