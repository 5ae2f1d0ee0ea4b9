"""The checkpoint folder's lock: an exclusive ``flock`` that keeps two identical trainings out of one checkpoint
folder, and how long train waits for it (split out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from heteroflow.components.errors import CheckpointLocked

__all__ = ["KEPT_FACTS", "KEPT_MODEL", "LOCK_WAIT_SECONDS", "HeldLock", "code_fingerprint", "keep_finished", "release_kept"]

LOCK_WAIT_SECONDS: float | None = None
"""How long train waits for a checkpoint folder's lock; None: as long as its holder lives (the kernel releases a
``flock`` when its holder ends, so a held lock always has a live holder)."""


@dataclasses.dataclass
class HeldLock:
    """What :func:`_exclusive` yields: whom this training waited for, and what that holder left when it finished.

    Attributes:
        waited_for: the holder it waited for (``pid N``), or None when the lock was free.
        waited_seconds: how long it waited.
        finished: the facts the holder wrote with :meth:`finish` before it ended (its model folder among them),
            or None: it did not finish (killed, failed, or moved to another candidate), so its checkpoint, if any,
            is the place to resume from.
    """

    fh: Any
    waited_for: str | None = None
    waited_seconds: float = 0.0
    finished: dict[str, Any] | None = None

    def finish(self, facts: dict[str, Any]) -> None:
        """Leave ``facts`` (JSON-ready; ``model_dir`` the model written) in the lock file for a training waiting
        for this one: it reads them on the lock file it holds open, even once the folder is removed."""
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}\n" + json.dumps({"finished": facts}, default=str))
        self.fh.flush()


def _finished_of(content: str) -> dict[str, Any] | None:
    """The facts a finished holder left in its lock file's second line, or None."""
    _, _, rest = content.partition("\n")
    try:
        value = json.loads(rest) if rest.strip() else None
    except ValueError:
        return None
    done = value.get("finished") if isinstance(value, dict) else None
    return done if isinstance(done, dict) else None


@contextlib.contextmanager
def _exclusive(ckpt_dir: Path, wait_seconds: float | None = None, *, say: Callable[[str], None] | None = None) -> Iterator[HeldLock]:
    """Hold an exclusive ``flock`` on ``<ckpt_dir>/.lock``: two trainings never share one checkpoint folder.

    A second identical training waits while the first lives, saying once whom it waits for; it never fails for
    a lock and spends no retry on one. Then, on the :class:`HeldLock` it gets: ``finished`` when the first
    finished (its facts and model folder, left by :meth:`HeldLock.finish`: use its model), else the first's
    checkpoint is in the folder to resume from. A lock file removed by its holder while we waited (the holder
    finished and removed the folder) is taken afresh.

    Raises:
        CheckpointLocked: only with ``wait_seconds`` (or :data:`LOCK_WAIT_SECONDS`) set and exceeded.
    """
    limit = LOCK_WAIT_SECONDS if wait_seconds is None else wait_seconds
    deadline = None if limit is None else time.monotonic() + limit
    told = False
    waited_for: str | None = None
    waited_from = time.monotonic()
    finished: dict[str, Any] | None = None
    while True:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fh = open(ckpt_dir / ".lock", "a+")
        try:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    fh.seek(0)
                    holder = fh.read().strip().partition("\n")[0] or "another process"
                    waited_for = waited_for or holder
                    if deadline is not None and time.monotonic() >= deadline:
                        raise CheckpointLocked(
                            f"checkpoint folder {ckpt_dir} is in use by {holder}: the same training (same data, "
                            "parameters and model) is running already; wait for it or stop it, then rerun to resume"
                        ) from None
                    if not told and say is not None:
                        say(f"train: waiting for {holder}, which runs the same training (checkpoint folder {ckpt_dir})")
                        told = True
                    time.sleep(0.2)
            fh.seek(0)
            if waited_for is not None:  # what the holder we waited for left (this file, even if unlinked since)
                finished = _finished_of(fh.read()) or finished
            try:
                same = os.fstat(fh.fileno()).st_ino == os.stat(ckpt_dir / ".lock").st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder finished and removed the folder while we waited: lock the new one
                fcntl.flock(fh, fcntl.LOCK_UN)
                continue
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}")
            fh.flush()
            held = HeldLock(fh, waited_for=waited_for, finished=finished,
                            waited_seconds=time.monotonic() - waited_from if waited_for else 0.0)
            try:
                yield held
            finally:
                # a training that failed before its first checkpoint leaves a folder with nothing to resume: remove
                # it (while the lock is held; one waiting on this file finds it unlinked and locks a new one)
                with contextlib.suppress(OSError):
                    if ckpt_dir.is_dir() and [p.name for p in ckpt_dir.iterdir()] == [".lock"]:
                        (ckpt_dir / ".lock").unlink()
                        ckpt_dir.rmdir()
                fcntl.flock(fh, fcntl.LOCK_UN)
            return
        finally:
            fh.close()


