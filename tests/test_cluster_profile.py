"""The cluster profile: the YAML format, its defaults, the example profiles, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from heteroflow.components.devices.cluster import (
    DEFAULT_PROFILE,
    ClusterProfile,
    InvalidProfile,
    VendorConvention,
    load_profile,
)
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Toleration

PROFILES = Path(__file__).resolve().parent.parent / "examples" / "profiles"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def test_defaults():
    p = DEFAULT_PROFILE
    assert p.vendor("nvidia") == VendorConvention(plugin="official", labels="gfd")
    assert p.vendor("ascend") == VendorConvention(plugin="official", labels="npu-chip-name")
    assert p.vendor("amd") == VendorConvention(plugin="official", labels="amd-labeller")
    assert p.vendor("gaudi") == VendorConvention(plugin="official", labels="none")
    assert p.vendor("nvidia").label_key == "nvidia.com/gpu.product"
    assert p.accelerator_tolerations is True
    assert (p.tolerations, p.volcano_queue, p.kueue_queue, p.scheduler_name) == ((), None, None, None)
    assert p.image_for("gpu") is None
    assert ClusterProfile.from_dict({}) == DEFAULT_PROFILE


def test_example_profiles():
    nvidia = load_profile(PROFILES / "nvidia-gfd.yaml")
    assert nvidia.name == "nvidia-gfd" and nvidia.vendor("nvidia").labels == "gfd"
    assert nvidia.image_for("gpu") == "registry.example.com/heteroflow:cuda12"
    assert nvidia.source == str(PROFILES / "nvidia-gfd.yaml")
    official = load_profile(PROFILES / "ascend-official.yaml")
    assert official.vendor("ascend") == VendorConvention(plugin="official", labels="npu-chip-name")
    assert (official.volcano_queue, official.scheduler_name) == ("default", "volcano")
    hami = load_profile(PROFILES / "ascend-hami.yaml")
    assert hami.vendor("ascend") == VendorConvention(plugin="hami", labels="none")
    assert hami.accelerator_tolerations is False
    assert hami.vendor("nvidia") == DEFAULT_PROFILE.vendor("nvidia")  # vendors not named keep the defaults
    kueue = load_profile(PROFILES / "kueue-gke.yaml")
    assert (kueue.kueue_queue, kueue.vendor("nvidia").labels) == ("team-ml", "gke")
    assert dict(kueue.labels) == {"app.kubernetes.io/part-of": "heteroflow"}


@pytest.mark.parametrize("name", ["nvidia-gfd", "ascend-official", "ascend-hami", "kueue-gke"])
def test_profile_round_trips_through_to_dict(name, tmp_path):
    p = load_profile(PROFILES / f"{name}.yaml")
    again = load_profile(_write(tmp_path, yaml.safe_dump(p.to_dict())))
    assert again == p


def test_full_profile(tmp_path):
    path = _write(
        tmp_path,
        """
version: 1
name: full
vendors:
  nvidia: {plugin: hami, labels: gke}
  ascend: {plugin: hami}
accelerator_tolerations: false
tolerations:
  - {key: dedicated, operator: Equal, value: ml, effect: NoSchedule}
  - {operator: Exists}
