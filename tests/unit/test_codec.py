"""Single-object encoding: round trips, the fingerprint, and every way decode refuses."""

from __future__ import annotations

import dataclasses
import io
import json
import types
import typing
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint as fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas.codec import DecodeError, decode, encode, event_type_name

AVRO_DIR = Path(codec.__file__).resolve().parent / "avro"
LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text(max_size=12)


# --------------------------------------------------------------------------
# Strategies built from the type hints (one st.builds per class)
# --------------------------------------------------------------------------
def strategy_for(hint: typing.Any) -> st.SearchStrategy:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is str:
        return TEXT
    if hint is bool:
        return st.booleans()
    if hint is int:
        return LONG
    if hint is float:
        return st.floats(allow_nan=False)  # NaN != NaN would fail equality, not the codec
    if dataclasses.is_dataclass(hint):
        return builds(hint)
    if origin is tuple:
        return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(TEXT, strategy_for(args[1]), max_size=3)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | strategy_for(inner)
    raise AssertionError(f"no strategy for {hint!r}")


def builds(cls: type) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)})


def sample_start_run() -> ev.StartRun:
    spec = ev.JobSpec(
        job_id="job-1",
        tenant="acme",
        user="ana",
        tier="paid",
        prompt="a cat, 4k",
        params={"seed": "42", "fps": "24"},
        gpus=16,
        gpus_per_node=8,
        estimate_s=900.5,
        shapes=(
            ev.Shape(gpus=16, gpus_per_node=8, estimate_s=900.5),
            ev.Shape(gpus=8, gpus_per_node=8, estimate_s=1700.0),
        ),
        preemptible=True,
        checkpoint_interval_s=120.0,
        gpu_type="H200",
        callback_url="https://example.test/hook",
        submitted_ms=1_764_460_800_000,
    )
    placement = (
        ev.NodeSlice(node_id="node-1", gpus=(0, 1, 2, 3, 4, 5, 6, 7)),
        ev.NodeSlice(node_id="node-2", gpus=(0, 1, 2, 3, 4, 5, 6, 7)),
    )
    return ev.StartRun(
        event_id="cell-0:17:0",
        ts_ms=1_764_460_801_000,
        node_id="node-1",
        incarnation=3,
        run=2,
        spec=spec,
        gpus=(0, 1, 2, 3, 4, 5, 6, 7),
        placement=placement,
        estimate_s=900.5,
        resume_from="s3://ckpt/job-1/1",
    )


def sample_tick() -> ev.Tick:
    return ev.Tick(event_id="clock:cell-0:1", ts_ms=1_000, cell="cell-0", now_ms=1_000)


SAMPLES = [
    sample_start_run(),
    sample_tick(),
    ev.SubmitJob(event_id="s-1", ts_ms=5, spec=ev.JobSpec(job_id="j", tenant="t")),
    ev.NodeHeartbeat(
        event_id="h-1",
        ts_ms=9,
        node_id="node-1",
        incarnation=1,
        gpus=(ev.GpuHealth(index=0, warm_models=("demo:1",)),),
        runs=(ev.RunReport(job_id="j", run=1, step_rate=2.5),),
    ),
]


# --------------------------------------------------------------------------
# Fingerprints and framing
# --------------------------------------------------------------------------
def test_null_fingerprint_is_the_spec_test_vector():
    assert codec.schema_fingerprint("null") == 7195948357588979594


def parse_nested_expanded() -> dict:
    """Named schemas of the nested records, each itself parsed with expand=True.

    Parsing them without expand leaves JobSpec's ``framespool.Shape`` a bare
    reference that a later expand=True does not follow (fastavro expands one
    level), and SubmitJob's canonical form would not define Shape at all.
    """
    named: dict = {}
    nested = {c.__name__ for c in ev.NESTED_TYPES}
    pending = [
        json.loads(p.read_text()) for p in sorted(AVRO_DIR.glob("*.avsc")) if p.stem in nested
    ]
    while pending:  # nested records may reference each other: parse in dependency order
        done = []
        for raw in pending:
            try:
                parse_schema(raw, named, expand=True)
            except Exception:
                continue
            done.append(raw)
        assert done, "nested schemas reference an unknown type"
        pending = [r for r in pending if r not in done]
    return named


