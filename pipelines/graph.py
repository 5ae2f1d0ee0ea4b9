"""A pipeline, defined once: a graph of step calls, in plain Python.

A :class:`Pipeline` holds its calls in order; each :class:`Call` is one use of a
:class:`~heteroflow.components.core.step.Step` with its inputs bound to earlier calls' outputs, and its parameters
bound to pipeline parameters or constants. A step parameter the pipeline does not bind becomes a pipeline
parameter of the same name, with the step's type, default, unit and help (two calls that leave the same name
unbound share one pipeline parameter, e.g. ``seed``). Renderers take a Pipeline: KFP
(:mod:`heteroflow.pipelines.kfp.render`), Airflow (:mod:`heteroflow.dags`), the in-process runner
(:mod:`heteroflow.pipelines.engines.inprocess`) and ``heteroflow params``.

Example::

    from heteroflow.components.steps import PREWARM, PREPROCESS, TRAIN
    from heteroflow.pipelines.graph import Pipeline

    p = Pipeline("my-pipeline")
    data = p.add(PREWARM, source_uri=p.param("dataset_uri", help="folder of .csv files"))
    shards = p.add(PREPROCESS, dataset=data.outputs.dataset, test_fraction=0.2)
    p.add(TRAIN, shards=shards.outputs.shards, candidates=["gpu:count=1", "cpu:cpu=4"])

A call's candidates and retry policy default to its step's. When the pipeline has a planner call (the ``plan``
step), it places every device-bound call; without one, each device-bound call starts at its first candidate.
Every device-bound call falls back to its next candidate on a device failure.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from heteroflow.components.errors import HeteroflowError, InvalidParameter, Problems, did_you_mean
from heteroflow.components.resources import Candidates, Resources, RetryPolicy
from heteroflow.components.core.step import Param, Step

__all__ = ["Call", "Const", "OutputRef", "ParamRef", "Pipeline", "SecretEnv", "load_pipeline"]

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_CALL = re.compile(r"^[a-z](?:[a-z0-9_]|-(?=[a-z0-9])){0,40}$")  # dashes as in KFP task names (`train-large`)
_RESERVED_CALLS = ("prepare-run", "record-run")  # Airflow's setup and teardown tasks


@dataclasses.dataclass(frozen=True, slots=True)
class ParamRef:
    """A reference to a pipeline parameter (made by :meth:`Pipeline.param`), with optional overrides of the
    default and help it takes from the step parameter it is bound to."""

    name: str
    default: Any = inspect.Parameter.empty
    help: str = ""
    unit: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class OutputRef:
    """An output artifact of an earlier call: ``call.outputs.<name>``."""

    call: str
    output: str


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    """A constant bound to a step parameter at the call."""

    value: Any


Binding = ParamRef | OutputRef | Const

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True, slots=True)
class SecretEnv:
    """Environment variables a call's pods take from a Kubernetes Secret (credentials never travel as pipeline
    parameters). KFP renders it with ``kfp.kubernetes.use_secret_as_env``; Airflow pods with ``V1EnvVar``
    ``secretKeyRef``; local runs read the same variables from the environment.

    Args:
        secret: the Secret's name (a DNS subdomain name).
        env: environment variable -> key in the Secret, e.g. ``{"AWS_ACCESS_KEY_ID": "access_key"}``.

    Raises:
        InvalidParameter: a bad Secret name or environment variable name, or no variables.
    """

    secret: str
    env: Mapping[str, str]

    def __post_init__(self) -> None:
        if not _K8S_NAME.match(self.secret or ""):
            raise InvalidParameter(f"secret={self.secret!r} is not a Kubernetes Secret name; valid: [a-z0-9]([-a-z0-9.]*[a-z0-9])?")
        if not self.env:
            raise InvalidParameter(f"secret {self.secret!r}: env is empty; valid: {{'ENV_VAR': 'key in the Secret'}}")
        for var, key in self.env.items():
            if not _ENV_NAME.match(var):
                raise InvalidParameter(f"secret {self.secret!r}: {var!r} is not an environment variable name")
            if not isinstance(key, str) or not key:
                raise InvalidParameter(f"secret {self.secret!r}: the key for {var} is empty")
        object.__setattr__(self, "env", dict(self.env))


class _Outputs:
    """``call.outputs.model`` / ``call.outputs["model"]``: references to a call's output artifacts."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def __getattr__(self, name: str) -> OutputRef:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Any:
        step = self._call.step
        if any(p.name == name for p in step.returns):  # an output parameter (pipelines.control)
            from heteroflow.pipelines.control import ValueRef

            return ValueRef(self._call.name, name, step.returned(name).type)
        if not any(s.name == name for s in step.outputs):
            step.returned(name)  # raises with the valid names (artifacts and output parameters)
        return OutputRef(self._call.name, name)

    def __iter__(self) -> Iterator[str]:
        return iter([*(s.name for s in self._call.step.outputs), *(p.name for p in self._call.step.returns)])