def _take_finished_model(held: HeldLock | None, model_dir: str | os.PathLike[str], *,
                         say: Callable[[str], None]) -> dict[str, Any] | None:
    """The result of the identical training this one waited for, its model copied into ``model_dir`` (atomically),
    or None: it did not finish, or its model folder is gone (then this one trains, from its checkpoint if any).

    Returns:
        the finished training's facts (:class:`~heteroflow.components.training.step.TrainResult` fields), with
        ``model_dir`` this call's folder and ``reused_model`` the folder copied from.
    """
    import shutil

    from heteroflow.cache.atomic import atomic_directory
    from heteroflow.components.training.model_files import MODEL_CONFIG, MODEL_WEIGHTS

    facts = held.finished if held is not None else None
    if not facts:
        return None
    src = Path(str(facts.get("model_dir") or ""))
    if not (src / MODEL_WEIGHTS).is_file() or not (src / MODEL_CONFIG).is_file():
        say(f"train: {held.waited_for} finished the same training, but its model folder {src} is gone: training here")
        return None
    out = Path(model_dir)
    if out.resolve() != src.resolve():
        with atomic_directory(out) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True)
    say(f"train: {held.waited_for} finished the same training ({facts.get('steps')} steps); its model {src} is this "
        "run's, not trained again")
    return {**facts, "model_dir": out, "reused_model": str(src)}


KEPT_MODEL = "finished"
"""The folder, in a checkpoint folder, that keeps a finished training's model until a run that uses it succeeds."""
KEPT_FACTS = "finished.json"
"""Its facts (:class:`~heteroflow.components.training.step.TrainResult` fields), written after the folder."""


def keep_finished(ckpt_dir: Path, model_dir: str | os.PathLike[str], facts: dict[str, Any]) -> Path:
    """Keep a finished training in its checkpoint folder, in place of its checkpoints (called by train with the
    folder's lock held, in a run that records itself: a local engine's): a copy of its model folder
    (:data:`KEPT_MODEL`, published whole) and then ``facts`` (:data:`KEPT_FACTS`). A run stopped or failed after
    train (Ctrl-C during evaluate) then resumes with this model instead of training again from step 0, as
    Metaflow's ``resume`` reuses the steps a run finished; :func:`release_kept` removes the folder once a run that
    used it succeeds.

    Returns:
        The kept model folder.

    Raises:
        OSError: the copy or the facts could not be written (the checkpoints are left as they were).
    """
    import shutil

    from heteroflow.cache.atomic import atomic_directory, atomic_write_bytes

    kept = ckpt_dir / KEPT_MODEL
    with atomic_directory(kept) as tmp:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
    atomic_write_bytes(ckpt_dir / KEPT_FACTS, json.dumps({**facts, "model_dir": str(kept)}, default=str).encode())
    for entry in ckpt_dir.iterdir():  # the checkpoints: nothing is left to resume inside this training
        if entry.name not in (".lock", KEPT_MODEL, KEPT_FACTS):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return kept


