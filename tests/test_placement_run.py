"""A real run with a node inventory: the plan step's policy explanation reaches run.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

INVENTORY = """\
policy: throughput
nodes:
  - {name: t4, replicas: 2, devices: {model: t4, count: 4}}
  - {name: v100, devices: {model: v100, count: 8}}
  - {name: cpu, cpu: 32, memory: 128Gi}
throughputs:
  train: {t4: 2.0, v100: 5.0}
"""


@pytest.mark.slow
def test_policy_explanation_reaches_run_json(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    exe = Path(sys.executable).with_name("heteroflow")
    env = {**os.environ, "HETEROFLOW_HOME": str(tmp_path / "home")}
    out = subprocess.run([str(exe), "run", "--engine", "inprocess", "--param", f"device_inventory={inv}",
                          "--output", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    line = record["results"]["plan"]["explanations"]["train"]
    assert line.startswith("[throughput] candidate") and "-> nvidia-v100 x1 on v100: fastest that fits, 5 steps/s" in line
    assert record["results"]["plan"]["policy"] == "throughput"
    assert record["placement"]["train"]["explanation"] == line
