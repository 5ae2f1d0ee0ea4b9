"""Sources and the cache tier (issue #16, items 9-13): each input of the issue, and a sibling of the same kind.

9. a URL's query (a signature) travels with every request and never into a path, a name or a file;
10. credentials in the JSON form fsspec's environment variables hold work, and a malformed option is a
    configuration error, never "does not exist";
11. a long-lived process lists the source fresh for every prewarm; an object replaced mid-copy is copied again;
12. files that change at the source while the data set is copied are copied again (or the prewarm fails clearly);
13. one data set identity for every cache key; cached and temporary folders get the umask's modes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import heteroflow.cache.copying as copying  # _copy_file: what copying._copy_all calls
import heteroflow.cache.prewarm as pm
from heteroflow.cache.atomic import atomic_directory, atomic_write_bytes, make_temp_dir
from heteroflow.cache.dataset import open_dataset
from heteroflow.cache.errors import (
    CacheIntegrityError,
    DatasetError,
    SourceChanged,
    SourceConfigError,
    SourceUnavailable,
)
from heteroflow.cache.prewarm import MANIFEST_NAME, cache_key, dataset_cache_dir, prewarm, prewarm_dataset
from heteroflow.cache.redact import warn_if_credentials
from heteroflow.cache.sources import classify, dataset_identity, split_query
from servers import files_containing, s3_test_server, serve_folder

SIG = "SECRETsig%2Bq%3D"  # an Azure SAS signature is base64, percent-encoded in the URL
IRIS = b"sepal_length,sepal_width,petal_length,petal_width,class\n5.1,3.5,1.4,0.2,setosa\n7.0,3.2,4.7,1.4,versicolor\n"


@pytest.fixture
def www(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    (root / "data").mkdir(parents=True)
    (root / "data" / "iris.csv").write_bytes(IRIS)
    (root / "data" / "sub").mkdir()
    (root / "data" / "sub" / "more.csv").write_bytes(IRIS[:80] + b"\n")
    return root


def _cached(result) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return {p.relative_to(result.manifest.root).as_posix(): p.read_bytes() for p in result.manifest.local_paths()}


def _source(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- 9. a query string is the request's, not the path's --------------------------------------------------------


@pytest.mark.filterwarnings("ignore:the data set URL")
def test_a_folder_url_with_a_sas_query_reads_each_file_with_it(www: Path, tmp_path: Path):
    """The input: `http://127.0.0.1:PORT/data/?sv=1&sig=SECRET` fetched `/data/?<query>/iris.csv`, cached the HTML
    listing as iris.csv and wrote the signature to disk. The server here checks the signature on every request."""
    log: list[str] = []
    with serve_folder(www, required_query={"sv": "1", "sig": "SECRETsig+q="}, log=log) as base:
        url = f"{base}/data/?sv=1&sig={SIG}"
        result = prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert _cached(result) == _source(www / "data")  # the files, not a listing page
    gets = [line for line in log if line.startswith("GET /data/iris.csv") or line.startswith("GET /data/sub/more.csv")]
    assert gets and all(line.endswith(f"?sv=1&sig={SIG}") for line in gets)  # the query carried to each file URL
    assert not any("?" in p.name for p in (tmp_path / "tier").rglob("*"))
    assert files_containing([tmp_path / "tier", tmp_path / "out"], "SECRETsig") == []
    assert "SECRETsig" not in json.dumps(result.facts()) and "SECRETsig" not in str(result.dataset_dir)
    assert result.manifest.source_uri == f"{base}/data/?sv=1&sig=***"
    view = open_dataset(tmp_path / "out", verify="sha256")
    assert view.version == result.version
    # sibling: messages about a cached file name the source's file, not `<folder>/?sv=1&sig=***/iris.csv`
    assert view.in_source_terms(f"{view.root}/iris.csv: line 3: bad") == f"{base}/data/iris.csv: line 3: bad"


@pytest.mark.filterwarnings("ignore:the data set URL")
def test_a_signed_single_file_url_is_that_file(www: Path, tmp_path: Path):
    """The input: `.../iris.csv?X-Amz-Signature=...` was refused ("has no .csv ... file (found: iris.csv?X-Amz-...")."""
    query = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Date": "20261201T000000Z", "X-Amz-Signature": "abcdef0123456789"}
    checked = dict(query)  # what the server accepts; changed below, as a new signature replaces the old
    with serve_folder(www, required_query=checked) as base:
        url = f"{base}/data/iris.csv?" + "&".join(f"{k}={v}" for k, v in query.items())
        result = prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
        # sibling: the same object signed again later (new date, new signature) is the same data set, reused
        checked.update({"X-Amz-Date": "20261202T000000Z", "X-Amz-Signature": "99999999abcdef00"})
        again_url = f"{base}/data/iris.csv?" + "&".join(f"{k}={v}" for k, v in checked.items())
        again = prewarm_dataset(again_url, str(tmp_path / "out2"), cache_root=str(tmp_path / "tier"))
    assert again.dataset_dir == result.dataset_dir and again.version == result.version
    view = open_dataset(tmp_path / "out")
    assert view.in_source_terms(f"{view.root}/iris.csv: bad") == f"{base}/data/iris.csv: bad"  # not .../iris.csv/iris.csv
    assert _cached(result) == {"iris.csv": IRIS}
    assert files_containing([tmp_path / "tier", tmp_path / "out"], "abcdef0123456789") == []


@pytest.mark.filterwarnings("ignore:the data set URL")
def test_a_url_presigned_for_get_works_where_head_is_refused(www: Path, tmp_path: Path):
    """Sibling: S3 answers HEAD on a URL presigned for GET with 403 (the method is signed); sizes come from GET."""
    query = {"X-Amz-Signature": "feedface00112233"}
    log: list[str] = []
    with serve_folder(www, required_query=query, refuse_head=True, log=log) as base:
        result = prewarm(f"{base}/data/iris.csv?X-Amz-Signature=feedface00112233", tmp_path / "cache")
    assert _cached(result) == {"iris.csv": IRIS}
    assert any(line.startswith("HEAD ") for line in log) and any(line.startswith("GET ") for line in log)


def test_a_listing_link_that_only_requeries_is_not_a_file(tmp_path: Path):
    """Sibling: Apache-style listings link `?C=N;O=D` (sort orders); joined to the folder URL they became "files"
    named `?C=N;O=D` holding the listing again."""
    root = tmp_path / "www" / "data"
    root.mkdir(parents=True)
    (root / "iris.csv").write_bytes(IRIS)
    (root / "index.html").write_text(
        '<html><body><a href="?C=N;O=D">Name</a> <a href="?C=M;O=A">Last modified</a>\n'
        '<a href="iris.csv">iris.csv</a></body></html>'
    )
    with serve_folder(tmp_path / "www") as base:
        result = prewarm(f"{base}/data/", tmp_path / "cache")
    assert _cached(result) == {"iris.csv": IRIS}
    assert any("a link with a query string" in s for s in result.skipped_entries)


def test_split_query_and_identity():
    assert split_query("http://h/data/?sv=1&sig=S#frag") == ("http://h/data/", "sv=1&sig=S")
    assert split_query("memory://x/we?ird") == ("memory://x/we?ird", "")  # a `?` in a non-HTTP path is the path's
    assert dataset_identity("HTTP://alice:pw@Host:8080/d/?sv=1&sig=S&format=csv") == "http://host:8080/d?format=csv"
    assert cache_key("https://h/d/?sv=2020&se=2026-01-01&sig=A") == cache_key("https://h/d?sv=2021&se=2027-01-01&sig=B")
    assert cache_key("https://h/d/?part=1") != cache_key("https://h/d/?part=2")  # a query that names data stays
    assert cache_key("http://h:notaport/d/").startswith("d-")


# --- 10. credentials in the JSON form; malformed options are configuration errors ------------------------------


@pytest.fixture
def fsspec_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """fsspec reads FSSPEC_* variables once, at import: re-read them into a fresh config for the test."""
    import fsspec.config

    conf: dict = {}
    monkeypatch.setattr(fsspec.config, "conf", conf)

    def reload() -> None:
        conf.clear()
        fsspec.config.set_conf_env(conf)

    monkeypatch.setattr(monkeypatch, "reload_fsspec", reload, raising=False)
    yield monkeypatch


@pytest.mark.parametrize("variable", ["FSSPEC_HTTP_CLIENT_KWARGS", "FSSPEC_HTTP_AUTH"])
def test_credentials_in_the_json_form_the_warning_suggests(www: Path, tmp_path: Path, fsspec_env, variable: str):
    """The input: FSSPEC_HTTP_CLIENT_KWARGS='{"auth": {"login": "u", "password": "p"}}' failed as "does not exist at
    the source (... TypeError: BasicAuth() tuple is required)". Sibling: the request option FSSPEC_HTTP_AUTH."""
    value = {"login": "u", "password": "p"}
    fsspec_env.setenv(variable, json.dumps({"auth": value} if variable.endswith("CLIENT_KWARGS") else value))
    fsspec_env.reload_fsspec()
    with serve_folder(www, auth=("u", "p")) as base:
        result = prewarm(f"{base}/data/", tmp_path / "cache")
    assert _cached(result) == _source(www / "data")