def code_fingerprint(refs: list[Any]) -> dict[str, str]:
    """``{ref: sha256 of its module's source file}`` for each ``module:attribute`` in ``refs`` (empty ones left out;
    ``?`` where the module's file cannot be found or read). The checkpoint folder's key names a model factory, not
    its code: a kept finished model is taken only while this is unchanged (a user edits the model after a run
    failed past train, then reruns). Finds the file without importing the module itself (its parent packages are)."""
    import hashlib
    import importlib.util

    out: dict[str, str] = {}
    for ref in refs:
        if not ref or not isinstance(ref, str):
            continue
        module = ref.partition(":")[0]
        try:
            spec = importlib.util.find_spec(module)
            origin = spec.origin if spec is not None else None
            out[ref] = hashlib.sha256(Path(origin).read_bytes()).hexdigest() if origin and origin not in ("built-in", "frozen") else "?"
        except (ImportError, ValueError, OSError):
            out[ref] = "?"
    return out


def _discard_kept(ckpt_dir: Path) -> None:
    """Remove a kept finished model that cannot be used (the lock held): the facts first, so it is never half-kept."""
    import shutil

    (ckpt_dir / KEPT_FACTS).unlink(missing_ok=True)
    shutil.rmtree(ckpt_dir / KEPT_MODEL, ignore_errors=True)


def _take_kept_model(ckpt_dir: Path, model_dir: str | os.PathLike[str], *, say: Callable[[str], None],
                     code: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The finished training kept in ``ckpt_dir`` (:func:`keep_finished`), its model copied into ``model_dir``
    (atomically), or None: none kept, it is incomplete or cannot be copied, or ``code`` (:func:`code_fingerprint`
    now) differs from the code it was trained with (then it is removed, said, and this one trains).

    Returns:
        its facts, with ``model_dir`` this call's folder, ``reused_model`` the kept folder and ``kept_checkpoint``
        ``ckpt_dir`` (released when this run succeeds).
    """
    import shutil

    from heteroflow.cache.atomic import atomic_directory
    from heteroflow.components.training.model_files import MODEL_CONFIG, MODEL_WEIGHTS

    kept = ckpt_dir / KEPT_MODEL
    try:
        facts = json.loads((ckpt_dir / KEPT_FACTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(facts, dict) or not (kept / MODEL_WEIGHTS).is_file() or not (kept / MODEL_CONFIG).is_file():
        return None
    if code is not None and facts.get("code") != code:
        changed = sorted(r for r in set(code) | set(facts.get("code") or {}) if code.get(r) != (facts.get("code") or {}).get(r))
        say(f"train: the model an earlier run finished (kept in {ckpt_dir}) was trained with other code "
            f"({', '.join(r.partition(':')[0] for r in changed) or 'unknown'} changed since): training afresh")
        _discard_kept(ckpt_dir)
        return None
    out = Path(model_dir)
    try:
        with atomic_directory(out) as tmp:
            shutil.copytree(kept, tmp, dirs_exist_ok=True)
    except (OSError, shutil.Error) as exc:
        say(f"train: the model kept in {ckpt_dir} could not be copied ({exc}): training afresh")
        return None
    say(f"train: an earlier run finished this training ({facts.get('steps')} steps) but did not succeed after it: its "
        f"model, kept in {ckpt_dir}, is this run's, not trained again (remove that folder to train afresh)")
    return {**facts, "model_dir": out, "reused_model": str(kept), "kept_checkpoint": str(ckpt_dir)}


def release_kept(ckpt_dir: str | os.PathLike[str]) -> bool:
    """Remove a checkpoint folder that keeps a finished training (:func:`keep_finished`), once a run that used it
    succeeded; left as it is while a training holds its lock (it decides for itself). Never raises.

    Returns:
        True when it was removed.
    """
    import shutil

    folder = Path(ckpt_dir)
    if not (folder / KEPT_FACTS).is_file():
        return False
    try:
        fh = open(folder / ".lock", "a+")
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fh.seek(0)
        fh.truncate()  # a training waiting on this lock file finds no finished facts in it: it trains (or resumes)
        fh.flush()
        # out of the way whole while the lock is held, then removed: a new training never finds a half-removed
        # folder, nor locks a new .lock beside the old one's removal
        tombstone = folder.with_name(f".{folder.name}.removed-{os.getpid()}")
        try:
            os.rename(folder, tombstone)
        except OSError:
            return False
    shutil.rmtree(tombstone, ignore_errors=True)
    return not folder.exists()
