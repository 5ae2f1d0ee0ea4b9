"""Parameter problems are reported before a run starts (README: exit 2, one line, no run folder made), each named as
the user wrote it: a new user's trial.

The trial's inputs: prewarm's parameters were checked only when prewarm ran (a run folder made, a permanent failure,
exit 1; ``copy_threads`` named ``workers``; ``lock_timeout_s=-1`` accepted, and filelock waits forever for it).
Siblings found in the code: ``cache_root`` (an unknown scheme, an Alluxio ``timeout_s`` that is not a number) was
refused only when prewarm ran, or with a bare ``ValueError``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from heteroflow.cache.errors import InvalidCacheOption
from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.default import default_pipeline
from heteroflow.pipelines.runs.records import prepare_arguments


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    """``heteroflow run ARGS`` in tmp_path; (exit code, output)."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--engine", "inprocess", *args])
    return result.exit_code, result.output


# --- prewarm's parameters -----------------------------------------------------------------------------------

PREWARM_CASES = {
    # the trial's inputs
    "keep_versions=-1": "keep_versions=-1 is out of range; valid: 1 or more (the current version included)",
    "copy_threads=-3": "copy_threads=-3 is out of range; valid: 0 (sized to the work and the CPU cores) or more",
    "verify_cached=md5": "verify_cached='md5' is not a verification mode; valid: size, stat, sha256",
    "lock_timeout_s=-1": "lock_timeout_s=-1.0 is out of range; valid: a number of seconds >= 0 (0: do not wait)",
    # siblings
    "keep_versions=0": "keep_versions=0 is out of range; valid: 1 or more (the current version included)",
    "lock_timeout_s=nan": "lock_timeout_s=nan is not a finite number; valid: a number of seconds >= 0 (0: do not wait)",
    "cache_root=ftp://host/cache": "cache_root='ftp://host/cache': unknown cache scheme ftp://; valid: empty (the local "
    "cache), a folder, file://FOLDER, alluxio2://PROXY_HOST[:PORT][?mount=DIR], "
    "alluxio3://WORKER_HOST[:PORT][,HOST:PORT...][?mount=DIR]",
    "cache_root=alluxio2://proxy:39999?timeout_s=soon": "cache_root='alluxio2://proxy:39999?timeout_s=soon': "
    "timeout_s='soon' is not valid; valid: a number of seconds > 0",
}


