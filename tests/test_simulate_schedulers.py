"""`heteroflow simulate --noise-sigma`: the no-foreknowledge JCT replay's schedulers (pipelines/jct.py) on a
Gavel-style trace, each row the replay's own figures, labelled with the estimate's noise (issue 30)."""

from __future__ import annotations

import json
import re
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


def test_piped_results_are_plain_columns_with_every_cell_whole(tmp_path: Path) -> None:
    """Piped (as `heteroflow simulate ... | cat`), the results are the title line, then a header line and one line
    per policy, every cell whole (`heteroflow runs`' plain columns), not a box cut to 80 columns (`sta…`, `39.…`)."""
    out = CliRunner().invoke(app, ["simulate", "--trace", "gavel:16:6:5", "--noise-sigma", "0", "--json", str(tmp_path / "r.json")],
                             env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("16 jobs on ") and "makespan lower bound" in lines[0]
    header = re.split(r"\s{2,}", lines[1].strip())
    assert header[:6] == ["policy", "avg JCT h", "p99 JCT h", "makespan h", "/bound", "queueing h"] and header[-2:] == ["cost", "energy kWh"]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[2:2 + len(results)]]
    assert [r[0] for r in rows] == [r["policy"] for r in results]  # "fifo (oracle, sigma 0)" whole
    assert all(len(r) == len(header) for r in rows)
    assert not any(c in out.output for c in "│┃━─…")


def test_a_narrow_terminal_cuts_no_cell_of_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: in a terminal narrower than the table, rich cut the cells (`least…`, `makes…`, `2,…`).
    Now headers wrap between words, numbers are never split, the policy folds, and the columns that still do not fit
    are hidden and named under the table; each shown cell is the one piped output prints whole."""
    import io

    from rich.console import Console

    from heteroflow.pipelines.cli import simulate as simulate_cli

    args = ["simulate", "--trace", "gavel:16:6:5", "--noise-sigma", "0", "--policy", "gavel-style", "--policy", "least-loaded",
            "--policy", "heteroflow"]
    piped = CliRunner().invoke(app, args, env={"COLUMNS": "80"}).output.splitlines()
    header = re.split(r"\s{2,}", piped[1].strip())
    whole = [dict(zip(header, re.split(r"\s{2,}", line.strip()))) for line in piped[2:5]]
    for width in (60, 100):
        out = io.StringIO()
        monkeypatch.setattr(simulate_cli, "console", Console(file=out, force_terminal=True, width=width, color_system=None, soft_wrap=True))
        assert CliRunner().invoke(app, args).exit_code == 0
        text = out.getvalue()
        table = [l for l in text.splitlines() if l[:1] in "┏┃┡│└"]
        assert table and all(len(l) <= width for l in table) and "…" not in text, text
        heads = [" ".join(h.split()) for h in (" ".join(parts) for parts in zip(
            *[[c.strip() for c in l.split("┃")[1:-1]] for l in table if l.startswith("┃")]))]
        rows = [[c.strip() for c in l.split("│")[1:-1]] for l in table if l.startswith("│")]
        shown: list[list[str]] = []
        for cells in rows:  # a folded policy continues on the next line, its other cells empty
            if shown and not any(cells[1:]):
                shown[-1] = [a + b for a, b in zip(shown[-1], cells)]
            else:
                shown.append(cells)
        assert [dict(zip(heads, [c.replace(" ", "") for c in r])) for r in shown] == [
            {h: w[h].replace(" ", "") for h in heads} for w in whole], text
        note = next(l for l in text.splitlines() if "hidden at" in l)
        assert re.match(rf"{len(header) - len(heads)} columns? hidden at {width} columns: ", note), note
        assert sorted(heads + note.split(": ", 1)[1].split(" (")[0].split(", ")) == sorted(header)
        assert {"policy", "avg JCT h"} <= set(heads) and (width == 60 or len(heads) >= 9)


@pytest.mark.parametrize("name", ["fgd", "bestfit", "best-fit"])
def test_a_packing_policy_on_a_job_trace_says_it_is_for_pod_traces(name: str) -> None:
    """A new user's trial: `simulate --policy fgd` on a job trace said only 'unknown', listing the job trace's
    policies; fgd is a packing policy, for pod traces. An unknown name is still 'unknown'."""
    done = CliRunner().invoke(app, ["simulate", "--trace", "gavel:4:5:0", "--policy", name], env={"COLUMNS": "400"})
    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())
    assert f"--policy {name} packs pods: it applies to a pod trace (--trace an Alibaba 2023 pod list or a Pollux workload), " \
           "and gavel:4:5:0 is a job trace; valid here: gavel, least-loaded" in said
    assert "the replay's schedulers fifo" in said
    unknown = CliRunner().invoke(app, ["simulate", "--trace", "gavel:4:5:0", "--policy", "nosuch"], env={"COLUMNS": "400"})
    assert unknown.exit_code == 2 and "policy='nosuch' is unknown" in " ".join(unknown.output.split())
