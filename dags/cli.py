"""``heteroflow airflow ...``: commands for running heteroflow pipelines on Airflow.

Registered in the ``heteroflow.cli`` entry-point group (pyproject.toml), so ``heteroflow airflow`` appears
without the CLI importing this package; nothing from Airflow is imported until a command runs.

- ``heteroflow airflow pools [--inventory FILE]``: create or update the pools per device kind and accelerator
  model (:mod:`heteroflow.dags.pools`) in this environment's Airflow database, and record them in the Airflow
  Variable ``heteroflow_pools`` (what a DAG's ``prepare-run`` checks on workers that cannot read the database:
  a missing pool fails the run at once instead of leaving its tasks ``scheduled`` for ever).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from heteroflow.components.errors import HeteroflowError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Run heteroflow pipelines on Airflow 3 (pools; DAGs come from heteroflow.dags.factory.build_dag).",
)
_console = Console(soft_wrap=True)
_err = Console(stderr=True, soft_wrap=True)


@app.callback()
def _group() -> None:
    """Run heteroflow pipelines on Airflow 3."""


@app.command()
def pools(
    inventory: Annotated[
        Optional[Path],
        typer.Option(
            help="Device inventory (YAML or JSON): per kind a count, or a count per model, e.g. "
            "'gpu: {a100-80gb: 2, t4: 4}' / 'npu: 8'. Default: the devices PyTorch sees here "
            "(plus HETEROFLOW_SIMULATE_DEVICES)."
        ),
    ] = None,
    prefix: Annotated[str, typer.Option(help="Pool name prefix (build_dag uses heteroflow).")] = "heteroflow",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change; change nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the pools as JSON.")] = False,
) -> None:
    """Create or update Airflow pools per device kind and accelerator model (slots = devices).

    Runs against the Airflow database of this environment (AIRFLOW_HOME), like `airflow pools set`.
    """
    from heteroflow.dags.pools import load_inventory, pool_plan, sync_pools

    try:
        rows = sync_pools(pool_plan(load_inventory(inventory), prefix=prefix), dry_run=dry_run, prefix=prefix)
    except (HeteroflowError, OSError) as exc:
        _err.print(f"[bold red]error:[/] {escape(' '.join(str(exc).split()))}", highlight=False)
        raise typer.Exit(code=2) from None
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="Airflow pools" + (" (dry run: nothing changed)" if dry_run else ""), title_justify="left")
    for col in ("pool", "slots", "before", "meaning"):  # a pool's name stays on one line (copied into DAGs); meaning wraps
        table.add_column(col, no_wrap=col in ("pool", "slots", "before"))
    for row in rows:
        before = "new" if row["previous"] is None else str(row["previous"])
        table.add_row(row["name"], str(row["slots"]), before, escape(row["description"]))
    from heteroflow.pipelines.cli.common import whole_cells

    _console.print(whole_cells(table))
