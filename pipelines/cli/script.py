"""The ``heteroflow`` console script: the command line (:mod:`heteroflow.pipelines.cli.main`), started so that a kfp.local
run's step processes start first.

``heteroflow run`` on kfp.local, its default engine, starts its prestarted step processes
(:func:`heteroflow.pipelines.kfp.prestart.start_early`) before the command line is imported: importing and parsing it
(typer, rich, and typer's pydantic) takes about 0.4 s of the driver's start, which those processes' own start
overlaps on another core. The command line is read here as plain words, before typer parses it
(:func:`runs_on_kfp_local`); a wrong guess, such as a usage error that typer reports next, only starts processes that
the exit kills.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["console_script", "passive_openmp_waits", "runs_on_kfp_local"]


def passive_openmp_waits() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and the step processes it starts, unless it is set (then it
    is kept). Read by the OpenMP runtime when it loads (``import torch``), so it is set before anything imports torch.

    OpenMP's ``OMP_WAIT_POLICY`` (OpenMP API specification, environment variables): ``PASSIVE`` threads waiting for
    work sleep; by default libgomp's spin for a while first. On a host with more runnable work than cores (a shared
    2-core machine, or kfp.local's prestarted step processes starting beside train) a spinning thread holds a core
    that the thread it waits for needs: a new user's trial saw train's loop take 10-20x as long in some runs. Measured
    (digits MLP, 10 epochs, 2 torch threads, load average 1.7-2.3 on 2 cores): the loop took 1.3-4.7 s with the
    default and 0.2-0.3 s with ``PASSIVE`` (0.1 s with one thread, ``OMP_NUM_THREADS=1``). On idle cores a sleeping
    thread wakes in microseconds; set ``OMP_WAIT_POLICY=ACTIVE`` to keep spinning."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def runs_on_kfp_local(args: Sequence[str]) -> bool:
    """Whether the command line ``args`` (without the program name) asks for ``heteroflow run`` on kfp.local: the
    command ``run`` after the global options (``--debug``), without ``--help``, and an ``--engine`` that is
    ``kfp-local``, or absent while ``kfp-local`` is the default engine
    (:data:`heteroflow.pipelines.engines.registry.DEFAULT_ENGINE`)."""
    words = list(args)
    while words and words[0] == "--debug":
        words.pop(0)
    if not words or words[0] != "run":
        return False
    from heteroflow.pipelines.engines.registry import DEFAULT_ENGINE  # a light module: names only, no engine's runner

    engine = DEFAULT_ENGINE
    rest = words[1:]
    for i, word in enumerate(rest):
        if word == "--":
            break
        if word == "--help":
            return False
        if word == "--engine" and i + 1 < len(rest):
            engine = rest[i + 1]
        elif word.startswith("--engine="):
            engine = word.partition("=")[2]
    return engine == "kfp-local"


def console_script() -> None:
    """The ``heteroflow`` console script: starts a kfp.local run's step processes when the command line asks for one
    (:func:`runs_on_kfp_local`), then runs :func:`heteroflow.pipelines.cli.main.console_script`; OpenMP's waits
    passive in all of them (:func:`passive_openmp_waits`)."""
    passive_openmp_waits()
    if runs_on_kfp_local(sys.argv[1:]):
        from heteroflow.pipelines.kfp.prestart import start_early

        start_early()  # HETEROFLOW_PRESTART=0 starts none; a bad value starts none here and the run reports it
    from heteroflow.pipelines.cli.main import console_script as cli_console_script

    cli_console_script()


if __name__ == "__main__":  # pragma: no cover
    console_script()
