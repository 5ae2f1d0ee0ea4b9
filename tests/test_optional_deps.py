"""Test modules whose optional test dependencies (the ``dev`` extra) are missing still collect and run everything
that does not need them: pytest runs them in a fresh interpreter where an import hook hides the dependency."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_RUN_HIDDEN = """
import importlib.abc, sys, pytest
HIDDEN = {hidden!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)", name=name)
        return None
sys.meta_path.insert(0, Hide())
sys.exit(pytest.main({args!r}))
"""


def _pytest_without(hidden: list[str], tmp_path: Path, *args: str) -> tuple[dict[str, int], list[str]]:
    """Run pytest on ``args`` with the modules ``hidden`` unimportable; return the outcome counts and skip lines."""
    argv = ["-q", "-rs", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--rootdir", str(REPO),
            "-c", str(REPO / "pyproject.toml"), *args]
    code = _RUN_HIDDEN.format(hidden=hidden, args=argv)
    # cwd outside the checkout: ``python -c`` puts the cwd on sys.path, which would make bare ``components`` importable
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = out.strip().splitlines()[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|skipped|failed|errors?|deselected)", summary)}
    return counts, [line for line in out.splitlines() if line.startswith("SKIPPED")]


@pytest.mark.slow
def test_the_resource_model_runs_without_hypothesis(tmp_path: Path) -> None:
    counts, skips = _pytest_without(["hypothesis", "_hypothesis_pytestplugin"], tmp_path,
                                    str(REPO / "tests/test_resources.py"), str(REPO / "tests/test_resources_properties.py"))
    assert counts.get("passed", 0) > 200 and counts.get("skipped") == 1, counts  # only the property module skips
    assert len(skips) == 1 and "test_resources_properties.py" in skips[0] and "hypothesis" in skips[0], skips


@pytest.mark.slow
def test_dags_and_kfp_resources_collect_without_kubernetes_validate(tmp_path: Path) -> None:
    pytest.importorskip("airflow.providers.cncf.kubernetes", reason="the airflow extra is not installed")
    pytest.importorskip("kfp.kubernetes", reason="the kfp extra is not installed")
    counts, skips = _pytest_without(["kubernetes_validate"], tmp_path, "-m", "not slow", "-k", "valid or carries",
                                    str(REPO / "tests/test_dags.py"), str(REPO / "tests/test_kfp_resources.py"))
    assert "error" not in counts and "errors" not in counts and counts.get("passed", 0) > 0, counts
    # the validation tests, one per example profile in each module, are the only ones skipped, with the reason
    assert counts.get("skipped") == 8, (counts, skips)
    assert all("kubernetes-validate (the dev extra) is not installed" in line for line in skips), skips
    assert {Path(line.split("]")[1].split(":")[0].strip()).name for line in skips} == {"test_dags.py", "test_kfp_resources.py"}
