"""The live table of ``heteroflow run``: a transient failure shows ``retrying in N s (attempt k of n)`` while it
waits, seconds tick while a step runs, and the summary lists retries and the time spent waiting."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from heteroflow.components.core.retry import RetryPolicy
from heteroflow.pipelines.cli.runs import live_state


def _step(status: str = "failed", seconds: float | None = 0.5) -> types.SimpleNamespace:
    return types.SimpleNamespace(name="train", status=status, failure="transient", seconds=seconds)


def _failed(n: int, candidate: int, start: float, end: float, failure: str = "transient") -> dict:
    return {"attempt": n, "status": "failed", "failure": failure, "candidate": candidate, "started_at": start, "ended_at": end}


POLICY = RetryPolicy(retries=2, backoff_seconds=10, factor=2, max_delay_seconds=100, window_seconds=3600)


def test_a_transient_failure_waiting_for_its_retry() -> None:
    recs = [_failed(1, 0, 100.0, 101.0)]
    assert live_state(_step(), recs, POLICY, now=104.2) == ("retrying", 0.5, "retrying in 7 s (attempt 2 of 3)")
    recs.append(_failed(2, 0, 111.0, 112.0))
    assert live_state(_step(), recs, POLICY, now=113.0)[2] == "retrying in 19 s (attempt 3 of 3)"  # 10 * 2**1 s
    assert live_state(_step(), recs, POLICY, now=200.0)[2] == "retrying in 0 s (attempt 3 of 3)"


def test_no_retry_left_or_outside_the_window_reads_failed() -> None:
    recs = [_failed(1, 0, 100.0, 101.0), _failed(2, 0, 111.0, 112.0), _failed(3, 0, 132.0, 133.0)]
    assert live_state(_step(), recs, POLICY, now=134.0) == ("failed", 0.5, "")
    short = RetryPolicy(retries=1, backoff_seconds=10, factor=2, max_delay_seconds=100, window_seconds=15)
    long_first = [_failed(1, 0, 100.0, 106.0)]  # the attempt itself ran 6 s
    assert live_state(_step(), long_first, short, now=107.0)[0] == "failed"  # 106 + 10 - 100 > 15
    assert live_state(_step(), [_failed(1, 0, 100.0, 101.0, failure="permanent")], POLICY, now=102.0)[0] == "failed"


def test_a_loop_iteration_waiting_for_its_retry_counts_its_own_attempts() -> None:
    """Inside a ParallelFor each iteration retries apart: iteration 1's first failure is its attempt 1 of 3, however
    many attempts the other iterations made; a running iteration's seconds tick."""
    ok = {"attempt": 1, "status": "succeeded", "candidate": None, "started_at": 99.0, "ended_at": 99.5, "iteration": 0}
    recs = [ok, {**_failed(1, None, 100.0, 101.0), "iteration": 1}, {**ok, "iteration": 2}]
    assert live_state(_step(status="failed"), recs, POLICY, now=104.2) == ("retrying", 0.5, "[1] retrying in 7 s (attempt 2 of 3)")
    running = {"attempt": 1, "status": "running", "candidate": None, "started_at": 103.0, "iteration": 3}
    assert live_state(_step(status="running"), [*recs, running], POLICY, now=104.0) == ("running", 1.5, "[1] retrying in 7 s (attempt 2 of 3)")
    done = [ok, {**ok, "iteration": 1, "attempt": 2}]
    looped = types.SimpleNamespace(name="train", status="succeeded", seconds=1.0, iterations=[{"iteration": 0, "status": "succeeded", "attempts": 1},
                                                                                          {"iteration": 1, "status": "succeeded", "attempts": 2}])
    assert live_state(looped, done, POLICY, now=200.0) == ("succeeded", 1.0, "2 iterations: 2 succeeded; [1] 2 attempts")


def test_attempts_count_per_candidate_after_a_fallback() -> None:
    recs = [_failed(1, 0, 100.0, 101.0, failure="device"), _failed(2, 1, 101.0, 102.0)]
    assert live_state(_step(), recs, POLICY, now=103.0)[2] == "retrying in 9 s (attempt 2 of 3)"


def test_seconds_tick_while_a_step_runs() -> None:
    recs = [{"attempt": 1, "status": "running", "started_at": 100.0}]
    assert live_state(_step("running", None), recs, POLICY, now=112.5) == ("running", 12.5, "")


QUICK = """\
from heteroflow.components.core.retry import RetryPolicy
from heteroflow.pipelines.default import default_pipeline


def build():
    p = default_pipeline(name="hf-quick-retry")
    p.replace("train", retry=RetryPolicy(retries=2, backoff_seconds=4, factor=1, max_delay_seconds=4, window_seconds=600))
    return p
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("script") is None, reason="no `script` (util-linux) to run the command on a terminal")
def test_live_frames_show_retrying_during_the_wait(tmp_path: Path) -> None:
    """``heteroflow run`` on a pseudo-terminal (util-linux ``script``), train failing twice with a transient
    fault and a 4 s backoff: the captured frames count down ``retrying in N s (attempt k of 3)``, train's seconds
    tick while it runs, and the summary lists both retries and the time spent waiting."""
    (tmp_path / "quick_pipeline.py").write_text(QUICK)
    heteroflow = Path(sys.executable).parent / "heteroflow"
    command = (
        f"{heteroflow} run --pipeline quick_pipeline:build --engine kfp-local --output {tmp_path / 'run'} "
        "--simulate-devices npu --inject-fault train@npu=transient:2 --param epochs=3"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "160", "LINES": "50", "TERM": "xterm"}
    typescript = tmp_path / "frames.typescript"
    done = subprocess.run(["script", "-q", "-e", "-c", command, str(typescript)], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", typescript.read_text(errors="replace"))
    assert done.returncode == 0, frames[-3000:]
    waits = re.findall(r"retrying in (\d+) s \(attempt (\d) of 3\)", frames)
    assert {k for _, k in waits} == {"2", "3"}, frames[-3000:]
    assert len({n for n, _ in waits}) >= 2  # the wait counts down across frames
    assert all(0 <= int(n) <= 4 for n, _ in waits)
    ticking = {float(x) for x in re.findall(r"│ train\s+│ running\s+│[^│]*│[^│]*│\s+([\d.]+) │", frames)}
    assert len(ticking) >= 2, frames[-3000:]
    assert re.search(r"retries: 2, [\d.]+ s spent waiting of the run's [\d.]+ s", frames)
    assert len(re.findall(r"  train attempt [23] on npu \(candidate 0\) after a transient failure, waited [\d.]+ s", frames)) == 2
