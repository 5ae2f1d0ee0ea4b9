"""Shared fixtures. Every test gets its own ``HETEROFLOW_HOME`` so nothing touches ``~/.cache/heteroflow``."""

from __future__ import annotations

import os

# One OpenMP thread per process unless the caller set OMP_NUM_THREADS: the suite runs three pytest-xdist workers on a
# 2-core machine, each starting step processes and training workers, so every core already has a process on it.
# With torch's default (one intra-op thread per core) each training's second thread spin-waits for a core another
# process holds: the in-process digits training of tests/test_steps.py took 7-17 s of CPU in the whole suite against
# about 1 s alone. This is batches.train_threads' advice for an oversubscribed host; it is set before torch is
# imported (libgomp reads it when it loads), and the processes the tests start inherit it. Tests of the thread
# count itself set or remove it with monkeypatch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from heteroflow.components.data.datasets import export_digits  # noqa: E402


# pytest-xdist's workers run with COLUMNS=80 and LINES=24 in their environment; the CLI's rich consoles are made at
# import and would keep 80 columns for the whole session (tables squeezed, cells wrapped), unlike a plain `pytest`.
# Workers see the environment a serial run sees, so `pytest -n 2` and `pytest` give the same output to the tests.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


def _kfp_stack_without_sources() -> None:
    """KFP's resource setters (``set_cpu_limit``, ``set_accelerator_type`` ...) call
    ``PipelineTask._ensure_container_spec_exists``, which calls ``inspect.stack()`` only to read its caller's name
    (``inspect.stack()[1][3]``) for an error message. ``inspect.stack`` reads the source of every frame, and under
    pytest (60 frames deep, thousands of modules for ``inspect.getmodule`` to scan) that took ~35 ms per call: 9 of
    test_kfp_resources.py's 12 CPU-s, paid again by every test that builds a KFP task outside
    ``heteroflow.pipelines.kfp.render.to_kfp`` (which applies heteroflow's own cheap check). Here kfp's module sees an
    ``inspect`` whose ``stack()`` returns the same frames, names and line numbers without reading source lines; kfp's
    check itself, message included, runs as is (tests/test_kfp_patches.py tests it)."""
    import inspect
    import types

    from heteroflow.pipelines.kfp.patches import import_kfp

    try:
        import_kfp()  # as heteroflow imports kfp: kfp.client left to first use
        from kfp.dsl import pipeline_task
    except ImportError:  # kfp not installed, or hidden (tests/test_optional_deps.py)
        return

    class _Inspect(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            return getattr(inspect, name)

        @staticmethod
        def stack(context: int = 1) -> list[inspect.FrameInfo]:
            frames, frame = [], sys._getframe(1)
            while frame is not None:
                frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None, None))
                frame = frame.f_back
            return frames

    if getattr(pipeline_task, "inspect", None) is inspect:
        pipeline_task.inspect = _Inspect("inspect")


