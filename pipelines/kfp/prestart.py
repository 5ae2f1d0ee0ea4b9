"""Prestarted step processes for kfp.local: each task still gets a fresh process of its own, started ahead of time.

kfp.local's ``SubprocessRunner`` starts a lightweight component's task as
``sh -ec 'program_path=$(mktemp -d); printf "%s" "$0" > "$program_path/ephemeral_component.py";
_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main --component_module_path ... "$@"' SOURCE ARGS...``, and that
process then spends 0.2-0.45 s (2 cores) starting the interpreter and importing kfp's executor, heteroflow's
runtime and the step's module before the step function runs, all on the run's critical path: a task cannot start
before the tasks it reads from have ended.

A :class:`WarmPool` starts those processes before they are needed, as Ray's raylet prestarts Python workers ahead of
tasks (its worker pool; ``num_prestart_python_workers``, ``enable_worker_prestart``): each runs :func:`main`, which imports kfp's executor and the modules given to it, then waits on its standard input. When
kfp.local hands a task to its subprocess handler, :meth:`WarmPool.run` gives that task's program (the component
source and the executor's arguments from the command above) to one waiting process, which does what the shell
command would (writes the source to ``ephemeral_component.py`` in a fresh ``mkdtemp`` folder, then runs
``kfp.dsl.executor_main`` as ``__main__`` with the same arguments), and streams its output as kfp's
``run_local_subprocess`` does. The pool starts the next one, one at a time, while a CPU core is idle
(:data:`MIN_IDLE_CORES`). What stays as in kfp.local:

- one process per task attempt, never reused: it exits when its task ends (the exit status is the task's);
- the task's environment: the task's variables are set in the process before its program runs. A process is used
  only if its environment when it started (``_KFP_RUNTIME=true`` added, as kfp's command adds it) differs from the
  task's in :data:`TASK_VARIABLES` alone (the run's step contract, :data:`heteroflow.pipelines.environment.CONTRACT`,
  and ``TMPDIR``, none of which a preloaded module reads when imported: tested) and its working directory is the
  task's; otherwise the task starts its own;
- anything but a lightweight component's exact command (packages to install, a container component, another kfp
  version's template) starts its own process, as kfp starts it.

What differs: the modules given to the pool are imported before kfp's executor sets up logging rather than during
the task, so only heteroflow's own modules and numpy are preloaded (a user's step module is imported by its task, since
importing it runs the user's code); and standard input is ``/dev/null`` during the task (a step reads none).

The ``heteroflow`` console script starts its pool (:func:`start_early`) when its command line asks for a run on
kfp.local, before it imports the command line, the pipeline and kfp (:mod:`heteroflow.pipelines.cli.script`): about a
second of the driver's own start that these processes' start overlaps;
:func:`heteroflow.pipelines.kfp.local.run_local` takes that pool over (:func:`take_early`) or starts its own.

``HETEROFLOW_PRESTART`` (default ``3``) sets how many processes wait at once; ``0`` turns prestarting off.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PRESTART_ENV",
    "TASK_VARIABLES",
    "WarmPool",
    "idle_cores_meter",
    "lightweight_program",
    "main",
    "prestart_size",
    "start_early",
    "take_early",
]

PRESTART_ENV = "HETEROFLOW_PRESTART"
"""How many prestarted step processes wait at once during a kfp.local run (``0``: none)."""

DEFAULT_SIZE = 3
"""Three: the default pipeline's first three step tasks (plan beside prewarm, then preprocess) can each find one
ready when the command line starts the pool early; on 2 cores about two are ready by then (they start one at a time
on the core the driver leaves idle)."""

DEFAULT_PRELOAD: tuple[str, ...] = ("numpy", "heteroflow.components.core.runtime", "heteroflow.components.steps")
"""What an early pool preloads before the pipeline is known: numpy (the shipped data steps import it when they run;
their modules do not, so that defining a pipeline stays light), heteroflow's runtime and the shipped steps."""

