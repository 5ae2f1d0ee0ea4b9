"""Compression of the exchange between kinds (#29 item 5): top-k with error feedback as a DDP communication hook
that weights each kind by its share, and torch's PowerSGD hook, picked by a parameter."""

from __future__ import annotations

import math

import pytest
import torch

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.training.mixed import MixedJob, ReplicaGroup, run_mixed, run_mixed_local


def _job(**kw) -> MixedJob:
    return MixedJob(model="mixed_models:mlp", data="mixed_models:digits", global_batch=32, learning_rate=0.05, max_steps=20,
                    optimizer="mixed_models:sgd", seed=3, fixed_shares={"gpu": [24], "npu": [8]}, **kw)


def _diff(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_bad_compression_names_the_field():
    with pytest.raises(InvalidParameter, match="compression='zip' is unknown; valid: none, topk, powersgd"):
        _job(compression="zip").check()


@pytest.mark.slow
def test_topk_sending_everything_is_the_uncompressed_exchange_and_one_percent_sends_a_fiftieth():
    plain = run_mixed_local(_job(), ["gpu", "npu"])
    full = run_mixed_local(_job(compression="topk", topk_ratio=1.0), ["gpu", "npu"])
    assert _diff(plain.state_dict, full.state_dict) <= 1e-5  # the share weighting is the same on the top-k path
    sparse = run_mixed_local(_job(compression="topk", topk_ratio=0.01), ["gpu", "npu"])
    n = sum(v.numel() for v in plain.state_dict.values())
    assert plain.uncompressed_bytes_per_step == plain.bytes_per_step == n * 4
    assert sparse.bytes_per_step == math.ceil(0.01 * n) * 8  # float32 values and int32 indices
    assert 0.015 < sparse.bytes_per_step / sparse.uncompressed_bytes_per_step < 0.025
    assert sparse.history[-1]["loss"] < sparse.history[0]["loss"]  # it still learns (error feedback)
    assert _diff(plain.state_dict, sparse.state_dict) > 1e-4  # and it did compress


@pytest.mark.slow
def test_powersgd_across_kinds_compresses_and_learns():
    run = run_mixed_local(_job(compression="powersgd", powersgd_rank=2), ["gpu", "npu"])
    ratio = run.bytes_per_step / run.uncompressed_bytes_per_step
    assert 0 < ratio < 0.25  # two warm-up exchanges uncompressed, then P and Q of rank 2
    assert all(torch.isfinite(v).all() for v in run.state_dict.values())
    assert run.history[-1]["loss"] < run.history[0]["loss"]


@pytest.mark.slow
def test_compression_applies_between_kind_leaders_only_in_a_one_one_two_layout():
    """gpu x2 + npu x1: the two GPU replicas sum in their kind group, the leaders exchange top-k (ratio 1: all),
    then the GPU leader broadcasts; the weights are the uncompressed run's."""
    kw = {"fixed_shares": {"gpu": [8, 8], "npu": [16]}}
    plain = run_mixed(MixedJob(**{**_job().__dict__, **kw}), [ReplicaGroup("gpu", 2), ReplicaGroup("npu", 1)])
    topk = run_mixed(MixedJob(**{**_job(compression="topk", topk_ratio=1.0).__dict__, **kw}), [ReplicaGroup("gpu", 2), ReplicaGroup("npu", 1)])
    assert _diff(plain.state_dict, topk.state_dict) <= 1e-5
