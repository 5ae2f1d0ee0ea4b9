"""Run metrics in Prometheus' text format, with prometheus-client: a textfile-collector file per run and
``heteroflow metrics serve``.

At the end of every run, ``<run_dir>/metrics.prom`` is written (and, when ``$HETEROFLOW_METRICS_DIR`` is set, a
copy ``heteroflow-<run id>.prom`` there, for node_exporter's textfile collector: point its
``--collector.textfile.directory`` at that folder). ``heteroflow metrics write RUN_DIR`` writes one again (with
``--profile`` for costs), and ``heteroflow metrics serve`` answers ``/metrics`` on 127.0.0.1 with the metrics of
every run under the run roots, read at each scrape.

Every series carries ``run_id`` and ``pipeline`` (files of different runs never collide in one collector). A step
inside a ``ParallelFor`` is one ``step`` (its iterations' attempts add up): no series is per iteration, so a loop
over many items never multiplies the series.
Device labels: ``device_kind`` (``cpu``, ``gpu``, ``npu``), ``accelerator`` (the model, empty when none) and
``simulated`` (``true`` when the kind was simulated and the work ran on the CPU). The metrics:

======================================================  ====================================================
``heteroflow_run_info`` (gauge, 1)                      labels ``status``
``heteroflow_run_duration_seconds`` (gauge)             wall time of the run; label ``status``
``heteroflow_step_attempts_total`` (counter)            attempts per ``step``, device and ``outcome``
                                                        (``succeeded``, ``failed``, ``killed``, ...)
``heteroflow_step_seconds_total`` (counter)             seconds of those attempts (wall time inside the step
                                                        process) per ``step`` and device
``heteroflow_step_failures_total`` (counter)            failed attempts per ``step``, device and
                                                        ``failure_class`` (``device``, ``transient``,
                                                        ``permanent``; :mod:`heteroflow.components.core.failures`)
``heteroflow_fallbacks_total`` (counter)                candidates left per ``step``: ``from_device_kind``,
                                                        ``from_accelerator``, ``to_device_kind``,
                                                        ``to_accelerator``, ``failure_class`` (inside a loop:
                                                        the candidate that iteration went on to; the
                                                        iterations' fallbacks add up)
``heteroflow_retry_wait_seconds_total`` (counter)       seconds spent waiting before retries (backoff), per
                                                        ``step``
``heteroflow_step_queue_wait_seconds`` (gauge)          per ``step``: from the end of the calls before it to
                                                        the start of its first attempt (engine start-up; on a
                                                        cluster, the pod's time pending in its queue); only
                                                        where both times are recorded
``heteroflow_device_seconds_total`` (counter)           attempt seconds x devices (the placed candidate's
                                                        device count, else 1) per ``step`` and device
``heteroflow_device_cost_total`` (counter)              device-hours x the price per device-hour of the
                                                        cluster profile's ``prices`` (the accelerator model's
                                                        price, else its kind's); label ``currency``; only
                                                        where a price is known
``heteroflow_step_metric`` (gauge)                      the scalar metrics of the run's Metrics outputs
                                                        (accuracy, final loss...): labels ``step``, ``metric``
======================================================  ====================================================
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.core.telemetry import iteration_key
from heteroflow.pipelines.runs.folders import find_runs, load_run, retries

__all__ = [
    "METRICS_DIR_ENV",
    "METRICS_FILE",
    "PROFILE_ENV",
    "RunCollector",
    "prices_from_profile",
    "registry_for",
    "serve",
    "write_textfile",
    "write_textfile_quietly",
]

METRICS_FILE = "metrics.prom"
METRICS_DIR_ENV = "HETEROFLOW_METRICS_DIR"
"""A node_exporter textfile-collector folder: every run also writes ``heteroflow-<run id>.prom`` there."""
PROFILE_ENV = "HETEROFLOW_CLUSTER_PROFILE"
"""A cluster profile YAML whose ``prices`` cost the runs' device time (unset: no cost metric)."""

Prices = tuple[Mapping[str, float], str]


def prices_from_profile(profile: Any = None) -> Prices:
    """``(prices per device-hour, currency)`` from a :class:`~heteroflow.components.devices.cluster.ClusterProfile`, a
    profile YAML path, or (None) ``$HETEROFLOW_CLUSTER_PROFILE`` when set; ``({}, "USD")`` without one.

    Raises:
        InvalidProfile: the profile cannot be read or holds an invalid price.
    """
    from heteroflow.components.devices.cluster import ClusterProfile, load_profile

    if profile is None:
        profile = os.environ.get(PROFILE_ENV) or None
    if profile is None:
        return {}, "USD"
    if not isinstance(profile, ClusterProfile):
        profile = load_profile(profile)
    return dict(profile.prices), profile.currency


def _host_kind_name() -> str:
    from heteroflow.components.devices import host_kind

    return host_kind().value


def _device_labels(rec: Mapping[str, Any]) -> tuple[str, str, str]:
    kind = str(rec.get("kind") or rec.get("device") or _host_kind_name())
    return kind, str(rec.get("accelerator") or ""), "true" if rec.get("simulated") else "false"


