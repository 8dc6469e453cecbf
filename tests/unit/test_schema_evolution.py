"""Old writer schemas stay readable (docs/design.md#encoding-and-schema-evolution:
schemas only grow).

``schemas/avro/history/<Name>.v<N>.avsc`` freezes what an event looked like
before it changed. Messages framed with such a fingerprint decode into today's
dataclass, fields the writer lacked taking the reader's defaults.

Changing an event schema (or a nested record it uses):
1. copy the event's current standalone schema (``codec.schema(name)``) to
   ``history/<Name>.v<N>.avsc`` before editing;
2. give every new field a default;
3. add the new fingerprint to ``PUBLISHED`` below; never remove one.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError

from framespool.schemas import codec
from framespool.schemas import events as ev
from framespool.schemas.causes import RunCause

HISTORY_DIR = Path(codec.__file__).resolve().parent / "avro" / "history"
HISTORY_FILES = sorted(HISTORY_DIR.glob("*.avsc"))

# Every writer fingerprint that may be in a log somewhere -> its event type.
PUBLISHED: dict[int, str] = {
    8475562237568431756: "ProcessorConfigured",
    15470063863479061884: "BeginRun",
    1449332226969916357: "BreakerTripped",
    5950304651811157114: "CancelJob",
    3992447068728216982: "CellStatus",
    13222358012203505010: "CellOffer",
    8531952309526037772: "CellOffer",  # v2, before TierBacklog.fair_gpu_s
    3777272075834501056: "CellOffer",
    4347331174392688626: "JobRerouted",  # v1, before resume_from
    2743375956041810172: "JobRerouted",
    16670860553661131631: "CheckpointRun",
    5705835224117532517: "JobAdmitted",  # v1, before run and resume_from
    14886996547017134977: "JobAdmitted",
    410677305261948217: "JobAssigned",
    11590368638228278672: "JobCancelled",
    11409721385229893718: "JobCompleted",
    14039620250252508977: "JobFailed",  # v1, before cause
    11337470190741820709: "JobFailed",
    12655476728794218687: "JobPreempted",
    6330376819410712608: "JobQueued",  # v1, before wait_p50_s/wait_p90_s
    5421707228969922155: "JobQueued",  # v2, before reason_code
    5625604532350092095: "JobQueued",
    3255541121579035984: "JobRejected",
    4184484722552005384: "JobRequeued",  # v1, before cause and failure_class
    10664622816892659894: "JobRequeued",
    5600814957622728919: "JobWaitEstimated",  # v1, before wait_p50_s/wait_p90_s
    1223824917002093173: "JobWaitEstimated",  # v2, before reason_code
    7364240666948115945: "JobWaitEstimated",
    10334197358283290359: "NodeHeartbeat",  # v1, before runs
    2097034915834626238: "NodeHeartbeat",
    17100172342302756222: "NodeRegistered",
    225445061635241931: "NodeStateChanged",
    2713283913142138838: "ReportIgnored",
    6810633244687506476: "ReportIgnored",
    6268029967876228540: "RunCheckpointed",  # v1, before step
    525678026398429116: "RunCheckpointed",  # v2, before size_bytes
    1891095845874224698: "RunCheckpointed",
    3549295491678464021: "RunCompleted",
    346797318825563378: "RunFailed",
    13215469610589694338: "RunProgress",  # v1, before phase
    17684412150108126202: "RunProgress",
    12985183337708829204: "RunStarted",
    4386090155483056073: "RunStopped",
    14123273196169535750: "StartRun",
    17705117326070474944: "StopRun",
    17313048942763823760: "SubmitJob",  # v1, JobSpec before shapes/gpu_type/callback_url
    17702116534467155230: "SubmitJob",
    11053332663211720620: "Tick",
}


# --------------------------------------------------------------------------
# Helpers over standalone schemas (named types defined at first use)
# --------------------------------------------------------------------------
def named_types(node: Any, out: dict[str, dict] | None = None) -> dict[str, dict]:
    out = {} if out is None else out
    if isinstance(node, list):
        for branch in node:
            named_types(branch, out)
    elif isinstance(node, dict):
        if node["type"] == "record":
            out[node["name"]] = node
            for f in node["fields"]:
                named_types(f["type"], out)
        elif node["type"] == "array":
            named_types(node["items"], out)
        elif node["type"] == "map":
            named_types(node["values"], out)
    return out


def deref(node: Any, types: dict[str, dict]) -> Any:
    return types.get(node, node) if isinstance(node, str) else node


def missing_defaults(writer: dict, reader: dict) -> list[str]:
    """Reader fields the writer lacks that have no default: fastavro refuses those."""
    w_types, r_types = named_types(writer), named_types(reader)
    problems: list[str] = []

    def walk(w: Any, r: Any) -> None:
        w, r = deref(w, w_types), deref(r, r_types)
        if isinstance(w, list) and isinstance(r, list):
            w_named = {b if isinstance(b, str) else b.get("name"): b for b in w}
            for branch in r:
                key = branch if isinstance(branch, str) else branch.get("name")
                if key in w_named:
                    walk(w_named[key], branch)
        elif isinstance(w, dict) and isinstance(r, dict) and w["type"] == r["type"]:
            if r["type"] == "record":
                w_fields = {f["name"]: f for f in w["fields"]}
                for f in r["fields"]:
                    names = [f["name"], *f.get("aliases", [])]
                    old = next((w_fields[n] for n in names if n in w_fields), None)
                    if old is None:
                        if "default" not in f:
                            problems.append(f"{r['name']}.{f['name']}")
                    else:
                        walk(old["type"], f["type"])
            elif r["type"] == "array":
                walk(w["items"], r["items"])
            elif r["type"] == "map":
                walk(w["values"], r["values"])

    walk(writer, reader)
    return problems


def sample(node: Any, types: dict[str, dict]) -> Any:
    """A value for every field, none of them equal to a typical default."""
    node = deref(node, types)
    if isinstance(node, list):
        return sample(next(b for b in node if b != "null"), types)
    kind = node if isinstance(node, str) else node["type"]
    if kind == "record":
        return {f["name"]: sample(f["type"], types) for f in node["fields"]}
    if kind == "array":
        return [sample(node["items"], types)]
    if kind == "map":
        return {"k": sample(node["values"], types)}
    return {
        "string": "v",
        "long": 7,
        "int": 7,
        "double": 2.5,
        "float": 2.5,
        "boolean": True,
        "bytes": b"v",
    }[kind]


def plain(value: Any) -> Any:
    """A decoded event as the JSON-ish shape fastavro reads and writes."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def assert_resolved(
    decoded: Any, written: Any, reader: Any, types: dict[str, dict], path: str
) -> None:
    """Fields the writer had keep their values; the others hold the reader's default."""
    reader = deref(reader, types)
    if isinstance(reader, list):
        reader = next(b for b in reader if b != "null") if written is not None else "null"
        reader = deref(reader, types)
    kind = reader if isinstance(reader, str) else reader["type"]
    if kind == "record":
        for f in reader["fields"]:
            where = f"{path}.{f['name']}"
            if f["name"] in written:
                assert_resolved(decoded[f["name"]], written[f["name"]], f["type"], types, where)
            else:
                assert decoded[f["name"]] == f["default"], f"{where} should take its default"
    elif kind == "array":
        assert len(decoded) == len(written), path
        for i, (d, w) in enumerate(zip(decoded, written)):
            assert_resolved(d, w, reader["items"], types, f"{path}[{i}]")
    elif kind == "map":
        assert decoded.keys() == written.keys(), path
        for k in written:
            assert_resolved(decoded[k], written[k], reader["values"], types, f"{path}[{k}]")
    else:
        assert decoded == written, path


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def frame(writer: dict, datum: dict) -> bytes:
    fo = io.BytesIO()
    fo.write(b"\xc3\x01" + codec.schema_fingerprint(writer).to_bytes(8, "little"))
    schemaless_writer(fo, parse_schema(writer), datum)
    return fo.getvalue()


