"""The ``heteroflow`` command line: through typer's CliRunner on ``heteroflow.pipelines.cli.main.app``, and through
the installed console script in a subprocess (what a user runs).

User errors must exit with status 2 and print one clear ``error:`` line without a traceback; the subprocess
tests run with ``COLUMNS=80`` and no terminal, which is what a user sees when output goes to a pipe or a log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


from typer.testing import CliRunner  # noqa: E402

from heteroflow.pipelines.cli.main import app  # noqa: E402
from heteroflow.pipelines.default import PIPELINE_NAME, default_pipeline  # noqa: E402

PARAM_NAMES = sorted(default_pipeline().params)
STEP_ORDER = tuple(c.name for c in default_pipeline().calls)


def _console_script() -> str:
    """The installed ``heteroflow`` script next to this interpreter (the venv's bin/)."""
    found = shutil.which("heteroflow", path=str(Path(sys.executable).parent))
    assert found, f"the heteroflow console script is not installed next to {sys.executable}"
    return found


def _run_script(args: list[str], *, cwd: Path, columns: int = 80, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "PYTHONPATH")}
    env.update({"COLUMNS": str(columns), "NO_COLOR": "1"})
    return subprocess.run(
        [_console_script(), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _flat(text: str) -> str:
    """Whitespace collapsed, so that a message wrapped by the terminal width still matches."""
    return " ".join(text.split())


# --- compile and params -------------------------------------------------------------------------------------


def test_compile_writes_valid_kfp_yaml(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "pipeline.yaml"
    result = CliRunner().invoke(app, ["compile", "-o", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert out.is_file()
    # what to do next with the file (a new user found it only in --help)
    assert f"next: upload {out} in the Kubeflow Pipelines UI, or run it there with heteroflow submit {out} --host URL" in result.output
    docs = list(yaml.safe_load_all(out.read_text(encoding="utf-8")))
    assert len(docs) == 2  # the pipeline, then the kfp-kubernetes platform spec (the accelerators' tolerations)
    ir = docs[0]
    assert "kubernetes" in docs[1]["platforms"]
    assert ir["pipelineInfo"]["name"] == PIPELINE_NAME
    assert sorted(ir["root"]["inputDefinitions"]["parameters"]) == sorted(n.replace(".", "_") for n in PARAM_NAMES)  # KFP names
    assert set(ir["deploymentSpec"]["executors"]) >= {"exec-prewarm", "exec-preprocess", "exec-plan"}
    assert str(out) in _flat(result.output)


def test_compile_with_image_and_candidates(tmp_path: Path) -> None:
    out = tmp_path / "custom.yaml"
    image = "registry.example.com/heteroflow:0.1.0"
    result = CliRunner().invoke(app, ["compile", "-o", str(out), "--image", image, "-c", "gpu:count=2", "-c", "cpu:cpu=4"])
    assert result.exit_code == 0, result.output
    ir = next(yaml.safe_load_all(out.read_text(encoding="utf-8")))
    executors = {k: e for k, e in ir["deploymentSpec"]["executors"].items() if "container" in e}  # not the importers
    assert {e["container"]["image"] for e in executors.values()} == {image}
    # one train executor per candidate (a flat fallback chain)
    train_limits = sorted(
        str(e["container"].get("resources", {}).get("accelerator", {}).get("resourceCount", "cpu"))
        for name, e in executors.items()
        if re.fullmatch(r"exec-train(-\d+)?", name)
    )
    assert train_limits == ["2", "cpu"]
    assert "note: every step uses the placeholder image" not in result.output


def test_compile_without_image_says_the_placeholder_cannot_run_on_a_cluster(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["compile", "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0, result.output
    assert "placeholder image heteroflow-python:0.1.0, which cannot run on a cluster" in _flat(result.output)


@pytest.mark.slow
def test_compile_via_console_script(tmp_path: Path) -> None:
    out = tmp_path / "pipeline.yaml"
    proc = _run_script(["compile", "-o", str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    ir = next(yaml.safe_load_all(out.read_text(encoding="utf-8")))
    assert ir["pipelineInfo"]["name"] == PIPELINE_NAME


def test_params_json_lists_every_parameter() -> None:
    result = CliRunner().invoke(app, ["params", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert sorted(listed) == PARAM_NAMES
    assert listed["epochs"] == {"type": "int", "default": 30, "unit": "passes", "help": listed["epochs"]["help"]}
    assert listed["epochs"]["help"]
    assert listed["checkpoint_every_steps"]["unit"] == "optimizer steps"
    assert listed["dataset_uri"]["default"] is None
    assert listed["learning_rate"]["type"] == "float"
    assert all(p["help"] for p in listed.values()), "every parameter has a help line"


@pytest.mark.slow
def test_params_table_lists_every_parameter_on_a_wide_terminal(tmp_path: Path) -> None:
    proc = _run_script(["params"], cwd=tmp_path, columns=300)
    assert proc.returncode == 0, proc.stderr
    for name in PARAM_NAMES:
        assert f" {name} " in proc.stdout, f"{name} is not in the params table"


@pytest.mark.slow
def test_params_table_lists_every_parameter_at_80_columns(tmp_path: Path) -> None:
    proc = _run_script(["params"], cwd=tmp_path, columns=80)
    assert proc.returncode == 0, proc.stderr
    missing = [name for name in PARAM_NAMES if f" {name} " not in proc.stdout]
    assert missing == []


@pytest.mark.slow
def test_params_table_shows_help_text_verbatim(tmp_path: Path) -> None:
    proc = _run_script(["params"], cwd=tmp_path, columns=300)
    assert proc.returncode == 0, proc.stderr
    help_text = default_pipeline().params["model_name"].help
    assert "[a-z0-9]" in help_text
    assert help_text in proc.stdout


# --- run --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_via_console_script_prints_steps_and_metrics_and_writes_run_json(digits_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run-out"
    proc = _run_script(
        ["run", "--param", "epochs=3", "--dataset", str(digits_dir), "--output", str(run_dir)], cwd=tmp_path, columns=300
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    for step in STEP_ORDER:
        assert step in proc.stdout, f"step {step} missing from the table"
    assert "test accuracy" in proc.stdout
    assert "archived:" in proc.stdout
    record = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert record["status"] == "succeeded"
    assert record["params"]["epochs"] == 3
    assert record["params"]["dataset_uri"] == str(digits_dir)
    assert [s["name"] for s in record["steps"]] == list(STEP_ORDER)
    assert all(s["status"] == "succeeded" for s in record["steps"])
    assert f"{record['metrics']['evaluate']['accuracy']:.4f}" in proc.stdout
    assert str(run_dir.resolve() / "run.json") in _flat(proc.stdout)
    # Nothing was written into the working directory: the run folder is --output.
    assert not (tmp_path / "heteroflow-runs").exists()
    # the last line names what follows, with this run's folder and model; each command works as printed
    archived = record["results"]["archive"]
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"next: heteroflow runs show {run_dir.resolve()}; heteroflow archive show {archived['name']}:v{archived['version']}"
    for command in last.removeprefix("next: ").split("; "):
        assert _run_script(command.split()[1:], cwd=tmp_path, columns=300).returncode == 0, command


# --- user errors ------------------------------------------------------------------------------------------


# id -> (arguments, substrings the message must contain); "{missing}", "{empty}", "{only-txt}" are data set
# folders made by _expand.
ERROR_CASES: dict[str, tuple[list[str], list[str]]] = {
    "unknown-param": (["run", "--param", "nosuch=1"], ["unknown parameter 'nosuch'; valid: ", *PARAM_NAMES]),
    "param-typo": (["run", "--param", "epoch=3"], ["unknown parameter 'epoch' (did you mean 'epochs'?); valid: "]),
    # `model` is the default pipeline's name of train's model_factory: the message says the name the user gave
    "model-alias": (
        ["run", "--param", "model=nosuch"],
        ["error: model (train's model_factory): model_factory 'nosuch' is not 'module:attribute'"],
    ),
    "param-not-int": (["run", "--param", "epochs=abc"], ["epochs='abc'", "is not a valid int; valid: an integer"]),
    "param-not-pair": (["run", "--param", "epochs"], ["'epochs'", "is not NAME=VALUE"]),
    "dataset-missing": (["run", "--dataset", "{missing}"], ["{missing}", "does not exist"]),
    "dataset-empty": (["run", "--dataset", "{empty}"], ["{empty}", "is empty"]),
    "dataset-only-txt": (["run", "--dataset", "{only-txt}"], ["{only-txt}", "no .csv, .tsv, .parquet or .npz file"]),
    "memory-unit-GB": (["run", "-c", "gpu:memory=16GB"], ["memory='16GB'", "'GB' is not a unit"]),
    "negative-count": (["run", "-c", "gpu:count=-1"], ["count=-1", "negative"]),
    "unknown-kind": (["run", "-c", "tpu"], ["-c/--candidate: kind='tpu'", "is not a device kind", "cpu, gpu, npu"]),
    # nodes on a mixed candidate's part: refused as -c is read (run failed in plan after prewarm and preprocess, with
    # "replicas[1]: ... DeviceKind('npu')"; compile wrote a pipeline that could never run)
    "mixed-nodes-run": (["run", "--engine", "inprocess", "-c", "gpu+npu:nodes=2", "--simulate-devices", "gpu,npu"],
                        ["-c/--candidate: mixed candidate 'gpu+npu:nodes=2': nodes=2 on npu replicas", "valid: count=N replicas"]),
    "mixed-nodes-compile": (["compile", "-c", "gpu+npu:nodes=2", "-o", "m.yaml"],
                            ["-c/--candidate: mixed candidate 'gpu+npu:nodes=2': nodes=2 on npu replicas"]),
    "mixed-kind-twice": (["compile", "-c", "gpu+gpu", "-o", "m.yaml"], ["-c/--candidate: mixed candidate 'gpu+gpu': kind 'gpu' is given twice"]),
    "candidate-field-typo": (["run", "-c", "gpu:acelerator=t4"], ["unknown resource field(s) acelerator (did you mean 'accelerator'?)"]),
    "unknown-protocol": (["run", "--dataset", "nosuch://bucket/data"], ["nosuch:// is not a known fsspec protocol"]),
    # Out-of-range values fail before any step runs (not after the steps' retries).
    "epochs-zero": (["run", "--param", "epochs=0"], ["epochs=0 is out of range", "an integer >= 1"]),
    "learning-rate-zero": (["run", "--param", "learning_rate=0"], ["learning_rate=0.0 is out of range", "> 0"]),
    "test-fraction-too-big": (["run", "--param", "test_fraction=1.5"], ["test_fraction=1.5 is out of range", "0 < x < 1"]),
    "fractions-leave-nothing": (
        ["run", "--param", "test_fraction=0.5", "--param", "validation_fraction=0.5"],
        ["leaves nothing to train on"],
    ),
    "bad-model-name": (["run", "--param", "model_name=BAD NAME"], ["model_name='BAD NAME'", "[a-z0-9][a-z0-9._-]*"]),
    "negative-workers": (["run", "--param", "num_workers=-1"], ["num_workers=-1 is out of range"]),
    "bad-inventory": (["run", "--param", 'device_inventory={"tpu": 1}'], ["device_inventory: unknown field 'tpu', and not a device kind (did you mean 'npu'?)", "cpu, gpu, npu"]),
    "output-is-a-file": (["run", "--output", "{a-file}"], ["{a-file}", "is a file"]),
    "output-holds-a-run": (["run", "--output", "{old-run}"], ["{old-run}", "already holds a run that succeeded"]),
    "compile-to-a-folder": (["compile", "-o", "{empty}"], ["{empty}", "must be a file name ending in .yaml"]),
}



def _expand(items: list[str], tmp_path: Path) -> list[str]:
    """Replace the data set placeholders with folders under tmp_path (created here)."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    (tmp_path / "only-txt").mkdir(exist_ok=True)
    (tmp_path / "only-txt" / "notes.txt").write_text("not a data set\n")
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "old-run" / "steps").mkdir(parents=True, exist_ok=True)
    (tmp_path / "old-run" / "run.json").write_text('{"status": "succeeded"}')  # a finished run is never overwritten
    subs = {
        "{a-file}": str(tmp_path / "a-file"),
        "{old-run}": str(tmp_path / "old-run"),
        "{missing}": str(tmp_path / "no-such-folder"),
        "{empty}": str(tmp_path / "empty"),
        "{only-txt}": str(tmp_path / "only-txt"),
    }
    return [subs.get(item, item) for item in items]


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_error_exits_2_with_a_clear_message(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args, expected = ERROR_CASES[case]
    args, expected = _expand(args, tmp_path), _expand(expected, tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    message = _flat(result.output)
    assert message.startswith("error: "), result.output
    assert message.count("error:") == 1
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"
    assert not (tmp_path / "heteroflow-runs").exists(), "a user error must not start a run"
    assert not (tmp_path / "m.yaml").exists(), "a user error must not write a pipeline"


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    # CliRunner covers every case above; through the real console script (a pipe, 80 columns) one per kind of
    # error is enough to prove one line, exit 2, no traceback: a parameter, a data set, a resource, a path.
    ["unknown-param", "dataset-empty", "memory-unit-GB", "output-is-a-file"],
)
def test_user_error_is_one_line_via_console_script(case: str, tmp_path: Path) -> None:
    args, expected = ERROR_CASES[case]
    args, expected = _expand(args, tmp_path), _expand(expected, tmp_path)
    proc = _run_script(args, cwd=tmp_path, columns=80)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{proc.stderr}"
    assert lines[0].startswith("error: ")
    for text in expected:
        assert text in lines[0]


def test_error_message_keeps_square_brackets(tmp_path: Path) -> None:
    missing = tmp_path / "data[v2]"
    result = CliRunner().invoke(app, ["run", "--dataset", str(missing)])
    assert result.exit_code == 2
    assert str(missing) in _flat(result.output)


def test_dataset_given_twice_is_a_user_error(digits_dir: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--dataset", str(digits_dir), "--param", f"dataset_uri={digits_dir}"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "once" in _flat(result.output)


def test_dataset_for_a_pipeline_that_reads_none_names_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's trial: --dataset with a pipeline without dataset_uri said "unknown parameter(s) dataset_uri",
    a name the user never typed."""
    (tmp_path / "nodata.py").write_text(
        "from heteroflow.pipelines.graph import Pipeline\nfrom heteroflow.pipelines.default import default_pipeline\n"
        "p = default_pipeline().subset(['plan'], name='plan-only')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(app, ["run", "--pipeline", "nodata:p", "--dataset", str(tmp_path), "-o", str(tmp_path / "r")],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "unknown parameter" not in result.output
    assert "--dataset: pipeline 'plan-only' reads no data set (it has no dataset_uri parameter); valid: leave --dataset out" in _flat(result.output)


def test_no_arguments_shows_help() -> None:
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 2  # no_args_is_help: click >= 8.2 prints the help and exits 2
    for command in ("run", "compile", "params"):
        assert command in result.output


def _command_paths(command, path=()):  # type: ignore[no-untyped-def]
    yield path, command
    if isinstance(getattr(command, "commands", None), dict):  # a group (typer 0.29 has click's classes of its own)
        for name, sub in command.commands.items():
            yield from _command_paths(sub, (*path, name))


def test_no_flag_shows_a_type_in_any_commands_help() -> None:
    """A new user's trial: `heteroflow run --help` showed `--verbose -v <bool>` and `--help <bool>` (typer 0.29's
    rich help types every option): a flag takes no value, so every command's --help shows none after a flag, and
    an option that takes one keeps its type."""
    import typer

    paths = list(_command_paths(typer.main.get_command(app)))
    assert len(paths) > 20  # every command and group, `runs show` and `archive list` among them
    for path, command in paths:
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (path, shown.output)
        assert "<bool>" not in shown.output, (path, shown.output)
        for param in command.params:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                row = next(line for line in shown.output.splitlines() if re.search(rf"{re.escape(param.opts[0])}\b", line))
                assert "<" not in row, (path, row)
    run_help = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--output\s+-o\s+<path>", run_help) and re.search(r"--verbose\s+-v\s+Print", run_help), run_help


@pytest.mark.parametrize(
    "argv, code, out, err",
    [
        (["heteroflow", "--help"], 0, "Usage: heteroflow", ""),
        (["heteroflow", "run", "--param", "nope=1"], 2, "", "unknown parameter 'nope'"),
    ],
)
def test_the_console_script_skips_teardown_but_runs_exit_functions_and_flushes(argv: list[str], code: int, out: str, err: str) -> None:
    """The console script ends with os._exit after the work: atexit callbacks still run, output is whole, the
    status is kept; main() itself still ends with SystemExit for callers in their own process."""
    import subprocess
    import sys

    script = (
        "import atexit, sys\n"
        "from heteroflow.pipelines.cli import main as cli\n"
        "atexit.register(lambda: print('exit functions ran', flush=True))\n"
        f"sys.argv = {argv!r}\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit as done:\n"
        "    print('main raised SystemExit', done.code, flush=True)\n"
        "cli.console_script()\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert out in done.stdout and err in done.stderr
    assert f"main raised SystemExit {code}" in done.stdout
    assert done.stdout.rstrip().endswith("exit functions ran") and "not reached" not in done.stdout


def test_what_a_step_waits_for_is_printed_once_as_a_line_on_any_console() -> None:
    """#28 item 10: train's "waiting for pid N" (its live progress while it waits for an identical training) is a
    line of its own on the console in every mode, not only a cell of the live table on a terminal; once per step."""
    from types import SimpleNamespace

    from heteroflow.pipelines.cli.summary import _waiting_lines

    waiting = {"progress": {"waiting": "waiting for pid 42, which runs the same training (checkpoint folder /c)"}}
    steps = [SimpleNamespace(name="prep", details={"progress": {"files": 3}}), SimpleNamespace(name="train", details=waiting)]
    seen: set[str] = set()
    assert _waiting_lines(steps, seen) == ["train: waiting for pid 42, which runs the same training (checkpoint folder /c)"]
    assert _waiting_lines(steps, seen) == []  # said once
    steps[1].details = {"progress": {"epoch": 1}}
    assert _waiting_lines(steps, seen) == []


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_console_script_makes_openmp_waits_passive_unless_set(given: str | None, seen: str) -> None:
    """A new user's trial: train's loop took 10-20x as long in some runs on 2 cores (OpenMP threads spinning while
    the thread they waited for had no core). The console script sets OMP_WAIT_POLICY=PASSIVE, before torch is
    imported and for the step processes it starts; a value the user set is kept."""
    code = (
        "import os, sys\n"
        "import heteroflow.pipelines.cli.main as cli\n"
        "cli.console_script = lambda: print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)\n"
        "from heteroflow.pipelines.cli.script import console_script\n"
        "sys.argv = ['heteroflow', 'runs']\n"
        "console_script()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": given} if given else {})
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [seen, "False"], done.stdout


# --- help that says what the code does (a new user's trial) ------------------------------------------------------


def _help_text(text: str) -> str:
    """Help text as one line: rich's box, its borders and the wrapping gone."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_profile_help_names_the_training_profile_parameter() -> None:
    """`heteroflow --help` said "the plan step's `profile` parameter"; there is none: it is `training_profile`."""
    top = _help_text(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output)
    profile = _help_text(CliRunner().invoke(app, ["profile", "--help"], env={"COLUMNS": "200"}).output)
    for text in (top, profile):
        assert "(the `training_profile` parameter of plan and train takes it: heteroflow run --param training_profile=profile.json)" in text, text
        assert "`profile` parameter" not in text
    assert "training_profile" in PARAM_NAMES  # the parameter the help names is one


def test_params_help_lists_every_class_column_name_and_every_device_inventory_form() -> None:
    """`label_column` omitted `labels` and `classes`, which the code takes; `device_inventory` said JSON only, while
    a node inventory's path (and `kubernetes`) work too."""
    from heteroflow.components.data.columns import CLASS_COLUMN_NAMES

    spec = json.loads(CliRunner().invoke(app, ["params", "--json"]).output)
    label = spec["label_column"]["help"]
    assert "a column named " + ", ".join(CLASS_COLUMN_NAMES[:-1]) + f" or {CLASS_COLUMN_NAMES[-1]} (any case; in that order of preference)" in label, label
    inventory = spec["device_inventory"]["help"]
    assert ('JSON {"gpu": N, "npu": M} (or per model {"gpu": {"t4": 4}}), the path of a node inventory file (.yaml, .yml '
            "or .json: nodes with their devices, queues, a policy), or kubernetes (the live cluster's free capacity)") in inventory, inventory


def test_a_class_column_named_as_the_help_says_is_taken(tmp_path: Path) -> None:
    """What the help lists is what preprocess takes: `classes` (the last name listed), in any case, not the last column."""
    from heteroflow.components.data.columns import CLASS_COLUMN_NAMES
    from heteroflow.components.data.datasets import read_table
    from heteroflow.components.data.columns import _label_of

    assert CLASS_COLUMN_NAMES[-2:] == ("labels", "classes")
    table = tmp_path / "t.csv"
    table.write_text("Classes,a,b\nx,1,2\ny,3,4\nx,5,6\n")
    assert _label_of(read_table(table), "")[0] == "Classes"


def test_a_node_inventory_file_the_device_inventory_help_names_is_taken(tmp_path: Path) -> None:
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.components.placement.plan import check_plan_params

    inv = tmp_path / "cluster.yaml"
    inv.write_text("nodes:\n  - {name: a, devices: {t4: 2}, cpu: 8, memory: 32Gi}\n")
    check_plan_params(device_inventory=str(inv))
    with pytest.raises(InvalidParameter, match=r"or the path of a node inventory file \(\.yaml, \.yml or \.json\), or kubernetes$"):
        check_plan_params(device_inventory=str(tmp_path / "cluster.txt"))


def test_run_help_lists_every_registered_engine_and_every_fault_form() -> None:
    """`--engine` did not list `airflow` (registered through an entry point); `--inject-fault` omitted
    `:after_steps=N`. The engines come from the registry as the help is shown."""
    from heteroflow.components.core.failures import parse_faults
    from heteroflow.pipelines.engines.registry import engine_names, get_engine

    text = _help_text(CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output)
    assert "airflow" in engine_names()
    for name in engine_names():
        assert f"{name}: {' '.join(get_engine(name, check=False).description.split())}" in text, (name, text)
    assert "airflow: a real Airflow 3 on SQLite" in text
    assert "Testing: STEP@KIND=CLASS[:N | :after_steps=N] (repeatable; CLASS: device, transient, permanent)" in text, text
    assert "train@npu=device:after_steps=40" in text
    for example in ("train@npu=device", "preprocess@cpu=permanent", "train@npu=transient:2", "train@npu=device:after_steps=40"):
        assert parse_faults(example)  # every example the help gives parses
