"""Airflow pools per device kind and accelerator model, from a device inventory.

A heteroflow DAG puts each accelerator task in a pool (:func:`heteroflow.dags.layout.pool_for`): the model's
pool (``heteroflow-npu-ascend-910b3``) when its candidate names one model, else its kind's
(``heteroflow-gpu``), with ``pool_slots`` = the devices it uses; so Airflow never starts more device tasks than
there are devices. :func:`sync_pools` creates or updates those pools (``heteroflow airflow pools``).

The inventory is a YAML or JSON file in any form :mod:`heteroflow.components.placement.inventory` reads (its plan-step
view, :meth:`heteroflow.components.placement.plan.Inventory.from_mapping`): per device kind a count, or a count per model::

    gpu: {a100-80gb: 2, t4: 4}     # pools heteroflow-gpu (6), heteroflow-gpu-nvidia-a100-80gb (2), ...-nvidia-t4 (4)
    npu: 8                         # pool heteroflow-npu (8)

Without a file, the devices PyTorch sees here (plus ``HETEROFLOW_SIMULATE_DEVICES``). A kind with no devices
gets a pool of 0 slots: a task asking for it waits; the plan step never starts a call there, and a fallback
gate passes over candidates the plan's inventory cannot serve.

A missing pool fails the run at once (issue #16.14). Airflow leaves a task whose pool does not exist in
``scheduled`` for ever (the scheduler only logs "Tasks using non-existent pool ... will not be scheduled",
``airflow/ti_deps/deps/pool_slots_available_dep.py``), and ``airflow dags test`` ignores pools, so trying a DAG
never shows it. So the DAG's first task (``prepare-run``) calls :func:`check_pools`: every pool a task of the DAG
uses must exist, with at least the ``pool_slots`` its task takes (a task that needs more slots than its pool has
waits for ever too; a pool of 0 slots is the inventory saying "none here", which the planner passes over). It
fails with ``AirflowFailException`` naming the pools and ``heteroflow airflow pools``. Where the task cannot read
Airflow's database (Airflow 3 workers block it), it reads what :func:`sync_pools` recorded in the Airflow
Variable :data:`POOLS_VARIABLE`, and where neither is readable it warns and lets the run go on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.dags.layout import POOL_PREFIX, pools_for_inventory

__all__ = ["POOLS_VARIABLE", "check_pools", "load_inventory", "pool_plan", "pools_in_use", "sync_pools"]

POOLS_VARIABLE = "heteroflow_pools"
"""Airflow Variable in which ``heteroflow airflow pools`` records the pools it made (JSON ``{pool: slots}``): what
:func:`check_pools` reads where a task cannot read Airflow's database."""


