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
    parse_quantity,
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
    (dict(kind="gpu", accelerator="tpu-v5"), r"^accelerator='tpu-v5' is unknown; valid: amd-gpu, .*ascend-310p, ascend-910, .*nvidia-gpu"),
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
    # memory stays in the unit the user wrote (issue #10: "8G" was rendered as "7812500Ki")
    (dict(kind="npu", count=2, cpu="1.5", memory="1024Mi"), {"cpu": "1500m", "memory": "1024Mi", "huawei.com/Ascend910": "2"}),
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
        match=r"unknown resource field\(s\) gpus, ram; valid: kind, count, nodes, cpu, memory, cpu_limit, memory_limit, "
        r"device_memory, device_share, accelerator, precision, node_selector, tolerations, affinity, labels, annotations",
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
    # issue #16.17: a key given twice is an error, never "the last one wins"
    ("cpu:cpu=2,cpu=4", r"candidate 'cpu:cpu=2,cpu=4': cpu is given twice \(cpu=2 and cpu=4\); give each key once"),
    ("gpu:count=1,memory=8Gi,count=1", r"count is given twice \(count=1 and count=1\)"),  # even with equal values
    ("cpu:kind=gpu", r"the kind is given twice \('cpu' before the colon and kind=gpu\)"),  # sibling: kind= and KIND:
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
    (([Resources(kind="gpu"), Resources(kind="gpu")],), {}, r"same Resources twice: candidates\[0\] and candidates\[1\]"),
    ((["gpu", "gpu:count=1"],), {}, r"same Resources twice: .* \(written 'gpu' and 'gpu:count=1'\)"),
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


def test_a_duplicate_candidate_is_named_with_both_positions_and_spellings():
    """Issue #28.21: the error names the duplicate, where it is and how each copy was written."""
    with pytest.raises(InvalidResources) as info:
        Candidates(["npu", "cpu:cpu=2", {"kind": "gpu"}, "gpu:count=1"])
    assert str(info.value) == (
        f"candidates lists the same Resources twice: candidates[2] and candidates[3] are both "
        f"{Resources(kind='gpu').describe()} (written {{'kind': 'gpu'}} and 'gpu:count=1'); each fallback must differ"
    )


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
    # 100 retries need a window that holds their waits (5 s doubling, capped at 300 s: 28,815 s), see #16.15
    assert RetryPolicy(retries=retries, window_seconds=86400).retries == retries


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
    from heteroflow.components.core.retry import kfp_duration

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


# --- Requests and limits (issue #10) ----------------------------------------------------------------------


def test_requests_and_limits_are_separate_fields():
    r = Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi")
    assert (r.cpu_millicores, r.cpu_limit_millicores) == (1000, 2000)
    assert (r.memory_bytes, r.memory_limit_bytes) == (2 * 2**30, 4 * 2**30)
    assert r.k8s_requests() == {"cpu": "1", "memory": "2Gi"}
    assert r.k8s_limits() == {"cpu": "2", "memory": "4Gi"}
    assert r.describe() == "cpu, 1 CPU (limit 2), 2Gi (limit 4Gi)"


def test_limit_defaults_to_request():
    r = Resources(cpu="500m", memory="8G")
    assert r.cpu_limit_millicores == 500 and r.memory_limit_bytes == 8 * 10**9
    assert r.k8s_limits() == r.k8s_requests() == {"cpu": "500m", "memory": "8G"}


def test_limit_only_and_absent_quantities():
    r = Resources(accelerator="T4", cpu=None, memory=None, memory_limit="8G")
    assert r.cpu_millicores is None and r.cpu_limit_millicores is None
    assert r.memory_bytes is None and r.memory_limit_bytes == 8 * 10**9
    assert r.k8s_requests() == {"nvidia.com/gpu": "1"}
    assert r.k8s_limits() == {"memory": "8G", "nvidia.com/gpu": "1"}
    assert r.describe() == "gpu x1 (nvidia-t4), limit 8G"


