"""The web dashboard in headless Chromium against the embedded stack.

Chromium is driven through the DevTools protocol over a websocket (aiohttp's
client): sign in with the tenant's key, watch a job run to COMPLETED on its
page (live over the fetch-based SSE stream) and in the job list, see busy GPUs
on the map, and fail on any console error or uncaught exception. Screenshots
of both views go to the test's tmp dir (and to ``FRAMESPOOL_SCREENSHOT_DIR``
when set). Skips only when no Chromium binary is installed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from framespool.broker import free_port
from framespool.producers.client import ApiError, Client
from framespool.stack import StackConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str | None:
    explicit = os.environ.get("FRAMESPOOL_CHROMIUM")
    for name in (explicit,) if explicit else CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        pytest.skip(
            "no Chromium binary (/usr/bin/chromium): install Debian's 'chromium' "
            "package (.ci/run does) to run the dashboard test"
        )
    return binary


@pytest.fixture(scope="module")
def stack_config(tmp_path_factory, chromium) -> StackConfig:
    return StackConfig(
        data_dir=tmp_path_factory.mktemp("stack"),
        port=free_port(),
        nodes=2,
        gpus_per_node=8,
        time_scale=20.0,
    )


# ----------------------------------------------------------------------------
# A minimal DevTools protocol client
# ----------------------------------------------------------------------------
class Browser:
    """One headless Chromium with one page, driven over the DevTools websocket."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary, self.profile = binary, profile
        self.process: subprocess.Popen | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.events: list[dict[str, Any]] = []
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        self.profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.profile / "chromium.log", "wb"),
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start; see {self.profile / 'chromium.log'}")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        self.session = aiohttp.ClientSession()
        page = None
        while page is None:
            async with self.session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                page = next((t for t in await resp.json() if t["type"] == "page"), None)
            if page is None:
                await asyncio.sleep(0.1)
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=1000,
            deviceScaleFactor=1,
            mobile=False,
        )

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None:
                if "error" in data:
                    future.set_exception(RuntimeError(f"CDP error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        future = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self.ws.send_json({"id": self._next_id, "method": method, "params": params})
        return await asyncio.wait_for(future, 30)

    async def eval(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 60, what: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = await self.eval(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        text = await self.eval("document.body.innerText")
        raise AssertionError(f"timed out waiting for {what or expression}; page text:\n{text}")

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        copy_dir = os.environ.get("FRAMESPOOL_SCREENSHOT_DIR")
        if copy_dir:
            Path(copy_dir).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(copy_dir) / path.name)

    def console_errors(self) -> list[str]:
        errors = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(
                    "console: "
                    + " ".join(
                        str(a.get("value", a.get("description"))) for a in params.get("args", [])
                    )
                )
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                errors.append(
                    "exception: "
                    + str(details.get("exception", {}).get("description", details.get("text")))
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                errors.append(
                    f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
                )
        return errors

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def visible(selector: str) -> str:
    return (
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
        f"return !!e && !e.closest('[hidden]'); }})()"
    )


def text_of(selector: str) -> str:
    return f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent"


# ----------------------------------------------------------------------------
# The test
# ----------------------------------------------------------------------------
def test_dashboard_shows_cluster_and_a_job_reaching_completed(stack, chromium, tmp_path):
    key = stack.tenant_keys[0]["api_key"]
    client = Client(stack.api_url, key, timeout_s=30)

    async def go() -> None:
        browser = Browser(chromium, tmp_path / "profile")
        await browser.start()
        try:
            await browser.send("Page.navigate", url=f"{stack.api_url}/")
            await browser.wait_for(visible("#login-form"), 30, "the sign-in form")
            # type the key as a user would, then sign in
            await browser.eval("document.querySelector('#api-key').focus()")
            await browser.send("Input.insertText", text=key)
            await browser.eval("document.querySelector('#login-form button').click()")
            await browser.wait_for(visible("#gpu-map"), 30, "the dashboard after sign-in")
            gpus = stack.config.nodes * stack.config.gpus_per_node
            await browser.wait_for(
                f"document.querySelectorAll('#gpu-map .gpu').length === {gpus}",
                30,
                f"{gpus} GPUs on the map",
            )
            assert (
                await browser.eval("document.querySelectorAll('#gpu-map .gpu.free').length") == gpus
            )

            # a long 8-GPU job shows up on the map as busy GPUs linked to it
            long_job = client.submit(
                prompt="a long slow pan over a mountain lake",
                model="demo",
                gpus=8,
                gpus_per_node=8,
                params={
                    "duration_s": 2,
                    "fps": 8,
                    "steps": 2000,
                    "seconds_per_step": 1,
                    "resolution": "128x72",
                    "seed": 1,
                },
            )["job_id"]
            await browser.wait_for(
                f"document.querySelectorAll('#gpu-map .gpu.busy[data-job-id=\"{long_job}\"]')"
                ".length === 8",
                60,
                "8 busy GPUs of the long job on the map",
            )
            # a short job, followed on its own page: live timeline, then the result GIF
            job_id = client.submit(
                prompt="a red fox running through fresh snow",
                model="demo",
                params={
                    "duration_s": 2,
                    "fps": 8,
                    "resolution": "128x72",
                    "seed": 7,
                    "steps": 40,
                    "seconds_per_step": 2,
                },
            )["job_id"]
            await browser.wait_for(
                f"!!document.querySelector('#jobs-table tr[data-job-id=\"{job_id}\"]')",
                30,
                "the new job in the list",
            )
            await browser.wait_for(
                "document.querySelectorAll('#share-table tbody tr').length > 0",
                30,
                "the tenant share table",
            )
            await browser.screenshot(tmp_path / "dashboard-overview.png")

            await browser.eval("window.__sameDocument = true")  # a reload would drop it
            await browser.eval(
                f"document.querySelector('#jobs-table tr[data-job-id=\"{job_id}\"] a').click()"
            )
            await browser.wait_for(visible("#timeline"), 10, "the job page")
            assert await browser.eval(text_of("#job-title")) == job_id
            first = await browser.wait_for(text_of("#job-state"), 10, "the job's state")
            assert first != "COMPLETED", "opened too late to see live updates"
            await browser.wait_for(
                f"{text_of('#job-state')} === 'COMPLETED'", 120, "the job page to show COMPLETED"
            )
            # it got there over the event stream, without reloading the page
            assert await browser.eval(
                "performance.getEntriesByType('resource').some(e => e.name.endsWith('/events'))"
            )
            assert await browser.eval("window.__sameDocument === true")
            await browser.wait_for(
                "(() => { const i = document.querySelector('#job-result img');"
                " return !!i && i.complete && i.naturalWidth > 0; })()",
                30,
                "the result GIF to load",
            )
            types = await browser.eval(
                "[...document.querySelectorAll('#timeline tbody tr')].map(r => r.dataset.type)"
            )
            assert types[0] == "JobAdmitted" and types[-1] == "JobCompleted", types
            assert {"JobAssigned", "RunProgress"} <= set(types), types
            assert (await browser.eval(text_of("#job-progress-text"))).startswith("100%")
            await browser.screenshot(tmp_path / "dashboard-job.png")

            await browser.eval("location.hash = '#/'")
            row = f"#jobs-table tr[data-job-id=\"{job_id}\"]"
            await browser.wait_for(
                f"{text_of(row + ' .state')} === 'COMPLETED'", 30, "the job list to show COMPLETED"
            )
            assert await browser.eval(text_of(row + " .pct")) == "100%"

            # the key lives in sessionStorage and never went into a URL
            assert await browser.eval("sessionStorage.getItem('framespool.apiKey')") == key
            urls = await browser.eval(
                "[location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
            )
            assert urls and not any(key in u for u in urls), urls
            try:  # cleanup: the long job may already have finished (409 job_terminal)
                client.cancel(long_job)
            except ApiError as exc:
                assert exc.status == 409, exc
            assert browser.console_errors() == []
        finally:
            await browser.close()

    asyncio.run(go())
    log = (stack.log_dir / "api.log").read_text()
    assert key not in log and not re.search(r"sig=[0-9a-f]{8}", log)
