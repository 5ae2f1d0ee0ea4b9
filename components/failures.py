"""Deprecated module path: this module is now :mod:`heteroflow.components.core.failures`.

``heteroflow.components.failures`` keeps working (it is the same module object) for one release, with a DeprecationWarning;
import the new path. Saved references to it (compiled pipelines, archives) keep resolving."""

import importlib
import sys
import warnings

warnings.warn("heteroflow.components.failures is deprecated; import heteroflow.components.core.failures", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("heteroflow.components.core.failures")
