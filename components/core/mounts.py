"""Where a volume a step mounts is, in the process that runs the step.

On a cluster a call's volumes are mounted at their paths (``/mnt/workspace``), and a step opens those paths. A
local engine (in-process, kfp.local, Airflow's local mode) cannot mount anything: it gives each volume a folder of
the run (a PVC lives in the run folder for the run and is deleted at its end) and tells the step process, in the
environment variable :data:`MOUNTS_ENV`, which folder stands for which mount path. A step that opens a mounted
path through :func:`local_path` works on both::

    from heteroflow.components.core.mounts import local_path

    def train(epochs: int = 3) -> dict:
        checkpoint = local_path("/mnt/workspace/model.pt")   # /mnt/workspace/model.pt in a pod,
        ...                                                  # <run dir>/volumes/workspace/model.pt locally

No import beyond the standard library: step processes import this first.
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

__all__ = ["MOUNTS_ENV", "local_path", "mounts"]

MOUNTS_ENV = "HETEROFLOW_MOUNTS"
"""A JSON object ``{mount path: local folder}``, set by local engines for the step they run; a relative folder is
relative to the run folder (``HETEROFLOW_RUN_DIR``)."""
RUN_DIR_ENV = "HETEROFLOW_RUN_DIR"  # heteroflow.components.core.telemetry.RUN_DIR_ENV (not imported: no imports here)


def mounts() -> dict[str, str]:
    """The mount path -> local folder map of this step process (empty on a cluster, where volumes are mounted).

    Raises:
        ValueError: :data:`MOUNTS_ENV` is set but is not a JSON object of strings (the message names it).
    """
    raw = os.environ.get(MOUNTS_ENV, "")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise ValueError(f"{MOUNTS_ENV}={raw!r} is not JSON; valid: a JSON object {{mount path: local folder}}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError(f"{MOUNTS_ENV}={raw!r} is not a JSON object of strings {{mount path: local folder}}")
    return data


def local_path(path: str | os.PathLike[str]) -> Path:
    """``path`` in this process: under the local folder that stands for its mount when a local engine runs the step
    (the longest mount path that contains it), else ``path`` itself (a pod, where the volume is mounted).

    Args:
        path: an absolute path under a mount path of the call (``/mnt/workspace/model.pt``), or any path.

    Returns:
        The path to open, e.g. ``<run dir>/volumes/workspace/model.pt``.
    """
    text = os.fspath(path)
    norm = posixpath.normpath(text)
    best = ""
    for mount in mounts():
        m = posixpath.normpath(mount)
        if (norm == m or norm.startswith(m.rstrip("/") + "/")) and len(m) > len(best):
            best = m
    if not best:
        return Path(text)
    folder = next(v for k, v in mounts().items() if posixpath.normpath(k) == best)
    base = Path(folder)
    if not base.is_absolute():  # a folder of the run: relative to its run folder
        base = Path(os.environ.get(RUN_DIR_ENV, ".")) / base
    rest = posixpath.relpath(norm, best)
    return base if rest == "." else base.joinpath(*rest.split("/"))
