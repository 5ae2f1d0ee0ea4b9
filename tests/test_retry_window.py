"""Every declared retry can start (issue #16.15): a policy whose waits alone pass its total window is refused
where it is declared, and a policy compiled for a cluster, where Argo does not cap the waits, warns when Argo would
start fewer retries than ``maxRetryCount`` says."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from heteroflow.components.errors import InvalidResources
from heteroflow.components.core.retry import RetryPolicy, RetryWindowWarning


def test_the_issues_policy_is_refused_with_what_would_start_and_the_ways_out() -> None:
    with pytest.raises(InvalidResources) as info:
        RetryPolicy(retries=5, backoff_seconds=300, max_delay_seconds=1800)  # the default 3600 s window
    message = str(info.value)
    assert message.startswith("retries=5 cannot all start within window_seconds=3600")
    assert "the waits before them alone add up to 5700 s (300, 600, 1200, 1800, 1800 s)" in message
    assert "at most 3 could start" in message
    assert "valid: window_seconds >= 5700 plus the run time of 5 attempts, or retries <= 3" in message
    # each way out the message gives is accepted
    assert RetryPolicy(retries=3, backoff_seconds=300, max_delay_seconds=1800).retries == 3
    roomy = RetryPolicy(retries=5, backoff_seconds=300, max_delay_seconds=1800, window_seconds=5700 + 5 * 600)
    assert roomy.retries_that_can_start(cluster=False, attempt_seconds=600) == 5


def test_a_first_wait_longer_than_the_window_is_refused() -> None:
    """Sibling: a single retry whose first wait already passes the window could never start."""
    with pytest.raises(InvalidResources, match=r"retries=1 cannot all start within window_seconds=300 .* at most 0"):
        RetryPolicy(retries=1, backoff_seconds=600, max_delay_seconds=600, window_seconds=300)


@pytest.mark.parametrize(
    ("policy", "cluster", "attempt_seconds", "expected"),
    [
        # Argo: waits 10, 30, 90, 270 (sum 400): a retry whose start is exactly at the window's end still starts
        # (operator.go stops only when the waiting deadline is *after* the max-duration deadline)
        (dict(retries=4, backoff_seconds=10, factor=3, max_delay_seconds=60, window_seconds=400), True, 0, 4),
        (dict(retries=4, backoff_seconds=10, factor=3, max_delay_seconds=60, window_seconds=399), True, 0, 3),
        # the same policy where the cap applies (Airflow, kfp.local, in-process): 10 + 30 + 60 + 60 = 160 s
        (dict(retries=4, backoff_seconds=10, factor=3, max_delay_seconds=60, window_seconds=399), False, 0, 4),
        # attempts' own run time counts: 4 attempts of 60 s + 160 s of waits = 400 s
        (dict(retries=4, backoff_seconds=10, factor=3, max_delay_seconds=60, window_seconds=399), False, 60, 3),
        # a sub-second backoff compiles to "1s" on a cluster: Argo waits 1, 2, 4
        (dict(retries=3, backoff_seconds=0.2, factor=2, max_delay_seconds=1, window_seconds=6), True, 0, 2),
    ],
    ids=["argo-at-the-edge", "argo-past-the-edge", "capped", "attempt-time", "sub-second-backoff"],
)
def test_retries_that_can_start(policy: dict, cluster: bool, attempt_seconds: float, expected: int) -> None:
    assert RetryPolicy(**policy).retries_that_can_start(cluster=cluster, attempt_seconds=attempt_seconds) == expected


def test_a_huge_float_factor_no_longer_overflows() -> None:
    """Sibling found while fixing: ``1e10 ** 99`` raised OverflowError in ``delay_seconds``."""
    policy = RetryPolicy(retries=100, backoff_seconds=1, factor=1e10, max_delay_seconds=60, window_seconds=86400)
    assert policy.delay_seconds(99) == 60.0
    assert policy.cluster_delay_seconds(99) == float("inf")
    assert policy.retries_that_can_start(cluster=True) == 1


def test_compiling_for_a_cluster_warns_when_argo_would_start_fewer_retries(tmp_path: Path) -> None:
    """Sibling: RetryPolicy(retries=10) is valid where waits are capped (5..160 s, then 300 s: 1,515 s in all),
    but Argo waits 5 x 2^n uncapped (5,115 s for 10 retries), so only 9 fit KFP's default hour on a cluster."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import compile_pipeline

    pipeline = default_pipeline()
    pipeline.replace("train", retry=RetryPolicy(retries=10))
    out = tmp_path / "p.yaml"
    with pytest.warns(RetryWindowWarning, match=r"retries=10 compiles to maxRetryCount: 10, but on a cluster at most 9"):
        compile_pipeline(pipeline, out)
    text = out.read_text()
    assert "maxRetryCount: 10" in text
    assert "backoffMaxDuration: 3600s" in text
    # with the window the warning asks for, no warning
    pipeline.replace("train", retry=RetryPolicy(retries=10, window_seconds=5115 + 10 * 600))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RetryWindowWarning)
        compile_pipeline(pipeline, out)
    assert "backoffMaxDuration: 11115s" in out.read_text()
    assert next(yaml.safe_load_all(out.read_text()))["pipelineInfo"]


def test_every_shipped_steps_policy_lets_all_its_retries_start_everywhere() -> None:
    from heteroflow.pipelines.default import default_pipeline

    for call in default_pipeline().calls:
        policy = call.retry
        assert policy.retries_that_can_start(cluster=True) == policy.retries, call.name
        assert policy.retries_that_can_start(cluster=False) == policy.retries, call.name
