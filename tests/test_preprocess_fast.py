"""Issue #32 items 1 and 6: the fast preprocess gives what the reference implementation gives, and the pre-run
data check stays cheap without finding less.

Item 1: preprocess reads text tables with pyarrow's CSV reader where the file allows (``datasets._read_csv``,
``heteroflow.components.data.arrowcsv``) and fits and applies the transformation with numpy
(``tabular.fit_fast`` / ``tabular.apply_fast``) instead of passing every split through scikit-learn's
ColumnTransformer. The reference is kept in the code (``preprocess._FAST_TRANSFORM = False``,
``arrowcsv.ENABLED = False``: pandas' reader and the ColumnTransformer, as before #32): every test here runs both
on the same input and compares the shards, ``meta.json``, the schema and the archived transformation's output,
value for value. An archive written before #32 (``tests/data/archived-before-32``) still loads and predicts.

Item 6: :func:`heteroflow.components.data.precheck._plainly_fine` certifies a plainly fine CSV data set without
pandas; whenever it does, the full check finds nothing either, and every problem is still found (by the full check).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data import arrowcsv, preprocess as preprocess_module
from heteroflow.components.data.datasets import read_table
from heteroflow.components.data.preprocess import SPLITS, load_split, preprocess
from heteroflow.components.data.tabular import load_transform, prepare_rows

DATA = Path(__file__).parent / "data"
ARCHIVED = DATA / "archived-before-32"


def _write(folder: Path, name: str, text: str, encoding: str = "utf-8") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(text.encode(encoding))
    return folder


def _both(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **params: Any) -> tuple[Path, Path]:
    """Preprocess ``src`` with the reference implementation and the fast one; their output folders."""
    outs = []
    for fast in (False, True):
        with monkeypatch.context() as m:
            m.setattr(preprocess_module, "_FAST_TRANSFORM", fast)
            m.setattr(arrowcsv, "ENABLED", fast)
            out = tmp_path / ("fast" if fast else "reference")
            preprocess(src, out, num_workers=1, **params)
            outs.append(out)
    return outs[0], outs[1]


def _same_outputs(reference: Path, fast: Path, rows: Any = None) -> None:
    """Same shards (every array, value for value), meta.json and schema; the archived transformations give the
    same features for ``rows`` (raw rows, as predict is given them)."""
    for split in SPLITS:
        for a, b in zip(sorted(reference.glob(f"{split}-*.npz")), sorted(fast.glob(f"{split}-*.npz")), strict=True):
            with np.load(a) as x, np.load(b) as y:
                assert sorted(x.files) == sorted(y.files)
                for key in x.files:
                    assert x[key].dtype == y[key].dtype, (a.name, key)
                    np.testing.assert_array_equal(x[key], y[key], err_msg=f"{a.name} {key}")
    meta_a = json.loads((reference / "meta.json").read_text())
    meta_b = json.loads((fast / "meta.json").read_text())
    for meta in (meta_a, meta_b):
        for described in meta["report"]["files"]:
            described.pop("reader", None)
    assert meta_a == meta_b
    schema_a, schema_b = (json.loads((f / "transform.json").read_text()) for f in (reference, fast))
    assert schema_a == schema_b
    ta, _ = load_transform(reference)
    tb, _ = load_transform(fast)
    if rows is not None:
        xa = np.asarray(ta.transform(prepare_rows(rows, schema_a)), dtype=np.float32)
        xb = np.asarray(tb.transform(prepare_rows(rows, schema_b)), dtype=np.float32)
        np.testing.assert_array_equal(xa, xb)
    number = dict(ta.named_transformers_).get("number")
    if number is not None:
        sa, sb = number.named_steps["scale"], tb.named_transformers_["number"].named_steps["scale"]
        np.testing.assert_array_equal(sa.mean_, sb.mean_)
        np.testing.assert_array_equal(sa.scale_, sb.scale_)


# --- item 1: the bundled tables -----------------------------------------------------------------------------


def test_digits_give_the_same_shards_and_transformation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.data.datasets import export_digits

    src = export_digits(tmp_path / "digits")
    reference, fast = _both(src, tmp_path, monkeypatch)
    rows = read_table(src / "digits-part-1.csv").frame.head(50)
    _same_outputs(reference, fast, rows)
    assert json.loads((fast / "meta.json").read_text())["num_features"] == 64


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("titanic.csv", {"label_column": "Survived", "missing": "impute", "drop_columns": "Name,Ticket,Cabin"}),
        ("titanic.csv", {"label_column": "Survived", "missing": "drop", "drop_columns": "Name,Ticket,Cabin"}),
        ("penguins.csv", {"missing": "impute"}),
        ("adult.csv", {"missing": "impute", "max_categories": 60}),
    ],
)
def test_published_tables_give_the_same_outputs(
    name: str, params: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(DATA / name, src / name)
    reference, fast = _both(src, tmp_path, monkeypatch, **params)
    rows = read_table(src / name).frame.head(80)
    if params.get("missing") == "drop":  # a model trained so fills no gap: the complete rows
        rows = rows.dropna(subset=json.loads((fast / "meta.json").read_text())["report"]["columns_used"])
    _same_outputs(reference, fast, rows)


@pytest.mark.parametrize("shard_size", [0, 97])
def test_shards_written_in_pieces_are_the_shards_of_the_reference(
    shard_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's features are computed and written in pieces (issue #32 item 1): with pieces of a few rows and
    shards of 97 rows, the shards are still the reference's, array for array."""
    from heteroflow.components.data.datasets import export_digits

    src = export_digits(tmp_path / "digits")
    monkeypatch.setattr(preprocess_module, "_PIECE_BYTES", 64 * 4 * 10)  # 10 rows a piece (64 features)
    reference, fast = _both(src, tmp_path, monkeypatch, shard_size=shard_size, validation_fraction=0.0)
    _same_outputs(reference, fast)
    shards = sorted(p.name for p in fast.glob("*.npz"))
    assert shards == sorted(p.name for p in reference.glob("*.npz"))
    assert "validation-00000.npz" in shards  # an empty split: one empty shard
    if shard_size:
        assert len([s for s in shards if s.startswith("train-")]) > 10
    x, y = load_split(fast, "train")
    assert x.dtype == np.float32 and x.shape == (len(y), 64)


