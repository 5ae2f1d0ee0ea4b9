"""The ``heteroflow`` command line.

- ``heteroflow run``: run the default pipeline on this machine (kfp.local; ``--engine`` picks another registered
  engine, :mod:`heteroflow.pipelines.engines.registry`); a live table per step (status,
  device, attempts, progress), then where each device-bound step ran and why, the metrics, the archived model;
  ``run.json`` in the run's folder.
- ``heteroflow compile -o FILE``: the default pipeline as KFP IR YAML for the Kubeflow UI.
- ``heteroflow submit FILE --host URL``: send a compiled pipeline to a Kubeflow Pipelines endpoint.
- ``heteroflow engines``: the registered engines, what each needs installed.
- ``heteroflow params``: every pipeline parameter with its type, default, unit and help.
- ``heteroflow predict MODEL INPUT``: an archived model's predictions (``--format onnx``: its ONNX export on onnxruntime).
- ``heteroflow step NAME``: run one step in this process (what pods and Airflow tasks run); exit status per
  failure class (:data:`heteroflow.components.core.runtime.EXIT_CODES`).

User errors (bad parameters, a missing data set, invalid resources, a path that cannot be written) print one
line that says what is wrong and what is valid, and exit with status 2; a failed run exits with status 1. An
unexpected error prints one line and the file that holds its traceback (``--debug`` prints the traceback).

This module holds the typer app, ``run``, ``compile``, ``engines``, ``params``, ``submit`` and the entry points
(:func:`main`, :func:`console_script`, the plugins' command groups); the rest went to sibling modules and is
re-imported here: the consoles and the one-line error (:mod:`heteroflow.pipelines.cli.common`), the steps table and
the run's summary (:mod:`heteroflow.pipelines.cli.summary`), ``heteroflow step`` (:mod:`heteroflow.pipelines.cli.step`),
``heteroflow archive`` (:mod:`heteroflow.pipelines.cli.archive`), and the other command groups (``cache``, ``runs``,
``simulate``, ...).
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from heteroflow.components.errors import HeteroflowError, InvalidParameter, did_you_mean
from heteroflow.pipelines.cli.common import (
    _PIPELINE_OPTION,
    _fail,
    _one_line,
    _parse_pairs,
    _pipeline,
    _show_warning,
    console,
    err_console,
    flags_show_no_type,
    whole_cells,
)
from heteroflow.pipelines.cli.summary import _live_console, _print_record, _steps_table, _waiting_lines
from heteroflow.pipelines.engines.registry import DEFAULT_ENGINE

flags_show_no_type()  # `--verbose`, `--help`: no `<bool>` after a flag in any command's --help
app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="heteroflow: ML training pipelines on heterogeneous compute (GPU, NPU, CPU).",
)
_state = {"debug": False, "console_script": False}


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Print the full traceback of an unexpected error.")] = False,
) -> None:
    _state["debug"] = debug


def _engine_help(*, every: bool = False) -> str:
    """``--engine``'s help, from the registry: the builtin engines, and with ``every`` those installed packages
    register too (``airflow``, through an entry point: loading those costs every command's start-up, so
    ``run --help`` asks for them when it is shown, :class:`_RunCommand`)."""
    from heteroflow.pipelines.engines.registry import BUILTIN_ENGINES, engine_names, get_engine

    listed = []
    for name in engine_names() if every else BUILTIN_ENGINES:
        try:
            listed.append(f"{name}: {get_engine(name, check=False).description}")
        except HeteroflowError:  # a broken plugin: named, `heteroflow engines` says why
            listed.append(f"{name}: (cannot be loaded; see `heteroflow engines`)")
    tail = "`heteroflow engines` says what each needs installed" if every else "or one an installed package registers (`heteroflow engines` lists them all)"
    return f"The engine: {'; '.join(listed)}; {tail}."


_ENGINE_HELP = _engine_help()


class _RunCommand(TyperCommand):
    """``heteroflow run``: its ``--help`` lists every registered engine, those of installed packages (``airflow``)
    too, read from the registry as the help is shown (#new-user trial: it listed the builtin ones only)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.params:
            if param.name == "engine":
                param.help = _engine_help(every=True)
        super().format_help(ctx, formatter)


@app.command(cls=_RunCommand)
def run(
    param: Annotated[
        Optional[list[str]],
        typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable); see `heteroflow params`."),
    ] = None,
    dataset: Annotated[
        Optional[str],
        typer.Option(help="Data set folder or fsspec URL: tables (.csv, .tsv, .parquet, .npz), an image folder (one folder per class) or .pt tensors; `heteroflow readers` lists every format. Default: the digits sample."),
    ] = None,
    candidate: Annotated[
        Optional[list[str]],
        typer.Option(
            "--candidate",
            "-c",
            help="Train candidate KIND[:key=value,...], most preferred first (repeatable), "
            "e.g. -c gpu:count=1,memory=16Gi -c cpu:cpu=4. Default: npu, gpu, cpu. Replicas of several kinds in one "
            "job: -c gpu:count=2+npu:count=4, with the job's options after any part: compression=none|topk|powersgd, "
            "topk_ratio (default 0.01), powersgd_rank (default 2), rebalance_every_steps, rebalance_every_minutes.",
        ),
    ] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Run folder. Default: ./heteroflow-runs/<run id>.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print the engine's own output as it comes: kfp.local's instead of writing kfp.log, Airflow's as well as writing airflow.log (both in the run folder).")] = False,
    pipeline_ref: Annotated[Optional[str], _PIPELINE_OPTION] = None,
    engine: Annotated[str, typer.Option(help=_ENGINE_HELP)] = DEFAULT_ENGINE,
    simulate_devices: Annotated[
        Optional[str],
        typer.Option(
            "--simulate-devices",
            help="Testing: device kinds that count as present and run on the CPU, keeping their identity in "
            "records and placement, e.g. npu,gpu (also HETEROFLOW_SIMULATE_DEVICES).",
        ),
    ] = None,
    inject_fault: Annotated[
        Optional[list[str]],
        typer.Option(
            "--inject-fault",
            help="Testing: STEP@KIND=CLASS[:N | :after_steps=N] (repeatable; CLASS: device, transient, permanent), "
            "e.g. train@npu=device, preprocess@cpu=permanent, train@npu=transient:2 (fails the first 2 attempts), "
            "train@npu=device:after_steps=40 (fails once 40 optimizer steps are done: the next candidate resumes from "
            "the checkpoint) (also HETEROFLOW_INJECT_FAULT).",
        ),
    ] = None,
) -> None:
    """Run the default pipeline (prewarm, preprocess, plan, train, evaluate, archive), or --pipeline, on this machine."""
    if engine == "kfp-local" and _state["console_script"]:
        from heteroflow.pipelines.kfp.prestart import start_early

        # step processes start while this one imports and renders the pipeline (the console script only: code
        # that calls main() in its own process gets run_local's pool, which ends with the run). The console script
        # (heteroflow.pipelines.cli.script) has started them already when it read `run` on its command line.
        start_early()
    from heteroflow.pipelines.engines.registry import get_engine
    from heteroflow.pipelines.engines.runner import DEFAULT_PIPELINE_SOURCE, run as run_pipeline

    stopped_by: list[int] = []

    def on_sigterm(signum: int, frame: object) -> None:
        stopped_by.append(signum)
        raise KeyboardInterrupt  # stop like Ctrl-C: the step subprocesses are stopped and the run recorded

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        try:
            chosen = get_engine(engine)
        except InvalidParameter as exc:
            raise InvalidParameter(f"--engine: {exc}") from None
        pipeline = _pipeline(pipeline_ref, candidate)
        raw = _parse_pairs(param or [])
        aliases = pipeline.aliases  # `seed` sets preprocess.seed and train.seed
        params = _coerced(pipeline, raw, dataset)
        options: dict[str, Any] = dict(engine=engine, run_dir=output, simulate_devices=simulate_devices, inject_faults=inject_fault)
        # engines that run the pipeline in other processes import it from here (airflow: and give its calls the
        # value's candidates, those of -c)
        options["source"] = pipeline_ref or DEFAULT_PIPELINE_SOURCE
        began = time.monotonic()  # what the command waits for: said beside the record's time where it is longer
        if "on_progress" not in chosen.options or verbose:
            echo = verbose and "echo_engine_output" in chosen.options  # -v: the engine's own output, where it has one
            record = run_pipeline(pipeline, params, echo_engine_output=echo, **options)
        else:
            live_console = _live_console()
            seen: set[str] = set()
            with Live(_steps_table([]), console=live_console, refresh_per_second=4, transient=True) as live:

                def on_progress(steps: list[Any]) -> None:
                    for line in _waiting_lines(steps, seen):  # on a terminal and off it (#28 item 10)
                        live.console.print(escape(line), highlight=False)
                    live.update(_steps_table(steps, pipeline))

                record = run_pipeline(pipeline, params, on_progress=on_progress, **options)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
        return
    except KeyboardInterrupt as stop:
        stopped = getattr(stop, "record", None)
        if stopped is not None and stopped.status == "succeeded":  # every step had finished: say what run.json says
            _print_record(stopped, pipeline)
            return
        if stopped is not None:
            console.print(_steps_table(stopped.steps))
            report = Path(stopped.run_dir, "report.html")  # written with run.json: the steps so far, train's curves
            if report.is_file():
                console.print(f"report: {escape(str(report))}", highlight=False)
            console.print(f"record: {escape(str(stopped.run_dir))}/run.json", highlight=False)
        err_console.print(interrupted_hint(stopped), highlight=False)
        # 128 + the signal, as a shell reports a process a signal ended: 130 after Ctrl-C, 143 after SIGTERM
        raise typer.Exit(code=128 + (stopped_by[0] if stopped_by else signal.SIGINT)) from None

    _print_record(record, pipeline, elapsed=time.monotonic() - began, engine=chosen.name)
    if record.status not in ("succeeded", "submitted"):  # submitted: engine kfp's backend runs it (it exited 1)
        raise typer.Exit(code=1)


