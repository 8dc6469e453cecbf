"""Avro single-object encoding of framespool events (docs/design.md#encoding-and-schema-evolution).

Theory of operation
-------------------
A message is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's parsing canonical form + the ``schemaless_writer`` body.

1. At import, every ``schemas/avro/<Name>.avsc`` is read. Files reference other
   records by full name (``framespool.JobSpec``); the loader inlines a named
   type at its first use and leaves later uses as name references, which gives
   a standalone, standard Avro schema per event. Its canonical form is the one
   the Avro spec fingerprints: identical to fastavro's ``expand=True`` form
   whenever a named type is used once, and still standard when it is used twice.
2. ``schemas/avro/history/<Name>.v<N>.avsc`` are older writer schemas of the
   top-level event ``Name``. They must be self-contained (they freeze the nested
   records as they were), so their fingerprints never move when a current
   nested record grows.
3. The registry maps the 8 fingerprint bytes to (event name, writer schema,
   reader schema, builder). Current fingerprints read with no resolution; older
   ones are resolved against the current schema by fastavro, which fills the
   reader's defaults for fields the writer lacked.
4. Record <-> dict converters are built once per record from the Avro schema
   (the source of truth) and the dataclass of the same name: an ``attrgetter``
   for all fields plus converters for the few nested fields only (records,
   arrays -> tuples). No per-call reflection.

``decode`` raises only ``DecodeError`` for bad input; its ``reason`` is one of
``truncated`` (the bytes end before the header or the body is complete: the
reader asked for more bytes than were left), ``bad_magic``,
``unknown_fingerprint`` or ``malformed_body`` (anything else wrong with the
body, including trailing bytes).
"""

from __future__ import annotations

import copy
import json
import operator
import re
from collections.abc import Callable, Mapping
from io import BytesIO
from pathlib import Path
from typing import Any, NamedTuple

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from framespool.schemas.deadletter import DeadLetterReason
from framespool.schemas.events import EVENT_TYPES, NESTED_TYPES

AVRO_DIR = Path(__file__).resolve().parent / "avro"
HISTORY_DIR = AVRO_DIR / "history"
NAMESPACE = "framespool"
MAGIC = b"\xc3\x01"
HEADER_LEN = len(MAGIC) + 8

# DecodeError reasons: the codec's part of the dead-letter vocabulary.
TRUNCATED = DeadLetterReason.TRUNCATED
BAD_MAGIC = DeadLetterReason.BAD_MAGIC
UNKNOWN_FINGERPRINT = DeadLetterReason.UNKNOWN_FINGERPRINT
MALFORMED_BODY = DeadLetterReason.MALFORMED_BODY

_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
_HISTORY_FILE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[0-9]+)\.avsc$")

Converter = Callable[[Any], Any] | None  # None means "pass the value through"


class DecodeError(Exception):
    """The bytes are not a framespool event we can read; ``reason`` says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EncodeError(ValueError):
    """An event's field values do not fit its schema (a bug in the caller)."""


class SchemaError(Exception):
    """The ``.avsc`` files are inconsistent; raised at import, never at run time."""


# --------------------------------------------------------------------------
# Loading: raw .avsc JSON -> standalone schemas and fingerprints
# --------------------------------------------------------------------------
def _full_name(name: str, namespace: str) -> str:
    return name if "." in name else f"{namespace}.{name}"


def _standalone(
    node: Any, definitions: dict[str, dict], seen: set[str], namespace: str, where: str
) -> Any:
    """Copy ``node`` with each named type defined at its first use, named after."""
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return node
        full = _full_name(node, namespace)
        if full in seen:
            return full
        if full not in definitions:
            raise SchemaError(
                f"{where}: unknown type {node!r}; define it in its own "
                f".avsc (current schemas) or inline (history schemas)"
            )
        return _standalone(definitions[full], definitions, seen, namespace, where)
    if isinstance(node, list):
        return [_standalone(b, definitions, seen, namespace, where) for b in node]
    kind = node["type"]
    out = dict(node)
    if kind in ("record", "enum", "fixed"):
        full = _full_name(node["name"], node.get("namespace", namespace))
        if full in seen:
            raise SchemaError(f"{where}: named type {full} is defined twice")
        seen.add(full)
        out["name"] = full
        out.pop("namespace", None)
        inner_ns = full.rpartition(".")[0]
        if kind == "record":
            out["fields"] = [
                {**f, "type": _standalone(f["type"], definitions, seen, inner_ns, where)}
                for f in node["fields"]
            ]
    elif kind == "array":
        out["items"] = _standalone(node["items"], definitions, seen, namespace, where)
    elif kind == "map":
        out["values"] = _standalone(node["values"], definitions, seen, namespace, where)
    return out


