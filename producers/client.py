"""A small synchronous client of the HTTP API, for the CLI and scripts (stdlib only).

    client = Client("http://127.0.0.1:8080", api_key)
    job = client.submit(prompt="a red fox", model="demo", idempotency_key="fox-1")
    for event in client.watch(job["job_id"]):
        print(event["event"], event["data"]["summary"])
    print(client.result(job["job_id"])["url"])

Errors come back as ``ApiError`` carrying the server's code, message and field.
``watch`` reconnects after a dropped stream with ``Last-Event-ID``, so no event
is lost or repeated, and stops after the job's terminal event.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any


def parse_stream(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Yield ``{"id", "event", "data"}`` dicts from decoded SSE lines (the frames
    ``framespool.projections.sse.format_event`` writes)."""
    event: dict[str, Any] = {}
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield {
                    "id": event.get("id"),
                    "event": event.get("event", "message"),
                    "data": "\n".join(data),
                }
            event, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name in ("id", "event", "retry"):
            event[name] = value


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(
            f"HTTP {status} {code}: {message}" + (f" (field {field})" if field else "")
        )
        self.status, self.code, self.message, self.field = status, code, message, field


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Client:
    def __init__(self, base_url: str, api_key: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(_NoRedirect)

    # -- plumbing ---------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ):
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=hdrs)
        try:
            return self._opener.open(req, timeout=timeout or self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None

    def _json(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        with self._request(method, path, body, headers) as resp:
            return json.loads(resp.read() or b"null")

    # -- API ----------------------------------------------------------------------
    def submit(self, *, idempotency_key: str | None = None, **fields: Any) -> dict:
        """POST /v1/jobs; ``fields`` are the body (prompt, model, params, gpus, ...)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/jobs", fields, headers)

    def status(self, job_id: str) -> dict:
        return self._json("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}")

    def jobs(self, state: str | None = None, limit: int = 50, cursor: str | None = None) -> dict:
        query = {k: v for k, v in (("state", state), ("limit", limit), ("cursor", cursor)) if v}
        return self._json("GET", "/v1/jobs?" + urllib.parse.urlencode(query))

    def all_jobs(self, state: str | None = None, page_size: int = 100) -> Iterator[dict]:
        cursor = None
        while True:
            page = self.jobs(state, page_size, cursor)
            yield from page["jobs"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def cancel(self, job_id: str) -> dict:
        return self._json("DELETE", f"/v1/jobs/{urllib.parse.quote(job_id)}")

    def result(self, job_id: str) -> dict:
        return self._json("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/result")

    def models(self) -> dict:
        """GET /v1/models: what this tenant may submit, with each model's defaults."""
        return self._json("GET", "/v1/models")

    def cluster(self, detail: bool = True) -> dict:
        return self._json("GET", "/v1/cluster" + ("" if detail else "?detail=0"))

    def rotate_webhook_secret(self) -> dict:
        """A new webhook signing secret for this key's tenant; the answer is the only copy."""
        return self._json("POST", "/v1/webhook-secret")

    def watch(
        self, job_id: str, last_event_id: int | None = None, reconnect: int = 5
    ) -> Iterator[dict]:
        """Yield ``{"id", "event", "data"}`` for each event until the job ends."""
        path = f"/v1/jobs/{urllib.parse.quote(job_id)}/events"
        last = last_event_id
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            ended = False
            try:
                with self._request(
                    "GET", path, headers=headers, timeout=max(self.timeout_s, 60)
                ) as resp:
                    lines = (raw.decode("utf-8") for raw in resp)
                    for event in parse_stream(lines):
                        failures = 0
                        if event["id"] is not None:
                            last = int(event["id"])
                        data = json.loads(event["data"])
                        if event["event"] == "end":
                            ended = True
                            break
                        yield {"id": last, "event": event["event"], "data": data}
            except (OSError, ValueError) as exc:  # a dropped connection: resume below
                if failures >= reconnect:
                    raise ApiError(
                        0, "stream_lost", f"the event stream of {job_id} failed: {exc}"
                    ) from exc
            if ended:
                return
            failures += 1
            if failures > reconnect:
                raise ApiError(0, "stream_lost", f"the event stream of {job_id} kept closing")
            time.sleep(min(5.0, 0.2 * 2**failures))


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        err = json.loads(exc.read() or b"{}").get("error", {})
    except ValueError:
        err = {}
    return ApiError(
        exc.code,
        err.get("code", "http_error"),
        err.get("message", str(exc.reason)),
        err.get("field"),
    )
