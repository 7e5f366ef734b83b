"""A real JupyterHub on loopback for the hub test: `Hub.start(folder)` boots JupyterHub with its
configurable-http-proxy (from npm), a shared-password authenticator and one single-user JupyterLab per student
from this venv, each in a home of its own under `folder`; `stop()` ends the hub, which stops every student's
server (`cleanup_servers`), then anything of it still running. `Student` is one student in Chromium: log in,
pull the bundle with an nbgitpuller link as the README says, Run All a notebook, and the peak memory (VmHWM) of
the kernel and the server.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from helpers.jupyter_browser import (_CELLS, _CURRENT, _IDLE, _OPEN, _RUN_ALL, _STARTED, SETTINGS, CellView, _free_port,
                             end_group)

PROXY = shutil.which("configurable-http-proxy")
_RESTART = """async () => {  // each open notebook's kernel, through the notebook's own connection (its status follows)
  let restarted = 0;
  for (const widget of window.jupyterapp.shell.widgets('main')) {
    const kernel = widget.sessionContext && widget.sessionContext.session && widget.sessionContext.session.kernel;
    if (!kernel) continue;
    await kernel.restart();
    restarted += 1;
  }
  return restarted;
}"""
_EDIT = """async ({path, sources}) => {  // what a student does: write into cells, then File > Save (JupyterLab's own save)
  const app = window.jupyterapp;
  const widget = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await widget.context.ready;
  let written = 0;
  for (const cell of widget.content.widgets) {
    if (cell.model.id in sources) {
      cell.model.sharedModel.setSource(sources[cell.model.id]);
      written += 1;
    }
  }
  await widget.context.save();
  await widget.sessionContext.shutdown();
  widget.dispose();
  return written;
}"""
_DUPLICATE = """async (path) => {  // the file browser's Duplicate: a copy beside it, named NAME-Copy1
  const folder = path.split('/').slice(0, -1).join('/');
  return (await window.jupyterapp.serviceManager.contents.copy(path, folder)).path;
}"""
_RENAME = "async ([from, to]) => (await window.jupyterapp.serviceManager.contents.rename(from, to)).path"
_TERMINAL = """async () => {  // File > New > Terminal: a shell of the student's server, its output kept
  const session = await window.jupyterapp.serviceManager.terminals.startNew();
  window.labkitTerminal = {session, out: ''};
  session.messageReceived.connect((_, msg) => {
    if (msg.type === 'stdout') window.labkitTerminal.out += msg.content[0];
  });
  return session.name;
}"""
_EXIT = re.compile(r"@@rc=(\d+)")  # printed after each command; its echo reads '@@rc=' "$?", never a digit after =
PASSWORD = "labkit-hub-test"  # the shared password every student logs in with
CONFIG = """
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.pid_file = {folder!r} + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + {folder!r} + "/hub.sqlite"
c.JupyterHub.cookie_secret_file = {folder!r} + "/cookie_secret"
c.JupyterHub.pid_file = {folder!r} + "/hub.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {password!r}
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"  # every student's server as this user, in a home of its own
c.SimpleLocalProcessSpawner.home_dir_template = {folder!r} + "/home/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--allow-root", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
                  "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {environment!r}
