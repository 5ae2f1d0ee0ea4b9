"""The HTML run report: what it says for records of any shape, per-epoch history plots, escaping, no network,
``heteroflow report``, and report.html written at the end of a run. (In a browser: test_report_browser.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from heteroflow.pipelines.runs.report import REPORT_FILE, render_report, write_report, write_report_quietly


@pytest.fixture(autouse=True)
def _no_drawings_or_prerender_thread_between_tests() -> Any:
    """Each test starts with no prerender thread and no plots memoized by an earlier test, and leaves none: under
    pytest-xdist a test that rendered a report without writing it (render_report keeps its drawings; write_report
    drops them) ran before the prerender test in the same worker, whose wait for 3 drawings then read the stale
    ones at once and failed; it failed before write_report, so its thread went on drawing into the next test's
    figures, which failed too."""
    from heteroflow.pipelines.runs import charts, prerendering

    def clean() -> None:
        prerendering.stop_prerender()
        with charts._CHARTS_LOCK:
            charts._CHARTS.clear()

    clean()
    yield
    clean()


def _record(tmp_path: Path, **changes: Any) -> Path:
    """A run folder holding a run.json and attempt records written the way the engines write them."""
    run = {
        "run_id": "r1",
        "pipeline": "toy",
        "status": "succeeded",
        "run_dir": str(tmp_path),
        "started_at": 1_700_000_000.0,
        "wall_seconds": 12.5,
        "params": {"epochs": 3, "dataset_uri": "/data/<iris>"},
        "steps": [
            {"name": "prep", "status": "succeeded", "device": "cpu", "kind": "cpu", "candidate": None, "attempts": 1, "seconds": 0.5},
            {"name": "train", "status": "succeeded", "device": "cpu", "kind": "gpu", "accelerator": "nvidia-gpu", "simulated": True,
             "candidate": 0, "attempts": 2, "seconds": 3.0},
        ],
        "fallbacks": [],
        "metrics": {},
        "results": {
            "evaluate": {
                "accuracy": 0.5,
                "classes": ["[setosa]", "<b>virginica</b>"],
                "confusion_matrix": [[3, 1], [2, 4]],
                "precision": {"[setosa]": 0.6, "<b>virginica</b>": 0.8},
                "recall": {"[setosa]": 0.75, "<b>virginica</b>": 0.6667},
                "samples": 10,
            }
        },
        "placement": {},
    }
    run.update(changes)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run.json").write_text(json.dumps(run))
    steps = tmp_path / "steps" / "train"
    steps.mkdir(parents=True, exist_ok=True)
    (steps / "attempt-1.json").write_text(json.dumps({"step": "train", "attempt": 1, "status": "failed", "failure": "transient",
                                                      "error": "TimeoutError: storage", "candidate": 0, "kind": "gpu",
                                                      "started_at": 1_700_000_001.0, "ended_at": 1_700_000_002.0, "seconds": 1.0}))
    (steps / "attempt-2.json").write_text(json.dumps({"step": "train", "attempt": 2, "status": "succeeded", "candidate": 0, "kind": "gpu",
                                                      "started_at": 1_700_000_009.5, "ended_at": 1_700_000_012.5, "seconds": 3.0}))
    return tmp_path


def test_history_is_plotted_per_epoch(tmp_path: Path) -> None:
    history = [{"epoch": e, "loss": 1.0 / e, "validation_accuracy": 0.5 + e / 10} for e in (1, 2, 3)]
    folder = _record(tmp_path, results={"train": {"final_loss": 0.333, "history": history}})
    html = render_report(folder)
    plots = re.findall(r'data-plot="([^"]+)"', html)
    assert plots == ["timeline", "train loss", "train metrics"]
    loss_svg = html.split('data-plot="train loss"')[1].split("</svg>")[0]
    assert "loss" in loss_svg and "validation_accuracy" not in loss_svg  # one curve per group, labelled
    assert "validation_accuracy" in html.split('data-plot="train metrics"')[1].split("</svg>")[0]
    assert "no per-epoch history" not in html


def test_an_interrupted_run_plots_the_history_so_far_and_its_stopped_attempt_is_not_running(tmp_path: Path) -> None:
    """A fresh-user trial: Ctrl-C during train left a report saying "no per-epoch history" and an attempts row
    "running" for an attempt that ended with the run. The live progress carries the history so far, and an
    attempt still marked running in an ended run is shown as what happened to the run."""
    history = [{"epoch": e, "loss": 1.0 / e} for e in (1, 2)]
    steps = [{"name": "train", "status": "killed", "kind": "cpu", "candidate": 0, "attempts": 1,
              "details": {"progress": {"epoch": 2, "epochs": 5, "loss": 0.5, "history": history}}}]
    folder = _record(tmp_path, status="interrupted", steps=steps, results={})
    (folder / "steps" / "train" / "attempt-2.json").unlink()
    (folder / "steps" / "train" / "attempt-1.json").write_text(json.dumps(
        {"step": "train", "attempt": 1, "status": "running", "candidate": 0, "kind": "cpu", "started_at": 1_700_000_001.0}))
    html = render_report(folder)
    assert "train loss" in re.findall(r'data-plot="([^"]+)"', html)
    assert "no per-epoch history" not in html
    attempts = html.split("<h2>Attempts</h2>")[1].split("</table>")[0]
    assert "interrupted" in attempts and "running" not in attempts
    # sibling: a run whose process died (killed) shows its attempt as killed
    (folder / "run.json").write_text(json.dumps({**json.loads((folder / "run.json").read_text()), "status": "killed"}))
    attempts = render_report(folder).split("<h2>Attempts</h2>")[1].split("</table>")[0]
    assert "killed" in attempts and "running" not in attempts


def test_a_resumed_training_marks_where_it_resumed_on_its_curves(tmp_path: Path) -> None:
    """#28 item 11: the curve of a training that resumed at step 40 (after a fallback) has a dashed line there,
    labelled, between the epochs whose steps surround it; a fresh start has none."""
    from heteroflow.pipelines.runs.charts import _resume_at

    history = [{"epoch": e, "step": 23 * e, "loss": 1.0 / e} for e in (1, 2, 3, 4)]
    folder = _record(tmp_path, results={"train": {"history": history, "resumed_from_step": 40, "steps": 92}})
    html = render_report(folder)
    assert "resumed from step 40" in html
    assert _resume_at([1, 2, 3, 4], history, 40, 92) == pytest.approx(1 + 17 / 23)
    # sibling: a history without steps (a training function that reports epochs only) places it by the share
    assert _resume_at([1, 2, 3, 4], [{"epoch": e} for e in (1, 2, 3, 4)], 46, 92) == pytest.approx(2.0)
    fresh = _record(tmp_path / "fresh", results={"train": {"history": history, "resumed_from_step": 0, "steps": 92}})
    assert "resumed from step" not in render_report(fresh)


def test_history_under_the_step_details_or_metrics_is_found(tmp_path: Path) -> None:
    folder = _record(tmp_path, metrics={"train": {"history": [{"epoch": 1, "loss": 0.9}, {"epoch": 2, "loss": 0.4}]}})
    assert 'data-plot="train loss"' in render_report(folder)


def test_history_as_columns_is_plotted(tmp_path: Path) -> None:
    folder = _record(tmp_path, results={"train": {"history": {"loss": [0.9, 0.5, 0.2], "validation_accuracy": [0.5, 0.7, 0.9]}}})
    html = render_report(folder)
    assert 'data-plot="train loss"' in html and 'data-plot="train metrics"' in html


def test_a_record_without_history_says_so_and_still_renders(tmp_path: Path) -> None:
    html = render_report(_record(tmp_path))
    assert "The record holds no per-epoch history." in html
    assert 'data-plot="evaluate confusion"' in html and 'data-plot="evaluate per class"' in html


def test_retries_show_their_waits(tmp_path: Path) -> None:
    html = render_report(_record(tmp_path))
    assert "1 retry, 7.5 s spent waiting (backoff)." in html
    assert "7.5 s over 1 retry" in html


def test_class_names_and_values_are_escaped_and_nothing_is_fetched(tmp_path: Path) -> None:
    html = render_report(_record(tmp_path))
    assert "<b>virginica</b>" not in html and "&lt;b&gt;virginica&lt;/b&gt;" in html
    assert "[setosa]" in html  # literal, never taken for markup
    assert "/data/&lt;iris&gt;" in html
    # self-contained: no script, and no src/href that leaves the document
    assert "<script" not in html
    assert not re.findall(r'(?:src|href)="(?!#|data:)', html)  # in-document links and data: URIs only
    assert not re.findall(r"https?://(?!www\.w3\.org/)", html)  # only SVG/XLink namespace names


def test_svg_ids_are_unique_in_the_document(tmp_path: Path) -> None:
    folder = _record(tmp_path, results={**json.loads((_record(tmp_path) / "run.json").read_text())["results"],
                                        "train": {"history": [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]}})
    ids = re.findall(r'\sid="([^"]+)"', render_report(folder))
    assert ids and len(ids) == len(set(ids))


def test_a_killed_run_with_few_fields_renders(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "k", "status": "killed", "error": "the run's process ended"}))
    html = render_report(tmp_path)
    assert "killed" in html and "the run&#x27;s process ended" in html


def test_write_report_is_atomic_and_quiet_failures_warn(tmp_path: Path) -> None:
    folder = _record(tmp_path / "run")
    path = write_report(folder)
    assert path == folder / REPORT_FILE and path.read_text().startswith("<!DOCTYPE html>")
    assert not list(folder.glob("*.tmp*"))
    with pytest.warns(RuntimeWarning, match="could not write report.html"):
        assert write_report_quietly(tmp_path / "nothing-here") is None


def test_report_command(tmp_path: Path) -> None:
    from heteroflow.pipelines.cli.main import app

    folder = _record(tmp_path / "run")
    result = CliRunner().invoke(app, ["report", str(folder), "-o", str(tmp_path / "out.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.html").read_text().count('class="node"') == 2
    result = CliRunner().invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 2 and f"run folder {tmp_path / 'missing'} does not exist" in " ".join(result.output.split())


@pytest.mark.slow
def test_every_run_writes_its_report(tmp_path: Path) -> None:
    """The in-process engine (and kfp.local and Airflow, through the same record writer) leaves report.html."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    record = run_inprocess(default_pipeline(), {"epochs": 1}, run_dir=tmp_path / "run", simulate_devices="npu,gpu",
                           inject_faults="train@npu=transient:1", sleep=lambda s: None)
    assert record.status == "succeeded"
    html = (tmp_path / "run" / REPORT_FILE).read_text()
    assert "1 retry" in html and "transient" in html
    for step in record.steps:
        assert f'data-step="{step.name}"' in html