def schema_fingerprint(schema: Any) -> int:
    """CRC-64-AVRO fingerprint of a standalone schema's parsing canonical form."""
    digest = _fastavro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
    return int.from_bytes(bytes.fromhex(digest), "little")


def _read_avsc(path: Path) -> dict:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _load_current() -> dict[str, dict]:
    """Raw record definitions by full name, one per ``<Name>.avsc``."""
    definitions: dict[str, dict] = {}
    for path in sorted(AVRO_DIR.glob("*.avsc")):
        raw = _read_avsc(path)
        full = _full_name(raw["name"], raw.get("namespace", NAMESPACE))
        if full != f"{NAMESPACE}.{path.stem}":
            raise SchemaError(f"{path.name} defines {full}; expected {NAMESPACE}.{path.stem}")
        definitions[full] = raw
    return definitions


# --------------------------------------------------------------------------
# Converters: dataclass <-> the dicts fastavro reads and writes
# --------------------------------------------------------------------------
class _Pair(NamedTuple):
    encode: Converter
    decode: Converter


_IDENTITY = _Pair(None, None)


def _record_pair(cls: type, fields: list[dict], field_pairs: list[_Pair]) -> _Pair:
    names = tuple(f["name"] for f in fields)
    # attrgetter of several names returns a tuple; of one name, a bare value
    getter = (
        operator.attrgetter(*names)
        if len(names) > 1
        else (lambda obj, get=operator.attrgetter(names[0]): (get(obj),))
    )
    enc_nested = tuple((n, p.encode) for n, p in zip(names, field_pairs) if p.encode)
    dec_nested = tuple((n, p.decode) for n, p in zip(names, field_pairs) if p.decode)

    def encode(obj: Any) -> dict:
        d = dict(zip(names, getter(obj)))
        for name, conv in enc_nested:
            d[name] = conv(d[name])
        return d

    def decode(d: dict) -> Any:
        for name, conv in dec_nested:
            d[name] = conv(d[name])
        return cls(**d)

    return _Pair(encode, decode)


def _array_pair(items: _Pair) -> _Pair:
    enc, dec = items
    # fastavro writes any sequence, so a tuple of primitives passes through.
    encode = None if enc is None else (lambda v: [enc(x) for x in v])
    decode = tuple if dec is None else (lambda v: tuple([dec(x) for x in v]))
    return _Pair(encode, decode)


def _map_pair(values: _Pair) -> _Pair:
    enc, dec = values
    encode = None if enc is None else (lambda v: {k: enc(x) for k, x in v.items()})
    decode = None if dec is None else (lambda v: {k: dec(x) for k, x in v.items()})
    return _Pair(encode, decode)


