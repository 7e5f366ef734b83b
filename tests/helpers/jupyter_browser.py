"""JupyterLab in a real browser, for the browser tests: start a server, drive Chromium, Run All, read the result.

`JupyterLab.start(root, folder)` serves `root` from this venv on a free localhost port with a random token, its
settings, config and runtime folders under `folder` (notebooks render every cell, not only those in view, and
are never autosaved), and its kernels on the `tiny` profile; `stop()` shuts its kernels down and ends the server by its process id (its
process group), also after a failed test. `Browser` runs Debian's Chromium through Playwright with a fresh
profile. `Browser.run_all(lab, path)` opens a notebook, runs all its cells as the Run menu does, waits for the
kernel to go idle and the outputs to settle, and returns what each code cell shows (`CellView`); `problems`
turns that into lines naming the notebook and the cell.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.run_all import ALLOWED, CHECKER  # what a student notebook may show after Run All, as nbclient judges it

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    import playwright  # noqa: F401
    HAVE_PLAYWRIGHT = True
except ImportError:
    HAVE_PLAYWRIGHT = False
NEEDS_CHROMIUM = [  # what every test that drives Chromium needs (the browser tests, the hub test)
    pytest.mark.skipif(not CHROMIUM, reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.skipif(not HAVE_PLAYWRIGHT, reason="playwright is not installed (pip install -e '.[dev]')")]
BROWSER_MARKS = [pytest.mark.browser, pytest.mark.slow, *NEEDS_CHROMIUM]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
TALL = 4000  # the viewport's height while screenshots are taken
WIDGET_ERRORS = ("Error displaying widget", "Failed to load model class", "Failed to load view class",
                 "Could not create a view", "Click to show javascript error")  # the last: ipywidgets 8's error view
SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
            "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
            # no "get notified about Jupyter news?" toast over the screenshots
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"}}


def end_group(process: subprocess.Popen, term_wait: float) -> None:
    """End the process group `process` leads: TERM, up to term_wait seconds, then KILL."""
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JupyterLab:
    """A JupyterLab server this process started: its process, address and token."""

    process: subprocess.Popen
    url: str
    token: str
    log: Path

    @classmethod
    def start(cls, root: Path, folder: Path, timeout: float = 90) -> JupyterLab:
        for plugin, values in SETTINGS.items():  # every cell rendered; nothing ever saved over a notebook
            where = folder / "settings" / plugin
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(json.dumps(values))
        port, token = _free_port(), secrets.token_hex(16)
        env = {**os.environ, "LABKIT_PROFILE": "tiny", "JUPYTERLAB_SETTINGS_DIR": str(folder / "settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces"), "JUPYTER_CONFIG_DIR": str(folder / "config"),
               "JUPYTER_RUNTIME_DIR": str(folder / "runtime"), "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
        env.pop("LABKIT_CHECKS", None)  # the kernel must guess, as it does for a student: JupyterLab shows, not raises
        log = folder / "jupyterlab.log"
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--allow-root",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        with open(log, "wb") as out:
            process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        lab = cls(process, f"http://127.0.0.1:{port}", token, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-2000:]}")
            try:
                lab.api("status")
                return lab
            except OSError:
                time.sleep(0.5)
        lab.stop()
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{log.read_text()[-2000:]}")

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for kernel in self.api("kernels"):  # type: ignore[union-attr]
            self.api(f"kernels/{kernel['id']}", method="DELETE")

    def stop(self) -> None:
        """Shut the kernels down, then end the server's process group (its pid leads it): TERM, then KILL."""
        if self.process.poll() is None:
            try:
                self.shutdown_kernels()
            except OSError:
                pass
            end_group(self.process, 15)


@dataclass
class CellView:
    """One code cell as the page shows it after Run All."""

    index: int  # the cell's index in the notebook (markdown cells count)
    source: str
    executed: bool  # it has an execution count
    errors: list[tuple[str, str]]  # (ename, evalue) of each error output
    stderr: str
    text: str  # the cell's rendered outputs as text
    images: int  # image outputs in the cell's model
    shown_images: int  # <img> elements of its outputs that loaded (naturalWidth > 0)
    shown_widgets: int  # outputs showing a widget that rendered (no error view)