def test_device_count_is_both_request_and_limit():
    r = Resources(kind="gpu", count=4)
    assert r.k8s_requests()["nvidia.com/gpu"] == r.k8s_limits()["nvidia.com/gpu"] == "4"


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(cpu="2", cpu_limit="1"), r"^cpu='2' is above cpu_limit='1': a request cannot exceed its limit; valid: cpu <= cpu_limit"),
        (dict(memory="4Gi", memory_limit="4G"), r"^memory='4Gi' is above memory_limit='4G'.*valid: memory <= memory_limit"),
        (dict(cpu_limit="two"), r"^cpu_limit='two' is not a Kubernetes quantity"),
    ],
    ids=["cpu-above-limit", "memory-above-limit-decimal-vs-binary", "bad-limit"],
)
def test_request_above_limit_is_an_error(kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Resources(**kwargs)


def test_replace_keeps_default_limit_tracking_the_request():
    r = Resources(cpu="1", memory="2Gi")
    bigger = dataclasses.replace(r, cpu="4", memory="8Gi")
    assert bigger.cpu_limit_millicores == 4000 and bigger.memory_limit_bytes == 8 * 2**30


UNIT_CASES = [
    ("8G", "8G"),  # issue #10: was rendered 7812500Ki
    ("16Gi", "16Gi"),
    ("1024Mi", "1024Mi"),
    ("1500", "1500"),
    (1500, "1500"),
    ("1.5Gi", "1536Mi"),  # not an integer in Gi: the shortest exact form
    ("1e9", "1G"),  # exponent form: the shortest exact form
    ("2000k", "2000k"),
]


@pytest.mark.parametrize(("written", "rendered"), UNIT_CASES, ids=[repr(w) for w, _ in UNIT_CASES])
def test_memory_rendered_in_the_unit_the_user_wrote_where_exact(written, rendered):
    r = Resources(memory=written)
    assert r.k8s_requests()["memory"] == rendered
    assert r.to_dict()["memory"] == rendered
    assert parse_memory(rendered) == r.memory_bytes


@pytest.mark.parametrize(
    ("written", "rendered"), [("500m", "500m"), ("2", "2"), (2, "2"), (0.5, "500m"), ("1500m", "1500m"), ("1.5", "1500m")]
)
def test_cpu_rendered_in_the_unit_the_user_wrote_where_exact(written, rendered):
    assert Resources(cpu=written).k8s_requests()["cpu"] == rendered


# --- Issue #8 item 6: every quantity a pod requests is positive or absent ----------------------------------

ZERO_CASES = [
    (dict(kind="cpu", cpu="0"), r"^cpu='0' is zero: a pod's request or limit is positive or absent; valid:"),  # issue input
    (dict(kind="cpu", memory="0Gi"), r"^memory='0Gi' is zero"),
    (dict(kind="cpu", cpu_limit="0m"), r"^cpu_limit='0m' is zero"),  # sibling: a zero limit
    (dict(kind="cpu", memory_limit=0), r"^memory_limit=0 is zero"),
    (dict(kind="gpu", device_memory="0"), r"^device_memory='0' is zero"),  # sibling: zero device memory
    (dict(kind="cpu", cpu=0.0), r"^cpu=0\.0 is zero"),
]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    ZERO_CASES,
    ids=["cpu-0-issue", "memory-0Gi", "cpu_limit-0m", "memory_limit-int-0", "device_memory-0", "cpu-float-0"],
)
def test_zero_quantities_are_rejected(kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Resources(**kwargs)


def test_absent_quantities_are_not_rendered():
    r = Resources(kind="cpu", cpu=None, memory=None)
    assert r.k8s_requests() == {} and r.k8s_limits() == {}
    assert r.to_dict()["cpu"] is None and Resources.from_dict(r.to_dict()) == r


# --- Issue #8 item 7: quantity strings that break the parser ----------------------------------------------


def test_huge_exponent_is_invalid_resources_not_a_decimal_error():
    # issue input: raised a raw decimal.InvalidOperation
    with pytest.raises(InvalidResources, match=r"^memory='1e999999999' is too large; valid:"):
        Resources(kind="cpu", memory="1e999999999")


BREAKERS = [
    ("memory", "1e-999999999", "not a whole number of bytes"),  # sibling: tiny, not huge
    ("memory", "9" * 5000, "more than 200 significant digits"),  # sibling: beyond Python's int-from-str limit
    ("memory", "1e" + "9" * 40, "too large"),  # an exponent too long to be an int
    ("cpu", "1e999999999", "too large"),
    ("cpu", "0." + "0" * 3000 + "1", "finer than 1m"),
    ("memory", "8Ei", "too large"),  # 2^63: one past int64
    ("memory", "NaN", "not a Kubernetes quantity"),
    ("memory", "Infinity", "not a Kubernetes quantity"),
    ("cpu", "1_000", "not a Kubernetes quantity"),
    ("cpu", "\u0661", "not a Kubernetes quantity"),  # ARABIC-INDIC DIGIT ONE: Python's \d and Decimal accept it
    ("memory", "1Gi\n", None),  # trailing whitespace is stripped: valid
]


@pytest.mark.parametrize(("field", "text", "why"), BREAKERS, ids=[f"{f}-{t[:12]!r}" for f, t, _ in BREAKERS])
def test_any_string_yields_the_exact_value_or_invalid_resources(field, text, why):
    parse = parse_memory if field == "memory" else parse_cpu
    if why is None:
        assert parse(text) == 2**30
        return
    with pytest.raises(InvalidResources, match=rf"^{field}=.*{why}"):
        parse(text)


def test_largest_int64_quantity_is_exact():
    assert parse_memory(str(2**63 - 1)) == 2**63 - 1
    assert parse_memory("7Ei") == 7 * 2**60
    assert parse_cpu("9223372036854775807m") == 2**63 - 1


# --- Issue #8 item 9: say the fix ---------------------------------------------------------------------------

SUGGESTIONS = [
    ("memory", "1.5GiB", ["'1.5Gi'"]),  # issue inputs
    ("memory", "16GB", ["'16G'", "'16Gi'"]),
    ("memory", "16 Gi", ["'16Gi'"]),
    ("memory", "512MiB", ["'512Mi'"]),  # siblings
    ("memory", "16gi", ["'16Gi'"]),
    ("memory", "1K", ["'1k'", "'1Ki'"]),  # kubernetes.utils accepts 1K; Kubernetes does not
    ("memory", "1,5Gi", ["'1.5Gi'"]),
    ("memory", "1m", ["'1M'", "'1Mi'"]),  # valid quantity, a thousandth of a byte
    ("memory", "100 bytes", ["'100'"]),
    ("cpu", "2 cores", ["'2'"]),
    ("cpu", "500 m", ["'500m'"]),
    ("cpu", "4vCPU", ["'4'"]),
]


@pytest.mark.parametrize(("field", "text", "expected"), SUGGESTIONS, ids=[f"{f}-{t}" for f, t, _ in SUGGESTIONS])
def test_errors_suggest_the_likely_intent(field, text, expected):
    parse = parse_memory if field == "memory" else parse_cpu
    with pytest.raises(InvalidResources) as info:
        parse(text)
    message = str(info.value)
    assert message.startswith(f"{field}={text!r}")
    assert "did you mean " + " or ".join(expected) + "?" in message
    assert "; valid: " in message
    for suggestion in expected:  # each suggestion is itself valid
        parse(suggestion.strip("'"))


def test_no_suggestion_when_nothing_is_near():
    with pytest.raises(InvalidResources) as info:
        parse_memory("lots")
    assert "did you mean" not in str(info.value)


# --- Strings kubernetes.utils.parse_quantity takes but Kubernetes does not ------------------------------------
# (the property tests against kubernetes.utils.parse_quantity, which need hypothesis: test_resources_properties.py)

def _k8s_parse(text):
    from kubernetes.utils import parse_quantity as k8s_parse_quantity

    return k8s_parse_quantity(text)


LIBRARY_ONLY = ["1K", "1mi", "1ni", "1e3Ki", "1e3M", "NaN", "Infinity", "-inf", "1_000", "\u0661", "2E3Gi", "1e2k"]


@pytest.mark.parametrize("text", LIBRARY_ONLY)
def test_strings_kubernetes_rejects_but_the_library_accepts(text):
    _k8s_parse(text)  # kubernetes.utils.parse_quantity takes it ...
    with pytest.raises(InvalidResources):  # ... Kubernetes' ParseQuantity does not, and neither do we
        parse_quantity(text)


# --- Accelerator names, device memory and precision (issue #10) ------------------------------------------

ACCEL_NAMES = [
    ("T4", "nvidia-t4"),
    ("NVIDIA_TESLA_T4", "nvidia-t4"),
    ("nvidia-tesla-t4", "nvidia-t4"),
    ("A100", "nvidia-a100"),
    ("ascend-910b3", "ascend-910b3"),
    ("910B", "ascend-910b"),
    ("Ascend 910B3", "ascend-910b3"),
    ("nvidia-gpu", "nvidia-gpu"),
]


@pytest.mark.parametrize(("written", "key"), ACCEL_NAMES, ids=[w for w, _ in ACCEL_NAMES])
def test_accelerator_names_users_write_resolve_to_the_registry(written, key):
    r = Resources(accelerator=written)
    assert r.accelerator == key
    assert r.kind is ACCELERATORS[key].kind  # kind follows the accelerator when not given
    assert r == Resources(kind=ACCELERATORS[key].kind.value, accelerator=key)


def test_unknown_accelerator_lists_close_matches():
    with pytest.raises(InvalidResources, match=r"^accelerator='A200' is unknown; close matches: nvidia-h200, nvidia-a100; valid: "):
        Resources(accelerator="A200")


FIT_ERRORS = [
    (dict(accelerator="T4", device_memory="32Gi"), r"^device_memory='32Gi' is more than nvidia-t4 \(NVIDIA T4\) has \(16Gi\); valid: at most 16Gi, or an accelerator with more: nvidia-a100-40gb"),
    (dict(accelerator="A100", device_memory="100Gi"), r"^device_memory='100Gi' is more than any model of nvidia-a100 .* has \(the largest, nvidia-a100-80gb, has 80Gi\); valid: at most 80Gi, or an accelerator with more: nvidia-h200 \(141Gi\)"),
    (dict(accelerator="ascend-910b4", device_memory="64Gi"), r"^device_memory='64Gi' is more than ascend-910b4 .*\(32Gi\)"),
    (dict(accelerator="T4", precision="bf16"), r"^precision='bf16' on accelerator='nvidia-t4' \(NVIDIA T4\): it has no bfloat16; valid: precision='fp16' or 'fp32', or an accelerator with bf16: nvidia-a10"),
    (dict(accelerator="ascend-910a", precision="bf16"), r"^precision='bf16' on accelerator='ascend-910a'"),
    (dict(kind="gpu", precision="fp8"), r"^precision='fp8' is unknown; valid: fp32, fp16, bf16"),
]


@pytest.mark.parametrize(("kwargs", "pattern"), FIT_ERRORS, ids=["t4-32Gi", "a100-100Gi", "910b4-64Gi", "t4-bf16", "910a-bf16", "fp8"])
def test_wrong_accelerator_combinations_name_the_field(kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Resources(**kwargs)


def test_device_memory_and_bf16_narrow_a_family():
    r = Resources(kind="gpu", device_memory="40Gi")
    assert [m.name for m in r.accelerator_models] == ["nvidia-a100-40gb", "nvidia-a100-80gb", "nvidia-h100", "nvidia-h200"]
    r = Resources(accelerator="nvidia-gpu", precision="BF16")
    assert r.precision == "bf16"
    assert "nvidia-t4" not in {m.name for m in r.accelerator_models} and "nvidia-v100" not in {m.name for m in r.accelerator_models}
    r = Resources(accelerator="ascend-910", precision="bf16", device_memory="64Gi")
    assert [m.name for m in r.accelerator_models] == ["ascend-910b2", "ascend-910b3", "ascend-910c"]
    assert Resources(accelerator="T4", device_memory="16Gi").accelerator_models == (ACCELERATORS["nvidia-t4"],)


def test_torch_device_and_backend_follow_the_accelerator():
    assert (Resources().torch_device_type, Resources().distributed_backend) == ("cpu", "gloo")
    assert (Resources(accelerator="T4").torch_device_type, Resources(accelerator="T4").distributed_backend) == ("cuda", "nccl")
    npu = Resources(accelerator="910B3")
    assert (npu.torch_device_type, npu.distributed_backend) == ("npu", "hccl")
    assert Resources(accelerator="gaudi2").torch_device_type == "hpu"


# --- Node selectors, tolerations, affinity, labels, annotations --------------------------------------------

AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]
        }
    }
}
PLACED = dict(
    kind="gpu",
    cpu="100m",
    memory="100Mi",
    node_selector={"disktype": "ssd"},
    tolerations=[{"key": "example-key", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600}],
    affinity=AFFINITY,
    labels={"team": "vision"},
    annotations={"example.com/owner": "ml platform"},
)


