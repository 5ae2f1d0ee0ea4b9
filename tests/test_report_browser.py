"""The HTML run report in a real browser: headless Chromium (the Debian package) opens the reports of a run that
succeeded, a run that failed and a run that fell back, through the DevTools protocol over a pipe. Each gets a
screenshot (the test artifact: under ``$HETEROFLOW_TEST_ARTIFACTS/report-browser/`` when that is set, as
``.ci/run`` sets it, else under pytest's tmp dir), and the checks are made on what the page shows
(``document.body.innerText``): every step, the failure and the fallback reason, the plots, and no console error.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"),
]

STEPS = ["prewarm", "preprocess", "plan", "train", "evaluate", "archive"]


class Browser:
    """A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (fd 3: commands to the browser,
    fd 4: replies and events; messages are JSON separated by NUL bytes). No port, no network, no extra package."""

    def __init__(self, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire() -> None:  # in the child: fd 3 reads our commands, fd 4 writes its replies
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=wire,
            pass_fds=(3, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        self._replies.setdefault(msg["id"], queue.Queue()).put(msg)
                else:
                    self.events.append(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None, timeout: float = 60) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            box = self._replies.setdefault(ident, queue.Queue())
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"chromium did not answer {method} in {timeout} s; stderr: {b''.join(self._stderr)[-2000:]!r}") from None
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, session: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            time.sleep(0.05)
        raise AssertionError(f"no {method} within {timeout} s")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass


class Page:
    """One tab: what it printed to the console, its visible text, a full-page screenshot."""

    def __init__(self, browser: Browser, url: str) -> None:
        self.browser = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            browser.send(f"{domain}.enable", session=self.session)
        browser.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=self.session)
        browser.send("Page.navigate", {"url": url}, session=self.session)
        browser.wait_event("Page.loadEventFired", self.session)

    def evaluate(self, expression: str) -> Any:
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console messages of level error, uncaught exceptions, and browser log entries of level error (a
        resource that failed to load, a blocked request) of this tab."""
        out = []
        for e in self.browser.events:
            if e.get("sessionId") != self.session:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                # the message first: 500 characters of the details' JSON, where the page's URL comes before it, cut
                # "Error: boom" off under pytest-xdist (a longer tmp_path: .../popen-gw0/...)
                details = p.get("exceptionDetails", {})
                message = f"{details.get('text', '')} {details.get('exception', {}).get('description', '')}".strip()
                out.append(f"{message} {json.dumps(details)}"[:500])
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def screenshot(self, path: Path) -> Path:
        size = self.browser.send("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
        shot = self.browser.send(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
            session=self.session,
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real runs of the default pipeline (in-process engine, 2 epochs): one that succeeded, one whose train
    failed permanently, one whose train fell back from the (simulated) NPU to the GPU after a device failure."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.engines.inprocess import run_inprocess

    root = tmp_path_factory.mktemp("report-runs")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HETEROFLOW_HOME", str(root / "home"))
        mp.delenv("HETEROFLOW_RUN_DIR", raising=False)
        for name, faults in (("ok", None), ("failed", "train@npu=permanent"), ("fallback", "train@npu=device")):
            record = run_inprocess(
                default_pipeline(),
                {"epochs": 2},
                run_dir=root / name,
                simulate_devices="npu,gpu" if faults else None,
                inject_faults=faults,
            )
            assert record.status == ("failed" if name == "failed" else "succeeded"), record.status
            out[name] = root / name
    return out


def _open(browser: Browser, run_dir: Path, artifacts: Path, name: str) -> tuple[Page, str]:
    report = run_dir / "report.html"  # written at the end of the run
    assert report.is_file()
    page = Page(browser, report.as_uri())
    kept = os.environ.get("HETEROFLOW_TEST_ARTIFACTS")
    if kept:
        artifacts = Path(kept) / "report-browser"
        artifacts.mkdir(parents=True, exist_ok=True)
    shot = page.screenshot(artifacts / f"report-{name}.png")
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.console_errors() == []
    text = page.evaluate("document.body.innerText")
    shown = page.evaluate("Array.from(document.querySelectorAll('.node[data-step]')).filter(n => n.getBoundingClientRect().height > 0).map(n => n.dataset.step)")
    assert shown == STEPS
    for step in STEPS:
        assert step in text
    # nothing is fetched at view time: every resource the page loaded is the file itself
    loaded = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded == []
    return page, text


def _plots(page: Page) -> dict[str, tuple[float, float]]:
    """The rendered plots: label -> (width, height) in CSS pixels."""
    return {
        k: tuple(v)
        for k, v in page.evaluate(
            "Object.fromEntries(Array.from(document.querySelectorAll('.plot')).map(p => {const r = p.querySelector('svg').getBoundingClientRect(); return [p.dataset.plot, [r.width, r.height]];}))"
        ).items()
    }


def test_report_of_a_run_that_succeeded(browser: Browser, runs: dict[str, Path], tmp_path: Path) -> None:
    page, text = _open(browser, runs["ok"], tmp_path, "ok")
    assert "succeeded" in text
    plots = _plots(page)
    assert {"timeline", "evaluate confusion", "evaluate per class"} <= set(plots)
    assert all(w > 200 and h > 100 for w, h in plots.values()), plots
    from heteroflow.pipelines.runs.folders import history_of, load_run

    for call in history_of(load_run(runs["ok"])):  # the per-epoch curves of whatever history the record holds
        assert f"{call} loss" in plots
    # the confusion matrix and per-class figures are the run's own numbers
    record = json.loads((runs["ok"] / "run.json").read_text())
    cm = record["results"]["evaluate"]["confusion_matrix"]
    cells = page.evaluate("Array.from(document.querySelectorAll('table.confusion tr')).slice(1).map(r => Array.from(r.querySelectorAll('td')).map(c => Number(c.innerText)))")
    assert cells == cm
    assert f"{record['results']['evaluate']['accuracy']:.4f}" in text
    # lineage: data set version -> archived model version
    archive = record["results"]["archive"]
    assert record["results"]["prewarm"]["version"] in text and f"{archive['name']}:v{archive['version']}" in text


def test_report_of_a_failed_run(browser: Browser, runs: dict[str, Path], tmp_path: Path) -> None:
    page, text = _open(browser, runs["failed"], tmp_path, "failed")
    assert "step train failed (permanent failure)" in text
    assert "injected by HETEROFLOW_INJECT_FAULT (train@npu=permanent)" in text
    statuses = page.evaluate("Object.fromEntries(Array.from(document.querySelectorAll('.node[data-step]')).map(n => [n.dataset.step, n.innerText.split('\\n')[1]]))")
    assert statuses == {"prewarm": "succeeded", "preprocess": "succeeded", "plan": "succeeded", "train": "failed", "evaluate": "not run", "archive": "not run"}
    assert "timeline" in _plots(page)


def test_report_of_a_run_that_fell_back(browser: Browser, runs: dict[str, Path], tmp_path: Path) -> None:
    page, text = _open(browser, runs["fallback"], tmp_path, "fallback")
    fallbacks = page.evaluate("Array.from(document.querySelectorAll('li.fallback')).map(li => li.innerText)")
    assert len(fallbacks) == 1
    assert fallbacks[0].startswith("train left candidate 0 (npu (ascend-910)) after a device failure: ")
    assert "injected by HETEROFLOW_INJECT_FAULT (train@npu=device)" in fallbacks[0]
    train = page.evaluate("document.querySelector('.node[data-step=train]').innerText")
    assert "gpu (nvidia-gpu, simulated, on cpu)" in train and "candidate: 1" in train and "attempts: 2" in train
    assert {"timeline", "evaluate confusion", "evaluate per class"} <= set(_plots(page))


def test_the_console_check_sees_errors(browser: Browser, tmp_path: Path) -> None:
    """The check above can fail: a page that logs an error, throws, and loads a missing image is caught."""
    page_file = tmp_path / "bad.html"
    page_file.write_text(
        "<!DOCTYPE html><html><body><p>x</p><img src='missing.png'>"
        "<script>console.error('broken plot'); throw new Error('boom');</script></body></html>"
    )
    page = Page(browser, page_file.as_uri())
    errors = page.console_errors()
    assert any("broken plot" in e for e in errors)
    assert any("boom" in e for e in errors)
    assert any("missing.png" in e or "ERR_FILE_NOT_FOUND" in e for e in errors), errors
