"""Errors raised by the steps and the resource model (all derive from :class:`HeteroflowError`)."""

from __future__ import annotations

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