def test_credentials_in_a_record_never_reach_the_report(tmp_path: Path) -> None:
    folder = _record(tmp_path / "run", error="OSError: cannot read https://alice:s3cret@data.example.com/x.csv",
                     params={"dataset_uri": "https://alice:s3cret@data.example.com/"})
    text = write_report(folder).read_text()
    assert "s3cret" not in text and "data.example.com" in text


def test_a_user_steps_results_named_like_evaluates_do_not_break_the_report(tmp_path: Path) -> None:
    """Any step's results are read by the report; a user's step may name its facts as evaluate does with
    other shapes. CI once saw ``could not write report.html: TypeError: 'int' object is not iterable`` for a
    calibrate step returning ``{"classes": 10}``; its siblings are a ``counts`` that is not a dict of numbers
    and a ``confusion_matrix`` or ``precision`` of another shape. Those are left undrawn; evaluate's still are."""
    evaluate = json.loads((_record(tmp_path / "base") / "run.json").read_text())["results"]["evaluate"]
    results = {
        "evaluate": evaluate,
        "calibrate": {"temperature_scale": 2.5, "classes": 10},
        "count": {"counts": "many", "num_classes": 3},
        "odd": {"confusion_matrix": [[1, 2], [3]], "precision": {"a": "high"}, "recall": {"a": 0.5}},
    }
    folder = _record(tmp_path / "run", results=results)
    path = write_report(folder)
    html = path.read_text()
    assert html.count('data-plot="') == html.count("<svg")  # every plot present is whole
    assert 'data-plot="evaluate confusion"' in html and 'data-plot="evaluate per class"' in html
    assert 'data-plot="odd confusion"' not in html and 'data-plot="odd per class"' not in html