@pytest.mark.parametrize(("param", "message"), PREWARM_CASES.items(), ids=list(PREWARM_CASES))
def test_prewarm_parameters_are_refused_before_the_run_starts(
    param: str, message: str, tmp_path: Path, heteroflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = _run(tmp_path, monkeypatch, "--param", param)
    assert code == 2, output
    assert output == f"error: {message}\n"
    assert not (tmp_path / "heteroflow-runs").exists()  # no run folder
    assert not (heteroflow_home / "cache").exists()  # prewarm copied nothing (the digits sample is exported, not cached)


def test_prewarm_parameters_come_with_the_other_steps_problems(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter) as caught:
        prepare_arguments(default_pipeline(), {"copy_threads": -3, "keep_versions": 0, "epochs": 0})
    assert str(caught.value) == (
        "3 problems with this run (nothing was run; fix each and rerun):\n"
        "- copy_threads=-3 is out of range; valid: 0 (sized to the work and the CPU cores) or more\n"
        "- keep_versions=0 is out of range; valid: 1 or more (the current version included)\n"
        "- epochs=0 is out of range; valid: an integer >= 1"
    )


def test_valid_prewarm_parameters_pass(tmp_path: Path) -> None:
    args = prepare_arguments(default_pipeline(), {"copy_threads": 0, "keep_versions": 1, "verify_cached": "sha256",
                                                  "lock_timeout_s": 0.0, "cache_root": str(tmp_path / "tier")})
    assert (args["copy_threads"], args["keep_versions"], args["lock_timeout_s"]) == (0, 1, 0.0)


def test_prewarm_dataset_names_its_own_parameters_when_called_directly(tmp_path: Path, digits_dir: Path) -> None:
    # a step process (KFP, Airflow, `heteroflow step`) calls the function without the run's check: the same words
    from heteroflow.cache.prewarm import prewarm_dataset

    with pytest.raises(InvalidCacheOption) as caught:
        prewarm_dataset(str(digits_dir), str(tmp_path / "out"), cache_root=str(tmp_path / "tier"), copy_threads=-3,
                        verify_cached="md5", lock_timeout_s=-1.0)
    assert str(caught.value) == (
        "3 problems with prewarm's parameters:\n"
        "- copy_threads=-3 is out of range; valid: 0 (sized to the work and the CPU cores) or more\n"
        "- verify_cached='md5' is not a verification mode; valid: size, stat, sha256\n"
        "- lock_timeout_s=-1.0 is out of range; valid: a number of seconds >= 0 (0: do not wait)"
    )
    assert not (tmp_path / "tier").exists() and not (tmp_path / "out").exists()


def test_prewarm_refuses_a_lock_timeout_that_would_wait_forever(tmp_path: Path, digits_dir: Path) -> None:
    from heteroflow.cache.prewarm import prewarm

    with pytest.raises(InvalidCacheOption, match=r"^lock_timeout_s=-1 is out of range; valid: a number of seconds >= 0"):
        prewarm(str(digits_dir), tmp_path / "cache", lock_timeout_s=-1)
    assert not (tmp_path / "cache").exists()


def test_an_alluxio_timeout_that_is_not_a_number_is_an_invalid_cache_option() -> None:
    from heteroflow.cache.backends import backend_for

    with pytest.raises(InvalidCacheOption, match=r"^cache root alluxio3://w:28080\?poll_s=-2: poll_s='-2' is not valid; "
                                                  r"valid: a number of seconds > 0$"):
        backend_for("alluxio3://w:28080?poll_s=-2")
    assert backend_for("alluxio3://w:28080?poll_s=0.5").poll_s == 0.5


def test_heteroflow_prewarm_names_its_own_options(digits_dir: Path, tmp_path: Path) -> None:
    # `heteroflow prewarm` passes --workers/--verify/--cache to prewarm_dataset: its errors name the options typed
    result = CliRunner().invoke(app, ["prewarm", str(digits_dir), "--cache", str(tmp_path / "tier"), "--workers", "-3"])
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: --workers=-3 is out of range; valid: 0 (sized to the work and the CPU cores) or more\n"
    result = CliRunner().invoke(app, ["prewarm", str(digits_dir), "--cache", "gs://b/c", "--verify", "md5"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[:3] == [
        "error: 2 problems with the options:",
        "- --cache='gs://b/c': unknown cache scheme gs://; valid: empty (the local cache), a folder, file://FOLDER, "
        "alluxio2://PROXY_HOST[:PORT][?mount=DIR], alluxio3://WORKER_HOST[:PORT][,HOST:PORT...][?mount=DIR]",
        "- --verify='md5' is not a verification mode; valid: size, stat, sha256",
    ]
    assert not (tmp_path / "tier").exists()


# --- one problem, one message -------------------------------------------------------------------------------


def test_a_bad_delimiter_is_one_problem(tmp_path: Path, heteroflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the trial's input: "2 problems" (preprocess's check, and the up-front read of the tables with it)
    code, output = _run(tmp_path, monkeypatch, "--param", "delimiter=x")
    assert code == 2, output
    assert output == "error: delimiter='x' is not valid; valid: auto, ',', ';', tab, '|'\n"
    assert not (tmp_path / "heteroflow-runs").exists()


def test_a_bad_delimiter_and_header_are_two_problems_not_three(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter) as caught:
        prepare_arguments(default_pipeline(), {"delimiter": "x", "header": "maybe"})
    assert str(caught.value) == (
        "2 problems with this run (nothing was run; fix each and rerun):\n"
        "- header='maybe' is not valid; valid: auto, true, false\n"
        "- delimiter='x' is not valid; valid: auto, ',', ';', tab, '|'"
    )


def test_a_problem_two_steps_find_is_one_line(tmp_path: Path, heteroflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `seed` sets preprocess.seed and train.seed: both checks find the same problem; it read "1 problem with this run:"
    code, output = _run(tmp_path, monkeypatch, "--param", "seed=-1")
    assert code == 2, output
    assert output == "error: seed=-1 is out of range; valid: an integer from 0 to 4294967295\n"


# --- heteroflow profile -------------------------------------------------------------------------------------


def test_profile_refuses_bad_steps_before_it_prewarms_and_preprocesses(tmp_path: Path, heteroflow_home: Path) -> None:
    # the trial's input: preprocess ran (2.7 s) before `steps` was refused
    result = CliRunner().invoke(app, ["profile", "--steps", "-5", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: steps=-5 is out of range; valid: an integer >= 1\n"
    assert not (heteroflow_home / "cache").exists()  # the digits sample was not prewarmed
    assert not (tmp_path / "p.json").exists()


def test_profile_refuses_every_bad_parameter_at_once_before_any_work(tmp_path: Path, heteroflow_home: Path) -> None:
    # sibling: train's parameters were checked after preprocess too, one at a time; `model` keeps the name typed
    result = CliRunner().invoke(app, ["profile", "--steps", "0", "-p", "batch_size=0", "-p", "model=nosuch",
                                      "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: 3 problems with the profile's parameters:\n"
        "- steps=0 is out of range; valid: an integer >= 1\n"
        "- batch_size=0 is out of range; valid: an integer >= 1\n"
        "- model (train's model_factory): model_factory 'nosuch' is not 'module:attribute' (e.g. mypkg.models:make_model)\n"
    )
    assert not (heteroflow_home / "cache").exists()


def test_check_profile_params_gathers_its_problems() -> None:
    from heteroflow.components.training.profiling import check_profile_params
    from heteroflow.components.training.step import TRAIN

    check_profile_params(steps=1, warmup_steps=0, batch_size=8)  # valid: nothing to say
    with pytest.raises(InvalidParameter) as caught:
        check_profile_params(steps=0, warmup_steps=-1, hiden=3)
    assert str(caught.value) == (
        "3 problems with the profile's parameters:\n"
        "- steps=0 is out of range; valid: an integer >= 1\n"
        "- warmup_steps=-1 is out of range; valid: an integer >= 0\n"
        f"- hiden: not a parameter of train; valid: {', '.join(TRAIN.param_names)}"
    )


# --- named as typed -----------------------------------------------------------------------------------------


def test_a_value_given_by_an_alias_is_named_by_the_alias(tmp_path: Path, heteroflow_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # the trial's input: `seed` (sets preprocess.seed and train.seed) was named `preprocess.seed`
    code, output = _run(tmp_path, monkeypatch, "--param", "seed=1.5")
    assert code == 2, output
    assert output == "error: parameter seed='1.5' is not a valid int; valid: an integer, e.g. 3\n"
    # sibling: KFP's spelling of train.seed is named as typed too
    code, output = _run(tmp_path, monkeypatch, "--param", "train_seed=x")
    assert code == 2, output
    assert output == "error: parameter train_seed='x' is not a valid int; valid: an integer, e.g. 3\n"
    assert not (tmp_path / "heteroflow-runs").exists()


def test_a_step_parameter_given_by_its_pipeline_name_is_named_so(tmp_path: Path, heteroflow_home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # sibling: `preprocess.seed=-1` read `seed=-1 is out of range`, which names the alias that sets both steps' seeds
    code, output = _run(tmp_path, monkeypatch, "--param", "preprocess.seed=-1", "--param", "seed=-2")
    assert code == 2, output
    assert output == (
        "error: 2 problems with this run (nothing was run; fix each and rerun):\n"
        "- preprocess.seed=-1 is out of range; valid: an integer from 0 to 4294967295\n"
        "- seed=-2 is out of range; valid: an integer from 0 to 4294967295\n"
    )


def test_prepare_arguments_names_each_parameter_as_given(tmp_path: Path) -> None:
    # the engines' own check (Airflow's conf, heteroflow.run's params): an alias, KFP's spelling, a wrong type
    with pytest.raises(InvalidParameter, match=r"^train_seed=-2 is out of range; valid: an integer from 0 to 4294967295$"):
        prepare_arguments(default_pipeline(), {"train_seed": -2})
    with pytest.raises(InvalidParameter, match=r"^parameter seed='1\.5' is a string; valid: an integer$"):
        prepare_arguments(default_pipeline(), {"seed": "1.5"})
    args = prepare_arguments(default_pipeline(), {"seed": 3, "train_seed": 5})  # the values themselves: as before
    assert (args["preprocess.seed"], args["train.seed"]) == (3, 5)


# --- every problem of a step, not its first -----------------------------------------------------------------


def test_archive_and_plan_report_each_of_their_problems(tmp_path: Path) -> None:
    # siblings of the audit: archive's check stopped at model_name, plan's at device_inventory
    with pytest.raises(InvalidParameter) as caught:
        prepare_arguments(default_pipeline(), {"model_name": "BAD", "export_formats": "tflite",
                                               "device_inventory": '{"gpu": -1}',
                                               "training_profile": str(tmp_path / "missing.json")})
    assert str(caught.value) == (
        "4 problems with this run (nothing was run; fix each and rerun):\n"
        "- device_inventory: gpu=-1 is not a device count; valid: an integer >= 0\n"
        f"- training_profile='{tmp_path / 'missing.json'}' does not exist; write one with `heteroflow profile`\n"
        "- model_name='BAD' is not a valid model name; valid: [a-z0-9][a-z0-9._-]*, up to 63 characters\n"
        "- export_formats='tflite': 'tflite' is not an export format; valid: onnx (comma-separated), or empty for "
        "PyTorch's own files only"
    )


# --- folders a step makes: named by their parameter when they cannot be made -----------------------------------

def test_a_folder_parameter_that_cannot_be_made_is_named_with_what_is_valid(tmp_path: Path) -> None:
    """Noticed at a new user's trial: ``checkpoint_root=/proc/nope`` failed train with a bare ``FileNotFoundError:
    [Errno 2] No such file or directory: '/proc/nope'`` naming no parameter; its sibling ``archive_root`` failed
    archive the same way, and a file in the folder's place said ``File exists``."""
    from heteroflow.components.errors import make_folder

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(InvalidParameter) as info:
        make_folder(a_file, param="archive_root", value=str(a_file), valid="a folder")
    assert str(info.value) == f"archive_root={str(a_file)!r}: cannot make the folder {a_file} (a file is there, not a folder); valid: a folder"
    with pytest.raises(InvalidParameter) as info:
        make_folder(a_file / "sub", param="checkpoint_root", value="~/x", valid="a folder")
    assert str(info.value).startswith(f"checkpoint_root='~/x': cannot make the folder {a_file / 'sub'} (Not a directory)")
    make_folder(tmp_path / "new" / "deeper", param="archive_root", value="", valid="a folder")
    assert (tmp_path / "new" / "deeper").is_dir()


@pytest.mark.slow
def test_train_names_a_checkpoint_root_it_cannot_make(digits_shards: Path, tmp_path: Path) -> None:
    """The step itself: train refuses an unusable ``checkpoint_root`` before it touches a device, as a permanent
    InvalidParameter (no retry, no fallback). (Archive's ``archive_root`` goes through the same call.)"""
    from heteroflow.components.core.failures import FailureClass, classify
    from heteroflow.components.training.step import train

    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(InvalidParameter) as info:
        train(digits_shards, tmp_path / "model", epochs=1, checkpoint_root=str(blocker))
    assert str(info.value).startswith(f"checkpoint_root={str(blocker)!r}: cannot make the folder {blocker} (a file is there, not a folder); valid: a folder this process can write")
    assert classify(info.value).cls is FailureClass.PERMANENT
    assert not (tmp_path / "model").exists()