class _ConverterBuilder:
    """Builds (and memoizes) one converter pair per named record."""

    def __init__(self, definitions: dict[str, dict], classes: Mapping[str, type]) -> None:
        self._definitions = definitions
        self._classes = classes
        self._records: dict[str, _Pair] = {}

    def codec(self, full: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """The (encode, decode) pair of a top-level record: never a pass-through."""
        encode, decode = self.record(full)
        assert encode is not None and decode is not None, full
        return encode, decode

    def record(self, full: str) -> _Pair:
        if full not in self._records:
            raw = self._definitions[full]
            cls = self._classes.get(full)
            if cls is None:
                raise SchemaError(f"{full} has no dataclass in schemas/events.py")
            ns = full.rpartition(".")[0]
            pairs = [self.of(f["type"], ns) for f in raw["fields"]]
            self._records[full] = _record_pair(cls, raw["fields"], pairs)
        return self._records[full]

    def of(self, node: Any, namespace: str) -> _Pair:
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _IDENTITY
            return self.record(_full_name(node, namespace))
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            pairs = [self.of(b, namespace) for b in branches]
            if all(p == _IDENTITY for p in pairs):
                return _IDENTITY
            if len(branches) == 1 and len(node) == 2:
                return _Pair(
                    *(
                        None if c is None else (lambda v, c=c: None if v is None else c(v))
                        for c in pairs[0]
                    )
                )
            raise SchemaError(f"union {node}: only [\"null\", X] may hold a record or array")
        kind = node["type"]
        if kind == "record":
            full = _full_name(node["name"], node.get("namespace", namespace))
            self._definitions.setdefault(full, node)
            return self.record(full)
        if kind == "array":
            return _array_pair(self.of(node["items"], namespace))
        if kind == "map":
            return _map_pair(self.of(node["values"], namespace))
        if kind in _PRIMITIVES:
            return _IDENTITY
        raise SchemaError(f"type {kind!r} has no Python mapping in the codec")


# --------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------
class _Encoder(NamedTuple):
    header: bytes
    schema: Any  # parsed (fastavro's Schema)
    to_dict: Callable[[Any], Any]


class _Reader(NamedTuple):
    name: str
    label: str  # "SubmitJob" or "SubmitJob.v1"
    writer: Any  # parsed (fastavro's Schema)
    reader: Any  # parsed current schema when it differs from the writer, else None
    build: Callable[[Any], Any]


def _build_registry():
    definitions = _load_current()
    classes = {f"{NAMESPACE}.{c.__name__}": c for c in (*EVENT_TYPES, *NESTED_TYPES)}
    events_by_name: dict[str, type] = {c.__name__: c for c in EVENT_TYPES}
    missing = sorted(set(classes) - set(definitions))
    if missing:
        raise SchemaError(f"dataclasses without an .avsc in {AVRO_DIR}: {missing}")
    converters = _ConverterBuilder(definitions, classes)
    standalone: dict[str, dict] = {}
    fingerprints: dict[str, int] = {}
    encoders: dict[type, _Encoder] = {}
    readers: dict[bytes, _Reader] = {}
    for full, raw in definitions.items():
        short = full.rpartition(".")[2]
        standalone[short] = _standalone(raw, definitions, set(), NAMESPACE, f"{short}.avsc")
        fingerprints[short] = schema_fingerprint(standalone[short])
    cls: type | None
    for cls in EVENT_TYPES:
        name = cls.__name__
        parsed = parse_schema(standalone[name])
        fp = fingerprints[name].to_bytes(8, "little")
        encode, decode = converters.codec(f"{NAMESPACE}.{name}")
        encoders[cls] = _Encoder(MAGIC + fp, parsed, encode)
        readers[fp] = _Reader(name, name, parsed, None, decode)
    for path in sorted(HISTORY_DIR.glob("*.avsc")):
        match = _HISTORY_FILE.match(path.name)
        cls = events_by_name.get(match["name"]) if match else None
        if cls is None:
            raise SchemaError(
                f"history/{path.name}: expected <EventName>.v<N>.avsc "
                f"(history is kept for top-level events only)"
            )
        name, label, current = cls.__name__, path.name[: -len(".avsc")], encoders[cls]
        old = _standalone(_read_avsc(path), {}, set(), NAMESPACE, f"history/{path.name}")
        if old["name"] != f"{NAMESPACE}.{name}":
            raise SchemaError(f"history/{path.name} defines {old['name']}")
        fp = schema_fingerprint(old).to_bytes(8, "little")
        if fp in readers:
            raise SchemaError(
                f"history/{path.name} has the fingerprint of "
                f"{readers[fp].label}; delete one of them"
            )
        build = readers[current.header[2:]].build
        readers[fp] = _Reader(name, label, parse_schema(old), current.schema, build)
    return standalone, fingerprints, encoders, readers


_STANDALONE, _FINGERPRINTS, _ENCODERS, _READERS = _build_registry()


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------
def encode(event: Any) -> bytes:
    """Single-object encoding of one instance of an ``EVENT_TYPES`` class."""
    enc = _ENCODERS.get(type(event))
    if enc is None:
        raise TypeError(f"{type(event).__name__} is not an event type in framespool.schemas.events")
    fo = BytesIO()
    fo.write(enc.header)
    try:
        schemaless_writer(fo, enc.schema, enc.to_dict(event))
    except Exception as exc:  # fastavro reports bad values with assorted types
        raise EncodeError(
            f"cannot encode {type(event).__name__} "
            f"event_id={getattr(event, 'event_id', '?')!r}: {exc}"
        ) from exc
    return fo.getvalue()


def _reader_for(data: bytes | None) -> _Reader:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        if data is None:  # a Kafka tombstone: undecodable input, not a caller bug
            raise DecodeError(TRUNCATED, "no value (a tombstone?): 0 bytes")
        raise TypeError(f"decode takes bytes, not {type(data).__name__}")
    n = len(data)
    if data[:2] != MAGIC[:n]:
        raise DecodeError(BAD_MAGIC, f"expected magic c301, got {bytes(data[:2]).hex()}")
    if n < HEADER_LEN:
        raise DecodeError(TRUNCATED, f"{n} bytes: shorter than the {HEADER_LEN}-byte header")
    reader = _READERS.get(bytes(data[2:HEADER_LEN]))
    if reader is None:
        fp = int.from_bytes(data[2:HEADER_LEN], "little")
        raise DecodeError(
            UNKNOWN_FINGERPRINT,
            f"schema fingerprint {fp} is neither a current event schema "
            f"nor one in schemas/avro/history",
        )
    return reader


class _ShortReadProbe(BytesIO):
    """A BytesIO that remembers whether a read asked for more than was left."""

    ran_out = False

    def read(self, size: int | None = -1) -> bytes:
        out = super().read(size)
        if size is not None and 0 <= len(out) < size:
            self.ran_out = True
        return out


def _runs_out_of_bytes(data: bytes, reader: _Reader) -> bool:
    """Replay a failed read (error path only) to tell truncation from corruption.

    fastavro signals running out of bytes as EOFError or, inside a varint, as
    IndexError; a corrupt body can raise either too. A short read cannot lie.
    """
    probe = _ShortReadProbe(data)
    probe.seek(HEADER_LEN)
    try:
        schemaless_reader(probe, reader.writer, reader.reader)
    except Exception:  # the same failure as before; only the probe's flag matters
        pass
    return probe.ran_out


def decode(data: bytes | None) -> Any:
    """The frozen event dataclass for one single-object-encoded message. A record
    without a value (``None``, a Kafka tombstone) raises :class:`DecodeError` like
    any undecodable input, so readers may pass ``Record.value`` as it is."""
    if data is None:
        raise DecodeError(TRUNCATED, "no value (a tombstone?): 0 bytes")
    reader = _reader_for(data)
    fo = BytesIO(data)
    fo.seek(HEADER_LEN)
    try:
        record = schemaless_reader(fo, reader.writer, reader.reader)
    except Exception as exc:  # fastavro reports bad bodies with assorted types
        if _runs_out_of_bytes(data, reader):
            raise DecodeError(
                TRUNCATED, f"{reader.label} body ends early: {len(data)} bytes are not enough"
            ) from exc
        raise DecodeError(
            MALFORMED_BODY, f"{reader.label} body is malformed: {type(exc).__name__}: {exc}"
        ) from exc
    if fo.tell() != len(data):
        raise DecodeError(
            MALFORMED_BODY, f"{reader.label} body has {len(data) - fo.tell()} trailing bytes"
        )
    return reader.build(record)


def event_type_name(data: bytes | None) -> str:
    """The event type a message holds, from its fingerprint alone (body unread); a
    tombstone (``None``) raises :class:`DecodeError` as in :func:`decode`."""
    return _reader_for(data).name


def fingerprint(name: str) -> int:
    """Current fingerprint of the record ``name`` (e.g. ``"SubmitJob"``)."""
    try:
        return _FINGERPRINTS[name]
    except KeyError:
        raise KeyError(f"no schema named {name!r} in {AVRO_DIR}") from None


def schema(name: str) -> dict:
    """Current standalone schema of ``name`` (nested records inlined); a copy."""
    try:
        return copy.deepcopy(_STANDALONE[name])
    except KeyError:
        raise KeyError(f"no schema named {name!r} in {AVRO_DIR}") from None


def registered() -> dict[int, str]:
    """Every readable writer fingerprint -> ``"Name"`` or ``"Name.vN"`` (history)."""
    return {int.from_bytes(fp, "little"): r.label for fp, r in _READERS.items()}
