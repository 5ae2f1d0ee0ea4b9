"""Default local locations. Read at call time (never at import), so tests and users can redirect them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["home_dir", "local_cache_dir"]


def home_dir() -> Path:
    """heteroflow's local state: ``$HETEROFLOW_HOME``, else ``$XDG_CACHE_HOME/heteroflow``, else
    ``~/.cache/heteroflow``. Holds the sample data sets, the local cache tier, checkpoints and the archive."""
    env = os.environ.get("HETEROFLOW_HOME")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "heteroflow"


def local_cache_dir() -> Path:
    """The local cache tier (``<home>/cache``), used when no cache root is given."""
    return home_dir() / "cache"
