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
    memory and samples/s, written as JSON (the plan step's `profile` parameter takes it)."""
    from heteroflow.cache.errors import HeteroflowError
    from heteroflow.components.training.profiling import profile_training
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
        with tempfile.TemporaryDirectory(prefix="heteroflow-profile-") as scratch:
            shards = _preprocessed(dataset, Path(scratch))
            result = profile_training(shards, output, steps=steps, device=device, **kwargs)  # type: ignore[arg-type]
    except (HeteroflowError, ValueError, OSError) as exc:
        name = next((n for n in aliased if str(exc).startswith(n)), None)
        if name is not None:  # said by train's name (model_factory): say the name the user gave too
            exc = ValueError(f"{aliased[name]} (train's {name}): {exc}")
        _fail(exc)
        return
    key = ", ".join(f"{o['name']} {o['share']:.0%}" for o in result["operators"] if o["share"] >= 0.10)
    console.print(
        f"profile: {result['samples_per_second']:.0f} samples/s on {result['device']} ({result['precision']}), "
        f"{result['step_seconds'] * 1000:.2f} ms/step; key operators: {key or 'none >= 10%'}; "
        f"peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB ({result['peak_memory_of']}); wrote {output}",
        highlight=False,
    )


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
