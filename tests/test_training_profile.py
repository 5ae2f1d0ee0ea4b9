"""Issue 14, "Profile": ``heteroflow profile`` writes a JSON profile (time share per operator, key operators,
peak memory, samples/s) and the plan step accepts and records one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteroflow.components.errors import InvalidParameter

pytest.importorskip("torch", reason="profiling needs PyTorch (the 'torch' extra)")


def test_the_profile_command_writes_operator_shares_key_operators_memory_and_throughput(digits_shards: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["profile", "--dataset", str(digits_shards), "--steps", "5", "-o", str(out)])
    assert result.exit_code == 0, result.output
    prof = json.loads(out.read_text())
    ops = prof["operators"]
    assert ops and all(o["share"] > 0 and o["calls"] >= 1 for o in ops)
    assert [o["share"] for o in ops] == sorted((o["share"] for o in ops), reverse=True)
    assert 0.5 < sum(o["share"] for o in ops) <= 1.0001  # the top operators hold most of the time
    assert prof["key_operators"]  # at least one operator holds >= 10% (which one depends on the machine: Adam's step or a matmul)
    assert any(o["name"].startswith("aten::mm") or o["name"].startswith("aten::addmm") for o in ops)  # the linear layers
    assert set(prof["key_operators"]) == {o["name"] for o in ops if o["share"] >= 0.10}
    assert prof["samples_per_second"] > 0 and prof["peak_memory_bytes"] > 0 and prof["peak_memory_of"] == "host_rss"
    assert "samples/s on cpu" in result.output


def test_the_profile_command_refuses_bad_parameters_in_one_line(digits_shards: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    result = CliRunner().invoke(app, ["profile", "--dataset", str(digits_shards), "-p", "batch_size=0", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "batch_size=0 is out of range" in result.output
    assert not (tmp_path / "p.json").exists()


def test_the_plan_step_accepts_and_records_a_profile(digits_shards: Path, tmp_path: Path) -> None:
    from heteroflow.components.placement.plan import check_plan_params, plan_step
    from heteroflow.components.training.profiling import profile_training

    profile_training(digits_shards, tmp_path / "p.json", steps=3, warmup_steps=1)
    result = plan_step(str(tmp_path / "placement.json"), placements="{}", training_profile=str(tmp_path / "p.json"))
    assert result.training_profile is not None and result.training_profile["path"] == str(tmp_path / "p.json")
    assert result.training_profile["samples_per_second"] > 0
    (tmp_path / "bad.json").write_text('{"x": 1}')
    with pytest.raises(InvalidParameter, match=r"training_profile=.*bad.json.* is not a heteroflow profile"):
        check_plan_params(training_profile=str(tmp_path / "bad.json"))
    with pytest.raises(InvalidParameter, match=r"training_profile=.*missing.json.* does not exist"):
        check_plan_params(training_profile=str(tmp_path / "missing.json"))


def test_the_profile_command_takes_trains_parameters_with_their_types_from_the_step(digits_shards: Path, tmp_path: Path) -> None:
    """`--param` names and types come from the train Step (no list of its own): `model` as in `heteroflow run`, a
    value of the wrong type and a name train does not have are one line each, exit 2."""
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    out = tmp_path / "p.json"
    base = ["profile", "--dataset", str(digits_shards), "--steps", "2", "-o", str(out)]
    ok = CliRunner().invoke(app, [*base, "--param", "batch_size=16", "--param", "hidden_units=8", "--param", "model="])
    assert ok.exit_code == 0, ok.output
    assert json.loads(out.read_text())["batch_size"] == 16
    bad_type = CliRunner().invoke(app, [*base, "--param", "batch_size=abc"])
    assert bad_type.exit_code == 2 and "batch_size='abc' is not a valid int; valid: an integer" in bad_type.output
    unknown = CliRunner().invoke(app, [*base, "--param", "hiden_units=8"])
    assert unknown.exit_code == 2 and "hiden_units: not a parameter of train (did you mean 'hidden_units'?); valid: " in unknown.output
    aliased = CliRunner().invoke(app, [*base, "--param", "model=nosuch"])  # said by the name given, and train's
    assert aliased.exit_code == 2
    assert "model (train's model_factory): model_factory 'nosuch' is not 'module:attribute'" in " ".join(aliased.output.split())
    with pytest.raises(InvalidParameter, match=r"^hiden: not a parameter of train"):
        from heteroflow.components.training.profiling import profile_training

        profile_training(digits_shards, out, steps=1, hiden=3)


_FILES = """
import torch

class Decoded(torch.utils.data.Dataset):
    \"\"\"Samples decoded when read (not in memory): train chooses its loader workers from the first batches.\"\"\"
    classes = ["a", "b"]
    draws_random = False

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i % 2

def make(split):
    return Decoded() if split == "train" else None
"""


def test_a_profile_uses_trains_loader_workers_and_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from heteroflow.components.training import batches
    from heteroflow.components.training.profiling import profile_training

    (tmp_path / "profdata32.py").write_text(_FILES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("heteroflow.components.data.preprocess.available_cpus", lambda: 3)  # at most 3 workers (one per core)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    asked: list[tuple[float, float, int, int, int]] = []

    def choose(load: float, compute: float, *, cpus: int, most: int, nbytes: int = 0) -> int:
        asked.append((load, compute, cpus, most, nbytes))
        return 1

    monkeypatch.setattr(batches, "choose_workers", choose)
    before = torch.get_num_threads()
    prof = profile_training(tmp_path, tmp_path / "p.json", steps=2, warmup_steps=1, batch_size=8,
                            dataset_factory="profdata32:make")
    assert len(asked) == 1 and asked[0][2:4] == (3, 3) and asked[0][0] > 0 and asked[0][1] > 0  # timed, as train times
    assert asked[0][4] > 0  # the bytes of a batch, for the cost of passing it from a worker
    assert prof["loader_workers"] == 1  # the count chosen, as train would train with
    assert prof["torch_threads"] == 1  # 3 cores less the 3 workers train may use, at least 1
    assert json.loads((tmp_path / "p.json").read_text())["loader_workers"] == 1
    assert torch.get_num_threads() == before  # put back
    fixed = profile_training(tmp_path, tmp_path / "q.json", steps=2, warmup_steps=1, batch_size=8,
                             dataset_factory="profdata32:make", loader_workers=0)
    assert (fixed["loader_workers"], fixed["torch_threads"], len(asked)) == (0, 3, 1)  # as asked: nothing chosen


def test_the_profilers_own_tracepoint_lines_stay_out_of_stderr_and_other_lines_stay_in(capfd: pytest.CaptureFixture[str]) -> None:
    """A new user's trial: ``heteroflow profile`` printed torch's own ``USDT:... profiler_start`` and
    ``profiler_stop`` lines (Kineto writes them to file descriptor 2 itself). They are left out; a line anything
    else writes to stderr meanwhile (Python's or a C library's) still appears, in order."""
    import os
    import sys

    import torch

    from heteroflow.components.training.profiling import _without_tracepoint_lines

    print("before", file=sys.stderr)
    with _without_tracepoint_lines(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(4) @ torch.ones(4)
        print("python's line", file=sys.stderr)
        os.write(2, b"USDT:2026-12-05 03:37:06 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a C library's line\n")
    print("after", file=sys.stderr)
    err = capfd.readouterr().err
    assert "USDT:" not in err and "profiler_start" not in err
    assert err.splitlines() == ["before", "python's line", "a C library's line", "after"]
