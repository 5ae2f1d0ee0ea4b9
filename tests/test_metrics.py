"""Run metrics: prometheus-client collectors over run records, the per-run textfile, ``heteroflow metrics serve``
scraped and parsed with prometheus-client's own text parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from heteroflow.components.devices.cluster import ClusterProfile, InvalidProfile
from heteroflow.pipelines.runs.metrics import METRICS_DIR_ENV, registry_for, serve, write_textfile

DOCUMENTED = {
    "heteroflow_run_info",
    "heteroflow_run_duration_seconds",
    "heteroflow_step_attempts",
    "heteroflow_step_seconds",
    "heteroflow_step_failures",
    "heteroflow_fallbacks",
    "heteroflow_retry_wait_seconds",
    "heteroflow_step_queue_wait_seconds",
    "heteroflow_device_seconds",
    "heteroflow_device_cost",
    "heteroflow_step_metric",
}


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _record(folder: Path) -> Path:
    """A run that retried train twice on the npu (transient), then left it (device) for the gpu."""
    folder.mkdir(parents=True)
    run = {
        "run_id": "r-1", "pipeline": "p", "status": "succeeded", "started_at": 1000.0, "wall_seconds": 60.0,
        "steps": [{"name": "prep", "status": "succeeded"}, {"name": "train", "status": "succeeded", "kind": "gpu", "candidate": 1}],
        "fallbacks": [{"step": "train", "candidate": 0, "kind": "npu", "accelerator": "ascend-910b3", "failure": "device", "reason": "x"}],
        "metrics": {"evaluate": {"accuracy": 0.9, "precision_0": 1.0}},
        "placement": {"train": {"index": 1, "resources": {"kind": "gpu", "count": 2}}},
    }
    (folder / "run.json").write_text(json.dumps(run))
    attempts = {
        "prep": [{"attempt": 1, "status": "succeeded", "kind": "cpu", "started_at": 1002.0, "ended_at": 1003.0, "seconds": 1.0}],
        "train": [
            {"attempt": 1, "status": "failed", "failure": "transient", "candidate": 0, "kind": "npu", "accelerator": "ascend-910b3", "started_at": 1004.0, "ended_at": 1005.0, "seconds": 1.0},
            {"attempt": 2, "status": "failed", "failure": "transient", "candidate": 0, "kind": "npu", "accelerator": "ascend-910b3", "started_at": 1015.0, "ended_at": 1016.0, "seconds": 1.0},
            {"attempt": 3, "status": "failed", "failure": "device", "candidate": 0, "kind": "npu", "accelerator": "ascend-910b3", "started_at": 1036.0, "ended_at": 1037.0, "seconds": 1.0},
            {"attempt": 4, "status": "succeeded", "candidate": 1, "kind": "gpu", "accelerator": "nvidia-a100", "started_at": 1037.0, "ended_at": 1055.0, "seconds": 18.0},
        ],
    }
    for step, recs in attempts.items():
        (folder / "steps" / step).mkdir(parents=True)
        for r in recs:
            (folder / "steps" / step / f"attempt-{r['attempt']}.json").write_text(json.dumps(r))
    return folder


def test_a_misspelled_price_key_is_refused_and_a_models_alias_is_its_registry_name() -> None:
    """A new user's profile: ``prices: {gpuu: 2.5}`` was accepted by compile and metrics serve, and the GPU time
    then cost nothing without a word (the metrics look prices up by kind or registry name)."""
    from heteroflow.components.devices.cluster import InvalidProfile

    with pytest.raises(InvalidProfile, match=r"prices.gpuu is neither a device kind nor an accelerator model \(did you mean 'gpu'\?\)"):
        ClusterProfile.from_dict({"prices": {"gpuu": 2.5}})
    profile = ClusterProfile.from_dict({"prices": {"currency": "EUR", "GPU": 2.0, "t4": 0.35, "A100": 3.6}})
    assert dict(profile.prices) == {"gpu": 2.0, "nvidia-t4": 0.35, "nvidia-a100": 3.6} and profile.currency == "EUR"


def test_the_metrics_of_a_run_that_retried_and_fell_back(tmp_path: Path) -> None:
    from heteroflow.pipelines.runs.folders import load_run

    run = load_run(_record(tmp_path / "r"))
    profile = ClusterProfile.from_dict({"prices": {"currency": "EUR", "gpu": 2.0, "nvidia-a100": 3.6, "npu": 1.8}})
    text = generate_latest(registry_for(lambda: [run], (dict(profile.prices), profile.currency))).decode()
    s = _samples(text)

    def value(name: str, **labels: str) -> float:
        hits = [v for l, v in s[name] if all(l.get(k) == x for k, x in labels.items())]
        assert len(hits) == 1, (name, labels, s.get(name))
        return hits[0]

    assert value("heteroflow_step_attempts_total", step="train", device_kind="npu", accelerator="ascend-910b3", outcome="failed") == 3
    assert value("heteroflow_step_attempts_total", step="train", device_kind="gpu", outcome="succeeded") == 1
    assert value("heteroflow_step_failures_total", step="train", device_kind="npu", failure_class="transient") == 2
    assert value("heteroflow_step_failures_total", step="train", device_kind="npu", failure_class="device") == 1
    assert value("heteroflow_fallbacks_total", step="train", from_device_kind="npu", from_accelerator="ascend-910b3",
                 to_device_kind="gpu", to_accelerator="nvidia-a100", failure_class="device") == 1
    assert value("heteroflow_retry_wait_seconds_total", step="train") == pytest.approx(30.0)  # 10 s + 20 s of backoff
    assert value("heteroflow_step_queue_wait_seconds", step="prep") == pytest.approx(2.0)  # run start -> first attempt
    assert value("heteroflow_step_queue_wait_seconds", step="train") == pytest.approx(1.0)
    # the gpu candidate was placed with 2 devices: 18 s x 2; its model's price wins over its kind's
    assert value("heteroflow_device_seconds_total", step="train", device_kind="gpu") == pytest.approx(36.0)
    assert value("heteroflow_device_cost_total", step="train", device_kind="gpu", currency="EUR") == pytest.approx(36.0 / 3600 * 3.6)
    assert value("heteroflow_device_cost_total", step="train", device_kind="npu") == pytest.approx(3.0 / 3600 * 1.8)
    assert not [l for l, _ in s["heteroflow_device_cost_total"] if l["device_kind"] == "cpu"]  # no cpu price: no cost
    assert value("heteroflow_step_metric", step="evaluate", metric="accuracy") == 0.9
    assert not [l for l, _ in s["heteroflow_step_metric"] if l["metric"].startswith("precision_")]
    assert all(l["run_id"] == "r-1" and l["pipeline"] == "p" for samples in s.values() for l, _ in samples)


def test_a_fallback_inside_a_loop_goes_to_its_own_iterations_next_candidate(tmp_path: Path) -> None:
    """Iteration 0 of a loop left the npu for the cpu (the gpu passed over), iteration 1 left it for the gpu: each
    fallback's ``to`` labels are its own iteration's next attempt. They were the first later candidate of any
    iteration, so both fallbacks read npu -> cpu. No ``iteration`` label: a loop step is one ``step``."""
    from heteroflow.pipelines.runs.folders import load_run

    folder = tmp_path / "r"
    (folder / "steps" / "train").mkdir(parents=True)
    npu = {"kind": "npu", "accelerator": "ascend-910b3", "candidate": 0, "status": "failed", "failure": "device"}
    chains = {0: [npu, {"kind": "cpu", "candidate": 2, "status": "succeeded"}], 1: [npu, {"kind": "gpu", "accelerator": "nvidia-a100", "candidate": 1, "status": "succeeded"}]}
    for i, chain in chains.items():
        (folder / "steps" / "train" / f"iteration-{i}").mkdir()
        for n, rec in enumerate(chain, 1):
            t = 1000.0 + 10 * i + n
            rec = {**rec, "step": "train", "attempt": n, "iteration": i, "item": i, "started_at": t, "ended_at": t + 0.5, "seconds": 0.5}
            (folder / "steps" / "train" / f"iteration-{i}" / f"attempt-{n}.json").write_text(json.dumps(rec))
    from heteroflow.pipelines.runs.records import fallbacks

    left = [{k: v for k, v in f.items() if k != "at"} for f in fallbacks(folder)]
    assert [(f["iteration"], f["candidate"]) for f in left] == [(0, 0), (1, 0)]
    (folder / "run.json").write_text(json.dumps({"run_id": "r-2", "pipeline": "p", "status": "succeeded", "started_at": 999.0,
                                                 "wall_seconds": 30.0, "steps": [{"name": "train", "status": "succeeded"}], "fallbacks": left}))
    s = _samples(generate_latest(registry_for(lambda: [load_run(folder)])).decode())
    went = sorted((l["to_device_kind"], l["to_accelerator"], v) for l, v in s["heteroflow_fallbacks_total"])
    assert went == [("cpu", "", 1.0), ("gpu", "nvidia-a100", 1.0)]
    assert not any("iteration" in l for samples in s.values() for l, _ in samples)


def test_textfile_goes_to_the_collector_folder_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _record(tmp_path / "r")
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path / "textfile"))
    written = write_textfile(folder)
    assert written == [folder / "metrics.prom", tmp_path / "textfile" / "heteroflow-r-1.prom"]
    assert written[0].read_text() == written[1].read_text()
    assert {f.name for f in text_string_to_metric_families(written[0].read_text())} >= DOCUMENTED - {"heteroflow_device_cost"}
    assert list((tmp_path / "textfile").iterdir()) == [written[1]]  # no temporary file left behind


def test_a_bad_price_names_the_field() -> None:
    with pytest.raises(InvalidProfile, match=r"prices.gpu='cheap' is not a price; valid: a number >= 0"):
        ClusterProfile.from_dict({"prices": {"gpu": "cheap"}})


def test_serve_reads_the_runs_on_disk_at_each_scrape(tmp_path: Path) -> None:
    server, thread = serve([tmp_path], port=0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        before = _samples(urllib.request.urlopen(url, timeout=10).read().decode())
        assert "heteroflow_run_info" not in before
        _record(tmp_path / "r")
        after = _samples(urllib.request.urlopen(url, timeout=10).read().decode())
        assert [l["run_id"] for l, _ in after["heteroflow_run_info"]] == ["r-1"]
    finally:
        server.shutdown()


@pytest.mark.slow
def test_metrics_serve_scraped_for_a_run_that_fell_back(tmp_path: Path) -> None:
    """A real run falls back from the (simulated) NPU to the GPU; ``heteroflow metrics serve`` (a subprocess) is
    scraped and parsed with prometheus-client's parser: the documented names, with that run's labels."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(default_pipeline(), {"epochs": 1}, run_dir=tmp_path / "runs" / "fell-back", simulate_devices="npu,gpu",
                           inject_faults="train@npu=device")
    assert record.status == "succeeded" and record.fallbacks
    assert (tmp_path / "runs" / "fell-back" / "metrics.prom").is_file()  # written at the end of the run
    profile = tmp_path / "profile.yaml"
    profile.write_text("name: test\nprices:\n  currency: USD\n  gpu: 2.5\n  npu: 1.5\n  cpu: 0.1\n")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "heteroflow"), "metrics", "serve", "--root", str(tmp_path / "runs"), "--port", "0", "--profile", str(profile)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("serving http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        url = line.split()[1]
        text = urllib.request.urlopen(url, timeout=30).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert DOCUMENTED - {"heteroflow_retry_wait_seconds"} <= set(families)  # no retry in this run
    fb = [s for s in families["heteroflow_fallbacks"].samples if s.name == "heteroflow_fallbacks_total"]
    assert [(s.labels["run_id"], s.labels["step"], s.labels["from_device_kind"], s.labels["from_accelerator"], s.labels["to_device_kind"],
             s.labels["to_accelerator"], s.labels["failure_class"], s.value) for s in fb] == [
        (record.run_id, "train", "npu", "ascend-910", "gpu", "nvidia-gpu", "device", 1.0)
    ]
    assert record.run_id.startswith("fell-back-")  # a run given its folder: the folder's name, then a unique part (#28.12)
    attempts = {(s.labels["step"], s.labels["device_kind"], s.labels["simulated"], s.labels["outcome"]): s.value
                for s in families["heteroflow_step_attempts"].samples if s.name.endswith("_total")}
    assert attempts[("train", "npu", "true", "failed")] == 1 and attempts[("train", "gpu", "true", "succeeded")] == 1
    failures = [(s.labels["step"], s.labels["device_kind"], s.labels["failure_class"]) for s in families["heteroflow_step_failures"].samples if s.name.endswith("_total")]
    assert failures == [("train", "npu", "device")]
    train = record.step("train")
    cost = {s.labels["device_kind"]: s.value for s in families["heteroflow_device_cost"].samples if s.labels["step"] == "train" and s.name.endswith("_total")}
    assert cost["gpu"] == pytest.approx(train.seconds / 3600 * 2.5)  # the placed npu had 1 device; the gpu ran train.seconds
    assert {s.labels["status"] for s in families["heteroflow_run_info"].samples} == {"succeeded"}


def test_run_ids_that_differ_only_in_unsafe_characters_get_their_own_collector_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#28.12 sibling: the collector file name replaced unsafe characters by ``_``, so ``a b`` and ``a_b`` shared one."""
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path / "textfile"))
    written = []
    for name, run_id in (("one", "a b"), ("two", "a_b")):
        folder = _record(tmp_path / name)
        run = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**run, "run_id": run_id}))
        written.append(write_textfile(folder)[1])
    assert written[0] != written[1]
    assert written[1] == tmp_path / "textfile" / "heteroflow-a_b.prom"
    assert sorted((tmp_path / "textfile").iterdir()) == sorted(written)
    assert 'run_id="a b"' in written[0].read_text() and 'run_id="a_b"' in written[1].read_text()