def interrupted_hint(record: Any) -> str:
    """What an interrupted ``heteroflow run`` says last: rerun the same command to resume, and what the rerun
    continues from, worded by where the stop came (``record``: the interrupted run's record, or None when the stop
    came before it existed). Train resumes from its last checkpoint only if it wrote one (it writes them every
    so many steps, a parameter of its own): a stop before the first starts it again."""
    steps = {s.name: s.status for s in (record.steps if record is not None else [])}
    parts = []
    if steps.get("prewarm") != "succeeded":
        parts.append("prewarm skips what is cached")
    if steps.get("train") in ("interrupted", "killed", "running"):  # stopped while it trained
        parts.append("train continues from its last checkpoint if it wrote one; stopped before its first, it starts again")
    elif steps.get("train") == "succeeded" and record is not None and (record.results.get("train") or {}).get("kept_checkpoint"):
        parts.append("train takes the model it finished, kept until a run succeeds: it does not train again")
    return "interrupted: rerun the same command to resume" + (f" ({'; '.join(parts)})" if parts else "")


def _coerced(pipeline: Any, raw: dict[str, str], dataset: str | None) -> dict[str, Any]:
    """``--param`` values as the pipeline's types, and ``--dataset``. Every problem in one message: unknown names
    and values that do not parse, with what the run's own check finds in the others (the data set among them).

    Raises:
        InvalidParameter | DatasetError | RunProblems: see :func:`heteroflow.pipelines.runs.records.prepare_arguments`.
    """
    import dataclasses

    from heteroflow.components.errors import Problems

    problems = Problems()
    aliases = pipeline.aliases  # `seed` sets preprocess.seed and train.seed
    spellings = pipeline.kfp_spellings  # `preprocess_seed` (KFP's spelling) is `preprocess.seed` (#28.20)
    canonical = {k: (spellings[k] if k in spellings and k not in pipeline.params else k) for k in raw}
    unknown = sorted(k for k, name in canonical.items() if name not in pipeline.params and name not in aliases)
    if unknown:
        valid = sorted([*pipeline.params, *aliases])
        problems.add(InvalidParameter(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f"{did_you_mean(unknown, valid)}; valid: {', '.join(valid)}"
        ))
    params: dict[str, Any] = {}
    for given, value in raw.items():
        name = canonical[given]
        if given not in unknown:
            param = pipeline.params[aliases[name][0] if name in aliases else name]
            with problems.check():  # a value that does not parse is named as given (`seed`, not preprocess.seed)
                params[name] = dataclasses.replace(param, name=given).coerce(value)
    if dataset is not None:
        if "dataset_uri" in raw:
            problems.add(InvalidParameter("give the data set once: --dataset or --param dataset_uri, not both"))
        elif "dataset_uri" not in pipeline.params:  # it said "unknown parameter(s) dataset_uri", a name never typed
            problems.add(InvalidParameter(
                f"--dataset: pipeline {pipeline.name!r} reads no data set (it has no dataset_uri parameter); valid: "
                f"leave --dataset out, or give its own parameters ({', '.join(sorted(pipeline.params)) or 'none'})"))
        else:
            params["dataset_uri"] = dataset
    if problems:  # with the problems of the values that parsed
        from heteroflow.pipelines.runs.records import prepare_arguments

        with problems.check():
            prepare_arguments(pipeline, params)
        problems.raise_all("this run (nothing was run; fix each and rerun)")
    return params