def problems(name: str, cells: list[CellView], student: bool = False) -> list[str]:
    """What is wrong with a notebook after Run All, one line per problem naming the notebook and the cell."""
    found = []
    if cells and not cells[-1].executed:
        found.append(f"{name}: Run All did not reach the last cell (cell {cells[-1].index})")
    for c in cells:
        where = f"{name}, cell {c.index}"
        for ename, evalue in c.errors:
            if not (student and ename in ALLOWED):
                found.append(f"{where}: {ename}: {evalue[:200]}")
        shown = next((e for e in WIDGET_ERRORS if e in c.text), None)
        if shown:  # a closed widget (a finished progress bar) shows nothing, and that is no fault
            found.append(f"{where}: a widget did not render ({shown})")
        if c.shown_images < c.images:
            found.append(f"{where}: {c.images - c.shown_images} of {c.images} figures not shown as images")
        if student and CHECKER in c.source and "not attempted" not in c.stderr + c.text:
            found.append(f"{where}: the checker did not report 'not attempted'")
    return found


_OPEN = """async (path) => {
  const app = window.jupyterapp;
  if (window.labkitNotebook) {  // the previous notebook: its kernel shut down, its tab closed
    await window.labkitNotebook.sessionContext.shutdown();
    window.labkitNotebook.context.model.dirty = false;  // no "save your work?" dialog: never saved
    window.labkitNotebook.dispose();
  }
  const widget = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  const late = new Promise((_, reject) => setTimeout(() => reject(new Error(
      `${path}: no kernel within 60 s (a notebook without a kernelspec asks for one)`)), 60000));
  await Promise.race([Promise.all([widget.context.ready, widget.sessionContext.ready]), late]);
  app.shell.activateById(widget.id);
  window.labkitNotebook = widget;
}"""
_CURRENT = "() => window.jupyterapp.shell.currentWidget === window.labkitNotebook"
_RUN_ALL = """async () => {
  const app = window.jupyterapp;
  await app.commands.execute('notebook:clear-all-cell-outputs');  // and execution counts: none is from this run
  for (const cell of window.labkitNotebook.content.widgets) {
    if (cell.model.type === 'code') cell.model.executionCount = null;
  }
  app.commands.execute('notebook:run-all-cells');  // not awaited: after an error it may never settle
}"""
_STARTED = """() => [...window.labkitNotebook.content.widgets].some(c => c.model.type === 'code' &&
                                                                 c.model.executionCount !== null)"""
_IDLE = """() => {
  const widget = window.labkitNotebook;
  const kernel = widget.sessionContext.session && widget.sessionContext.session.kernel;
  if (!kernel || kernel.status !== 'idle') return false;
  return ![...widget.content.widgets].some(c => c.model.type === 'code' && c.promptNode &&
                                                c.promptNode.textContent.includes('*'));
}"""
_CELLS = """() => {
  const widget = window.labkitNotebook;
  return [...widget.content.widgets].map((cell, index) => {
    if (cell.model.type !== 'code') return null;
    const outputs = cell.model.outputs.toJSON();
    const area = cell.node.querySelector('.jp-OutputArea') || cell.node;
    const imgs = [...area.querySelectorAll('.jp-OutputArea-output img')];
    return {index, source: cell.model.sharedModel.getSource(),
            executed: cell.model.executionCount !== null,
            errors: outputs.filter(o => o.output_type === 'error').map(o => [o.ename, o.evalue]),
            stderr: outputs.filter(o => o.output_type === 'stream' && o.name === 'stderr').map(o => o.text).join(''),
            text: area.innerText,
            images: outputs.filter(o => o.data && (o.data['image/png'] || o.data['image/jpeg'])).length,
            shown_images: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
            shown_widgets: [...area.querySelectorAll('.jp-OutputArea-output')]
                           .filter(v => v.querySelector('.jupyter-widgets') &&
                                        !v.querySelector('.jupyter-widgets-error-widget') &&
                                        !v.innerText.includes('Error displaying widget')).length};
  }).filter(c => c !== null);
}"""


