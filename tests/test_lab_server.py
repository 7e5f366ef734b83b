"""`make lab` serves JupyterLab on the kit's folder: the URL it prints answers 200, both notebooks/ and
solutions/ are served, and it opens on the first notebook."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answer(url: str, server: subprocess.Popen, log: Path, seconds: float = 60.0):
    """The response to url once the server listens. jupyter_server prints its URL before its event loop binds the
    port (ServerApp.init_httpserver queues _bind_http_server on the loop; start_app logs the URL first), so on a
    loaded machine a connection can be refused for a moment after the URL is printed."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return urllib.request.urlopen(url, timeout=30)
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                state = "ended" if server.poll() is not None else "runs"
                raise AssertionError(f"{url}: {e.reason}; the server {state}; its log ends:\n"
                                     f"{log.read_text()[-2000:]}") from e
            if server.poll() is not None:
                raise AssertionError(f"the server ended ({server.returncode}); its log ends:\n"
                                     f"{log.read_text()[-2000:]}") from e
            time.sleep(0.5)


def test_make_lab_serves_jupyterlab_at_the_printed_url(tmp_path):
    port = free_port()
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        server = subprocess.Popen(["make", "-s", "lab", f"PORT={port}"], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = None
        for _ in range(120):  # up to 60 s for the server to print its URL
            found = re.search(rf"http://127\.0\.0\.1:{port}/lab[^?\s]*\?token=(\w+)", log.read_text())
            if found:
                url = found.group(0)
                break
            if server.poll() is not None:
                break
            time.sleep(0.5)
        assert url, f"no URL printed; the log ends:\n{log.read_text()[-2000:]}"
        with answer(url, server, log) as response:
            assert response.status == 200
        base, token = f"http://127.0.0.1:{port}", found.group(1)
        with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=30) as response:
            listed = {item["name"]: item["type"] for item in json.load(response)["content"]}
        assert listed.get("notebooks") == "directory" and listed.get("solutions") == "directory", listed
        with urllib.request.urlopen(f"{base}/api/contents/notebooks/00_start_here.ipynb?token={token}&content=0",
                                    timeout=30) as response:
            assert json.load(response)["type"] == "notebook"
        assert url.startswith(f"{base}/lab/tree/notebooks/00_start_here.ipynb?token="), url  # opens on lab 00
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
