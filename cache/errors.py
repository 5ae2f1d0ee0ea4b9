"""Exception root of heteroflow.

Every error heteroflow raises on purpose derives from :class:`HeteroflowError` and from the builtin that
matches it (``ValueError`` for bad input, ``RuntimeError`` for environment failures), so callers can catch
either. The root lives in the lowest layer (``heteroflow.cache``) because imports only go
``dags -> pipelines -> components -> cache``.
"""

from __future__ import annotations


class HeteroflowError(Exception):
    """Root of all errors raised by heteroflow on purpose."""


class DatasetError(HeteroflowError, ValueError):
    """A data set folder or URI is missing, empty, or holds no file in a supported format."""


class CacheIntegrityError(HeteroflowError, RuntimeError):
    """A cached file does not match its manifest (size or sha256) after copying."""
