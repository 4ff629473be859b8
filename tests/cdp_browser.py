"""A headless Chromium driven over the DevTools protocol (aiohttp's websocket client), for the
page tests: navigate, evaluate, screenshot, and collect every console error and uncaught
exception the pages produce."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.processes import wait_for

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--window-size=1280,900", "--remote-debugging-port=0", "--remote-allow-origins=*")


class Browser:
    """One Chromium process and its first page; use as ``async with Browser() as b``."""

    def __init__(self) -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="pages-chromium-")
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self.proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> Browser:
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = Path(self.profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("Chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        # --window-size includes the window's frame; the viewport itself must be 1280 x 900.
        await self.send("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                        deviceScaleFactor=1, mobile=False)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self._reader.cancel()
        await self.ws.close()
        await self.session.close()
        if self.proc is not None:
            # Chromium's helpers (crashpad, utility processes) keep writing to the profile for a
            # moment after the browser exits: stop the whole process group, then delete.
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        wait_for(self._profile_removed, 10, "Chromium's profile directory to be removed", 0.2)

    def _profile_removed(self) -> bool:
        try:
            self.profile.cleanup()
        except OSError:
            return False  # a helper that was just killed had written a file: try again
        return True

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                self._waiting.pop(data["id"]).set_result(data)
                continue
            method, params = data.get("method", ""), data.get("params", {})
            if method == "Runtime.exceptionThrown":
                self.errors.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                self.errors.append(json.dumps(params["args"])[:500])
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                self.errors.append(f"{params['entry'].get('url')}: {params['entry']['text']}")
            if method in self._events:
                self._events[method].set()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its ``result`` (raises on a protocol error)."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        loaded = self._events["Page.loadEventFired"] = asyncio.Event()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(loaded.wait(), 30)

    async def submit(self, selector: str) -> None:
        """Submit the form at ``selector`` and wait for the next page's load event."""
        loaded = self._events["Page.loadEventFired"] = asyncio.Event()
        await self.eval(f"document.querySelector({json.dumps(selector)}).submit()")
        await asyncio.wait_for(loaded.wait(), 30)

    async def eval(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        """A PNG of the viewport, or of the whole page (to look at everything a test saw)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = (await self.send("Page.getLayoutMetrics"))["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={
                "x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        shot = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(shot["data"]))
