"""Training on the command line: ``heteroflow profile`` (N training steps under ``torch.profiler`` -> a JSON profile).

Registered in :mod:`heteroflow.pipelines.cli.main` with::

    from heteroflow.pipelines.cli.train import profile_command
    app.command("profile")(profile_command)

Errors print one line; a user error (a bad parameter, a factory that cannot be imported, bad data) exits 2.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from heteroflow.pipelines.cli.cache import _fail

__all__ = ["profile_command"]

console = Console(soft_wrap=True)

_ALIASES = {"model": "model_factory"}
"""The default pipeline's names of train's parameters (``--param model=...`` as with ``heteroflow run``)."""


def profile_command(
    dataset: Annotated[
        Optional[str],
        typer.Option(help="Data set folder or fsspec URL (prewarmed and preprocessed first), or preprocess output. Default: the digits sample."),
    ] = None,
    param: Annotated[
        Optional[list[str]],
        typer.Option("--param", "-p", help="Training parameter NAME=VALUE (repeatable): model, model_args, batch_size, precision, ..."),
    ] = None,
    steps: Annotated[int, typer.Option(help="Training steps timed, then profiled.")] = 20,
    device: Annotated[str, typer.Option(help="Torch device: cpu, cuda, cuda:N, npu.")] = "cpu",
    output: Annotated[Path, typer.Option("--output", "-o", help="JSON profile to write.")] = Path("profile.json"),
) -> None:
    """Profile a few training steps with torch.profiler: time share per operator, key operators (>= 10%), peak
    memory and samples/s, written as JSON (the `training_profile` parameter of plan and train takes it:
    heteroflow run --param training_profile=profile.json)."""
    from heteroflow.cache.errors import HeteroflowError
    from heteroflow.components.training.profiling import check_profile_params, profile_training
    from heteroflow.components.training.step import TRAIN

    aliased: dict[str, str] = {}  # model_factory -> model, when given as --param model=...
    try:
        kwargs: dict[str, object] = {}
        for item in param or []:
            key, sep, value = item.partition("=")
            if key.strip() in _ALIASES:
                aliased[_ALIASES[key.strip()]] = key.strip()
            key = _ALIASES.get(key.strip(), key.strip())
            if not sep:
                raise ValueError(f"--param {item!r} is not NAME=VALUE")
            if key not in TRAIN.param_names:
                from heteroflow.components.errors import did_you_mean

                valid = sorted({*TRAIN.param_names, *_ALIASES})
                raise ValueError(f"--param {key}: not a parameter of train{did_you_mean([key], valid)}; valid: {', '.join(valid)}")
            kwargs[key] = TRAIN.param(key).coerce(value)  # the type the step declares
        check_profile_params(steps=steps, **kwargs)  # before the data set is prewarmed and preprocessed (seconds)
        with tempfile.TemporaryDirectory(prefix="heteroflow-profile-") as scratch:
            shards = _preprocessed(dataset, Path(scratch))
            result = profile_training(shards, output, steps=steps, device=device, **kwargs)  # type: ignore[arg-type]
    except (HeteroflowError, ValueError, OSError) as exc:
        text = _as_given(str(exc), aliased)
        _fail(ValueError(text) if text != str(exc) else exc)
        return
    key = ", ".join(f"{o['name']} {o['share']:.0%}" for o in result["operators"] if o["share"] >= 0.10)
    console.print(
        f"profile: {result['samples_per_second']:.0f} samples/s on {result['device']} ({result['precision']}), "
        f"{result['step_seconds'] * 1000:.2f} ms/step; key operators: {key or 'none >= 10%'}; "
        f"peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB ({result['peak_memory_of']}); wrote {output}",
        highlight=False,
    )


def _as_given(text: str, aliased: dict[str, str]) -> str:
    """``text`` with each problem said by train's name of a parameter the user gave by the pipeline's name
    (``model_factory``) headed by that name too: ``model (train's model_factory): model_factory ...``; each line of
    a message that lists several problems (``- ...``), or the message itself."""
    import re

    def named(line: str) -> str:
        body = line[2:] if line.startswith("- ") else line
        for name, given in aliased.items():
            if re.match(rf"{re.escape(name)}\b", body):
                return f"{line[: len(line) - len(body)]}{given} (train's {name}): {body}"
        return line

    return "\n".join(named(line) for line in text.split("\n"))


def _preprocessed(dataset: str | None, scratch: Path) -> Path:
    """Preprocess output for ``dataset``: itself when it is one, else prewarmed (into the cache tier) and
    preprocessed into ``scratch``."""
    from heteroflow.cache.prewarm import prewarm_dataset
    from heteroflow.components.data.datasets import export_digits
    from heteroflow.components.data.preprocess import preprocess

    if dataset and (Path(dataset).expanduser() / "meta.json").is_file():
        return Path(dataset).expanduser()
    source = dataset or str(export_digits())
    prewarm_dataset(source, str(scratch / "dataset"))
    preprocess(str(scratch / "dataset"), scratch / "shards", num_workers=1)
    return scratch / "shards"
