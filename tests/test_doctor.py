"""doctor: every failure path with injected values; the real machine only for shape, never for verdicts."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

dr = importlib.import_module("labkit.env.doctor")  # `labkit.env.doctor` the attribute is the function
from labkit.env.doctor import Check, DoctorReport


# -- torch -------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1+cu128", "2.13.0.dev20260101"])
def test_a_tested_torch_passes(version):
    c = dr.check_torch(version)
    assert c.ok and "the whole suite's (CI, on a CPU)" in c.detail


def test_a_torch_every_lab_ran_on_on_a_gpu_passes_and_says_where():
    c = dr.check_torch("2.11.0+cu130")
    assert c.ok and "every lab ran on an H200 (docs/gpu/" in c.detail and "CI runs the whole suite on 2.13" in c.detail


def test_every_gpu_torch_has_its_passing_record():
    """The record GPU_TORCH names ran every lab under that torch; each of its rows passed there, or in a rerun of
    that row the same day (`gpu-check --only ROW`: the record's name with -2, -3, ...), the latest run deciding."""
    root = Path(dr.__file__).resolve().parents[2]
    assert dr.GPU_TORCH  # the floor below CI's torch stands on these records
    for release, where in dr.GPU_TORCH.items():
        path = root / re.search(r"\((docs/gpu/[^)]+)\.json\)", where)[1]
        reruns = sorted(path.parent.glob(f"{path.name}-[0-9]*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        runs = [path.parent / f"{path.name}.json", *reruns]  # in the order they ran: -2 before -10
        latest = {}
        for run in map(json.loads, (p.read_text() for p in runs)):
            assert tuple(int(v) for v in run["torch"].split(".")[:2]) == release
            latest.update({r["key"]: r["ok"] for r in run["rows"]})
        assert {f"lab{n:02d}" for n in range(8)} <= set(latest) and all(latest.values()), latest


@pytest.mark.parametrize("version, detail", [
    (None, "torch does not import"),
    ("2.10.1", "torch 2.10.1 is older than 2.11, the oldest labkit was tested on"),
    ("2.5.0", "older than 2.11"),
    ("1.13.1+cu117", "older than 2.11"),
])
def test_torch_missing_or_old_fails_with_pip_fix(version, detail):
    c = dr.check_torch(version)
    assert not c.ok and c.severity == "error" and detail in c.detail
    assert 'pip install "torch>=2.11"' in c.fix


@pytest.mark.parametrize("version, where", [("2.14.0", "newer than the releases"), ("3.0", "newer than the releases"),
                                            ("2.12.1", "a release")])
def test_an_untested_torch_is_a_warning_naming_what_was_tested(version, where):
    c = dr.check_torch(version)
    assert not c.ok and c.severity == "warning" and f"is {where} labkit was not tested on" in c.detail
    assert "(CI: 2.13 on a CPU; GPU: 2.11)" in c.detail


def test_the_lowest_torch_allowed_is_the_oldest_tested_and_the_pinned_one_is_tested():
    root = dr.__file__.rsplit("/labkit/", 1)[0]
    pyproject = open(f"{root}/pyproject.toml").read()
    assert f'"torch>={".".join(map(str, dr.MIN_TORCH))}",' in pyproject
    pin = re.search(r"^TORCH_SPEC \?= torch==(\d+)\.(\d+)\.", open(f"{root}/tools/kit.mk").read(), re.M)
    assert (int(pin[1]), int(pin[2])) in dr.TESTED_TORCH


# -- profile ---------------------------------------------------------------------

def test_profile_ok():
    c = dr.check_profile(lambda: "tiny")
    assert c.ok and c.detail == "profile tiny"


def test_profile_invalid_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "huge")
    c = dr.check_profile()  # the real labkit.env.profile.profile(), reading the patched variable
    assert not c.ok
    assert "LABKIT_PROFILE='huge' is not a profile" in c.detail
    assert "unset LABKIT_PROFILE" in c.fix


def test_profile_without_torch_is_reported():
    def resolve():
        raise ImportError("No module named 'torch'")

    c = dr.check_profile(resolve)
    assert not c.ok and "needs torch" in c.detail and c.needs == "torch"
    assert "LABKIT_PROFILE" not in c.fix  # the variable is not what is wrong


# -- packages ------------------------------------------------------------------------

def test_the_packages_checked_are_pyproject_s_dependencies():
    import tomllib

    pyproject = tomllib.loads((Path(dr.__file__).parents[2] / "pyproject.toml").read_text())
    assert dr.REQUIRED == tuple(pyproject["project"]["dependencies"])


def test_packages_all_there_pass():
    c = dr.check_packages([])
    assert c.ok and c.detail == f"all {len(dr.REQUIRED)} the labs need"


def test_packages_missing_or_old_are_named_with_one_command_for_all():
    c = dr.check_packages(["torch>=2.11", "pulp>=3.3 (has 3.0)"], command=lambda m: f"install {len(m)}")
    assert not c.ok and c.severity == "error" and c.fix == "install 2"
    assert c.detail == f"missing: torch>=2.11, pulp>=3.3 (has 3.0) (2 of the {len(dr.REQUIRED)} packages the labs need)"


def test_packages_read_from_this_python(monkeypatch):
    versions = {"torch": "2.13.0", "matplotlib": "3.5.1", "jupyterlab-widgets": "3.0.13"}
    monkeypatch.setattr(dr, "_installed_version", versions.get)
    missing = dr._missing()
    assert "torch>=2.11" not in missing and "jupyterlab_widgets>=3.0" not in missing  # found by either spelling
    assert "matplotlib>=3.8 (has 3.5.1)" in missing and "numpy>=1.26" in missing


def test_the_install_command_is_the_kit_s_make_target_where_its_makefile_is(tmp_path):
    (tmp_path / "Makefile").write_text("include tools/kit.mk\n")
    other = str(tmp_path / "elsewhere")
    laptop = dr.install_command(["torch>=2.11"], kit=str(tmp_path), prefix=other, hub=False)
    assert laptop.startswith(f"cd {tmp_path} && make lab ")
    assert dr.install_command(["torch>=2.11"], kit=str(tmp_path), prefix=other, hub=True).startswith(
        f"cd {tmp_path} && make hub ")
    # in the kit's own .venv (or with no Makefile beside the package), pip into this very Python
    inside = dr.install_command(["torch>=2.11", "pulp>=3.3 (has 3.0)"], kit=str(tmp_path),
                                prefix=str(tmp_path / ".venv"), hub=False, python="/x/python")
    assert inside == '/x/python -m pip install "torch>=2.11" "pulp>=3.3"'
    (tmp_path / "Makefile").unlink()
    assert dr.install_command(["tqdm>=4.66"], kit=str(tmp_path), prefix=other, hub=False,
                              python="/x/python") == '/x/python -m pip install "tqdm>=4.66"'


def test_a_failure_the_packages_command_fixes_points_to_it_instead_of_a_fix_of_its_own():
    packages = Check("packages", False, "missing: torch>=2.11, matplotlib>=3.8 (2 of the 12 packages the labs need)",
                     "cd kit && make lab")
    torch = dr.check_torch(None)
    backend = dr.check_backend(None, False)
    widgets = dr.check_widgets(None, None)  # ipywidgets is not among those the packages check named
    lines = str(report(packages, torch, backend, widgets)).splitlines()
    assert "       fix: cd kit && make lab" in lines
    assert "  FAIL torch: torch does not import (fix: the packages command above)" in lines
    assert "  FAIL matplotlib: matplotlib does not import (fix: the packages command above)" in lines
    assert "  FAIL widgets: ipywidgets and jupyterlab_widgets not installed" in lines  # with its own fix below
    assert lines.count("       fix: cd kit && make lab") == 1 and sum("fix:" in line for line in lines) == 4


# -- widgets -----------------------------------------------------------------------

@pytest.mark.parametrize("ipywidgets, lab", [("8.1.5", "3.0.13"), ("7.8.1", "1.1.7"), ("9.0.0", "4.0.0")])
def test_widgets_matching_majors(ipywidgets, lab):
    c = dr.check_widgets(ipywidgets, lab)
    assert c.ok and ipywidgets in c.detail


@pytest.mark.parametrize("ipywidgets, lab, needs", [
    ("8.1.5", "1.1.7", "ipywidgets 8 needs jupyterlab_widgets 3"),
    ("7.8.1", "3.0.13", "ipywidgets 7 needs jupyterlab_widgets 1"),
])
def test_widgets_mismatch_names_the_symptom_and_fix(ipywidgets, lab, needs):
    c = dr.check_widgets(ipywidgets, lab)
    assert not c.ok
    assert needs in c.detail and "model not found" in c.detail
    assert "pip install" in c.fix and "restart JupyterLab" in c.fix


@pytest.mark.parametrize("ipywidgets, lab, missing", [
    (None, "3.0.13", "ipywidgets not installed"),
    ("8.1.5", None, "jupyterlab_widgets not installed"),
    (None, None, "ipywidgets and jupyterlab_widgets not installed"),
])
def test_widgets_missing_is_a_failure_with_pip_command(ipywidgets, lab, missing):
    c = dr.check_widgets(ipywidgets, lab)
    assert not c.ok and c.detail == missing
    assert c.fix.startswith('pip install "ipywidgets')


def test_widgets_reads_installed_versions_by_default(monkeypatch):
    from importlib import metadata

    c = dr.check_widgets()  # the venv has both, in matching majors (pyproject pins them so)
    assert c.ok and c.detail == (f"ipywidgets {metadata.version('ipywidgets')}, "
                                 f"jupyterlab_widgets {metadata.version('jupyterlab_widgets')}")
    monkeypatch.setattr(dr, "_installed_version", {"ipywidgets": "8.1.0", "jupyterlab_widgets": "1.1.0"}.get)
    assert not dr.check_widgets().ok  # the defaults really are read through _installed_version


# -- matplotlib backend ------------------------------------------------------------

@pytest.mark.parametrize("backend", [
    "module://matplotlib_inline.backend_inline", "inline", "widget", "module://ipympl.backend_nbagg"])
def test_backend_inline_or_ipympl_in_a_kernel(backend):
    assert dr.check_backend(backend, in_kernel=True).ok


def test_backend_notebook_fails_in_a_kernel():
    c = dr.check_backend("nbAgg", in_kernel=True)
    assert not c.ok
    assert "%matplotlib notebook` does not work in JupyterLab" in c.detail
    assert "%matplotlib inline" in c.fix


@pytest.mark.parametrize("backend", ["agg", "QtAgg"])
def test_backend_that_shows_nothing_fails_in_a_kernel(backend):
    c = dr.check_backend(backend, in_kernel=True)
    assert not c.ok and "will not show" in c.detail


@pytest.mark.parametrize("backend", ["agg", "nbAgg", "TkAgg"])
def test_backend_anything_goes_on_the_command_line(backend):
    c = dr.check_backend(backend, in_kernel=False)
    assert c.ok and backend in c.detail


def test_backend_without_matplotlib():
    c = dr.check_backend(None, in_kernel=True)
    assert not c.ok and "pip install" in c.fix


def test_pytest_is_not_a_kernel():
    assert dr._in_kernel() is False


# -- CUDA build --------------------------------------------------------------------

def test_cuda_no_gpu_is_fine():
    assert dr.check_cuda(gpu_visible=False, cuda_version=None, cuda_available=False).ok


def test_cuda_gpu_with_cuda_build_is_fine():
    assert dr.check_cuda(gpu_visible=True, cuda_version="12.8", cuda_available=True).ok


def test_cuda_gpu_with_cpu_only_torch_fails():
    c = dr.check_cuda(gpu_visible=True, cuda_version=None, cuda_available=False)
    assert not c.ok and "CPU-only build" in c.detail
    assert "CUDA wheel from pytorch.org's install selector" in c.fix
    assert "http" not in c.fix and "--index-url" not in c.fix


def test_cuda_build_that_cannot_reach_the_gpu_fails_and_shows_the_warning():
    c = dr.check_cuda(gpu_visible=True, cuda_version="12.8", cuda_available=False,
                      warning="CUDA initialization: The NVIDIA driver on your system is too old")
    assert not c.ok
    assert "built for CUDA 12.8" in c.detail and "driver on your system is too old" in c.detail
    assert "install selector" in c.fix and "http" not in c.fix


def test_cuda_probe_swallows_warnings(recwarn, monkeypatch):
    import warnings

    import torch

    def warns() -> bool:
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old", UserWarning)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", warns)
    version, available, warning = dr._torch_cuda()
    assert len(recwarn) == 0  # nothing reaches stderr from the probe
    assert not available and "driver on your system is too old" in warning


@pytest.mark.parametrize("which, exists, visible", [
    ("/usr/bin/nvidia-smi", False, True), (None, True, True), (None, False, False)])
def test_gpu_visible_from_nvidia_smi_or_the_device_file(monkeypatch, which, exists, visible):
    monkeypatch.setattr(dr.shutil, "which", lambda name: which if name == "nvidia-smi" else None)
    monkeypatch.setattr(dr.os.path, "exists", lambda path: exists and path == "/dev/nvidia0")
    assert dr._gpu_visible() is visible


# -- /dev/shm ----------------------------------------------------------------------

def test_shm_absent_is_fine():
    c = dr.check_shm(None)
    assert c.ok and "no /dev/shm" in c.detail


def test_shm_large_is_fine():
    assert dr.check_shm(8 * 2**30).ok


def test_shm_docker_default_is_a_warning_with_the_docker_fix():
    c = dr.check_shm(64 * 2**20)
    assert not c.ok and c.severity == "warning"
    assert "64 MiB" in c.detail and "bus error" in c.detail
    assert "--shm-size=2g" in c.fix and "--ipc=host" in c.fix


def test_shm_threshold_is_one_gib():
    assert dr.check_shm(2**30).ok
    assert not dr.check_shm(2**30 - 1).ok


def test_shm_size_of_a_missing_path_is_none():
    assert dr._shm_bytes("/no/such/dir") is None


# -- machine description ---------------------------------------------------------

def test_parse_meminfo():
    text = "MemTotal:       16318412 kB\nMemFree:         1234 kB\n"
    assert dr.parse_meminfo(text) == 16318412 * 1024
    assert dr.parse_meminfo("nothing here") is None


def test_describe_device_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dr, "_ram_bytes", lambda: 24 * 2**30)
    monkeypatch.setattr(dr, "_cpu_cores", lambda: 2)
    assert dr.describe_device() == "CPU, 2 cores, 24.0 GiB RAM"
    monkeypatch.setattr(dr, "_ram_bytes", lambda: None)
    monkeypatch.setattr(dr, "_cpu_cores", lambda: None)
    assert dr.describe_device() == "CPU, ? cores, RAM unknown"


