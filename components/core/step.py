"""The one definition of a pipeline step: :class:`Step`.

A :class:`Step` is a value that holds everything every engine needs to know about one step, taken once from
its plain Python function:

- the function that does the work (importable and callable without KFP or Airflow);
- its parameters, with types, defaults, units and help, read from the function's signature and the ``Args:``
  section of its Google-style docstring (a help line may carry ``(unit: ...)``);
- its input and output artifacts with their KFP artifact types (:class:`ArtifactSpec`); artifacts reach the
  function as local paths (``str``), and an output that the function does not write itself gets the step's
  facts (its return value, as JSON) in its file and metadata;
- its device candidates (first preferred), retry policy, cacheability, and whether it is device-bound (then the
  engine tries the candidates in order and hands the function the torch device type of the one it is on).

Renderers (KFP in :mod:`heteroflow.pipelines.kfp.render`, Airflow in :mod:`heteroflow.dags`, the CLI's
parameter listing) read only these fields: adding a parameter to a step function is the whole change.

The shape follows flytekit's ``@task`` and ZenML's ``@step`` (typed function plus resources and retries in one
value, rendered per orchestrator), with candidates across device kinds added.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from heteroflow.components.core.keys import first_duplicate
from heteroflow.components.errors import InvalidParameter, did_you_mean
from heteroflow.components.resources import Candidates, Resources, RetryPolicy

__all__ = [
    "ArtifactSpec",
    "ArtifactType",
    "Param",
    "Step",
    "import_object",
    "load_step",
    "step_ref",
    "with_defaults",
    "step",
]

_SCALAR_TYPES = (str, int, float, bool)
_COLLECTION_TYPES = (list, dict)
"""Parameter and output-parameter types beside the scalars: KFP's ``List`` and ``Dict`` (JSON values; a
``ParallelFor`` loops over a list, ``Collected`` gathers a loop's values into one)."""
_UNIT = re.compile(r"\s*\(unit:\s*([^)]+)\)")