def test_the_warning_suggests_a_form_that_works(www: Path, tmp_path: Path, fsspec_env):
    with pytest.warns(UserWarning) as caught:
        warn_if_credentials("http://u:p@127.0.0.1:1/data/")
    [suggested] = re.findall(r"FSSPEC_HTTP_CLIENT_KWARGS='([^']+)'", next(str(w.message) for w in caught if issubclass(w.category, UserWarning)))
    fsspec_env.setenv("FSSPEC_HTTP_CLIENT_KWARGS", suggested.replace("USER", "u").replace("PASSWORD", "p"))
    fsspec_env.reload_fsspec()
    with serve_folder(www, auth=("u", "p")) as base:
        assert _cached(prewarm(f"{base}/data/", tmp_path / "cache")) == _source(www / "data")


def test_a_timeout_in_seconds_works(www: Path, tmp_path: Path, fsspec_env):
    """Sibling: '{"timeout": 30}' (seconds, as JSON holds them) raised aiohttp's ValueError ("timeout parameter cannot be
    of <class 'int'> type") unclassified."""
    fsspec_env.setenv("FSSPEC_HTTP_CLIENT_KWARGS", '{"timeout": 30}')
    fsspec_env.reload_fsspec()
    with serve_folder(www) as base:
        assert _cached(prewarm(f"{base}/data/", tmp_path / "cache")) == _source(www / "data")


