"""Worker processes never inherit a lock another thread held at the fork (issue #28.13): the in-process engine hung
about one run in fifteen when a forked preprocess worker imported pandas while the engine's other thread was inside
an import. The input kept here starts a pool while another thread holds a module's import lock; the siblings are the
DataLoader workers and a script without a main guard (which spawned workers re-ran)."""

from __future__ import annotations

import builtins
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.components.core.processes import process_pool, worker_context

# a module whose import, in this process only, waits until the test lets it finish: while it waits, the importing
# thread holds the module's import lock, as the engine's thread did while importing pandas
HELD_MODULE = """
import builtins
gate = getattr(builtins, "_heteroflow_test_gate", None)
if gate is not None:  # only in the test's own process; a fresh worker imports it straight through
    gate[0].set()
    gate[1].wait()
VALUE = 42
"""


@pytest.fixture
def import_held(tmp_path: Path) -> Iterator[str]:
    """Another thread is inside ``import heteroflow_held_module`` (holding its lock) for the whole test."""
    (tmp_path / "heteroflow_held_module.py").write_text(HELD_MODULE)
    entered, release = threading.Event(), threading.Event()
    builtins._heteroflow_test_gate = (entered, release)  # type: ignore[attr-defined]
    import sys

    sys.path.insert(0, str(tmp_path))
    importer = threading.Thread(target=__import__, args=("heteroflow_held_module",), daemon=True)
    importer.start()
    entered.wait()  # the observable state: the other thread is inside the import, its lock held
    try:
        yield str(tmp_path)
    finally:
        release.set()
        importer.join()
        del builtins._heteroflow_test_gate  # type: ignore[attr-defined]
        sys.path.remove(str(tmp_path))
        sys.modules.pop("heteroflow_held_module", None)


def _waiting_for_an_import_lock(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked inside the import system waiting for a module's lock (its current frames)."""
    frame = sys._current_frames().get(thread.ident)  # noqa: SLF001 - the observable state of the other thread
    while frame is not None:
        if frame.f_code.co_name in {"_lock_unlock_module", "acquire"} and "importlib" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def test_a_pool_worker_imports_a_module_whose_lock_another_thread_holds(import_held: str) -> None:
    """The issue's input: another thread is inside the import of a module the pool's workers import when the pool
    starts. The pool imports its workers' modules first, which waits for that import to finish, then forks: the
    workers find the module complete (a worker forked while the lock was held would wait for it forever)."""
    pools: list = []
    starter = threading.Thread(target=lambda: pools.append(process_pool(2, preload=("heteroflow_held_module",))), daemon=True)
    starter.start()
    while not _waiting_for_an_import_lock(starter):  # the observable state: the pool waits for the other import
        assert starter.is_alive(), "the pool started without waiting for the module another thread is importing"
        threading.Event().wait(0.01)
    builtins._heteroflow_test_gate[1].set()  # type: ignore[attr-defined]  # the other thread's import finishes
    starter.join()
    code = f"import sys; sys.path.insert(0, {import_held!r}); import heteroflow_held_module as m; assert m.VALUE == 42"
    with pools[0] as pool:
        futures = [pool.submit(exec, code) for _ in range(2)]
        # a guard so that a regression fails instead of hanging the suite; the assertion is on the outcome
        assert [f.result(timeout=300) for f in futures] == [None, None]


UNGUARDED_SCRIPT = """
import sys
sys.path[:0] = {paths!r}
from heteroflow.components.core.processes import process_pool
print("the script ran", flush=True)
with process_pool(2) as pool:
    print(sorted(pool.map(abs, [-2, -1])), flush=True)
"""


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """The sibling found trying it as a new user: with ``spawn``, each worker re-ran the user's unguarded script (a
    ``heteroflow.run`` in it ran the whole pipeline again per worker, leaving failed runs behind)."""
    script = tmp_path / "script.py"
    script.write_text(UNGUARDED_SCRIPT.format(paths=[p for p in sys.path if p]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["the script ran", "[1, 2]"]


def test_dataloader_workers_import_their_modules_first_and_load_every_batch() -> None:
    """The sibling: the training's DataLoader workers (forked, torch's default on Linux) import the image readers
    first too."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    from heteroflow.components.training.batches import make_loader

    data = TensorDataset(torch.arange(12, dtype=torch.float32).reshape(6, 2), torch.arange(6))
    loader = make_loader(data, batch_size=2, seed=0, shuffle=False, num_workers=1, device=torch.device("cpu"))
    assert loader.multiprocessing_context.get_start_method() == worker_context().get_start_method()
    labels = [int(y) for _, ys in loader for y in ys]
    assert labels == [0, 1, 2, 3, 4, 5]
    in_memory = make_loader(data, batch_size=2, seed=0, shuffle=False, num_workers=0, device=torch.device("cpu"))
    assert in_memory.multiprocessing_context is None  # no worker process, nothing to start