queue: {volcano: q1, kueue: lq1}
scheduler_name: volcano
images: {cpu: img-cpu, gpu: img-gpu, npu: img-npu}
labels: {team: vision}
annotations: {example.com/owner: "ML platform"}
""",
    )
    p = load_profile(path)
    assert p.vendor("nvidia") == VendorConvention(plugin="hami", labels="gke")
    assert p.vendor("ascend") == VendorConvention(plugin="hami", labels="npu-chip-name")  # labels default kept
    assert p.tolerations == (Toleration(key="dedicated", value="ml", effect="NoSchedule"), Toleration(operator="Exists"))
    assert (p.volcano_queue, p.kueue_queue, p.scheduler_name) == ("q1", "lq1", "volcano")
    assert p.image_for("npu") == "img-npu"
    assert dict(p.annotations) == {"example.com/owner": "ML platform"}


BAD = [
    ("vendor: {nvidia: {}}\n", r": unknown field 'vendor' \(did you mean 'vendors'\?\) in the profile \(top level\); valid: version, name, vendors, "),
    ("vendors: {nvidia: {plugin: official, label: gfd}}\n", r": unknown field 'label' \(did you mean 'labels'\?\) in vendors\.nvidia; valid: plugin, labels"),
    ("vendors: {cambricon: {}}\n", r": unknown field 'cambricon' in vendors; valid: nvidia, ascend, amd, gaudi"),
    ("vendors: {nvidia: {plugin: gpu-operator}}\n", r": vendors\.nvidia\.plugin='gpu-operator' is unknown; valid: official, hami"),
    ("vendors: {ascend: {labels: gfd}}\n", r": vendors\.ascend\.labels='gfd' is unknown for ascend; valid: npu-chip-name, none"),
    ("queue: {slurm: q}\n", r": unknown field 'slurm' in queue; valid: volcano, kueue"),
    ("queue: {kueue: 'team a'}\n", r"queue\.kueue='team a' is not a Kubernetes label value"),
    ("images: {tpu: x}\n", r": unknown field 'tpu' \(did you mean 'npu'\?\) in images; valid: cpu, gpu, npu"),
    ("tolerations: [{key: '', operator: Equal, value: x}]\n", r"tolerations\[0\]\.operator='Equal' with an empty key: .*valid: operator='Exists'"),
    ("tolerations: {key: a}\n", r": tolerations is dict, not a list"),
    ("accelerator_tolerations: yes please\n", r": accelerator_tolerations='yes please' is not a boolean; valid: true, false"),
    ("version: 2\n", r": version=2 is unknown; valid: 1"),
    ("scheduler_name: Volcano Scheduler\n", r": scheduler_name='Volcano Scheduler' is not a scheduler name"),
    ("labels: {'a b': c}\n", r"labels key 'a b' is not a Kubernetes qualified name"),
    ("- just\n- a list\n", r": the profile \(top level\) is list, not a mapping"),
    ("", r": the file is empty"),
]


@pytest.mark.parametrize(("text", "pattern"), BAD, ids=[
    "unknown-top", "unknown-vendor-field", "unknown-vendor", "bad-plugin", "labels-of-another-vendor",
    "unknown-queue", "bad-kueue-name", "unknown-image-kind", "toleration-empty-key", "tolerations-not-list",
    "bad-bool", "bad-version", "bad-scheduler", "bad-label-key", "not-a-mapping", "empty",
])
def test_bad_profiles_name_the_file_and_the_field(tmp_path, text, pattern):
    path = _write(tmp_path, text)
    with pytest.raises(InvalidProfile, match=pattern) as info:
        load_profile(path)
    assert str(info.value).startswith(f"{path}: ")
    assert isinstance(info.value, InvalidResources) and isinstance(info.value, ValueError)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(InvalidProfile, match=r"^cluster profile .*missing\.yaml: cannot be read \(No such file or directory\)"):
        load_profile(tmp_path / "missing.yaml")
    with pytest.raises(InvalidProfile, match=r"^cluster profile .*profile\.yaml: not valid YAML \(line 2, column 1: expected the node content, but found '<stream end>' \(while parsing a flow node at line 2, column 1\)\)$") as info:
        load_profile(_write(tmp_path, "vendors: {nvidia: [\n"))
    assert "<unicode string>" not in str(info.value) and "\n" not in str(info.value)  # one line, counted as an editor counts


def test_from_dict_names_its_source():
    with pytest.raises(InvalidProfile, match=r"^inline: unknown field 'queues' \(did you mean 'queue'\?\) in the profile"):
        ClusterProfile.from_dict({"queues": {}}, source="inline")


def test_the_command_a_shipped_profile_shows_compiles_the_default_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ascend-hami cannot give the default pipeline's "any Ascend 910" candidate (one resource per chip): `compile
    --profile` refuses it, as a new user's trial found; the command the profile's header shows (a chip named) compiles."""
    import shlex

    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    monkeypatch.chdir(PROFILES.parent.parent)
    refused = CliRunner().invoke(app, ["compile", "--profile", str(PROFILES / "ascend-hami.yaml"), "-o", str(tmp_path / "refused.yaml")])
    assert refused.exit_code == 2 and "valid: one model of ascend-910a" in " ".join(refused.output.split()), refused.output
    shown = [line.removeprefix("#").strip() for line in (PROFILES / "ascend-hami.yaml").read_text().splitlines() if line.startswith("#   heteroflow ")]
    assert len(shown) == 1, shown
    args = shlex.split(shown[0])[1:]
    args[args.index("-o") + 1] = str(tmp_path / "pipeline.yaml")
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "huawei.com/Ascend910B3" in (tmp_path / "pipeline.yaml").read_text()
