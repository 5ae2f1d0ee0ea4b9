"""Issue #27 item 5: file readers in one registry (heteroflow.components.data.formats). Each built-in reader is found
by suffix and by sniffing its content; a suffix no reader claims is an error that lists the readers; the cache tier
asks the readers which files are data; a reader installed through the entry-point group ``heteroflow.readers`` is
used by preprocess, end to end, for its suffix."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.formats import (
    BUILTIN_READERS,
    ENTRY_POINT_GROUP,
    REGISTRY,
    ReaderRegistry,
    UnknownFormat,
    reader_for,
)

BUILTIN_SUFFIXES = {
    "csv": (".csv", ".tsv"),
    "parquet": (".parquet", ".pq"),
    "npz": (".npz",),
    "image_folder": (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"),
    "tensors": (".pt", ".pth"),
}


def _write_sample(kind: str, path: Path) -> Path:
    """One real file of each built-in format at ``path`` (whatever its name)."""
    if kind == "csv":
        path.write_text("a;b;label\n1;2;x\n3;4;y\n", encoding="utf-8")
    elif kind == "parquet":
        import pandas as pd

        pd.DataFrame({"a": [1.0, 2.0], "label": ["x", "y"]}).to_parquet(path, engine="pyarrow")
    elif kind == "npz":
        with open(path, "wb") as fh:
            np.savez(fh, x=np.zeros((2, 3)), y=np.array([0, 1]))
    elif kind == "image_folder":
        from PIL import Image

        Image.new("L", (4, 4), 128).save(path, format="PNG")
    elif kind == "tensors":
        import torch

        torch.save({"x": torch.zeros(2, 3), "y": torch.tensor([0, 1])}, path)
    return path


def test_the_builtins_are_registered_with_their_suffixes_and_describe_themselves():
    assert {r.name: r.suffixes for r in BUILTIN_READERS} == BUILTIN_SUFFIXES
    lines = REGISTRY.describe_all()
    for reader in BUILTIN_READERS:
        assert reader in REGISTRY.readers()
        text = reader.describe()
        assert text and "\n" not in text, reader.name
        assert any(line.startswith(f"{reader.name}: {', '.join(reader.suffixes)}: ") for line in lines)


@pytest.mark.parametrize(("name", "suffix"), [(n, s) for n, ss in BUILTIN_SUFFIXES.items() for s in ss])
def test_each_builtin_reader_is_found_by_suffix(name: str, suffix: str):
    assert reader_for(f"data/x{suffix}").name == name
    assert reader_for(f"data/X{suffix.upper()}").name == name  # suffixes compare lower-cased
    assert REGISTRY.is_data_file(f"sub/x{suffix}")


@pytest.mark.parametrize("name", list(BUILTIN_SUFFIXES))
def test_each_builtin_reader_is_found_by_sniffing_a_file_without_a_suffix(name: str, tmp_path: Path):
    if name == "image_folder":
        pytest.importorskip("PIL")
    if name == "tensors":
        pytest.importorskip("torch")
    blob = _write_sample(name, tmp_path / "blob")
    found = REGISTRY.sniff(blob)
    assert found is not None and found.name == name
    others = [r.name for r in BUILTIN_READERS if r.name != name and r.sniff(blob)]
    assert others == [], f"{others} also claim a {name} file"


def test_an_image_folder_is_sniffed_as_a_folder(tmp_path: Path):
    pytest.importorskip("PIL")
    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    _write_sample("image_folder", tmp_path / "imgs" / "cat" / "1.png")
    reader = REGISTRY.get("image_folder")
    assert reader.sniff(tmp_path / "imgs")
    (tmp_path / "flat").mkdir()
    _write_sample("image_folder", tmp_path / "flat" / "1.png")  # an image at the top: no class folder
    assert not reader.sniff(tmp_path / "flat")


def test_text_that_is_no_table_and_missing_files_sniff_as_nothing(tmp_path: Path):
    (tmp_path / "README").write_text("just some notes\nno delimiters here\n")
    assert REGISTRY.sniff(tmp_path / "README") is None
    assert REGISTRY.sniff(tmp_path / "missing") is None


def test_an_unknown_suffix_lists_the_registered_readers(tmp_path: Path):
    from heteroflow.components.data.datasets import read_table

    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(UnknownFormat, match=r"unsupported file type '\.txt'") as err:
        read_table(f)
    for name, suffixes in BUILTIN_SUFFIXES.items():
        assert f"{name} ({', '.join(suffixes)})" in str(err.value)
    assert isinstance(err.value, DatasetError)  # a permanent failure, as before
    with pytest.raises(UnknownFormat, match=r"unsupported file type '\.png'"):  # a reader reads .png, not as a table
        read_table(tmp_path / "x.png")
    with pytest.raises(UnknownFormat, match=r"no reader is named 'xlsx'; registered readers: csv \(\.csv, \.tsv\)"):
        REGISTRY.get("xlsx")


def test_files_no_reader_reads_are_named_by_the_check_and_by_preprocess(tmp_path: Path):
    from heteroflow.cache.listing import list_dataset
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.data.preprocess import preprocess

    src = tmp_path / "blobs"
    src.mkdir()
    (src / "y.bin").write_bytes(b"\x00\x01")
    with pytest.raises(DatasetError, match=r"has no .* file \(found: y\.bin\); supported formats: .*; registered readers: csv \("):
        list_dataset(str(src))
    result = prewarm(str(src), tmp_path / "cache")  # the cache tier caches any file
    with pytest.raises(UnknownFormat, match=r"no reader reads \.bin files; readers: tables .*; registered readers: .*tensors \(\.pt, \.pth\)"):
        preprocess(result.manifest_path, tmp_path / "out", num_workers=1)


def test_the_cache_tier_asks_the_readers_which_files_are_data(tmp_path: Path):
    """cache/ holds no suffix list: with no readers installed it checks no format, and a judge it is given decides."""
    from heteroflow.cache import listing

    src = tmp_path / "blobs"
    src.mkdir()
    (src / "y.bin").write_bytes(b"\x00\x01")

    class BinJudge:
        def is_data_file(self, path: str) -> bool:
            return path.endswith(".bin")

        def suffixes(self) -> tuple[str, ...]:
            return (".bin",)

        def formats_help(self) -> str:
            return "only .bin"

    try:
        listing.set_data_formats([])
        assert [f.path for f in listing.list_dataset(str(src)).files] == ["y.bin"]
        assert listing.list_dataset(str(src)).data_files == ()
        listing.set_data_formats(BinJudge())
        assert [f.path for f in listing.list_dataset(str(src)).data_files] == ["y.bin"]
        assert listing.READABLE_SUFFIXES == (".bin",) and listing.FORMATS_HELP == "only .bin"
        (src / "y.bin").rename(src / "y.csv")
        with pytest.raises(DatasetError, match=r"\(found: y\.csv\); only \.bin$"):
            listing.list_dataset(str(src))
    finally:
        listing.set_data_formats(None)
    assert listing.data_formats() == (REGISTRY,)  # the entry point heteroflow itself installs
    assert listing.list_dataset(str(src)).data_files[0].path == "y.csv"


# --- a third-party reader through the entry-point group ------------------------------------------------------

PLUGIN = '''
import json
from pathlib import Path

import pandas as pd

from heteroflow.components.data.datasets import RawTable, clean_column


class JsonLinesReader:
    name = "jsonl"
    suffixes = (".jsonl",)
    kind = "table"

    def sniff(self, path):
        try:
            with open(path, "rb") as fh:
                return fh.read(1) == b"{"
        except OSError:
            return False

    def read(self, path, /, *, header="auto", delimiter="auto"):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        frame = pd.DataFrame(rows)
        kinds = {}
        for col in frame.columns:
            frame[col], kinds[col] = clean_column(frame[col])
        return RawTable(frame=frame, kinds=kinds, source=str(path), format="jsonl", csv=None, named=True, blank_rows=0)

    def describe(self):
        return "JSON lines tables, one object per line"


class HashCsvReader:
    """Claims .csv too, but only files that start with '#!hash' (to test sniffing an ambiguous suffix)."""

    name = "hashcsv"
    suffixes = (".csv",)
    kind = "table"

    def sniff(self, path):
        with open(path, "rb") as fh:
            return fh.read(6) == b"#!hash"

    def read(self, path, /, **options):
        frame = pd.read_csv(path, skiprows=1)  # the #!hash line, then a plain CSV
        kinds = {}
        for col in frame.columns:
            frame[col], kinds[col] = clean_column(frame[col])
        return RawTable(frame=frame, kinds=kinds, source=str(path), format="hashcsv", csv=None, named=True, blank_rows=0)

    def describe(self):
        return "csv files with a #!hash line"


class VectorReader:
    """A kind of its own: '.vec' files of lines 'label v1 v2 v3', read whole by preprocess, opened by train."""

    name = "vec"
    suffixes = (".vec",)
    kind = "vectors"

    def sniff(self, path):
        return Path(path).suffix == ".vec"

    def read(self, view, /, *, split):
        import numpy as np
        from heteroflow.components.data.formats import PreparedFiles

        rows = [line.split() for p in view.files if p.suffix == ".vec" for line in p.read_text().splitlines() if line.strip()]
        classes = sorted({r[0] for r in rows})
        y = np.array([classes.index(r[0]) for r in rows])
        x = np.array([[float(v) for v in r[1:]] for r in rows], dtype=np.float32)
        parts = split(y)
        meta = {"data_kind": "vectors", "classes": classes, "sample_shape": [x.shape[1]],
                "counts": {s: int(len(i)) for s, i in parts.items()}, "num_features": int(x.shape[1])}

        def write(folder):
            for s, i in parts.items():
                np.savez(folder / f"{s}.npz", x=x[i], y=y[i])

        return PreparedFiles(meta=meta, write=write)

    def open_splits(self, dataset_dir, meta):
        import numpy as np
        import torch
        from heteroflow.components.data.readers import DataSplits, TensorData

        def part(s):
            with np.load(Path(dataset_dir) / f"{s}.npz") as d:
                return TensorData(torch.from_numpy(d["x"]), torch.from_numpy(d["y"]))

        return DataSplits(kind="vectors", train=part("train"), validation=part("validation"), test=part("test"),
                          classes=tuple(meta["classes"]), input_shape=tuple(meta["sample_shape"]), in_memory=True,
                          info={"kind": "vectors"}, fingerprint="vec")

    def describe(self):
        return "label and numbers per line"


def broken():
    raise RuntimeError("this plugin is broken")
'''


@pytest.fixture()
def plugin_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[importlib.metadata.EntryPoint]]:
    """``importlib.metadata.entry_points`` answering the readers' group with the entry points the test puts in the
    list (a module ``hf_test_readers`` on sys.path holds the readers); the registry forgets them afterwards."""
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "hf_test_readers.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path / "plugin"))
    eps: list[importlib.metadata.EntryPoint] = []
    real = importlib.metadata.entry_points

    def entry_points(**params):  # type: ignore[no-untyped-def]
        if params.get("group") == ENTRY_POINT_GROUP:
            return importlib.metadata.EntryPoints(eps)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    REGISTRY.reload()
    yield eps
    REGISTRY.reload()
    monkeypatch.undo()
    sys.modules.pop("hf_test_readers", None)
    assert "jsonl" not in [r.name for r in REGISTRY.readers()]


def _jsonl_dataset(folder: Path) -> int:
    folder.mkdir()
    rng = np.random.default_rng(0)
    n = 0
    for part in range(2):
        lines = []
        for i in range(60):
            label = ["setosa", "versicolor", "virginica"][i % 3]
            lines.append(json.dumps({"petal": float(i % 3) + rng.normal(0, 0.1), "width": float(rng.normal()), "species": label}))
            n += 1
        (folder / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "README.md").write_text("not data")
    return n


def test_a_reader_from_an_entry_point_is_used_by_preprocess_end_to_end(plugin_entry_points, tmp_path: Path):
    from heteroflow.components.data.preprocess import load_split, preprocess

    src = tmp_path / "iris-jsonl"
    rows = _jsonl_dataset(src)
    plugin_entry_points.append(importlib.metadata.EntryPoint("jsonl", "hf_test_readers:JsonLinesReader", ENTRY_POINT_GROUP))

    assert reader_for(src / "part-0.jsonl").name == "jsonl"
    assert "jsonl (.jsonl)" in REGISTRY.listing()
    result = preprocess(src, tmp_path / "out", num_workers=1, seed=3)
    assert sum(result.counts.values()) == rows
    assert result.classes == ("setosa", "versicolor", "virginica")
    assert [f["format"] for f in result.report["files"]] == ["jsonl", "jsonl"]
    assert [Path(f["path"]).name for f in result.report["files"]] == ["part-0.jsonl", "part-1.jsonl"]
    x, y = load_split(result.output_dir, "train")
    assert x.shape == (result.counts["train"], 2) and set(np.unique(y)) == {0, 1, 2}


def test_without_the_plugin_the_same_folder_is_refused(tmp_path: Path):
    from heteroflow.components.data.preprocess import preprocess

    src = tmp_path / "iris-jsonl"
    _jsonl_dataset(src)
    with pytest.raises(DatasetError, match=r"has no .* file \(found: README\.md, part-0\.jsonl, part-1\.jsonl\)"):
        preprocess(src, tmp_path / "out", num_workers=1)


def test_a_broken_entry_point_is_logged_and_the_builtins_still_read(plugin_entry_points, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    plugin_entry_points.append(importlib.metadata.EntryPoint("broken", "hf_test_readers:broken", ENTRY_POINT_GROUP))
    plugin_entry_points.append(importlib.metadata.EntryPoint("gone", "hf_no_such_module:Reader", ENTRY_POINT_GROUP))
    with caplog.at_level(logging.WARNING, logger="heteroflow.components"):
        names = [r.name for r in REGISTRY.readers()]
    assert names == list(BUILTIN_SUFFIXES)
    assert "entry point broken = hf_test_readers:broken" in caplog.text and "this plugin is broken" in caplog.text
    assert "entry point gone = hf_no_such_module:Reader" in caplog.text
    assert reader_for(tmp_path / "x.csv").name == "csv"


def test_an_ambiguous_suffix_is_decided_by_sniffing(plugin_entry_points, tmp_path: Path):
    plugin_entry_points.append(importlib.metadata.EntryPoint("hashcsv", "hf_test_readers:HashCsvReader", ENTRY_POINT_GROUP))
    registry = ReaderRegistry(BUILTIN_READERS)  # loads the same (patched) group
    hashed = tmp_path / "a.csv"
    hashed.write_text("#!hash\na,b\n1,2\n")
    plain = tmp_path / "b.csv"
    plain.write_text("a,b\n1,2\n")
    assert [r.name for r in registry.claiming(hashed)] == ["hashcsv", "csv"]  # entry-point readers sniff first
    assert registry.find(hashed).name == "hashcsv"
    table = registry.find(hashed).read(hashed)
    assert list(table.frame.columns) == ["a", "b"] and table.frame.iloc[0].tolist() == [1, 2]
    assert registry.find(plain).name == "csv"
    assert registry.suffixes("table")[:2] == (".csv", ".tsv")


def test_register_checks_the_reader():
    registry = ReaderRegistry(group="")
    with pytest.raises(TypeError, match=r"lacks .*sniff"):
        registry.register(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a reader named 'csv' is registered already; registered: csv"):
        registry.register(BUILTIN_READERS[0])
        registry.register(BUILTIN_READERS[0])

    class Upper:
        name, suffixes, kind = "up", (".CSV",), "table"

        def sniff(self, path): return False  # noqa: E704
        def read(self, path, /, **o): return None  # noqa: E704
        def describe(self): return "x"  # noqa: E704

    with pytest.raises(TypeError, match=r"lower-case"):
        registry.register(Upper())


def test_heteroflow_readers_lists_every_reader_with_its_origin(plugin_entry_points):
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    plugin_entry_points.append(importlib.metadata.EntryPoint("jsonl", "hf_test_readers:JsonLinesReader", ENTRY_POINT_GROUP))
    result = CliRunner().invoke(app, ["readers", "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)
    assert [(f["name"], tuple(f["suffixes"])) for f in facts] == [*BUILTIN_SUFFIXES.items(), ("jsonl", (".jsonl",))]
    assert facts[0]["origin"] == "registered in code" and facts[0]["kind"] == "table"
    assert facts[-1]["origin"] == "entry point jsonl = hf_test_readers:JsonLinesReader"
    assert facts[-1]["description"] == "JSON lines tables, one object per line"
    table = CliRunner().invoke(app, ["readers"], terminal_width=200)
    assert table.exit_code == 0 and "image_folder" in table.output and ".jsonl" in table.output


def test_a_reader_of_a_kind_of_its_own_is_prepared_by_preprocess_and_opened_for_training(plugin_entry_points, tmp_path: Path):
    pytest.importorskip("torch")
    from heteroflow.components.data.preprocess import preprocess
    from heteroflow.components.data.readers import open_splits

    plugin_entry_points.append(importlib.metadata.EntryPoint("vec", "hf_test_readers:VectorReader", ENTRY_POINT_GROUP))
    src = tmp_path / "vectors"
    src.mkdir()
    rng = np.random.default_rng(1)
    (src / "a.vec").write_text("".join(f"{'ab'[i % 2]} {rng.normal():.3f} {rng.normal():.3f} {i % 2}\n" for i in range(40)))
    result = preprocess(src, tmp_path / "out", num_workers=1)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["data_kind"] == "vectors" and meta["source_uri"] == str(src) and result.classes == ("a", "b")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["meta.json", "test.npz", "train.npz", "validation.npz"]
    splits = open_splits(tmp_path / "out")
    assert splits.kind == "vectors" and splits.input_shape == (3,)
    assert len(splits.train) + len(splits.validation) + len(splits.test) == 40
