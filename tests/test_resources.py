"""The resource model: Kubernetes quantities, Resources, Candidates and RetryPolicy."""

from __future__ import annotations

import dataclasses
import json

import pytest

from heteroflow.cache.errors import HeteroflowError
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import (
    ACCELERATORS,
    ASCEND_910,
    NVIDIA_GPU,
    Candidates,
    DeviceKind,
    Resources,
    RetryPolicy,
    parse_cpu,
    parse_memory,
)

# --- parse_cpu --------------------------------------------------------------------------------------------

CPU_VALID = [
    ("500m", 500),
    ("2", 2000),
    (2, 2000),
    (0.5, 500),
    ("0.5", 500),
    ("1.5", 1500),
    ("1000m", 1000),
    ("16", 16000),
    ("1e-3", 1),
    ("0", 0),
    (" 250m ", 250),
]


@pytest.mark.parametrize(
    ("value", "millicores"), CPU_VALID, ids=[f"{v!r}->{m}" for v, m in CPU_VALID]
)
def test_parse_cpu_valid(value, millicores):
    result = parse_cpu(value)
    assert result == millicores
    assert type(result) is int


CPU_INVALID = [
    ("100u", "finer than 1m"),
    ("0.0005", "finer than 1m"),
    ("-1", "negative"),
    (-1, "negative"),
    ("abc", "not a Kubernetes quantity"),
    ("", "not a Kubernetes quantity"),
    ("2 cores", "not a Kubernetes quantity"),
    (True, "not a quantity"),
    (None, "not a quantity"),
    (float("inf"), "not finite"),
    (float("nan"), "not finite"),
]


@pytest.mark.parametrize(("value", "why"), CPU_INVALID, ids=[repr(v) for v, _ in CPU_INVALID])
def test_parse_cpu_invalid(value, why):
    with pytest.raises(InvalidResources, match=rf"^cpu=.*{why}.*valid:"):
        parse_cpu(value)


def test_parse_cpu_reports_the_given_field():
    with pytest.raises(InvalidResources, match=r"^limits\.cpu='abc'"):
        parse_cpu("abc", field="limits.cpu")


# --- parse_memory -----------------------------------------------------------------------------------------

MEMORY_VALID = [
    ("16Gi", 16 * 2**30),
    ("1G", 10**9),
    ("512Mi", 512 * 2**20),
    ("1e9", 10**9),
    ("1E9", 10**9),
    ("1.5Gi", 3 * 2**29),
    ("1k", 1000),
    ("1Ki", 1024),
    ("2Ti", 2 * 2**40),
    ("1M", 10**6),
    (1024, 1024),
    ("1024", 1024),
    ("0", 0),
]


@pytest.mark.parametrize(("value", "num_bytes"), MEMORY_VALID, ids=[f"{v!r}" for v, _ in MEMORY_VALID])
def test_parse_memory_valid(value, num_bytes):
    result = parse_memory(value)
    assert result == num_bytes
    assert type(result) is int


MEMORY_INVALID = [
    ("16GB", r"G = 10\^9.*Gi = 2\^30.*'GB' is not a unit"),
    ("16gi", "not a Kubernetes quantity"),
    ("-1Gi", "negative"),
    ("1m", "not a whole number of bytes"),
    ("", "not a Kubernetes quantity"),
    (None, "not a quantity"),
    (True, "not a quantity"),
    (1.5, "not a whole number of bytes"),
    ("Gi", "not a Kubernetes quantity"),
]


@pytest.mark.parametrize(("value", "why"), MEMORY_INVALID, ids=[repr(v) for v, _ in MEMORY_INVALID])
def test_parse_memory_invalid(value, why):
    with pytest.raises(InvalidResources, match=rf"^memory=.*(?:{why}).*valid:"):
        parse_memory(value)


def test_parse_memory_gb_message_suggests_g_and_gi():
    with pytest.raises(InvalidResources) as info:
        parse_memory("16GB", field="device_memory")
    message = str(info.value)
    assert message.startswith("device_memory='16GB'")
    assert "'GB' is not a unit" in message
    assert "G = 10^9" in message and "Gi = 2^30" in message


# --- Resources --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("cpu", DeviceKind.CPU), ("GPU", DeviceKind.GPU), (" npu ", DeviceKind.NPU), (DeviceKind.GPU, DeviceKind.GPU)],
    ids=["cpu", "upper-GPU", "padded-npu", "enum"],
)
def test_kind_strings_become_device_kind(kind, expected):
    r = Resources(kind=kind)
    assert r.kind is expected
    assert isinstance(r.kind, DeviceKind)


