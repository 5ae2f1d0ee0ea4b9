"""Deprecated module path: this module is now :mod:`heteroflow.pipelines.engines.runner`.

``heteroflow.pipelines.runner`` keeps working (it is the same module object) for one release, with a DeprecationWarning;
import the new path. Saved references to it (compiled pipelines, archives) keep resolving."""

import importlib
import sys
import warnings

warnings.warn("heteroflow.pipelines.runner is deprecated; import heteroflow.pipelines.engines.runner", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("heteroflow.pipelines.engines.runner")