_TASK_VARIABLES: frozenset[str] | None = None


def _task_variables() -> frozenset[str]:
    """:data:`TASK_VARIABLES`, read from :mod:`heteroflow.pipelines.environment` when first needed: this module is
    imported before anything else of a ``heteroflow run`` (:mod:`heteroflow.pipelines.cli.script`), so that its
    pool starts without waiting for the step contract's modules (~0.1 s of imports the command line does later)."""
    global _TASK_VARIABLES
    if _TASK_VARIABLES is None:
        from heteroflow.pipelines.environment import CONTRACT

        _TASK_VARIABLES = frozenset({*CONTRACT, "TMPDIR"})
    return _TASK_VARIABLES


def __getattr__(name: str) -> Any:
    """``TASK_VARIABLES``: the variables a task's environment may set unlike a waiting process's: the step contract
    (:data:`heteroflow.pipelines.environment.CONTRACT`: the run folder and id, the driver's pid, the testing
    settings) and ``TMPDIR`` (kfp.local's scratch folder in the run folder). Computed on first use
    (:func:`_task_variables`)."""
    if name == "TASK_VARIABLES":
        return _task_variables()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_EXECUTOR_MODULE = "kfp.dsl.executor_main"


def prestart_size(environ: Mapping[str, str] | None = None) -> int:
    """The pool size ``HETEROFLOW_PRESTART`` asks for (default :data:`DEFAULT_SIZE`).

    Raises:
        ValueError: the variable is not a whole number >= 0 (the message names it and what is valid).
    """
    text = (os.environ if environ is None else environ).get(PRESTART_ENV, "").strip()
    if not text:
        return DEFAULT_SIZE
    try:
        size = int(text)
    except ValueError:
        size = -1
    if size < 0:
        raise ValueError(f"{PRESTART_ENV}={text!r} is not valid; valid: a whole number >= 0 (0 turns prestarting off)")
    return size


_TEMPLATE: list[str] | None = None


