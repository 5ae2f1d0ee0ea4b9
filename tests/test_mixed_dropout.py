"""A kind drops out, the job goes on (#29 item 4): the NPU replicas fail with a device-class failure (injected on
the CPU), their elastic agent is stopped, the GPU agent re-forms the rendezvous alone, resumes from the last
checkpoint with recomputed shares, and ends with the uninterrupted run's weights; the record, the summary and the
report say which kind dropped, at which step, and from which step it resumed. When every kind fails, the step's
fallback to the next candidate takes over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heteroflow.components.core.failures import FailureClass, InjectedDeviceFault, classify
from heteroflow.components.training.mixed import MixedJob, ReplicaGroup, run_mixed, run_mixed_local

HETEROFLOW = Path(sys.executable).with_name("heteroflow")


def _job(ckpt: Path) -> MixedJob:
    return MixedJob(model="mixed_models:cnn", data="mixed_models:digits", global_batch=32, learning_rate=0.05, max_steps=20,
                    optimizer="mixed_models:sgd", seed=7, fixed_shares={"gpu": [24], "npu": [8]}, checkpoint_dir=str(ckpt),
                    checkpoint_every_steps=5)


@pytest.mark.slow
def test_npu_drops_out_the_gpu_resumes_and_the_weights_match_the_uninterrupted_run(tmp_path, monkeypatch):
    # the uninterrupted run: the same two replicas as forked workers (run_mixed_local, the same weights as the agents'
    # launch without a drop-out, tests/test_mixed_trajectory.py), a few seconds less than two more agents
    whole = run_mixed_local(_job(tmp_path / "a"), ["gpu", "npu"])
    monkeypatch.setenv("HETEROFLOW_INJECT_FAULT", "train@npu=device:after_steps=7")
    lines: list[str] = []
    dropped = run_mixed(_job(tmp_path / "b"), [ReplicaGroup("gpu", 1), ReplicaGroup("npu", 1)], last_call_timeout=3, say=lines.append)
    assert whole.kinds == ["gpu", "npu"] and whole.steps == dropped.steps == 20
    (d,) = dropped.dropped
    assert d["kind"] == "npu" and d["step"] == 7 and d["resumed_from_step"] == 5 and "InjectedDeviceFault" in d["reason"]
    assert dropped.kinds == ["gpu"] and dropped.shares == [32] and dropped.resumed_from_step == 5 and dropped.steps == 20
    assert any("kind npu dropped out after step 7" in line for line in lines)
    assert max(float((whole.state_dict[k] - dropped.state_dict[k]).abs().max()) for k in whole.state_dict) <= 1e-5


@pytest.mark.slow
def test_every_kind_failing_raises_the_device_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("HETEROFLOW_INJECT_FAULT", "train@npu=device:after_steps=3,train@gpu=device:after_steps=3")
    with pytest.raises(InjectedDeviceFault) as err:
        run_mixed(_job(tmp_path / "c"), [ReplicaGroup("gpu", 1), ReplicaGroup("npu", 1)], last_call_timeout=3)
    assert classify(err.value).cls is FailureClass.DEVICE


def _run(args: list[str], home: Path, cwd: Path, fault: str) -> dict:
    proc = subprocess.run(
        [str(HETEROFLOW), "run", "--engine", "inprocess", "--simulate-devices", "gpu,npu@0.5", "--param", "epochs=1",
         "--param", "checkpoint_every_steps=5", "--inject-fault", fault, *args],
        cwd=cwd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ, "HETEROFLOW_HOME": str(home), "COLUMNS": "160"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    runs = sorted((cwd / "heteroflow-runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return json.loads((runs[-1] / "run.json").read_text()) | {"_stdout": proc.stdout, "_output": proc.stdout + proc.stderr}


@pytest.mark.slow
def test_from_the_cli_a_dropped_kind_is_in_the_record_report_and_metrics_and_all_failing_falls_back(digits_dir, tmp_path):
    home = tmp_path / "home"
    run = _run(["--dataset", str(digits_dir), "-c", "gpu:count=1+npu:count=1", "-c", "cpu"], home, tmp_path,
               "train@npu=device:after_steps=12")
    assert run["status"] == "succeeded" and not run.get("fallbacks")
    train = run["results"]["train"]
    (d,) = train["mixed"]["dropped"]
    assert d["kind"] == "npu" and d["step"] == 12 and d["resumed_from_step"] == 10
    assert train["resumed_from_step"] == 10 and train["mixed"]["kinds"] == ["gpu"]
    assert run["metrics"]["train"]["dropped_kinds"] == 1.0 and run["metrics"]["train"]["share_gpu_0"] == 64.0
    html = Path(run["run_dir"], "report.html").read_text(encoding="utf-8")
    section = html.split("<h2>Mixed device kinds</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<b>npu</b> dropped out after step 12" in section and "resumed from step 10" in section
    # one wording, live and in the summary; the placement line names candidate 0's replicas and what it went on with
    assert run["_output"].count("kind npu dropped out after step 12") == 2 and " at step 12" not in run["_output"]
    assert ("placement of train: candidate 0 (gpu x1 + npu x1) -> gpu (nvidia-gpu, simulated, on cpu) once npu dropped "
            "out after step 12; resumed from step 10") in run["_stdout"]
    prom = Path(run["run_dir"], "metrics.prom").read_text(encoding="utf-8")
    assert 'metric="dropped_kinds"' in prom and 'metric="busy_fraction_gpu_0"' in prom
    # torch's own log lines of the re-forming group (~35 lines of `E1205 ... api.py] ... Traceback` on the console with
    # --engine inprocess) are in the run folder's torch-elastic.log, named in the drop-out line; the workers' lines stay
    assert "Traceback" not in run["_output"] and "torch/distributed/elastic" not in run["_output"], run["_output"][-3000:]
    elastic = Path(run["run_dir"], "torch-elastic.log")
    assert f"(torch's own log: {elastic})" in run["_output"] and "Traceback" in elastic.read_text(encoding="utf-8")
    assert "train: resuming from step 10" in run["_output"]

    again = tmp_path / "again"
    again.mkdir()
    both = _run(["--dataset", str(digits_dir), "-c", "gpu:count=1+npu:count=1", "-c", "cpu"], home, again,
                "train@npu=device:after_steps=3,train@gpu=device:after_steps=3")
    assert both["status"] == "succeeded"
    (fallback,) = both["fallbacks"]
    assert fallback["step"] == "train" and fallback["failure"] == "device"
    assert both["results"]["train"]["device_kind"] == "cpu"


@pytest.mark.parametrize("pod", [False, True, "conf"])
def test_a_local_agent_finds_a_stopped_agent_dead_within_5_s_and_a_pods_agent_keeps_torchs_heartbeats(tmp_path, monkeypatch, pod):
    """A local mixed job's agents all run beside the store: the agent the launcher stopped when its kind dropped out
    is found dead after 5 missed 1-s heartbeats (the others' round cannot close before; torch's 3 x 5 s took the
    CLI's drop-out 23 s to resume, now 15 s). A pod of a cluster job keeps torch's defaults (5 s, 3 attempts), or
    what its ``PET_RDZV_CONF`` states (``rdzv_configs``, over the launcher's timeouts too)."""
    import torch.distributed.launcher.api as api

    from heteroflow.components.training import mixed

    for name in (mixed.KIND_ENV, mixed.SPEED_ENV, mixed.DEVICE_ENV, mixed._POD_ENV, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)  # _agent_main sets them: put back after the test
    seen = {}
    monkeypatch.setattr(api, "elastic_launch", lambda config, entry: (lambda *args: seen.update(config=config, args=args)))
    cfg = {"kind": "npu", "speed": 0.5, "device_type": "cpu", "count": 1, "kinds": 2, "run_id": "r", "endpoint": "127.0.0.1:1",
           "job_path": "job.pkl", "join_timeout": 600, "last_call_timeout": 10, "pod": bool(pod)}
    if pod == "conf":
        cfg["rdzv_configs"] = {"keep_alive_interval": 2, "keep_alive_max_attempt": 4, "join_timeout": 900}
    (tmp_path / "agent.json").write_text(json.dumps(cfg))
    mixed._agent_main(str(tmp_path / "agent.json"))
    rdzv = seen["config"].rdzv_configs
    assert seen["args"] == ("job.pkl",)
    if pod == "conf":
        assert (rdzv["join_timeout"], rdzv["last_call_timeout"], rdzv["keep_alive_interval"], rdzv["keep_alive_max_attempt"]) == (900, 10, 2, 4)
        return
    assert (rdzv["join_timeout"], rdzv["last_call_timeout"]) == (600, 10)
    if pod:
        assert "keep_alive_interval" not in rdzv and "keep_alive_max_attempt" not in rdzv
    else:
        assert (rdzv["keep_alive_interval"], rdzv["keep_alive_max_attempt"]) == (1, 5)


def test_an_agents_torch_log_lines_go_to_the_run_folder_and_its_other_lines_to_stderr(tmp_path, monkeypatch, capfdbinary):
    """The forwarding behind the CLI test above, without training: glog-prefixed lines (torch's logging) to the run
    folder's torch-elastic.log with the kind, the rest to stderr; no run folder, or a pod of a cluster job: None
    (the agents' stderr is left as it was)."""
    import io

    from heteroflow.components.training.mixed import AGENTS_LOG, _agents_log, _forward

    monkeypatch.delenv("HETEROFLOW_RUN_DIR", raising=False)
    assert _agents_log({}) is None
    monkeypatch.setenv("HETEROFLOW_RUN_DIR", str(tmp_path))
    assert _agents_log({"endpoint": "10.0.0.1:29400"}) is None and _agents_log({}) == tmp_path / AGENTS_LOG
    stream = io.BytesIO(b"E1205 03:58:02.140000 22960 torch/distributed/elastic/multiprocessing/api.py:836] failed (exitcode: 1)\n"
                        b"E1205 03:58:02.140000 22960 torch/distributed/elastic/multiprocessing/api.py:836] Traceback (most recent call last):\n"
                        b"train: resuming from step 100 of 600, on gpu\n"
                        b"W1205 03:58:03.000000 22960 torch/distributed/run.py:1] note\n")
    _forward(stream, "gpu", tmp_path / AGENTS_LOG)
    logged = (tmp_path / AGENTS_LOG).read_text().splitlines()
    assert [line.split(" ", 2)[:2] for line in logged] == [["[gpu]", "E1205"], ["[gpu]", "E1205"], ["[gpu]", "W1205"]]
    assert capfdbinary.readouterr().err == b"train: resuming from step 100 of 600, on gpu\n"


def test_an_agents_lines_are_read_to_the_end_when_its_log_cannot_be_opened(tmp_path, capfdbinary):
    """A review: a torch-elastic.log that could not be opened ended the forwarding thread at once, leaving the
    agent's stderr pipe unread (the agent blocks once 64 KiB are buffered). The lines now all go to stderr."""
    import io

    from heteroflow.components.training.mixed import _forward

    lines = [b"E1205 03:58:02.140000 22960 torch/distributed/elastic/multiprocessing/api.py:836] failed\n",
             b"train: resuming from step 100 of 600, on gpu\n"] * 2000
    stream = io.BytesIO(b"".join(lines))
    _forward(stream, "gpu", tmp_path / "no-such-folder" / "torch-elastic.log")
    assert stream.tell() == len(stream.getvalue())  # read to the end
    assert capfdbinary.readouterr().err == b"".join(lines)
