"""Deprecated module path: this module is now :mod:`heteroflow.components.data.readers`.

``heteroflow.components.readers`` keeps working (it is the same module object) for one release, with a DeprecationWarning;
import the new path. Saved references to it (compiled pipelines, archives) keep resolving."""

import importlib
import sys
import warnings

warnings.warn("heteroflow.components.readers is deprecated; import heteroflow.components.data.readers", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("heteroflow.components.data.readers")