def _lightweight_template() -> list[str]:
    """The first three words of kfp's lightweight component command (``sh``, ``-ec``, the script), as this kfp
    version writes it (taken from kfp itself, so another version's template is simply not recognised)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        from kfp.dsl import component_factory

        def probe() -> None:  # any function: only the command's fixed part is kept
            pass

        command, _ = component_factory._get_command_and_args_for_lightweight_component(probe)
        _TEMPLATE = list(command[:3])
    return _TEMPLATE


def lightweight_program(full_command: Sequence[str], executable: str = sys.executable) -> tuple[str, list[str]] | None:
    """``(component source, executor arguments)`` of a kfp.local lightweight-component command, or None for any
    other command.

    Args:
        full_command: the command as kfp.local's ``SubprocessTaskHandler`` holds it: as the component has it
            (``python3``), or after kfp.local's ``replace_python_executable`` put ``executable`` in its place.
        executable: the Python that kfp.local runs the command with (``sys.executable`` without a venv).
    """
    template = _lightweight_template()
    if len(full_command) < 4 or list(full_command[:2]) != template[:2]:
        return None
    if full_command[2] not in (template[2], template[2].replace("python3", executable)):
        return None
    return full_command[3], list(full_command[4:])


READY = "heteroflow-prestart: ready"
"""The line a prestarted process prints once its modules are imported (read by the pool, never by a task)."""

MIN_IDLE_CORES = 0.75
"""A process is started only when at least this many cores were idle over the last :data:`POLL_SECONDS`: it uses a
core the run leaves idle (the driver's own start, a step importing torch on one core), never one a step computes
on (preprocess and training use every core)."""

POLL_SECONDS = 0.1
"""How often the pool looks at the CPU's idle time while it has fewer than its size ready."""

TAKE_WAIT_SECONDS = 10.0
"""The longest a task waits for a process that is importing (it would take as long to start its own)."""


@dataclass(eq=False)
class _Prestarted:
    process: subprocess.Popen[str]
    environ: dict[str, str]
    cwd: str
    early_output: list[str] = field(default_factory=list)
    """Lines it printed before it was ready (an import's warning): the task's output starts with them."""


def idle_cores_meter() -> Callable[[], float]:
    """A function returning the cores idle since its previous call (idle and iowait time over wall time, from
    ``psutil.cpu_times()``, the whole machine's); its first call returns 0."""
    import psutil

    cores = psutil.cpu_count() or 1
    last = [psutil.cpu_times()]

    def idle() -> float:
        now = psutil.cpu_times()
        before, last[0] = last[0], now
        total = sum(now) - sum(before)
        if total <= 0:
            return 0.0
        waiting = (now.idle - before.idle) + (getattr(now, "iowait", 0.0) - getattr(before, "iowait", 0.0))
        return cores * waiting / total

    idle()
    return idle


class WarmPool:
    """Step processes started ahead of the kfp.local tasks that will use them (see the module docstring).

    A background thread starts them one at a time, each only when :data:`MIN_IDLE_CORES` cores were idle, until
    ``size`` are ready; a task takes a ready one (or waits for the one importing), and the thread starts the next.

    Args:
        size: how many are kept ready (0: the pool starts nothing and :meth:`run` always returns None).
        preload: modules each process imports before it is ready (heteroflow's own and numpy: importing a module
            runs it).
        executable: the Python to start (kfp.local's, ``sys.executable``).
        idle_cores: returns the cores idle since its previous call (default: the machine's, from psutil).
        limit: the most tasks the run has for it (None: no limit; :meth:`set_limit`): processes are started
            only while the tasks that asked for one so far plus those ready are fewer, so none is started that no
            task will take (a process imports for ~0.4 s of CPU, on a core the run's last steps and its report then share).

    Use it as a context manager (or call :meth:`start` and :meth:`close`): processes not used are killed at the
    end. Thread-safe: kfp.local runs independent tasks from several threads.
    """

    def __init__(
        self,
        size: int = DEFAULT_SIZE,
        preload: Sequence[str] = (),
        executable: str = sys.executable,
        *,
        idle_cores: Callable[[], float] | None = None,
        limit: int | None = None,
    ) -> None:
        self.size = size
        self.limit = limit
        self.preload = tuple(preload)
        self.executable = executable
        self.started = 0
        """Processes started so far."""
        self.used = 0
        """Tasks that ran in a prestarted process."""
        self._asked = 0
        self._idle_cores = idle_cores
        self._ready: list[_Prestarted] = []
        self._starting: _Prestarted | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WarmPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **(extra or {}), "_KFP_RUNTIME": "true"}

    def set_limit(self, limit: int | None) -> None:
        """Set :attr:`limit`: the most tasks the run has for this pool, those that asked already included (None:
        no limit)."""
        with self._cond:
            self.limit = limit
            self._cond.notify_all()

    def _enough(self) -> bool:
        """Whether no process is to be started now: ``size`` are ready, or the tasks that asked for one (taken or
        started their own) plus those ready reach :attr:`limit` (called holding the lock)."""
        return len(self._ready) >= self.size or (self.limit is not None and self._asked + len(self._ready) >= self.limit)

    def start(self) -> None:
        """Start the thread that starts the processes (idempotent; nothing with ``size`` 0)."""
        with self._cond:
            if self.size <= 0 or self._closed or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._fill, name="heteroflow-prestart", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        idle = self._idle_cores or idle_cores_meter()
        while True:
            with self._cond:
                if self._closed:
                    return
                if self._enough():
                    self._cond.wait()  # until a task takes one (or the pool closes, or the limit changes)
                    continue
            if idle() < MIN_IDLE_CORES:
                with self._cond:
                    self._cond.wait(POLL_SECONDS)
                continue
            env = self._environ()
            process = subprocess.Popen(
                [self.executable, "-m", __name__, *self.preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                env=env,
            )
            prestarted = _Prestarted(process, env, os.getcwd())
            with self._cond:
                self.started += 1
                self._starting = prestarted
                closed = self._closed
            ready = not closed and _await_ready(prestarted)
            with self._cond:
                self._starting = None
                ready = ready and not self._closed
                if ready:
                    self._ready.append(prestarted)
                self._cond.notify_all()
            if not ready:
                _kill([prestarted])
            idle()  # its own import is not idle time of the run

    def _take(self, env: dict[str, str]) -> _Prestarted | None:
        """A ready process whose environment differs from ``env`` in :data:`TASK_VARIABLES` alone, in this working
        directory, waiting for the one importing if none is; the others (the environment changed otherwise since
        they started, or they died) are killed."""
        cwd = os.getcwd()
        found: _Prestarted | None = None
        stale: list[_Prestarted] = []
        deadline = time.monotonic() + TAKE_WAIT_SECONDS
        with self._cond:
            self._asked += 1  # a task of the run, whether it gets a process or starts its own
            while not self._closed:
                for prestarted in list(self._ready):
                    self._ready.remove(prestarted)
                    if prestarted.process.poll() is not None or not _compatible(prestarted.environ, env) or prestarted.cwd != cwd:
                        stale.append(prestarted)
                    else:
                        found = prestarted
                        break
                starting = self._starting
                remaining = deadline - time.monotonic()
                if found is not None or starting is None or remaining <= 0:
                    break
                if not _compatible(starting.environ, env) or starting.cwd != cwd:
                    break
                self._cond.wait(remaining)
            self._cond.notify_all()  # the filling thread starts the next one
        _kill(stale)
        return found

    def run(self, full_command: Sequence[str], env_vars: Mapping[str, str] | None = None) -> int | None:
        """Run a kfp.local task's command in a prestarted process, printing its output lines as kfp.local does.

        Args:
            full_command: the task's command (see :func:`lightweight_program`).
            env_vars: the task's own variables (kfp.local's ``env_vars``), over this process's environment.

        Returns:
            The process's exit status (the task's), or None when the task must start its own process: not a
            lightweight component's command, no process ready (nor one importing) with the task's environment,
            or the pool is empty or closed.
        """
        if self.size <= 0 or self._closed:
            return None
        program = lightweight_program(full_command, self.executable)
        if program is None:
            return None
        env = self._environ(env_vars)
        prestarted = self._take(env)
        if prestarted is None:
            return None
        source, args = program
        process = prestarted.process
        try:
            assert process.stdin is not None
            process.stdin.write(json.dumps({"source": source, "args": args, "environ": env}) + "\n")
            process.stdin.close()
        except OSError:  # it died while waiting: the task starts its own process
            _kill([prestarted])
            return None
        with self._cond:
            self.used += 1
        with process:
            for line in prestarted.early_output:
                print(line, end="")
            if process.stdout:
                for line in iter(process.stdout.readline, ""):
                    print(line, end="")
                print("\n")  # as kfp's run_local_subprocess separates a task's lines from what follows
            return process.wait()

    def close(self) -> None:
        """Kill the processes not used (they hold nothing yet) and stop the thread; later :meth:`run` calls return
        None."""
        with self._cond:
            self._closed = True
            unused, self._ready = self._ready, []
            starting = self._starting
            self._cond.notify_all()
            thread = self._thread
        _kill(unused)
        if starting is not None:  # the filling thread reads its output: it sees the end and cleans up after it
            with contextlib.suppress(OSError):
                starting.process.kill()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)