def test_describe_device_gpus(monkeypatch):
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30))
    assert dr.describe_device() == "GPU NVIDIA H200, 141.0 GiB (x2)"


# -- the report --------------------------------------------------------------------

def report(*checks: Check) -> DoctorReport:
    return DoctorReport(torch="2.13.0", device="CPU, 4 cores, 8.0 GiB RAM", profile="cpu", checks=checks)


def test_report_ok_ignores_warnings_but_not_errors():
    good = Check("torch", True, "torch 2.13.0")
    warn = Check("shm", False, "small", "bigger", severity="warning")
    bad = Check("widgets", False, "mismatch", "pip install it")
    assert report(good, warn).ok
    assert not report(good, warn, bad).ok
    assert report(good, warn, bad).failures == [warn, bad]


def test_report_text_is_short_and_shows_each_fix():
    text = str(report(Check("torch", True, "torch 2.13.0"), Check("profile", True, "profile cpu"),
                      Check("widgets", False, "mismatch", "pip install it"),
                      Check("shm", False, "small", "bigger", severity="warning")))
    lines = text.splitlines()
    assert lines[0] == "labkit doctor: problems found"
    assert "  passed   torch, profile" in lines
    assert "  FAIL widgets: mismatch" in lines and "       fix: pip install it" in lines
    assert "  WARN shm: small" in lines
    assert len(lines) <= 10