def test_placement_fields_are_immutable():
    r = Resources(**PLACED)
    with pytest.raises(TypeError):
        r.node_selector["disktype"] = "hdd"  # type: ignore[index]
    with pytest.raises(TypeError):
        r.labels["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        r.affinity["nodeAffinity"]["x"] = 1  # type: ignore[index]
    assert isinstance(r.tolerations, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.tolerations[0].key = "other"  # type: ignore[misc]
    # changing the caller's dict after construction changes nothing
    selector = {"disktype": "ssd"}
    r2 = Resources(node_selector=selector)
    selector["disktype"] = "hdd"
    assert r2.node_selector == {"disktype": "ssd"}
    assert hash(r) == hash(Resources(**PLACED))


def test_placement_fields_survive_dict_and_json_round_trips():
    r = Resources(**PLACED)
    d = r.to_dict()
    assert d["node_selector"] == {"disktype": "ssd"}
    assert d["tolerations"] == [{"key": "example-key", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600}]
    assert d["affinity"] == AFFINITY
    assert d["labels"] == {"team": "vision"} and d["annotations"] == {"example.com/owner": "ml platform"}
    assert json.loads(json.dumps(d)) == d
    assert Resources.from_dict(d) == r
    c = Candidates([r, Resources(kind="cpu", cpu="1", cpu_limit="2", precision="fp32")])
    back = Candidates.from_json(c.to_json())
    assert back == c
    assert back[0].affinity == r.affinity and back[0].tolerations == r.tolerations
    assert back[1].cpu_limit_millicores == 2000 and back[1].precision == "fp32"
    assert back.to_json() == c.to_json()


def test_to_dict_keeps_the_old_keys_for_plain_candidates():
    # the default pipeline's compiled candidates JSON (tests/golden/default_pipeline.yaml) keeps its shape
    assert Resources(kind="npu", accelerator="ascend-910", cpu="8", memory="32Gi").to_dict() == {
        "kind": "npu", "count": 1, "cpu": "8", "memory": "32Gi", "device_memory": None, "accelerator": "ascend-910",
    }


PLACEMENT_INVALID = [
    (dict(tolerations=[{"key": "", "operator": "Equal", "value": "x"}]), r"^tolerations\[0\]\.operator='Equal' with an empty key: .*valid: operator='Exists', or a key"),
    (dict(tolerations=[{"operator": "Equal"}]), r"^tolerations\[0\]\.operator='Equal' with an empty key"),
    (dict(tolerations=[{"key": "a", "operator": "Like"}]), r"^tolerations\[0\]\.operator='Like' is unknown; valid: Equal, Exists"),
    (dict(tolerations=[{"key": "a", "operator": "Exists", "value": "b"}]), r"^tolerations\[0\]\.value='b' with operator 'Exists'"),
    (dict(tolerations=[{"key": "a", "effect": "NoRun"}]), r"^tolerations\[0\]\.effect='NoRun' is unknown; valid: NoSchedule, PreferNoSchedule, NoExecute"),
    (dict(tolerations=[{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]), r"^tolerations\[0\]\.toleration_seconds=5 with effect='NoSchedule'"),
    (dict(tolerations=[{"key": "a", "seconds": 5}]), r"^tolerations\[0\] has unknown field\(s\) seconds; valid: key, operator"),
    (dict(tolerations={"key": "a"}), r"^tolerations=.* is not a list"),
    (dict(node_selector={"bad key!": "x"}), r"^node_selector key 'bad key!' is not a Kubernetes qualified name"),
    (dict(node_selector={"disktype": "s s d"}), r"^node_selector\['disktype'\]='s s d' is not a Kubernetes label value"),
    (dict(labels={"a": "x" * 64}), r"^labels\['a'\]='x+' is not a Kubernetes label value"),
    (dict(annotations={"a": 1}), r"^annotations\['a'\]=1 is not a string"),
    (dict(affinity={"nodeAfinity": {}}), r"^affinity has unknown field\(s\) nodeAfinity; valid: nodeAffinity, podAffinity, podAntiAffinity"),
]


@pytest.mark.parametrize(("kwargs", "pattern"), PLACEMENT_INVALID, ids=[
    "empty-key-equal", "no-key-default-operator", "bad-operator", "exists-with-value", "bad-effect",
    "seconds-without-noexecute", "unknown-toleration-field", "tolerations-not-list", "bad-selector-key",
    "bad-selector-value", "long-label", "non-string-annotation", "affinity-typo",
])
def test_placement_fields_invalid(kwargs, pattern):
    with pytest.raises(InvalidResources, match=pattern):
        Resources(**kwargs)


def test_toleration_accepts_the_kubernetes_client_type():
    from kubernetes.client import V1Toleration

    from heteroflow.components.resources import Toleration

    r = Resources(tolerations=[V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")])
    assert r.tolerations == (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)


def test_resources_with_placement_fields_pickle_and_deepcopy():
    import copy
    import pickle

    r = Resources(**PLACED)
    assert pickle.loads(pickle.dumps(r)) == r
    clone = copy.deepcopy(r)
    assert clone == r and clone.affinity == r.affinity and hash(clone) == hash(r)
    assert Resources(tolerations=None, node_selector=None, labels=None) == Resources()


def test_a_misspelt_kind_suggests_the_registered_one() -> None:
    """Found trying it as a new user: ``-c gppu`` listed the kinds but did not say which one was meant."""
    with pytest.raises(InvalidResources, match=r"^kind='gppu' is not a device kind; valid kinds: cpu, gpu, npu.*; did you mean 'gpu'\?$"):
        Resources.parse_spec("gppu")
    with pytest.raises(InvalidResources, match=r"did you mean 'gpu'\?$"):
        Resources.parse_spec("cudda:count=1")  # an alias, misspelt: the kind it stands for
    with pytest.raises(InvalidResources, match=r"valid kinds: cpu, gpu, npu[^;]*$"):
        Resources.parse_spec("quantum")  # nothing close: no guess


def test_fields_separated_by_semicolons_say_the_separator() -> None:
    with pytest.raises(InvalidResources, match=r"candidate 'gpu:count=1;memory=2Gi': fields are separated by ',', not ';'"):
        Resources.parse_spec("gpu:count=1;memory=2Gi")
