"""A step parameter's default is written once, in its step definition (DESIGN.md "One definition").

The configurations built from train's parameters (:class:`~heteroflow.components.training.mixed.MixedJob`,
:class:`~heteroflow.components.training.loop.TrainContext`, the built-in :func:`~heteroflow.components.training.loop.mlp`)
take their defaults from :data:`~heteroflow.components.training.step.TRAIN`, and no module of the package writes a
default literal for one of the train or preprocess step's own parameters (an AST scan).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from heteroflow.components.data.preprocess import PREPROCESS
from heteroflow.components.training.factories import mlp
from heteroflow.components.training.loop import TrainContext
from heteroflow.components.training.mixed import MixedJob
from heteroflow.components.training.step import TRAIN

REPO = Path(__file__).resolve().parents[1]

RENAMED = {"loss_ref": "loss", "optimizer_ref": "optimizer"}
"""A configuration's field -> the train parameter it holds under another name."""

OTHER_MEANING = {(TrainContext, "loader_workers")}
"""Fields named like a train parameter that hold something else: TrainContext.loader_workers is the worker count
chosen (an integer >= 0), not the parameter (-1: auto)."""


def _defaults(obj: Any) -> dict[str, Any]:
    """``{name: default}`` of a dataclass's fields or a function's parameters that have one."""
    if dataclasses.is_dataclass(obj):
        return {f.name: f.default for f in dataclasses.fields(obj) if f.default is not dataclasses.MISSING}
    return {n: p.default for n, p in inspect.signature(obj).parameters.items() if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize(("config", "expected"), [
    (MixedJob, {"epochs", "optimizer", "loss", "seed", "checkpoint_every_steps"}),
    (TrainContext, {"loss_ref", "optimizer_ref", "compile_model"}),
    (mlp, {"hidden_units"}),
], ids=["MixedJob", "TrainContext", "mlp"])
def test_a_train_configuration_defaults_to_the_step_definition(config: Any, expected: set[str]) -> None:
    train_defaults = {p.name: p.default for p in TRAIN.params if not p.required}
    checked = {}
    for name, default in _defaults(config).items():
        param = RENAMED.get(name, name)
        if param in train_defaults and (config, name) not in OTHER_MEANING:
            checked[name] = (default, train_defaults[param])
    assert set(checked) == expected, "the fields named like a train parameter changed: update this test's list"
    differing = {name: pair for name, pair in checked.items() if pair[0] != pair[1]}
    assert differing == {}, f"{config.__name__}'s defaults differ from TRAIN's (theirs, TRAIN's): {differing}"


DISTINCT = ("checkpoint_every_steps", "hidden_units", "learning_rate", "epochs", "compile_model",
            "model_args", "train_function", "validation_fraction", "test_fraction", "shard_size", "max_categories")
"""Parameter names of train and preprocess that mean the step's parameter wherever they appear (unlike ``seed`` or
``header``, which other functions take with their own meaning)."""


def _step_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in (TRAIN, PREPROCESS):
        out.update({p.name: p.default for p in s.params if not p.required and p.name in DISTINCT})
    return out


def literal_defaults(tree: ast.AST, names: dict[str, Any]) -> list[tuple[int, str, Any]]:
    """``(line, name, value)`` of every literal default for ``names`` in ``tree``: a function parameter's, a class
    field's (``name: T = literal``), and ``x.get("name", literal)`` where the literal is the step's default."""
    found = []

    def literal(node: ast.AST | None) -> tuple[bool, Any]:
        try:
            return True, ast.literal_eval(node) if node is not None else None
        except ValueError:
            return False, None

    for node in ast.walk(tree):
        pairs: list[tuple[str, ast.AST | None, bool]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs += [(x.arg, d, False) for x, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)]
            pairs += [(x.arg, d, False) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            pairs.append((node.target.id, node.value, False))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)):
            pairs.append((str(node.args[0].value), node.args[1], True))
        for name, value, only_equal in pairs:
            if name not in names or value is None:
                continue
            ok, v = literal(value)
            if ok and (not only_equal or v == names[name]):
                found.append((value.lineno, name, v))
    return found


def _own_signature_lines(step: Any) -> set[tuple[str, int]]:
    """The lines of the step function's own signature (where its defaults are written)."""
    path = Path(inspect.getsourcefile(step.func)).resolve()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == step.func.__name__)
    rel = path.relative_to(REPO).as_posix()
    return {(rel, line) for line in range(node.lineno, node.body[0].lineno)}


def test_no_module_repeats_a_step_parameter_default() -> None:
    names = _step_defaults()
    assert {"checkpoint_every_steps", "hidden_units", "validation_fraction"} <= set(names)
    own = _own_signature_lines(TRAIN) | _own_signature_lines(PREPROCESS)
    repeats = []
    for layer in ("components", "pipelines", "dags", "cache"):
        for path in sorted((REPO / layer).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for line, name, value in literal_defaults(ast.parse(path.read_text(encoding="utf-8")), names):
                if (rel, line) not in own:
                    repeats.append(f"{rel}:{line}: {name} = {value!r} (the step's default: {names[name]!r})")
    assert repeats == [], ("take the default from the step definition (TRAIN.param(name).default, with_defaults) "
                           "instead of writing it again:\n" + "\n".join(repeats))


@pytest.mark.parametrize(("source", "found"), [
    ("def f(checkpoint_every_steps: int = 50): ...\n", [(1, "checkpoint_every_steps", 50)]),
    ("class C:\n    hidden_units: int = 64\n", [(2, "hidden_units", 64)]),
    ("x = v.get('validation_fraction', 0.15)\n", [(1, "validation_fraction", 0.15)]),
    ("x = v.get('epochs', '?')\n", []),  # a display's fallback, not the default
    ("def f(epochs: int = TRAIN.param('epochs').default): ...\n", []),  # taken from the step
], ids=["parameter", "field", "get", "get-other-value", "from-the-step"])
def test_the_scan_finds_a_repeated_literal(source: str, found: list[tuple[int, str, Any]]) -> None:
    names = {"checkpoint_every_steps": 50, "hidden_units": 128, "validation_fraction": 0.15, "epochs": 30}
    assert literal_defaults(ast.parse(source), names) == found


def test_a_mixed_job_defaults_to_the_mixed_candidate_options() -> None:
    """MixedJob's exchange and rebalancing options default to a mixed candidate's (the train step passes the
    candidate's values), and JOB_DEFAULTS are MixedResources' own field defaults."""
    from heteroflow.components.replicas import JOB_DEFAULTS, JOB_OPTIONS, MixedResources

    fields = _defaults(MixedResources)
    assert JOB_DEFAULTS == {k: fields[k] for k in JOB_OPTIONS}
    assert {k: _defaults(MixedJob)[k] for k in JOB_OPTIONS} == JOB_DEFAULTS