NESTED_EXPANDED = parse_nested_expanded()


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
def test_fingerprint_matches_fastavro_expand_true(cls):
    """The recipe of docs/broker-notes.md#fastavro-single-object-encoding, with every level expanded, gives the codec's fingerprint."""
    raw = json.loads((AVRO_DIR / f"{cls.__name__}.avsc").read_text())
    expanded = parse_schema(raw, dict(NESTED_EXPANDED), expand=True)
    hex_le = fastavro_fingerprint(to_parsing_canonical_form(expanded), "CRC-64-AVRO")
    assert codec.fingerprint(cls.__name__) == int.from_bytes(bytes.fromhex(hex_le), "little")


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
def test_canonical_form_is_self_contained(cls):
    """Every named type the fingerprinted text uses is defined in it."""
    canonical = to_parsing_canonical_form(codec.schema(cls.__name__))
    parse_schema(json.loads(canonical), {})  # raises UnknownType on a dangling name


def test_named_type_used_twice_is_defined_once_in_the_canonical_form():
    definitions = {
        "framespool.A": {
            "type": "record",
            "name": "A",
            "namespace": "framespool",
            "fields": [{"name": "x", "type": "long"}],
        }
    }
    raw = {
        "type": "record",
        "name": "B",
        "namespace": "framespool",
        "fields": [{"name": "a", "type": "framespool.A"}, {"name": "b", "type": "A"}],
    }
    standalone = codec._standalone(raw, definitions, set(), "framespool", "test")
    canonical = to_parsing_canonical_form(standalone)
    assert canonical == (
        '{"name":"framespool.B","type":"record","fields":[{"name":"a","type":'
        '{"name":"framespool.A","type":"record","fields":[{"name":"x",'
        '"type":"long"}]}},{"name":"b","type":"framespool.A"}]}'
    )


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_header_is_magic_then_little_endian_fingerprint(event):
    data = encode(event)
    name = type(event).__name__
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.fingerprint(name).to_bytes(8, "little")
    assert event_type_name(data) == name


def test_every_event_fingerprint_is_distinct_and_registered():
    fps = {cls.__name__: codec.fingerprint(cls.__name__) for cls in ev.EVENT_TYPES}
    assert len(set(fps.values())) == len(fps)
    registered = codec.registered()
    assert all(registered[fp] == name for name, fp in fps.items())


def test_schema_returns_a_copy():
    codec.schema("Tick")["fields"].clear()
    assert codec.schema("Tick")["fields"]
    assert decode(encode(sample_tick())) == sample_tick()


def test_unknown_names_raise_key_error():
    with pytest.raises(KeyError):
        codec.fingerprint("NoSuchEvent")
    with pytest.raises(KeyError):
        codec.schema("NoSuchEvent")


# --------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_event_type(cls, data):
    event = data.draw(builds(cls))
    assert decode(encode(event)) == event


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip_samples(event):
    assert decode(encode(event)) == event


def test_decoded_collections_have_the_dataclass_types():
    run = decode(encode(sample_start_run()))
    assert isinstance(run, ev.StartRun)
    assert isinstance(run.gpus, tuple)
    assert isinstance(run.placement, tuple) and isinstance(run.placement[0], ev.NodeSlice)
    assert isinstance(run.placement[0].gpus, tuple)
    assert isinstance(run.spec, ev.JobSpec)
    assert isinstance(run.spec.shapes, tuple) and isinstance(run.spec.shapes[0], ev.Shape)
    assert run.spec.params == {"seed": "42", "fps": "24"} and isinstance(run.spec.params, dict)
    beat = decode(encode(SAMPLES[3]))
    assert isinstance(beat.gpus[0].warm_models, tuple)


def test_decode_accepts_bytearray_and_memoryview():
    data = encode(sample_tick())
    assert decode(bytearray(data)) == sample_tick()
    assert decode(memoryview(data)) == sample_tick()


def test_encode_refuses_what_is_not_an_event():
    with pytest.raises(TypeError):
        encode(ev.JobSpec(job_id="j", tenant="t"))  # nested record, not an event
    with pytest.raises(TypeError):
        encode({"event_id": "x"})


@pytest.mark.parametrize(
    "event",
    [
        dataclasses.replace(sample_tick(), ts_ms="soon"),
        dataclasses.replace(sample_tick(), now_ms=2**63),
        dataclasses.replace(sample_tick(), cell="\ud800"),  # a lone surrogate is not UTF-8
        dataclasses.replace(sample_tick(), cell=None),
    ],
    ids=["str-for-long", "long-overflow", "surrogate", "none-for-string"],
)
def test_encode_reports_bad_values_as_encode_error(event):
    with pytest.raises(codec.EncodeError, match="Tick"):
        encode(event)