def _device_count(run: Mapping[str, Any], step: str, rec: Mapping[str, Any]) -> int:
    placed = (run.get("placement") or {}).get(step) or {}
    if isinstance(placed, dict) and placed.get("index") == rec.get("candidate"):
        count = (placed.get("resources") or {}).get("count")
        if isinstance(count, int) and count > 0:
            return count
    return 1


class RunCollector:
    """A prometheus-client collector of the metrics above for the runs ``runs()`` returns (called at each
    collection, so a server always reports the runs on disk)."""

    def __init__(self, runs: Callable[[], Iterable[Mapping[str, Any]]], prices: Prices = ({}, "USD")) -> None:
        self._runs = runs
        self._prices = prices

    def describe(self) -> list[Any]:
        return []  # not known before the runs are read; keeps registration from calling collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        base = ["run_id", "pipeline"]
        dev = ["device_kind", "accelerator", "simulated"]
        info = GaugeMetricFamily("heteroflow_run_info", "One series per run; value 1.", labels=base + ["status"])
        duration = GaugeMetricFamily("heteroflow_run_duration_seconds", "Wall time of the run, seconds.", labels=base + ["status"])
        attempts = CounterMetricFamily("heteroflow_step_attempts", "Attempts of a step by device and outcome.", labels=base + ["step", *dev, "outcome"])
        seconds = CounterMetricFamily("heteroflow_step_seconds", "Seconds of a step's attempts (inside the step process) by device.", labels=base + ["step", *dev])
        failures = CounterMetricFamily("heteroflow_step_failures", "Failed attempts by device and failure class.", labels=base + ["step", *dev, "failure_class"])
        fallbacks = CounterMetricFamily(
            "heteroflow_fallbacks",
            "Candidates a step left for the next one.",
            labels=base + ["step", "from_device_kind", "from_accelerator", "to_device_kind", "to_accelerator", "failure_class"],
        )
        waits = CounterMetricFamily("heteroflow_retry_wait_seconds", "Seconds waited before retries (backoff).", labels=base + ["step"])
        queue = GaugeMetricFamily("heteroflow_step_queue_wait_seconds", "From the end of the calls before a step to its first attempt, seconds.", labels=base + ["step"])
        device_seconds = CounterMetricFamily("heteroflow_device_seconds", "Attempt seconds times devices, by device.", labels=base + ["step", *dev])
        cost = CounterMetricFamily("heteroflow_device_cost", "Device-hours times the cluster profile's price per device-hour.", labels=base + ["step", *dev, "currency"])
        metric = GaugeMetricFamily("heteroflow_step_metric", "Scalar metrics of a run's Metrics outputs.", labels=base + ["step", "metric"])
        prices, currency = self._prices
        for run in self._runs():
            ids = [str(run.get("run_id", "")), str(run.get("pipeline", ""))]
            status = str(run.get("status", ""))
            info.add_metric(ids + [status], 1.0)
            if isinstance(run.get("wall_seconds"), (int, float)):
                duration.add_metric(ids + [status], float(run["wall_seconds"]))
            order = [s.get("name") for s in run.get("steps") or []]
            recs_by_step = run.get("attempts") or {}
            last_end: float | None = float(run["started_at"]) if isinstance(run.get("started_at"), (int, float)) and run["started_at"] > 0 else None
            for step in order + sorted(set(recs_by_step) - set(order)):
                recs = recs_by_step.get(step) or []
                counts: dict[tuple[str, ...], list[float]] = {}
                failed: dict[tuple[str, ...], int] = {}
                for rec in recs:
                    d = _device_labels(rec)
                    outcome = str(rec.get("status") or "unknown")
                    secs = float(rec.get("seconds") or 0.0)
                    key = (step, *d, outcome)
                    counts.setdefault(key, [0, 0.0, 0.0])
                    counts[key][0] += 1
                    counts[key][1] += secs
                    counts[key][2] += secs * _device_count(run, step, rec)
                    if outcome == "failed":
                        fkey = (step, *d, str(rec.get("failure") or "unknown"))
                        failed[fkey] = failed.get(fkey, 0) + 1
                for fkey, n in failed.items():
                    failures.add_metric(ids + list(fkey), n)
                by_device: dict[tuple[str, ...], list[float]] = {}
                for (s, *d, outcome), (n, secs, dsecs) in counts.items():
                    attempts.add_metric(ids + [s, *d, outcome], n)
                    acc = by_device.setdefault((s, *d), [0.0, 0.0])
                    acc[0] += secs
                    acc[1] += dsecs
                for (s, kind, accel, sim), (secs, dsecs) in by_device.items():
                    seconds.add_metric(ids + [s, kind, accel, sim], secs)
                    device_seconds.add_metric(ids + [s, kind, accel, sim], dsecs)
                    price = prices.get(accel) if accel and accel in prices else prices.get(kind)
                    if price is not None:
                        cost.add_metric(ids + [s, kind, accel, sim, currency], dsecs / 3600.0 * price)
                starts = [r["started_at"] for r in recs if isinstance(r.get("started_at"), (int, float))]
                if starts and last_end is not None:
                    queue.add_metric(ids + [step], max(min(starts) - last_end, 0.0))
                ends = [r["ended_at"] for r in recs if isinstance(r.get("ended_at"), (int, float))]
                if ends:
                    last_end = max(ends + ([last_end] if last_end is not None else []))
            left: dict[tuple[str, ...], int] = {}
            for f in run.get("fallbacks") or []:
                step = str(f.get("step"))
                recs = recs_by_step.get(step) or []
                # the candidate this fallback went to: the next one in the same loop iteration, never another
                # iteration's (a fallback without ``iteration``: outside a loop, or a record from before they had one)
                key_of = (*(f.get("outer_iterations") or []), f["iteration"]) if isinstance(f.get("iteration"), int) else None
                mine = [r for r in recs if key_of is None or iteration_key(r) == key_of]
                to = next((r for r in mine if (r.get("candidate") or 0) > (f.get("candidate") or 0)), {})
                key = (step, str(f.get("kind") or ""), str(f.get("accelerator") or ""), str(to.get("kind") or ""), str(to.get("accelerator") or ""), str(f.get("failure") or ""))
                left[key] = left.get(key, 0) + 1
            for key, n in left.items():
                fallbacks.add_metric(ids + list(key), n)
            wait_by_step: dict[str, float] = {}
            for r in retries(run):
                wait_by_step[r["step"]] = wait_by_step.get(r["step"], 0.0) + (r["wait_seconds"] or 0.0)
            for step, total in wait_by_step.items():
                waits.add_metric(ids + [step], total)
            for step, values in (run.get("metrics") or {}).items():
                if isinstance(values, dict):
                    for name, value in values.items():
                        if isinstance(value, (int, float)) and not isinstance(value, bool) and not name.startswith(("precision_", "recall_")):
                            metric.add_metric(ids + [str(step), str(name)], float(value))
        yield from (info, duration, attempts, seconds, failures, fallbacks, waits, queue, device_seconds, cost, metric)