c.Spawner.environment["PYTHONPATH"] = lambda spawner: {folder!r} + "/home/" + spawner.user.name + "/" + {pythonpath!r}
"""


@dataclass
class Hub:
    """A JupyterHub this process started: its process, address and log."""

    process: subprocess.Popen
    url: str
    folder: Path
    api_port: int  # the proxy's: its command line names it

    @classmethod
    def start(cls, folder: Path, environment: dict[str, str], pythonpath: str, timeout: float = 90) -> Hub:
        """environment: every student's server's; pythonpath: a folder of each home put first on sys.path."""
        settings = folder / "settings"
        for plugin, values in SETTINGS.items():  # every cell rendered; nothing ever saved over a notebook
            (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
            (settings / plugin).write_text(__import__("json").dumps(values))
        port, hub_port, api_port = _free_port(), _free_port(), _free_port()
        if len({port, hub_port, api_port}) < 3:
            raise RuntimeError("three free ports came out the same; run again")
        config = folder / "jupyterhub_config.py"
        config.write_text(CONFIG.format(
            port=port, hub_port=hub_port, api_port=api_port, proxy=PROXY, folder=str(folder),
            password=PASSWORD, singleuser=str(Path(sys.executable).with_name("jupyterhub-singleuser")),
            environment={**environment, "JUPYTERLAB_SETTINGS_DIR": str(settings)}, pythonpath=pythonpath))
        log = folder / "hub.log"
        with open(log, "wb") as out:
            process = subprocess.Popen([str(Path(sys.executable).with_name("jupyterhub")), "-f", str(config)],
                                       cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        hub = cls(process, f"http://127.0.0.1:{port}", folder, api_port)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"JupyterHub exited with {process.returncode}:\n{hub.log()}")
                try:
                    with urllib.request.urlopen(f"{hub.url}/hub/login", timeout=5) as reply:
                        if reply.status == 200:
                            return hub
                except OSError:
                    pass
                time.sleep(0.5)
            raise RuntimeError(f"JupyterHub did not answer within {timeout:.0f} s:\n{hub.log()}")
        except BaseException:
            hub.stop()
            raise

    def log(self) -> str:
        return (self.folder / "hub.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """TERM the hub (it stops the students' servers and its proxy), then KILL whatever of it is left: the
        proxy and each server run in sessions of their own, so they are found by their command line and their
        environment, not by the hub's process group."""
        end_group(self.process, 30)
        for pid in processes(lambda env, cmd: str(self.folder) in env.get("HOME", "")
                             or ("configurable-http-proxy" in cmd and f"--api-port {self.api_port}" in cmd)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def processes(match) -> list[int]:  # noqa: ANN001
    """Pids of this machine's processes whose (environment, command line) match(env, cmd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw_env = (entry / "environ").read_bytes()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        env = dict(kv.split("=", 1) for kv in raw_env.decode(errors="replace").split("\0") if "=" in kv)
        if match(env, cmd):
            found.append(int(entry.name))
    return found


def peak_rss(pid: int) -> int:
    """Bytes of the process's peak resident memory (VmHWM), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Student:
    """One student's page in Chromium on the hub."""

    def __init__(self, hub: Hub, context, name: str) -> None:  # noqa: ANN001
        self.hub, self.name, self.page = hub, name, context.new_page()

    def log_in(self) -> None:
        self.page.goto(f"{self.hub.url}/hub/login", wait_until="domcontentloaded")
        self.page.fill("#username_input", self.name)
        self.page.fill("#password_input", PASSWORD)
        self.page.click("#login_submit")
        self.page.wait_for_url(f"**/user/{self.name}/**", timeout=180_000)
        self._wait_for_lab()

    def pull(self, repo: str, urlpath: str) -> None:
        """The README's nbgitpuller link, opened as a student clicks it."""
        query = urllib.parse.urlencode({"repo": repo, "branch": "main", "urlpath": urlpath})
        self.page.goto(f"{self.hub.url}/hub/user-redirect/git-pull?{query}", wait_until="domcontentloaded")
        self.page.wait_for_url(f"**/user/{self.name}/lab/**", timeout=180_000)
        self._wait_for_lab()

    def _wait_for_lab(self) -> None:
        self.page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined",
                                    timeout=180_000)
        self.page.evaluate("async () => { await window.jupyterapp.started; await window.jupyterapp.restored; }")

    def start_run_all(self, path: str) -> None:
        """Open `path` (relative to the student's home) and start Run All, not waiting for it to end."""
        self.page.evaluate(_OPEN, path)
        self.page.wait_for_function(_CURRENT, timeout=30_000, polling=100)
        self.page.wait_for_function(_IDLE, timeout=120_000, polling=250)
        self.page.evaluate(_RUN_ALL)
        self.page.wait_for_function(_STARTED, timeout=120_000, polling=250)

    def restart_kernels(self) -> int:
        """Kernel > Restart Kernel for every kernel this student's server runs (what `make hub` tells a student
        whose notebook was open before the install: a kernel started then cannot import the kit); how many."""
        return self.page.evaluate(_RESTART)

    def finish(self, timeout: float = 600) -> list[CellView]:
        """Wait until the kernel is idle and stays so; each code cell as shown."""
        deadline = time.monotonic() + timeout
        while True:
            self.page.wait_for_function(_IDLE, timeout=max(1.0, deadline - time.monotonic()) * 1000, polling=500)
            self.page.wait_for_timeout(1500)
            if self.page.evaluate(_IDLE) or time.monotonic() > deadline:
                break
        return [CellView(**c) for c in self.page.evaluate(_CELLS)]

    def edit(self, path: str, sources: dict[str, str]) -> int:
        """Open `path` (below the home), write `sources` (cell id -> source) into its cells and save it, as a
        student does in JupyterLab; how many cells were written."""
        return self.page.evaluate(_EDIT, {"path": path, "sources": sources})

    def duplicate(self, path: str) -> str:
        """The file browser's Duplicate of `path`; the copy's path."""
        return self.page.evaluate(_DUPLICATE, path)

    def rename(self, path: str, to: str) -> str:
        return self.page.evaluate(_RENAME, [path, to])

    def terminal(self, commands: list[str], timeout: float = 900) -> list[tuple[int, str]]:
        """Each command typed into a new JupyterLab terminal of this student's server, one after the other:
        (its exit status, what the terminal showed meanwhile, colours and carriage returns dropped)."""
        self.page.evaluate(_TERMINAL)
        self.page.wait_for_function("() => window.labkitTerminal.out.length > 0", timeout=60_000)
        done = []
        for command in commands:
            start = self.page.evaluate("() => window.labkitTerminal.out.length")
            self.page.evaluate("(text) => window.labkitTerminal.session.send({type: 'stdin', content: [text]})",
                               f"{command}; printf '%s%s\\n' '@@rc=' \"$?\"\r")
            self.page.wait_for_function(f"() => /@@rc=\\d+/.test(window.labkitTerminal.out.slice({start}))",
                                        timeout=timeout * 1000, polling=1000)
            shown = self.page.evaluate(f"() => window.labkitTerminal.out.slice({start})")
            text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", shown)
            done.append((int(_EXIT.search(text).group(1)), text))
        return done

    def kernel_labkit(self) -> str:
        """Where `import labkit` leads in this student's running kernel: its environment and folder, asked anew."""
        (pid,) = processes(lambda env, cmd: env.get("JUPYTERHUB_USER") == self.name and "ipykernel" in cmd)
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv)
        found = subprocess.run([sys.executable, "-c", "import labkit; print(labkit.__file__)"], env=env,
                               cwd=os.readlink(f"/proc/{pid}/cwd"), capture_output=True, text=True, check=True)
        return found.stdout.strip()

    def peaks(self) -> tuple[int, int]:
        """(the kernel's, the server's) peak resident bytes: this student's processes, found by JUPYTERHUB_USER."""
        mine = lambda env, cmd: env.get("JUPYTERHUB_USER") == self.name  # noqa: E731
        kernels = processes(lambda env, cmd: mine(env, cmd) and "ipykernel" in cmd)
        servers = processes(lambda env, cmd: mine(env, cmd) and "jupyterhub-singleuser" in cmd)
        return sum(map(peak_rss, kernels)), sum(map(peak_rss, servers))