@pytest.mark.parametrize("auth", ['"u:p"', '{"name": "u", "pw": "p"}', '["u", "p", "x"]'])
def test_a_malformed_auth_is_a_configuration_error(www: Path, tmp_path: Path, fsspec_env, auth: str):
    fsspec_env.setenv("FSSPEC_HTTP_CLIENT_KWARGS", f'{{"auth": {auth}}}')
    fsspec_env.reload_fsspec()
    with serve_folder(www, auth=("u", "p")) as base:
        with pytest.raises(SourceConfigError, match=r"FSSPEC_HTTP_CLIENT_KWARGS .*auth must be a login and a password; "
                           r'valid: \{"auth": \{"login": "USER", "password": "PASSWORD"\}\}') as err:
            prewarm(f"{base}/data/", tmp_path / "cache")
    assert "does not exist" not in str(err.value)
    assert not (tmp_path / "cache").exists()


def test_a_driver_type_error_is_not_missing():
    """The exact chain fsspec raised: FileNotFoundError(url) from aiohttp's TypeError."""
    try:
        try:
            raise TypeError("BasicAuth() tuple is required instead")
        except TypeError as inner:
            raise FileNotFoundError("http://127.0.0.1:8000/data/") from inner
    except FileNotFoundError as exc:
        mapped = classify(exc, "http://127.0.0.1:8000/data/")
    assert isinstance(mapped, SourceConfigError) and isinstance(mapped, ValueError)
    assert "does not exist" not in str(mapped)
    assert "rejected its options" in str(mapped) and "FSSPEC_HTTP_CLIENT_KWARGS=" in str(mapped)
    assert "BasicAuth() tuple is required" in str(mapped)


# --- 11. a long-lived process lists fresh; an object replaced mid-copy is copied again ------------------------


@pytest.fixture
def s3_data(tmp_path: Path) -> Iterator[tuple[str, object]]:
    src = tmp_path / "s3src"
    (src / "sub").mkdir(parents=True)
    (src / "a.csv").write_bytes(b"x,label\n1,0\n2,1\n")
    (src / "sub" / "b.csv").write_bytes(b"x,label\n3,0\n")
    with s3_test_server({"s3://datasets/growing": src}) as endpoint:
        import boto3

        yield endpoint, boto3.client("s3", endpoint_url=endpoint)


