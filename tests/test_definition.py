"""One definition per step and per pipeline: Step values derived from functions, the Pipeline graph, the
failure classifier, the testing settings, the shared step runtime, ``heteroflow step`` and the in-process
runner.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heteroflow.components.errors import DeviceUnavailable, InvalidParameter
from heteroflow.components.core.failures import (
    FailureClass,
    InjectedDeviceFault,
    classify,
    injected_fault,
    parse_faults,
    simulated_devices,
)
from heteroflow.components.resources import Candidates, Resources, RetryPolicy
from heteroflow.components.core.runtime import EXIT_CODES, LocalArtifact, run_step
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step, step_ref
from heteroflow.components.steps import DEFAULT_STEPS, EVALUATE, PLAN, PREWARM, TRAIN
from heteroflow.components.core.telemetry import read_step_records
from heteroflow.pipelines.default import default_pipeline
from heteroflow.pipelines.graph import Pipeline

# --- a toy step module, defined here and importable by name (tests/ is not a package) ----------------------


def scale(values_path: str, out_path: str, *, factor: float = 2.0, label: str = "x", device: str = "cpu") -> dict:
    """Multiply the numbers in a file.

    Args:
        values_path: input file, one number per line.
        out_path: output file.
        factor: what to multiply by (unit: times).
        label: a name for the output.
        device: injected torch device type.
    """
    numbers = [float(x) for x in Path(values_path).read_text().split()]
    Path(out_path).write_text("\n".join(str(n * factor) for n in numbers))
    return {"label": label, "total": sum(numbers) * factor, "device": device}


def make(out_path: str, *, count: int = 3) -> dict:
    """Write the numbers 1..count.

    Args:
        out_path: output file.
        count: how many numbers.
    """
    Path(out_path).write_text("\n".join(str(i + 1) for i in range(count)))
    return {"count": count}


MAKE = step(make, outputs=[ArtifactSpec(name="values", type=ArtifactType.DATASET, param="out_path")])
SCALE = step(
    scale,
    inputs=[ArtifactSpec(name="values", type=ArtifactType.DATASET, param="values_path")],
    outputs=[ArtifactSpec(name="scaled", type=ArtifactType.DATASET, param="out_path")],
    candidates=["npu", "gpu", "cpu"],
    device_bound=True,
    device_param="device",
)


# --- Step ------------------------------------------------------------------------------------------------


def test_step_params_come_from_the_signature_and_the_docstring() -> None:
    assert [p.name for p in SCALE.params] == ["factor", "label"]
    factor = SCALE.param("factor")
    assert (factor.type, factor.default, factor.unit, factor.help) == (float, 2.0, "times", "what to multiply by.")
    assert SCALE.param("label").help == "a name for the output."
    assert SCALE.description == "Multiply the numbers in a file."
    # injected and artifact parameters are not step parameters
    assert "device" not in SCALE.param_names and "values_path" not in SCALE.param_names


def test_shipped_steps_take_their_parameters_from_their_functions() -> None:
    from heteroflow.components.training.step import train

    signature = inspect.signature(train)
    for p in TRAIN.params:
        assert p.default == signature.parameters[p.name].default
        assert p.help, f"train parameter {p.name} has no help line"
    assert TRAIN.param("epochs").unit == "passes"
    assert TRAIN.device_bound and EVALUATE.device_bound and not PREWARM.device_bound
    assert [s.name for s in DEFAULT_STEPS] == ["prewarm", "preprocess", "plan", "train", "evaluate", "archive"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(inputs=[ArtifactSpec(name="v", param="nosuch")]), r"has no parameter 'nosuch'"),
        (dict(device_bound=True), r"needs device_param or resources_param"),
        (dict(planner=True), r"needs placements_param"),
        (dict(outputs=[ArtifactSpec(name="a", param="out_path"), ArtifactSpec(name="a")]),
         r"names the artifact 'a' twice \(outputs\[0\] and outputs\[1\]\)"),
    ],
    ids=["unknown-param", "device-bound-without-device", "planner-without-placements", "duplicate-artifact"],
)
def test_step_definition_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidParameter, match=match):
        step(make, **kwargs)


def test_a_parameter_of_an_unsupported_type_is_refused() -> None:
    def f(out_path: str, *, sizes: set[int] = set()) -> None:  # noqa: B006 - a set: lists and dicts are KFP parameters
        """F.

        Args:
            out_path: out.
            sizes: sizes.
        """

    with pytest.raises(InvalidParameter, match=r"f\(sizes\) is annotated .*a step parameter must be str, int, float, bool, list or dict"):
        step(f, outputs=[ArtifactSpec(name="o", param="out_path")])


def test_step_ref_finds_the_module_level_name() -> None:
    assert step_ref(SCALE) == f"{__name__}:SCALE"
    assert step_ref(TRAIN) == "heteroflow.components.training.step:TRAIN"


# --- Pipeline --------------------------------------------------------------------------------------------


def _toy() -> Pipeline:
    p = Pipeline("toy")
    values = p.add(MAKE)
    p.add(SCALE, values=values.outputs.values, label="doubled")
    return p


def test_unbound_step_parameters_become_pipeline_parameters() -> None:
    p = _toy()
    assert list(p.params) == ["count", "factor"]
    assert p.params["factor"].unit == "times"
    assert p.arguments({"factor": 3}) == {"count": 3, "factor": 3.0}


def test_the_default_pipeline_lifts_each_step_parameter_once() -> None:
    p = default_pipeline()
    # preprocess and train each have a seed: one parameter per call, qualified; dataset_uri feeds prewarm's source_uri;
    # model feeds train's model_factory (a KFP component cannot have a parameter named like its output artifact 'model')
    assert "seed" not in p.params and {"preprocess.seed", "train.seed"} <= set(p.params)
    assert p.params["preprocess.seed"].help != p.params["train.seed"].help  # each says what it seeds
    assert p.aliases == {"seed": ["preprocess.seed", "train.seed"]}
    assert "source_uri" not in p.params and p.params["dataset_uri"].required
    assert "model_factory" not in p.params and p.params["model"].default == ""
    names = [f"{c.name}.{n}" if n == "seed" else n for c in p.calls for n in c.step.param_names
             if n not in ("source_uri", "model_factory")]
    assert sorted(set(names)) == sorted(set(p.params) - {"dataset_uri", "model"})


def test_parameters_are_per_call_unless_shared_on_purpose() -> None:
    base = dict(dataset_uri="/data")
    p = default_pipeline()
    args = p.arguments({**base, "seed": 3, "train.seed": 5})  # the short name sets every call's, unless named
    assert (args["preprocess.seed"], args["train.seed"]) == (3, 5)
    assert p.call_params(p["preprocess"], args)["seed"] == 3 and p.call_params(p["train"], args)["seed"] == 5
    # a second step with a parameter of the same name and another default: its own parameter (#15.5)
    q = default_pipeline().copy("two-batch-sizes")
    q.add(MAKE, name="make_more", count=2)
    q.add(SCALE, values=q["make_more"].outputs.values, factor=q.param("factor", default=1.5))
    q.add(SCALE, name="scale_again", values=q["make_more"].outputs.values, factor=q.param("factor", default=1.5))  # shared on purpose
    assert q.params["factor"].default == 1.5 and "scale.factor" not in q.params
    assert q["scale"].bindings["factor"] == q["scale_again"].bindings["factor"]
    q.add(SCALE, name="scale_three", values=q["make_more"].outputs.values)  # unbound `label`: per call
    assert {"scale.label", "scale_again.label", "scale_three.label"} <= set(q.params)
    assert q.aliases["label"] == ["scale.label", "scale_again.label", "scale_three.label"]


def test_qualified_parameters_reach_kfp_as_identifiers(tmp_path: Path) -> None:
    pytest.importorskip("kfp", reason="kfp is not installed (extra heteroflow[kfp])")
    from heteroflow.pipelines.kfp.render import compile_pipeline, kfp_arguments

    p = default_pipeline()
    out = compile_pipeline(p, tmp_path / "p.yaml")
    import yaml

    inputs = next(yaml.safe_load_all(out.read_text()))["root"]["inputDefinitions"]["parameters"]
    assert {"preprocess_seed", "train_seed"} <= set(inputs) and "seed" not in inputs
    assert kfp_arguments(p, {"train.seed": 1}) == {"train_seed": 1}


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda p: p.add(SCALE), r"input artifact\(s\) values must be bound"),
        (lambda p: p.add(MAKE), r"already has a call named 'make'"),
        (lambda p: p.add(MAKE, name="Bad Name"), r"call name 'Bad Name' is not valid"),
        (lambda p: p.add(MAKE, name="m2", nosuch=1), r"has no input or parameter 'nosuch'"),
        (lambda p: p.add(MAKE, name="m2", count="three"), r"count='three' is a string; valid: an integer"),
        (
            lambda p: (p.add(MAKE, name="m2", count=p.param("n", default=9)), p.add(MAKE, name="m3", count=p.param("n", default=4))),
            r"'n' is already a int with default 9",
        ),
    ],
    ids=["unbound-input", "duplicate-call", "bad-name", "unknown-binding", "wrong-constant-type", "conflicting-default"],
)
def test_pipeline_errors_name_what_to_do(build, match: str) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("toy")
    p.add(MAKE)
    with pytest.raises(InvalidParameter, match=match):
        build(p)


def test_unknown_and_wrongly_typed_arguments_are_refused() -> None:
    p = _toy()
    with pytest.raises(InvalidParameter, match=r"unknown parameter\(s\) nosuch; valid: count, factor"):
        p.arguments({"nosuch": 1})
    with pytest.raises(InvalidParameter, match=r"unknown parameter\(s\) facter \(did you mean 'factor'\?\); valid: count, factor"):
        p.arguments({"facter": 1})
    with pytest.raises(InvalidParameter, match=r"factor='x' is a str"):
        p.arguments({"factor": "x"})


def test_a_copy_is_independent() -> None:
    p = default_pipeline()
    q = p.copy("other")
    q.replace("train", candidates=["cpu:cpu=2"])
    assert len(p["train"].candidates) == 3 and len(q["train"].candidates) == 1


def test_replace_returns_the_changed_pipeline_so_a_chain_keeps_its_candidates() -> None:
    """A new user's input: ``d = default_pipeline().replace("train", candidates=[...])`` was None, and
    ``heteroflow.run(d)`` then ran the default pipeline with the default candidates, without a word."""
    p = default_pipeline()
    d = p.replace("train", candidates=["cpu:cpu=2"])
    assert d is p and [c.describe() for c in d["train"].candidates] == ["cpu, 2 CPU, 2Gi"]


# --- failures --------------------------------------------------------------------------------------------


def _torch_errors() -> list[tuple[BaseException, FailureClass]]:
    import torch

    return [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)"), FailureClass.DEVICE),
        (torch.AcceleratorError("CUDA error: uncorrectable ECC error encountered"), FailureClass.DEVICE),
    ]


CLASSIFIED = [
    (DeviceUnavailable("device='cuda': no CUDA device is available to this process"), FailureClass.DEVICE),
    (RuntimeError("NPU out of memory. Tried to allocate 52.00 MiB (NPU 0; 60.96 GiB total capacity; 59.36 GiB already allocated"), FailureClass.DEVICE),
    (RuntimeError("CUDA error: invalid device ordinal"), FailureClass.DEVICE),
    (RuntimeError("No CUDA GPUs are available"), FailureClass.DEVICE),
    (AssertionError("Torch not compiled with CUDA enabled"), FailureClass.DEVICE),
    (
        RuntimeError(
            "init:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:292 NPU function error: aclrtGetDeviceCount(&device_count), "
            "error code is 207004 [ERROR] ERR00100 PTA call acl api failed [Error]: The device is unavailable."
        ),
        FailureClass.DEVICE,
    ),
    (RuntimeError("NPU function error: c10_npu::SetDevice(device_id_), error code is 507033"), FailureClass.DEVICE),
    (RuntimeError("CUDA error: device-side assert triggered"), FailureClass.PERMANENT),
    (TimeoutError("read timed out"), FailureClass.TRANSIENT),
    (ConnectionResetError(104, "Connection reset by peer"), FailureClass.TRANSIENT),
    (OSError(116, "Stale file handle"), FailureClass.TRANSIENT),
    (ValueError("could not convert string to float: 'abc'"), FailureClass.PERMANENT),
    (InvalidParameter("epochs=0 is out of range"), FailureClass.PERMANENT),
    (KeyError("label"), FailureClass.PERMANENT),
    (FileNotFoundError(2, "No such file or directory"), FailureClass.PERMANENT),
]


@pytest.mark.parametrize(("exc", "expected"), CLASSIFIED, ids=[f"{type(e).__name__}-{i}" for i, (e, _) in enumerate(CLASSIFIED)])
def test_classifier_table(exc: BaseException, expected: FailureClass) -> None:
    assert classify(exc).cls is expected


def test_classifier_on_real_torch_exception_types() -> None:
    for exc, expected in _torch_errors():
        assert classify(exc).cls is expected, exc


def test_a_killed_process_pool_worker_is_transient() -> None:
    from concurrent.futures.process import BrokenProcessPool

    assert classify(BrokenProcessPool("A process in the process pool was terminated abruptly")).cls is FailureClass.TRANSIENT


def test_fault_specs_parse_and_bad_ones_say_the_form() -> None:
    specs = parse_faults("train@npu=device, preprocess@cpu=permanent,train@gpu=transient:2")
    assert [str(s) for s in specs] == ["train@npu=device", "preprocess@cpu=permanent", "train@gpu=transient:2"]
    for bad in ("train=device", "train@tpu=device", "train@npu=flaky", "train@npu=transient:x"):
        with pytest.raises(InvalidParameter, match=r"STEP@KIND=CLASS|not a device kind"):
            parse_faults(bad)


def test_a_fault_count_or_after_steps_of_zero_is_refused() -> None:
    """Trial finding: `--inject-fault train@cpu=transient:0` was accepted and injected nothing, so a typo looked like
    a passed failure test. Its sibling `:after_steps=0` failed after the first step, not before it."""
    with pytest.raises(InvalidParameter, match=r"'train@cpu=transient:0' fails no attempt .*valid: N >= 1, e.g. train@cpu=transient:1, or no :N"):
        parse_faults("train@cpu=transient:0", source="--inject-fault")
    with pytest.raises(InvalidParameter, match=r"'train@npu=device:after_steps=0': after_steps counts .*valid: N >= 1"):
        parse_faults("train@npu=device:after_steps=0", source="--inject-fault")
    assert [s.times for s in parse_faults("train@cpu=transient:1")] == [1]


def test_a_counted_fault_fails_the_first_n_attempts_then_lets_the_step_run(tmp_path: Path) -> None:
    env = {"HETEROFLOW_INJECT_FAULT": "train@npu=transient:2"}
    seen = [injected_fault("train", "npu", state_dir=tmp_path, environ=env) for _ in range(4)]
    assert [type(e).__name__ if e else None for e in seen] == ["InjectedTransientFault", "InjectedTransientFault", None, None]
    assert injected_fault("train", "gpu", state_dir=tmp_path, environ=env) is None
    assert isinstance(injected_fault("t", "npu", state_dir=None, environ={"HETEROFLOW_INJECT_FAULT": "t@npu=device"}), InjectedDeviceFault)


def test_a_counted_fault_counts_each_loop_iteration_apart(tmp_path: Path) -> None:
    """Inside a ParallelFor a count is the iteration's own, as its retries are: iteration 1 fails its first attempt
    even after iteration 0 spent its count (the count was shared by the iterations)."""
    env = {"HETEROFLOW_INJECT_FAULT": "train@npu=transient:1"}
    seen = [injected_fault("train", "npu", state_dir=tmp_path, environ=env, iteration=key) for key in [(0,), (0,), (1,), (1,), (0, 1)]]
    assert [e is not None for e in seen] == [True, False, True, False, True]


def test_simulated_devices_parse() -> None:
    assert simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "npu,gpu:nvidia-gpu"}) == {"npu": "", "gpu": "nvidia-gpu"}
    with pytest.raises(InvalidParameter, match="the CPU is always present"):
        simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "cpu"})
    # a new user's trial: a model no registry entry names failed only in plan, after prewarm and preprocess, and an
    # NPU model simulated as a GPU passed; both are refused up front now, and an alias is the registry's name
    with pytest.raises(InvalidParameter, match=r"item 'gpu:nosuchmodel': model 'nosuchmodel' is unknown; valid: a gpu model \(nvidia-k80, "):
        simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "gpu:nosuchmodel"})
    with pytest.raises(InvalidParameter, match=r"item 'gpu:ascend-910b3': model 'ascend-910b3' is a npu model; valid: a gpu model"):
        simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "gpu:ascend-910b3"})
    assert simulated_devices({"HETEROFLOW_SIMULATE_DEVICES": "gpu:t4,npu:910B3@0.5"}) == {"gpu": "nvidia-t4", "npu": "ascend-910b3"}


# --- the shared runtime ----------------------------------------------------------------------------------


def test_run_step_injects_the_device_and_records_the_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "gpu")
    src = tmp_path / "values"
    src.write_text("1\n2\n")
    out = run_step(
        SCALE,
        params={"factor": "3"},
        inputs={"values": str(src)},
        outputs={"scaled": str(tmp_path / "scaled")},
        candidate=Resources(kind="gpu"),
        candidate_index=1,
        run_dir=tmp_path / "run",
    )
    assert (out.status, out.kind, out.candidate, out.simulated) == ("succeeded", "gpu", 1, True)
    assert out.facts == {"label": "x", "total": 9.0, "device": "cpu"}  # simulated: the work ran on the CPU
    record = read_step_records(tmp_path / "run")["scale"][0]
    assert (record.kind, record.candidate, record.simulated, record.accelerator) == ("gpu", 1, True, "nvidia-gpu")


def test_a_step_that_is_not_device_bound_records_no_candidate(tmp_path: Path) -> None:
    """A review's reading: kfp.local recorded candidate 0 for every call (the in-process engine none), so
    `heteroflow runs` listed a device for each step of a kfp.local run of a pipeline with no device-bound step."""
    from heteroflow.pipelines.cli.runs_rows import _devices

    out = run_step(MAKE, outputs={"values": str(tmp_path / "v")}, run_dir=tmp_path / "run")
    assert out.status == "succeeded" and out.candidate is None
    assert read_step_records(tmp_path / "run")["make"][0].candidate is None
    assert _devices({"steps": [{"name": "make", "status": "succeeded", "kind": "cpu", "candidate": out.candidate}]}) == ""
    scaled = run_step(SCALE, inputs={"values": str(tmp_path / "v")}, outputs={"scaled": str(tmp_path / "s")}, run_dir=tmp_path / "run")
    assert scaled.candidate == 0  # a device-bound step's default candidate is still its first


def test_run_step_refuses_unknown_parameters_and_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"has no parameter\(s\) nosuch; valid: factor, label"):
        run_step(SCALE, params={"nosuch": 1}, inputs={"values": "x"}, outputs={"scaled": "y"})
    with pytest.raises(InvalidParameter, match=r"has no parameter\(s\) lable \(did you mean 'label'\?\); valid: factor, label"):
        run_step(SCALE, params={"lable": 1}, inputs={"values": "x"}, outputs={"scaled": "y"})
    with pytest.raises(InvalidParameter, match=r"step 'scale' has no parameter 'factr' \(did you mean 'factor'\?\); valid: "):
        SCALE.param("factr")
    with pytest.raises(InvalidParameter, match=r"needs input artifact\(s\) values"):
        run_step(SCALE, outputs={"scaled": "y"})


def test_a_non_finite_fact_is_a_permanent_failure_naming_where(tmp_path: Path) -> None:
    def nan_step(out_path: str) -> dict:
        """Returns a NaN.

        Args:
            out_path: out.
        """
        return {"loss": float("nan")}

    s = step(nan_step, outputs=[ArtifactSpec(name="o", param="out_path")])
    out = run_step(s, outputs={"o": str(tmp_path / "o")})
    assert (out.status, out.failure) == ("failed", "permanent")
    assert "step 'nan_step' result.loss is nan" in out.reason


# --- heteroflow step ------------------------------------------------------------------------------------


def _heteroflow(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("heteroflow")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.slow
def test_heteroflow_step_runs_a_step_and_exits_with_its_failure_class(digits_dir: Path, tmp_path: Path) -> None:
    ok = _heteroflow(
        "step", "prewarm", "--param", f"source_uri={digits_dir}", "--param", f"cache_root={tmp_path / 'cache'}",
        "--output", f"dataset={tmp_path / 'ds'}", "--run-dir", str(tmp_path / "run"), "--outcome", str(tmp_path / "o.json"),
    )
    assert ok.returncode == EXIT_CODES["succeeded"] == 0, ok.stderr
    outcome = json.loads(ok.stdout)
    assert outcome["status"] == "succeeded" and outcome["facts"]["files"] > 0
    assert json.loads((tmp_path / "o.json").read_text()) == outcome
    assert (tmp_path / "ds" / "manifest.json").is_file()

    permanent = _heteroflow("step", "prewarm", "--param", f"source_uri={tmp_path / 'missing'}", "--output", f"dataset={tmp_path / 'd2'}")
    assert permanent.returncode == EXIT_CODES["permanent"] == 3
    assert json.loads(permanent.stdout)["failure"] == "permanent"

    device = _heteroflow(
        "step", "prewarm", "--param", f"source_uri={digits_dir}", "--output", f"dataset={tmp_path / 'd3'}",
        env={"HETEROFLOW_INJECT_FAULT": "prewarm@cpu=device"},
    )
    assert device.returncode == EXIT_CODES["device"] == 4
    transient = _heteroflow(
        "step", "prewarm", "--param", f"source_uri={digits_dir}", "--output", f"dataset={tmp_path / 'd4'}",
        env={"HETEROFLOW_INJECT_FAULT": "prewarm@cpu=transient"},
    )
    assert transient.returncode == EXIT_CODES["transient"] == 5

    usage = _heteroflow("step", "nosuch")
    assert usage.returncode == 2
    assert "step 'nosuch' is unknown; valid: prewarm, preprocess, plan, train, evaluate, archive" in " ".join(usage.stderr.split())


def test_heteroflow_step_runs_a_user_step_by_reference(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    src = tmp_path / "values"
    src.write_text("2\n")
    result = CliRunner().invoke(
        app,
        ["step", f"{__name__}:SCALE", "--input", f"values={src}", "--output", f"scaled={tmp_path / 's'}", "--candidate", "cpu", "-p", "factor=4"],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s").read_text() == "8.0"


def test_heteroflow_step_finds_a_module_in_the_current_folder_as_run_pipeline_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's finding: `heteroflow step mymodule:report ...` run beside mymodule.py said "cannot import
    'mymodule'", while `heteroflow run --pipeline mymodule:...` from the same folder found it."""
    import sys

    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    (tmp_path / "cwdstep_u56.py").write_text(
        "from pathlib import Path\n"
        "from heteroflow import ArtifactSpec, ArtifactType, step\n"
        "def double(values_path: str, out_path: str) -> dict:\n"
        "    Path(out_path).write_text(str(2 * float(Path(values_path).read_text())))\n"
        "    return {}\n"
        "DOUBLE = step(double, inputs=[ArtifactSpec(name='values', type=ArtifactType.DATASET, param='values_path')],\n"
        "              outputs=[ArtifactSpec(name='doubled', type=ArtifactType.DATASET, param='out_path')])\n"
    )
    (tmp_path / "values").write_text("21")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    result = CliRunner().invoke(app, ["step", "cwdstep_u56:DOUBLE", "--input", "values=values", "--output", "doubled=out"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out").read_text() == "42.0"


# --- in-process runner -----------------------------------------------------------------------------------


def test_inprocess_device_failure_falls_back_and_the_run_succeeds(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(_toy(), run_dir=tmp_path / "run", inject_faults="scale@npu=device")
    assert record.status == "succeeded"
    assert (record.step("scale").kind, record.step("scale").candidate, record.step("scale").attempts) == ("gpu", 1, 2)
    assert [(f["step"], f["candidate"], f["kind"], f["failure"]) for f in record.fallbacks] == [("scale", 0, "npu", "device")]
    assert record.results["scale"]["total"] == 12.0  # (1 + 2 + 3) * 2


def test_inprocess_permanent_failure_stops_without_retry_or_fallback(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    waits: list[float] = []
    p = _toy()
    p.replace("scale", retry=RetryPolicy(retries=3, backoff_seconds=1))
    record = run_inprocess(p, run_dir=tmp_path / "run", inject_faults="scale@npu=permanent", sleep=waits.append)
    assert record.status == "failed"
    assert (record.step("scale").attempts, record.step("scale").failure) == (1, "permanent")
    assert waits == [] and record.fallbacks == []


def test_inprocess_transient_failure_is_retried_with_backoff(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    waits: list[float] = []
    p = _toy()
    p.replace("scale", retry=RetryPolicy(retries=3, backoff_seconds=2, factor=3, max_delay_seconds=10))
    record = run_inprocess(p, run_dir=tmp_path / "run", inject_faults="scale@npu=transient:3", sleep=waits.append)
    assert record.status == "succeeded"
    assert (record.step("scale").kind, record.step("scale").attempts) == ("npu", 4)
    assert waits == [2.0, 6.0, 10.0]


def test_inprocess_upstream_failure_never_starts_a_fallback(tmp_path: Path) -> None:
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(_toy(), run_dir=tmp_path / "run", inject_faults="make@cpu=permanent,scale@npu=device")
    assert record.status == "failed"
    assert record.step("scale").status == "not run" and record.fallbacks == []


# --- a call's options are checked at the call (#16.16) --------------------------------------------------------


def test_replace_takes_a_retry_dict_as_a_policy_and_rejects_anything_else() -> None:
    from heteroflow.components.resources import RetryPolicy
    from heteroflow.pipelines.default import default_pipeline

    p = default_pipeline()
    p.replace("train", retry={"retries": 2})  # the input of #16.16: once it reached kfp.local as a dict
    assert p["train"].retry == RetryPolicy(retries=2)
    with pytest.raises(InvalidParameter, match=r"train: retry=\{'retrys': 2\}: unknown field\(s\) retrys; valid: retries"):
        p.replace("train", retry={"retrys": 2})
    with pytest.raises(InvalidParameter, match=r"train: retry=2 is not a retry policy"):
        p.replace("train", retry=2)


def test_a_calls_other_options_are_checked_at_the_call_too() -> None:
    from heteroflow.components.steps import PREWARM
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.graph import Pipeline

    p = default_pipeline()
    with pytest.raises(InvalidParameter, match=r"train: cacheable='no' is not a bool"):
        p.replace("train", cacheable="no")
    with pytest.raises(InvalidParameter, match=r"prewarm: secrets=.* is not a list of SecretEnv"):
        p.replace("prewarm", secrets={"secret": "s3", "env": {"A": "a"}})
    with pytest.raises(InvalidParameter, match=r"train: candidates='gpu' is not a list of candidates"):
        p.replace("train", candidates="gpu")  # a bare string would be read as the candidates g, p, u
    q = Pipeline("q")
    with pytest.raises(InvalidParameter, match=r"prewarm: retry=\{'retries': -1\}"):
        q.add(PREWARM, retry={"retries": -1})


# --- every copy of a call keeps every field (#15.4) ------------------------------------------------------------


def test_every_copy_of_a_call_keeps_every_field_even_one_added_later() -> None:
    import dataclasses

    from heteroflow.dags.layout import subset
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.graph import Call, SecretEnv

    # a call class with one more field than today's, as a future change would add
    Extended = dataclasses.make_dataclass("Extended", [("priority", int, dataclasses.field(default=0))], bases=(Call,), kw_only=True)
    p = default_pipeline()
    p.replace("prewarm", secrets=[SecretEnv(secret="s3-credentials", env={"AWS_ACCESS_KEY_ID": "access_key"})])
    prewarm = p["prewarm"]
    p._calls["prewarm"] = Extended(**{f.name: getattr(prewarm, f.name) for f in dataclasses.fields(Call)}, priority=7)
    copies = {
        "copy": p.copy("c")["prewarm"],
        "subset": subset(p, ["prewarm"], name="s")["prewarm"],
        "Pipeline.subset": p.subset(["prewarm", "preprocess"], name="t")["prewarm"],
    }
    for how, call in copies.items():
        assert isinstance(call, Extended) and call.priority == 7, how
        assert call.secrets == p["prewarm"].secrets and call.secrets, how  # the Asset DAG's prewarm keeps its credentials
        assert call.bindings == p["prewarm"].bindings and call.bindings is not p["prewarm"].bindings, how


def choose_best(accuracies: list) -> dict:
    """The best of them.

    Args:
        accuracies: one per trial.
    """
    return {"best": max(accuracies)}


def test_a_step_without_a_summary_hook_says_its_scalar_results_in_the_run_summary() -> None:
    """Trial finding: the tuning fan-out's summary and `runs show` never said what choose_best found (the learning
    rate and accuracy were in run.json alone). A step of yours without a summary hook now gets one line of its scalar
    results; lists, dicts and long text stay in run.json."""
    s = step(choose_best)
    assert s.summarize({"best_learning_rate": 0.001, "best_accuracy": 0.98999, "chosen": True, "note": "ok"}) == [
        "choose_best: best_learning_rate 0.001, best_accuracy 0.99, chosen True, note ok"]
    assert s.summarize({"history": [1, 2], "config": {"a": 1}, "log": "x" * 200}) == []
    many = {f"m{i}": i for i in range(10)}
    assert s.summarize(many) == ["choose_best: m0 0, m1 1, m2 2, m3 3, m4 4, m5 5, m6 6, m7 7 (and 2 more in run.json)"]