def test_doctor_on_this_machine_prints_a_few_lines_and_no_stderr(capsys):
    result = dr.doctor()
    out, err = capsys.readouterr()
    assert err == ""
    assert out.strip() == str(result)
    assert 5 <= len(out.splitlines()) <= 12
    assert {c.name for c in result.checks} == {"packages", "torch", "profile", "widgets", "matplotlib", "cuda", "shm", "gpu share",
                                                "allocator", "hub"}


# -- on a JupyterHub -----------------------------------------------------------------------

HUB = {"JUPYTERHUB_SERVICE_PREFIX": "/user/ada/", "JUPYTERHUB_USER": "ada"}


def test_a_hub_is_told_by_jupyterhub_s_variables():
    assert dr.on_hub({}) is None and dr.hub_line({}) == ""
    assert dr.on_hub(HUB) == "ada" and dr.on_hub({"JUPYTERHUB_API_URL": "http://hub:8081/hub/api"}) == "?"


def test_on_a_hub_the_doctor_says_what_is_tested_there_and_what_is_not():
    line = dr.hub_line(HUB)
    assert "make lab` starts none" in line and "Tested on a hub: labs 00-01" in line and "Not tested:" in line
    assert "torch 2.11" in line and "lk.use(" in line


def test_a_kernel_in_the_kit_s_venv_on_a_hub_is_a_warning():
    ok = dr.check_hub(HUB, prefix="/opt/conda", kit="/home/ada/labkit/labkit")
    assert ok.ok and "ada" in ok.detail
    second = dr.check_hub(HUB, prefix="/home/ada/labkit/.venv", kit="/home/ada/labkit/labkit")
    assert not second.ok and second.severity == "warning" and "make hub" in second.fix
    assert dr.check_hub({}, prefix="/home/ada/labkit/.venv", kit="/home/ada/labkit/labkit").ok  # a laptop's venv