def test_a_second_prewarm_in_one_process_sees_added_and_replaced_objects(s3_data, tmp_path: Path):
    """The input: in one process, a second prewarm after an object was added failed as "does not exist at the
    source" (s3fs's listing cache); an overwritten object gave a 412 classified permanent."""
    _, s3 = s3_data
    url = "s3://datasets/growing/"
    first = prewarm_dataset(url, str(tmp_path / "o1"), cache_root=str(tmp_path / "tier"))
    assert sorted(_cached(first)) == ["a.csv", "sub/b.csv"]
    s3.put_object(Bucket="datasets", Key="growing/c.csv", Body=b"x,label\n4,1\n")  # type: ignore[attr-defined]
    s3.put_object(Bucket="datasets", Key="growing/sub/d.csv", Body=b"x,label\n5,0\n")  # type: ignore[attr-defined]
    second = prewarm_dataset(url, str(tmp_path / "o2"), cache_root=str(tmp_path / "tier"))
    assert sorted(_cached(second)) == ["a.csv", "c.csv", "sub/b.csv", "sub/d.csv"]
    assert (second.files_copied, second.files_skipped) == (2, 2)
    s3.put_object(Bucket="datasets", Key="growing/a.csv", Body=b"x,label\n1,0\n2,1\n9,9\n")  # type: ignore[attr-defined]
    third = prewarm_dataset(url, str(tmp_path / "o3"), cache_root=str(tmp_path / "tier"))
    assert _cached(third)["a.csv"] == b"x,label\n1,0\n2,1\n9,9\n"


def test_an_object_replaced_between_listing_and_read_is_copied_again(s3_data, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture):
    """Sibling: the read is pinned to the listed ETag, so moto answers 412; that is a change, copied again."""
    _, s3 = s3_data
    real = pm.list_dataset
    calls = []

    def list_then_replace(uri, **kwargs):  # type: ignore[no-untyped-def]
        out = real(uri, **kwargs)
        if not calls:
            s3.put_object(Bucket="datasets", Key="growing/a.csv", Body=b"x,label\n7,7\n")  # type: ignore[attr-defined]
        calls.append(uri)
        return out

    monkeypatch.setattr(pm, "list_dataset", list_then_replace)
    with caplog.at_level(logging.WARNING, logger="heteroflow.cache"):
        result = prewarm("s3://datasets/growing/", tmp_path / "cache", workers=1)
    assert _cached(result)["a.csv"] == b"x,label\n7,7\n"
    assert result.changed_during_copy == ("a.csv",)
    assert "changed at the source while the data set was copied (a.csv)" in caplog.text


def test_a_412_is_a_change_not_a_permanent_refusal():
    class PreconditionFailed(OSError):
        status = 412

    mapped = classify(PreconditionFailed("At least one of the pre-conditions you specified did not hold"), "s3://b/d/")
    assert isinstance(mapped, SourceChanged) and isinstance(mapped, SourceUnavailable) and isinstance(mapped, ConnectionError)


# --- 12. files changed at the source while the data set is copied ---------------------------------------------


