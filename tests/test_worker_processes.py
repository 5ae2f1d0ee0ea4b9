"""Worker processes never inherit a lock another thread held at the fork (issue #28.13): the in-process engine hung
about one run in fifteen when a forked preprocess worker imported pandas while the engine's other thread was inside
an import. The input kept here forks while a module's import lock is held; the sibling is the DataLoader workers."""

from __future__ import annotations

import builtins
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


def test_a_pool_worker_imports_a_module_whose_lock_another_thread_holds(import_held: str) -> None:
    """The issue's input: with ``fork`` the worker inherits the held lock and its import never returns."""
    code = f"import sys; sys.path.insert(0, {import_held!r}); import heteroflow_held_module as m; assert m.VALUE == 42"
    with process_pool(2) as pool:
        futures = [pool.submit(exec, code) for _ in range(2)]
        # a guard so that a regression fails instead of hanging the suite; the assertion is on the outcome
        assert [f.result(timeout=300) for f in futures] == [None, None]


def test_every_worker_process_heteroflow_starts_is_never_forked() -> None:
    assert worker_context().get_start_method() == "spawn"  # forkserver's socket fails under a long TMPDIR
    with process_pool(1) as pool:
        assert pool._mp_context.get_start_method() == worker_context().get_start_method()


def test_dataloader_workers_are_never_forked_and_load_every_batch(import_held: str) -> None:
    """The sibling: the training's DataLoader workers were forked too (torch's default on Linux)."""
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
