"""`labkit grade` where unprivileged user namespaces are off (a hub's pod, a hardened host): one line naming the
setting and what to do, found by forcing bubblewrap to fail as it fails there."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.course.grade import sandbox

ROOT = Path(__file__).resolve().parent.parent
# what bubblewrap 0.8 prints where the kernel allows no unprivileged user namespace (bubblewrap's bubblewrap.c)
DEBIAN = ("bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged "
          "user namespaces. On e.g. debian this can be enabled with 'sysctl kernel.unprivileged_userns_clone=1'.")
POD = "bwrap: Creating new namespace failed: Operation not permitted"


def _fake_bwrap(folder: Path, message: str) -> Path:
    fake = folder / "bwrap"
    fake.write_text(f"#!/bin/sh\necho \"{message}\" >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


def _proc_sys(folder: Path, **settings: str) -> Path:
    root = folder / "sys"
    for name, value in settings.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return root


@pytest.fixture
def failing_bwrap(tmp_path, monkeypatch):
    def force(message: str, **settings: str) -> None:
        fake = _fake_bwrap(tmp_path, message)
        monkeypatch.setattr(sandbox, "bwrap", lambda: str(fake))
        monkeypatch.setattr(sandbox, "_privileged", lambda: False)  # the grader's own user: no setpriv
        proc = _proc_sys(tmp_path, **settings)
        real = sandbox.userns_off
        monkeypatch.setattr(sandbox, "userns_off", lambda stderr: real(stderr, proc))
    return force


def test_the_debian_switch_off_is_named_in_one_line_with_what_to_do(failing_bwrap):
    failing_bwrap(DEBIAN, kernel__unprivileged_userns_clone="0", user__max_user_namespaces="63000")
    why = sandbox.unusable()
    assert why is not None and "\n" not in why
    assert "kernel.unprivileged_userns_clone is 0" in why and "user.max_user_namespaces" not in why
    assert "sysctl -w kernel.unprivileged_userns_clone=1" in why and "grade on another machine" in why


def test_no_user_namespaces_at_all_is_named(failing_bwrap):
    failing_bwrap(POD, user__max_user_namespaces="0")
    why = sandbox.unusable()
    assert "user.max_user_namespaces is 0" in why and "sysctl -w user.max_user_namespaces=15000" in why


def test_a_pod_that_forbids_them_with_the_settings_on_blames_the_container(failing_bwrap):
    failing_bwrap(POD, kernel__unprivileged_userns_clone="1", user__max_user_namespaces="63000")
    why = sandbox.unusable()
    assert "seccomp" in why and "grade on another machine" in why and "\n" not in why


def test_another_failure_keeps_its_own_message(failing_bwrap):
    failing_bwrap("bwrap: Unknown option --disable-userns", kernel__unprivileged_userns_clone="0")
    assert "bubblewrap 0.8 or newer" in sandbox.unusable()


def test_the_command_line_says_it_in_one_line(tmp_path):
    """`python -m labkit grade` run with a bwrap on PATH that fails as the kernel makes it fail, and not as root
    (root drops to a uid with setpriv first): the line it prints names the setting."""
    import os
    _fake_bwrap(tmp_path, DEBIAN)
    if os.geteuid() == 0:  # as root the probe runs under unshare and setpriv: ones that run the command as it is
        (tmp_path / "unshare").write_text('#!/bin/sh\nn=0\nwhile [ $# -gt 0 ]; do if [ "$1" = -- ]; then n=$((n+1)); '
                                          'if [ $n = 2 ]; then shift; exec "$@"; fi; fi; shift; done\n')
        (tmp_path / "setpriv").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
        for name in ("unshare", "setpriv"):
            (tmp_path / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "class" / "ada").mkdir(parents=True)  # a class to grade: an empty one is refused before the box
    shutil.copy(ROOT / "notebooks" / "02_recompute.ipynb", tmp_path / "class" / "ada")
    done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(tmp_path / "class"), "--labs", "02", "--out",
                           str(tmp_path / "g.csv")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("labkit grade: unprivileged user namespaces are off here"), done.stderr[-2000:]
    assert "kernel.unprivileged_userns_clone" in line or "user.max_user_namespaces" in line


def test_another_permission_failure_is_not_called_user_namespaces(failing_bwrap):
    """A mount refused inside the box also says "Operation not permitted": that is not user namespaces being off,
    and the message says what bwrap said instead."""
    failing_bwrap("bwrap: Can't mount proc on /newroot/proc: Operation not permitted", user__max_user_namespaces="0")
    why = sandbox.unusable()
    assert "user namespaces are off" not in why and "Can't mount proc" in why


def test_no_pid_namespace_to_read_refuses_the_box(monkeypatch):
    """Where /proc/self/ns/pid cannot be read, a box's worker could not be told from one outside any box (and, its
    parent pid 1, would end at once): unusable() says so before any box is made."""
    monkeypatch.setattr(sandbox, "bwrap", lambda: "/bin/true")
    monkeypatch.setattr(sandbox, "_pid_namespace", lambda: "")
    why = sandbox.unusable()
    assert why is not None and "/proc/self/ns/pid cannot be read" in why, why