def event_name(path: Path) -> str:
    return path.name.split(".")[0]


# --------------------------------------------------------------------------
# The history files
# --------------------------------------------------------------------------
def test_there_is_history_to_test():
    assert {p.name for p in HISTORY_FILES} >= {
        "SubmitJob.v1.avsc",
        "NodeHeartbeat.v1.avsc",
        "JobRequeued.v1.avsc",
        "JobFailed.v1.avsc",
        "JobQueued.v1.avsc",
        "JobWaitEstimated.v1.avsc",
    }


@pytest.mark.parametrize("path", HISTORY_FILES, ids=lambda p: p.name)
def test_history_file_is_an_older_version_of_an_event(path):
    name = event_name(path)
    assert name in ev.EVENT_BY_NAME, f"{path.name}: history is kept for top-level events only"
    old = load(path)
    assert (old.get("namespace"), old["name"]) == ("framespool", name)
    fp = codec.schema_fingerprint(old)
    assert fp != codec.fingerprint(name), f"{path.name} is the current schema"
    assert codec.registered()[fp] == path.name.removesuffix(".avsc")


@pytest.mark.parametrize("path", HISTORY_FILES, ids=lambda p: p.name)
def test_every_field_added_since_has_a_default(path):
    current = codec.schema(event_name(path))
    assert missing_defaults(load(path), current) == []