@pytest.fixture
def changing(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.csv").write_bytes(b"x,label\n1,0\n")
    (src / "z-big.csv").write_bytes(b"x,label\n" + b"2,1\n" * 400_000)  # ~1.6 MB: copied through the chunked path
    return src


def _during_copy_of(monkeypatch: pytest.MonkeyPatch, path: str, action) -> list[str]:  # type: ignore[no-untyped-def]
    real = copying._copy_file
    done: list[str] = []

    def copy_file(f, dest, open_src):  # type: ignore[no-untyped-def]
        if f.path == path:
            action(len(done))
        done.append(f.path)
        return real(f, dest, open_src)

    monkeypatch.setattr(copying, "_copy_file", copy_file)
    return done


def test_a_file_changed_after_its_copy_while_a_neighbour_copies_is_copied_again(
    changing: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The input: a.csv changed after its own copy while z-big.csv was still copying was published with its old
    size, and no notice."""
    new = b"x,label\n1,0\n3,1\n"

    def change_a(n: int) -> None:
        if n == 1:  # a.csv is copied already (one worker, sorted order)
            (changing / "a.csv").write_bytes(new)

    _during_copy_of(monkeypatch, "z-big.csv", change_a)
    with caplog.at_level(logging.WARNING, logger="heteroflow.cache"):
        result = prewarm(str(changing), tmp_path / "cache", workers=1)
    assert _cached(result) == _source(changing)
    assert {f.path: f.bytes for f in result.manifest.files}["a.csv"] == len(new)
    assert result.changed_during_copy == ("a.csv",) and result.files_copied == 2
    assert "1 file changed at the source while the data set was copied (a.csv)" in caplog.text
    again = prewarm(str(changing), tmp_path / "cache")
    assert again.files_copied == 0  # what was published is what the source holds


def test_a_same_size_rewrite_during_the_copy_is_seen_by_its_mtime(changing: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    """Sibling: same size, new content and mtime."""
    def rewrite(n: int) -> None:
        if n == 1:
            (changing / "a.csv").write_bytes(b"x,label\n9,1\n")
            st = (changing / "a.csv").stat()
            os.utime(changing / "a.csv", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))

    _during_copy_of(monkeypatch, "z-big.csv", rewrite)
    result = prewarm(str(changing), tmp_path / "cache", workers=1)
    assert _cached(result)["a.csv"] == b"x,label\n9,1\n"


def test_a_file_that_grows_between_listing_and_its_copy_is_copied_again(changing: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """Sibling: a copy longer than listed was a permanent CacheIntegrityError; the source changed, so copy again."""
    def grow(n: int) -> None:
        if n == 0:
            with open(changing / "a.csv", "ab") as fh:
                fh.write(b"5,0\n")

    _during_copy_of(monkeypatch, "a.csv", grow)
    result = prewarm(str(changing), tmp_path / "cache", workers=1)
    assert _cached(result) == _source(changing)
    assert result.changed_during_copy == ("a.csv",)


def test_a_file_deleted_between_listing_and_its_copy_is_a_change_not_a_missing_data_set(changing: Path, tmp_path: Path,
                                                                                         monkeypatch: pytest.MonkeyPatch):
    """A review's input: a file removed at the source while the data set was copied failed prewarm permanently with
    "data set ... does not exist at the source", and threw the copy so far away. It is a change of the source, as a
    file of another size is: the fresh listing is published, and the change named."""
    def remove(n: int) -> None:
        if n == 0:
            (changing / "a.csv").unlink()

    _during_copy_of(monkeypatch, "a.csv", remove)
    result = prewarm(str(changing), tmp_path / "cache", workers=1)
    assert _cached(result) == _source(changing) and "a.csv" not in _cached(result)
    assert result.changed_during_copy == ("a.csv",)


def test_a_file_that_keeps_changing_fails_clearly_and_the_current_version_stays(changing: Path, tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    first = prewarm(str(changing), tmp_path / "cache")
    (changing / "a.csv").write_bytes(b"x,label\n1,0\n0,0\n")

    def append(n: int) -> None:
        with open(changing / "a.csv", "ab") as fh:
            fh.write(b"5,0\n")

    _during_copy_of(monkeypatch, "a.csv", append)  # a writer still appending: every copy finds it longer
    with pytest.raises(SourceChanged, match=r"a\.csv kept changing at the source while it was copied \(3 tries"):
        prewarm(str(changing), tmp_path / "cache", workers=1)
    assert json.loads((tmp_path / "cache" / MANIFEST_NAME).read_text())["version"] == first.version


def test_a_short_read_of_an_unchanged_source_is_still_an_integrity_error(changing: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """Not every short copy is a change: when the fresh listing matches, the read was bad and nothing is published."""
    real = copying._copy_file

    def short(f, dest, open_src):  # type: ignore[no-untyped-def]
        if f.path == "a.csv":
            Path(dest).write_bytes(b"x")
            raise CacheIntegrityError(f"copied 1 bytes of {f.path!r} but the source has {f.bytes}")
        return real(f, dest, open_src)

    monkeypatch.setattr(copying, "_copy_file", short)
    with pytest.raises(CacheIntegrityError, match="copied 1 bytes of 'a.csv'"):
        prewarm(str(changing), tmp_path / "cache", workers=1)
    assert not (tmp_path / "cache" / MANIFEST_NAME).exists()


# --- 13. one identity for every cache key; umask modes ---------------------------------------------------------


def test_a_relative_prewarm_is_the_entry_a_run_reuses(tmp_path: Path, digits_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """The input: `heteroflow prewarm data/x` made a cache entry `heteroflow run --dataset data/x` did not reuse."""
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.runs.records import prepare_arguments

    work = tmp_path / "work"
    shutil.copytree(digits_dir, work / "data" / "x")
    monkeypatch.chdir(work)
    out = CliRunner().invoke(app, ["prewarm", "data/x"])
    assert out.exit_code == 0, out.output
    args = prepare_arguments(default_pipeline(), {"dataset_uri": "data/x"})  # what `run --dataset data/x` passes on
    entry = dataset_cache_dir(args["dataset_uri"])
    assert (entry / MANIFEST_NAME).is_file()
    run_prewarm = prewarm_dataset(args["dataset_uri"], str(tmp_path / "step-out"))
    assert run_prewarm.files_copied == 0 and run_prewarm.dataset_dir == entry
    assert json.loads((entry / MANIFEST_NAME).read_text())["source_uri"] == str((work / "data" / "x").resolve())
    # sibling: a plain folder read without prewarm records the same identity in its lineage
    assert open_dataset("data/x").source_uri == str((work / "data" / "x").resolve())
    status = CliRunner().invoke(app, ["cache", "status", "data/x"])  # sibling: `cache status` takes the same spelling
    assert status.exit_code == 0 and entry.name in status.output


def test_every_spelling_of_a_local_folder_is_one_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "data" / "x").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    keys = {cache_key(s) for s in ("data/x", "./data/x/", "file://data/x", str(tmp_path / "data" / "x"),
                                   "link/x", str(tmp_path / "link" / "x") + "/", "data/../data/x")}
    assert len(keys) == 1
    assert cache_key("s3://b/d/") == cache_key("s3://b/d") != cache_key("s3://b/e")


def test_cached_and_temporary_folders_get_the_umask_modes(tmp_path: Path, digits_dir: Path):
    """The input: archive version folders were 0700 (mkdtemp's), unreadable to the team; siblings: every folder and
    file the cache tier writes."""
    old = os.umask(0o002)
    try:
        result = prewarm(str(digits_dir), tmp_path / "cache")
        with atomic_directory(tmp_path / "published") as tmp:
            (tmp / "f").write_text("x")
        atomic_write_bytes(tmp_path / "record.json", b"{}")
        made = make_temp_dir(tmp_path, prefix=".incoming-")
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    version = Path(result.manifest.root)
    assert mode(version) == mode(version.parent) == mode(tmp_path / "cache") == 0o775
    assert {mode(p) for p in version.rglob("*")} == {0o664}
    assert mode(tmp_path / "cache" / MANIFEST_NAME) == 0o664 and mode(tmp_path / "cache" / pm.LOCK_NAME) == 0o664
    assert mode(tmp_path / "published") == 0o775 and mode(tmp_path / "record.json") == 0o664
    assert mode(made) == 0o775 and made.name.startswith(".incoming-")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_dataset(result.manifest_path).version == result.version


def test_a_signed_folder_without_data_names_no_signature(www: Path, tmp_path: Path):
    """Sibling: "has no .csv ... file (found: ...)" quoted the file names with the URL's query; now the names are the
    files' own, and no message holds the signature. (prewarm caches any files since #14; the up-front check of a run,
    list_dataset with require_data, is what refuses a folder without data.)"""
    from heteroflow.cache.listing import list_dataset

    (www / "notes").mkdir()
    (www / "notes" / "README.md").write_text("no data")
    with serve_folder(www, required_query={"sig": "zz12345"}) as base:
        with pytest.raises(DatasetError, match=r"\(found: README.md\)") as err:
            list_dataset(f"{base}/notes/?sig=zz12345")
    assert "zz12345" not in str(err.value)


def test_an_archived_version_is_readable_to_the_team(tmp_path: Path):
    """The input of #16.13 itself: an archive version folder gets the umask's mode (0775 under umask 002), not 0700."""
    from heteroflow.components.models.archive import archive

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.pt").write_bytes(b"weights")
    old = os.umask(0o002)
    try:
        result = archive(model, tmp_path / "archive", name="team-mlp", metrics={"accuracy": 1.0}, lineage={})
    finally:
        os.umask(old)
    assert stat.S_IMODE(result.path.stat().st_mode) == 0o775
    assert stat.S_IMODE((result.path / "metrics.json").stat().st_mode) & 0o044 == 0o044