_kfp_stack_without_sources()


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many pytest-xdist workers ``-n auto`` (pyproject.toml's addopts) starts: three for a run of the whole
    suite (no path given: pytest runs ``testpaths``, with or without ``-m``) on a machine with two CPUs or more; none
    (one process, as without xdist) when paths are given (``pytest tests/test_x.py -k y``: no workers to start, ``-s``
    and ``--pdb`` work) or with ``-s``. ``-n N`` or ``PYTEST_XDIST_AUTO_NUM_WORKERS=N`` choose N, ``-n 0`` none.

    Three on two cores: the suite's tests spend about a seventh of their time waiting, not computing (a dropped
    kind's heartbeats and rendezvous, Airflow's polling, retry back-offs, a run held past its timeout). With two
    workers the host was idle for it: 177% CPU, 12 min 25 s - 13 min 0 s for the whole suite; with three, the same
    hour, 191% and 11 min 20 s (per-test CPU and wall time summed per worker, 2,292 tests, no failures)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS or config.getoption("capture") == "no":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 3 if cpus >= 2 else 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the test files that hold ``slow`` tests run first (each file's tests kept together and in
    their order), the files of quick tests last. xdist hands tests out in collection order (``--dist loadgroup``:
    one test at a time, ``xdist_group``s first), so in file order a minute-long test collected late (test_user_*,
    test_training_*) ran alone on one worker while the others had finished: a core idle at the suite's end. Quick
    tests at the end even out the workers' last minutes. A run without workers (``-n 0``, paths given) keeps
    file order. Deterministic: every worker collects the same order, as xdist requires.

    Also makes ``@pytest.mark.xdist_group`` work again: pytest-xdist 3.8 marks a grouped test by appending
    ``@<group>`` to ``item._nodeid``, which pytest 9 no longer reads (a node's id is ``item._id``), so with
    pytest 9.2 grouped tests were spread over the workers like any others. Here the suffix goes on the id."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: file order within each part
    if not getattr(config.option, "loadgroup", False):  # set by xdist in its workers only
        return
    try:
        from _pytest.nodeid import coerce_node_id  # pytest >= 9; before it xdist's own suffix works
    except ImportError:
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(autouse=True)
def heteroflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HETEROFLOW_HOME", str(home))
    monkeypatch.delenv("HETEROFLOW_RUN_DIR", raising=False)
    return home


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real digits data set (1,797 samples) exported as CSV files, once per session. Treat as read-only."""
    return export_digits(tmp_path_factory.mktemp("digits-src") / "digits")


@pytest.fixture(scope="session")
def digits_shards(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> Path:
    """digits prewarmed and preprocessed (seed 0, 15% validation, 15% test), once per session. Read-only."""
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("digits-shards")
    result = prewarm(str(digits_dir), root / "cache")
    out = root / "shards"
    preprocess(result.manifest_path, out, seed=0, num_workers=1)
    return out


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory: pytest.TempPathFactory, digits_shards: Path) -> Path:
    """The model folder (``model.pt``, ``model.json``) of the built-in MLP trained 1 epoch on ``digits_shards`` (seed
    0), once per session. Read-only: a test that changes a model copies this folder first (``shutil.copytree``)."""
    from heteroflow.components.training.step import train

    root = tmp_path_factory.mktemp("digits-model")
    return train(digits_shards, root / "model", epochs=1, checkpoint_root=root / "checkpoints").model_dir


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Airflow's metadata database (SQLite ``airflow.db``) made by one real ``airflow db migrate`` per session (per
    xdist worker): a migrate costs about 5 s of CPU whether or not the database is current, so tests copy this file
    into their own ``AIRFLOW_HOME`` (``migrated_airflow_home``) instead of migrating again. Read-only."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    root = tmp_path_factory.mktemp("airflow-db-template")
    home, dags = root / "home", root / "dags"
    dags.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HETEROFLOW_SIMULATE_DEVICES", "HETEROFLOW_INJECT_FAULT")}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    airflow = str(Path(sys.executable).parent / "airflow")
    done = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"airflow db migrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (home / "airflow.db").is_file(), sorted(p.name for p in home.iterdir())
    return home / "airflow.db"


@pytest.fixture(scope="session")
def migrated_airflow_home(airflow_db_template: Path) -> Callable[[Path], Path]:
    """``make(home)``: ``home`` (made if missing) as an ``AIRFLOW_HOME`` holding a copy of the session's migrated
    database, ready for ``airflow dags reserialize`` / ``dags test`` / ``pools`` with no ``db migrate``. Returns
    ``home``. Each home gets its own copy: tests never share Airflow state."""

    def make(home: Path) -> Path:
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(airflow_db_template, home / "airflow.db")
        return home

    return make


# Pauses training at an observable point, in whatever process trains (a step subprocess of `heteroflow run`):
# right after the checkpoint.json of step >= $HETEROFLOW_TEST_PAUSE_AT_STEP is written, train sleeps up to
# $HETEROFLOW_TEST_PAUSE_SECONDS, so a test can signal the run while training is certainly unfinished (no race
# with a fast machine finishing training first). Loaded through PYTHONPATH as `sitecustomize`; it patches
# heteroflow.components.training.checkpoint once that module is imported, and does nothing in other processes.
_PAUSE_HOOK = '''
import importlib.abc, importlib.util, os, sys, time

_AT = int(os.environ.get("HETEROFLOW_TEST_PAUSE_AT_STEP", "0") or 0)


class _PauseTrain(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "heteroflow.components.training.checkpoint":  # where checkpoints are written (Checkpoint.save)
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real = module.atomic_write_bytes

            def write(target_path, data, *args, **kwargs):
                real(target_path, data, *args, **kwargs)
                if os.path.basename(target_path) == "checkpoint.json" and b'"step": ' in data:
                    import json
                    if json.loads(data)["step"] >= _AT:
                        time.sleep(float(os.environ.get("HETEROFLOW_TEST_PAUSE_SECONDS", "120")))

            module.atomic_write_bytes = write

        spec.loader.exec_module = exec_module
        return spec


if _AT:
    sys.meta_path.insert(0, _PauseTrain())
'''


@pytest.fixture()
def pause_train_at_checkpoint(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``env(step)``: environment variables under which train, in any process started with them, pauses (120 s)
    right after writing its checkpoint of step >= ``step``; the checkpoint file is the point a test waits for."""
    folder = tmp_path_factory.mktemp("pause-hook")
    (folder / "sitecustomize.py").write_text(_PAUSE_HOOK)

    def env(step: int, seconds: float = 120.0) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, "HETEROFLOW_TEST_PAUSE_AT_STEP": str(step), "HETEROFLOW_TEST_PAUSE_SECONDS": str(seconds)}

    return env
