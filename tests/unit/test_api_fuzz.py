"""Any request a tenant can send gets an answer, never a 5xx or a hang.

Hypothesis draws requests over every route and beyond: junk path segments
(percent-encoded unicode, dots, control characters), junk query keys and
values, junk or valid credentials, idempotency keys, ``Last-Event-ID`` and
content types, and bodies of any bytes or JSON. Every answer must come within
a few seconds, below 500, and a refusal must be the API's JSON error with a
code (``docs/design.md``: bad input gets a clear error). The body-level
property (a refusal names the field, an accepted body becomes a spec) is
``test_api_validation.py``'s.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.projections.store import InMemoryViewStore

KEY = "acme-key.alice-secret"
ROUTES = [
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{}"),
    ("DELETE", "/v1/jobs/{}"),
    ("GET", "/v1/jobs/{}/events"),
    ("GET", "/v1/jobs/{}/result"),
    ("GET", "/v1/artifacts/{}"),
    ("GET", "/v1/cluster"),
    ("POST", "/v1/webhook-secret"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("PUT", "/v1/jobs/{}"),
    ("PATCH", "/{}"),
    ("GET", "/{}/{}"),
]
# header values travel as latin-1 without control characters (the client refuses them)
PRINTABLE = "".join(map(chr, [*range(0x20, 0x7F), *range(0xA0, 0x100)]))
HEADER_TEXT = st.text(PRINTABLE, max_size=60)
SEGMENT = st.one_of(
    st.sampled_from(["job_1", "..", ".", "%2e%2e", "a/b", "x" * 300, "%00", "%ff"]),
    st.text(min_size=1, max_size=40).map(lambda s: quote(s, safe="")),
)
VALUE = st.one_of(
    st.sampled_from(["", "0", "-1", "abc", "9" * 30, "QUEUED", "1e309", "job_1"]), st.text()
)
# each known parameter in about half the requests, plus unknown ones
QUERY = st.builds(
    lambda known, unknown: {**unknown, **known},
    st.fixed_dictionaries(
        {},
        optional=dict.fromkeys(
            ["cursor", "limit", "state", "tier", "tenant", "since", "wait", "after"], VALUE
        ),
    ),
    st.dictionaries(st.text(min_size=1, max_size=12), VALUE, max_size=2),
)
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
BODY = st.one_of(
    st.none(),
    st.binary(max_size=300),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"prompt": st.text(max_size=30)}, optional={"model": st.text(max_size=12)}
    ).map(lambda v: json.dumps(v).encode()),
)
# most requests carry the valid key, so that they reach the handlers
AUTH = st.one_of(
    st.just(f"Bearer {KEY}"), st.just(f"Bearer {KEY}"), st.just(f"Bearer {KEY}"), HEADER_TEXT
)
HEADERS = st.fixed_dictionaries(
    {"Authorization": AUTH},
    optional={
        "Idempotency-Key": HEADER_TEXT,
        "Last-Event-ID": HEADER_TEXT,
        "Content-Type": st.one_of(
            st.sampled_from(["application/json", "text/plain", "multipart/form-data"]),
            HEADER_TEXT,
        ),
    },
)


@pytest.fixture(scope="module")
def served():
    """One API (in-memory store and log) on 127.0.0.1 for every example."""
    loop = asyncio.new_event_loop()
    keys = ApiKeys([record_for(KEY, "acme", "alice")], {"acme": TenantPolicy(("free",))})
    config = ApiConfig(auth=keys, store=InMemoryViewStore(), producer=MemoryProducer())
    client = TestClient(TestServer(make_app(config)), loop=loop)
    loop.run_until_complete(client.start_server())
    yield loop, client
    loop.run_until_complete(client.close())
    loop.close()


@pytest.mark.parametrize("method, template", ROUTES)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    segments=st.lists(SEGMENT, min_size=2, max_size=2),
    query=QUERY,
    headers=HEADERS,
    body=BODY,
)
def test_any_request_is_answered_below_500_with_a_json_error(
    served, method, template, segments, query, headers, body
) -> None:
    loop, client = served
    path = template.format(*segments[: template.count("{}")])

    async def send() -> tuple[int, str, str]:
        response = await client.request(
            method,
            path,
            params=query,
            headers=headers,
            data=body,
            timeout=aiohttp.ClientTimeout(total=10),
        )
        return response.status, response.headers.get("Content-Type", ""), await response.text()

    status, content_type, text = loop.run_until_complete(send())
    assert status < 500, (method, path, query, headers, body, status, text[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (method, path, status, text[:300])
        assert json.loads(text)["error"]["code"], text[:300]
