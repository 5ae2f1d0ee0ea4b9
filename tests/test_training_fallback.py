"""Issue 14, "A fallback resumes": an NPU candidate that fails mid-training hands over to the GPU candidate, which
resumes from the NPU's last checkpoint (the folder is keyed by data, parameters and model, not device); the run
record says from which step; the final weights equal an uninterrupted run's (deterministic mode, on the CPU that
simulates both device kinds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="train needs PyTorch (the 'torch' extra)")

HETEROFLOW = Path(sys.executable).with_name("heteroflow")


def _run(args: list[str], home: Path, cwd: Path, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [str(HETEROFLOW), "run", "--simulate-devices", "npu,gpu", "--param", "epochs=5", "--param", "checkpoint_every_steps=20",
         "--param", "deterministic=true", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        # one torch thread: beside the other xdist worker, train's default of a thread per core oversubscribes the
        # two cores (a 20-epoch digits `heteroflow run` took 21.7 s of CPU with 2 threads, 10.4 s with 1, #32)
        env={**os.environ, "HETEROFLOW_HOME": str(home), "COLUMNS": "120", "OMP_NUM_THREADS": "1", **(env or {})},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    runs = sorted((cwd / "heteroflow-runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return json.loads((runs[-1] / "run.json").read_text())


def _weights(record: dict) -> dict:
    return torch.load(Path(record["results"]["archive"]["path"]) / "model" / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def one_npu_reference(digits_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted run both tests below compare with (one run for both: a `heteroflow run` costs about 10 s
    of CPU): train on one NPU (``-c npu:count=1``), the parameters of ``_run``, no fault. Read-only."""
    root = tmp_path_factory.mktemp("one-npu-reference")
    return _run(["--dataset", str(digits_dir), "-c", "npu:count=1"], root / "home", root)


# the same xdist group: both tests run on one worker, which makes one_npu_reference once
@pytest.mark.slow
@pytest.mark.xdist_group("training_fallback")
def test_a_device_failure_after_40_steps_resumes_on_the_gpu_with_the_uninterrupted_weights(
    digits_dir: Path, tmp_path: Path, one_npu_reference: dict
) -> None:
    home = tmp_path / "home"
    data = ["--dataset", str(digits_dir)]
    faulted = _run([*data, "--inject-fault", "train@npu=device:after_steps=40"], home, tmp_path)
    assert faulted["status"] == "succeeded"
    train = faulted["results"]["train"]
    assert train["device_kind"] == "gpu" and train["resumed_from_step"] >= 40
    assert faulted["metrics"]["train"]["resumed_from_step"] == train["resumed_from_step"]
    assert [h["epoch"] for h in train["history"]] == [1, 2, 3, 4, 5]  # the NPU's epochs are in the history
    (fallback,) = faulted["fallbacks"]
    assert "after_steps=40" in json.dumps(fallback)
    # #28 item 17: the report says where train finished and from which step it resumed
    html = Path(faulted["run_dir"], "report.html").read_text(encoding="utf-8")
    placement = html.split("<h2>Placement</h2>", 1)[1].split("<h2>", 1)[0]
    assert "&rarr; gpu (" in placement and "simulated, on cpu" in placement and "then fell back" in placement
    assert f"resumed from step {train['resumed_from_step']}" in placement

    # the env form of the same fault
    env_run = _run(data, home, tmp_path, env={"HETEROFLOW_INJECT_FAULT": "train@npu=device:after_steps=40"})
    assert env_run["results"]["train"]["device_kind"] == "gpu" and env_run["results"]["train"]["resumed_from_step"] >= 40

    reference = one_npu_reference  # the default candidates' first (simulated) NPU: one NPU, as -c npu:count=1
    ref_train = reference["results"]["train"]
    assert ref_train["device_kind"] == "npu" and ref_train["resumed_from_step"] == 0
    assert train["final_loss"] == ref_train["final_loss"] and train["history"] == ref_train["history"]
    a, b, c = _weights(faulted), _weights(env_run), _weights(reference)
    assert [k for k in c if not torch.equal(a[k], c[k])] == []
    assert [k for k in c if not torch.equal(b[k], c[k])] == []


@pytest.mark.slow
@pytest.mark.xdist_group("training_fallback")
def test_a_two_device_candidate_that_fails_after_40_steps_resumes_on_one_gpu(
    digits_dir: Path, tmp_path: Path, one_npu_reference: dict
) -> None:
    """The case heteroflow exists for, with several devices: an NPU x2 candidate trains with two workers (one
    per device, each its share of every batch), its devices fail after 40 steps, and the one-GPU candidate resumes
    from rank 0's checkpoint: one optimizer step means the same on both, so the history equals an uninterrupted
    one-device run and the weights equal it up to the reduction's float rounding."""
    home = tmp_path / "home"
    data = ["--dataset", str(digits_dir), "-c", "npu:count=2", "-c", "gpu:count=1"]
    faulted = _run([*data, "--inject-fault", "train@npu=device:after_steps=40"], home, tmp_path)
    assert faulted["status"] == "succeeded"
    train = faulted["results"]["train"]
    assert (train["device_kind"], train["processes"]) == ("gpu", 1)
    assert train["resumed_from_step"] >= 40
    (fallback,) = faulted["fallbacks"]
    assert fallback["kind"] == "npu" and "after_steps=40" in json.dumps(fallback)
    assert re.search(r"\(raised in distributed worker rank [01]\)$", fallback["reason"]), fallback["reason"]
    assert "Traceback" not in fallback["reason"]  # one line; the worker's traceback is in the step's log

    two = _run(["--dataset", str(digits_dir), "-c", "npu:count=2"], home, tmp_path)
    assert (two["results"]["train"]["device_kind"], two["results"]["train"]["processes"]) == ("npu", 2)
    reference = one_npu_reference
    assert reference["results"]["train"]["processes"] == 1
    for run in (faulted, two):
        got = run["results"]["train"]["history"]
        ref = reference["results"]["train"]["history"]
        assert [h["epoch"] for h in got] == [h["epoch"] for h in ref] == [1, 2, 3, 4, 5]
        assert [h["loss"] for h in got] == pytest.approx([h["loss"] for h in ref], abs=1e-5)
        a, c = _weights(run), _weights(reference)
        assert all(torch.allclose(a[k], c[k], atol=1e-5, rtol=0) for k in c), {k: float((a[k] - c[k]).abs().max()) for k in c}
