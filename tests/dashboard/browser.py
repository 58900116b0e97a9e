"""Headless Chromium driven over the DevTools protocol (with the `websockets` client, which uvicorn uses):
open a page, wait until a condition holds in it, read the DOM, take a screenshot."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager

import httpx
from websockets.asyncio.client import connect

from tests.server.conftest import free_port

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--window-size=1400,1800"]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def chromium():
    port = free_port()
    profile = tempfile.mkdtemp(prefix="kvobs-chromium-")
    proc = subprocess.Popen(
        [chromium_binary(), *FLAGS, f"--remote-debugging-port={port}", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                page = next(t for t in targets if t["type"] == "page")
                break
            except (httpx.HTTPError, StopIteration):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield Page(page["webSocketDebuggerUrl"])
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


class Page:
    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url
        self._ids = itertools.count(1)

    def run(self, coro):
        return asyncio.run(coro)

    async def _call(self, ws, method: str, **params):
        message_id = next(self._ids)
        await ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page as it is now."""

        async def go():
            async with connect(self.ws_url) as ws:
                result = await self._call(ws, "Runtime.evaluate", expression=expression, returnByValue=True)
                return result["result"].get("value")

        return self.run(go())

    def visit(
        self, url: str, ready_js: str, *, timeout_s: float = 60.0, settle_s: float = 1.5, scroll_js: str | None = None
    ) -> tuple[str, bytes]:
        """Load `url`, wait until `ready_js` is true, run `scroll_js` (to bring a part of the page into view), then
        return (the page's text, a PNG screenshot)."""

        async def go():
            async with connect(self.ws_url, max_size=64 * 2**20) as ws:
                await self._call(ws, "Page.enable")
                await self._call(ws, "Page.navigate", url=url)
                deadline = time.monotonic() + timeout_s
                while True:
                    result = await self._call(
                        ws, "Runtime.evaluate", expression=f"Boolean({ready_js})", returnByValue=True
                    )
                    if result["result"].get("value"):
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{url}: not ready after {timeout_s:.0f} s ({ready_js})")
                    await asyncio.sleep(0.25)
                await asyncio.sleep(settle_s)  # charts draw after the elements appear
                if scroll_js:
                    await self._call(ws, "Runtime.evaluate", expression=scroll_js)
                    await asyncio.sleep(0.5)
                text = await self._call(
                    ws, "Runtime.evaluate", expression="document.body.innerText", returnByValue=True
                )
                shot = await self._call(ws, "Page.captureScreenshot", format="png", captureBeyondViewport=False)
                return text["result"]["value"], base64.b64decode(shot["data"])

        return self.run(go())
