"""The pure pod builder: a candidate and a cluster profile -> the Kubernetes client's types, validated against the
real Kubernetes schema (kubernetes-validate, strict: unknown fields are errors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from heteroflow.components.devices.cluster import ClusterProfile, load_profile
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources, Toleration
from heteroflow.pipelines.k8s.resources import build_pod_resources, plan_pod

kubernetes = pytest.importorskip("kubernetes")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
from kubernetes import client  # noqa: E402

PROFILES = Path(__file__).resolve().parent.parent / "examples" / "profiles"
K8S_VERSION = "1.33.0"  # the Kubernetes API the fragments are validated against (pinned)
PLAIN = ClusterProfile.from_dict({"name": "plain", "accelerator_tolerations": False})


def _profile(name: str) -> ClusterProfile:
    return load_profile(PROFILES / f"{name}.yaml")


def _pod_dict(resources: Resources, profile: ClusterProfile | None = None) -> dict:
    pod = build_pod_resources(resources, profile).pod(name="step")
    return client.ApiClient().sanitize_for_serialization(pod)


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]},
                {"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["nvme"]}]},
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
        ],
    },
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "trainer"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    },
}

CASES = [
    ("cpu", Resources(cpu="2", memory="4Gi"), None),
    ("cpu-limits", Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi"), None),
    ("cpu-nothing", Resources(cpu=None, memory=None), None),
    ("t4-gfd", Resources(accelerator="T4", memory="8G"), "nvidia-gfd"),
    ("any-nvidia-40Gi-bf16", Resources(kind="gpu", count=2, device_memory="40Gi", precision="bf16"), "nvidia-gfd"),
    ("t4-gke-kueue", Resources(accelerator="T4", cpu=None, memory=None, memory_limit="8G"), "kueue-gke"),
    ("910b3-official", Resources(accelerator="Ascend 910B3", cpu="8", memory="32Gi"), "ascend-official"),
    ("910b-official", Resources(accelerator="910B", count=8, cpu="64", memory="512Gi"), "ascend-official"),
    ("910b3-hami", Resources(accelerator="Ascend 910B3", cpu="8", memory="32Gi"), "ascend-hami"),
    ("310p-official", Resources(accelerator="310P"), "ascend-official"),
    ("mi300x", Resources(accelerator="MI300X", count=8), None),
    ("gaudi-any", Resources(accelerator="gaudi", count=8), None),
    (
        "everything",
        Resources(
            kind="gpu",
            device_memory="80Gi",
            node_selector={"disktype": "ssd"},
            tolerations=[
                {"key": "example-key", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600},
                {"operator": "Exists"},
            ],
            affinity=AFFINITY,
            labels={"team": "vision"},
            annotations={"example.com/owner": "ml platform"},
        ),
        "ascend-official",  # a Volcano queue and schedulerName, NVIDIA defaults
    ),
]


@pytest.mark.parametrize(("resources", "profile"), [(r, p) for _, r, p in CASES], ids=[n for n, _, _ in CASES])
def test_every_fragment_validates_against_the_kubernetes_schema(resources, profile):
    data = _pod_dict(resources, _profile(profile) if profile else None)
    assert kubernetes_validate.validate(data, K8S_VERSION, strict=True) == "1.33"


def test_the_validator_rejects_unknown_fields():
    # the check above can fail: an unknown field in a pod spec is an error in strict mode
    data = _pod_dict(Resources())
    data["spec"]["nodeSelectorTerms"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(data, K8S_VERSION, strict=True)


def test_builder_returns_the_kubernetes_client_types():
    p = build_pod_resources(
        Resources(accelerator="T4", memory="8G", tolerations=[{"key": "a", "operator": "Exists"}], affinity=AFFINITY),
        _profile("nvidia-gfd"),
    )
    assert isinstance(p.resources, client.V1ResourceRequirements)
    assert all(isinstance(t, client.V1Toleration) for t in p.tolerations)
    assert isinstance(p.affinity, client.V1Affinity)
    assert isinstance(p.affinity.node_affinity.required_during_scheduling_ignored_during_execution, client.V1NodeSelector)
    assert p.resources.requests == {"cpu": "1", "memory": "8G", "nvidia.com/gpu": "1"}
    assert p.image == "registry.example.com/heteroflow:cuda12"
    kwargs = p.kubernetes_pod_operator_kwargs()
    assert kwargs["container_resources"] is p.resources and kwargs["image"] == p.image
    assert set(kwargs) == {
        "container_resources", "tolerations", "node_selector", "affinity", "labels", "annotations", "schedulername", "image",
    }


def test_910b3_under_the_official_plugin_and_under_hami():
    r = Resources(accelerator="Ascend 910B3", count=1, cpu="8", memory="32Gi")
    official = build_pod_resources(r, _profile("ascend-official"))
    assert official.resources.limits == {"cpu": "8", "memory": "32Gi", "huawei.com/Ascend910": "1"}
    assert official.resources.requests == official.resources.limits
    assert official.node_selector == {"node.kubernetes.io/npu.chip.name": "910B3"}
    assert official.annotations == {"scheduling.volcano.sh/queue-name": "default"}
    assert official.scheduler_name == "volcano"
    assert [(t.key, t.operator, t.effect) for t in official.tolerations] == [("huawei.com/Ascend910", "Exists", "NoSchedule")]
    hami = build_pod_resources(r, _profile("ascend-hami"))
    assert hami.resources.limits == {"cpu": "8", "memory": "32Gi", "huawei.com/Ascend910B3": "1"}
    assert hami.node_selector == {} and hami.tolerations == [] and hami.affinity is None


def test_model_label_only_where_the_resource_name_does_not_pick_the_model():
    official = _profile("ascend-official")
    assert plan_pod(Resources(accelerator="ascend-910"), official).node_selector == {}  # any 910: the resource is enough
    assert plan_pod(Resources(accelerator="310P"), official).node_selector == {}  # Ascend310P serves only 310P
    narrowed = plan_pod(Resources(accelerator="910B"), official)
    assert narrowed.node_selector == {}
    assert narrowed.affinity == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "node.kubernetes.io/npu.chip.name", "operator": "In", "values": ["910B2", "910B3", "910B4"]}]}
                ]
            }
        }
    }
    assert plan_pod(Resources(kind="gpu")).affinity is None  # any NVIDIA
    gke = plan_pod(Resources(kind="gpu", device_memory="80Gi"), _profile("kueue-gke"))
    term = gke.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [
        {"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-a100-80gb", "nvidia-h100-80gb", "nvidia-h200-141gb"]}
    ]
    assert plan_pod(Resources(accelerator="T4"), _profile("kueue-gke")).node_selector == {
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4"
    }


def test_model_requirement_is_anded_into_every_user_term():
    plan = plan_pod(Resources(kind="gpu", device_memory="80Gi", affinity=AFFINITY), _profile("kueue-gke"))
    terms = plan.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    model = {
        "key": "cloud.google.com/gke-accelerator",
        "operator": "In",
        "values": ["nvidia-a100-80gb", "nvidia-h100-80gb", "nvidia-h200-141gb"],
    }
    assert [t["matchExpressions"][-1] for t in terms] == [model, model]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["ssd"], ["nvme"]]
    assert plan.affinity["podAntiAffinity"] == AFFINITY["podAntiAffinity"]
    assert plan.node_selector == {}
    # one model left: its single label value goes into the node selector, which Kubernetes ANDs with every term
    one = plan_pod(Resources(kind="gpu", device_memory="141Gi", affinity=AFFINITY), _profile("kueue-gke"))
    assert one.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}
    assert one.affinity["nodeAffinity"] == AFFINITY["nodeAffinity"]
    assert AFFINITY["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ] == [{"key": "disktype", "operator": "In", "values": ["ssd"]}]  # the caller's value is untouched


def test_tolerations_labels_annotations_merge_in_order():
    profile = ClusterProfile.from_dict(
        {
            "tolerations": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
            "queue": {"kueue": "lq", "volcano": "vq"},
            "labels": {"team": "platform", "tier": "batch"},
            "annotations": {"a": "profile"},
        }
    )
    r = Resources(
        accelerator="T4",
        tolerations=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}, {"key": "spot", "operator": "Exists"}],
        labels={"team": "vision"},
        annotations={"a": "candidate"},
    )
    plan = plan_pod(r, profile)
    assert plan.tolerations == (
        Toleration(key="dedicated", value="ml", effect="NoSchedule"),
        Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
        Toleration(key="spot", operator="Exists"),
    )
    assert plan.labels == {"team": "vision", "tier": "batch", "kueue.x-k8s.io/queue-name": "lq"}
    assert plan.annotations == {"a": "candidate", "scheduling.volcano.sh/queue-name": "vq"}


BAD = [
    (
        Resources(accelerator="910B"),
        "ascend-hami",
        r"^accelerator='ascend-910b' \(any Ascend 910B\) is several resources under the 'hami' device plugin of profile "
        r"'ascend-hami' .*\(huawei.com/Ascend910B2, huawei.com/Ascend910B3, huawei.com/Ascend910B4\).*valid: one model of "
        r"ascend-910b2, ascend-910b3, ascend-910b4",
    ),
    (
        Resources(accelerator="ascend-910a"),
        "ascend-official",
        r"^accelerator='ascend-910a' \(Ascend 910A\) has no documented node.kubernetes.io/npu.chip.name value",
    ),
    (
        Resources(accelerator="A10"),
        "kueue-gke",
        r"^accelerator='nvidia-a10' \(NVIDIA A10\) has no documented cloud.google.com/gke-accelerator value",
    ),
    (
        Resources(accelerator="gaudi2"),
        None,
        r"^accelerator='gaudi2' asks for gaudi2 among the models behind habana.ai/gaudi, but profile 'default' sets "
        r"vendors.gaudi.labels: none",
    ),
    (
        Resources(accelerator="T4", node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"}),
        "kueue-gke",
        r"^node_selector\['cloud.google.com/gke-accelerator'\]='nvidia-l4' contradicts accelerator='nvidia-t4'",
    ),
    (
        Resources(
            accelerator="T4",
            affinity={"nodeAffinity": {"requiredDuringScheduling": {}}},
        ),
        None,
        r"^affinity.nodeAffinity has unknown field\(s\) requiredDuringScheduling; valid: "
        r"preferredDuringSchedulingIgnoredDuringExecution, requiredDuringSchedulingIgnoredDuringExecution",
    ),
    (
        Resources(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a"}]}]}}}),
        None,
        r"^affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms\[0\].matchExpressions\[0\]: "
        r"Invalid value for `operator`",
    ),
]


@pytest.mark.parametrize(("resources", "profile", "pattern"), BAD, ids=[
    "hami-family", "official-910a-no-label", "gke-a10-no-label", "gaudi-model-no-labels", "contradicting-selector",
    "affinity-typo", "affinity-missing-operator",
])
def test_what_a_cluster_cannot_be_asked_is_a_clear_error(resources, profile, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        build_pod_resources(resources, _profile(profile) if profile else None)


def test_plain_profile_adds_nothing_of_its_own():
    plan = plan_pod(Resources(kind="gpu", cpu="100m", memory="100Mi"), PLAIN)
    assert plan.tolerations == () and plan.labels == {} and plan.annotations == {} and plan.node_selector == {}
    assert plan.requests == plan.limits == {"cpu": "100m", "memory": "100Mi", "nvidia.com/gpu": "1"}


def test_airflow_pod_gets_everything_kfp_cannot_set(tmp_path):
    """Airflow's KubernetesPodOperator builds its pod (no cluster: build_pod_request_obj, a kubeconfig naming an
    unreachable server) with the builder's kwargs, schedulerName and the per-kind image included."""
    pytest.importorskip("airflow.providers.cncf.kubernetes")
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: none, user: {}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\n"
        "current-context: none\n"
    )
    built = build_pod_resources(Resources(accelerator="910B3", cpu="8", memory="32Gi"), _profile("ascend-official"))
    op = KubernetesPodOperator(
        task_id="train",
        name="train",
        namespace="ml",
        cmds=["heteroflow", "step", "train"],
        in_cluster=False,
        config_file=str(kubeconfig),
        **built.kubernetes_pod_operator_kwargs(),
    )
    pod = op.build_pod_request_obj()
    assert pod.spec.scheduler_name == "volcano"
    assert pod.spec.containers[0].image == "registry.example.com/heteroflow:cann8"
    assert pod.spec.containers[0].resources.limits == {"cpu": "8", "memory": "32Gi", "huawei.com/Ascend910": "1"}
    assert pod.spec.node_selector == {"node.kubernetes.io/npu.chip.name": "910B3"}
    assert pod.metadata.annotations["scheduling.volcano.sh/queue-name"] == "default"
    data = client.ApiClient().sanitize_for_serialization(pod)
    assert kubernetes_validate.validate(data, K8S_VERSION, strict=True) == "1.33"
