"""One rule for every list of keys a user writes: a key given twice is an error, never "the last one wins".

Where it applies (issue #16.17): candidate specs (``-c cpu:cpu=2,cpu=4``), the CLI's ``NAME=VALUE`` options
(``--param``, ``--input``, ``--output``), and the YAML or JSON files a user writes (cluster profiles, device
inventories). YAML 1.2 (section 3.2.1.1) and RFC 8259 (section 4) both say mapping keys "should be unique", but
PyYAML and Python's ``json`` silently keep the last value; this module refuses instead, naming the key, both
values or lines, and the place it was written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = ["DuplicateKey", "first_duplicate", "load_yaml", "parse_pairs", "not_utf8", "unique_object", "yaml_problem"]


class DuplicateKey(InvalidParameter):
    """A key is given twice in one list or mapping; the message names the key, both values (or lines) and where."""


def first_duplicate(items: Iterable[Any]) -> tuple[int, int] | None:
    """The positions ``(first, second)`` of the first item that equals an earlier one, or ``None``.

    Every list check that refuses a duplicate uses it, so that its message can name the duplicate and both
    positions rather than only say "twice" (issue #28.21).
    """
    seen: dict[Any, int] = {}
    for i, item in enumerate(items):
        if item in seen:
            return seen[item], i
        seen[item] = i
    return None


def parse_pairs(pairs: Iterable[str], *, option: str = "--param", example: str = "epochs=3") -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}`` (names and values stripped of surrounding blanks).

    Args:
        pairs: the ``NAME=VALUE`` texts as given, one per repetition of the option.
        option: the option's name, for messages (``--param``, ``--input``, ``--output``).
        example: a valid ``NAME=VALUE`` shown in messages.

    Raises:
        InvalidParameter: an item is not ``NAME=VALUE`` with a non-empty name.
        DuplicateKey: a name is given twice (even with the same value: one of them is a slip).
    """
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise InvalidParameter(f"{option} {pair!r} is not NAME=VALUE (e.g. {option} {example})")
        if name in out:
            raise DuplicateKey(
                f"{option} {name} is given twice ({name}={out[name]} and {name}={value}); give each name once"
            )
        out[name] = value
    return out


def unique_object(where: str):  # type: ignore[no-untyped-def]
    """A ``json.loads(..., object_pairs_hook=unique_object(where))`` hook that refuses a key given twice in one
    JSON object (Python's ``json`` keeps the last one silently).

    Raises (from ``json.loads``):
        DuplicateKey: names the key, both values and ``where``.
    """

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise DuplicateKey(f"{where}: key {key!r} is given twice ({out[key]!r} and {value!r}); give each key once")
            out[key] = value
        return out

    return hook


def load_yaml(text: str, *, where: str) -> Any:
    """Parse YAML (or JSON) like ``yaml.safe_load``, but refuse a mapping key given twice.

    Merge keys (``<<: *defaults``) may still be overridden by the mapping's own keys, as YAML intends.

    Args:
        text: the document.
        where: what the text is (``cluster profile p.yaml``), for messages.

    Raises:
        DuplicateKey: a key is given twice in one mapping (the message gives both line numbers).
        yaml.YAMLError: not valid YAML.
    """
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first_line:
                        raise DuplicateKey(
                            f"{where}: key {key!r} is given twice (lines {first_line[key]} and {line}); "
                            "give each key once"
                        )
                    first_line[key] = line
                except TypeError:  # an unhashable key: safe_load rejects it with its own message
                    continue
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(exc: BaseException) -> str:
    """A PyYAML error on one line, where a user looks for it: ``line 2, column 5: mapping values are not allowed here
    (while scanning a simple key at line 1, column 1)``. PyYAML's own text spans several lines, names the text
    ``"<unicode string>"`` (it was parsed from a string, not the file) and counts as the editor does, from 1; its
    marks count from 0 (``Mark.line``, ``Mark.column``). Anything that is not a marked YAML error: its text on one line.
    """
    problem = getattr(exc, "problem", None)
    if not problem:
        return " ".join(str(exc).split())

    def at(mark: object) -> str:
        return f"line {getattr(mark, 'line', 0) + 1}, column {getattr(mark, 'column', 0) + 1}"

    mark, context, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context", None), getattr(exc, "context_mark", None)
    text = (f"{at(mark)}: " if mark is not None else "") + problem
    if context:
        text += f" ({context}" + (f" at {at(context_mark)}" if context_mark is not None else "") + ")"
    return " ".join(text.split())


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What a file that is not UTF-8 text gets told, for a message that names the file: ``not UTF-8 text (byte 0xff
    at offset 5); save it as UTF-8``. ``offset``: bytes from the start of the file, counted from 0 as ``UnicodeDecodeError.start`` counts."""
    byte = exc.object[exc.start:exc.start + 1]
    return f"not UTF-8 text (byte 0x{byte.hex() or '??'} at offset {exc.start}); save it as UTF-8"
