"""What every ``heteroflow`` command shares: the consoles, the one-line error (``error: ...``, exit 2), warnings as
one line, ``--param``-style ``NAME=VALUE`` pairs, and ``--pipeline`` (the pipeline a command works on).

Used by :mod:`heteroflow.pipelines.cli.main` and the command modules it registers.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from heteroflow.components.errors import InvalidParameter, InvalidResources
from heteroflow.components.resources import Candidates

__all__ = ["console", "err_console", "print_table", "whole_cells"]

console = Console(soft_wrap=True)  # paths and messages stay on one line when piped; tables still fit
err_console = Console(stderr=True, soft_wrap=True)  # one error, one line, whatever the terminal width


def _fail(exc: BaseException) -> None:
    """Print ``error: <message>`` (one line; a message that lists several problems as ``- `` bullets keeps them,
    one per line) and exit 2."""
    from heteroflow.cache.redact import redact_url

    text = str(exc)
    if "\n- " in text and not isinstance(exc, OSError):
        first, *rest = redact_url(text).split("\n")
        err_console.print(f"[bold red]error:[/] {escape(' '.join(first.split()))}", highlight=False)
        for line in rest:
            err_console.print(escape(line.rstrip()), highlight=False)
    else:
        err_console.print(f"[bold red]error:[/] {escape(_one_line(exc))}", highlight=False)
    raise typer.Exit(code=2)


def _one_line(exc: BaseException) -> str:
    from heteroflow.cache.redact import redact_url

    if isinstance(exc, OSError) and exc.filename is not None:
        reason = exc.strerror or type(exc).__name__
        return redact_url(f"cannot use {exc.filename}: {reason}")
    return redact_url(" ".join(str(exc).split()))


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None) -> None:
    """Warnings as one ``warning:`` line on stderr (no file and line of the code that warned), redacted."""
    from heteroflow.cache.redact import redact_url

    err_console.print(f"[yellow]warning:[/] {escape(redact_url(' '.join(str(message).split())))}", highlight=False)


def flags_show_no_type() -> None:
    """A flag takes no value, so its ``--help`` row names none. typer 0.29's rich help writes a type after every
    option (``TyperOption.display_type_rich``), flags too: ``--verbose  <bool>``, ``--help  <bool>``, where click's
    plain help and typer's own ``get_help_record`` write nothing for a flag or a counter. This wraps that method
    once so that a flag or a counter shows no type; every other option keeps typer's (``<path>``, ``<int>``). A
    typer without the method (older or newer) is left as it is. Called by :mod:`heteroflow.pipelines.cli.main`,
    which builds the app every ``--help`` renders, plugin groups included."""
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_flags_show_no_type", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) or getattr(self, "count", False):
            return None
        return original(self, ctx)

    display_type_rich._flags_show_no_type = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def fit_columns(target: Console, headers: list[str], rows: list[list[str]], drop_order: list[str],
                wrap: dict[str, int] | None = None, *, header_words: bool = False) -> tuple[list[int], list[str]]:
    """Which columns of a table fit ``target``'s width, the way ``kubectl get`` shows its short form and keeps the
    rest for ``-o wide``: columns named in ``drop_order`` are hidden, first named first, until every kept cell
    fits (rich's box: 3 characters per column plus 1; a column named in ``wrap`` may wrap down to its given width);
    where that is not enough, the columns ``drop_order`` does not name are hidden too, the rightmost first, all but
    the first column. A column is hidden whole or shown with its cells whole, never drawn zero wide. Only on a
    terminal: piped output (a script, a file) keeps every column.

    Args:
        target: the console the table prints to (its ``width`` and ``is_terminal``).
        headers: the column names, in order.
        rows: the cells as printed (strings), one list per row, ``len(headers)`` each.
        drop_order: the columns hidden first, least useful first; the others (but the first column) only where
            hiding all of these is not enough.
        wrap: column name -> the narrowest it may wrap to (characters); other columns count at their widest cell.
        header_words: headers may wrap between their words: a column is at least its header's longest word wide
            (else its whole header).

    Returns:
        ``(kept, hidden)``: the kept columns' indexes in ``headers`` order, and the hidden columns' names.
    """
    kept = list(range(len(headers)))
    hidden: list[str] = []
    if not target.is_terminal:
        return kept, hidden

    def floor(i: int) -> int:
        return max(map(len, headers[i].split())) if header_words and headers[i].strip() else len(headers[i])

    def needed(cols: list[int]) -> int:
        widest = {i: max([floor(i)] + [len(r[i]) for r in rows]) for i in cols}
        return 1 + sum(3 + min(widest[i], max((wrap or {}).get(headers[i], widest[i]), floor(i))) for i in cols)

    for name in drop_order:
        if needed(kept) <= target.width:
            break
        if name in headers and headers.index(name) in kept:
            kept.remove(headers.index(name))
            hidden.append(name)
    # still too wide (a cell longer than the caller planned for: a 77-character run id of the Airflow engine): the
    # other columns go too, the rightmost first, all but the first (what names the row); rich drew them zero wide
    # (`┳┳┓`, `│││`) and the note did not count them
    for i in reversed(range(1, len(headers))):
        if needed(kept) <= target.width:
            break
        if i in kept:
            kept.remove(i)
            hidden.append(headers[i])
    # a column hidden early may fit again once a wider one went after it: the most useful first
    for name in reversed(list(hidden)):
        trial = sorted(kept + [headers.index(name)])
        if needed(trial) <= target.width:
            kept = trial
            hidden.remove(name)
    return kept, [h for h in headers if h in hidden]  # in the table's order


def whole_cells(table: Any) -> Any:
    """``table`` (a rich ``Table``) with no cell cut: each column that would end a cell too wide for it with ``…``
    (rich's default overflow) folds it over more lines instead; a column given another overflow keeps it."""
    for column in table.columns:
        if column.overflow == "ellipsis":
            column.overflow = "fold"
    return table


def print_table(target: Console, table: Any, headers: list[str], rows: list[list[str]]) -> None:
    """Print ``table`` (of ``headers`` and ``rows``, as :func:`fit_columns` saw them) on a terminal, at its width,
    every cell whole (:func:`whole_cells`: a cell wider than its column folds over lines, never ends in ``…``).
    Piped, print ``headers`` and ``rows`` as plain columns instead, as ``kubectl get`` does: a header line, then one
    line per row, every column whole and left-aligned, two spaces between columns, no title or box, whatever
    ``COLUMNS`` says; so ``| head -3`` shows two rows and ``grep`` or ``awk`` reads whole cells."""
    if target.is_terminal:
        from rich.measure import Measurement

        if (len(table.columns) == 1 and table.show_edge
                and Measurement.get(target, target.options.update_width(10_000), table).minimum > target.width):
            # one column left (fit_columns hid the rest) and still wider than the box (a 77-character run id at 80
            # columns): no outer edge, which gives it 2 more characters, rather than a line the terminal wraps
            table.show_edge = False
        target.print(whole_cells(table))
        return
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        text = "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
        target.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)


def hidden_note(hidden: list[str], width: int, more: str = "--json has all") -> str:
    """``3 columns hidden at 80 columns: pipeline, error, fallbacks (a wider terminal shows them; --json has all)``;
    ``more`` names where else the hidden values are."""
    return (f"{len(hidden)} column{'s' if len(hidden) != 1 else ''} hidden at {width} columns: {', '.join(hidden)} "
            f"(a wider terminal shows them; {more})")


def _parse_pairs(pairs: list[str], *, option: str = "--param") -> dict[str, str]:
    from heteroflow.components.core.keys import parse_pairs  # a name given twice is an error (#16.17)

    return parse_pairs(pairs, option=option)


_PIPELINE_OPTION = typer.Option(
    "--pipeline",
    help="Your pipeline instead of the default: module:attribute of a heteroflow Pipeline, or of a function "
    "returning one (the module must be importable, e.g. on PYTHONPATH).",
)


def _pipeline(ref: str | None, candidate: list[str] | None = None) -> Any:
    """The pipeline a command works on: ``--pipeline`` or the default (with ``-c`` train candidates)."""
    if ref:
        from heteroflow.pipelines.graph import load_pipeline

        pipeline = load_pipeline(ref)
        if candidate:
            raise InvalidParameter("-c/--candidate applies to the default pipeline; set candidates in your pipeline")
        return pipeline
    from heteroflow.pipelines.default import default_pipeline

    try:
        candidates = Candidates(candidate) if candidate else None
    except (InvalidParameter, InvalidResources) as exc:  # say which option the user got wrong
        raise type(exc)(f"-c/--candidate: {exc}") from None
    return default_pipeline(train_candidates=candidates)
