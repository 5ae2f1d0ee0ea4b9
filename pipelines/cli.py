"""The ``heteroflow`` command line.

- ``heteroflow run``: run the default pipeline on this machine (kfp.local), print a table per step (device,
  attempts, seconds) and the final metrics, write ``run.json`` in the run's folder.
- ``heteroflow compile -o FILE``: write the default pipeline as KFP IR YAML for the Kubeflow UI.
- ``heteroflow params``: list the pipeline's parameters with their defaults.

User errors (bad parameters, a missing data set, invalid resources) print one line that says what is wrong
and what is valid, and exit with status 2; a failed step exits with status 1.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from heteroflow.components.errors import HeteroflowError, InvalidParameter
from heteroflow.components.resources import Candidates

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_show_locals=False,
    no_args_is_help=True,
    help="heteroflow: ML training pipelines on heterogeneous compute (GPU, NPU, CPU).",
)
console = Console(soft_wrap=True)  # paths and messages stay on one line when piped; tables still fit
err_console = Console(stderr=True, soft_wrap=True)  # one error, one line, whatever the terminal width


def _fail(exc: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    raise typer.Exit(code=2)


def _parse_pairs(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise InvalidParameter(f"--param {pair!r} is not NAME=VALUE (e.g. --param epochs=3)")
        out[name.strip()] = value.strip()
    return out


def _short_error(error: str | None) -> str:
    """``heteroflow.cache.errors.DatasetError: msg`` -> ``msg`` (our errors' messages say it all);
    any other exception keeps its type name."""
    if not error:
        return ""
    kind, sep, message = error.partition(": ")
    return message if sep and kind.startswith("heteroflow.") else error


def _steps_table(steps) -> Table:  # type: ignore[no-untyped-def]
    table = Table(title="steps", title_justify="left")
    for col, justify in (("step", "left"), ("status", "left"), ("device", "left"), ("attempts", "right"), ("seconds", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    colours = {"succeeded": "green", "failed": "red", "running": "yellow"}
    for s in steps:
        colour = colours.get(s.status, "dim")
        table.add_row(
            s.name,
            f"[{colour}]{s.status}[/]",
            s.device or "-",
            str(s.attempts) if s.attempts else "-",
            f"{s.seconds:.2f}" if s.seconds is not None else "-",
        )
    return table


@app.command()
def run(
    param: Annotated[
        Optional[list[str]],
        typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable); see `heteroflow params`."),
    ] = None,
    dataset: Annotated[
        Optional[str],
        typer.Option(help="Data set folder or fsspec URL with .csv or .npz files. Default: the digits sample."),
    ] = None,
    candidate: Annotated[
        Optional[list[str]],
        typer.Option(
            "--candidate",
            "-c",
            help="Train candidate KIND[:key=value,...], most preferred first (repeatable), "
            "e.g. -c gpu:count=1,memory=16Gi -c cpu:cpu=4. Default: npu, gpu, cpu.",
        ),
    ] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Run folder. Default: ./heteroflow-runs/<run id>.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print kfp.local's own output.")] = False,
) -> None:
    """Run the default pipeline (prewarm, preprocess, plan, train, evaluate, archive) on this machine."""
    from heteroflow.pipelines.default import build_default_pipeline
    from heteroflow.pipelines.local import coerce_overrides, pipeline_parameters, run_local

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # stop like Ctrl-C: the step subprocesses are stopped and the run recorded

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        candidates = Candidates(candidate) if candidate else None
        spec = pipeline_parameters(build_default_pipeline(candidates=candidates))
        params = coerce_overrides(_parse_pairs(param or []), spec)
        if dataset is not None:
            if "dataset_uri" in params:
                raise InvalidParameter("give the data set once: --dataset or --param dataset_uri, not both")
            params["dataset_uri"] = dataset
        if verbose:
            record = run_local(params, run_dir=output, candidates=candidates, echo_engine_output=True)
        else:
            with Live(_steps_table([]), console=console, refresh_per_second=4, transient=True) as live:
                record = run_local(
                    params, run_dir=output, candidates=candidates, on_progress=lambda steps: live.update(_steps_table(steps))
                )
    except HeteroflowError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        err_console.print(
            "interrupted: rerun the same command to resume (train continues from its last checkpoint, "
            "prewarm skips what is cached)",
            highlight=False,
        )
        raise typer.Exit(code=130) from None

    console.print(_steps_table(record.steps))
    placement = record.placement
    if placement:
        console.print(
            f"placement: candidate {placement.get('index')} (0 = preferred) -> [bold]{placement.get('torch_device')}[/]"
        )
        for why in placement.get("passed_over", []):
            console.print(f"  passed over: {escape(why)}", highlight=False)
    if record.status == "succeeded":
        m = record.metrics
        console.print(
            f"test accuracy: [bold]{m['accuracy']:.4f}[/] on {m.get('samples')} samples; "
            f"train throughput: {m.get('train_samples_per_second')} samples/s"
        )
        metrics = Table(title="per-class metrics (test)", title_justify="left")
        for col in ("class", "precision", "recall"):
            metrics.add_column(col, justify="right")
        for cls in m.get("precision", {}):
            metrics.add_row(cls, f"{m['precision'][cls]:.3f}", f"{m['recall'][cls]:.3f}")
        console.print(metrics)
        console.print(f"archived: {record.archive.get('path')} (version {record.archive.get('version')})", highlight=False)
    else:
        for s in record.steps:
            if s.status == "failed":
                console.print(f"[red]step {s.name} failed:[/] {escape(_short_error(s.error))}", highlight=False)
        console.print(f"engine log: {record.run_dir}/kfp.log", highlight=False)
    console.print(
        f"run {record.status} in {record.wall_seconds:.1f} s; record: {record.run_dir}/run.json", highlight=False
    )
    if record.status != "succeeded":
        raise typer.Exit(code=1)


@app.command("compile")
def compile_(
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write (KFP IR YAML).")],
    candidate: Annotated[
        Optional[list[str]],
        typer.Option("--candidate", "-c", help="Train candidate KIND[:key=value,...], most preferred first (repeatable)."),
    ] = None,
    image: Annotated[
        Optional[str],
        typer.Option(help="Container image with heteroflow[all] installed, for every step. [default: heteroflow-python:0.1.0]"),
    ] = None,
) -> None:
    """Compile the default pipeline to KFP IR YAML (upload it in the Kubeflow UI or with kfp.Client)."""
    from kfp import compiler

    from heteroflow.components.kfp_components import DEFAULT_IMAGE
    from heteroflow.pipelines.default import build_default_pipeline

    try:
        if output.is_dir() or output.suffix not in (".yaml", ".yml"):
            raise InvalidParameter(f"--output {output} must be a file name ending in .yaml or .yml")
        candidates = Candidates(candidate) if candidate else None
        pipeline = build_default_pipeline(candidates=candidates, image=image or DEFAULT_IMAGE)
    except HeteroflowError as exc:
        _fail(exc)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline, str(output))
    console.print(f"wrote {output}", highlight=False)


@app.command()
def params(as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """List the default pipeline's parameters, their types and defaults."""
    from heteroflow.pipelines.default import build_default_pipeline
    from heteroflow.pipelines.local import pipeline_parameters

    spec = pipeline_parameters(build_default_pipeline())
    if as_json:
        print(json.dumps({n: {"type": p.type.__name__, "default": None if p.required else p.default, "help": p.help} for n, p in spec.items()}, indent=2))
        return
    table = Table(title="parameters of the default pipeline (set with --param NAME=VALUE)", title_justify="left")
    for col in ("name", "type", "default", "meaning"):
        table.add_column(col, no_wrap=col == "name", overflow="fold")
    for p in spec.values():
        default = "(required; heteroflow run uses the digits sample)" if p.required else repr(p.default)
        table.add_row(p.name, p.type.__name__, escape(default), escape(p.help))
    console.print(table)


def main() -> None:
    """Entry point of the ``heteroflow`` console script."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
