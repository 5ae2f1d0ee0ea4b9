"""A key given twice is an error, never "the last one wins" (issue #16.17), in every list of keys a user writes:
candidate specs (the issue's input, in test_resources.py), the CLI's NAME=VALUE options, cluster profiles,
device inventories (YAML files and the plan step's JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.components.devices.cluster import InvalidProfile, load_profile
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.core.keys import DuplicateKey, load_yaml, parse_pairs, unique_object
from heteroflow.components.placement.plan import Inventory
from heteroflow.pipelines.cli.main import app


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_issues_candidate_is_refused_on_the_command_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["compile", "-o", str(tmp_path / "p.yaml"), "-c", "cpu:cpu=2,cpu=4"])
    assert result.exit_code == 2, result.output
    assert "cpu is given twice (cpu=2 and cpu=4)" in _flat(result.output)
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--param", "epochs=3", "--param", "epochs=5"], "--param epochs is given twice (epochs=3 and epochs=5)"),
        (["run", "-p", "seed=1", "-p", " seed =1"], "--param seed is given twice (seed=1 and seed=1)"),
        (
            ["step", "train", "--input", "dataset=/a", "--input", "dataset=/b"],
            "--input dataset is given twice (dataset=/a and dataset=/b)",
        ),
        (["step", "train", "--output", "model=/a", "--output", "model=/b"], "--output model is given twice"),
    ],
    ids=["param", "param-same-value", "step-input", "step-output"],
)
def test_a_name_value_option_given_twice_is_refused(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*args, *(["--output", str(tmp_path / "run")] if args[0] == "run" else [])])
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_parse_pairs_keeps_distinct_names_and_values_with_equals_signs() -> None:
    assert parse_pairs(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(InvalidParameter, match=r"--input 'a' is not NAME=VALUE \(e.g. --input epochs=3\)"):
        parse_pairs(["a"], option="--input")


def test_a_cluster_profile_with_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("name: gke\nqueue:\n  kueue: team-a\nqueue:\n  kueue: team-b\n")
    with pytest.raises(InvalidProfile, match=rf"cluster profile {profile}: key 'queue' is given twice \(lines 2 and 4\)"):
        load_profile(profile)


def test_a_nested_duplicate_in_a_shipped_profile_is_refused(tmp_path: Path) -> None:
    shipped = Path(__file__).parents[1] / "examples" / "profiles" / "nvidia-gfd.yaml"
    assert load_profile(shipped).name  # the shipped profiles have no duplicate
    lines = shipped.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  ") and ":" in line)  # first nested key
    doubled = tmp_path / "doubled.yaml"
    doubled.write_text("\n".join([*lines[: at + 1], lines[at], *lines[at + 1 :]]) + "\n")
    key = lines[at].split(":")[0].strip()
    with pytest.raises(InvalidProfile, match=rf"key '{key}' is given twice \(lines {at + 1} and {at + 2}\)"):
        load_profile(doubled)


def test_an_inventory_file_with_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="heteroflow.dags needs Airflow (the 'airflow' extra)")
    from heteroflow.dags.pools import load_inventory

    yaml_file = tmp_path / "inv.yaml"
    yaml_file.write_text("gpu:\n  t4: 2\n  a100-80gb: 1\n  t4: 4\n")
    with pytest.raises(DuplicateKey, match=rf"inventory {yaml_file}: key 't4' is given twice \(lines 2 and 4\)"):
        load_inventory(yaml_file)
    json_file = tmp_path / "inv.json"  # sibling: JSON is read by the same loader
    json_file.write_text('{"gpu": 2, "npu": 8, "gpu": 4}')
    with pytest.raises(DuplicateKey, match="key 'gpu' is given twice"):
        load_inventory(json_file)
    json_file.write_text('{"gpu": 2, "npu": 8}')
    assert load_inventory(json_file).devices["gpu"] == 2


def test_the_placement_inventory_loader_refuses_a_key_given_twice_as_the_pools_loader_does(tmp_path: Path) -> None:
    """A new user's trial: `gpu: 1` then `gpu: 2` was refused by `airflow pools` but read as `gpu: 2` by `manifests`
    and `simulate` (the placement loader, :func:`load_yaml_with_lines`), which then reported something else. Sibling:
    a node of the node form given a key twice."""
    from heteroflow.components.placement.inventory import load_inventory
    from heteroflow.components.placement.plan import cluster_inventory
    from heteroflow.components.placement.views import InvalidInventory

    counts = tmp_path / "dup.yaml"
    counts.write_text("gpu: 1\ngpu: 2\n")
    with pytest.raises(InvalidInventory, match=rf"^{counts}: key 'gpu' is given twice \(lines 1 and 2\); give each key once$"):
        load_inventory(counts)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n- name: a\n  devices: {nvidia-t4: 1}\n  name: b\n")
    with pytest.raises(InvalidInventory, match=r"key 'name' is given twice \(lines 2 and 4\)"):
        load_inventory(nodes)
    with pytest.raises(DuplicateKey, match=r"^device_inventory: key 'name' is given twice \(lines 2 and 4\)"):
        cluster_inventory(nodes.read_text())  # the plan step's device_inventory given as YAML text
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(counts), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "key 'gpu' is given twice (lines 1 and 2)" in _flat(result.output), result.output
    nodes.write_text("nodes:\n- name: a\n  devices: {nvidia-t4: 1}\n- name: b\n  devices: {nvidia-t4: 1}\n")  # the same keys in two mappings
    assert len(load_inventory(nodes).nodes) == 2


def test_a_file_that_is_not_utf8_is_named_with_the_byte_not_a_crash(tmp_path: Path) -> None:
    """A new user's trial: an inventory holding byte 0xff made `airflow pools`, `manifests` and `compile --profile`
    exit 1 with `unexpected UnicodeDecodeError` (a traceback file), and `simulate` exit 2 without naming the file."""
    bad = tmp_path / "latin.yaml"
    bad.write_bytes(b"gpu: \xff\xfe\n")
    said = "not UTF-8 text (byte 0xff at offset 5); save it as UTF-8"
    for args in (["manifests", "--inventory", str(bad), "-o", str(tmp_path / "out")],
                 ["simulate", "--trace", "gavel", "--inventory", str(bad)],
                 ["compile", "--profile", str(bad), "-o", str(tmp_path / "p.yaml")],
                 ["submit", str(bad), "--host", "http://127.0.0.1:9"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and f"{bad}" in _flat(result.output) and said in _flat(result.output), (args, result.output)
    with pytest.raises(InvalidProfile, match=rf"^cluster profile {bad}: not UTF-8 text \(byte 0xff at offset 5\)"):
        load_profile(bad)
    pytest.importorskip("airflow", reason="heteroflow.dags needs Airflow (the 'airflow' extra)")
    from heteroflow.dags.pools import load_inventory

    with pytest.raises(InvalidParameter, match=rf"^inventory {bad}: not UTF-8 text \(byte 0xff at offset 5\)"):
        load_inventory(bad)


def test_the_plan_steps_inventory_json_with_a_key_given_twice_is_refused() -> None:
    with pytest.raises(DuplicateKey, match=r"device_inventory: key 'gpu' is given twice \(2 and 4\)"):
        Inventory.from_json('{"gpu": 2, "gpu": 4}')
    with pytest.raises(InvalidParameter, match="is not JSON"):  # plain bad JSON keeps its message
        Inventory.from_json('{"gpu": ')
    assert Inventory.from_json('{"gpu": {"t4": 2}}').devices["gpu"] == 2


def test_load_yaml_allows_merge_keys_to_be_overridden_and_refuses_flow_duplicates() -> None:
    assert load_yaml("d: &d {x: 1, y: 2}\ne:\n  <<: *d\n  x: 3\n", where="w")["e"] == {"x": 3, "y": 2}
    with pytest.raises(DuplicateKey, match="w: key 'x' is given twice"):
        load_yaml("e: {x: 1, x: 2}", where="w")
    assert json.loads('{"a": 1}', object_pairs_hook=unique_object("j")) == {"a": 1}


def test_a_step_naming_an_artifact_twice_names_it_and_both_places() -> None:
    """Issue #28.21's sibling: a step's artifact list said "twice" and printed the whole list, not the duplicate."""
    from heteroflow.components.core.step import ArtifactSpec, step

    def make(data: str, out_path: str) -> None:
        pass

    with pytest.raises(InvalidParameter, match=r"names the artifact 'data' twice \(inputs\[0\] and outputs\[0\]\)"):
        step(make, inputs=[ArtifactSpec(name="data", param="data")], outputs=[ArtifactSpec(name="data", param="out_path")])