@pytest.mark.parametrize("path", HISTORY_FILES, ids=lambda p: p.name)
def test_old_message_decodes_into_the_current_dataclass(path):
    writer, name = load(path), event_name(path)
    datum = sample(writer, named_types(writer))
    event = codec.decode(frame(writer, datum))
    assert type(event) is ev.EVENT_BY_NAME[name]
    current = codec.schema(name)
    assert_resolved(plain(event), datum, current, named_types(current), name)
    assert codec.event_type_name(frame(writer, datum)) == name


def test_submit_job_v1_gets_the_new_job_spec_defaults():
    writer = load(HISTORY_DIR / "SubmitJob.v1.avsc")
    datum = {
        "event_id": "e-1",
        "ts_ms": 10,
        "idempotency_key": "k-1",
        "spec": {
            "job_id": "job-1",
            "tenant": "acme",
            "tier": "paid",
            "gpus": 8,
            "gpus_per_node": 8,
            "estimate_s": 300.0,
            "params": {"seed": "3"},
            "preemptible": True,
            "submitted_ms": 9,
        },
    }
    event = codec.decode(frame(writer, datum))
    assert event == ev.SubmitJob(
        event_id="e-1",
        ts_ms=10,
        idempotency_key="k-1",
        spec=ev.JobSpec(
            job_id="job-1",
            tenant="acme",
            tier="paid",
            gpus=8,
            gpus_per_node=8,
            estimate_s=300.0,
            params={"seed": "3"},
            preemptible=True,
            submitted_ms=9,
        ),
    )
    assert event.spec.shapes == () and event.spec.gpu_type == ""
    assert event.spec.callback_url is None


@pytest.mark.parametrize("name", ["JobQueued", "JobWaitEstimated"])
def test_wait_estimate_v1_reads_as_unknown_quantiles(name):
    writer = load(HISTORY_DIR / f"{name}.v1.avsc")
    datum = {"event_id": "q-1", "ts_ms": 5, "job_id": "job-1", "wait_estimate_s": 40.0}
    datum |= {"position": 3, "reason": "fair-share queue"}
    if name == "JobQueued":
        datum |= {"tenant": "acme", "tier": "paid"}
    event = codec.decode(frame(writer, datum))
    assert type(event) is ev.EVENT_BY_NAME[name]
    assert event.wait_estimate_s == 40.0 and event.position == 3
    assert event.wait_p50_s == -1.0 and event.wait_p90_s == -1.0


@pytest.mark.parametrize("name", ["JobQueued", "JobWaitEstimated"])
def test_wait_estimate_v2_reads_with_no_reason_code(name):
    writer = load(HISTORY_DIR / f"{name}.v2.avsc")
    datum = {"event_id": "q-1", "ts_ms": 5, "job_id": "job-1", "wait_estimate_s": 40.0}
    datum |= {"position": 3, "reason": "fair-share queue", "wait_p50_s": 30.0, "wait_p90_s": 80.0}
    if name == "JobQueued":
        datum |= {"tenant": "acme", "tier": "paid"}
    event = codec.decode(frame(writer, datum))
    assert event.reason == "fair-share queue" and event.reason_code == ""


def test_run_progress_v1_reads_as_no_phase():
    writer = load(HISTORY_DIR / "RunProgress.v1.avsc")
    datum = {"event_id": "p-1", "ts_ms": 5, "job_id": "job-1", "run": 1, "node_id": "n0"}
    event = codec.decode(frame(writer, datum | {"progress": 0.5}))
    assert event.progress == 0.5 and event.phase == ""


