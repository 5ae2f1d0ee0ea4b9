"""The layout of subpackages by concern (issue #27): every module path of heteroflow 0.1 keeps working for one
release, and strings already saved in archives and compiled pipelines keep resolving."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# heteroflow 0.1's flat modules -> their place now (a module that became a package of the same name is not here:
# its path is the package, which resolves the old module's names)
MOVED = {
    "heteroflow.components.accelerators": "heteroflow.components.devices.accelerators",
    "heteroflow.components.cluster": "heteroflow.components.devices.cluster",
    "heteroflow.components.step": "heteroflow.components.core.step",
    "heteroflow.components.runtime": "heteroflow.components.core.runtime",
    "heteroflow.components.failures": "heteroflow.components.core.failures",
    "heteroflow.components.preprocess": "heteroflow.components.data.preprocess",
    "heteroflow.components.train": "heteroflow.components.training.step",
    "heteroflow.components.archive": "heteroflow.components.models.archive",
    "heteroflow.components.plan": "heteroflow.components.placement.plan",
    "heteroflow.pipelines.kfp_render": "heteroflow.pipelines.kfp.render",
    "heteroflow.pipelines.local": "heteroflow.pipelines.kfp.local",
    "heteroflow.pipelines.runner": "heteroflow.pipelines.engines.runner",
    "heteroflow.pipelines.records": "heteroflow.pipelines.runs.records",
    "heteroflow.pipelines.manifests": "heteroflow.pipelines.k8s.manifests",
    "heteroflow.pipelines.script": "heteroflow.pipelines.cli.script",
}

BECAME_PACKAGES = {
    "heteroflow.components.training": ("heteroflow.components.training.loop", "mlp"),
    "heteroflow.components.placement": ("heteroflow.components.placement.policies", "place_round"),
    "heteroflow.pipelines.cli": ("heteroflow.pipelines.cli.main", "app"),
    "heteroflow.pipelines.runs": ("heteroflow.pipelines.runs.folders", "resolve_run"),
}


def _fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


@pytest.mark.parametrize("old, new", sorted(MOVED.items()), ids=sorted(MOVED))
def test_an_old_module_path_is_the_new_module_with_a_deprecation_warning(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated; import {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)  # the same object: monkeypatching either path patches both


@pytest.mark.parametrize("package, where", sorted(BECAME_PACKAGES.items()), ids=sorted(BECAME_PACKAGES))
def test_a_module_that_became_a_package_still_resolves_its_names_without_a_warning(package: str, where: tuple[str, str]) -> None:
    module, name = where
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'no_such_name'"):
        getattr(importlib.import_module(package), "no_such_name")


def test_strings_saved_in_archives_and_compiled_pipelines_keep_resolving() -> None:
    # what heteroflow 0.1 wrote into archive records (model factory, step) and compiled YAML (the step's module)
    out = _fresh(
        "import importlib\n"
        "import heteroflow.components.training.loop as loop, heteroflow.components.models.archive as archive\n"
        "print(getattr(importlib.import_module('heteroflow.components.training'), 'mlp') is loop.mlp)\n"
        "print(getattr(importlib.import_module('heteroflow.components.archive'), 'ARCHIVE') is archive.ARCHIVE)\n"
        "import heteroflow.components.train as t, heteroflow.components.training.step as s\n"
        "print(t.TRAIN is s.TRAIN)\n"
    )
    assert out.count("True") == 3, out
    assert "heteroflow.components.archive is deprecated; import heteroflow.components.models.archive" in out


def test_every_subpackage_says_what_it_owns_and_may_import() -> None:
    for init in sorted(ROOT.glob("*/*/__init__.py")):
        if init.parts[-3] not in {"components", "pipelines"} or init.parent.name == "_root":
            continue  # _root is the one-import API (heteroflow itself), not a concern
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(ROOT)} has no docstring"
        assert "May import" in doc or "may import" in doc, f"{init.relative_to(ROOT)}: say what the subpackage may import"
