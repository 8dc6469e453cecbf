"""Submission validation: accepted shapes are normalised; refusals name field and limit."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.callbacks.targets import TargetPolicy
from framespool.producers.auth import TenantPolicy
from framespool.producers.validation import FIELDS, Limits, ValidationError, validate_submit
from framespool.schemas import codec
from framespool.schemas.events import JobSpec, Shape, SubmitJob

POLICY = TenantPolicy(("enterprise", "free"), "free")
GOOD = {
    "prompt": "a red fox in the snow",
    "model": "demo",
    "params": {"resolution": "1280x720", "duration_s": 5, "fps": 24, "seed": 7},
}


def ok(**changes):
    return validate_submit({**GOOD, **changes}, POLICY)


def refused(body=None, policy=POLICY, **changes) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        validate_submit(body if body is not None else {**GOOD, **changes}, policy)
    return info.value


def test_a_good_body_becomes_spec_fields():
    fields = ok(
        gpus=16,
        gpus_per_node=8,
        tier="enterprise",
        preemptible=True,
        callback_url="https://hooks.example.com/x",
        shapes=[{"gpus": 8, "gpus_per_node": 8, "estimate_s": 300}],
    )
    spec = JobSpec(job_id="j", tenant="t", **fields)
    assert spec.params == {"resolution": "1280x720", "duration_s": "5", "fps": "24", "seed": "7"}
    assert spec.shapes == (Shape(gpus=8, gpus_per_node=8, estimate_s=300.0),)
    assert (spec.gpus, spec.gpus_per_node, spec.tier) == (16, 8, "enterprise")


def test_defaults_and_normalisation():
    fields = ok()
    assert fields["tier"] == "free" and fields["gpus"] == 1 and fields["gpus_per_node"] == 1
    assert ok(gpus=2, gpus_per_node=8)["gpus_per_node"] == 2
    assert ok(params={"duration_s": 2.5, "hd": True})["params"] == {
        "duration_s": "2.5",
        "hd": "true",
    }


@pytest.mark.parametrize(
    "changes,field,words",
    [
        ({"prompt": ""}, "prompt", "required"),
        ({"prompt": "   "}, "prompt", "required"),
        ({"prompt": "x" * 4001}, "prompt", "4000"),
        ({"prompt": 5}, "prompt", "required"),
        ({"model": None}, "model", "required"),
        ({"model": "../etc"}, "model", "letters"),
        ({"gpus": 0}, "gpus", "between 1 and 64"),
        ({"gpus": 65}, "gpus", "64"),
        ({"gpus": "8"}, "gpus", "integer"),
        ({"gpus": True}, "gpus", "integer"),
        ({"gpus_per_node": 9}, "gpus_per_node", "8"),
        ({"gpus": 12, "gpus_per_node": 8}, "gpus_per_node", "divide"),
        ({"tier": "gold"}, "tier", "enterprise, free"),
        ({"preemptible": "yes"}, "preemptible", "true or false"),
        ({"callback_url": "ftp://x.example/"}, "callback_url", "scheme"),
        ({"callback_url": "http://127.0.0.1/hook"}, "callback_url", "loopback"),
        ({"callback_url": "https://x.example/" + "a" * 2100}, "callback_url", "2048"),
        ({"callback_url": 3}, "callback_url", "URL"),
        ({"params": []}, "params", "JSON object"),
        ({"params": {"resolution": "big"}}, "params.resolution", "1280x720"),
        ({"params": {"resolution": "9000x720"}}, "params.resolution", "4096"),
        ({"params": {"duration_s": 0}}, "params.duration_s", "greater than 0"),
        ({"params": {"duration_s": 121}}, "params.duration_s", "120"),
        ({"params": {"duration_s": "5"}}, "params.duration_s", "number"),
        ({"params": {"duration_s": None}}, "params.duration_s", "number"),  # was a 500
        ({"params": {"fps": 61}}, "params.fps", "60"),
        ({"params": {"fps": 0}}, "params.fps", "between 1 and 60"),
        ({"params": {"seed": 1.5}}, "params.seed", "integer"),
        ({"params": {"Bad-Key": 1}}, "params.Bad-Key", "lower-case"),
        ({"params": {"x": [1]}}, "params.x", "string, number or boolean"),
        ({"params": {f"k{i}": "v" * 100 for i in range(50)}}, "params", "limit is 4096"),
        ({"shapes": {"gpus": 1}}, "shapes", "list"),
        (
            {"shapes": [{"gpus": 3, "gpus_per_node": 2, "estimate_s": 5}]},
            "shapes[0].gpus_per_node",
            "divide",
        ),
        ({"shapes": [{"gpus": 1, "gpus_per_node": 1}]}, "shapes[0].estimate_s", "required"),
        (
            {"shapes": [{"gpus": 1, "gpus_per_node": 1, "estimate_s": -1}]},
            "shapes[0].estimate_s",
            "greater than 0",
        ),
        ({"colour": "red"}, "colour", "known fields"),
        ({"estimate_s": float("inf")}, "estimate_s", "number"),
    ],
)
def test_refusals_name_the_field_and_the_limit(changes, field, words):
    err = refused(**changes)
    assert err.field == field, err
    assert words in err.message, err.message


def test_refusal_statuses():
    assert refused(tier="enterprise", policy=TenantPolicy(("free",))).status == 403
    assert refused(prompt="").status == 422
    assert refused(body=["not", "an", "object"]).status == 422


def test_model_allow_list_and_private_callbacks_when_allowed():
    limits = Limits(models=frozenset({"demo", "sora-lite"}))
    with pytest.raises(ValidationError, match="available: demo, sora-lite"):
        validate_submit({**GOOD, "model": "other"}, POLICY, limits)
    fields = validate_submit(
        {**GOOD, "callback_url": "http://127.0.0.1:9/h"},
        POLICY,
        url_policy=TargetPolicy(allow_private=True),
    )
    assert fields["callback_url"] == "http://127.0.0.1:9/h"


# -- any JSON a client may send ------------------------------------------------
_JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=40)
)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
# mostly valid, with the edges and a little beyond
_COUNT = st.sampled_from([1, 2, 4, 8, 1, 2, 4, 8, 3, 0, -1, 16, 64, 65, 0.5, 1e6, 1e300])
_NAME = st.sampled_from(["demo", "wan-2.1", "demo", "wan-2.1", "m" * 64, "m" * 65, "a b"])
_SHAPE = st.fixed_dictionaries(
    {}, optional={"gpus": _COUNT, "gpus_per_node": _COUNT, "estimate_s": _COUNT}
)
_PLAUSIBLE = {
    "model": _NAME,
    "model_version": _NAME,
    "params": st.dictionaries(
        st.sampled_from(["seed", "duration_s", "fps", "resolution"]) | st.text(max_size=12),
        st.integers(-10, 10**7) | st.floats() | st.text(max_size=20) | st.booleans() | st.none(),
        max_size=5,
    ),
    "gpus": _COUNT,
    "gpus_per_node": _COUNT,
    "tier": st.sampled_from(["enterprise", "free", "paid", "Free"]),
    "preemptible": st.booleans(),
    "callback_url": st.just("https://hooks.example.com/x")
    | st.sampled_from(["http://10.0.0.1/x", "ftp://a/b", "https://" + "a" * 3000]),
    "shapes": st.lists(_SHAPE, max_size=3),
    "estimate_s": _COUNT,
    "checkpoint_interval_s": _COUNT,
    "gpu_type": _NAME,
    "cpus": _COUNT,
    "mem_gb": _COUNT,
}


@st.composite
def _bodies(draw) -> dict:
    """GOOD with each field absent or plausible (often valid), and perhaps one
    field, known or not, holding any JSON at all."""
    body = dict(GOOD)
    for field, plausible in _PLAUSIBLE.items():
        if draw(st.booleans()):
            body[field] = draw(plausible)
    hostile = draw(st.none() | st.sampled_from([*_PLAUSIBLE, "prompt"]) | st.text(max_size=8))
    if hostile is not None:
        body[hostile] = draw(_JSON)
    return body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies())
def test_any_json_body_is_refused_by_field_or_becomes_an_encodable_spec(body) -> None:
    # what the API does with a body: a refusal is the client's (4xx, naming a
    # field or the body), an acceptance a spec the log's contract holds
    # and the same spec every time (its idempotency fingerprint)
    try:
        fields = validate_submit(body, POLICY)
    except ValidationError as e:
        assert e.status in (400, 403, 413, 422)
        # a field it sent, or a known one it left to its default (gpus 9 with
        # the default gpus_per_node 8 is refused by gpus_per_node)
        assert (
            e.field is None
            or e.field in body
            or e.field.split(".")[0].split("[")[0] in {*body, *FIELDS}
        ), e.field
        assert e.message
        return
    assert validate_submit(body, POLICY) == fields
    spec = JobSpec(job_id="j", tenant="t", user="u", submitted_ms=1, **fields)
    command = SubmitJob(event_id="j/submit", ts_ms=1, spec=spec, idempotency_key=None)
    assert codec.decode(codec.encode(command)) == command


def test_checkpoint_interval_has_a_floor():
    """Issue #33, 6: checkpoint_interval_s=1e-9 made the agent checkpoint in a loop."""
    for value in (1e-9, 0.5):
        with pytest.raises(ValidationError) as refused:
            validate_submit({**GOOD, "checkpoint_interval_s": value}, POLICY)
        assert refused.value.field == "checkpoint_interval_s"
        assert "0 (no checkpoints) or from 1 to 3600" in refused.value.message
    for value in (0, 1, 30):
        fields = validate_submit({**GOOD, "checkpoint_interval_s": value}, POLICY)
        assert fields["checkpoint_interval_s"] == value
    # the knob: an operator's higher floor
    with pytest.raises(ValidationError):
        validate_submit(
            {**GOOD, "checkpoint_interval_s": 30}, POLICY, Limits(checkpoint_interval_min_s=60)
        )


def test_the_agent_never_checkpoints_faster_than_its_floor():
    from framespool.agents.execution import MIN_CHECKPOINT_WALL_S, checkpoint_period_s

    assert checkpoint_period_s(1e-9, 1.0) == MIN_CHECKPOINT_WALL_S  # admitted before the check
    assert checkpoint_period_s(10.0, 100.0) == MIN_CHECKPOINT_WALL_S  # a fast time scale
    assert checkpoint_period_s(30.0, 10.0) == 3.0