@app.command()
def engines(as_json: Annotated[bool, typer.Option("--json", help="Print the engines as JSON.")] = False) -> None:
    """List the engines `heteroflow run --engine` takes: the builtin ones and those installed packages register."""
    from heteroflow.pipelines.engines.registry import EngineUnavailable, check_installed, engine_names, get_engine

    rows = []
    for name in engine_names():
        engine = get_engine(name, check=False)
        try:
            check_installed(engine)
            ready = "yes"
        except EngineUnavailable:
            ready = f"no: pip install 'heteroflow[{engine.extra}]'" if engine.extra else "no"
        rows.append({"name": name, "description": engine.description, "extra": engine.extra, "installed": ready})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="engines", title_justify="left")
    for col in ("name", "description", "installed"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["name"], escape(row["description"]), escape(row["installed"]))
    console.print(whole_cells(table))


@app.command("compile")
def compile_(
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write (KFP IR YAML).")],
    candidate: Annotated[
        Optional[list[str]],
        typer.Option("--candidate", "-c", help="Train candidate KIND[:key=value,...], most preferred first (repeatable)."),
    ] = None,
    image: Annotated[
        Optional[str],
        typer.Option(help="Container image with heteroflow[all] installed, for every step (needed on a cluster)."),
    ] = None,
    pipeline_ref: Annotated[Optional[str], _PIPELINE_OPTION] = None,
    profile: Annotated[
        Optional[Path],
        typer.Option(help="Cluster profile YAML: device-plugin conventions, node labels, queues, tolerations (see examples/profiles/)."),
    ] = None,
) -> None:
    """Compile the default pipeline to KFP IR YAML (upload it in the Kubeflow UI or with `heteroflow submit`)."""
    from heteroflow.pipelines.kfp.render import DEFAULT_IMAGE, compile_pipeline

    try:
        if output.is_dir() or output.suffix not in (".yaml", ".yml"):
            raise InvalidParameter(f"--output {output} must be a file name ending in .yaml or .yml")
        pipeline = _pipeline(pipeline_ref, candidate)
        cluster = None
        if profile is not None:
            from heteroflow.components.devices.cluster import load_profile

            cluster = load_profile(profile)
        output.parent.mkdir(parents=True, exist_ok=True)
        compile_pipeline(pipeline, output, image=image or DEFAULT_IMAGE, profile=cluster)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
        return
    console.print(f"wrote {output}", highlight=False)
    # what to do with it: the Kubeflow UI's "Upload pipeline", or the submit command (a KFP v2 endpoint)
    console.print(f"next: upload {output} in the Kubeflow Pipelines UI, or run it there with "
                  f"heteroflow submit {output} --host URL (or $HETEROFLOW_KFP_HOST)", highlight=False)
    if not image:
        err_console.print(
            f"note: every step uses the placeholder image {DEFAULT_IMAGE}, which cannot run on a cluster; "
            "pass --image with an image that has heteroflow[all] installed",
            highlight=False,
        )


