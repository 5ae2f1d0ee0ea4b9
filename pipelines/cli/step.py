"""``heteroflow step NAME``: run one step in this process (what pods and Airflow tasks run), print its outcome as
one JSON line and exit with its failure class (:data:`heteroflow.components.core.runtime.EXIT_CODES`).

Registered in :mod:`heteroflow.pipelines.cli.main` with ``app.command("step")(step_)``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from heteroflow.components.errors import HeteroflowError, InvalidParameter
from heteroflow.pipelines.cli.common import _fail, _parse_pairs, err_console

__all__ = ["step_"]


def _resolve_step(name: str) -> Any:
    from heteroflow.components.core.step import load_step
    from heteroflow.components.steps import DEFAULT_STEPS

    if ":" in name:
        import os
        import sys

        if os.getcwd() not in sys.path and "" not in sys.path:  # a module beside the user, as run --pipeline finds it
            sys.path.insert(0, os.getcwd())
        return load_step(name)
    for s in DEFAULT_STEPS:
        if s.name == name:
            return s
    raise InvalidParameter(
        f"step {name!r} is unknown; valid: {', '.join(s.name for s in DEFAULT_STEPS)}, or module:attribute of your own Step"
    )


def step_(
    name: Annotated[str, typer.Argument(help="A shipped step (prewarm, preprocess, plan, train, evaluate, archive) or module:attribute of a Step.")],
    param: Annotated[Optional[list[str]], typer.Option("--param", "-p", help="Step parameter NAME=VALUE (repeatable).")] = None,
    input_: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="Input artifact NAME=PATH (repeatable).")] = None,
    output: Annotated[Optional[list[str]], typer.Option("--output", "-o", help="Output artifact NAME=PATH (repeatable).")] = None,
    candidate: Annotated[
        Optional[str],
        typer.Option(help='Candidate to run on: KIND[:key=value,...] or JSON {"index": k, "resources": {...}}. Default: the step\'s first.'),
    ] = None,
    call: Annotated[Optional[str], typer.Option(help="The call's name in its pipeline (names the attempt records).")] = None,
    placements: Annotated[Optional[str], typer.Option(help="Planner steps: JSON {call: candidates JSON} to place.")] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="Run folder for attempt records (default $HETEROFLOW_RUN_DIR).")] = None,
    outcome_file: Annotated[
        Optional[Path], typer.Option("--outcome", help="Write the outcome as JSON here (e.g. /airflow/xcom/return.json).")
    ] = None,
) -> None:
    """Run one step in this process and exit with its failure class.

    Exit status: 0 succeeded, 2 usage error, 3 permanent failure (do not retry), 4 device failure (fall back to the
    next candidate), 5 transient failure (retry with backoff), 130 interrupted. The outcome (status, failure
    class, reason, candidate, facts, output metadata) is printed as one JSON line on stdout.
    """
    from heteroflow.components.core.runtime import LocalArtifact, candidate_from_json, run_step

    try:
        the_step = _resolve_step(name)
        inputs = _parse_pairs(input_ or [], option="--input")
        outputs = {k: LocalArtifact(v) for k, v in _parse_pairs(output or [], option="--output").items()}
        index, resources = candidate_from_json(candidate) if candidate else (None, None)
        outcome = run_step(
            the_step,
            call=call,
            params=_parse_pairs(param or []),
            inputs=inputs,
            outputs=outputs,
            candidate=resources,
            candidate_index=index,
            placements=json.loads(placements) if placements else None,
            run_dir=run_dir,
        )
    except (HeteroflowError, OSError, ValueError) as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None
    data = outcome.to_dict()
    data["outputs"] = {k: {"path": a.path, "metadata": a.metadata} for k, a in outputs.items()}
    text = json.dumps(data, default=str, sort_keys=True)
    if outcome_file is not None:
        try:
            outcome_file.parent.mkdir(parents=True, exist_ok=True)
            partial = outcome_file.with_name(f".{outcome_file.name}.{os.getpid()}.tmp")
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, outcome_file)  # whole or absent: others read it while this process runs (#29)
        except OSError as exc:
            _fail(exc)
    print(text)
    if outcome.status != "succeeded":
        err_console.print(f"step {outcome.call} failed ({outcome.failure}): {escape(outcome.reason or '')}", highlight=False)
    raise typer.Exit(code=outcome.exit_code)

