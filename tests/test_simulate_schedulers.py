"""`heteroflow simulate --noise-sigma`: the no-foreknowledge JCT replay's schedulers (pipelines/jct.py) on a
Gavel-style trace, each row the replay's own figures, labelled with the estimate's noise (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.components.placement.clusters import gavel_throughputs, uniform_inventory
from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.jct import replay
from heteroflow.pipelines.simulate import simulate
from heteroflow.pipelines.traces import generate_gavel_trace

runner = CliRunner()


def _setup():
    table = gavel_throughputs(None)
    inv = uniform_inventory({"k80": 36, "p100": 36, "v100": 36}, source="gavel (36 K80 + 36 P100 + 36 V100)")
    jobs = generate_gavel_trace(16, jobs_per_hour=6, seed=5, table=table, models=[m for m in table.models if m in inv.models])
    return table, inv, jobs


def test_noise_sigma_runs_the_replays_schedulers_with_that_noise(tmp_path: Path) -> None:
    out = runner.invoke(app, ["simulate", "--trace", "gavel:16:6:5", "--noise-sigma", "1", "--policy", "fifo", "--policy",
                              "heteroflow", "--policy", "throughput", "--json", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    got = {r["policy"]: r["avg_jct_h"] for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    table, inv, jobs = _setup()
    assert got == pytest.approx({
        "fifo (sigma 1)": replay(jobs, inv, table, "fifo", sigma=1.0, seed=5).avg_jct / 3600,
        "heteroflow (sigma 1)": replay(jobs, inv, table, "heteroflow", sigma=1.0, seed=5).avg_jct / 3600,
        "throughput": simulate(jobs, inv, table, "throughput").avg_jct / 3600,  # not a replay scheduler: the simulator
    })


def test_default_schedulers_with_noise_and_the_oracle_label(tmp_path: Path) -> None:
    out = runner.invoke(app, ["simulate", "--trace", "gavel:16:6:5", "--noise-sigma", "0", "--json", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    names = [r["policy"] for r in json.loads((tmp_path / "r.json").read_text())["results"]]
    assert names == [f"{n} (oracle, sigma 0)" for n in ("fifo", "static", "gavel-style", "heteroflow")]
    # without --noise-sigma, a name only the replay has selects it at sigma 0.5; 'static' stays the simulator's
    out = runner.invoke(app, ["simulate", "--trace", "gavel:16:6:5", "--policy", "gavel-style", "--policy", "static",
                              "--json", str(tmp_path / "s.json")])
    assert out.exit_code == 0, out.output
    assert [r["policy"] for r in json.loads((tmp_path / "s.json").read_text())["results"]] == ["gavel-style (sigma 0.5)", "static"]
