"""Errors raised by the steps and the resource model (all derive from :class:`HeteroflowError`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

from heteroflow.cache.errors import CacheIntegrityError, DatasetError, HeteroflowError

__all__ = [
    "ArchiveError",
    "CacheIntegrityError",
    "CheckpointError",
    "CheckpointLocked",
    "DatasetError",
    "DeviceUnavailable",
    "HeteroflowError",
    "InvalidParameter",
    "InvalidResources",
    "NoCandidateAvailable",
    "NonFiniteError",
    "Problems",
    "RunProblems",
    "did_you_mean",
    "make_folder",
]


class InvalidResources(HeteroflowError, ValueError):
    """A resource field holds a value that is not valid; the message names the field and the valid forms."""


class DeviceUnavailable(HeteroflowError, RuntimeError):
    """A device of the requested kind is absent or not usable here (a *device* failure: fall back)."""


class NoCandidateAvailable(HeteroflowError, RuntimeError):
    """No candidate of a step can run here; the message lists why each was passed over."""


class CheckpointError(HeteroflowError, RuntimeError):
    """A checkpoint cannot be used to resume (written by another model shape or another run's parameters)."""


class CheckpointLocked(CheckpointError, BlockingIOError):
    """Another live process holds the checkpoint folder's lock (the same training is running). A *transient*
    failure: it clears when that process ends (a killed run's step processes end with it)."""


class ArchiveError(HeteroflowError, RuntimeError):
    """An archive version could not be written without overwriting an existing one."""


class InvalidParameter(HeteroflowError, ValueError):
    """A step or pipeline parameter is out of range or unknown; the message names it and what is valid."""


class NonFiniteError(HeteroflowError, FloatingPointError):
    """A computed number is NaN or infinite (a training loss, a model output, a metric); the message says where
    (epoch and step, split, metric) and what to change. A *permanent* failure: the same inputs fail the same way
    on any device, so it is neither retried nor sent to another candidate."""


class RunProblems(InvalidParameter, DatasetError):
    """Several problems of a run's input (parameters and data set) found before anything ran, in one message;
    ``problems`` holds each one's message. It is both an :class:`InvalidParameter` and a :class:`DatasetError`,
    as its problems are (a permanent failure either way)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems) or (message,)


_DEFAULT_PIPELINE_NAMES = {"model": "model_factory"}
"""The default pipeline's parameters named otherwise than the step parameter they feed (heteroflow.pipelines.default)."""


def make_folder(folder: str | os.PathLike[str], *, param: str, value: object, valid: str) -> None:
    """Make ``folder`` (and its parents), the folder a step's parameter ``param`` (given as ``value``) names, or say
    which parameter names a folder that cannot be made (rather than a bare ``FileNotFoundError`` naming the path).

    Raises:
        InvalidParameter: the folder cannot be made or is not a folder: ``checkpoint_root='/proc/x': cannot make the
            folder /proc/x/ab12 (No such file or directory); valid: ...``, ``valid`` appended.
    """
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        why = "a file is there, not a folder" if os.path.lexists(folder) else (exc.strerror or str(exc))
        raise InvalidParameter(f"{param}={value!r}: cannot make the folder {folder} ({why}); valid: {valid}") from None


def did_you_mean(unknown: Iterable[str], valid: Iterable[str]) -> str:
    """The closest valid name of each unknown one, as a message's aside: ``" (did you mean 'epochs'?)"``, or
    ``" (did you mean 'epochs' for 'epoch', 'seed' for 'sead'?)"`` for several; empty when none is close.
    (:func:`difflib.get_close_matches`; matched case-insensitively, so ``Epochs`` suggests ``epochs``). The default
    pipeline's own names suggest what they stand for in a pipeline composed from the steps: ``model`` is train's
    ``model_factory`` there (difflib found ``model_args``)."""
    import difflib

    unknown = list(unknown)
    by_lower = {v.lower(): v for v in valid}

    def closest(u: str) -> list[str]:
        stands_for = _DEFAULT_PIPELINE_NAMES.get(u.lower())
        named = [v for v in by_lower if stands_for and v.rsplit(".", 1)[-1] == stands_for]
        return named[:1] or difflib.get_close_matches(u.lower(), by_lower, n=1)

    pairs = [(u, by_lower[close[0]]) for u in unknown if (close := closest(u))]
    if not pairs:
        return ""
    if len(unknown) == 1:
        return f" (did you mean {pairs[0][1]!r}?)"
    return f" (did you mean {', '.join(f'{v!r} for {u!r}' for u, v in pairs)}?)"


class Problems:
    """Gathers the problems of several checks, to report them all in one error instead of the first.

    Example::

        problems = Problems()
        with problems.check():
            check_integer("epochs", epochs, 1)
        with problems.check():
            check_integer("seed", seed, 0)
        problems.raise_all("train's parameters")

    A check raising :class:`InvalidParameter` or :class:`DatasetError` adds its message (each of a
    :class:`RunProblems`' messages); other errors pass through.
    """

    def __init__(self) -> None:
        self.errors: list[HeteroflowError] = []
        self.messages: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.messages)

    def add(self, error: HeteroflowError) -> None:
        """Add one problem (or each problem of a :class:`RunProblems`), once."""
        self.errors.append(error)
        for message in getattr(error, "problems", None) or (str(error),):
            if message not in self.messages:
                self.messages.append(message)

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Run a check; its :class:`InvalidParameter` or :class:`DatasetError` is kept instead of raised."""
        try:
            yield
        except (InvalidParameter, DatasetError) as exc:
            self.add(exc)

    def raise_all(self, what: str) -> None:
        """Raise the problems gathered, if any: one alone as it was (first) raised; several as one error listing each,
        headed by ``what`` they are problems of: an :class:`InvalidParameter` when each is one, a
        :class:`DatasetError` when each is one, else a :class:`RunProblems`.

        Raises:
            InvalidParameter | DatasetError | RunProblems: as above.
        """
        if not self.messages:
            return
        if len(self.messages) == 1:  # one problem, even when several checks found it (`seed` checked by two steps)
            raise self.errors[0]
        count = len(self.messages)
        message = f"{count} problem{'s' if count != 1 else ''} with {what}:\n- " + "\n- ".join(m.replace("\n", "\n  ") for m in self.messages)
        if all(isinstance(e, InvalidParameter) and not isinstance(e, DatasetError) for e in self.errors):
            error: HeteroflowError = InvalidParameter(message)
        elif all(isinstance(e, DatasetError) and not isinstance(e, InvalidParameter) for e in self.errors):
            error = DatasetError(message)
        else:
            error = RunProblems(message, tuple(self.messages))
        error.problems = tuple(self.messages)  # type: ignore[attr-defined]
        raise error
