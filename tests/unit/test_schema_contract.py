"""The ``.avsc`` files and the dataclasses in ``framespool.schemas.events`` are one contract.

For every class in ``EVENT_TYPES`` and ``NESTED_TYPES`` its ``schemas/avro/<Name>.avsc``
has the same fields, in the same order, with the mapped types and the same
defaults; and every ``.avsc`` has its class.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest

from framespool.schemas import codec
from framespool.schemas.events import EVENT_TYPES, NESTED_TYPES

AVRO_DIR = Path(codec.__file__).resolve().parent / "avro"
ALL_TYPES = (*EVENT_TYPES, *NESTED_TYPES)
NO_DEFAULT = object()


def expected_avro_type(hint: typing.Any) -> typing.Any:
    """The Avro type a Python annotation maps to (docs/design.md#encoding-and-schema-evolution, schemas/codec.py)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is str:
        return "string"
    if hint is bool:
        return "boolean"
    if hint is int:
        return "long"
    if hint is float:
        return "double"
    if dataclasses.is_dataclass(hint):
        return f"framespool.{hint.__name__}"
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return {"type": "array", "items": expected_avro_type(args[0])}
    if origin is dict and args[0] is str:
        return {"type": "map", "values": expected_avro_type(args[1])}
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        (inner,) = [a for a in args if a is not type(None)]
        return ["null", expected_avro_type(inner)]
    raise AssertionError(f"annotation {hint!r} has no Avro mapping; extend the codec first")


def python_default(f: dataclasses.Field) -> typing.Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return NO_DEFAULT


def same_default(py: typing.Any, avro: typing.Any) -> bool:
    """Equal as values and as kinds (``False == 0`` must not pass)."""
    if isinstance(py, tuple):
        return isinstance(avro, list) and list(py) == avro
    if isinstance(py, bool) or isinstance(avro, bool):
        return py is avro
    if isinstance(py, float):
        return isinstance(avro, (int, float)) and float(avro) == py
    return type(py) is type(avro) and py == avro


def load(name: str) -> dict:
    return json.loads((AVRO_DIR / f"{name}.avsc").read_text(encoding="utf-8"))


def test_every_avsc_has_a_class_and_every_class_an_avsc():
    files = {p.stem for p in AVRO_DIR.glob("*.avsc")}
    classes = {c.__name__ for c in ALL_TYPES}
    assert files - classes == set(), "an .avsc without a dataclass in schemas/events.py"
    assert classes - files == set(), "a dataclass without its schemas/avro/<Name>.avsc"


def test_event_and_nested_types_are_disjoint():
    assert not set(EVENT_TYPES) & set(NESTED_TYPES)


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
def test_record_header(cls):
    raw = load(cls.__name__)
    assert raw["type"] == "record"
    assert raw["name"] == cls.__name__
    assert raw["namespace"] == "framespool"
    assert isinstance(raw.get("doc"), str) and raw["doc"].strip(), "every record has a doc"


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
def test_fields_match_dataclass(cls):
    raw = load(cls.__name__)
    hints = typing.get_type_hints(cls)
    py_fields = dataclasses.fields(cls)
    assert [f["name"] for f in raw["fields"]] == [f.name for f in py_fields], "names or order"
    for avro_field, py_field in zip(raw["fields"], py_fields):
        where = f"{cls.__name__}.{py_field.name}"
        assert avro_field["type"] == expected_avro_type(hints[py_field.name]), where
        py = python_default(py_field)
        if py is NO_DEFAULT:
            assert "default" not in avro_field, f"{where}: Avro default without a Python one"
        else:
            assert "default" in avro_field, f"{where}: Python default {py!r} missing in .avsc"
            assert same_default(py, avro_field["default"]), (
                f"{where}: Python default {py!r} != Avro default {avro_field['default']!r}"
            )


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
def test_optional_fields_default_to_null(cls):
    for f in load(cls.__name__)["fields"]:
        if isinstance(f["type"], list):
            assert f["type"][0] == "null" and f.get("default", NO_DEFAULT) is None, (
                f"{cls.__name__}.{f['name']}: a union is [\"null\", X] with default null"
            )


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_events_start_with_event_id_and_ts_ms(cls):
    names = [f["name"] for f in load(cls.__name__)["fields"]]
    assert names[:2] == ["event_id", "ts_ms"]


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
def test_codec_schema_is_the_file_with_named_types_inlined(cls):
    raw, standalone = load(cls.__name__), codec.schema(cls.__name__)
    assert standalone["name"] == f"framespool.{cls.__name__}"
    assert [f["name"] for f in standalone["fields"]] == [f["name"] for f in raw["fields"]]
    assert [f.get("default", NO_DEFAULT) for f in standalone["fields"]] == [
        f.get("default", NO_DEFAULT) for f in raw["fields"]
    ]