class Browser:
    """Chromium through Playwright (headless, a fresh profile), one page on one JupyterLab."""

    def __init__(self, folder: Path) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        try:
            self.context = self._playwright.chromium.launch_persistent_context(
                str(folder / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1280, "height": 900})
        except Exception:
            self._playwright.stop()
            raise
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        self._lab: JupyterLab | None = None

    def close(self) -> None:
        try:
            self.context.close()
        finally:
            self._playwright.stop()

    def open_lab(self, lab: JupyterLab) -> None:
        self.page.goto(f"{lab.url}/lab?reset&token={lab.token}", wait_until="domcontentloaded")
        self.page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined",
                                    timeout=60_000)
        self.page.evaluate("async () => { await window.jupyterapp.started; await window.jupyterapp.restored; }")
        self._lab = lab

    def run_all(self, path: str, timeout: float = 240) -> list[CellView]:
        """Open `path` (relative to the server's root), Run All, wait until idle; each code cell as shown."""
        self.page.evaluate(_OPEN, path)
        self.page.wait_for_function(_CURRENT, timeout=30_000, polling=100)
        self.page.wait_for_function(_IDLE, timeout=60_000, polling=250)
        self.page.evaluate(_RUN_ALL)
        self.page.wait_for_function(_STARTED, timeout=60_000, polling=250)
        deadline = time.monotonic() + timeout
        while True:  # idle, and still idle a moment later: between two cells a loaded machine can look idle
            self.page.wait_for_function(_IDLE, timeout=max(1.0, deadline - time.monotonic()) * 1000, polling=500)
            self.page.wait_for_timeout(1500)
            if self.page.evaluate(_IDLE) or time.monotonic() > deadline:
                break
        self.settle()
        return [CellView(**c) for c in self.page.evaluate(_CELLS)]

    def settle(self, quiet: float = 1.0, most: float = 20) -> None:
        """Wait until every image has loaded and the page stopped changing for `quiet` seconds."""
        self.page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea-output img')]"
                                    ".every(i => i.complete)", timeout=most * 1000)
        last, since, start = None, time.monotonic(), time.monotonic()
        while time.monotonic() - start < most:
            now = self.page.evaluate("() => document.querySelector('.jp-Notebook')?.innerHTML.length || 0")
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.2)

    def screenshot(self, path: Path) -> Path:
        """The whole current notebook as one PNG: the scrolled panel taken a tall screen at a time, stitched."""
        scroller = f"#{self.page.evaluate('() => window.labkitNotebook.id')} .jp-WindowedPanel-outer"
        height = self.page.evaluate(f"() => document.querySelector('{scroller}').scrollHeight")
        screen = self.page.viewport_size
        self.page.set_viewport_size({"width": screen["width"], "height": TALL})  # fewer, taller shots
        self.page.wait_for_timeout(300)  # JupyterLab lays the panel out again
        try:
            return self._stitch(scroller, height, path)
        finally:
            self.page.set_viewport_size(screen)

    def _stitch(self, scroller: str, height: int, path: Path) -> Path:
        from PIL import Image

        box = self.page.locator(scroller).bounding_box()
        view = int(box["height"])
        parts = []
        for top in range(0, max(height, 1), view):
            self.page.evaluate(f"(t) => {{ document.querySelector('{scroller}').scrollTop = t; }}", top)
            time.sleep(0.15)
            shown = self.page.evaluate(f"() => document.querySelector('{scroller}').scrollTop")
            shot = Image.open(io.BytesIO(self.page.locator(scroller).screenshot()))
            parts.append(shot.crop((0, top - shown, shot.width, top - shown + min(view, height - top))))
        sheet = Image.new("RGB", (parts[0].width, sum(p.height for p in parts)), "white")
        y = 0
        for p in parts:
            sheet.paste(p, (0, y))
            y += p.height
        path.parent.mkdir(parents=True, exist_ok=True)
        sheet.save(path)
        return path
