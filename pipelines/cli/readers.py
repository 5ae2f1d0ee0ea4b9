"""The file readers on the command line: ``heteroflow readers`` lists every registered reader (built-in and from the
entry-point group ``heteroflow.readers``): its name, data kind, suffixes, description and where it came from.

Registered in :mod:`heteroflow.pipelines.cli.main` with ``app.command("readers")(readers_command)``.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["readers_command", "readers_facts"]


def readers_facts() -> list[dict[str, object]]:
    """One JSON-ready dict per registered reader: ``name``, ``kind``, ``suffixes`` (list), ``description``,
    ``origin`` (``registered in code`` or ``entry point NAME = module:attr``), in lookup order."""
    from heteroflow.components.data.formats import REGISTRY

    return [
        {"name": r.name, "kind": r.kind, "suffixes": list(r.suffixes), "description": r.describe(), "origin": REGISTRY.origin(r.name)}
        for r in REGISTRY.readers()
    ]


def readers_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the readers as a JSON list.")] = False,
) -> None:
    """List the file readers: which formats a data set may hold (third-party readers install through the
    entry-point group heteroflow.readers)."""
    facts = readers_facts()
    if as_json:
        print(json.dumps(facts, indent=1))
        return
    table = Table("reader", "kind", "suffixes", "reads", "from")
    for f in facts:
        table.add_row(str(f["name"]), str(f["kind"]), " ".join(f["suffixes"]), str(f["description"]), str(f["origin"]))  # type: ignore[arg-type]
    from heteroflow.pipelines.cli.common import whole_cells

    Console(soft_wrap=True).print(whole_cells(table))