def _await_ready(prestarted: _Prestarted) -> bool:
    """Read a starting process's output up to its :data:`READY` line (earlier lines kept for its task); False when
    it ended first."""
    stdout = prestarted.process.stdout
    if stdout is None:
        return False
    try:
        for line in iter(stdout.readline, ""):
            if line.rstrip("\n") == READY:
                return True
            prestarted.early_output.append(line)
    except (OSError, ValueError):  # killed and its pipe closed
        return False
    return False


def _compatible(started: Mapping[str, str], task: Mapping[str, str]) -> bool:
    """Whether a process started with ``started`` can run a task whose environment is ``task``: they differ in
    :data:`TASK_VARIABLES` alone."""
    variables = _task_variables()
    return all(started.get(k) == task.get(k) for k in started.keys() | task.keys() if k not in variables)


_EARLY: WarmPool | None = None
_EARLY_LOCK = threading.Lock()


def start_early(size: int | None = None, preload: Sequence[str] = DEFAULT_PRELOAD) -> None:
    """Start this process's pool now, for a kfp.local run about to be prepared (:func:`take_early` hands it over).

    ``size`` defaults to ``HETEROFLOW_PRESTART`` (a bad value starts nothing here: the run reports it). The pool is
    closed when this process exits, if no run took it. Does nothing when one is already started.
    """
    global _EARLY
    if size is None:
        try:
            size = prestart_size()
        except ValueError:
            return
    with _EARLY_LOCK:
        if _EARLY is not None or size <= 0:
            return
        _EARLY = WarmPool(size, preload=tuple(preload))
    _EARLY.start()
    import atexit

    atexit.register(_close_early)