# --------------------------------------------------------------------------
# Decode refusals
# --------------------------------------------------------------------------
def reason_of(data: bytes) -> str:
    with pytest.raises(DecodeError) as info:
        decode(data)
    assert str(info.value), "a DecodeError carries a human message"
    return info.value.reason


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_proper_prefix_is_truncated(event):
    data = encode(event)
    for n in range(len(data)):
        assert reason_of(data[:n]) == "truncated", f"prefix of {n} bytes"


def test_event_type_name_needs_only_the_header():
    data = encode(sample_start_run())
    assert event_type_name(data[:10]) == "StartRun"
    for n in range(10):
        with pytest.raises(DecodeError) as info:
            event_type_name(data[:n])
        assert info.value.reason == "truncated"


@pytest.mark.parametrize(
    "data",
    [b"\x00", b"\xc3\x00", b"\x01\xc3" + bytes(8), b"Obj\x01" + bytes(20), b"{\"event_id\": 1}"],
)
def test_wrong_magic(data):
    assert reason_of(data) == "bad_magic"
    with pytest.raises(DecodeError):
        event_type_name(data)


def test_unknown_fingerprint():
    data = b"\xc3\x01" + codec.schema_fingerprint("null").to_bytes(8, "little") + b"\x00"
    assert reason_of(data) == "unknown_fingerprint"
    with pytest.raises(DecodeError) as info:
        event_type_name(data)
    assert info.value.reason == "unknown_fingerprint"


def header(name: str) -> bytes:
    return b"\xc3\x01" + codec.fingerprint(name).to_bytes(8, "little")


def test_trailing_bytes_are_a_malformed_body():
    assert reason_of(encode(sample_tick()) + b"\x00") == "malformed_body"


def test_invalid_utf8_is_a_malformed_body():
    body = b"\x04\xff\xfe" + b"\x02" + b"\x02x" + b"\x02"  # event_id = ff fe
    assert reason_of(header("Tick") + body) == "malformed_body"


def test_union_branch_out_of_range_is_a_malformed_body():
    fo = io.BytesIO()
    writer = parse_schema(codec.schema("SubmitJob"))
    schemaless_writer(
        fo, writer, {"event_id": "e", "ts_ms": 1, "spec": {"job_id": "j", "tenant": "t"}}
    )
    body = fo.getvalue()
    assert body[-1:] == b"\x00"  # idempotency_key: branch 0 (null)
    assert decode(header("SubmitJob") + body).idempotency_key is None
    assert reason_of(header("SubmitJob") + body[:-1] + b"\x08") == "malformed_body"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_another_exception(data):
    try:
        decode(data)
    except DecodeError as exc:
        assert exc.reason in {"truncated", "bad_magic", "unknown_fingerprint", "malformed_body"}


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from([c.__name__ for c in ev.EVENT_TYPES]), body=st.binary(max_size=96))
def test_garbage_body_behind_a_valid_header(name, body):
    try:
        event = decode(header(name) + body)
    except DecodeError as exc:
        assert exc.reason in {"truncated", "malformed_body"}
    else:
        assert type(event).__name__ == name


def test_negative_length_is_a_malformed_body():
    body = b"\x01" + b"x" * 20  # event_id length -1
    assert reason_of(header("Tick") + body) == "malformed_body"


def test_length_beyond_the_end_is_truncated():
    body = b"\xfe\xff\xff\xff\x0f" + b"x" * 20  # event_id claims 2**31 - 1 bytes
    assert reason_of(header("Tick") + body) == "truncated"


def test_a_tombstone_is_undecodable_input_and_a_str_is_a_caller_bug():
    assert reason_of(None) == "truncated"
    with pytest.raises(TypeError):
        decode(encode(sample_tick()).hex())


def test_converters_for_optional_and_single_field_records():
    """Shapes today's schemas do not use yet: ["null", record] and a one-field record."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Box:
        shape: ev.Shape | None = None

    defs = {
        "framespool.Box": {
            "type": "record",
            "name": "Box",
            "namespace": "framespool",
            "fields": [{"name": "shape", "default": None, "type": ["null", "framespool.Shape"]}],
        },
        "framespool.Shape": json.loads((AVRO_DIR / "Shape.avsc").read_text()),
    }
    classes = {"framespool.Box": Box, "framespool.Shape": ev.Shape}
    pair = codec._ConverterBuilder(defs, classes).record("framespool.Box")
    shape = ev.Shape(gpus=2, gpus_per_node=1, estimate_s=5.0)
    assert pair.encode(Box(shape=shape)) == {
        "shape": {"gpus": 2, "gpus_per_node": 1, "estimate_s": 5.0}
    }
    assert pair.decode(pair.encode(Box(shape=shape))) == Box(shape=shape)
    assert pair.decode(pair.encode(Box())) == Box()
