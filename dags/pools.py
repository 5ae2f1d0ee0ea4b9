"""Airflow pools per device kind and accelerator model, from a device inventory.

A heteroflow DAG puts each accelerator task in a pool (:func:`heteroflow.dags.layout.pool_for`): the model's
pool (``heteroflow-npu-ascend-910b3``) when its candidate names one model, else its kind's
(``heteroflow-gpu``), with ``pool_slots`` = the devices it uses; so Airflow never starts more device tasks than
there are devices. :func:`sync_pools` creates or updates those pools (``heteroflow airflow pools``).

The inventory is the plan step's format (:meth:`heteroflow.components.plan.Inventory.from_json`), as a YAML or
JSON file: per device kind a count, or a count per model::

    gpu: {a100-80gb: 2, t4: 4}     # pools heteroflow-gpu (6), heteroflow-gpu-nvidia-a100-80gb (2), ...-nvidia-t4 (4)
    npu: 8                         # pool heteroflow-npu (8)

Without a file, the devices PyTorch sees here (plus ``HETEROFLOW_SIMULATE_DEVICES``). A kind with no devices
gets a pool of 0 slots: a task asking for it waits; the plan step never starts a call there, and a fallback
gate passes over candidates the plan's inventory cannot serve.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.dags.layout import POOL_PREFIX, pools_for_inventory

__all__ = ["load_inventory", "pool_plan", "sync_pools"]


def load_inventory(path: str | os.PathLike[str] | None = None) -> Any:
    """The inventory in ``path`` (YAML or JSON), or this machine's when None.

    Raises:
        InvalidParameter: the file is missing, is not YAML/JSON, gives a key twice in one mapping, or does not
            follow the inventory format (the message names the file and the field).
    """
    from heteroflow.components.plan import Inventory, current_inventory

    if path is None:
        return current_inventory("")
    import yaml

    from heteroflow.components.keys import load_yaml

    file = Path(path)
    try:
        data = load_yaml(file.read_text(encoding="utf-8"), where=f"inventory {file}")  # a key given twice: an error
    except OSError as exc:
        raise InvalidParameter(f"inventory {file}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise InvalidParameter(f"inventory {file} is not YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidParameter(f"inventory {file} must be a mapping of device kind -> count (or model -> count)")
    return Inventory.from_json(json.dumps(data), source=f"inventory {file}")


def pool_plan(inventory: Any, *, prefix: str = POOL_PREFIX) -> dict[str, tuple[int, str]]:
    """``{pool: (slots, description)}`` for ``inventory`` (see :func:`heteroflow.dags.layout.pools_for_inventory`)."""
    return pools_for_inventory(inventory, prefix=prefix)


def sync_pools(plan: dict[str, tuple[int, str]], *, dry_run: bool = False) -> list[dict[str, Any]]:
    """Create or update the pools of ``plan`` in the Airflow metadata database of this environment
    (``AIRFLOW_HOME``), as ``airflow pools set`` would.

    Returns:
        One entry per pool: ``name``, ``slots``, ``previous`` (slots before, None if new), ``description``.
    """
    from airflow.models.pool import Pool
    from sqlalchemy.exc import OperationalError

    out = []
    for name, (slots, description) in sorted(plan.items()):
        try:
            existing = Pool.get_pool(name)
        except OperationalError as exc:
            home = os.environ.get("AIRFLOW_HOME", "~/airflow")
            raise InvalidParameter(
                f"the Airflow database of AIRFLOW_HOME={home} cannot be read ({str(exc.orig).strip()}); create or "
                "upgrade it first with `airflow db migrate`"
            ) from None
        previous = None if existing is None else int(existing.slots)
        if not dry_run:
            Pool.create_or_update_pool(name, slots, description, False)
        out.append({"name": name, "slots": slots, "previous": previous, "description": description})
    return out