def take_early() -> WarmPool | None:
    """The pool :func:`start_early` started, now the caller's to close; None when there is none."""
    global _EARLY
    with _EARLY_LOCK:
        pool, _EARLY = _EARLY, None
    return pool


def _close_early() -> None:
    pool = take_early()
    if pool is not None:
        pool.close()


def _kill(processes: Iterable[_Prestarted]) -> None:
    for prestarted in processes:
        process = prestarted.process
        with contextlib.suppress(OSError):
            process.kill()
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError, ValueError):
                if pipe:
                    pipe.close()
        process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """A prestarted process: import ``argv``'s modules, wait for one task on standard input, run it, exit.

    The task is one JSON line ``{"source": ..., "args": [...]}`` (the component source and the executor arguments
    of kfp's command); an empty standard input (the pool closed) ends the process with 0. The task runs as kfp's
    ``sh -ec`` command runs it: the source written to ``<mkdtemp>/ephemeral_component.py``, then
    ``kfp.dsl.executor_main`` run as ``__main__`` (``runpy``, as ``python -m`` runs it) with
    ``--component_module_path`` and the arguments; its exceptions and ``SystemExit`` end this process as they
    would end kfp's.
    """
    import importlib

    for name in (_EXECUTOR_MODULE, *(sys.argv[1:] if argv is None else argv)):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not imported now: the task imports it and reports its error as usual
            pass
    print(READY, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    task: dict[str, Any] = json.loads(line)
    environ: dict[str, str] = task.get("environ") or dict(os.environ)
    for name in set(os.environ) - set(environ):
        del os.environ[name]
    os.environ.update(environ)  # the task's environment (differing in TASK_VARIABLES alone: checked by the pool)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    import runpy
    import tempfile

    tempfile.tempdir = None  # resolved again from the task's TMPDIR
    program_path = tempfile.mkdtemp(prefix="prestarted.")  # kfp.log names it: the task ran in a prestarted process
    component = os.path.join(program_path, "ephemeral_component.py")
    with open(component, "w", encoding="utf-8") as fh:
        fh.write(task["source"])
    sys.argv = [_EXECUTOR_MODULE, "--component_module_path", component, *task["args"]]
    # `python -m` runs the module as __main__ only (its imports stay preloaded): without this, runpy warns in
    # every task's log that it found the module imported already
    sys.modules.pop(_EXECUTOR_MODULE, None)
    runpy.run_module(_EXECUTOR_MODULE, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
