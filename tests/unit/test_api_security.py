"""API security properties: body and field size limits, callback targets checked at submit
(including through DNS), and logs that never carry keys or URL signatures.

Signed result URLs (tampering, expiry) are covered in test_api_handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
from urllib.parse import urlsplit

import pytest
from aiohttp.test_utils import TestClient, TestServer

from framespool.agents.artifacts import LocalDirStore
from framespool.callbacks.targets import TargetPolicy
from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, TenantPolicy, record_for
from framespool.projections.jobs import fold
from framespool.projections.store import Batch, InMemoryViewStore
from framespool.schemas.topics import COMMANDS
from framespool.telemetry.jsonlog import JsonFormatter
from tests.support.projections import lifecycle

KEY = "acme-key.alice-secret-do-not-log"
BODY = {"prompt": "a red fox", "model": "demo"}
DNS = {
    "hooks.example.com": ["93.184.216.34"],
    "evil.example.com": ["127.0.0.1"],
    "mixed.example.com": ["93.184.216.34", "169.254.169.254"],
    "v6.example.com": ["::1"],
    "rebind.example.com": ["10.1.2.3"],
}


async def fake_resolve(host: str) -> list[str]:
    if host == "slow.example.com":
        await asyncio.sleep(10)
    if host not in DNS:
        raise OSError(f"no such host {host}")
    return DNS[host]


@contextlib.asynccontextmanager
async def api(tmp_path, server=None, **overrides):
    keys = ApiKeys([record_for(KEY, "acme", "alice")], {"acme": TenantPolicy(("free",))})
    artifacts = LocalDirStore(
        tmp_path / "artifacts", url_base="http://api.test", secret=b"url-secret"
    )
    config = ApiConfig(
        auth=keys,
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        artifacts=artifacts,
        resolve_host=fake_resolve,
        resolve_timeout_s=0.2,
        **overrides,
    )
    async with TestClient(TestServer(make_app(config), **(server or {}))) as client:
        yield client, config


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_bodies_over_the_limit_are_413_with_or_without_content_length(tmp_path):
    async def go():
        async with api(tmp_path, max_body_bytes=2048) as (client, config):
            big = json.dumps({**BODY, "prompt": "x" * 3000}).encode()
            r = await client.post("/v1/jobs", data=big, headers=auth())
            assert r.status == 413 and (await r.json())["error"]["code"] == "body_too_large"

            async def chunks():
                for i in range(0, len(big), 500):
                    yield big[i : i + 500]

            r = await client.post("/v1/jobs", data=chunks(), headers=auth())
            assert r.status == 413 and (await r.json())["error"]["code"] == "body_too_large"
            assert config.producer.sent == []

    asyncio.run(go())


@pytest.mark.parametrize(
    "body, field, says",
    [
        ({**BODY, "prompt": "x" * 4001}, "prompt", "the limit is 4000"),
        (
            {**BODY, "params": {f"k{i}": "v" * 100 for i in range(50)}},
            "params",
            "the limit is 4096",
        ),
        ({**BODY, "params": {"note": "v" * 1001}}, "params.note", "the limit is 1000"),
    ],
)
def test_prompt_and_params_size_limits(tmp_path, body, field, says):
    async def go():
        async with api(tmp_path) as (client, _):
            r = await client.post("/v1/jobs", json=body, headers=auth())
            err = (await r.json())["error"]
            assert r.status == 422 and err["field"] == field and says in err["message"]

    asyncio.run(go())


@pytest.mark.parametrize(
    "url, accepted",
    [
        ("https://hooks.example.com/h", True),
        ("https://unknown.example.com/h", True),  # does not resolve now: checked at delivery
        ("https://slow.example.com/h", True),  # resolver timeout: checked at delivery
        ("https://evil.example.com/h", False),  # loopback via DNS
        ("https://mixed.example.com/h", False),  # one link-local answer is enough to refuse
        ("https://v6.example.com/h", False),
        ("https://rebind.example.com/h", False),  # private
        ("http://127.0.0.1:9/h", False),  # literal: refused by the validation
        ("http://[::ffff:10.0.0.1]/h", False),
        ("http://169.254.169.254/latest/meta-data", False),
    ],
)
def test_callback_targets_are_checked_at_submit_including_dns(tmp_path, url, accepted):
    async def go():
        async with api(tmp_path) as (client, config):
            r = await client.post("/v1/jobs", json={**BODY, "callback_url": url}, headers=auth())
            if accepted:
                assert r.status == 202, await r.text()
            else:
                err = (await r.json())["error"]
                assert r.status == 422 and err["field"] == "callback_url", err
                assert "public" in err["message"]
                assert config.producer.on(COMMANDS.name) == []

    asyncio.run(go())


def test_private_callbacks_allowed_when_configured(tmp_path):
    async def go():
        async with api(tmp_path, url_policy=TargetPolicy(allow_private=True)) as (client, _):
            r = await client.post(
                "/v1/jobs",
                headers=auth(),
                json={**BODY, "callback_url": "https://evil.example.com/h"},
            )
            assert r.status == 202

    asyncio.run(go())


@contextlib.contextmanager
def captured_json_logs():
    """Every logger (aiohttp's access log included, at INFO) into JSON lines."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter({"process": "api"}))
    root, access = logging.getLogger(), logging.getLogger("aiohttp.access")
    saved = (root.handlers[:], root.level, access.level)
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG)
    access.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        access.setLevel(saved[2])


def test_logs_are_json_and_carry_no_key_or_signature(tmp_path):
    async def go():
        # an access log that records the request line and the Authorization header
        access_log = {"access_log_format": '%a "%r" %s "%{Authorization}i"'}
        async with api(tmp_path, server=access_log) as (client, config):
            job = "job-log"
            config.store.commit(Batch(views={job: fold(lifecycle(job))}))
            video = tmp_path / "v.gif"
            video.write_bytes(b"GIF89a fake")
            config.artifacts.put_file(
                config.store.get(job).artifact_uri.removeprefix("local://"), video
            )
            result = await (await client.get(f"/v1/jobs/{job}/result", headers=auth())).json()
            parts = urlsplit(result["url"])
            assert (await client.get(f"{parts.path}?{parts.query}")).status == 200
            assert (await client.get(f"{parts.path}?{parts.query}0")).status == 403
            assert (await client.post("/v1/jobs", json=BODY, headers=auth())).status == 202
            assert (await client.get("/v1/jobs", headers={"X-API-Key": KEY})).status == 200
            assert (
                await client.get("/v1/jobs", headers={"Authorization": "Bearer wrong.key"})
            ).status == 401
            # code that logs a result URL or a header by mistake is redacted too
            logging.getLogger("framespool.api").warning(
                "result ready at %s for %s",
                result["url"],
                auth()["Authorization"],
                extra={"url": result["url"]},
            )
            return result["url"]

    with captured_json_logs() as out:
        url = asyncio.run(go())
    text = out.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]
    assert any(line["logger"] == "aiohttp.access" for line in lines), text
    assert any("result ready" in line["msg"] for line in lines)
    signature = re.search(r"sig=([0-9a-f]+)", url).group(1)
    for secret in (KEY, signature, "wrong.key"):
        assert secret not in text, f"{secret!r} leaked into the logs:\n{text}"
    assert "sig=***" in text and "Bearer ***" in text