def test_node_heartbeat_v1_reports_no_runs():
    writer = load(HISTORY_DIR / "NodeHeartbeat.v1.avsc")
    datum = {
        "event_id": "h-1",
        "ts_ms": 3,
        "node_id": "node-4",
        "incarnation": 2,
        "gpus": [{"index": 0, "temperature_c": 81.5, "ecc_uncorrected": 1}],
    }
    event = codec.decode(frame(writer, datum))
    assert event == ev.NodeHeartbeat(
        event_id="h-1",
        ts_ms=3,
        node_id="node-4",
        incarnation=2,
        gpus=(ev.GpuHealth(index=0, temperature_c=81.5, ecc_uncorrected=1),),
    )
    assert event.runs == ()


def test_run_ends_written_before_causes_read_as_unrecorded():
    requeued = {
        "event_id": "q-1",
        "ts_ms": 5,
        "job_id": "job-1",
        "run": 2,
        "reason": "retry after node_lost: node n1 down: no heartbeat for 6.1s",
        "resume_from": "s3://ck/1",
        "retries_left": 3,
    }
    event = codec.decode(frame(load(HISTORY_DIR / "JobRequeued.v1.avsc"), requeued))
    assert event == ev.JobRequeued(**requeued)
    assert event.cause == RunCause.UNRECORDED and event.failure_class == ""
    failed = {
        "event_id": "f-1",
        "ts_ms": 6,
        "job_id": "job-1",
        "run": 3,
        "reason": "exit 1",
        "failure_class": "generator_error",
    }
    event = codec.decode(frame(load(HISTORY_DIR / "JobFailed.v1.avsc"), failed))
    assert event == ev.JobFailed(**failed) and event.cause == RunCause.UNRECORDED


def test_a_cause_round_trips_as_its_code():
    event = ev.JobRequeued(
        event_id="q-2",
        ts_ms=7,
        job_id="job-1",
        run=1,
        reason="checkpoint-and-move: straggler on n2",
        cause=RunCause.STRAGGLER,
    )
    back = codec.decode(codec.encode(event))
    assert (
        back == event and back.cause == "straggler" and RunCause(back.cause) is RunCause.STRAGGLER
    )


# --------------------------------------------------------------------------
# The guard rails themselves
# --------------------------------------------------------------------------
def test_a_field_added_without_default_is_caught():
    """The check flags what fastavro would refuse at read time, nested records included."""
    writer = load(HISTORY_DIR / "SubmitJob.v1.avsc")
    reader = codec.schema("SubmitJob")
    spec = next(f for f in reader["fields"] if f["name"] == "spec")
    spec["type"]["fields"].append({"name": "region", "type": "string"})
    reader["fields"].append({"name": "priority", "type": "long"})
    assert missing_defaults(writer, reader) == [
        "framespool.JobSpec.region",
        "framespool.SubmitJob.priority",
    ]
    body = frame(writer, sample(writer, named_types(writer)))[10:]
    with pytest.raises(SchemaResolutionError):
        schemaless_reader(io.BytesIO(body), parse_schema(writer), parse_schema(reader))


def test_the_same_change_with_defaults_passes():
    writer = load(HISTORY_DIR / "SubmitJob.v1.avsc")
    reader = codec.schema("SubmitJob")
    reader["fields"].append({"name": "priority", "type": "long", "default": 0})
    assert missing_defaults(writer, reader) == []


def test_every_published_fingerprint_is_still_readable():
    registered = codec.registered()
    lost = {
        fp: name for fp, name in PUBLISHED.items() if registered.get(fp, "").split(".")[0] != name
    }
    assert not lost, (
        f"messages with these fingerprints would become unreadable: {lost}; "
        f"restore the old schema as schemas/avro/history/<Name>.v<N>.avsc"
    )


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
def test_every_current_fingerprint_is_published(cls):
    fp = codec.fingerprint(cls.__name__)
    assert PUBLISHED.get(fp) == cls.__name__, (
        f"{cls.__name__} has the new fingerprint {fp}. If it changed, first save the old "
        f"schema under schemas/avro/history/ (see this module's docstring); then add "
        f"{fp}: {cls.__name__!r} to PUBLISHED"
    )