# --- item 1: tricky inputs ----------------------------------------------------------------------------------


def _tricky(n: int = 300, seed: int = 3) -> str:
    """Numbers with gaps, a constant column, a true/false column with gaps, dates as text, a rare text value
    (in whichever split it falls), integers written with spaces, quoted fields holding the delimiter."""
    rng = np.random.default_rng(seed)
    lines = ["x,constant,flag,day,colour,count,who,label"]
    for i in range(n):
        x = "" if i % 17 == 0 else f"{rng.normal():.4f}"
        flag = "" if i % 23 == 0 else ("true" if rng.random() < 0.5 else "False")
        day = f"2024-0{1 + i % 3}-1{i % 2}"
        colour = "violet" if i == 7 else ("NA" if i % 29 == 0 else rng.choice(["red", "green", " blue"]))
        count = f" {int(rng.integers(0, 9))}"
        who = f'"Smith, J{i % 4}"'
        lines.append(f"{x},5,{flag},{day},{colour},{count},{who},{int(rng.integers(0, 3))}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("missing", ["impute", "drop"])
def test_tricky_cells_give_the_same_outputs(missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    src = _write(tmp_path / "src", "t.csv", _tricky())
    reference, fast = _both(src, tmp_path, monkeypatch, missing=missing)
    report = json.loads((fast / "meta.json").read_text())["report"]
    assert {"x", "constant", "flag", "day", "colour", "count", "who"} <= set(report["columns_used"])
    assert report["columns_encoded"]["day"] == 6 and "flag" in report["columns_text"]
    # at predict time: a value never seen (all zeros), a missing cell (imputed), a bool given as a bool
    rows = pd.DataFrame({
        "x": [0.5, None, 1.0], "constant": [5, 5, 7], "flag": [True, "false", None], "day": ["2024-01-10", "1999-01-01", "2024-02-11"],
        "colour": ["red", "purple", None], "count": [3, 4, None], "who": ["Smith, J1", "Smith, J9", "Smith, J2"],
    })
    if missing == "drop":
        rows = rows.iloc[:1]
    _same_outputs(reference, fast, rows)


def test_a_semicolon_table_with_decimal_commas_and_latin1_is_read_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = ["größe;farbe;label"] + [f"{1 + i % 7},{i % 3}5;{'rot' if i % 2 else 'grün'};{i % 2}" for i in range(120)]
    src = _write(tmp_path / "src", "t.csv", "\n".join(lines) + "\n", encoding="latin-1")
    reference, fast = _both(src, tmp_path, monkeypatch)
    _same_outputs(reference, fast)
    [described] = json.loads((fast / "meta.json").read_text())["report"]["files"]
    assert described["decimal"] == "," and described["encoding"] == "latin-1"


@pytest.mark.parametrize(
    "text",
    [
        _tricky(500, seed=5),
        "when,x,label\n2024-01-01 10:00,1,0\n2024-01-02 11:00,2,1\n2024-01-02,3,1\n",  # pyarrow would type them
        "\ufeffa,b,label\r\n1,x,0\r\n2, 5.5 ,1\r\n,z,0\r\n",  # a byte-order mark, CRLF, spaces around a number
        "1,0,2\n1,1,0\n0,1,1\n",  # no header; 1/0 are numbers, not true/false
        "a,b,label\n,,0\n,,1\n",  # columns of nothing but gaps
        "a,b,label\n1,x,0\n\n2,y,1\n",  # a blank line (a row position, a blank row)
        'a,b,label\n1,"two\nlines",0\n2,"y, z",1\n',  # a line end and a delimiter inside quotes
    ],
)
def test_the_arrow_reader_reads_what_pandas_reads(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    from heteroflow.components.data.csvformat import sniff_csv

    path = _write(tmp_path, "t.csv", text) / "t.csv"
    frame = arrowcsv.read(path, sniff_csv(path))
    assert frame is not None  # this table is one pyarrow reads
    with monkeypatch.context() as m:
        m.setattr(arrowcsv, "ENABLED", False)
        reference = read_table(path)
    fast = read_table(path)
    pd.testing.assert_frame_equal(reference.frame, fast.frame)
    assert reference.kinds == fast.kinds


@pytest.mark.parametrize(
    "text",
    [
        "a,b,label\n1,2,0\n3,4,1,\n5,6,0\n",  # a row one field longer: pandas' error, naming the line
        "a,b,label\n1,x,0\n2,y,1\n\xff,z,0\n",  # not UTF-8 past the sample
    ],
)
def test_what_pyarrow_cannot_read_as_pandas_would_goes_to_the_reference_reader(text: str, tmp_path: Path) -> None:
    from heteroflow.components.data.csvformat import sniff_csv

    path = tmp_path / "t.csv"
    path.write_bytes(text.encode("latin-1"))
    try:
        fmt = sniff_csv(path)
    except DatasetError:
        return
    assert arrowcsv.read(path, fmt) is None


def test_a_line_end_in_quotes_past_the_sample_and_a_block_is_read_as_pandas_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    rows = [f"{i},x{i % 3},{i % 2}" for i in range(9000)]  # about 100 KiB; the first quote past 64 KiB
    rows[8000] = '8000,"two\nlines, and a comma",0'
    path = _write(tmp_path, "t.csv", "a,b,label\n" + "\n".join(rows) + "\n") / "t.csv"
    with monkeypatch.context() as m:
        m.setattr(arrowcsv, "ENABLED", False)
        reference = read_table(path)
    for block in (1 << 10, 4 << 10, 1 << 20):  # blocks that split inside the quoted field, and one that does not
        monkeypatch.setattr(arrowcsv, "BLOCK_BYTES", block)
        fast = read_table(path)
        pd.testing.assert_frame_equal(reference.frame, fast.frame)
    assert reference.frame["b"].iloc[8000] == "two\nlines, and a comma"


def _blocks_table(change: str) -> str:
    """A table of about 60 KiB whose later rows hold what the first ones do not (``change``)."""
    rows = [f"{i},{i * 0.25},c{i % 4},{i % 3}" for i in range(3000)]
    for k in range(2000, 3000, 97):
        if change == "gaps":  # missing cells in an integer column, and a new text value, only past the first blocks
            rows[k] = f",{k * 0.25},new{k % 5},{k % 3}"
        elif change == "fraction":  # a whole-number column with a fraction past the sample: float64 in all
            rows[k] = f"{k}.5,{k * 0.25},c{k % 4},{k % 3}"
        elif change == "text":  # a number column with text past the sample: text in all
            rows[k] = f"x{k},{k * 0.25},c{k % 4},{k % 3}"
        elif change == "spaces":  # a text column of numbers written with spaces around them
            rows[k] = f"{k},{k * 0.25}, {k % 4} ,{k % 3}"
    if change == "spaces":
        rows = [r.replace(",c", ", ") for r in rows]
    return "n,v,kind,label\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "streaming"])
@pytest.mark.parametrize("change", ["none", "gaps", "fraction", "text", "spaces", "more rows than expected"])
def test_the_streaming_reader_over_many_blocks_reads_what_pandas_reads(
    change: str, threaded: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The column types come from the first block; each later block is read into the same arrays (issue #32
    item 1: the peak memory), or the whole file is read again where a later block does not fit them; the same
    frame whether the blocks are parsed on pyarrow's threads and then moved column by column (``THREADED``) or
    streamed one by one."""
    import pandas as pd

    monkeypatch.setattr(arrowcsv, "THREADED", threaded)

    path = _write(tmp_path, "t.csv", _blocks_table(change)) / "t.csv"
    with monkeypatch.context() as m:
        m.setattr(arrowcsv, "ENABLED", False)
        reference = read_table(path)
    streamed = []
    real_stream = arrowcsv._stream

    def stream(*args: Any, **kwargs: Any) -> Any:
        if change == "more rows than expected":  # room for 10 rows: the arrays grow
            kwargs["rows"] = 10
        streamed.append(real_stream(*args, **kwargs))
        return streamed[-1]

    monkeypatch.setattr(arrowcsv, "_stream", stream)
    monkeypatch.setattr(arrowcsv, "SAMPLE_BYTES", 4 << 10)
    monkeypatch.setattr(arrowcsv, "BLOCK_BYTES", 4 << 10)
    fast = read_table(path)
    pd.testing.assert_frame_equal(reference.frame, fast.frame)
    assert reference.kinds == fast.kinds
    if change in ("none", "gaps", "more rows than expected"):  # read block by block, into one array per column
        assert len(streamed) == 1 and streamed[0] is not None
    elif change in ("fraction", "text"):  # a later block does not fit the first one's types: the whole file again
        assert streamed == [None]


# --- item 1: a model archived before #32 ----------------------------------------------------------------------


def test_a_model_archived_before_32_still_loads_and_predicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.models.predict import load_archived

    expected = json.loads((ARCHIVED / "expected.json").read_text())
    model = load_archived(ARCHIVED / "model")
    rows = expected["rows"]
    np.testing.assert_array_equal(model.features(rows), np.asarray(expected["features"], dtype=np.float32))
    assert model.predict(rows).tolist() == expected["predictions"]
    # and the transformation preprocess fits today on the same table gives the same features
    src = _write(tmp_path / "src", "t.csv", (ARCHIVED / "table.csv").read_text())
    preprocess(src, tmp_path / "out", num_workers=1, **expected["params"])
    transform, schema = load_transform(tmp_path / "out")
    today = np.asarray(transform.transform(prepare_rows(rows, schema)), dtype=np.float32)
    np.testing.assert_array_equal(today, np.asarray(expected["features"], dtype=np.float32))


# --- item 6: the pre-run check ------------------------------------------------------------------------------


def test_the_pre_run_check_of_a_plain_table_does_not_import_pandas(tmp_path: Path) -> None:
    from heteroflow.components.data.datasets import export_digits

    src = export_digits(tmp_path / "digits")
    code = (
        "import sys\n"
        "from heteroflow.components.data.precheck import dataset_problems\n"
        f"print(dataset_problems({str(src)!r}, {{}}), 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "False"]


ONE_CLASS = "age,score,label\n" + "".join(f"{20 + i},{i % 7},healthy\n" for i in range(30))


@pytest.mark.parametrize(
    ("files", "fine"),
    [
        ({"t.csv": "a,b,label\n1,2,x\n3,4,y\n"}, True),
        ({"t.csv": "1,2,0\n3,4,1\n"}, True),  # no header
        ({"t.csv": ONE_CLASS}, False),
        ({"t.csv": "a,b,label\n1,2,1\n3,4,1.0\n5,6,01\n"}, False),  # one class, written three ways
        ({"t.csv": "a,b,label\n1,2,true\n3,4,TRUE\n"}, False),  # one class by meaning
        ({"t.csv": "a,b,label\n1,2,0\n3,4,1,\n"}, False),  # a row one field longer
        ({"t.csv": "a,b,label\n1,2,0\n3,4,1\n", "u.csv": "a,c,label\n1,2,0\n3,4,1\n"}, False),  # files disagree
        ({"t.csv": "a,a,label\n1,2,0\n3,4,1\n"}, False),  # a column named twice
        ({"t.csv": "a;b;label\n1;2;0\n3;4;1;\n"}, False),  # a trailing delimiter
        ({"t.csv": "label,a,class\nx,1,0\nx,2,1\n"}, False),  # 'label' is the class column: one class
        ({"t.csv": "a,b,label\n1,2,\n3,4,?\n5,6,1\n"}, False),  # missing markers are no class
    ],
)
def test_the_quick_pre_run_check_certifies_only_what_the_full_check_finds_fine(
    files: dict[str, str], fine: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from heteroflow.components.data import precheck

    src = tmp_path / "src"
    for name, text in files.items():
        _write(src, name, text)
    paths = sorted(src.iterdir())
    assert precheck._plainly_fine(paths, header="auto", delimiter="auto", label_column="") is fine
    with monkeypatch.context() as m:
        m.setattr(precheck, "_plainly_fine", lambda *a, **k: False)
        full = precheck.dataset_problems(str(src), {})
    assert precheck.dataset_problems(str(src), {}) == full  # what the check says is the full check's word
    if fine:
        assert full == []
    elif files == {"t.csv": ONE_CLASS}:
        assert "has 1 class ('healthy') in class column 'label'" in full[0]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_file_read_as_two_halves_is_the_file_read_in_one_stream(
    newline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #32 item 1: a large file is read as two halves on two threads (``arrowcsv._halves``); the frame is
    the one-stream read's, cell for cell: rows in order, an int column with gaps (float64 NaN), text values that
    first appear in the second half (the categories' order of first appearance), missing text cells."""
    rng = np.random.default_rng(7)
    n = 4000
    lines = ["id,count,x,kind,label"]
    for i in range(n):
        count = "" if i % 97 == 5 else str(int(rng.integers(0, 1000)))
        kind = "" if i % 89 == 3 else (f"late-{i % 5}" if i > n * 3 // 4 else f"k{i % 3}")
        lines.append(f"{i},{count},{rng.normal():.4f},{kind},{i % 2}")
    path = tmp_path / "t.csv"
    path.write_bytes((newline.join(lines) + newline).encode())
    halves = []
    real = arrowcsv._halves
    monkeypatch.setattr(arrowcsv, "_halves", lambda *a, **k: halves.append(real(*a, **k)) or halves[-1])
    monkeypatch.setattr(arrowcsv, "PARALLEL_BYTES", 1 << 10)
    monkeypatch.setattr(arrowcsv, "BLOCK_BYTES", 1 << 12)  # many blocks in each half
    monkeypatch.setattr(arrowcsv, "PARALLEL", True)
    monkeypatch.setattr(arrowcsv, "THREADED", False)  # the halves are a way of the streaming read
    split = read_table(path).frame
    assert halves == [n], "the file was read as two halves"
    monkeypatch.setattr(arrowcsv, "PARALLEL", False)
    serial = read_table(path).frame
    assert len(halves) == 1
    import pandas as pd

    pd.testing.assert_frame_equal(split, serial)
    monkeypatch.setattr(arrowcsv, "THREADED", True)
    pd.testing.assert_frame_equal(read_table(path).frame, serial)
    assert split["count"].isna().sum() == len(range(5, n, 97))
    assert list(split["kind"].cat.categories)[-5:] == [f"late-{k}" for k in (1, 2, 3, 4, 0)]


def test_the_transformation_is_the_same_file_in_a_process_that_imported_dill_first(digits_dir: Path, tmp_path: Path) -> None:
    """A new user's trial: the airflow engine archived a second version of a model kfp-local had archived, the same
    weights but another transform.joblib. Airflow imports dill before joblib, and joblib's pickler then copies
    dill's reducers: a slice was pickled as ``dill._dill._load_type`` (a file that needs dill to load). Preprocess
    in a process that imported dill first writes the same bytes as in one that did not."""
    pytest.importorskip("dill", reason="dill is installed with the airflow extra")
    code = (
        "import sys\n"
        "if sys.argv[1] == 'dill': import dill\n"
        "from heteroflow.components.data.preprocess import preprocess\n"
        "preprocess(sys.argv[2], sys.argv[3], num_workers=1)\n"
    )
    files = {}
    for how in ("plain", "dill"):
        out = tmp_path / how
        done = subprocess.run([sys.executable, "-c", code, how, str(digits_dir), str(out)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        files[how] = (out / "transform.joblib").read_bytes()
    assert b"dill" not in files["dill"]
    assert files["dill"] == files["plain"]