def load_inventory(path: str | os.PathLike[str] | None = None) -> Any:
    """The inventory in ``path`` (YAML or JSON), or this machine's when None.

    Raises:
        InvalidParameter: the file is missing, is not YAML/JSON, gives a key twice in one mapping, or does not
            follow the inventory format (the message names the file and the field).
    """
    from heteroflow.components.placement.plan import Inventory, current_inventory

    if path is None:
        return current_inventory("")
    import yaml

    from heteroflow.components.core.keys import load_yaml, not_utf8, yaml_problem

    file = Path(path)
    try:
        data = load_yaml(file.read_text(encoding="utf-8"), where=f"inventory {file}")  # a key given twice: an error
    except OSError as exc:
        raise InvalidParameter(f"inventory {file}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidParameter(f"inventory {file}: {not_utf8(exc)}") from None
    except yaml.YAMLError as exc:
        raise InvalidParameter(f"inventory {file}: not valid YAML or JSON ({yaml_problem(exc)})") from None  # as the placement loader
    if data is None:  # as the placement loader says it (manifests, simulate)
        raise InvalidParameter(f"inventory {file}: the file is empty; valid: a mapping of device kind -> count (or model -> count)")
    if not isinstance(data, dict):
        raise InvalidParameter(f"inventory {file}: an inventory is a mapping of device kind -> count (or model -> count), "
                               f"not {type(data).__name__}")
    workload = data.get("workload")
    if isinstance(workload, str) and workload.strip() and not Path(workload.strip()).expanduser().is_absolute():
        # relative to the inventory's folder, as the plan step and simulate read it (it was the working folder's)
        data = {**data, "workload": str(file.resolve().parent / workload.strip())}
    return Inventory.from_mapping(data, source=f"inventory {file}")


def pool_plan(inventory: Any, *, prefix: str = POOL_PREFIX) -> dict[str, tuple[int, str]]:
    """``{pool: (slots, description)}`` for ``inventory`` (see :func:`heteroflow.dags.layout.pools_for_inventory`)."""
    return pools_for_inventory(inventory, prefix=prefix)


def sync_pools(plan: dict[str, tuple[int, str]], *, dry_run: bool = False, prefix: str | None = None) -> list[dict[str, Any]]:
    """Create or update the pools of ``plan`` in the Airflow metadata database of this environment
    (``AIRFLOW_HOME``), as ``airflow pools set`` would. With ``prefix``, a pool named ``<prefix>-...`` that an
    earlier inventory made and ``plan`` has no more (a model the cluster no longer has) is set to 0 slots, said so
    in its description: it kept its old slots, and a task pinned to that model was admitted for devices gone.

    Returns:
        One entry per pool: ``name``, ``slots``, ``previous`` (slots before, None if new), ``description``.
    """
    from airflow.models.pool import Pool
    from sqlalchemy.exc import OperationalError

    out = []
    if prefix:
        try:
            stale = [p.pool for p in Pool.get_pools() if p.pool.startswith(f"{prefix}-") and p.pool not in plan]
        except OperationalError:
            stale = []  # reported below, by the first lookup
        plan = {**plan, **{name: (0, "not in the last inventory given to `heteroflow airflow pools`: 0 slots") for name in stale}}
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
    if not dry_run:
        _record(plan)
    return out


def _record(plan: dict[str, tuple[int, str]]) -> None:
    """Add ``plan``'s pools to the :data:`POOLS_VARIABLE` record (for workers that cannot read the database)."""
    from airflow.models.variable import Variable

    try:
        recorded = json.loads(Variable.get(POOLS_VARIABLE, default_var="{}"))
    except ValueError:
        recorded = {}
    recorded = recorded if isinstance(recorded, dict) else {}
    recorded.update({name: slots for name, (slots, _) in plan.items()})
    Variable.set(POOLS_VARIABLE, json.dumps(recorded, sort_keys=True),
                 description="pools made by `heteroflow airflow pools` ({pool: slots}); read by heteroflow DAGs' prepare-run")


def pools_in_use(tasks: Iterable[Any]) -> dict[str, int]:
    """``{pool: the most pool_slots one task takes}`` over ``tasks`` (Airflow operators), without ``default_pool``
    (it always exists)."""
    out: dict[str, int] = {}
    for task in tasks:
        pool = getattr(task, "pool", None)
        if pool and pool != "default_pool":
            out[pool] = max(out.get(pool, 0), int(getattr(task, "pool_slots", 1) or 1))
    return out


def _existing_pools() -> tuple[dict[str, int] | None, str]:
    """``({pool: slots}, where it was read)``, or ``(None, why)`` when neither source can be read here."""
    try:
        from airflow.models.pool import Pool

        return {p.pool: int(p.slots) for p in Pool.get_pools()}, "Airflow's database"
    except Exception as exc:  # Airflow 3 workers: "Direct database access via the ORM is not allowed"
        blocked = f"{type(exc).__name__}: {exc}"
    try:
        from airflow.sdk import Variable

        text = Variable.get(POOLS_VARIABLE, default=None)
    except Exception as exc:
        return None, f"database: {blocked}; Variable {POOLS_VARIABLE}: {type(exc).__name__}: {exc}"
    if text is None:
        return {}, f"the Airflow Variable {POOLS_VARIABLE} (absent: `heteroflow airflow pools` has not run here)"
    try:
        recorded = json.loads(text)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        return None, f"the Airflow Variable {POOLS_VARIABLE} is not a JSON object"
    return {str(k): int(v) for k, v in recorded.items()}, f"the Airflow Variable {POOLS_VARIABLE}"


def check_pools(tasks: Iterable[Any], *, dag_id: str = "this DAG") -> None:
    """Fail unless every pool ``tasks`` use exists with at least the slots one of them takes.

    Args:
        tasks: the DAG's tasks (``dag.tasks``).
        dag_id: named in the message.

    Raises:
        AirflowFailException: pools missing (named, with their slots wanted) or too small, and the command that
            makes them (``heteroflow airflow pools``).

    Warns:
        UserWarning: the pools cannot be read here (no database, no Variable); the run goes on unchecked.
    """
    from airflow.sdk.exceptions import AirflowFailException

    needed = pools_in_use(tasks)
    if not needed:
        return
    existing, source = _existing_pools()
    if existing is None:
        import warnings

        warnings.warn(f"cannot check the Airflow pools {', '.join(sorted(needed))} of {dag_id} here ({source}); "
                      "a task whose pool does not exist waits in `scheduled` for ever", UserWarning, stacklevel=2)
        return
    missing = sorted(name for name in needed if name not in existing)
    short = sorted(name for name in needed if name in existing and 0 < existing[name] < needed[name])
    problems = []
    if missing:
        problems.append(
            f"its tasks use the Airflow pool(s) {', '.join(missing)}, which do not exist (read from {source}); a task "
            "in a missing pool stays `scheduled` for ever (Airflow only logs \"non-existent pool\")"
        )
    if short:
        problems.append(
            "; ".join(f"a task takes {needed[n]} slots of pool {n}, which has {existing[n]}, so it can never start" for n in short)
        )
    if problems:
        raise AirflowFailException(
            f"{dag_id}: {'; and '.join(problems)}. Create or resize them with `heteroflow airflow pools --inventory "
            "FILE` (FILE: per device kind a count, or a count per model, e.g. 'gpu: {nvidia-t4: 2}' and 'npu: 8'; 0 "
            "where you have none), then rerun"
        )
