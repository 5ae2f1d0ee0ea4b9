"""Test servers for remote data sets, used by heteroflow's own tests (not shipped: ``from servers import ...``
works because pyproject.toml's pytest settings put ``tests/`` on ``sys.path``).

- :func:`serve_folder`: a folder served over HTTP on 127.0.0.1 by Python's ``http.server`` in a thread,
  optionally behind HTTP Basic auth (403 on a wrong password, 401 on none) or a signed-URL query check.
- :func:`s3_test_server`: moto's server mode, a local S3-compatible *test server* on 127.0.0.1, with
  credentials passed the way a cluster would pass them (environment variables), and a folder uploaded.
- :func:`files_containing`: every file under some folders whose bytes contain a string (a secret scan).

Nothing here reaches beyond the loopback interface.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

__all__ = ["files_containing", "s3_test_server", "serve_folder"]


class _Handler(http.server.SimpleHTTPRequestHandler):
    auth: tuple[str, str] | None = None
    required_query: Mapping[str, str] | None = None
    log: list[str] | None = None
    refuse_head = False

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass

    def _authorized(self) -> bool:
        if self.required_query is not None:
            import urllib.parse

            given = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query, keep_blank_values=True))
            if any(given.get(k) != v for k, v in self.required_query.items()):
                self.send_error(403, "signature does not match")
                return False
        if self.auth is None:
            return True
        header = self.headers.get("Authorization", "")
        expected = "Basic " + base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        if header == expected:
            return True
        self.send_error(403 if header else 401, "wrong credentials" if header else "credentials needed")
        return False

    def _log(self) -> None:
        if self.log is not None:
            self.log.append(f"{self.command} {self.path}")

    def do_GET(self) -> None:
        self._log()
        if self._authorized():
            super().do_GET()

    def do_HEAD(self) -> None:
        self._log()
        if self.refuse_head:  # as S3 answers HEAD on a URL presigned for GET: the method is part of the signature
            self.send_error(403, "SignatureDoesNotMatch")
        elif self._authorized():
            super().do_HEAD()


@contextlib.contextmanager
def serve_folder(folder: str | os.PathLike[str], *, auth: tuple[str, str] | None = None,
                 required_query: Mapping[str, str] | None = None, log: list[str] | None = None,
                 refuse_head: bool = False) -> Iterator[str]:
    """Serve ``folder`` on ``http://127.0.0.1:<free port>`` (directory listings as ``python3 -m http.server``).

    Args:
        folder: the folder to serve (its subfolders are data sets: ``<base>/digits/``).
        auth: (user, password) to require with HTTP Basic auth.
        required_query: query parameters every request must carry with exactly these values, else 403 (a
            signed URL's check, e.g. an Azure SAS ``{"sv": "1", "sig": "..."}``).
        log: a list that receives ``"METHOD /path?query"`` of every request.
        refuse_head: answer every HEAD request 403, as S3 does for a URL presigned for GET.

    Yields:
        The base URL, without a trailing slash.
    """
    handler = type("FolderHandler", (_Handler,), {"auth": auth, "required_query": required_query, "log": log,
                                             "refuse_head": refuse_head})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, name="heteroflow-test-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def s3_test_server(uploads: Mapping[str, str | os.PathLike[str]] | None = None, *,
                   access_key: str = "heteroflow-test-key", secret_key: str = "heteroflow-test-secret") -> Iterator[str]:
    """Run moto's server mode (a local S3-compatible test server) on 127.0.0.1 and point the AWS SDKs at it
    through the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_DEFAULT_REGION``), restored afterwards.

    Args:
        uploads: ``{"s3://bucket/prefix": local folder}``: buckets to create and folders to upload first.
        access_key: the access key id put in the environment.
        secret_key: the secret key put in the environment (a string to scan run folders for).

    Yields:
        The endpoint URL (``http://127.0.0.1:PORT``); child processes inherit the environment.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key,
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _clear_s3fs_cache()
    try:
        if uploads:
            s3 = boto3.client("s3", endpoint_url=endpoint)
            made: set[str] = set()
            for url, folder in uploads.items():
                bucket, _, prefix = url.removeprefix("s3://").partition("/")
                if bucket not in made:
                    s3.create_bucket(Bucket=bucket)
                    made.add(bucket)
                root = Path(folder)
                for p in sorted(root.rglob("*")):
                    if p.is_file():
                        key = "/".join(x for x in (prefix.strip("/"), p.relative_to(root).as_posix()) if x)
                        s3.put_object(Bucket=bucket, Key=key, Body=p.read_bytes())
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _clear_s3fs_cache()
        server.stop()


def _clear_s3fs_cache() -> None:
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


def files_containing(roots: Iterable[str | os.PathLike[str]], needle: str) -> list[Path]:
    """Every regular file under ``roots`` whose bytes contain ``needle`` (UTF-8), sorted."""
    data = needle.encode()
    hits = []
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            try:
                if p.is_file() and not p.is_symlink() and data in p.read_bytes():
                    hits.append(p)
            except OSError:
                continue
    return hits