class ArtifactType(str, enum.Enum):
    """KFP v2 artifact types (``kfp.dsl.<name>``); the Kubeflow UI draws lineage and metrics from them."""

    ARTIFACT = "Artifact"
    DATASET = "Dataset"
    MODEL = "Model"
    METRICS = "Metrics"
    CLASSIFICATION_METRICS = "ClassificationMetrics"
    HTML = "HTML"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ArtifactSpec:
    """One input or output artifact of a step.

    Attributes:
        name: the artifact's name in the pipeline graph (``shards``, ``model``).
        type: its KFP artifact type.
        param: the step function's parameter that receives the artifact's local path; None for an output the
            function does not write itself (it then holds the step's facts as JSON).
        help: one line for docs and the Kubeflow UI.
        metadata: turns the step's facts into this output's metadata (what the Kubeflow UI shows); default:
            every scalar fact for Metrics outputs, none for the others.
    """

    name: str
    type: ArtifactType = ArtifactType.ARTIFACT
    param: str | None = None
    help: str = ""
    metadata: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", ArtifactType(self.type))
        if not self.name.isidentifier():
            raise InvalidParameter(f"artifact name {self.name!r} is not a Python identifier")

    def metadata_for(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """The metadata this output gets from the step's ``facts`` (a flat JSON-ready dict)."""
        if self.metadata is not None:
            return dict(self.metadata(dict(facts)))
        if self.type is ArtifactType.METRICS:
            return {k: v for k, v in facts.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return {}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """One parameter of a step (or of a pipeline, which lifts its steps' parameters).

    Attributes:
        name: the parameter name.
        type: ``str``, ``int``, ``float`` or ``bool``.
        default: the default value; :data:`inspect.Parameter.empty` when the parameter is required.
        optional: None is a valid value (the function's annotation is ``X | None``).
        help: one line of documentation, from the function's docstring.
        unit: the unit of the value (``s``, ``samples``), from ``(unit: ...)`` in the help line; "" if none.
    """

    name: str
    type: type
    default: Any = inspect.Parameter.empty
    optional: bool = False
    help: str = ""
    unit: str = ""

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty

    def coerce(self, raw: str) -> Any:
        """Turn a command-line string into a value of this parameter's type.

        Raises:
            InvalidParameter: the string is not a valid value (the message names the parameter and the type).
        """
        if self.optional and raw.strip().lower() in ("", "none", "null"):
            return None
        try:
            if self.type is bool:
                if raw.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return raw.strip().lower() in ("true", "1", "yes")
            if self.type is str:
                return raw
            if self.type in _COLLECTION_TYPES:
                import json

                value = json.loads(raw)
                if not isinstance(value, self.type):
                    raise ValueError
                return value
            return self.type(raw.strip())
        except ValueError:
            valid = {bool: "true or false", int: "an integer, e.g. 3", float: "a number, e.g. 0.001", list: "a JSON list, e.g. [1, 2]", dict: "a JSON object"}.get(self.type, self.type.__name__)
            raise InvalidParameter(f"parameter {self.name}={raw!r} is not a valid {self.type.__name__}; valid: {valid}") from None

    def check(self, value: Any) -> Any:
        """Check a Python value against this parameter's type (ints are accepted for floats).

        Raises:
            InvalidParameter: wrong type.
        """
        if value is None and self.optional:
            return None
        ok = isinstance(value, self.type) and not (self.type is not bool and isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if self.type is int and isinstance(value, float) and value.is_integer():
            return int(value)  # a JSON number from an engine that keeps every number a float (kfp.local's lists)
        if self.type is list and isinstance(value, tuple):
            return list(value)
        if not ok:
            raise InvalidParameter(
                f"parameter {self.name}={value!r} is {_a(type(value))}; valid: {_a(self.type)}"
            )
        return value

    def describe_default(self) -> str:
        return "(required)" if self.required else repr(self.default)


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
               dict: "a mapping"}


def _a(cls: type) -> str:
    """A type in words: ``an integer`` (it read "a int"), ``a number``, else ``a <name>``."""
    return _TYPE_WORDS.get(cls) or f"{'an' if cls.__name__[:1].lower() in 'aeiou' else 'a'} {cls.__name__}"


def with_defaults(func: Callable[..., Any], values: Mapping[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """``func``'s keyword defaults, updated with ``values`` and ``more`` (keys ``func`` does not take are dropped).

    For parameter checks written once: ``check_x_params(locals())`` inside ``x`` and ``check_x_params(epochs=0)``
    in a test both see every parameter, with ``x``'s own defaults for the ones not given.
    """
    params = inspect.signature(func).parameters
    out = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    for source in (values or {}, more):
        out.update({k: v for k, v in source.items() if k in params})
    return out


def _docstring_args(func: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The short description and ``{param: help}`` of a Google/numpy/reST docstring (``docstring_parser``)."""
    import docstring_parser

    text = inspect.getdoc(func) or ""
    parsed = None
    for style in (docstring_parser.DocstringStyle.GOOGLE, docstring_parser.DocstringStyle.AUTO):
        try:
            parsed = docstring_parser.parse(text, style=style)  # Google first: the project's style
        except docstring_parser.ParseError:
            continue
        if parsed.params:
            break
    if parsed is None:
        return "", {}
    helps = {p.arg_name: " ".join((p.description or "").split()) for p in parsed.params}
    return (parsed.short_description or "").strip(), helps


def _scalar_type(annotation: Any, *, where: str) -> tuple[type, bool]:
    """(type, optional) of a parameter annotation that is a scalar or ``scalar | None``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            inner, _ = _scalar_type(args[0], where=where)
            return inner, True
    elif annotation in _SCALAR_TYPES or annotation in _COLLECTION_TYPES:
        return annotation, False
    elif typing.get_origin(annotation) in _COLLECTION_TYPES:  # list[float], dict[str, int]
        return typing.get_origin(annotation), False
    raise InvalidParameter(
        f"{where} is annotated {annotation!r}; a step parameter must be str, int, float, bool, list or dict (or X | None), "
        "or be declared as an artifact, injected, or excluded"
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One pipeline step, defined once (see the module docstring). Build it with :func:`step`.

    Attributes:
        name: the step's name (``train``); also the default name of its calls in a pipeline.
        func: the function that does the work.
        inputs / outputs: its artifacts.
        params: its parameters, in signature order (derived from ``func``).
        candidates: where it can run, first preferred.
        retry: retries on one candidate (transient failures only).
        cacheable: whether an engine may answer it from a cache.
        device_bound: whether it runs on an accelerator of its candidate (then the engine falls back to the
            next candidate on a device failure).
        device_param: the function parameter that receives the torch device type (``cuda``, ``npu``,
            ``cpu``) of the candidate being tried; None when the function takes none.
        resources_param: the function parameter that receives the candidate's :class:`Resources`, or None.
        planner: the step places the pipeline's device-bound calls: its ``placements_param`` receives
            ``{call: candidates JSON}`` and it returns ``{call: candidate index}`` (see ``plan``).
        placements_param: see ``planner``.
        description: one line, from the docstring.
        check: validates parameter values before a run starts (called with the parameters it names).
        facts: turns the function's return value into a flat JSON-ready dict (records, metadata).
        summary: turns the facts into lines for people (``heteroflow run`` prints them after the run).
        progress_param: the function parameter that receives a progress callback ``report(**facts)`` (the
            engine records the facts it is given in the running attempt's record, at most twice a second).
        progress_context: for a function that reports progress another way: called with that callback, it
            returns a context manager inside which the function runs.
        ref: ``module:attribute`` under which this value can be imported in a step process.
        returns: its output parameters (KFP's ``task.output`` / ``task.outputs["name"]``): small values a later
            call's parameter or a condition reads, taken from the facts by name. From the function's return
            annotation: a scalar, ``list`` or ``dict`` is one output parameter, ``result``; a ``NamedTuple`` is one
            per field; or given as ``step(returns={"best": str})`` for a function that returns a dict (a ``dict``
            return annotation means facts, not an output parameter).
    """

    name: str
    func: Callable[..., Any]
    inputs: tuple[ArtifactSpec, ...] = ()
    outputs: tuple[ArtifactSpec, ...] = ()
    params: tuple[Param, ...] = ()
    candidates: Candidates = dataclasses.field(default_factory=lambda: Candidates([Resources()]))  # the host kind
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    cacheable: bool = True
    device_bound: bool = False
    device_param: str | None = None
    resources_param: str | None = None
    planner: bool = False
    placements_param: str | None = None
    description: str = ""
    check: Callable[..., None] | None = None
    facts: Callable[[Any], dict[str, Any]] | None = None
    summary: Callable[[dict[str, Any]], list[str]] | None = None
    progress_param: str | None = None
    progress_context: Callable[[Callable[..., None]], Any] | None = None
    ref: str = ""
    returns: tuple[Param, ...] = ()

    # -- views ----------------------------------------------------------------------------------------------

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise InvalidParameter(f"step {self.name!r} has no parameter {name!r}{did_you_mean([name], self.param_names)}; valid: {', '.join(self.param_names)}")

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def input(self, name: str) -> ArtifactSpec:
        return _find(self.inputs, name, f"step {self.name!r} has no input artifact")

    def output(self, name: str) -> ArtifactSpec:
        return _find(self.outputs, name, f"step {self.name!r} has no output artifact")

    def returned(self, name: str) -> Param:
        """The output parameter ``name``.

        Raises:
            InvalidParameter: the step has none of that name (the message lists its outputs).
        """
        for p in self.returns:
            if p.name == name:
                return p
        valid = [p.name for p in self.returns] + [s.name for s in self.outputs]
        raise InvalidParameter(f"step {self.name!r} has no output {name!r}; valid: {', '.join(valid) or 'none'}")

    def returned_values(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """The output parameters' values in ``facts``, type-checked.

        Raises:
            InvalidParameter: an output parameter missing from the facts, or of the wrong type (a bug in the step:
                permanent).
        """
        out: dict[str, Any] = {}
        for p in self.returns:
            if p.name not in facts:
                raise InvalidParameter(f"step {self.name!r} returned no value for its output parameter {p.name!r}; it returned {sorted(facts)}")
            out[p.name] = p.check(facts[p.name])
        return out

    def with_options(
        self,
        *,
        candidates: Candidates | Iterable[Resources | str] | None = None,
        retry: RetryPolicy | None = None,
        cacheable: bool | None = None,
    ) -> Step:
        """A copy with other candidates, retry policy or caching (the function and parameters stay)."""
        changes: dict[str, Any] = {}
        if candidates is not None:
            changes["candidates"] = candidates if isinstance(candidates, Candidates) else Candidates(candidates)
        if retry is not None:
            changes["retry"] = retry
        if cacheable is not None:
            changes["cacheable"] = cacheable
        return dataclasses.replace(self, **changes)

    def to_facts(self, result: Any) -> dict[str, Any]:
        """The step's facts from the function's return value (``facts`` hook, a dict, or a dataclass)."""
        if self.facts is not None:
            return dict(self.facts(result))
        if result is None:
            return {}
        if isinstance(result, tuple) and hasattr(result, "_asdict"):  # a NamedTuple: one fact per field
            return {k: _jsonable(v) for k, v in result._asdict().items()}
        if isinstance(result, Mapping):
            return dict(result)
        if dataclasses.is_dataclass(result) and not isinstance(result, type):
            return {f.name: _jsonable(getattr(result, f.name)) for f in dataclasses.fields(result)}
        return {"result": _jsonable(result)}

    def summarize(self, facts: Mapping[str, Any]) -> list[str]:
        """Lines for people about a successful run of this step: its ``summary`` hook's; without one, one line of
        its scalar results (``choose_best: best_learning_rate 0.001, best_accuracy 0.99``: numbers, booleans and
        short strings, at most 8), so a step of yours says what it found; empty when it has none."""
        if self.summary is None:
            shown = [f"{k} {_scalar_text(v)}" for k, v in facts.items()
                     if isinstance(v, (int, float, bool)) or (isinstance(v, str) and 0 < len(v) <= 80 and "\n" not in v)]
            return [f"{self.name}: {', '.join(shown[:8])}" + (f" (and {len(shown) - 8} more in run.json)" if len(shown) > 8 else "")] if shown else []
        try:
            return list(self.summary(dict(facts)))
        except (KeyError, TypeError, ValueError):  # facts of an older record: say nothing rather than fail
            return []

    def check_params(self, values: Mapping[str, Any], *, candidates: Any = None) -> None:
        """Run the step's ``check`` with the values it names (a value missing from ``values`` takes the
        parameter's default), so a bad value fails before any step runs.

        Args:
            values: parameter values by name.
            candidates: the call's :class:`~heteroflow.components.resources.Candidates`, handed to a check that
                has a keyword-only ``candidates`` argument (values that only make sense on some candidates, such as
                one batch size per worker); None: not known here, and such a check skips what needs them.

        Raises:
            InvalidParameter: from the check.
        """
        if self.check is None:
            return
        wanted = inspect.signature(self.check).parameters
        extra = {"candidates": candidates} if "candidates" in wanted and wanted["candidates"].kind is inspect.Parameter.KEYWORD_ONLY else {}
        if any(p.kind is p.VAR_KEYWORD for p in wanted.values()):  # a check that takes every value
            full = {p.name: p.default for p in self.params if not p.required}
            full.update(values)
            self.check(**full, **extra)
            return
        kwargs = dict(extra)
        for name in wanted:
            if name in extra:
                continue
            if name in values:
                kwargs[name] = values[name]
            elif name in self.param_names and not self.param(name).required:
                kwargs[name] = self.param(name).default
        self.check(**kwargs)


def _scalar_text(value: Any) -> str:
    """A result as the summary shows it: floats to 4 significant digits (``0.9866``, ``0.001``)."""
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:.4g}"
    return str(value)


def _find(specs: Iterable[ArtifactSpec], name: str, what: str) -> ArtifactSpec:
    specs = tuple(specs)
    for s in specs:
        if s.name == name:
            return s
    raise InvalidParameter(f"{what} {name!r}; valid: {', '.join(s.name for s in specs) or 'none'}")


def _jsonable(value: Any) -> Any:
    import os

    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    return value


def step(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    inputs: Iterable[ArtifactSpec] = (),
    outputs: Iterable[ArtifactSpec] = (),
    candidates: Candidates | Iterable[Resources | str] | None = None,
    retry: RetryPolicy | None = None,
    cacheable: bool = True,
    device_bound: bool = False,
    device_param: str | None = None,
    resources_param: str | None = None,
    planner: bool = False,
    placements_param: str | None = None,
    exclude: Iterable[str] = (),
    check: Callable[..., None] | None = None,
    facts: Callable[[Any], dict[str, Any]] | None = None,
    summary: Callable[[dict[str, Any]], list[str]] | None = None,
    progress_param: str | None = None,
    progress_context: Callable[[Callable[..., None]], Any] | None = None,
    ref: str | None = None,
    returns: Mapping[str, type] | None = None,
) -> Step:
    """Define a :class:`Step` from a plain function: ``STEP = step(func, ...)``, or as a decorator,
    ``@step(...)`` (or bare ``@step``) above the function, which then names the Step.

    The function's parameters are sorted out once: each one named by an artifact's ``param`` receives that
    artifact's local path; ``device_param``, ``resources_param`` and ``placements_param`` are injected by the
    engine; ``exclude`` keeps the function's default; every other parameter is a step parameter, whose type
    (``str``/``int``/``float``/``bool``, or ``X | None``), default and help (docstring ``Args:``) come from the
    function. A required parameter must be bound by the pipeline.

    Args:
        func: the function. For a step to run in another process (KFP, Airflow, ``heteroflow step``) it must
            be importable by module and name, and so must the value this returns (``ref``).
        name: step name; default the function's name.
        ref: ``module:attribute`` of the returned value; default: guessed when the value is assigned to a
            module-level name (checked at render time by :func:`load_step`).
        returns: output parameter name -> type (str, int, float, bool, list or dict), read from the facts the
            function returns; default: from its return annotation (see :attr:`Step.returns`).

    Raises:
        InvalidParameter: an artifact maps to a parameter the function lacks, or a parameter has a type an
            engine cannot pass.
    """
    if func is None:  # @step(...): the same arguments, applied to the function below
        options = dict(locals())
        options.pop("func")
        return functools.partial(step, **options)  # type: ignore[return-value]
    inputs, outputs = tuple(inputs), tuple(outputs)
    signature = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:  # an annotation that does not resolve
        raise InvalidParameter(f"cannot read the annotations of {func.__qualname__}: {exc}") from None
    description, helps = _docstring_args(func)
    names = [s.name for s in (*inputs, *outputs)]
    twice = first_duplicate(names)
    if twice is not None:
        where = [f"inputs[{i}]" if i < len(inputs) else f"outputs[{i - len(inputs)}]" for i in twice]
        raise InvalidParameter(
            f"step {name or func.__name__!r} names the artifact {names[twice[0]]!r} twice ({where[0]} and "
            f"{where[1]}); give each artifact its own name"
        )
    special = {s.param for s in (*inputs, *outputs) if s.param} | set(exclude)
    for injected in (device_param, resources_param, placements_param, progress_param):
        if injected:
            special.add(injected)
    for p in special:
        if p not in signature.parameters:
            raise InvalidParameter(f"{func.__qualname__} has no parameter {p!r} (named by the step definition)")
    params = []
    for p in signature.parameters.values():
        if p.name in special or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        typ, optional = _scalar_type(hints.get(p.name, p.annotation), where=f"{func.__qualname__}({p.name})")
        help_text = helps.get(p.name, "")
        unit_match = _UNIT.search(help_text)
        unit = unit_match[1].strip() if unit_match else ""
        help_text = _UNIT.sub("", help_text).strip()
        params.append(Param(name=p.name, type=typ, default=p.default, optional=optional, help=help_text, unit=unit))
    outs = _returns(func, hints, returns, name or func.__name__)
    clash = sorted({p.name for p in outs} & ({s.name for s in (*inputs, *outputs)} | {p.name for p in params}))
    if clash:
        raise InvalidParameter(f"step {name or func.__name__!r}: {clash[0]!r} is both an output parameter and an artifact or a parameter; rename one")
    if device_bound and not (device_param or resources_param):
        raise InvalidParameter(f"device-bound step {name or func.__name__!r} needs device_param or resources_param")
    if planner and not placements_param:
        raise InvalidParameter(f"planner step {name or func.__name__!r} needs placements_param")
    return Step(
        name=name or func.__name__,
        func=func,
        inputs=inputs,
        outputs=outputs,
        params=tuple(params),
        candidates=(
            Candidates([Resources()])  # the host kind (cpu)
            if candidates is None
            else candidates if isinstance(candidates, Candidates) else Candidates(candidates)
        ),
        retry=retry if retry is not None else RetryPolicy(),
        cacheable=cacheable,
        device_bound=device_bound,
        device_param=device_param,
        resources_param=resources_param,
        planner=planner,
        placements_param=placements_param,
        description=description,
        check=check,
        facts=facts,
        summary=summary,
        progress_param=progress_param,
        progress_context=progress_context,
        ref=ref or "",
        returns=outs,
    )


def _returns(func: Callable[..., Any], hints: Mapping[str, Any], given: Mapping[str, type] | None, name: str) -> tuple[Param, ...]:
    """The output parameters of a step (see :attr:`Step.returns`)."""
    if given is not None:
        out = []
        for key, typ in given.items():
            if not key.isidentifier():
                raise InvalidParameter(f"step {name!r}: output parameter name {key!r} is not a Python identifier")
            kind, optional = _scalar_type(typ, where=f"step {name!r} returns[{key!r}]")
            out.append(Param(name=key, type=kind, optional=optional))
        return tuple(out)
    annotation = hints.get("return")
    if annotation is None or annotation is type(None):
        return ()
    if isinstance(annotation, type) and issubclass(annotation, tuple) and hasattr(annotation, "_fields"):
        fields = typing.get_type_hints(annotation)
        out = []
        for key in annotation._fields:
            kind, optional = _scalar_type(fields.get(key, str), where=f"{func.__qualname__} -> {annotation.__name__}.{key}")
            out.append(Param(name=key, type=kind, optional=optional))
        return tuple(out)
    try:
        kind, optional = _scalar_type(annotation, where=f"{func.__qualname__} return")
    except InvalidParameter:
        return ()  # a dataclass: its fields are facts, no output parameter unless ``returns=`` names some
    if kind is dict:
        return ()  # a dict return is the step's facts (see Step.to_facts), not one value
    return (Param(name="result", type=kind, optional=optional),)


def step_ref(value: Step) -> str:
    """The ``module:attribute`` under which a step process imports ``value``'s definition: its ``ref``, else
    the module-level name in its function's module that holds a Step with the same function.

    Raises:
        InvalidParameter: none is found, or the function lives in ``__main__`` (a step process cannot import
            it): define the step in a module.
    """
    if value.ref:
        return value.ref
    module_name = getattr(value.func, "__module__", None) or ""
    if module_name == "__main__":
        raise InvalidParameter(
            f"step {value.name!r} is defined in __main__, which a step process cannot import; define it in a module "
            "(a file on PYTHONPATH or in your package) and import it from there"
        )
    import sys

    module = sys.modules.get(module_name)
    for attr, candidate in vars(module).items() if module else ():
        if isinstance(candidate, Step) and candidate.func is value.func:
            return f"{module_name}:{attr}"
    raise InvalidParameter(
        f"step {value.name!r}: no module-level name in {module_name!r} holds it; assign the step to a module-level "
        "name, or pass ref='module:attribute' to step()"
    )


def import_object(ref: str, *, what: str, example: str) -> Any:
    """The object named by ``module:attribute`` (dotted attributes allowed), for ``what`` (named in errors).

    Raises:
        InvalidParameter: not of that form, the module cannot be imported, or the attribute is missing.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidParameter(f"{what} {ref!r} is not 'module:attribute' (e.g. {example})")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidParameter(
            f"{what} {ref!r}: cannot import {module_name!r} ({exc}); the module must be importable where it is used "
            "(installed, or on PYTHONPATH)"
        ) from None
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise InvalidParameter(f"{what} {ref!r}: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    return value


def load_step(ref: str) -> Step:
    """Import the :class:`Step` named by ``module:attribute`` (how step processes find their definition).

    Raises:
        InvalidParameter: the module or attribute does not exist, or is not a Step.
    """
    value = import_object(ref, what="step reference", example="heteroflow.components.training.step:TRAIN")
    if not isinstance(value, Step):
        raise InvalidParameter(f"step reference {ref!r} is not a heteroflow Step ({type(value).__name__})")
    return value
