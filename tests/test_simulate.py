"""The discrete-event simulator: deterministic replay, reclaim in a replay, trace input errors, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heteroflow.components.placement.policies import InvalidTrace, gavel_throughputs, load_inventory, uniform_inventory
from heteroflow.pipelines.simulate import (
    SimJob,
    generate_gavel_trace,
    lower_bound_makespan,
    read_trace,
    simulate,
    write_trace,
)

TABLE = gavel_throughputs()
GAVEL = uniform_inventory({"k80": 36, "p100": 36, "v100": 36})


def test_replay_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    jobs = generate_gavel_trace(60, jobs_per_hour=6, seed=3, table=TABLE)
    assert jobs == generate_gavel_trace(60, jobs_per_hour=6, seed=3, table=TABLE)
    assert jobs != generate_gavel_trace(60, jobs_per_hour=6, seed=4, table=TABLE)
    write_trace(jobs, tmp_path / "t.csv")
    again = read_trace(tmp_path / "t.csv", table=TABLE, inventory=GAVEL)
    assert again == jobs
    for policy in ("throughput", "static", "gavel"):
        a, b = simulate(jobs, GAVEL, TABLE, policy), simulate(again, GAVEL, TABLE, policy)
        assert a.finish == b.finish and a.summary() == b.summary()
        assert len(a.jct) == 60 and all(v > 0 for v in a.jct.values())
        assert a.makespan >= lower_bound_makespan(jobs, GAVEL, TABLE) * (1 - 1e-9)


def test_heterogeneity_aware_beats_static_binding() -> None:
    jobs = generate_gavel_trace(120, jobs_per_hour=6, seed=0, table=TABLE)
    static, aware = simulate(jobs, GAVEL, TABLE, "static"), simulate(jobs, GAVEL, TABLE, "throughput")
    assert aware.avg_jct < static.avg_jct
    assert set(aware.utilization) == {"nvidia-k80", "nvidia-p100", "nvidia-v100"}
    assert all(0 <= u <= 1 for u in aware.utilization.values())
    assert aware.energy_kwh > 0 and aware.cost > 0


QUEUES = """\
nodes:
  - {name: v100, replicas: 2, devices: {model: v100, count: 4}}
queues:
  - {name: prod, guarantee: 4, priority: 1}
  - {name: batch, reclaimable: true}
"""


def test_replay_reclaims_borrowed_capacity_and_honours_the_guarantee() -> None:
    inv = load_inventory("q.yaml", text=QUEUES)
    one_hour = 3600 * TABLE.of("A3C", 1)["nvidia-v100"]
    jobs = [SimJob(name=f"batch{i}", arrival=0.0, job_type="A3C", scale_factor=1, steps=one_hour, queue="batch") for i in range(8)]
    jobs.append(SimJob(name="prod0", arrival=600.0, job_type="A3C", scale_factor=1, steps=one_hour, queue="prod", priority=1))
    r = simulate(jobs, inv, TABLE, "throughput")
    assert r.queueing["prod0"] == 0.0  # started on arrival: a borrower was preempted
    assert r.preemptions == 1
    assert any("prod0 reclaims nvidia-v100 from batch" in line for line in r.explanations)
    assert len(r.finish) == 9  # the preempted job resumed and finished
    assert max(r.jct.values()) > 3600  # ... later than it would have


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("j1,0,Nope,1,100", r"t\.csv:3: job_type='Nope' with scale_factor=1 is not in the throughput table; valid types: A3C"),
        ("j1,0,A3C,-1,100", r"t\.csv:3: scale_factor=-1 is not a device count"),
        ("j1,0,A3C,2,100", r"t\.csv:3: job_type='A3C' with scale_factor=2 .*it has scale factors \[1\]"),
        ("j0,5,A3C,1,100", r"t\.csv:3: name='j0' duplicates line 2"),
        ("j1,0,A3C,1,100,default,0,h100", r"t\.csv:3: model='nvidia-h100' is not in the inventory"),
        ("j1,0,A3C,1,100,default,0,x999", r"t\.csv:3: model='x999' is unknown"),
        ("j1,0,A3C,1,100,nosuch", r"t\.csv:3: queue='nosuch' is not in the inventory"),
        ("j1,-3,A3C,1,100", r"t\.csv:3: arrival_s=-3.0 is negative"),
        # a review: nan was reported as negative; its sibling total_steps=inf as 'not positive'
        ("j1,nan,A3C,1,100", r"t\.csv:3: arrival_s=nan is not a finite number; valid: seconds >= 0"),
        ("j1,0,A3C,1,inf", r"t\.csv:3: total_steps=inf is not a finite number; valid: a number of steps > 0"),
    ],
    ids=["unknown-type", "negative-count", "scale-not-measured", "duplicate-name", "model-not-here", "unknown-model",
         "unknown-queue", "negative-arrival", "nan-arrival", "infinite-steps"],
)
def test_bad_trace_names_the_line(tmp_path: Path, row: str, match: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text("name,arrival_s,job_type,scale_factor,total_steps,queue,priority,model\nj0,0,A3C,1,100\n" + row + "\n")
    with pytest.raises(InvalidTrace, match=match):
        read_trace(path, table=TABLE, inventory=GAVEL)


def test_gavel_tsv_trace_is_read(tmp_path: Path) -> None:
    path = tmp_path / "g.trace"
    path.write_text("A3C\tcmd\t-n\t1\t1000\t0.0\t1\nCycleGAN\tcmd\t-n\t1\t500\t60.5\t1\n")
    jobs = read_trace(path, table=TABLE)
    assert [(j.job_type, j.steps, j.arrival) for j in jobs] == [("A3C", 1000.0, 0.0), ("CycleGAN", 500.0, 60.5)]


@pytest.mark.slow
def test_cli_simulate_writes_plot_and_json_and_rejects_bad_input(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("heteroflow")
    out = subprocess.run([str(exe), "simulate", "--trace", "gavel:40:6:0", "--policy", "static", "--policy", "throughput",
                          "--plot", str(tmp_path / "u.png"), "--json", str(tmp_path / "s.json")],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "u.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [r["policy"] for r in summary["results"]] == ["static", "throughput"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - {name: a, devices: {model: v100, count: 4}}\n  - {name: a, devices: {model: k80, count: 4}}\n")
    out = subprocess.run([str(exe), "simulate", "--trace", "gavel:5:6:0", "--inventory", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "bad.yaml:3: nodes[1].name='a' duplicates the node on line 2" in " ".join(out.stderr.split())


def test_philly_rows_become_jobs_with_real_times_and_sizes(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-09 07:01:55,66.0,1,66.0,a\n2017-10-09 06:13:03,2951.0,3,8853.0,a\n"
                    "2017-10-09 08:00:00,100.0,16,1600.0,b\n")
    jobs = read_trace(path, table=TABLE)  # detected by its header
    assert [(j.arrival, j.scale_factor) for j in jobs] == [(0.0, 4), (2932.0, 1), (6417.0, 8)]
    tp = TABLE.of(jobs[0].job_type, 4)["nvidia-p100"]
    assert jobs[0].steps == pytest.approx(2951.0 * tp)  # duration x throughput on the reference model
    from heteroflow.pipelines.simulate import philly_trace

    assert len(philly_trace(path, table=TABLE, cluster="b")) == 1
    assert philly_trace(path, table=TABLE, seed=1) == philly_trace(path, table=TABLE, seed=1)
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,-5,1,66.0,a\n")
    with pytest.raises(InvalidTrace, match=r"philly\.csv:2: duration=-5\.0, num_gpus=1; both must be positive"):
        read_trace(path, table=TABLE)