@app.command()
def params(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    pipeline_ref: Annotated[Optional[str], _PIPELINE_OPTION] = None,
) -> None:
    """List the pipeline's parameters: type, default, unit and meaning."""
    try:
        pipeline = _pipeline(pipeline_ref)
    except HeteroflowError as exc:
        _fail(exc)
        return
    _print_params(pipeline, as_json=as_json)


def _print_params(pipeline: Any, *, as_json: bool) -> None:
    from heteroflow.pipelines.kfp.platform import retry_note

    spec = pipeline.params
    kfp = {v: k for k, v in pipeline.kfp_spellings.items()}  # preprocess.seed -> preprocess_seed (#28.20)
    if as_json:
        print(
            json.dumps(
                {
                    n: {"type": p.type.__name__, "default": None if p.required else p.default, "unit": p.unit, "help": p.help}
                    | ({"kfp_name": kfp[n]} if n in kfp else {})
                    for n, p in spec.items()
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"parameters of {pipeline.name} (set with --param NAME=VALUE)", title_justify="left", expand=True)
    table.add_column("name", no_wrap=True)
    table.add_column("type = default", overflow="fold", ratio=1)
    table.add_column("meaning", overflow="fold", ratio=3)
    for p in spec.values():
        default = "required (heteroflow run: the digits sample)" if p.required else repr(p.default)
        unit = f" [{p.unit}]" if p.unit else ""
        table.add_row(p.name, escape(f"{p.type.__name__} = {default}{unit}"), escape(p.help))
    console.print(table)
    for short, names in pipeline.aliases.items():
        console.print(f"{short}=VALUE sets {' and '.join(names)} (each call has its own)", highlight=False)
    if kfp:  # one spelling accepted everywhere: either name works with --param, -c and KFP arguments
        pairs = ", ".join(f"{n} = {k}" for n, k in kfp.items())
        console.print(escape(f"KFP spells these with '_' (either spelling is accepted): {pairs}"), highlight=False)
    for call in pipeline.calls:  # the retries each call gets, the default written out (#31)
        console.print(escape(f"{call.name}: {retry_note(call)}"), highlight=False)


# --- one step (pipelines/cli/step.py) ---------------------------------------------------------------------

from heteroflow.pipelines.cli.step import step_  # noqa: E402

app.command("step")(step_)


# --- the cache tier (pipelines/cli/cache.py) ---------------------------------------------------------------

from heteroflow.pipelines.cli.cache import cache_app, prewarm_command  # noqa: E402

app.command("prewarm")(prewarm_command)
app.add_typer(cache_app, name="cache")

from heteroflow.pipelines.cli.simulate import simulate_command  # noqa: E402  (pipelines/cli/simulate.py)

app.command("simulate")(simulate_command)
from heteroflow.pipelines.cli.manifests import manifests_command  # noqa: E402  (pipelines/cli/manifests.py)

app.command("manifests")(manifests_command)
from heteroflow.pipelines.cli.train import profile_command  # noqa: E402  (pipelines/cli/train.py)

app.command("profile")(profile_command)
from heteroflow.pipelines.cli.readers import readers_command  # noqa: E402  (pipelines/cli/readers.py)

app.command("readers")(readers_command)


# --- archive (pipelines/cli/archive.py) ------------------------------------------------------------------

from heteroflow.pipelines.cli.archive import archive_app, archive_list, archive_show  # noqa: E402,F401  (archive_list, archive_show: re-exported)

app.add_typer(archive_app, name="archive")

from heteroflow.pipelines.cli.predict import predict_command  # noqa: E402  heteroflow predict (#31.3)

app.command("predict")(predict_command)


from heteroflow.pipelines.cli.runs import register as _register_runs  # noqa: E402  report, runs, metrics, prune (#17)

_register_runs(app)


# --- submit -----------------------------------------------------------------------------------------------


@app.command()
def submit(
    package: Annotated[Path, typer.Argument(help="A compiled pipeline (heteroflow compile -o FILE).")],
    host: Annotated[str, typer.Option(envvar="HETEROFLOW_KFP_HOST", help="Kubeflow Pipelines endpoint (KFP API URL).")],
    param: Annotated[Optional[list[str]], typer.Option("--param", "-p", help="Run argument NAME=VALUE (repeatable).")] = None,
    experiment: Annotated[str, typer.Option(help="Experiment to file the run under.")] = "heteroflow",
    run_name: Annotated[Optional[str], typer.Option(help="Run name (default: the pipeline's name and the time).")] = None,
    namespace: Annotated[Optional[str], typer.Option(help="Kubernetes namespace (multi-user Kubeflow).")] = None,
) -> None:
    """Send a compiled pipeline to a Kubeflow Pipelines endpoint as a new run (kfp.Client)."""
    from heteroflow.pipelines.kfp.submit import submit_package

    try:
        result = submit_package(
            package, host=host, arguments=_parse_pairs(param or []), experiment=experiment, run_name=run_name, namespace=namespace
        )
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
        return
    console.print(f"submitted run {result['run_id']} to {host}: {result['url']}", highlight=False)


PLUGIN_GROUP = "heteroflow.cli"
"""Entry-point group of command groups that higher layers add (``dags`` adds ``heteroflow airflow``): each entry
names a ``typer.Typer`` whose name is the sub-command. Loaded at start-up when the command line may name one
(:func:`_needs_plugins`), so nothing here imports them."""


def _needs_plugins(args: list[str]) -> bool:
    """Whether the command line ``args`` may name a plugin's command: it names no built-in command (``run``,
    ``runs``, ...) as its first word after the global options, as ``--help`` and a plugin's own command do. A
    built-in command skips the plugins' loading (``heteroflow airflow`` imports Airflow's DAG code: about 0.15 s of
    every ``heteroflow run``)."""
    from typer.main import get_command_name

    builtin = {info.name or get_command_name(info.callback.__name__) for info in app.registered_commands if info.callback}
    builtin |= {info.name for info in app.registered_groups if info.name}
    words = [w for w in args if w != "--debug"]
    return not words or words[0] not in builtin


def _add_plugins() -> None:
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        if any(info.name == entry.name for info in app.registered_groups):
            continue
        try:
            sub = entry.load()
        except ImportError as exc:  # an optional extra is missing: the command says so when used
            missing = typer.Typer(help=f"(unavailable: {exc})")

            @missing.callback(invoke_without_command=True)
            def _unavailable(_exc: str = str(exc), _name: str = entry.name) -> None:
                err_console.print(f"[bold red]error:[/] heteroflow {_name} needs {_exc}; install its extra", highlight=False)
                raise typer.Exit(code=2)

            sub = missing
        app.add_typer(sub, name=entry.name)


def _exit_now(code: Any) -> None:
    """End the process with ``code`` (a :class:`SystemExit` code) once its work is done and written: the exit
    functions run (logging's flush, ``atexit`` and ``weakref.finalize`` callbacks, multiprocessing's), output is
    flushed, then ``os._exit`` skips the interpreter's teardown of every module (kfp, protobuf, matplotlib:
    0.3-0.4 s after ``heteroflow run`` here), which has nothing left to do; step processes end the same way
    (:mod:`heteroflow.components.core.runtime`)."""
    import atexit
    import os

    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)  # what the interpreter does with a SystemExit("message")
        code = 1
    atexit._run_exitfuncs()  # noqa: SLF001 - what Py_Finalize runs first; public since Python 2 in all but name
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe (heteroflow runs | head): nothing more can arrive
            code = code or 120  # the interpreter's own status when flushing stdout fails at exit
    os._exit(code)


def console_script() -> None:
    """The ``heteroflow`` console script (entered through :func:`heteroflow.pipelines.cli.script.console_script`):
    :func:`main`, then the process ends without the interpreter's teardown (:func:`_exit_now`). Code that calls the CLI in its own process (a notebook, a test) calls :func:`main`,
    which ends with :class:`SystemExit` as usual."""
    _state["console_script"] = True
    try:
        main()
    except SystemExit as done:
        _exit_now(done.code)
    _exit_now(0)


def hoist_debug(args: list[str]) -> list[str]:
    """``args`` with ``--debug`` moved to the front: it is a global option, and users put it after the command
    (``heteroflow predict digits-mlp x.csv --debug``), where click would refuse it as "No such option". Words
    after ``--`` are left alone."""
    cut = args.index("--") if "--" in args else len(args)
    if "--debug" not in args[:cut]:
        return list(args)
    return ["--debug", *(w for w in args[:cut] if w != "--debug"), *args[cut:]]


def main() -> None:
    """The CLI: an unexpected error prints one line and where its traceback is (``heteroflow --debug ...``
    prints it).

    Raises:
        SystemExit: the command's exit status (0 ok, 1 an unexpected error, 2 bad usage or input, as each command
            documents).
    """
    import warnings

    sys.argv[1:] = hoist_debug(sys.argv[1:])
    if _needs_plugins(sys.argv[1:]):
        _add_plugins()
    warnings.showwarning = _show_warning
    try:
        app(standalone_mode=True)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the last resort: never a pretty traceback by default
        if _state["debug"] or "--debug" in sys.argv:
            raise
        with tempfile.NamedTemporaryFile("w", prefix="heteroflow-error-", suffix=".txt", delete=False) as fh:
            traceback.print_exception(exc, file=fh)
        words = [w for w in sys.argv[1:] if w != "--debug"]
        command = words[0] if words and not words[0].startswith("-") else "COMMAND"
        err_console.print(  # --debug is a global option, accepted anywhere before `--` (hoist_debug)
            f"[bold red]error:[/] unexpected {type(exc).__name__}: {escape(_one_line(exc))} "
            f"(traceback in {fh.name}; rerun as `heteroflow --debug {escape(command)} ...` to print it)",
            highlight=False,
        )
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
