"""Pipelines a user could write that a review found failing on one engine or compiling wrong, each with its own small
input: a device-bound step without outputs (its skip task's source did not parse), a parameter named like a builtin
the component body calls (``dict``), a non-finite default, a sub-pipeline's ``.after()``, a call name with a dash
beside output parameters, a keyword as a pipeline parameter, and ``copy()`` of a pipeline with inputs and outputs.
Steps are defined here and importable by name (tests/ is on the path)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from heteroflow.components.core.step import step
from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.graph import Pipeline


def probe(device: str = "cpu") -> dict:
    """A device-bound step with no artifacts.

    Args:
        device: injected torch device type.
    """
    return {"device": device}


def shadowing(dict: str = "x", locals: int = 2) -> dict:  # noqa: A002 - the names under test
    """A step whose parameters are named like builtins.

    Args:
        dict: a text.
        locals: a number.
    """
    return {"dict": dict, "locals": locals}


def limit(threshold: float = math.inf, floor: float = -math.inf) -> dict:
    """A step with non-finite defaults.

    Args:
        threshold: the largest allowed.
        floor: the smallest allowed.
    """
    return {"threshold": threshold, "floor": floor}


PROBE = step(probe, candidates=["npu", "gpu", "cpu"], device_bound=True, device_param="device")
SHADOWING = step(shadowing)
LIMIT = step(limit)


def _compile(p: Pipeline, tmp_path: Path) -> str:
    import heteroflow

    heteroflow.compile(p, str(tmp_path / "p.yaml"))
    return (tmp_path / "p.yaml").read_text()


def test_a_device_bound_step_without_outputs_compiles_with_its_fallback_chain(tmp_path: Path) -> None:
    """It raised a bare SyntaxError: its skip task looped over '(,)'."""
    p = Pipeline("probe-chain")
    p.add(PROBE)
    text = _compile(p, tmp_path)
    assert "heteroflow-skip-probe" in text or "heteroflow_skip_probe" in text
    from heteroflow.pipelines.kfp.render import _skip_source

    namespace: dict = {}
    exec(_skip_source(p["probe"]), namespace)  # the task's own source runs: nothing to pass on
    assert namespace["heteroflow_skip_probe"](route="gpu") == "gpu"


def test_parameters_named_like_builtins_reach_the_step_through_the_kfp_component(monkeypatch: pytest.MonkeyPatch) -> None:
    """`arguments = dict(locals())` in the component body called the parameter named dict (a str): every kfp.local
    task of the step failed with "'str' object is not callable"; the in-process engine ran it."""
    from heteroflow.components.core import runtime
    from heteroflow.pipelines.kfp.render import _shim_source

    p = Pipeline("shadow")
    p.add(SHADOWING)
    seen: list = []
    monkeypatch.setattr(runtime, "kfp_task", lambda ref, call, arguments: seen.append(arguments) or "ok")
    namespace: dict = {}
    exec(_shim_source(p["shadowing"], "x:y", placed=[], after=[], chain=False, inventory=False), namespace)
    assert namespace["shadowing"](dict="text", locals=5) == "ok" and seen == [{"dict": "text", "locals": 5}]


def test_a_non_finite_default_is_refused_at_compile_naming_the_parameter(tmp_path: Path) -> None:
    """`threshold: float = inf` in the component's source was a bare NameError at compile (and KFP's IR, JSON,
    cannot hold an infinity at all): the step and parameter are named, with what works. In-process it runs."""
    p = Pipeline("limits")
    p.add(LIMIT)
    with pytest.raises(InvalidParameter, match=r"step 'limit': parameter threshold's default inf cannot be written in a KFP pipeline"):
        _compile(p, tmp_path)
    assert LIMIT.func() == {"threshold": math.inf, "floor": -math.inf}


def show(x: str = "") -> dict:
    """Show a value.

    Args:
        x: what to show.
    """
    return {"shown": x}


def score(x: int = 1) -> float:
    """A score.

    Args:
        x: an input.
    """
    return x / 2


SHOW = step(show)
SCORE = step(score)


def test_a_sub_pipelines_after_waits_on_its_own_call_not_a_parents_namesake(tmp_path: Path) -> None:
    """`.after(prep)` inside a sub-pipeline was copied as 'prep': the outer pipeline's prep (or an error naming
    data__prep, which the user never wrote)."""
    sub = Pipeline("sub")
    prep = sub.add(SHOW, name="prep")
    sub.add(SHOW, name="work").after(prep)
    outer = Pipeline("outer")
    outer.add(SHOW, name="prep")
    outer.add(sub, name="data")
    assert outer["data__work"].run_after == ("data__prep",)
    alone = Pipeline("alone")
    alone.add(sub, name="data")
    _compile(alone, tmp_path)  # it failed: "after('prep'): not a call before it"


def test_a_dashed_call_name_with_output_parameters_compiles(tmp_path: Path) -> None:
    """`p.add(SCORE, name="my-score")` read by a later call: compile failed on an assertion (the component's
    function was written my_score, looked for as my-score)."""
    p = Pipeline("dashed")
    s = p.add(SCORE, name="my-score")
    p.add(FLOAT_IN, name="use", v=s.output)
    assert "my-score" in _compile(p, tmp_path)


def _float_in(v: float = 0.0) -> dict:
    """Read a float.

    Args:
        v: a value.
    """
    return {"v": v}


FLOAT_IN = step(_float_in)


def test_a_keyword_is_refused_as_a_pipeline_parameter_name() -> None:
    """`p.param("lambda")` ran in-process and failed compile with a bare ValueError."""
    with pytest.raises(InvalidParameter, match=r"parameter name 'lambda' is not a Python identifier \(it is a keyword\); valid: .* \(e.g. lambda_\)"):
        Pipeline("k").param("lambda", default=0.3)


def test_a_copy_keeps_a_sub_pipelines_outputs() -> None:
    """`sub.copy()` dropped what set_outputs declared (and the inputs pipeline_input declared)."""
    sub = Pipeline("sub")
    s = sub.add(SCORE, name="s")
    sub.set_outputs(best=s.output)
    copied = Pipeline("outer").add(sub.copy("sub-copy"), name="c")
    assert list(copied._outputs) == ["best"] and repr(copied.output) == repr(copied.outputs["best"])  # the copy had none


def test_subset_keeps_what_conditions_and_loops_read_or_says_what_to_keep() -> None:
    """A review's inputs: a subset keeping a call inside If(score.output >= 0.5) but not score failed mid-run with a
    KeyError after the calls before it ran; a subset of a loop over a pipeline parameter lost the parameter."""
    from heteroflow.pipelines.control import If, ParallelFor

    p1 = Pipeline("p1")
    p1.add(SHOW, name="first")
    s = p1.add(SCORE, name="score")
    with If(s.output >= 0.5):
        p1.add(SHOW, name="big")
    with pytest.raises(InvalidParameter, match=r"subset: big reads score's output 'result' \(a value, a condition or a loop's list\); keep score too"):
        p1.subset(["first", "big"], name="sub1")
    assert [c.name for c in p1.subset(["score", "big"], name="sub1").calls] == ["score", "big"]
    p2 = Pipeline("p2")
    with ParallelFor(p2.param("xs", default=[1, 2])) as x:
        p2.add(SCORE, name="score", x=x)
    assert list(p2.subset(["score"], name="sub2").params) == ["xs"]


@pytest.mark.parametrize(("names", "message"), [
    (("lr: trials",), None),  # Airflow's bare "has to be made of alphanumeric" ValueError
    (("trials", "trials"), r"ParallelFor 'trials': its Airflow id 'trials' is taken by loop 'trials'"),
    (("a",), r"ParallelFor 'a': its Airflow id 'a' is taken by call 'a'"),  # a loop named like a call inside it
])
def test_loop_names_kfp_takes_build_an_airflow_dag_or_say_what_clashes(names: tuple[str, ...], message: str | None) -> None:
    """Airflow keeps task and group ids in one namespace (KFP does not): two loops named alike, or a loop named like
    a call, failed the DAG with a bare DuplicateTaskIdFound."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    from heteroflow.dags.factory import build_dag
    from heteroflow.pipelines.control import ParallelFor

    p = Pipeline("loops")
    for i, name in enumerate(names):
        with ParallelFor([1, 2], name=name) as x:
            p.add(SCORE, name="a" if i == 0 else "b", x=x)
    if message is None:
        assert "lr-trials" in {g for g in build_dag(p, "loops").task_group_dict}
    else:
        with pytest.raises(InvalidParameter, match=message):
            build_dag(p, "loops")


def test_a_condition_on_a_pipeline_parameter_says_which_side_it_may_be() -> None:
    """`If(p.param("mode") == "fast")` is Python's comparison of two values (False); the message said a pipeline
    parameter could be compared, without saying it must be the right side of an output parameter or loop item."""
    from heteroflow.pipelines.control import If

    p = Pipeline("cond")
    with pytest.raises(InvalidParameter, match=r"whose left side is an output parameter or a loop item \(a pipeline parameter may be the right side\)"):
        If(p.param("mode", default="fast") == "fast")
    s = p.add(SCORE, name="s", x=p.param("n", default=2))
    with If(s.output >= p.param("n")):  # the form that works: a parameter a call binds, on the right
        p.add(SHOW, name="big")
    assert p["big"].groups[0].condition.op == ">="
