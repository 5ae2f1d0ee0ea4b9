"""The Alluxio cache backends.

No Alluxio can run on the development machines, so each backend's request flow is exercised against a
*protocol-level test server* (a last resort, named as such): a small HTTP server on 127.0.0.1 that speaks the
real REST paths the real clients call (alluxio-py 0.1.x against the Alluxio 2.x proxy's ``/api/v1/paths/...``
and ``/api/v1/streams/...``; alluxiofs against the Alluxio 3.x worker's ``/v1/node``, ``/v1/files``,
``/v1/info``, ``/v1/load`` and ``/v1/chunk/...``), serving files from a local folder. The integration tests at the
end run against a real Alluxio when ``HETEROFLOW_ALLUXIO2_PROXY`` / ``HETEROFLOW_ALLUXIO3_WORKERS`` are set.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.cache.backends import Alluxio2Backend, LocalDirectoryBackend, backend_for
from heteroflow.cache.dataset import open_dataset
from heteroflow.cache.errors import DatasetError, InvalidCacheOption
from heteroflow.cache.prewarm import prewarm_dataset
from heteroflow.cache.status import cache_status


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class _Base(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _bytes(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# --- protocol-level test server: the Alluxio 2.x REST proxy ------------------------------------------------


class Alluxio2ProxyTestServer(_Base):
    """Protocol-level test server for the Alluxio 2.x proxy REST API (paths and JSON as alluxio-py 0.1.x sends
    and parses them). The Alluxio namespace is the folder ``root``; reading a file with read type CACHE marks it
    100% in memory, as a worker would after caching it."""

    root: Path
    calls: list[str]
    read_types: dict[str, str]
    in_memory: set[str]
    open_files: dict[int, str]

    def _status(self, alluxio_path: str) -> dict[str, object] | None:
        local = self.root / alluxio_path.strip("/")
        if not local.exists():
            return None
        st = local.stat()
        return {
            "blockIds": [], "blockSizeBytes": 64 << 20, "cacheable": True, "completed": True,
            "creationTimeMs": 0, "lastModificationTimeMs": st.st_mtime_ns // 1_000_000, "fileBlockInfos": [],
            "fileId": st.st_ino, "folder": local.is_dir(), "owner": "alluxio", "group": "alluxio",
            "inMemoryPercentage": 100 if alluxio_path in self.in_memory else 0,
            "length": 0 if local.is_dir() else st.st_size, "name": local.name, "path": "/" + alluxio_path.strip("/"),
            "ufsPath": f"file://{local}", "pinned": False, "persisted": True, "persistenceState": "PERSISTED",
            "mode": 0o755, "mountPoint": False, "ttl": -1, "ttlAction": "DELETE",
        }

    def _not_found(self, path: str) -> None:
        self._json(404, {"statusCode": "NOT_FOUND", "message": f"Path {path} does not exist"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.split("/")
        self.calls.append(url.path)
        if url.path.startswith("/api/v1/paths/"):
            path, action = "/" + "/".join(parts[4:-1]).strip("/"), parts[-1]
            status = self._status(path)
            if status is None:
                return self._not_found(path)
            if action == "get-status":
                return self._json(200, status)
            if action == "list-status":
                local = self.root / path.strip("/")
                children = sorted(local.iterdir()) if local.is_dir() else [local]
                prefix = path.rstrip("/")
                return self._json(200, [self._status(f"{prefix}/{c.name}" if local.is_dir() else path) for c in children])
            if action == "open-file":
                file_id = len(self.open_files) + 1
                self.open_files[file_id] = path
                self.read_types[path] = body.get("readType", "")
                return self._json(200, file_id)
            return self._json(400, {"statusCode": "INVALID_ARGUMENT", "message": f"unknown action {action}"})
        if url.path.startswith("/api/v1/streams/"):
            file_id, action = int(parts[4]), parts[5]
            path = self.open_files[file_id]
            if action == "read":
                data = (self.root / path.strip("/")).read_bytes()
                if self.read_types.get(path) in ("CACHE", "CACHE_PROMOTE"):
                    self.in_memory.add(path)
                return self._bytes(data)
            if action == "close":
                return self._json(200, None)
        return self._json(404, {"statusCode": "NOT_FOUND", "message": self.path})


@pytest.fixture
def alluxio2(tmp_path: Path, digits_dir: Path) -> Iterator[tuple[type[Alluxio2ProxyTestServer], int]]:
    ns = tmp_path / "alluxio-namespace"
    shutil.copytree(digits_dir, ns / "datasets" / "digits")
    (ns / "datasets" / "digits" / ".ipynb_checkpoints").mkdir()
    (ns / "datasets" / "digits" / ".ipynb_checkpoints" / "x-checkpoint.csv").write_text("junk")
    handler = type("Handler", (Alluxio2ProxyTestServer,), {
        "root": ns, "calls": [], "read_types": {}, "in_memory": set(), "open_files": {}})
    server, port = _serve(handler)
    try:
        yield handler, port
    finally:
        server.shutdown()
        server.server_close()


def test_alluxio2_prewarm_reads_through_with_cache_read_type(alluxio2, digits_dir: Path, tmp_path: Path):
    handler, port = alluxio2
    cache = f"alluxio2://127.0.0.1:{port}?mount={handler.root}"
    result = prewarm_dataset("alluxio:///datasets/digits", str(tmp_path / "out"), cache_root=cache)
    names = sorted(p.name for p in digits_dir.iterdir())
    assert [e.path for e in result.manifest.files] == names  # the one listing: the hidden folder is not taken
    assert result.manifest.backend == "alluxio2"
    assert result.manifest.location == f"alluxio2://127.0.0.1:{port}/datasets/digits"
    assert set(handler.read_types.values()) == {"CACHE"}  # every file was read with the caching read type
    assert handler.in_memory == {f"/datasets/digits/{n}" for n in names}
    assert any(c.endswith("/list-status") for c in handler.calls) and any(c.endswith("/close") for c in handler.calls)
    # the same bytes: the same data set identity as a local prewarm
    local = prewarm_dataset(str(digits_dir), str(tmp_path / "local"), cache_root=str(tmp_path / "tier"))
    assert result.manifest.dataset_sha256 == local.manifest.dataset_sha256
    # with mount=, readers open the files as local paths, and check them
    view = open_dataset(tmp_path / "out", verify="sha256")
    assert view.version == result.version and len(view.data_files) == 4
    # a rerun reads nothing: unchanged and 100% in memory
    opened = len(handler.open_files)
    again = prewarm_dataset("/datasets/digits", str(tmp_path / "out2"), cache_root=cache)
    assert (again.files_copied, again.files_skipped) == (0, len(names))
    assert len(handler.open_files) == opened
    [status] = [s for s in cache_status() if s.backend == "alluxio2"]
    assert status.versions[0].version == result.version


def test_alluxio2_errors(alluxio2, tmp_path: Path):
    _, port = alluxio2
    cache = f"alluxio2://127.0.0.1:{port}"
    with pytest.raises(DatasetError, match=r"does not exist at the source"):
        prewarm_dataset("/datasets/none", str(tmp_path / "o"), cache_root=cache)
    with pytest.raises(DatasetError, match=r"give the data set as its path in Alluxio's namespace"):
        prewarm_dataset("s3://bucket/d", str(tmp_path / "o"), cache_root=cache)
    view_err = pytest.raises(DatasetError, match=r"cached in alluxio2 .* without a local folder.*mount")
    prewarm_dataset("/datasets/digits", str(tmp_path / "o"), cache_root=cache)
    with view_err:
        open_dataset(tmp_path / "o")


# --- protocol-level test server: the Alluxio 3.x worker REST API -------------------------------------------


class Alluxio3WorkerTestServer(_Base):
    """Protocol-level test server for an Alluxio 3.x worker's REST API (paths and JSON as alluxiofs sends and
    parses them). Under-storage URLs ``file:///...`` name local files; a submitted load job reports RUNNING on its
    first progress poll, then loads every file under its path (100% in Alluxio) and reports SUCCEEDED."""

    port: int
    calls: list[str]
    loaded: set[str]
    jobs: dict[str, int]

    def _local(self, ufs: str) -> Path:
        return Path(urllib.parse.urlsplit(ufs).path)

    def _status(self, ufs: str) -> dict[str, object]:
        local = self._local(ufs)
        st = local.stat()
        return {
            "mType": "directory" if local.is_dir() else "file", "mPath": local.name, "mUfsPath": ufs,
            "mLength": 0 if local.is_dir() else st.st_size, "mLastModificationTimeMs": st.st_mtime_ns // 1_000_000,
            "mInAlluxioPercentage": 100 if ufs in self.loaded else 0, "mContentHash": "", "mCompleted": True,
        }

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        self.calls.append(f"{url.path}?{query.get('opType', '')}")
        if url.path == "/v1/node":
            return self._json(200, {"Host": "127.0.0.1", "HttpServerPort": self.port})
        if url.path in ("/v1/files", "/v1/info"):
            ufs = query["path"]
            local = self._local(ufs)
            if not local.exists():
                return self._json(500, {"error": f"{ufs} does not exist"})
            if url.path == "/v1/info":
                return self._json(200, [self._status(ufs)])
            return self._json(200, [self._status(f"{ufs.rstrip('/')}/{c.name}") for c in sorted(local.iterdir())])
        if url.path == "/v1/load":
            ufs, op = query["path"], query["opType"]
            if op == "submit":
                self.jobs[ufs] = 0
                return self._json(200, {"success": True})
            if op == "progress":
                self.jobs[ufs] += 1
                if self.jobs[ufs] < 2:
                    return self._json(200, {"jobState": "RUNNING"})
                root = self._local(ufs)
                for p in root.rglob("*"):
                    if p.is_file():
                        self.loaded.add(f"{ufs.rstrip('/')}/{p.relative_to(root).as_posix()}")
                return self._json(200, {"jobState": "SUCCEEDED"})
            return self._json(200, {"success": True})
        if url.path.startswith("/v1/chunk/"):
            return self._bytes(self._local(query["ufsFullPath"]).read_bytes())
        return self._json(404, {"error": self.path})


@pytest.fixture
def alluxio3(tmp_path: Path, digits_dir: Path) -> Iterator[tuple[type[Alluxio3WorkerTestServer], int, str]]:
    ufs = tmp_path / "ufs" / "digits"
    shutil.copytree(digits_dir, ufs)
    handler = type("Handler", (Alluxio3WorkerTestServer,), {"port": 0, "calls": [], "loaded": set(), "jobs": {}})
    server, port = _serve(handler)
    handler.port = port
    try:
        yield handler, port, f"file://{ufs}"
    finally:
        server.shutdown()
        server.server_close()


def test_alluxio3_prewarm_submits_a_load_polls_and_verifies(alluxio3, digits_dir: Path, tmp_path: Path):
    handler, port, source = alluxio3
    cache = f"alluxio3://127.0.0.1:{port}?poll_s=0.05&mount={Path(source[len('file://'):])}"
    result = prewarm_dataset(source, str(tmp_path / "out"), cache_root=cache)
    names = sorted(p.name for p in digits_dir.iterdir())
    assert [e.path for e in result.manifest.files] == names
    assert result.manifest.backend == "alluxio3"
    assert "/v1/load?submit" in handler.calls
    assert handler.calls.count("/v1/load?progress") == 2  # polled until SUCCEEDED
    assert sum(c.startswith("/v1/chunk/") for c in handler.calls) == len(names)  # each file hashed through a worker
    local = prewarm_dataset(str(digits_dir), str(tmp_path / "local"), cache_root=str(tmp_path / "tier"))
    assert result.manifest.dataset_sha256 == local.manifest.dataset_sha256
    assert open_dataset(tmp_path / "out", verify="sha256").version == result.version
    # a rerun: unchanged and fully cached, so no load job and no read
    handler.calls.clear()
    again = prewarm_dataset(source, str(tmp_path / "out2"), cache_root=cache)
    assert (again.files_copied, again.files_skipped) == (0, len(names))
    assert not any(c.startswith(("/v1/load", "/v1/chunk")) for c in handler.calls)


def test_alluxio3_missing_source(alluxio3, tmp_path: Path):
    _, port, source = alluxio3
    with pytest.raises(DatasetError, match=r"does not exist"):
        prewarm_dataset(source + "-missing", str(tmp_path / "o"), cache_root=f"alluxio3://127.0.0.1:{port}")
    with pytest.raises(DatasetError, match=r"give the data set as its under-storage URL"):
        prewarm_dataset("/relative/path", str(tmp_path / "o"), cache_root=f"alluxio3://127.0.0.1:{port}")


def test_backend_for():
    assert backend_for("") == LocalDirectoryBackend("")
    assert backend_for("/mnt/cache") == LocalDirectoryBackend("/mnt/cache")
    assert backend_for("alluxio2://proxy") == Alluxio2Backend(host="proxy", port=39999)
    assert backend_for("alluxio2://proxy:1234?mount=/mnt/a") == Alluxio2Backend(host="proxy", port=1234, mount="/mnt/a")
    assert backend_for("alluxio3://w1,w2:9999").workers == "w1:28080,w2:9999"  # type: ignore[attr-defined]
    with pytest.raises(InvalidCacheOption, match=r"unknown cache scheme gs://; valid: empty"):
        backend_for("gs://bucket/cache")
    with pytest.raises(InvalidCacheOption, match=r"unknown option\(s\) mnt; valid: mount"):
        backend_for("alluxio2://proxy?mnt=/x")
    with pytest.raises(InvalidCacheOption, match=r"'proxy:http' is not HOST\[:PORT\]"):
        backend_for("alluxio2://proxy:http")


# --- integration tests against a real Alluxio --------------------------------------------------------------


def _env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        pytest.skip(reason=f"environment variable {name} is not set: no real Alluxio endpoint to test against")
    return value


def test_real_alluxio2_proxy(tmp_path: Path):
    """HETEROFLOW_ALLUXIO2_PROXY=HOST:PORT of an Alluxio 2.x proxy; HETEROFLOW_ALLUXIO2_DATASET=/path in its
    namespace holding .csv/.npz files; optional HETEROFLOW_ALLUXIO2_MOUNT=local FUSE mount of the namespace."""
    proxy = _env("HETEROFLOW_ALLUXIO2_PROXY")
    dataset = _env("HETEROFLOW_ALLUXIO2_DATASET")
    mount = os.environ.get("HETEROFLOW_ALLUXIO2_MOUNT", "")
    cache = f"alluxio2://{proxy}" + (f"?mount={mount}" if mount else "")
    result = prewarm_dataset(dataset, str(tmp_path / "out"), cache_root=cache)
    assert result.manifest.files and result.manifest.backend == "alluxio2"
    again = prewarm_dataset(dataset, str(tmp_path / "out2"), cache_root=cache)
    assert again.files_copied == 0 and again.manifest.dataset_sha256 == result.manifest.dataset_sha256
    if mount:
        open_dataset(tmp_path / "out", verify="sha256")


def test_real_alluxio3_workers(tmp_path: Path):
    """HETEROFLOW_ALLUXIO3_WORKERS=HOST:PORT[,HOST:PORT] of Alluxio 3.x workers; HETEROFLOW_ALLUXIO3_DATASET=the
    under-storage URL of a folder of .csv/.npz files; optional HETEROFLOW_ALLUXIO3_MOUNT=its local FUSE mount."""
    workers = _env("HETEROFLOW_ALLUXIO3_WORKERS")
    dataset = _env("HETEROFLOW_ALLUXIO3_DATASET")
    mount = os.environ.get("HETEROFLOW_ALLUXIO3_MOUNT", "")
    cache = f"alluxio3://{workers}" + (f"?mount={mount}" if mount else "")
    result = prewarm_dataset(dataset, str(tmp_path / "out"), cache_root=cache)
    assert result.manifest.files and result.manifest.backend == "alluxio3"
    again = prewarm_dataset(dataset, str(tmp_path / "out2"), cache_root=cache)
    assert again.files_copied == 0 and again.manifest.dataset_sha256 == result.manifest.dataset_sha256
    if mount:
        open_dataset(tmp_path / "out", verify="sha256")