def test_prewarm_imports_matplotlib_in_the_background_and_the_report_waits_for_it(tmp_path: Path) -> None:
    """The engines start the report's matplotlib import while the steps run (a fresh interpreter shows it: the
    import happens on another thread, and write_report joins that thread)."""
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "from heteroflow.pipelines.runs import prerendering, report\n"
        "assert 'matplotlib.figure' not in sys.modules\n"
        "report.prewarm(); t = prerendering._PREWARM  # the thread is prerendering's state\n"
        "assert t is not None and t is not threading.current_thread() and t.daemon\n"
        "t.join(); assert 'matplotlib.figure' in sys.modules\n"
        "report.prewarm(); assert prerendering._PREWARM is t  # once\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_plots_of_finished_steps_are_drawn_while_the_run_goes_on_and_the_report_is_the_same(tmp_path: Path) -> None:
    """prerender draws a call's plots once its attempt record says succeeded (before the run ends); the report
    written at the end is byte for byte the report drawn from scratch."""
    import threading
    import time

    from heteroflow.pipelines.graph import Pipeline
    from heteroflow.pipelines.runs import charts, prerendering, report

    history = [{"epoch": 1, "loss": 1.2, "validation_accuracy": 0.5}, {"epoch": 2, "loss": 0.7, "validation_accuracy": 0.8}]
    evaluate = {"accuracy": 0.7, "classes": ["a", "b"], "confusion_matrix": [[3, 1], [2, 4]],
                "precision": {"a": 0.6, "b": 0.8}, "recall": {"a": 0.75, "b": 0.67}, "samples": 10}
    folder = tmp_path / "run"
    for step, details in (("train", {"history": history}), ("evaluate", evaluate)):
        (folder / "steps" / step).mkdir(parents=True)
        (folder / "steps" / step / "attempt-1.json").write_text(json.dumps(
            {"step": step, "attempt": 1, "status": "succeeded", "started_at": 1_700_000_001.0, "ended_at": 1_700_000_002.0,
             "seconds": 1.0, "details": details}))
    wake = threading.Event()
    report.prerender(folder, Pipeline("toy"), wake=wake, interval=600)  # only the wake-up can make it read now
    wake.set()  # what the runner does when a task ends
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with charts._CHARTS_LOCK:
            drawn = sorted(k.partition("[")[0] for k in charts._CHARTS)
        if len(drawn) >= 3:
            break
        time.sleep(0.05)
    assert drawn == ["_confusion_plot", "_history_plots", "_per_class_plot"], drawn
    _record(folder, results={"train": {"history": history}, "evaluate": evaluate})
    written = write_report(folder).read_text(encoding="utf-8")
    assert prerendering._PRERENDER is None and charts._CHARTS == {}, "the thread is stopped and the drawings dropped"
    assert 'data-plot="train loss"' in written and 'data-plot="evaluate confusion"' in written
    assert written == render_report(folder), "the report does not depend on what was drawn early"