def registry_for(runs: Callable[[], Iterable[Mapping[str, Any]]], prices: Prices = ({}, "USD")) -> Any:
    """A fresh ``CollectorRegistry`` holding one :class:`RunCollector`."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(runs, prices))
    return registry


def write_textfile(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *, profile: Any = None) -> list[Path]:
    """Write the run's metrics as a textfile-collector file: ``output`` (default ``<run_dir>/metrics.prom``) and,
    when ``$HETEROFLOW_METRICS_DIR`` is set, ``<that folder>/heteroflow-<run id>.prom``. prometheus-client writes
    each through a temporary file and a rename, so a collector never reads half a file.

    Returns:
        The files written.

    Raises:
        InvalidParameter: no readable ``run.json`` in ``run_dir``. InvalidProfile: a bad profile.
    """
    from prometheus_client import write_to_textfile

    run = load_run(run_dir)
    registry = registry_for(lambda: [run], prices_from_profile(profile))
    targets = [Path(output) if output is not None else Path(run["run_dir"]) / METRICS_FILE]
    folder = os.environ.get(METRICS_DIR_ENV)
    if folder and output is None:
        targets.append(Path(folder) / f"heteroflow-{_file_safe(str(run.get('run_id', 'run')))}.prom")
    for target in targets:
        if target.is_dir():  # prometheus-client's error named its temporary file ('adir.9099.1401...: Is a directory')
            import errno

            raise IsADirectoryError(errno.EISDIR, "a folder is there; give a file path", str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(target), registry)
    return targets


def _file_safe(run_id: str) -> str:
    """``run_id`` as a file name part; when characters had to be replaced, a hash of the id is added, so two ids
    that differ only there (``a b`` and ``a_b``) never share a file."""
    import hashlib

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id).lstrip(".") or "run"
    return safe if safe == run_id else f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def write_textfile_quietly(run_dir: str | os.PathLike[str]) -> list[Path]:
    """:func:`write_textfile` at the end of a run: a problem is a warning, never a failed run."""
    import warnings

    try:
        return write_textfile(run_dir)
    except Exception as exc:  # the run is recorded; metrics must not change its outcome
        warnings.warn(f"could not write {METRICS_FILE} for {run_dir}: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return []


def serve(roots: Iterable[str | os.PathLike[str]] | None = None, *, port: int = 9464, host: str = "127.0.0.1", profile: Any = None) -> tuple[Any, Any]:
    """Serve ``/metrics`` for every run under ``roots`` (default: the run roots of
    :func:`heteroflow.pipelines.runs.folders.default_roots`), read at each scrape, on ``host:port`` (port 0: any free
    port; ``server.server_port`` tells which). Returns ``(server, thread)``; ``server.shutdown()`` stops it.

    Raises:
        OSError: the address is in use or cannot be bound. InvalidProfile: a bad profile.
    """
    from prometheus_client import start_http_server

    root_list = None if roots is None else list(roots)
    registry = registry_for(lambda: find_runs(root_list), prices_from_profile(profile))
    return start_http_server(port, addr=host, registry=registry)
