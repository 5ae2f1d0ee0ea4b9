"""``heteroflow archive list|show``: the archived models, every version, its metrics and lineage.

Registered in :mod:`heteroflow.pipelines.cli.main` with ``app.add_typer(archive_app, name="archive")``;
``heteroflow archive prune`` is added by :func:`heteroflow.pipelines.cli.runs.register`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from heteroflow.components.errors import HeteroflowError, InvalidParameter
from heteroflow.pipelines.cli.common import _fail, console, fit_columns, hidden_note, print_table, whole_cells

__all__ = ["archive_app", "archive_export", "archive_list", "archive_show"]

archive_app = typer.Typer(no_args_is_help=True, help="The archived models: every version, its metrics and lineage.")
_ROOT_OPTION = typer.Option("--root", help="Archive folder. Default: $HETEROFLOW_HOME/archive.")


def _accuracy(metrics: dict[str, Any]) -> str:
    value = metrics.get("accuracy")
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def _data_set(dataset: dict[str, Any]) -> str:
    """The list's data set cell: the first 8 hex digits of its sha256, or a dataset factory's ``module:function``."""
    if dataset.get("dataset_sha256"):
        return str(dataset["dataset_sha256"])[:8]
    return str(dataset.get("dataset_factory") or "-")


@archive_app.command("list")
def archive_list(
    model: Annotated[Optional[str], typer.Argument(help="Only this model's versions.")] = None,
    root: Annotated[Optional[Path], _ROOT_OPTION] = None,
) -> None:
    """List archived models and versions (newest last): when, test accuracy, device, data set, run."""
    from heteroflow.components.models.archive import archive_root_dir, list_models, list_versions, read_version

    folder = archive_root_dir(root)
    try:
        names = [model] if model else list_models(folder)
        if model:
            read_version(folder, model)  # an unknown model: the error lists the archived ones
    except HeteroflowError as exc:
        _fail(exc)
        return
    if not names:
        console.print(f"no archived model under {folder} yet (heteroflow run archives one)", highlight=False)
        return
    headers = ["model", "version", "archived at", "accuracy", "device", "data set", "run"]
    cells = []
    for name in names:
        for v in list_versions(folder, name):
            info = read_version(folder, name, v)
            lineage = info["lineage"]
            cells.append([
                name,
                f"v{v}",
                str(lineage.get("archived_at", "-")),
                _accuracy(info["metrics"]),
                str(lineage.get("device") or "-"),
                _data_set(lineage.get("dataset") or {}),
                str(lineage.get("run_id") or "-"),
            ])
    # at a narrow terminal: the data set's hash, then the run, then the device go first
    kept, hidden = fit_columns(console, headers, cells, ["data set", "run", "device"], wrap={"device": 14})
    table = Table(title=f"archived models in {folder}", title_justify="left")
    for i in kept:
        table.add_column(headers[i], no_wrap=headers[i] in ("model", "version", "archived at"), overflow="fold")
    for row_cells in cells:
        table.add_row(*(escape(row_cells[i]) for i in kept))
    print_table(console, table, headers, cells)
    if hidden:
        console.print(hidden_note(hidden, console.width, "`heteroflow archive show MODEL` has all"), highlight=False, style="dim")


def _formats(formats: dict[str, Any]) -> str:
    """``pytorch: model; onnx: onnx/model.onnx (input features [batch, 64] float32: preprocessed features ...)``."""
    parts = []
    for name, entry in sorted(formats.items()):
        entry = entry if isinstance(entry, dict) else {}
        text = f"{name}: {entry.get('path', '-')}"
        if isinstance(entry.get("input"), dict):
            given = entry["input"]
            text += f" (input {given.get('name')} {given.get('shape')} {given.get('dtype')}: {given.get('takes')})"
        parts.append(text)
    return "; ".join(parts)


@archive_app.command("show")
def archive_show(
    model: Annotated[str, typer.Argument(help="MODEL or MODEL:vN (default: the latest version).")],
    root: Annotated[Optional[Path], _ROOT_OPTION] = None,
) -> None:
    """One archived version: its path, metrics, and lineage (data set, parameters, device, code, the run that made it)."""
    from heteroflow.components.models.archive import archive_root_dir, read_version

    name, _, version_text = model.partition(":")
    try:
        version = None
        if version_text:
            if not (version_text.startswith("v") and version_text[1:].isdigit()):
                raise InvalidParameter(f"{model!r}: the version is written vN, e.g. {name}:v2")
            version = int(version_text[1:])
        info = read_version(archive_root_dir(root), name, version)
    except HeteroflowError as exc:
        _fail(exc)
        return
    lineage, metrics = info["lineage"], info["metrics"]
    console.print(f"[bold]{escape(info['name'])} v{info['version']}[/]: {escape(info['path'])}", highlight=False)
    facts = Table(title="lineage", title_justify="left", show_header=False)
    facts.add_column("what")
    facts.add_column("value", overflow="fold")
    dataset = lineage.get("dataset", {})
    rows = [
        ("run", lineage.get("run_id")),
        ("archived at", lineage.get("archived_at")),
        ("data set", dataset.get("source_uri") or (f"dataset_factory {dataset['dataset_factory']}" if dataset.get("dataset_factory") else None)),
        ("data set sha256", dataset.get("dataset_sha256")),
        ("data set files / bytes", f"{dataset.get('files')} / {dataset.get('total_bytes')}" if dataset.get("files") is not None else None),
        ("device", lineage.get("device")),
        ("preprocess", json.dumps(lineage.get("preprocess", {}), sort_keys=True)),
        ("model", json.dumps(lineage.get("model"), sort_keys=True) if lineage.get("model") else None),  # as built
        ("train", json.dumps(lineage.get("train", {}), sort_keys=True)),
        ("code", json.dumps(lineage.get("code", {}), sort_keys=True)),
        ("formats", _formats(lineage.get("formats") or {"pytorch": {"path": "model"}})),
    ]
    cells = [[key, str(value if value is not None else "-")] for key, value in rows]
    for key, value in cells:
        facts.add_row(key, escape(value))
    # piped (a script, a file): plain columns, every value whole on its line, as runs show and archive list print
    print_table(console, facts, ["lineage", "value"], cells)
    scores = Table(title="metrics (test)", title_justify="left")
    scores.add_column("metric")
    scores.add_column("value", justify="right")
    score_cells = []
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            score_cells.append([key, f"{value:.4f}" if isinstance(value, float) else str(value)])
        elif isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()):
            score_cells.extend([f"{key}[{k}]", f"{v:.4f}"] for k, v in value.items())
    for key, value in score_cells:
        scores.add_row(escape(key), value)  # class names print literally ([setosa] is no markup)
    if not console.is_terminal:
        console.print("", highlight=False)  # a blank line between the two blocks
    print_table(console, scores, ["metric (test)", "value"], score_cells)


@archive_app.command("export")
def archive_export(
    model: Annotated[str, typer.Argument(help="MODEL or MODEL:vN (default: the latest version).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The file to write (never replaced: an existing file is an error).")],
    format: Annotated[str, typer.Option("--format", help="The format: onnx (needs the onnx extra).")] = "onnx",  # noqa: A002
    root: Annotated[Optional[Path], _ROOT_OPTION] = None,
) -> None:
    """Export an archived version to a portable format (ONNX: takes the preprocessed features; checked against
    PyTorch's outputs). The archived version is left as it is; `--param export_formats=onnx` archives one with it."""
    from heteroflow.components.models.archive import archive_root_dir, read_version
    from heteroflow.components.models.onnx import export_onnx, parse_export_formats

    name, _, version_text = model.partition(":")
    try:
        if parse_export_formats(format) != ("onnx",):
            raise InvalidParameter(f"--format {format!r}: give one format; valid: onnx")
        version = None
        if version_text:  # vN, as `archive show` reads it ('2' and 'vv1' were taken)
            if not (version_text.startswith("v") and version_text[1:].isdigit()):
                raise InvalidParameter(f"{model!r}: the version is written vN, e.g. {name}:v2")
            version = int(version_text[1:])
        folder = archive_root_dir(root)
        info = read_version(folder, name, version)
        if output.expanduser().resolve().is_relative_to(folder.resolve()):
            raise InvalidParameter(
                f"-o {output} is inside the archive ({folder}): archived versions never change; write the file elsewhere, "
                "or archive with --param export_formats=onnx to keep one in the version"
            )
        done = export_onnx(Path(info["path"]) / "model", output.expanduser())
    except HeteroflowError as exc:
        _fail(exc)
        return
    console.print(
        escape(f"exported {info['name']}:v{info['version']} to {done.path} (ONNX opset {done.opset}, {done.exporter} "
               f"exporter; input {list(done.input_shape)} preprocessed features per sample, largest difference from "
               f"PyTorch {done.max_abs_diff:.2g})"),
        highlight=False,
    )
    if done.notice:
        console.print(escape(f"notice: {done.notice}"), highlight=False)