@pytest.mark.parametrize("case", ["short", "long names", "many classes"])
def test_plots_keep_every_text_inside_the_figure_without_a_layout_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                          case: str) -> None:
    """The plots are placed from their texts' sizes (charts._fit), not by matplotlib's constrained layout: every
    tick label, axis label and title lies inside the figure, also with long step names (titles), long class names
    (turned x labels), and 10 classes whose last name is long (the y ticks the locator picks change once the axes
    is placed); the axes are not squeezed (long texts make the figure larger)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from heteroflow.pipelines.runs import charts

    step = "a_user_step_with_a_really_quite_long_name_indeed" if case == "long names" else "train"
    classes = {
        "short": ["0", "1", "2"],
        "long names": ["Iris-setosa-long", "a_class_name_of_thirty_nine_characters_", "Iris-virginica-long"],
        "many classes": [f"c{i}" for i in range(9)] + ["the_last_class_name_xyz"],
    }[case]
    k = len(classes)
    cm = [[(7000 if i == j else i + j) for j in range(k)] for i in range(k)]
    history = [{"epoch": e, "loss": 12345.678 / e, "validation_accuracy": 0.5 + e / 100} for e in range(1, 31)]
    evaluate = {"accuracy": 0.7, "classes": classes, "confusion_matrix": cm, "samples": 7441,
                "precision": {c: 0.5 + i / (2 * k) for i, c in enumerate(classes)},
                "recall": {c: 0.9 - i / (3 * k) for i, c in enumerate(classes)}}
    folder = _record(tmp_path, results={step: {"history": history}, "evaluate": evaluate},
                     steps=[{"name": step, "status": "succeeded"}, {"name": "train", "status": "succeeded"}])
    (folder / "steps" / step).mkdir(parents=True, exist_ok=True)
    (folder / "steps" / step / "attempt-1.json").write_text(json.dumps(
        {"step": step, "attempt": 1, "status": "succeeded", "started_at": 1_700_000_000.0, "ended_at": 1_700_000_000.5}))
    figures: dict[str, Any] = {}
    real_svg = charts._svg

    def keep(fig: Any, label: str) -> str:
        figures[label] = fig
        assert fig.get_layout_engine() is None
        return real_svg(fig, label)

    monkeypatch.setattr(charts, "_svg", keep)  # the plots (in charts) call charts._svg
    monkeypatch.setattr(charts, "_CHARTS", {})  # draw every plot here, none from an earlier test's memo
    render_report(folder)
    assert set(figures) == {"timeline", f"{step} loss", f"{step} metrics", "evaluate confusion", "evaluate per class"}
    for label, fig in figures.items():
        canvas = FigureCanvasAgg(fig)
        with charts._style(label):
            renderer = canvas.get_renderer()
            fig.draw(renderer)
            box = fig.bbox
            for ax in fig.axes:  # the plot's axes and a colorbar's: each with what it draws (ticks in view, labels, title)
                extent = ax.get_tightbbox(renderer)
                assert (extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1 and extent.y0 >= box.y0 - 1
                        and extent.y1 <= box.y1 + 1), f"{label}: {extent.bounds} is outside the figure's {box.bounds}"
            texts = [t.get_text() for t in fig.axes[0].get_yticklabels() + fig.axes[0].get_xticklabels()]
            assert any(texts), f"{label}: the axes draw tick labels"
        ax = fig.axes[0].get_position()
        width, height = fig.get_size_inches()
        assert ax.width * width >= 1.5 and ax.height * height >= 0.6, f"{label}: axes squeezed to {ax.bounds} of {width} x {height} in"


def _fallen_back(tmp_path: Path) -> Path:
    """The record of a run whose train was placed on the NPU, failed there after 40 steps, and finished on the
    (simulated) GPU, resuming from step 40."""
    return _record(
        tmp_path,
        steps=[{"name": "train", "status": "succeeded", "device": "cpu", "kind": "gpu", "accelerator": "nvidia-gpu",
                "simulated": True, "candidate": 1, "attempts": 2, "seconds": 3.0}],
        placement={"train": {"index": 0, "device_kind": "npu", "torch_device": "npu",
                             "resources": {"kind": "npu", "accelerator": "ascend-910"}, "passed_over": []}},
        fallbacks=[{"step": "train", "candidate": 0, "kind": "npu", "accelerator": "ascend-910", "failure": "device",
                    "reason": "DeviceUnavailable: injected after 40 steps"}],
        results={"train": {"device": "cpu", "device_kind": "gpu", "accelerator": "nvidia-gpu", "steps": 330,
                           "resumed_from_step": 40, "seconds": 2.0, "samples_per_second": 100.0, "final_loss": 0.25,
                           "history": [{"epoch": e, "step": 66 * e, "loss": 1.0 / e} for e in range(1, 6)]}},
    )


def test_after_a_fallback_every_view_says_the_same_place_and_the_resume_step(tmp_path: Path) -> None:
    """#28 item 17: after a fallback the report says "resumed from step 40", its Placement section names the GPU
    the run finished on (not the NPU it was placed on first), and the console's train line names it the way
    the steps table does: one wording of where each step ran."""
    import io

    from rich.console import Console

    from heteroflow.components.training.step import TRAIN
    from heteroflow.pipelines.cli.summary import _steps_table
    from heteroflow.pipelines.runs.records import StepSummary

    html = render_report(_fallen_back(tmp_path))
    placement = html.split("<h2>Placement</h2>", 1)[1].split("<h2>", 1)[0]
    where = "gpu (nvidia-gpu, simulated, on cpu)"
    assert f"candidate 1 &rarr; {where}" in placement and "placed on candidate 0, npu, then fell back" in placement
    assert "resumed from step 40" in placement
    fallbacks = html.split("<h2>Fallbacks</h2>", 1)[1].split("<h2>", 1)[0]
    assert "resumed from step 40" in fallbacks and where in fallbacks

    (line,) = TRAIN.summarize(json.loads((tmp_path / "run.json").read_text())["results"]["train"])
    assert line.startswith(f"train: 330 steps on {where} (resumed from step 40)"), line
    out = io.StringIO()
    step = StepSummary(name="train", status="succeeded", device="cpu", kind="gpu", accelerator="nvidia-gpu", simulated=True,
                       candidate=1, attempts=2, seconds=3.0)
    Console(file=out, width=200).print(_steps_table([step]))
    assert f"{where} [candidate 1]" in out.getvalue()


def test_the_step_graph_and_runs_show_word_the_device_as_the_steps_table(tmp_path: Path) -> None:
    """Sibling of #28 item 17: the report's step graph said ``gpu (nvidia-gpu) simulated`` and the summary logged
    from a record (Airflow's record-run) ``gpu (simulated, on cpu)`` for the same step and placed it on the NPU;
    all now share the wording and the place it finished."""
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.folders import device_of, load_run

    folder = _fallen_back(tmp_path)
    run = load_run(folder)
    assert device_of(run["steps"][0]) == "gpu (nvidia-gpu, simulated, on cpu)"
    assert "device: gpu (nvidia-gpu, simulated, on cpu)" in render_report(run)
    text = summary_text(run)
    assert "gpu (nvidia-gpu, simulated, on cpu) [candidate 1]" in text
    assert "placement of train: candidate 1 -> gpu (nvidia-gpu, simulated, on cpu) (placed on candidate 0, npu" in text


def test_a_mixed_train_is_worded_by_every_kind_it_trained_on_in_every_view(tmp_path: Path) -> None:
    """A fresh-clone finding (#29): after `heteroflow run -c 'gpu:count=1+npu:count=1'` the steps table and the
    placement line said ``gpu (nvidia-gpu, simulated, on cpu)`` (the attempt's kind is the candidate's first, for
    fault injection and fallback) while train's own line said it trained on gpu+npu; every view now says gpu+npu."""
    import io

    from rich.console import Console

    from heteroflow.components.training.step import TRAIN
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.cli.summary import _steps_table
    from heteroflow.pipelines.runs.folders import device_of, load_run
    from heteroflow.pipelines.runs.records import StepSummary

    facts = {"device": "cpu", "device_kind": "gpu+npu", "steps": 600, "seconds": 9.6, "samples_per_second": 24702.0,
             "final_loss": 0.0039}
    folder = _record(
        tmp_path,
        steps=[{"name": "train", "status": "succeeded", "device": "cpu", "kind": "gpu", "accelerator": "nvidia-gpu",
                "simulated": True, "candidate": 0, "attempts": 1, "seconds": 11.0, "details": facts}],
        placement={"train": {"index": 0, "device_kind": "gpu", "torch_device": "cuda",
                             "resources": {"kind": "gpu", "replicas": [{"kind": "gpu"}, {"kind": "npu"}]}, "passed_over": []}},
        results={"train": facts},
    )
    where = "gpu+npu (simulated, on cpu)"
    run = load_run(folder)
    assert device_of(run["steps"][0]) == where
    text = summary_text(run)
    assert "placement of train: candidate 0 -> " + where in text and "nvidia-gpu" not in text
    assert f"device: {where}" in render_report(run)
    (line,) = TRAIN.summarize(facts)
    assert line.startswith(f"train: 600 steps on {where} in 9.6 s"), line
    out = io.StringIO()
    step = StepSummary(name="train", status="succeeded", device="cpu", kind="gpu", accelerator="nvidia-gpu", simulated=True,
                       candidate=0, attempts=1, seconds=11.0, details=facts)
    Console(file=out, width=200).print(_steps_table([step]))
    assert where in out.getvalue() and "nvidia-gpu" not in out.getvalue()
    single = StepSummary(name="train", status="succeeded", device="cpu", kind="gpu", accelerator="nvidia-gpu", simulated=True,
                         candidate=0, attempts=1, seconds=11.0, details={**facts, "device_kind": "gpu"})
    out = io.StringIO()
    Console(file=out, width=200).print(_steps_table([single]))
    assert "gpu (nvidia-gpu, simulated, on cpu)" in out.getvalue()  # a single kind keeps its model


def test_a_call_that_did_not_run_is_placed_in_the_same_words_and_a_tiny_loss_is_not_zero(tmp_path: Path) -> None:
    """A new user's findings: after train failed, evaluate's line read "candidate 0 (0 = preferred) -> cpu (cpu)"
    while every other read "candidate 0 -> cpu"; and a 6,000-step run printed "final loss 0.0000"."""
    from heteroflow.components.training.step import TRAIN
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.folders import load_run

    folder = _record(tmp_path, status="failed",
                     steps=[{"name": "train", "status": "failed", "device": "cpu", "kind": "cpu", "candidate": 0, "attempts": 1,
                             "seconds": 1.0, "error": "ValueError: x"},
                            {"name": "evaluate", "status": "not run"}],
                     placement={"train": {"index": 0, "device_kind": "cpu", "torch_device": "cpu", "passed_over": []},
                                "evaluate": {"index": 0, "device_kind": "cpu", "torch_device": "cpu", "passed_over": []}})
    text = summary_text(load_run(folder))
    assert "placement of train: candidate 0 -> cpu" in text
    assert "placement of evaluate: candidate 0 -> cpu (placed; it did not run)" in text and "0 = preferred" not in text
    facts = {"device": "cpu", "device_kind": "cpu", "steps": 6000, "seconds": 9.0, "samples_per_second": 40000.0}
    assert TRAIN.summarize({**facts, "final_loss": 3.2149e-05})[-1].endswith("final loss 3.21e-05")
    assert TRAIN.summarize({**facts, "final_loss": 0.0039})[-1].endswith("final loss 0.0039")  # as before
    assert TRAIN.summarize({**facts, "final_loss": 0.0})[-1].endswith("final loss 0.0000")  # zero is zero
