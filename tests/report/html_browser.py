"""A headless Chromium for the HTML report's tests and benchmark, driven through chromedriver.

Why chromedriver: it is Debian's own package beside ``chromium`` (same version, no browser
download), it speaks the W3C WebDriver protocol, plain HTTP + JSON that ``urllib`` drives, so
the tests need no Python package; and it returns the page's console messages (``goog:loggingPrefs``),
which ``chromium --dump-dom`` / ``--screenshot`` cannot.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = (
    None
    if CHROMIUM and CHROMEDRIVER
    else "needs headless Chromium: apt-get install -y chromium chromium-driver (.ci/run installs it)"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Browser:
    """One chromedriver process and one headless Chromium session (``with Browser() as b``)."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        assert MISSING is None, MISSING
        self.port = _free_port()
        self.size = (width, height)
        self.process: subprocess.Popen[bytes] | None = None
        self.session = ""

    def __enter__(self) -> Browser:
        assert CHROMEDRIVER is not None
        self.process = subprocess.Popen(
            [CHROMEDRIVER, f"--port={self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        width, height = self.size
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    f"--window-size={width},{height}",
                    "--hide-scrollbars",
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }
        reply = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.session = reply["sessionId"]
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.session:
                self._call("DELETE", f"/session/{self.session}")
        finally:
            if self.process is not None:
                self.process.terminate()
                self.process.wait(timeout=10)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"{}").get("value")

    def _session(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, path: Path) -> None:
        """Load a file and wait until it is loaded (WebDriver's page-load strategy)."""
        self._session("POST", "/url", {"url": path.resolve().as_uri()})

    def run(self, script: str, *args: Any) -> Any:
        """The value of a script's ``return`` in the page."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def click(self, css: str) -> None:
        element = self._session("POST", "/element", {"using": "css selector", "value": css})
        ident = next(iter(element.values()))
        self._session("POST", f"/element/{ident}/click", {})

    def console(self) -> list[dict[str, Any]]:
        """The console messages (and uncaught errors) since the last call."""
        return list(self._session("POST", "/se/log", {"type": "browser"}))

    def media(self, media: str) -> None:
        """Lay the page out for ``print`` (or ``screen``), through chromedriver's DevTools call."""
        self._session(
            "POST",
            "/goog/cdp/execute",
            {"cmd": "Emulation.setEmulatedMedia", "params": {"media": media}},
        )

    def print_pdf(self) -> bytes:
        """The page printed (WebDriver's Print Page: A4-ish defaults, backgrounds off)."""
        return base64.b64decode(self._session("POST", "/print", {"background": True}))

    def resize(self, width: int, height: int) -> None:
        self._session("POST", "/window/rect", {"width": width, "height": height})

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))
