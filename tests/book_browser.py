"""Read built book pages in a headless Chromium through the DevTools protocol (``websockets``):
per page the console errors and uncaught exceptions, the page height and the figures wider than
the content column. Used by tests/test_book.py; :func:`find_chromium` says where no browser is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

VIEWPORT = (1400, 900)  # a laptop screen: the book's column is 784 px wide at this width

_MEASURE = """(() => {
  const main = document.querySelector('main') || document.body;
  const column = (document.querySelector('article.bd-article') || main).getBoundingClientRect().width;
  const figures = [...document.querySelectorAll('.plotly-graph-div')].map(d => {
    const svg = d.querySelector('.main-svg');
    return {id: d.id, width: d.getBoundingClientRect().width, drawn: svg ? svg.getBoundingClientRect().width : 0};
  });
  return JSON.stringify({height: document.documentElement.scrollHeight, column, figures,
                         overflow: document.documentElement.scrollWidth > document.documentElement.clientWidth});
})()"""


def find_chromium() -> str | None:
    """A Chromium or Chrome executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


class Browser:
    """One headless Chromium; :meth:`read` loads a page and returns what it logged and measured."""

    def __init__(self, executable: str):
        self.profile = tempfile.mkdtemp(prefix="rlparity-chromium-")
        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
             "--allow-file-access-from-files", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        else:
            self.close()
            raise RuntimeError("chromium did not open its DevTools port in 30 s")
        port = port_file.read_text().split()[0]
        import urllib.request

        for _ in range(50):
            try:
                targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json").read())
                break
            except OSError:
                time.sleep(0.1)
        page = next(t for t in targets if t.get("type") == "page")
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None)
        self._id = 0
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self._call(method)
        self._call("Emulation.setDeviceMetricsOverride", width=VIEWPORT[0], height=VIEWPORT[1],
                   deviceScaleFactor=1, mobile=False)

    def _call(self, method: str, events: list | None = None, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if events is not None and "method" in msg:
                events.append(msg)

    def read(self, page: str | os.PathLike, settle: float = 1.5) -> dict:
        """Load ``page`` (a file), wait for it and for ``settle`` seconds more (plotly draws after
        load), return ``{"errors": [...], "height": px, "screens": height / 900, "column": px,
        "figures": [{"id", "width", "drawn"}], "overflow": bool}``."""
        events: list = []
        self._call("Page.navigate", events, url=Path(page).resolve().as_uri())
        deadline = time.time() + 60
        while time.time() < deadline and not any(e["method"] == "Page.loadEventFired" for e in events):
            try:
                events.append(json.loads(self.ws.recv(timeout=1)))
            except TimeoutError:
                pass
        end = time.time() + settle
        while time.time() < end:
            try:
                events.append(json.loads(self.ws.recv(timeout=max(0.05, end - time.time()))))
            except TimeoutError:
                break
        result = self._call("Runtime.evaluate", events, expression=_MEASURE, returnByValue=True)
        measured = json.loads(result["result"]["value"])
        errors = []
        for e in events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append((d.get("exception") or {}).get("description") or d.get("text", "exception"))
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(f"{p['entry'].get('text', '')} {p['entry'].get('url', '')}".strip())
        return {**measured, "errors": errors, "screens": measured["height"] / VIEWPORT[1]}

    def close(self):
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - closing a browser that already went away
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def read_pages(html_dir: str | os.PathLike, pages: list[str]) -> dict[str, dict]:
    """:meth:`Browser.read` for each of ``pages`` (paths relative to ``html_dir``), one browser."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no chromium found")
    browser = Browser(exe)
    try:
        return {p: browser.read(Path(html_dir) / p) for p in pages}
    finally:
        browser.close()