@dataclasses.dataclass(slots=True, kw_only=True)
class Call:
    """One use of a step in a pipeline.

    Attributes:
        name: unique in the pipeline (``train``); names its tasks and records.
        step: the step.
        bindings: step parameter or input artifact name -> what feeds it.
        candidates: where this call may run (default: the step's).
        retry: its retry policy (default: the step's).
        cacheable: whether an engine may answer it from a cache (default: the step's).
        secrets: Kubernetes Secrets whose keys its pods get as environment variables.
        groups: the conditions, loops and sub-pipelines it was added in, outermost first
            (:mod:`heteroflow.pipelines.control`).
        env: plain environment variables of its pods (and of the step process on local engines).
        volumes: mount path -> volume (:mod:`heteroflow.pipelines.volumes`).
        run_after: calls it starts after although it reads nothing from them (:meth:`after`).
        base_image: its container image (default: the pipeline's image).
        packages_to_install: pip packages installed before it runs (KFP's ``packages_to_install``).
        display_name: what the Kubeflow UI and Airflow show for it (default: its name).
    """

    name: str
    step: Step
    bindings: dict[str, Binding]
    candidates: Candidates
    retry: RetryPolicy
    cacheable: bool
    secrets: tuple[SecretEnv, ...] = ()
    groups: tuple[Any, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    volumes: dict[str, Any] = dataclasses.field(default_factory=dict)
    run_after: tuple[str, ...] = ()
    base_image: str | None = None
    packages_to_install: tuple[str, ...] = ()
    display_name: str | None = None

    @property
    def outputs(self) -> _Outputs:
        return _Outputs(self)

    def after(self, *calls: Call | str) -> Call:
        """Start this call after ``calls`` although it reads nothing from them (KFP's ``task.after``); returns it.

        Raises:
            InvalidParameter: a call that is not a Call or a call name, or this call itself.
        """
        names = list(self.run_after)
        for other in calls:
            name = other.name if isinstance(other, Call) else other
            if not isinstance(name, str):
                raise InvalidParameter(f"{self.name}: after({other!r}): valid: earlier calls (the values p.add returned) or their names")
            if name == self.name:
                raise InvalidParameter(f"{self.name}: a call cannot run after itself")
            if name not in names:
                names.append(name)
        self.run_after = tuple(names)
        return self

    @property
    def output(self) -> Any:
        """The step's one output parameter (KFP's ``task.output``; see :mod:`heteroflow.pipelines.control`).

        Raises:
            InvalidParameter: the step has no output parameter, or several (use ``outputs["name"]``).
        """
        if len(self.step.returns) != 1:
            names = ", ".join(p.name for p in self.step.returns) or "none"
            raise InvalidParameter(f"{self.name}: step {self.step.name!r} has {len(self.step.returns)} output parameters ({names}); use .outputs[NAME]")
        return self.outputs[self.step.returns[0].name]

    @property
    def device_bound(self) -> bool:
        return self.step.device_bound

    def input_refs(self) -> dict[str, OutputRef]:
        """Input artifact name -> the output that feeds it."""
        return {k: v for k, v in self.bindings.items() if isinstance(v, OutputRef)}

    def param_bindings(self) -> dict[str, Any]:
        """Step parameter name -> pipeline parameter, constant, or a control-flow reference (an output parameter,
        a loop item, a collected list: :mod:`heteroflow.pipelines.control`)."""
        return {k: v for k, v in self.bindings.items() if not isinstance(v, OutputRef)}


def _call_options(call: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``candidates``, ``retry``, ``cacheable`` and ``secrets`` of a call, checked and in their own types.

    Raises:
        InvalidParameter: a value of the wrong type (the message names the call, the field and the valid forms).
    """
    out: dict[str, Any] = {}
    for key, value in changes.items():
        where = f"{call}: {key}="
        if key == "candidates":
            if isinstance(value, Candidates):
                out[key] = value
            elif isinstance(value, (str, Resources)) or not isinstance(value, Iterable):
                raise InvalidParameter(
                    f"{where}{value!r} is not a list of candidates; valid: Candidates([...]) or a list of Resources or "
                    "'KIND:key=value' specs, most preferred first"
                )
            else:
                out[key] = Candidates(value)
        elif key == "retry":
            if isinstance(value, RetryPolicy):
                out[key] = value
            elif isinstance(value, Mapping):
                fields = [f.name for f in dataclasses.fields(RetryPolicy)]
                unknown = sorted(set(value) - set(fields))
                if unknown:
                    raise InvalidParameter(f"{where}{dict(value)!r}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
                try:
                    out[key] = RetryPolicy(**value)
                except HeteroflowError as exc:
                    raise InvalidParameter(f"{where}{dict(value)!r}: {exc}") from None
            else:
                raise InvalidParameter(f"{where}{value!r} is not a retry policy; valid: RetryPolicy(retries=..., ...) or a dict of its fields")
        elif key == "cacheable":
            if not isinstance(value, bool):
                raise InvalidParameter(f"{where}{value!r} is not a bool; valid: True or False")
            out[key] = value
        elif key == "secrets":
            if isinstance(value, (SecretEnv, str, Mapping)) or not isinstance(value, Iterable):
                raise InvalidParameter(f"{where}{value!r} is not a list of SecretEnv; valid: [SecretEnv(secret=..., env={{...}})]")
            items = tuple(value)
            bad = [v for v in items if not isinstance(v, SecretEnv)]
            if bad:
                raise InvalidParameter(f"{where}: {bad[0]!r} is not a SecretEnv; valid: SecretEnv(secret='name', env={{'VAR': 'key'}})")
            out[key] = items
        elif key in _STEP_OPTIONS:
            out[key] = _step_option(call, key, value)
        else:
            valid = ", ".join(["candidates", "retry", "cacheable", "secrets", *_STEP_OPTIONS])
            raise InvalidParameter(f"{call}: {key!r} cannot be set; valid: {valid}")
    return out


_STEP_OPTIONS = ("env", "volumes", "run_after", "base_image", "packages_to_install", "display_name")


def _step_option(call: str, key: str, value: Any) -> Any:
    """One of :data:`_STEP_OPTIONS`, checked (:mod:`heteroflow.pipelines.volumes`)."""
    from heteroflow.pipelines import volumes

    if key == "env":
        return volumes.check_env(call, value)
    if key == "volumes":
        return volumes.check_volumes(call, value)
    if key == "packages_to_install":
        return volumes.check_packages(call, value)
    if key == "run_after":
        items = [value] if isinstance(value, (str, Call)) else list(value or ())
        return tuple(v.name if isinstance(v, Call) else v for v in items)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidParameter(f"{call}: {key}={value!r} is not a non-empty string")
    return value


class Pipeline:
    """A graph of step calls (see the module docstring).

    Args:
        name: the pipeline's name (lowercase letters, digits and ``-``; shown in the Kubeflow UI).
        description: one line.

    Raises:
        InvalidParameter: a bad name.
    """

    def __init__(self, name: str, *, description: str = "", display_name: str | None = None, pipeline_root: str | None = None) -> None:
        if not _NAME.match(name):
            raise InvalidParameter(f"pipeline name {name!r} is not valid; valid: [a-z][a-z0-9-]*, up to 63 characters")
        self.name = name
        self.description = description
        self.display_name = display_name  # the Kubeflow UI's and Airflow's name for it (default: name)
        self.pipeline_root = pipeline_root  # KFP's pipeline_root: where the run's artifacts go (gs://, s3://, minio://)
        self._calls: dict[str, Call] = {}
        self._params: dict[str, Param] = {}
        self._owners: dict[str, str] = {}  # pipeline parameter made for one call's unbound step parameter -> that call

    # -- building -------------------------------------------------------------------------------------------

    def param(self, name: str, *, default: Any = inspect.Parameter.empty, help: str = "", unit: str = "") -> ParamRef:
        """A pipeline parameter to bind to a step parameter (its type comes from that step parameter).

        Args:
            name: the pipeline parameter's name.
            default: its default (default: the step parameter's).
            help: its help line (default: the step parameter's).
        """
        import keyword

        if not name.isidentifier() or keyword.iskeyword(name):  # 'lambda': in-process ran, compile raised a bare ValueError
            raise InvalidParameter(f"parameter name {name!r} is not a Python identifier" + (" (it is a keyword)" if keyword.iskeyword(name) else "")
                                   + "; valid: letters, digits and _, not starting with a digit, not a Python keyword (e.g. "
                                   + f"{name}_)")
        return ParamRef(name, default, help, unit)

    def add(
        self,
        step: Step | Pipeline,
        *,
        name: str | None = None,
        candidates: Candidates | Iterable[Resources | str] | None = None,
        retry: RetryPolicy | None = None,
        cacheable: bool | None = None,
        secrets: Iterable[SecretEnv] = (),
        env: Mapping[str, str] | None = None,
        volumes: Mapping[str, Any] | None = None,
        after: Iterable[Call | str] | Call | str = (),
        base_image: str | None = None,
        packages_to_install: Iterable[str] | None = None,
        display_name: str | None = None,
        **bindings: Any,
    ) -> Call:
        """Add a call of ``step``; returns it (its ``outputs`` feed later calls).

        Args:
            step: the step; or a Pipeline, added as a sub-pipeline (its parameters and inputs bound by
                ``bindings``; returns a :class:`~heteroflow.pipelines.subpipelines.SubCall`; see
                :mod:`heteroflow.pipelines.subpipelines`).
            name: the call's name; default the step's name.
            candidates: this call's candidates (default: the step's), most preferred first.
            retry: this call's retry policy (default: the step's).
            cacheable: whether this call may be cached (default: the step's).
            secrets: Kubernetes Secrets whose keys become environment variables of this call's pods (e.g. the
                storage credentials prewarm needs); see :class:`SecretEnv`.
            env: plain environment variables, ``{"NAME": "value"}``.
            volumes: ``{mount path: volume}``: :class:`~heteroflow.pipelines.volumes.CreatePVC`, ``PVC``,
                ``ConfigMapVolume``, ``SecretVolume``.
            after: earlier calls this one starts after without reading their outputs (also :meth:`Call.after`).
            base_image: this call's container image (KFP ``base_image``, the Airflow pod's ``image``).
            packages_to_install: pip packages KFP installs before the step runs.
            display_name: the name the Kubeflow UI and Airflow show.
            bindings: input artifact -> an earlier call's output (``other.outputs.model``); step parameter ->
                a :meth:`param` reference or a constant. Unbound step parameters become pipeline parameters.

        Raises:
            InvalidParameter: a duplicate or bad call name, an unknown binding, an unbound input artifact, a
                reference to a call not added yet, a constant of the wrong type, or a parameter name shared by
                two calls with different types or defaults (bind one of them explicitly).
        """
        if isinstance(step, Pipeline):  # a sub-pipeline (KFP's pipeline-as-component)
            from heteroflow.pipelines.subpipelines import add_pipeline

            if candidates is not None or retry is not None or cacheable is not None or secrets:
                raise InvalidParameter(f"{name or step.name}: a sub-pipeline takes no call options; set them on its calls")
            return add_pipeline(self, step, name=name, **bindings)  # type: ignore[return-value]
        from heteroflow.pipelines import control

        groups = control.current_groups()
        call_name = name or step.name
        if not _CALL.match(call_name) or call_name in _RESERVED_CALLS:
            raise InvalidParameter(
                f"call name {call_name!r} is not valid; valid: [a-z][a-z0-9_-]*, up to 41 characters, no '-' at the end or "
                f"twice in a row, not {' or '.join(_RESERVED_CALLS)}"
            )
        if call_name in self._calls:
            raise InvalidParameter(f"pipeline {self.name!r} already has a call named {call_name!r}; pass name=...")
        twin = next((c for c in self._calls if c.replace("-", "_") == call_name.replace("-", "_")), None)
        if twin is not None:
            raise InvalidParameter(f"call names {twin!r} and {call_name!r} are the same name in KFP (a Python identifier); rename one")
        bound: dict[str, Binding] = {}
        new_params: dict[str, Param] = {}
        for key, value in bindings.items():
            if key in {s.name for s in step.inputs}:
                if isinstance(value, control.InputRef):  # a sub-pipeline's own input (bound when it is added)
                    if value.type is not step.input(key).type:
                        raise InvalidParameter(f"{call_name}: input {key!r} is a {step.input(key).type.value}, but pipeline input {value.name!r} is a {value.type.value}")
                    bound[key] = value  # type: ignore[assignment]
                    continue
                if not isinstance(value, OutputRef):
                    raise InvalidParameter(f"{call_name}: input artifact {key!r} must be an earlier call's output (call.outputs.NAME)")
                if value.call not in self._calls:
                    raise InvalidParameter(f"{call_name}: {key!r} refers to call {value.call!r}, which is not in the pipeline yet")
                src = self._calls[value.call].step.output(value.output)
                dst = step.input(key)
                if src.type is not dst.type:
                    raise InvalidParameter(
                        f"{call_name}: input {key!r} is a {dst.type.value}, but {value.call}.{value.output} is a {src.type.value}"
                    )
                bound[key] = value
            elif key in step.param_names:
                param = step.param(key)
                if isinstance(value, ParamRef):
                    merged = Param(
                        name=value.name,
                        type=param.type,
                        default=param.default if value.default is inspect.Parameter.empty else param.check(value.default),
                        optional=param.optional,
                        help=value.help or param.help,
                        unit=value.unit or param.unit,
                    )
                    new_params[value.name] = self._merge_param(merged, call_name, new_params)
                    bound[key] = ParamRef(value.name)
                elif control.is_channel(value):  # an output parameter, a loop item, a collected list
                    bound[key] = control.bind_param(self, call_name, param, value, groups)
                elif isinstance(value, OutputRef):
                    raise InvalidParameter(f"{call_name}: parameter {key!r} cannot take an artifact ({value.call}.{value.output})")
                else:
                    bound[key] = Const(param.check(value.value if isinstance(value, Const) else value))
            else:
                valid = [s.name for s in step.inputs] + list(step.param_names)
                raise InvalidParameter(f"{call_name}: step {step.name!r} has no input or parameter {key!r}; valid: {', '.join(valid)}")
        missing = [s.name for s in step.inputs if s.name not in bound]
        if missing:
            raise InvalidParameter(f"{call_name}: input artifact(s) {', '.join(missing)} must be bound to earlier calls' outputs")
        own: dict[str, Param] = {}
        for param in step.params:
            if param.name not in bound:
                # per call: `seed` while no other call has one, else `<call>.seed` (the other call's becomes
                # `<other>.seed` too); a parameter shared on purpose is a p.param(...) bound to several calls
                name = param.name
                if name in self._params or name in new_params or any(n.endswith(f".{name}") for n in self._params):
                    name = f"{call_name}.{param.name}"
                own[name] = dataclasses.replace(param, name=name)
                bound[param.name] = ParamRef(name)
        if step.planner and any(c.step.planner for c in self._calls.values()):
            raise InvalidParameter(f"{call_name}: the pipeline already has a planner call; one places every device-bound call")
        if step.planner and any(c.device_bound for c in self._calls.values()):
            raise InvalidParameter(f"{call_name}: a planner must come before the device-bound calls it places")
        given = {"candidates": candidates, "retry": retry, "cacheable": cacheable}
        more = {"env": env, "volumes": volumes, "run_after": after, "base_image": base_image, "packages_to_install": packages_to_install, "display_name": display_name}
        options = _call_options(call_name, {**{k: v for k, v in given.items() if v is not None}, "secrets": secrets, **more})
        for earlier in options["run_after"]:
            if earlier not in self._calls:
                raise InvalidParameter(f"{call_name}: after={earlier!r} is not an earlier call; calls: {', '.join(self._calls) or '(none)'}")
        call = Call(
            name=call_name,
            step=step,
            bindings=bound,
            candidates=options.get("candidates", step.candidates),
            retry=options.get("retry", step.retry),
            cacheable=options.get("cacheable", step.cacheable),
            secrets=options["secrets"],
            groups=groups,
            **{k: options[k] for k in _STEP_OPTIONS},
        )
        control.register(self, groups, call)
        for name in [*new_params, *own]:
            short = name.rsplit(".", 1)[-1]
            owner = self._owners.get(short)
            if owner is not None and (name != short or name in new_params):
                self._qualify(short)  # `seed` of an earlier call is now ambiguous: it becomes `<that call>.seed`
        self._params.update(new_params)
        self._params.update(own)
        self._owners.update({name: call_name for name in own if "." not in name})
        self._calls[call_name] = call
        return call

    def set_outputs(self, **refs: Any) -> None:
        """What this pipeline returns when it is a step of another (KFP's pipeline outputs): name -> an output
        artifact or output parameter of one of its calls (see :mod:`heteroflow.pipelines.subpipelines`)."""
        from heteroflow.pipelines.subpipelines import set_outputs

        set_outputs(self, refs)

    def _qualify(self, short: str) -> None:
        """Rename the pipeline parameter ``short``, made for one call's unbound step parameter, ``<call>.short``."""
        owner = self._owners.pop(short)
        qualified = f"{owner}.{short}"
        self._params = {(qualified if k == short else k): (dataclasses.replace(v, name=qualified) if k == short else v) for k, v in self._params.items()}
        call = self._calls[owner]
        call.bindings = {k: (ParamRef(qualified) if isinstance(b, ParamRef) and b.name == short else b) for k, b in call.bindings.items()}

    @property
    def aliases(self) -> dict[str, list[str]]:
        """Short names that stand for several calls' parameters: ``{"seed": ["preprocess.seed", "train.seed"]}``.
        Setting ``seed`` sets each of them (unless it is set by its own name)."""
        out: dict[str, list[str]] = {}
        for name in self._params:
            if "." in name:
                short = name.rsplit(".", 1)[-1]
                if short not in self._params:
                    out.setdefault(short, []).append(name)
        return out

    @property
    def kfp_spellings(self) -> dict[str, str]:
        """KFP's spelling of each parameter whose name is not a Python identifier -> the parameter:
        ``{"preprocess_seed": "preprocess.seed", "train_large_seed": "train-large.seed"}``. Both spellings are
        accepted wherever arguments are given (CLI, :meth:`arguments`); ``heteroflow params`` shows the mapping."""
        return {n.replace(".", "_").replace("-", "_"): n for n in self._params if not n.isidentifier()}

    def _merge_param(self, param: Param, call: str, pending: Mapping[str, Param]) -> Param:
        existing = pending.get(param.name) or self._params.get(param.name)
        if existing is None or (param.name in self._owners and param.name not in pending):
            return param  # new, or a name an earlier call took for itself (add() qualifies that one)
        if existing.type is not param.type or existing.default != param.default or existing.optional != param.optional:
            raise InvalidParameter(
                f"{call}: pipeline parameter {param.name!r} is already a {existing.type.__name__} with default "
                f"{existing.describe_default()}; this call's is a {param.type.__name__} with default "
                f"{param.describe_default()}: bind it explicitly (e.g. {param.name}=p.param('{call}_{param.name}'))"
            )
        return existing

    def copy(self, name: str | None = None, *, description: str | None = None) -> Pipeline:
        """A copy to extend (each call copied with :func:`dataclasses.replace`, so every field of a call is kept;
        steps are shared values)."""
        other = Pipeline(
            name or self.name,
            description=self.description if description is None else description,
            display_name=self.display_name,
            pipeline_root=self.pipeline_root,
        )
        other._calls = {k: dataclasses.replace(c, bindings=dict(c.bindings)) for k, c in self._calls.items()}
        other._params = dict(self._params)
        other._owners = dict(self._owners)
        for kept in ("_inputs", "_outputs"):  # a sub-pipeline's inputs and outputs (they were dropped)
            if kept in self.__dict__:
                setattr(other, kept, dict(self.__dict__[kept]))
        return other

    def subset(self, calls: Iterable[str], *, name: str, description: str = "") -> Pipeline:
        """A new pipeline of some of this one's calls, in this one's order, each copied with
        :func:`dataclasses.replace` (every field kept: candidates, retries, secrets...), with the pipeline
        parameters they use.

        Raises:
            InvalidParameter: an unknown call, or a kept call reads an output of a call left out.
        """
        keep = set(calls)
        for call_name in keep:
            self[call_name]  # raises with the valid names
        out = Pipeline(name, description=description)
        for call in self._calls.values():
            if call.name not in keep:
                continue
            # what the call reads: its bindings (an output parameter collected over a loop too), and its groups'
            # condition operands and loop lists (those were not looked at: a condition on a call left out failed
            # mid-run with a KeyError, and a loop over a pipeline parameter lost the parameter)
            from heteroflow.pipelines.control import CollectedRef

            refs = [b.ref if isinstance(b, CollectedRef) else b for b in call.bindings.values()]
            for group in call.groups:
                for branch in (group, *group.branches):
                    if branch.condition is not None:
                        refs.extend(branch.condition.operands())
                if group.kind == "loop":
                    refs.append(group.items)
            for binding in refs:
                if isinstance(binding, OutputRef) and binding.call not in keep:
                    raise InvalidParameter(f"subset: {call.name} reads {binding.call}.{binding.output}; keep {binding.call} too")
                source = getattr(binding, "call", None)
                if type(binding).__name__ == "ValueRef" and source not in keep:
                    raise InvalidParameter(f"subset: {call.name} reads {source}'s output {binding.output!r} (a value, a condition "
                                           f"or a loop's list); keep {source} too")
                if isinstance(binding, ParamRef) and binding.name in self._params:
                    out._params[binding.name] = self._params[binding.name]
                    if self._owners.get(binding.name) == call.name:
                        out._owners[binding.name] = call.name
            after = tuple(n for n in call.run_after if n in keep)  # ordering on a call left out is dropped
            out._calls[call.name] = dataclasses.replace(call, bindings=dict(call.bindings), run_after=after)
        return out

    def replace(self, call: str, **changes: Any) -> Pipeline:
        """Change a call's ``candidates``, ``retry`` (a :class:`RetryPolicy`, or a dict of its fields),
        ``cacheable`` or ``secrets`` in place, checked here.

        Returns:
            This pipeline, changed (as flytekit's ``with_overrides`` returns its node), so
            ``default_pipeline().replace("train", candidates=[...])`` is the changed pipeline: it returned None, and
            ``heteroflow.run(None)`` ran the default pipeline with the candidates dropped.

        Raises:
            InvalidParameter: an unknown call or field, or a value of the wrong type (naming the field and the
                valid forms).
        """
        target = self[call]
        for key, value in _call_options(call, changes).items():
            setattr(target, key, value)
        return self

    # -- views ----------------------------------------------------------------------------------------------

    @property
    def calls(self) -> tuple[Call, ...]:
        """The calls in order (a topological order: every call comes after the calls it reads from)."""
        return tuple(self._calls.values())

    def __getitem__(self, name: str) -> Call:
        try:
            return self._calls[name]
        except KeyError:
            raise InvalidParameter(f"pipeline {self.name!r} has no call {name!r}; calls: {', '.join(self._calls)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._calls

    @property
    def params(self) -> dict[str, Param]:
        """Every pipeline parameter (required ones first, then in the order calls introduced them)."""
        items = list(self._params.values())
        return {p.name: p for p in sorted(items, key=lambda p: not p.required)}

    @property
    def planner(self) -> Call | None:
        return next((c for c in self._calls.values() if c.step.planner), None)

    @property
    def placed_calls(self) -> tuple[Call, ...]:
        """The device-bound calls (the planner places these, in order)."""
        return tuple(c for c in self._calls.values() if c.device_bound)

    def placements(self) -> dict[str, str]:
        """``{call: candidates JSON}`` of the device-bound calls: what the planner is given."""
        return {c.name: c.candidates.to_json() for c in self.placed_calls}

    def consumers(self, call: str) -> list[tuple[Call, str, OutputRef]]:
        """(consumer, input name, ref) for every input fed by an output of ``call``."""
        return [(c, k, ref) for c in self._calls.values() for k, ref in c.input_refs().items() if ref.call == call]

    def arguments(self, values: Mapping[str, Any] | None = None, *, problems: Problems | None = None) -> dict[str, Any]:
        """Every pipeline parameter's value: ``values`` over the defaults, type-checked.

        Args:
            values: the values given, by pipeline parameter name (or a short alias).
            problems: gather the problems here instead of raising them (a bad value is left out of the result,
                a required parameter without a value too), so that a caller reports them with others.

        Raises:
            InvalidParameter: unknown names (the message lists the valid ones), values of the wrong type, required
                parameters without a value: every one of them, in one message.
        """
        gather = Problems() if problems is None else problems
        values = dict(values or {})
        given_as = self.given_names(values)  # a value of the wrong type is named as it was given (`seed`)
        for kfp_name, name in self.kfp_spellings.items():  # `preprocess_seed` (KFP's spelling) is `preprocess.seed`
            if kfp_name in values and kfp_name not in self._params:
                values.setdefault(name, values.pop(kfp_name))
        aliases = self.aliases
        unknown = sorted(set(values) - set(self._params) - set(aliases))
        if unknown:
            valid = sorted([*self._params, *aliases])
            gather.add(InvalidParameter(f"unknown parameter(s) {', '.join(unknown)}{did_you_mean(unknown, valid)}; valid: {', '.join(valid)}"))
        for short, names in aliases.items():
            if short in values:
                value = values.pop(short)
                for name in names:
                    values.setdefault(name, value)
        out: dict[str, Any] = {}
        for p in self.params.values():
            if p.name in values:
                with gather.check():
                    named = p if given_as.get(p.name, p.name) == p.name else dataclasses.replace(p, name=given_as[p.name])
                    out[p.name] = named.check(values[p.name])
            elif p.required:
                gather.add(InvalidParameter(f"parameter {p.name!r} is required ({p.type.__name__}): {p.help}"))
            else:
                out[p.name] = p.default
        if problems is None:
            gather.raise_all(f"the parameters of pipeline {self.name!r}")
        return out

    def given_names(self, values: Mapping[str, Any]) -> dict[str, str]:
        """``{pipeline parameter: the name it was given by}`` for ``values`` as :meth:`arguments` takes them: its own
        name, KFP's spelling (``preprocess_seed``), or an alias (``seed``, for each parameter it sets that is not set
        by its own name). Names that are none of these are left out."""
        out: dict[str, str] = {}
        spellings, aliases = self.kfp_spellings, self.aliases
        for key in values:
            if key in self._params:
                out[key] = key
            elif key in spellings:
                out.setdefault(spellings[key], key)
        for key in values:
            if key not in self._params and key in aliases:
                for name in aliases[key]:
                    out.setdefault(name, key)
        return out

    def call_params(self, call: Call, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The parameter values ``call``'s step gets for pipeline ``arguments``."""
        out: dict[str, Any] = {}
        for key, binding in call.param_bindings().items():
            if isinstance(binding, ParamRef):
                out[key] = arguments[binding.name]
            elif isinstance(binding, Const):
                out[key] = binding.value
            # else: a control-flow reference, known when the run reaches the call (pipelines.control)
        return out

    def check(self, arguments: Mapping[str, Any], *, problems: Problems | None = None,
              names: Mapping[str, str] | None = None) -> None:
        """Run every call's parameter checks on ``arguments`` (before anything runs). A call that is bound to a
        parameter missing from ``arguments`` (one :meth:`arguments` refused) is not checked.

        Args:
            arguments: the pipeline's arguments (:meth:`arguments`).
            problems: gather the problems here instead of raising them.
            names: the name each pipeline parameter was given by, where it was given (:meth:`given_names`): a
                problem of ``preprocess.seed`` given as ``preprocess_seed`` names ``preprocess_seed``; default: a
                step's check names its own parameter (``seed``).

        Raises:
            InvalidParameter: the problems of every call's check (each naming the parameter), in one message.
        """
        gather = Problems() if problems is None else problems
        for call in self._calls.values():
            bindings = call.param_bindings().values()
            if any(isinstance(b, ParamRef) and b.name not in arguments for b in bindings):
                continue
            with gather.check():
                self._check_loop_items(call, arguments)
            with gather.check():
                self._check_collected_loops(call, arguments)
            if any(not isinstance(b, (ParamRef, Const)) for b in bindings):
                continue  # a value known only at run time: the step checks it when it runs
            with gather.check():
                try:
                    call.step.check_params(self.call_params(call, arguments), candidates=call.candidates)
                except InvalidParameter as exc:
                    given = _as_given(exc, call, names or {})
                    if given is exc:
                        raise
                    raise given from None
        if problems is None:
            gather.raise_all(f"the parameters of pipeline {self.name!r}")

    def _check_loop_items(self, call: Call, arguments: Mapping[str, Any]) -> None:
        """Check every item a ``ParallelFor`` over a literal list or a pipeline parameter hands ``call``, as the
        step parameter it is bound to checks it (and the step's own check, where the item is the call's only value
        not known yet), before anything runs (a bad item would otherwise fail its one
        iteration mid-run, after the iterations before it). Items of an output parameter are known only at run time.

        Raises:
            InvalidParameter: the first bad item, named by its index, the list it is in and the parameter it feeds.
        """
        from heteroflow.pipelines.control import LoopItem

        bindings = call.param_bindings()
        loop_keys = [k for k, b in bindings.items() if isinstance(b, LoopItem)]
        others = [b for k, b in bindings.items() if k not in loop_keys]
        # the step's own check runs per item only where the item is the call's one unknown value
        known = (self.call_params(call, arguments) if len(loop_keys) == 1 and all(
            isinstance(b, Const) or (isinstance(b, ParamRef) and b.name in arguments) for b in others) else None)
        for key, binding in bindings.items():
            if not isinstance(binding, LoopItem):
                continue
            items, where = binding.loop.items, "the ParallelFor list"
            if isinstance(items, ParamRef):
                items, where = arguments.get(items.name), f"parameter {items.name}"
            if not isinstance(items, list):
                continue
            for i, item in enumerate(items):
                value = item
                if binding.field is not None:
                    if not isinstance(item, Mapping) or binding.field not in item:
                        raise InvalidParameter(f"{where}[{i}] = {item!r} has no key {binding.field!r}, which {call.name}'s "
                                               f"{key} takes; valid: every item a dict with it")
                    value = item[binding.field]
                try:
                    checked = call.step.param(key).check(value)
                    if known is not None:  # the step's own check (ranges...), with the call's other values
                        call.step.check_params({**known, key: checked})
                except InvalidParameter as exc:
                    raise InvalidParameter(f"{where}[{i}] = {value!r} goes to {call.name}'s {key}: {exc}") from None

    def _check_collected_loops(self, call: Call, arguments: Mapping[str, Any]) -> None:
        """Refuse an empty list for a ``ParallelFor`` over a pipeline parameter whose outputs ``call`` collects
        (``Collected(...)``), before anything runs. KFP runs no iteration for an empty list, so such a loop is legal
        on its own (a loop nobody collects from still runs, doing nothing); but the call after it would get an empty
        list and fail mid-run inside its own code (``max()`` of nothing) with no word of the parameter. A literal
        empty list is refused where it is written (:class:`~heteroflow.pipelines.control.ParallelFor`); a list
        output parameter is known only when the run reaches the loop.

        Raises:
            InvalidParameter: the parameter, that it is empty, the call that collects from its loop, and what is
                valid (a list of at least one item).
        """
        from heteroflow.pipelines.control import CollectedRef

        for key, binding in call.param_bindings().items():
            if not isinstance(binding, CollectedRef) or binding.loop is None or not isinstance(binding.loop.items, ParamRef):
                continue
            name = binding.loop.items.name
            if arguments.get(name) == []:
                raise InvalidParameter(
                    f"{name}=[] is empty: loop {binding.loop.name} would run no iteration, and {call.name}'s {key} collects "
                    f"{binding.ref!r} from it (Collected) into an empty list; valid: a list of at least one item"
                )

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, calls={list(self._calls)})"


def _as_given(exc: InvalidParameter, call: Call, names: Mapping[str, str]) -> InvalidParameter:
    """``exc`` (from ``call``'s step check) with each problem that starts with a step parameter bound to a pipeline
    parameter of another name headed by the name the user gave: ``model (train's model_factory): model_factory
    'x' is not ...`` for the default pipeline's ``model``; and a step parameter given by another name of its own
    (in ``names``: ``preprocess.seed``, KFP's ``train_seed``) named by it: ``train_seed=-1 is out of range``.
    ``exc`` itself when no problem is such."""
    import copy

    prefixed, replaced = {}, {}
    for key, binding in call.param_bindings().items():
        if not isinstance(binding, ParamRef):
            continue
        given = names.get(binding.name, binding.name)
        if binding.name.rpartition(".")[2] != key:
            prefixed[key] = given
        elif given != key and binding.name in names:  # `seed` (the alias) stays `seed`
            replaced[key] = given

    def named(message: str) -> str:
        for key, name in prefixed.items():
            if re.match(rf"{re.escape(key)}\b", message):
                return f"{name} ({call.name}'s {key}): {message}"
        for key, name in replaced.items():
            if re.match(rf"{re.escape(key)}\b", message):
                return name + message[len(key):]
        return message

    messages = tuple(getattr(exc, "problems", None) or (str(exc),))
    given = tuple(named(m) for m in messages)
    if given == messages:
        return exc
    text = str(exc)
    for old, new in zip(messages, given):
        text = text.replace(old, new, 1)
    out = copy.copy(exc)
    out.args = (text,)
    if getattr(exc, "problems", None):
        out.problems = given  # type: ignore[attr-defined]
    return out


def load_pipeline(ref: str) -> Pipeline:
    """The :class:`Pipeline` named by ``module:attribute``: a Pipeline value, or a function that returns one
    (called with no arguments). This is how ``heteroflow run|compile|params --pipeline`` find a user's pipeline.

    Raises:
        InvalidParameter: the module cannot be imported, the attribute is missing, or it is not a pipeline.
    """
    import os
    import sys

    from heteroflow.components.core.step import Step, import_object

    if os.getcwd() not in sys.path and "" not in sys.path:  # a module beside the user, as `python -m` finds it
        sys.path.insert(0, os.getcwd())
    value: Any = import_object(ref, what="--pipeline", example="mypipelines:build")
    if isinstance(value, Step):
        raise InvalidParameter(f"--pipeline {ref!r} is a Step; give a Pipeline (or a function returning one) that uses it")
    if callable(value) and not isinstance(value, Pipeline):
        required = [
            p.name
            for p in inspect.signature(value).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise InvalidParameter(
                f"--pipeline {ref!r} is a function that needs arguments ({', '.join(required)}); give a Pipeline, or a "
                "function with no arguments that returns one"
            )
        value = value()
    if not isinstance(value, Pipeline):
        from heteroflow.components.core.step import _a

        raise InvalidParameter(f"--pipeline {ref!r} is {_a(type(value))}, not a heteroflow Pipeline (or a function returning one)")
    return value
