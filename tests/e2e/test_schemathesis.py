"""Property-based tests of the HTTP API against its own OpenAPI document (schemathesis).

The API app runs with fakes (in-memory store, recording producer, local artifact
store, a fake DNS resolver) on a free loopback port, with a few jobs and a cell
already folded in. Schemathesis loads ``/openapi.json`` from it and sends valid
and invalid requests to every operation, twice: once with generated job ids
(mostly unknown: 404 paths), once with the id of a COMPLETED job (200, 302,
409 paths). Each response must not be a 5xx and must conform to the document:
status code, content type, headers, body schema; and an operation that needs a
key must refuse requests without one (``ignored_auth``). Examples per operation
are bounded so the whole run stays well under a minute.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from framespool.agents.artifacts import LocalDirStore
from framespool.broker import free_port
from framespool.log.memory import MemoryProducer
from framespool.producers import openapi
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.producers.ratelimit import RateLimit
from framespool.projections import cluster
from framespool.projections.jobs import fold
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.projections.webhook_secrets import WebhookSecrets
from tests.support.projections import cell_status, lifecycle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

KEY = "acme-key.alice-secret"
DONE = "job-done"
MAX_EXAMPLES = 40
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
]


async def _public_resolver(host: str) -> list[str]:
    return ["93.184.216.34"]


class ApiServer:
    """The API app with fakes, served by its own event loop in a thread."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        keys = ApiKeys(
            [record_for(KEY, "acme", "alice")],
            {"acme": TenantPolicy(("enterprise", "free"), "free")},
        )
        artifacts = LocalDirStore(root / "artifacts", url_base=self.url, secret=b"url-secret")
        store = InMemoryViewStore()
        done = fold(lifecycle(DONE))
        gif = root / "out.gif"
        gif.write_bytes(b"GIF89a" + b"\x00" * 64)
        artifacts.put_file(done.artifact_uri.removeprefix("local://"), gif)
        views = {DONE: done, "job-failed": fold(lifecycle("job-failed", outcome="FAILED"))}
        cells = cluster.apply(None, cell_status("cell-0", 1_000, busy=3)).cells
        store.commit(Batch(views=views, cells=dict(cells)))
        self.config = ApiConfig(
            auth=keys,
            store=store,
            producer=MemoryProducer(),
            artifacts=artifacts,
            resolve_host=_public_resolver,
            sse_keepalive_s=1.0,
            # ignored_auth re-sends every example without a key, all from this one address:
            # the per-address limit of unkeyed requests (test_api_hardening) is off here
            unauthenticated_rate_limit=RateLimit(rate_per_s=0),
            webhook_secrets=WebhookSecrets({"acme": "whsec_test"}),
        )
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.runner = web.AppRunner(make_app(self.config))
        self._loop.run_until_complete(self.runner.setup())
        self._loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.runner.cleanup())
        self._loop.close()

    def __enter__(self) -> ApiServer:
        self._thread.start()
        assert self._ready.wait(10), "the API did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    with ApiServer(tmp_path_factory.mktemp("api")) as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(api_server):
    return schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")


def _cases() -> list:
    """(method, path, generation mode, fixed path parameters) for every operation."""
    out = []
    doc = openapi.build()
    for method, path in sorted(openapi.documented_routes(doc)):
        item = doc["paths"][path]
        inputs = (
            item.get("parameters")
            or item[method.lower()].get("parameters")
            or item[method.lower()].get("requestBody")
        )
        modes = (
            (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
            if inputs
            else (GenerationMode.POSITIVE,)
        )  # nothing to make invalid
        for mode in modes:
            fixed = [None, {"job_id": DONE}] if "{job_id}" in path else [None]
            for params in fixed:
                label = f"{method} {path} {mode.value}" + (" completed-job" if params else "")
                out.append(pytest.param(method, path, mode, params, id=label))
    return out


@pytest.mark.parametrize("method, path, mode, path_parameters", _cases())
def test_api_conforms_to_its_openapi_document(
    api_server, api_schema, method, path, mode, path_parameters
):
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(mode, path_parameters=path_parameters))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        case.call_and_validate(
            base_url=api_server.url,
            headers={"Authorization": f"Bearer {KEY}"},
            checks=CHECKS,
            timeout=15,
            allow_redirects=False,
        )

    check()
