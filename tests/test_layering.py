"""Imports go one way: ``dags -> pipelines -> components -> cache`` (DESIGN.md "Layout"), in-function imports included.

An AST scan of every module under cache/, components/, pipelines/ and dags/ (``pipelines/_root/``, the
``heteroflow`` package itself, counts as pipelines): ``import``, ``from ... import`` at any depth (module level,
in a function, under ``TYPE_CHECKING``) and ``importlib.import_module("heteroflow....")`` / ``__import__`` with a
string literal. A failure names the file, the line and the import that goes up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("cache", "components", "pipelines", "dags")
"""Lowest first: a module may import its own layer and the ones before it."""
_DYNAMIC = {"import_module", "__import__"}


def _layer_of_module(name: str) -> str | None:
    """The layer of an absolute module name, or None when it is not heteroflow's."""
    parts = name.split(".")
    if parts[0] != "heteroflow":
        return None
    if len(parts) == 1 or parts[1] not in LAYERS:
        return "pipelines"  # `heteroflow` itself: the public API, mapped from pipelines/_root/
    return parts[1]


def _imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, imported module, how it is written)`` of every absolute import of a heteroflow module in ``tree``."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, f"import {a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = ", ".join(a.name for a in node.names)
            if node.module == "heteroflow":  # `from heteroflow import pipelines` names a subpackage
                found += [(node.lineno, f"heteroflow.{a.name}" if a.name in LAYERS else "heteroflow",
                           f"from heteroflow import {a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module, f"from {node.module} import {names}"))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            arg = node.args[0]
            if fname in _DYNAMIC and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value, f"{fname}({arg.value!r})"))
    return found


def upward_imports(root: Path = REPO) -> list[str]:
    """Every import of a higher layer, as ``"FILE:LINE: LAYER imports LAYER: STATEMENT"``."""
    problems = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            own = LAYERS.index(layer)
            for line, module, text in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
                target = _layer_of_module(module)
                if target is not None and LAYERS.index(target) > own:
                    problems.append(f"{rel}:{line}: {layer} imports {target}: {text}")
    return problems


def test_no_module_imports_a_higher_layer() -> None:
    problems = upward_imports()
    assert problems == [], "imports go dags -> pipelines -> components -> cache only:\n" + "\n".join(problems)


def test_every_layer_is_scanned() -> None:
    for layer in LAYERS:
        assert any((REPO / layer).rglob("*.py")), layer
    assert _layer_of_module("heteroflow") == "pipelines" and _layer_of_module("kfp.dsl") is None


@pytest.mark.parametrize(("layer", "source", "found"), [
    ("cache", "from heteroflow.components.resources import Resources\n", "cache imports components: from heteroflow.components.resources import Resources"),
    ("components", "def f():\n    import heteroflow.pipelines.k8s.manifests\n", "components imports pipelines: import heteroflow.pipelines.k8s.manifests"),
    ("components", "import importlib\nm = importlib.import_module('heteroflow.dags.pods')\n", "components imports dags: import_module('heteroflow.dags.pods')"),
    ("pipelines", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from heteroflow.dags.factory import build_dag\n", "pipelines imports dags: from heteroflow.dags.factory import build_dag"),
    ("cache", "from heteroflow import run\n", "cache imports pipelines: from heteroflow import run"),
    ("components", "from heteroflow import pipelines\n", "components imports pipelines: from heteroflow import pipelines"),
], ids=["module-level", "in-function", "import_module", "type-checking", "public-api", "subpackage-by-name"])
def test_an_upward_import_is_named_with_file_and_line(tmp_path: Path, layer: str, source: str, found: str) -> None:
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / layer / "mod.py").write_text(source, encoding="utf-8")
    problems = upward_imports(tmp_path)
    assert len(problems) == 1, problems
    line = source[: source.index("heteroflow")].count("\n") + 1
    assert problems[0] == f"{layer}/mod.py:{line}: {found}"


def test_imports_down_or_sideways_pass(tmp_path: Path) -> None:
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / "dags" / "a.py").write_text("import heteroflow.pipelines.cli.main\nfrom heteroflow.cache import atomic\n")
    (tmp_path / "components" / "b.py").write_text("from heteroflow.components.errors import X\nfrom . import c\n"
                                                   "import importlib\nimportlib.import_module('heteroflow.cache.crds')\n")
    (tmp_path / "pipelines" / "c.py").write_text("from heteroflow import Resources\n")
    assert upward_imports(tmp_path) == []


def test_names_moved_down_stay_importable_from_where_they_were() -> None:
    """components/training/trainjob.py rendered its job with pipelines.manifests (an import up); the renderer and the pod plan
    moved down into components, and the old modules re-export the same objects."""
    from heteroflow.components.devices import podplan
    from heteroflow.components.training import trainjob
    from heteroflow.pipelines.k8s import resources as k8s_resources

    from heteroflow.pipelines.k8s import manifests
    for name in ("training_job_manifests", "TRAINER_RUNTIME", "TRAINER_CONTAINER", "GROUP_ANNOTATION"):
        assert getattr(manifests, name) is getattr(trainjob, name), name
    for name in ("plan_pod", "PodPlan", "DefaultProfileWarning"):
        assert getattr(k8s_resources, name) is getattr(podplan, name), name
