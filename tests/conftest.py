"""Shared fixtures. Every test gets its own ``HETEROFLOW_HOME`` so nothing touches ``~/.cache/heteroflow``."""

from __future__ import annotations

from pathlib import Path

import pytest

from heteroflow.components.datasets import export_digits


@pytest.fixture(autouse=True)
def heteroflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HETEROFLOW_HOME", str(home))
    monkeypatch.delenv("HETEROFLOW_RUN_DIR", raising=False)
    return home


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real digits data set (1,797 samples) exported as CSV files, once per session. Treat as read-only."""
    return export_digits(tmp_path_factory.mktemp("digits-src") / "digits")


@pytest.fixture(scope="session")
def digits_shards(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> Path:
    """digits prewarmed and preprocessed (seed 0, 15% validation, 15% test), once per session. Read-only."""
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.preprocess import preprocess

    root = tmp_path_factory.mktemp("digits-shards")
    result = prewarm(str(digits_dir), root / "cache")
    out = root / "shards"
    preprocess(result.manifest_path, out, seed=0, num_workers=1)
    return out