@pytest.mark.parametrize(("kind", "count"), [("cpu", 0), ("gpu", 1), ("npu", 1)], ids=["cpu", "gpu", "npu"])
def test_count_defaults(kind, count):
    assert Resources(kind=kind).count == count


def test_defaults_are_parsed():
    r = Resources()
    assert r.kind is DeviceKind.CPU
    assert r.cpu_millicores == 1000
    assert r.memory_bytes == 2 * 2**30
    assert r.device_memory_bytes is None
    assert r.accelerator_spec is None
    assert r.torch_device_type == "cpu"


def test_parsed_fields():
    r = Resources(kind="gpu", count=2, cpu="500m", memory="16Gi", device_memory="40Gi")
    assert r.cpu_millicores == 500
    assert r.memory_bytes == 16 * 2**30
    assert r.device_memory_bytes == 40 * 2**30
    assert r.accelerator_spec is NVIDIA_GPU
    assert r.torch_device_type == "cuda"
    npu = Resources(kind="npu", accelerator="ascend-310p")
    assert npu.accelerator_spec is ACCELERATORS["ascend-310p"]
    assert npu.torch_device_type == "npu"
    assert Resources(kind="npu").accelerator_spec is ASCEND_910


RESOURCES_INVALID = [
    (dict(kind="gpu", count=-1), r"^count=-1 is negative"),
    (dict(kind="cpu", count=1), r"^count=1 with kind='cpu'"),
    (dict(kind="gpu", count=0), r"^count=0 with kind='gpu'"),
    (dict(kind="npu", count=0), r"^count=0 with kind='npu'"),
    (dict(kind="gpu", count=True), r"^count=True is not an integer"),
    (dict(kind="gpu", count=1.0), r"^count=1\.0 is not an integer"),
    (dict(kind="gpu", accelerator="tpu-v5"), r"^accelerator='tpu-v5' is unknown; valid: ascend-310p, ascend-910, nvidia-gpu"),
    (dict(kind="gpu", accelerator="ascend-910"), r"^accelerator='ascend-910' is a npu, but kind='gpu'"),
    (dict(kind="npu", accelerator="nvidia-gpu"), r"^accelerator='nvidia-gpu' is a gpu, but kind='npu'"),
    (dict(kind="cpu", accelerator="nvidia-gpu"), r"^accelerator='nvidia-gpu' is a gpu, but kind='cpu'"),
    (dict(kind="cpu", device_memory="16Gi"), r"^device_memory is set with kind='cpu'"),
    (dict(kind="gpu", device_memory="16GB"), r"^device_memory='16GB'"),
    (dict(kind="tpu"), r"^kind='tpu' is not a device kind; valid kinds: cpu, gpu, npu"),
    (dict(kind=3), r"^kind=3 is not a device kind"),
    (dict(cpu="lots"), r"^cpu='lots'"),
    (dict(memory="16GB"), r"^memory='16GB'.*'GB' is not a unit"),
]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    RESOURCES_INVALID,
    ids=[
        "negative-count",
        "cpu-with-count",
        "gpu-count-0",
        "npu-count-0",
        "bool-count",
        "float-count",
        "unknown-accelerator",
        "npu-accelerator-on-gpu",
        "gpu-accelerator-on-npu",
        "accelerator-on-cpu",
        "device-memory-on-cpu",
        "bad-device-memory",
        "unknown-kind",
        "non-string-kind",
        "bad-cpu",
        "bad-memory",
    ],
)
def test_resources_invalid(kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Resources(**kwargs)


def test_invalid_resources_is_value_error_and_heteroflow_error():
    assert issubclass(InvalidResources, ValueError)
    assert issubclass(InvalidResources, HeteroflowError)
    with pytest.raises(ValueError, match="count"):
        Resources(kind="gpu", count=-1)
    with pytest.raises(HeteroflowError, match="count"):
        Resources(kind="gpu", count=-1)


def test_resources_are_immutable():
    r = Resources(kind="gpu", memory="16Gi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.memory = "32Gi"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.memory_bytes = 1  # type: ignore[misc]
    assert r.memory == "16Gi"
    assert r.memory_bytes == 16 * 2**30


def test_replace_reparses():
    r = Resources(kind="gpu", count=2, memory="16Gi", cpu="2")
    r2 = dataclasses.replace(r, memory="32Gi")
    assert r2.memory_bytes == 32 * 2**30
    assert r2.cpu_millicores == 2000
    assert r2.count == 2
    assert r2.kind is DeviceKind.GPU
    assert r.memory_bytes == 16 * 2**30
    with pytest.raises(InvalidResources, match=r"^memory='32GB'"):
        dataclasses.replace(r, memory="32GB")


def test_resources_hashable_and_equal():
    a = Resources(kind="gpu", memory="16Gi")
    b = Resources(kind="GPU", memory="16Gi")
    assert a == b
    assert hash(a) == hash(b)
    assert a != Resources(kind="gpu", memory="32Gi")


K8S_CASES = [
    (dict(kind="cpu", cpu="500m", memory="16Gi"), {"cpu": "500m", "memory": "16Gi"}),
    (dict(kind="gpu", cpu="500m", memory="16Gi"), {"cpu": "500m", "memory": "16Gi", "nvidia.com/gpu": "1"}),
    (dict(kind="gpu", count=4, cpu=8, memory="1G"), {"cpu": "8", "memory": "1G", "nvidia.com/gpu": "4"}),
    (dict(kind="npu", count=2, cpu="1.5", memory="1024Mi"), {"cpu": "1500m", "memory": "1Gi", "huawei.com/Ascend910": "2"}),
    (
        dict(kind="npu", accelerator="ascend-310p", memory=1500),
        {"cpu": "1", "memory": "1500", "huawei.com/Ascend310P": "1"},
    ),
]


@pytest.mark.parametrize(("kwargs", "expected"), K8S_CASES, ids=["cpu", "gpu", "gpu-x4", "npu-910-x2", "npu-310p"])
def test_k8s_requests(kwargs, expected):
    assert Resources(**kwargs).k8s_requests() == expected


def test_describe():
    assert Resources(kind="gpu", cpu="4", memory="16Gi").describe() == "gpu x1 (nvidia-gpu), 4 CPU, 16Gi"
    assert Resources(kind="cpu", cpu="500m").describe() == "cpu, 500m CPU, 2Gi"


ROUND_TRIP = [
    dict(kind="cpu", cpu="500m", memory="16Gi"),
    dict(kind="gpu", count=2, cpu="8", memory="32Gi", device_memory="40Gi"),
    dict(kind="npu", accelerator="ascend-310p", count=1, cpu="4", memory="8Gi"),
    dict(kind="gpu", accelerator="nvidia-gpu"),
]


@pytest.mark.parametrize("kwargs", ROUND_TRIP, ids=["cpu", "gpu", "npu-310p", "gpu-explicit-accel"])
def test_to_dict_from_dict_round_trip(kwargs):
    r = Resources(**kwargs)
    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    back = Resources.from_dict(d)
    assert back == r
    assert back.to_dict() == d
    assert (back.cpu_millicores, back.memory_bytes, back.device_memory_bytes) == (
        r.cpu_millicores,
        r.memory_bytes,
        r.device_memory_bytes,
    )


@pytest.mark.parametrize(
    "kwargs",
    [dict(kind="gpu", cpu=4, memory="16Gi"), dict(kind="cpu", memory="1024Mi")],
    ids=["int-cpu", "memory-1024Mi"],
)
def test_to_dict_from_dict_round_trip_non_canonical_spelling(kwargs):
    r = Resources(**kwargs)
    assert Resources.from_dict(r.to_dict()) == r


def test_from_dict_unknown_key_lists_valid_keys():
    with pytest.raises(
        InvalidResources,
        match=r"unknown resource field\(s\) gpus, ram; valid: kind, count, cpu, memory, device_memory, accelerator",
    ):
        Resources.from_dict({"kind": "gpu", "gpus": 2, "ram": "1Gi"})


def test_from_dict_invalid_value_names_field():
    with pytest.raises(InvalidResources, match=r"^memory='lots'"):
        Resources.from_dict({"kind": "gpu", "memory": "lots"})


def test_parse_spec():
    r = Resources.parse_spec("gpu:count=2,memory=16Gi")
    assert r.kind is DeviceKind.GPU
    assert r.count == 2
    assert r.memory_bytes == 16 * 2**30
    assert r == Resources(kind="gpu", count=2, memory="16Gi")
    assert Resources.parse_spec("cpu") == Resources(kind="cpu")
    assert Resources.parse_spec("cpu:cpu=8").cpu_millicores == 8000
    npu = Resources.parse_spec("npu: accelerator=ascend-310p , count=1")
    assert npu.accelerator == "ascend-310p"


BAD_SPECS = [
    ("gpu:count", r"'count' is not key=value"),
    ("gpu:count=two", r"^count='two' in candidate 'gpu:count=two' is not an integer"),
    ("gpu:gpus=2", r"unknown resource field\(s\) gpus; valid: kind, count"),
    ("tpu:count=1", r"^kind='tpu' is not a device kind"),
    ("gpu:memory=16GB", r"^memory='16GB'"),
    ("cpu:count=1", r"^count=1 with kind='cpu'"),
    ("", r"^kind='' is not a device kind"),
]


@pytest.mark.parametrize(("spec", "pattern"), BAD_SPECS, ids=[s or "empty" for s, _ in BAD_SPECS])
def test_parse_spec_invalid(spec, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Resources.parse_spec(spec)


# --- Candidates -------------------------------------------------------------------------------------------


def test_candidates_order_preserved_first_preferred():
    npu = Resources(kind="npu", count=1, cpu="8", memory="32Gi")
    gpu = Resources(kind="gpu", count=1, cpu="8", memory="32Gi", device_memory="40Gi")
    cpu = Resources(kind="cpu", cpu="8", memory="16Gi")
    c = Candidates([npu, gpu, cpu])
    assert list(c) == [npu, gpu, cpu]
    assert c[0] is npu
    assert c.options == (npu, gpu, cpu)
    assert len(c) == 3
    assert c.policy == "ordered"
    reversed_c = Candidates([cpu, gpu, npu])
    assert reversed_c[0] is cpu
    assert reversed_c != c


def test_candidates_accept_strings_and_dicts():
    c = Candidates(["gpu:count=2,memory=16Gi", {"kind": "cpu", "cpu": "4"}, Resources(kind="npu")], policy="any")
    assert c[0] == Resources(kind="gpu", count=2, memory="16Gi")
    assert c[1] == Resources(kind="cpu", cpu="4")
    assert c[2] == Resources(kind="npu")
    assert c.policy == "any"


CANDIDATES_INVALID = [
    (([],), {}, r"^candidates is empty"),
    (([Resources(kind="gpu"), Resources(kind="gpu")],), {}, r"same Resources twice"),
    ((["gpu", "gpu:count=1"],), {}, r"same Resources twice"),
    (([Resources(kind="cpu")],), {"policy": "cheapest"}, r"^policy='cheapest' is unknown; valid: ordered, any"),
    (([Resources(kind="cpu"), 42],), {}, r"^candidates\[1\]=42 is not a Resources"),
    ((["gpu:gpus=1"],), {}, r"unknown resource field\(s\) gpus"),
]


@pytest.mark.parametrize(
    ("args", "kwargs", "pattern"),
    CANDIDATES_INVALID,
    ids=["empty", "duplicate", "duplicate-spelled-differently", "unknown-policy", "not-a-resource", "bad-spec"],
)
def test_candidates_invalid(args, kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Candidates(*args, **kwargs)


def test_candidates_duplicate_with_different_spelling():
    with pytest.raises(InvalidResources, match="same Resources twice"):
        Candidates([Resources(kind="cpu", cpu="1"), Resources(kind="cpu", cpu=1)])


def test_candidates_json_round_trip():
    c = Candidates(
        [
            Resources(kind="npu", accelerator="ascend-910", count=1, cpu="8", memory="32Gi"),
            Resources(kind="gpu", count=1, cpu="8", memory="32Gi", device_memory="40Gi"),
            Resources(kind="cpu", cpu="8", memory="16Gi"),
        ],
        policy="any",
    )
    text = c.to_json()
    data = json.loads(text)
    assert data["policy"] == "any"
    assert [o["kind"] for o in data["options"]] == ["npu", "gpu", "cpu"]
    back = Candidates.from_json(text)
    assert back == c
    assert back.policy == "any"
    assert [r.k8s_requests() for r in back] == [r.k8s_requests() for r in c]
    assert Candidates.from_json('{"options": ["cpu"]}') == Candidates([Resources(kind="cpu")])


MALFORMED_JSON = ["not json", "[]", "{}", '{"policy": "ordered"}', "null", '{"options": [{"kind": "gpu", "x": 1}]}']


@pytest.mark.parametrize("text", MALFORMED_JSON, ids=["not-json", "list", "no-options", "no-options-2", "null", "bad-item"])
def test_candidates_from_json_malformed(text):
    with pytest.raises(InvalidResources):
        Candidates.from_json(text)


def test_candidates_from_json_malformed_message():
    with pytest.raises(InvalidResources, match=r"candidates JSON is malformed .*expected \{'options': \[\.\.\.\]\}"):
        Candidates.from_json("{not json")


@pytest.mark.parametrize("text", ['{"options": 5}', '{"options": null}'], ids=["int-options", "null-options"])
def test_candidates_from_json_options_not_a_list(text):
    with pytest.raises(InvalidResources):
        Candidates.from_json(text)


# --- RetryPolicy ------------------------------------------------------------------------------------------

DELAYS = [
    (RetryPolicy(), [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]),
    (RetryPolicy(backoff_seconds=1, factor=3, max_delay_seconds=20), [1.0, 3.0, 9.0, 20.0, 20.0]),
    (RetryPolicy(backoff_seconds=2, factor=1, max_delay_seconds=2), [2.0, 2.0, 2.0]),
    (RetryPolicy(backoff_seconds=0, factor=2, max_delay_seconds=0), [0.0, 0.0]),
    (RetryPolicy(backoff_seconds=0.5, factor=1.5, max_delay_seconds=100), [0.5, 0.75, 1.125, 1.6875]),
]


@pytest.mark.parametrize(("policy", "expected"), DELAYS, ids=["default", "factor-3-cap-20", "constant", "zero", "fractional"])
def test_delay_seconds(policy, expected):
    got = [policy.delay_seconds(n) for n in range(len(expected))]
    assert got == pytest.approx(expected)
    for n, value in enumerate(got):
        assert value == pytest.approx(
            min(policy.backoff_seconds * policy.factor**n, policy.max_delay_seconds)
        )
        assert isinstance(value, float)


@pytest.mark.parametrize("retries", [0, 100], ids=["0", "100"])
def test_retries_bounds_valid(retries):
    assert RetryPolicy(retries=retries).retries == retries


RETRY_INVALID = [
    (dict(retries=-1), r"^retries=-1 is out of range; valid: an integer 0\.\.100"),
    (dict(retries=101), r"^retries=101 is out of range"),
    (dict(retries=1.5), r"^retries=1\.5 is out of range"),
    (dict(retries=True), r"^retries=True is out of range"),
    (dict(factor=0.5), r"^factor=0\.5 is out of range; valid: a finite number >= 1"),
    (dict(backoff_seconds=-1), r"^backoff_seconds=-1 is out of range; valid: a finite number >= 0"),
    (dict(backoff_seconds=float("nan")), r"^backoff_seconds=nan is not finite"),
    (dict(backoff_seconds=10, max_delay_seconds=5), r"^max_delay_seconds=5 is below backoff_seconds=10"),
    (dict(max_delay_seconds="300"), r"^max_delay_seconds='300' is not a number"),
    (dict(window_seconds=float("inf")), r"^window_seconds=inf is not finite"),
    (dict(max_delay_seconds=float("inf")), r"^max_delay_seconds=inf is not finite"),
    (dict(window_seconds=0), r"^window_seconds=0 allows no retry at all"),
]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    RETRY_INVALID,
    ids=["retries-neg", "retries-101", "retries-float", "retries-bool", "factor<1", "backoff-neg", "backoff-nan",
         "max<backoff", "max-str", "window-inf", "max-inf", "window-0"],
)
def test_retry_policy_invalid(kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.2, "1s"), (0.5, "1s"), (1.4, "1s"), (2.6, "3s"), (3600, "3600s")],
    ids=["zero", "sub-second", "half", "round-down", "round-up", "hour"],
)
def test_kfp_duration_rounds_and_never_truncates_to_zero(seconds, text):
    from heteroflow.components.retry import kfp_duration

    assert kfp_duration(seconds) == text


def test_kfp_retry_args_use_the_window_on_a_cluster_and_the_cap_locally():
    p = RetryPolicy(retries=2, backoff_seconds=0.4, factor=2, max_delay_seconds=60, window_seconds=7200)
    cluster = p.kfp_retry_args(local=False)
    assert cluster == {"num_retries": 2, "backoff_duration": "1s", "backoff_factor": 2.0, "backoff_max_duration": "7200s"}
    assert p.kfp_retry_args(local=True)["backoff_max_duration"] == "60s"


def test_retry_policy_is_frozen():
    p = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.retries = 5  # type: ignore[misc]
