"""`heteroflow simulate` on the Alibaba 2023 format (pipelines/alibaba.py, pipelines/fragmentation.py,
pipelines/traces.trace_format): readers, format detection, missing columns named, a shared-GPU inventory and
workload through the command, and the real trace where ../shared has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from heteroflow.components.placement.clusters import InvalidTrace
from heteroflow.components.placement.packing import fill
from heteroflow.components.placement.vectors import Cluster
from heteroflow.components.placement.views import InvalidInventory
from heteroflow.pipelines.alibaba import data_dir, detect_csv, read_nodes, read_pods
from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.fragmentation import packing_cluster
from heteroflow.pipelines.traces import read_pollux_workload, trace_format

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "shared_gpu"
NODES, PODS = EXAMPLES / "nodes.csv", EXAMPLES / "pods.csv"
runner = CliRunner()


def test_readers_take_the_alibaba_columns() -> None:
    nodes = read_nodes(NODES)
    assert len(nodes) == 17 and nodes[0].model == "A100" and nodes[0].gpus == 8 and nodes[-1].model is None
    pods = read_pods(PODS)
    assert len(pods) == 200 and any(p.shared for p in pods) and any(p.num_gpu == 0 for p in pods)
    constrained = [p for p in pods if p.models]
    assert constrained and all(set(p.models) <= {"V100M16", "V100M32", "T4", "A100"} for p in constrained)


def test_missing_columns_and_bad_values_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu\np1,1000,10,1\n")
    with pytest.raises(InvalidTrace, match=r"pods.csv:1: missing column\(s\) gpu_milli; the Alibaba 2023 pod list needs name, cpu_milli"):
        read_pods(bad)
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,10,1,1200\n")
    with pytest.raises(InvalidTrace, match=r"pods.csv:2: request 'p1': gpu_milli=1200"):
        read_pods(bad)
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,lots,10,1,500\n")
    with pytest.raises(InvalidTrace, match=r"pods.csv:2: cpu_milli='lots'; valid: a number >= 0"):
        read_pods(bad)
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,gpu,model\nn1,1000,2,T4\n")
    with pytest.raises(InvalidInventory, match=r"nodes.csv:1: missing column\(s\) memory_mib"):
        read_nodes(nodes)
    nodes.write_text("name,cpu_milli,memory_mib,gpu,model\nn1,1000,10,2,\n")  # `name` stands for `sn`
    with pytest.raises(InvalidInventory, match=r"nodes.csv:2: node 'n1': model=None with gpus=2"):
        read_nodes(nodes)


def test_trace_format_is_detected(tmp_path: Path) -> None:
    assert trace_format(PODS) == "alibaba-pods" and trace_format(NODES) == "alibaba-nodes" and detect_csv(PODS) == "alibaba-pods"
    cases = {"pollux-workload": "name,time,application,num_replicas,batch_size\ncifar10-0,107,cifar10,6,2048\n",
             "philly": "timestamp,duration,num_gpus,gpu_time,cluster\n0,10,1,10,a\n",
             "gavel": "ResNet-18 (batch size 16)\tcmd\t--n\tFalse\t100\t0\t1\n",
             "csv": "name,arrival_s,job_type,scale_factor,total_steps\nj,0,A3C,1,10\n"}
    for fmt, text in cases.items():
        (tmp_path / fmt).write_text(text)
        assert trace_format(tmp_path / fmt) == fmt
    jobs = read_pollux_workload(tmp_path / "pollux-workload")
    assert [(j.num_gpu, j.single_node) for j in jobs] == [(6, False)]


def test_simulate_packs_a_shared_gpu_workload_and_prints_the_unallocated_share(tmp_path: Path) -> None:
    out = runner.invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(NODES), "--policy", "fgd", "--policy", "bestfit",
                              "--json", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    c = Cluster(read_nodes(NODES))
    want = {name: fill(read_pods(PODS), c, name, seed=0).final_unallocated for name in ("fgd", "bestfit")}
    for name, share in want.items():
        assert f"{name}: unallocated {100 * share:.1f}% of 64 GPUs" in out.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["default"] == "fgd" and [r["unallocated_share"] for r in data["results"]] == pytest.approx(list(want.values()))
    # without --policy: the default (fgd, the workload shares GPUs) then bestfit and random
    out = runner.invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(NODES)])
    assert out.exit_code == 0 and "fgd (default)" in out.output and "random: unallocated" in out.output


def test_simulate_names_what_is_missing(tmp_path: Path) -> None:
    out = runner.invoke(app, ["simulate", "--trace", str(PODS)])
    assert out.exit_code == 2 and "--inventory needs its node list (sn,cpu_milli,memory_mib,gpu,model)" in out.output
    out = runner.invoke(app, ["simulate", "--trace", "gavel:10:6:0", "--inventory", str(NODES)])
    assert out.exit_code == 2 and "--trace needs an Alibaba 2023 pod list" in out.output
    out = runner.invoke(app, ["simulate", "--trace", str(NODES), "--inventory", str(NODES)])
    assert out.exit_code == 2 and "an Alibaba 2023 node list; give it as --inventory" in out.output
    out = runner.invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(NODES), "--policy", "tetris"])
    assert out.exit_code == 2 and "policy='tetris' is not a packing policy" in out.output
    yaml_inv = tmp_path / "inv.yaml"
    yaml_inv.write_text("nodes:\n  - name: a\n    devices: {nvidia-t4: 2}\n")
    out = runner.invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(yaml_inv)])
    assert out.exit_code == 2 and "node 'a' states no cpu and memory" in out.output


def test_a_yaml_inventory_and_a_pollux_workload_pack_too(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: a\n    replicas: 4\n    cpu: 32\n    memory: 128Gi\n    devices: {nvidia-t4: 4}\n")
    c = packing_cluster(inv)
    assert len(c.nodes) == 4 and c.gpu_capacity_milli == 16000 and int(c.mem_cap[0]) == 128 * 1024
    wl = tmp_path / "workload.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\n" + "".join(f"j{i},{i},cifar10,{n},128\n" for i, n in enumerate([1, 2, 6, 3, 1])))
    out = runner.invoke(app, ["simulate", "--trace", str(wl), "--inventory", str(inv), "--policy", "firstfit", "--explain", "3"])
    assert out.exit_code == 0, out.output
    lines = [ln.strip() for ln in out.output.splitlines() if ln.strip().startswith("firstfit: j")]
    assert len(lines) == 3 and all(" -> a-" in ln or " waits: " in ln for ln in lines)
    assert "firstfit: unallocated" in out.output and "bestfit (default)" not in out.output


@pytest.mark.slow
def test_on_the_real_alibaba_cluster_fgd_leaves_fewer_gpus_unallocated_than_best_fit() -> None:
    data = data_dir()
    if data is None:
        pytest.skip("no ../shared/data/alibaba_gpu_v2023 (research-use data, not shipped; set HETEROFLOW_ALIBABA_2023 to its folder)")
    c = Cluster(read_nodes(data / "openb_node_list_gpu_node.csv"))
    assert len(c.nodes) == 1213 and c.gpu_capacity_milli == 6212 * 1000
    pods = read_pods(data / "openb_pod_list_gpushare40.csv")
    fgd, best = (fill(pods, c, name, seed=0) for name in ("fgd", "bestfit"))
    assert fgd.final_unallocated < best.final_unallocated
    assert np.all(np.diff(fgd.arrived) >= 0) and fgd.arrived[-1] <= 1.0


@pytest.mark.slow
def test_the_benchmark_prints_the_lines_a_script_reads(tmp_path: Path) -> None:
    """benchmarks/fragmentation.py on the synthetic cluster laid out as the Alibaba folder (the real one may be absent)."""
    import re
    import subprocess
    import sys

    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES.read_text())
    (tmp_path / "openb_pod_list_gpushare_example.csv").write_text(PODS.read_text())
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "fragmentation.py"
    out = subprocess.run([sys.executable, str(bench), "--data", str(tmp_path), "--seeds", "3", "--policies", "fgd,firstfit",
                          "--plot", str(tmp_path / "f.png"), "--jobs", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    m = re.search(r"^fgd gpushare_example: unallocated (\d+\.\d)% \(bestfit (\d+\.\d)%, random (\d+\.\d)%\)$", out.stdout, re.M)
    assert m, out.stdout
    c = Cluster(read_nodes(NODES))
    pods = read_pods(PODS)
    want = [float(np.median([100 * fill(pods, c, name, seed=s).final_unallocated for s in range(3)])) for name in ("fgd", "bestfit", "random")]
    assert [float(g) for g in m.groups()] == pytest.approx(want, abs=0.051)
    assert (tmp_path / "f.png").stat().st_size > 10_000 and "firstfit" in out.stdout
    empty = subprocess.run([sys.executable, str(bench), "--data", str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert empty.returncode == 0 and empty.stdout.startswith("skipped: no Alibaba 2023 node and pod lists in")


def test_piped_packing_results_are_plain_columns_with_every_cell_whole() -> None:
    """Piped, the packing table is plain columns (a header line, one line per policy, every cell whole) after its
    title line, as `heteroflow runs` prints them; the reasons column is not cut to 80 columns."""
    out = CliRunner().invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(NODES), "--policy", "fgd", "--policy", "bestfit"],
                             env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert "pods" in lines[0] and "seed(s)" in lines[0]
    assert re.split(r"\s{2,}", lines[1].strip()) == ["policy", "unallocated", "placed", "waiting", "what holds them"]
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[2:4]]
    assert [r[0] for r in rows] == ["fgd (default)", "bestfit"] and all(r[1].endswith("%") for r in rows)
    assert not any(c in out.output for c in "│┃━─…")


def test_the_packing_table_gives_every_column_over_the_same_seeds(tmp_path: Path) -> None:
    """A new user's trial: "200 pods ... drawn" above placed 60 + waiting 4, and the placed and waiting counts were
    seed 0's beside the median unallocated share of 5 seeds, unlabelled. The title says the pods are the trace's
    and what the columns are; placed and waiting are the medians over the seeds, as the share is."""
    import statistics

    out = CliRunner().invoke(app, ["simulate", "--trace", str(PODS), "--inventory", str(NODES), "--seeds", "5", "--json", str(tmp_path / "s.json")],
                             env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("200 pods in the trace (87 shared-GPU), drawn until they ask for 64 GPUs, on 17 nodes of ") and \
        lines[0].endswith("; 5 seed(s): medians; what holds them: seed 0"), lines[0]
    summary = {r["policy"]: r for r in json.loads((tmp_path / "s.json").read_text())["results"]}
    for line in lines[2:2 + len(summary)]:
        policy, _share, placed, waiting, *_ = re.split(r"\s{2,}", line.strip())
        name = policy.removesuffix(" (default)")
        assert float(placed) == statistics.median(summary[name]["placed"]) and float(waiting) == statistics.median(summary[name]["waiting"]), (line, summary[name])