def test_the_report_shows_the_hub_line(monkeypatch, capsys):
    for name, value in HUB.items():
        monkeypatch.setenv(name, value)
    result = dr.doctor()
    assert "  hub      JupyterHub server of ada" in capsys.readouterr().out and result.hub


def test_doctor_quiet_prints_nothing(capsys):
    dr.doctor(verbose=False)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("ok, status", [(True, 0), (False, 1)])
def test_main_exit_status_follows_the_report(monkeypatch, capsys, ok, status):
    checks = (Check("torch", ok, "torch", "fix it"),)
    monkeypatch.setattr(dr, "CHECKS", tuple(lambda c=c: c for c in checks))
    assert dr.main() == status
    assert "torch" in capsys.readouterr().out


def test_invalid_profile_shows_in_the_header(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_PROFILE", "huge")
    result = dr.doctor()
    assert result.profile.startswith("?") and not result.ok
    assert "FAIL profile" in capsys.readouterr().out


# -- labkit.env.profile ------------------------------------------------------------------

def test_profile_name_is_trimmed_and_case_blind(monkeypatch):
    from labkit.env.profile import profile, sizes

    monkeypatch.setenv("LABKIT_PROFILE", " CPU ")
    assert profile() == "cpu" and sizes().name == "cpu"


def test_profile_gpu_without_cuda_is_refused(monkeypatch):
    import torch

    from labkit.env.profile import profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LABKIT_PROFILE", "gpu")
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        profile()
    monkeypatch.delenv("LABKIT_PROFILE")
    assert profile() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert profile() == "gpu"
