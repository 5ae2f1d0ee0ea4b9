"""Deprecated module path: this module is now :mod:`heteroflow.components.core.telemetry`.

``heteroflow.components.telemetry`` keeps working (it is the same module object) for one release, with a DeprecationWarning;
import the new path. Saved references to it (compiled pipelines, archives) keep resolving."""

import importlib
import sys
import warnings

warnings.warn("heteroflow.components.telemetry is deprecated; import heteroflow.components.core.telemetry", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("heteroflow.components.core.telemetry")
