"""Deprecated module path: this module is now :mod:`heteroflow.pipelines.engines.inprocess`.

``heteroflow.pipelines.inprocess`` keeps working (it is the same module object) for one release, with a DeprecationWarning;
import the new path. Saved references to it (compiled pipelines, archives) keep resolving."""

import importlib
import sys
import warnings

warnings.warn("heteroflow.pipelines.inprocess is deprecated; import heteroflow.pipelines.engines.inprocess", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("heteroflow.pipelines.engines.inprocess")
