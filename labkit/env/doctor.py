"""Doctor: what this machine is, and the environment problems the labs are known to trip on.

Each check is a function returning a `Check`. Its inputs are parameters whose
default, FROM_SYSTEM, means "read this machine", so a test passes the values
of a broken machine instead of breaking a real one. torch and labkit.env.profile
are imported lazily: the doctor must still run, and say so, when torch is
missing.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

# The torch releases (major, minor) the whole suite has passed on: CI's pinned torch, on a CPU.
TESTED_TORCH = ((2, 13),)
# The torch releases on which every lab ran on a GPU, each with gpu-check's record of it (docs/gpu/; a test holds
# each record to exist, name that torch and pass): a hub image's own torch, often older than CI's.
GPU_TORCH = {(2, 11): "every lab ran on an H200 (docs/gpu/nvidia-h200-16gib-torch2.11.0-2026-12-04.json)"}
# pyproject.toml's lower bound and `make lab`'s TORCH_FLOOR are the oldest of both (tests hold them equal); a torch
# between two tested ones, or newer than all, is let through with a warning.
MIN_TORCH = min((*TESTED_TORCH, *GPU_TORCH))
SHM_MIN_BYTES = 1 << 30  # DataLoader workers pass batches through /dev/shm
# What the labs need installed: pyproject.toml's [project] dependencies (a test holds the two equal), checked here
# without importing any of them, so that a Python that has none still gets the report and the command to run
REQUIRED = ("torch>=2.11", "numpy>=1.26", "matplotlib>=3.8", "ipywidgets>=8.1", "jupyterlab_widgets>=3.0",
            "jupyterlab>=4.0", "ipykernel>=6.29", "nbformat>=5.10", "nbclient>=0.10", "tqdm>=4.66", "pulp>=3.3",
            "pwlf>=2.2")
WIDGETS_PAIRS = {7: 1, 8: 3}  # ipywidgets major -> the jupyterlab_widgets major it speaks to
WIDGETS_PIP = 'pip install "ipywidgets>=8.1,<9" "jupyterlab_widgets>=3,<4"'


class _FromSystem:
    """Default of a check's parameters: read the value from this machine."""

    def __repr__(self) -> str:
        return "FROM_SYSTEM"


FROM_SYSTEM: Any = _FromSystem()


@dataclass(frozen=True)
class Check:
    """The outcome of one check; a failure carries a fix a student can act on."""

    name: str  # short, e.g. "widgets"
    ok: bool
    detail: str  # what was seen
    fix: str = ""  # what to do when not ok
    severity: str = "error"  # "error" fails the doctor; "warning" is printed but does not
    needs: str = ""  # the distribution whose absence alone fails it: its fix is the packages check's command


@dataclass(frozen=True)
class DoctorReport:
    """What the doctor saw: the machine in three lines and the checks."""

    torch: str  # torch version, or why it is missing
    device: str  # GPU name and memory, or CPU cores and RAM
    profile: str  # active labkit profile, or "?" when LABKIT_PROFILE is invalid
    checks: tuple[Check, ...]
    gpu: str = ""  # on CUDA: memory, MIG and other processes (labkit.env.gpuinfo)
    sizes: str = ""  # on the gpu profile: the sizes it chose for that memory, and why
    hub: str = ""  # on a JupyterHub server: what is tested there and what is not

    @property
    def failures(self) -> list[Check]:
        """Checks that did not pass, warnings included."""
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        """True when no error-level check failed (warnings do not count)."""
        return all(c.ok or c.severity == "warning" for c in self.checks)

    def __str__(self) -> str:
        passed = [c.name for c in self.checks if c.ok]
        lines = [f"labkit doctor: {'ok' if self.ok else 'problems found'}",
                 f"  torch    {self.torch}",
                 f"  device   {self.device}",
                 f"  profile  {self.profile}",
                 *([f"  gpu      {self.gpu}"] if self.gpu else []),
                 *([f"  sizes    {self.sizes}"] if self.sizes else []),
                 *([f"  hub      {self.hub}"] if self.hub else []),
                 f"  passed   {', '.join(passed) if passed else 'none'}"]
        missing = next((c.detail for c in self.checks if c.name == "packages" and not c.ok), "")
        for c in self.failures:
            label = "WARN" if c.severity == "warning" else "FAIL"
            if c.needs and c.needs in _names(missing):  # the packages check's one command installs it
                lines.append(f"  {label} {c.name}: {c.detail} (fix: the packages command above)")
            else:
                lines += [f"  {label} {c.name}: {c.detail}", f"       fix: {c.fix}"]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"DoctorReport(ok={self.ok}, checks={len(self.checks)}, "
                f"failures={[c.name for c in self.failures]})")


# -- reading the machine -------------------------------------------------------

def _version_tuple(version: str) -> tuple[int, ...]:
    """Leading numeric parts of a version: "2.13.0+cpu" -> (2, 13, 0)."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def _installed_version(package: str) -> str | None:
    """Installed version of a distribution, None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _names(detail: str) -> set[str]:
    """The distributions a packages check's detail names ("missing: torch>=2.11, pulp>=3.3 (has 3.0) (2 of
    the 12 ...)" -> {"torch", "pulp"})."""
    return set(re.findall(r"(?:: |, )([A-Za-z0-9_.-]+)>=", detail))


def _torch_version() -> str | None:
    """torch.__version__, None when torch does not import."""
    try:
        import torch
    except Exception:  # a broken install raises more than ImportError (OSError on a missing .so)
        return None
    return str(torch.__version__)


def _torch_cuda() -> tuple[str | None, bool, str]:
    """(torch.version.cuda, torch.cuda.is_available(), any warning it raised) without printing it."""
    try:
        import torch
    except Exception:
        return None, False, ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()  # warns "CUDA initialization: ..." on a driver mismatch
    return torch.version.cuda, available, "; ".join(str(w.message).strip() for w in caught)


def _gpu_visible() -> bool:
    """Whether the system shows an NVIDIA GPU, whatever torch thinks."""
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def _in_kernel() -> bool:
    """Whether this runs inside a Jupyter (IPython ZMQ) kernel; IPython is not imported here."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _mpl_backend() -> str | None:
    """matplotlib's backend name, None when matplotlib does not import."""
    try:
        import matplotlib
    except Exception:
        return None
    return str(matplotlib.get_backend())


def _shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory filesystem, None where there is none (macOS, Windows)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_frsize * st.f_blocks


def _active_profile() -> str:
    """labkit.env.profile.profile(), imported late because it imports torch."""
    from labkit.env.profile import profile
    return profile()


def parse_meminfo(text: str) -> int | None:
    """Total RAM in bytes from the text of /proc/meminfo ("MemTotal: 16318412 kB")."""
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _ram_bytes() -> int | None:
    """Total RAM: /proc/meminfo on Linux, sysconf elsewhere, None when neither tells."""
    try:
        with open("/proc/meminfo") as f:
            total = parse_meminfo(f.read())
        if total:
            return total
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _cpu_cores() -> int | None:
    """Cores this process may run on (the affinity mask, which containers narrow), else all."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def describe_device() -> str:
    """One line: the CUDA devices torch sees, else the CPU cores and RAM."""
    try:
        import torch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        n_gpus = 0
    if n_gpus:
        props = torch.cuda.get_device_properties(0)
        more = f" (x{n_gpus})" if n_gpus > 1 else ""
        return f"GPU {props.name}, {props.total_memory / 2**30:.1f} GiB{more}"
    ram = _ram_bytes()
    ram_text = f"{ram / 2**30:.1f} GiB RAM" if ram else "RAM unknown"
    return f"CPU, {_cpu_cores() or '?'} cores, {ram_text}"


# -- the checks ----------------------------------------------------------------

def check_torch(version: str | None = FROM_SYSTEM) -> Check:
    """torch imports and is at least MIN_TORCH (`version` None: it does not import); says where this release was
    tested (CI's whole suite on a CPU, or every lab on a GPU); an untested one is a warning."""
    version = _torch_version() if version is FROM_SYSTEM else version
    wanted = ".".join(map(str, MIN_TORCH))
    fix = f'pip install "torch>={wanted}" (or `make lab`, which installs the pinned version)'
    if version is None:
        return Check("torch", False, "torch does not import", fix, needs="torch")
    release = _version_tuple(version)[:2]
    if release < MIN_TORCH:
        return Check("torch", False, f"torch {version} is older than {wanted}, the oldest labkit was tested on", fix)
    if release in TESTED_TORCH:
        return Check("torch", True, f"torch {version}: the whole suite's (CI, on a CPU)")
    if release in GPU_TORCH:
        return Check("torch", True, f"torch {version}: {GPU_TORCH[release]}; CI runs the whole suite on "
                     f"{_releases(TESTED_TORCH)}")
    newer = all(release > r for r in (*TESTED_TORCH, *GPU_TORCH))
    return Check("torch", False, f"torch {version} is {'newer than the releases' if newer else 'a release'} labkit "
                 f"was not tested on (CI: {_releases(TESTED_TORCH)} on a CPU; GPU: {_releases(tuple(GPU_TORCH))}); "
                 "the labs may work, and what breaks is worth a report",
                 "`make lab` installs the tested torch into .venv", severity="warning")


def _releases(found: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(".".join(map(str, r)) for r in sorted(found))


def _missing() -> list[str]:
    """The requirements of REQUIRED that this Python lacks ("torch>=2.11") or has older than their floor
    ("matplotlib>=3.8 (has 3.5.1)")."""
    found = []
    for spec in REQUIRED:
        name, _, floor = spec.partition(">=")
        version = _installed_version(name) or _installed_version(name.replace("_", "-"))
        if version is None or _version_tuple(version) < _version_tuple(floor):
            found.append(spec if version is None else f"{spec} (has {version})")
    return found


def _kit_folder() -> str:
    """The folder the labkit package sits in (the kit's checkout or bundle, where its Makefile is)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def install_command(missing: list[str], kit: str = FROM_SYSTEM, prefix: str = FROM_SYSTEM,
                    hub: bool = FROM_SYSTEM, python: str = sys.executable) -> str:
    """The one command that installs `missing`: the kit's own make target where its Makefile is (`make hub` on a
    JupyterHub, into the hub's Python; `make lab` elsewhere, a .venv with the tested versions), else pip, into
    this Python (in the kit's .venv already, or a kit installed without its folder)."""
    kit = _kit_folder() if kit is FROM_SYSTEM else kit
    prefix = sys.prefix if prefix is FROM_SYSTEM else prefix
    hub = on_hub() is not None if hub is FROM_SYSTEM else hub
    in_venv = os.path.abspath(prefix) == os.path.abspath(os.path.join(kit, ".venv"))
    if os.path.exists(os.path.join(kit, "Makefile")) and not in_venv:
        if hub:
            return f"cd {kit} && make hub   (the kit's packages into this hub's Python, its torch kept)"
        return (f"cd {kit} && make lab   (a .venv there with the tested versions of all of them, then JupyterLab "
                "in it: run the labs, and this doctor, from that .venv)")
    return f"{python} -m pip install " + " ".join(f'"{m.split(" (")[0]}"' for m in missing)


def check_packages(missing: list[str] = FROM_SYSTEM, command: Callable[[list[str]], str] = install_command) -> Check:
    """Every package the labs need is installed, at least at its floor; the fix is one command for all of them."""
    missing = _missing() if missing is FROM_SYSTEM else missing
    if not missing:
        return Check("packages", True, f"all {len(REQUIRED)} the labs need")
    return Check("packages", False, f"missing: {', '.join(missing)} ({len(missing)} of the {len(REQUIRED)} packages "
                 "the labs need)", command(missing))


def check_profile(resolve: Callable[[], str] = _active_profile) -> Check:
    """LABKIT_PROFILE, when set, names a profile this machine can run."""
    try:
        name = resolve()
    except ImportError as exc:
        return Check("profile", False, f"choosing a profile needs torch: {exc}", "install torch (above)",
                     needs="torch")
    except ValueError as exc:
        return Check("profile", False, str(exc),
                     "unset LABKIT_PROFILE or set it to tiny, cpu or gpu (gpu needs CUDA)")
    return Check("profile", True, f"profile {name}")


def check_widgets(ipywidgets: str | None = FROM_SYSTEM,
                  jupyterlab_widgets: str | None = FROM_SYSTEM) -> Check:
    """ipywidgets and jupyterlab_widgets are installed in majors that speak to each other."""
    if ipywidgets is FROM_SYSTEM:
        ipywidgets = _installed_version("ipywidgets")
    if jupyterlab_widgets is FROM_SYSTEM:
        jupyterlab_widgets = _installed_version("jupyterlab_widgets")
    missing = [name for name, v in (("ipywidgets", ipywidgets),
                                    ("jupyterlab_widgets", jupyterlab_widgets)) if v is None]
    if missing:
        return Check("widgets", False, f"{' and '.join(missing)} not installed",
                     f"{WIDGETS_PIP}, then restart JupyterLab", needs=missing[0])
    found = f"ipywidgets {ipywidgets}, jupyterlab_widgets {jupyterlab_widgets}"
    widgets_major = _version_tuple(ipywidgets or "")[:1]
    lab_major = _version_tuple(jupyterlab_widgets or "")[:1]
    wanted = WIDGETS_PAIRS.get(widgets_major[0]) if widgets_major else None
    if wanted is not None and lab_major != (wanted,):
        return Check("widgets", False,
                     f"{found}: ipywidgets {widgets_major[0]} needs jupyterlab_widgets {wanted} "
                     '(Lab shows "Error displaying widget: model not found")',
                     f"{WIDGETS_PIP}, then restart JupyterLab (not only the kernel)")
    return Check("widgets", True, found)


def check_backend(backend: str | None = FROM_SYSTEM, in_kernel: bool = FROM_SYSTEM) -> Check:
    """In a notebook kernel, matplotlib draws inline or with ipympl; on the command line anything goes."""
    backend = _mpl_backend() if backend is FROM_SYSTEM else backend
    in_kernel = _in_kernel() if in_kernel is FROM_SYSTEM else in_kernel
    if backend is None:
        return Check("matplotlib", False, "matplotlib does not import", 'pip install "matplotlib>=3.8"',
                     needs="matplotlib")
    if not in_kernel:
        return Check("matplotlib", True, f"backend {backend} (command line)")
    lowered = backend.lower()
    if any(word in lowered for word in ("inline", "widget", "ipympl")):
        return Check("matplotlib", True, f"backend {backend}")
    why = ("`%matplotlib notebook` does not work in JupyterLab"
           if "nbagg" in lowered or "notebook" in lowered else "figures will not show in the notebook")
    return Check("matplotlib", False, f"backend {backend} in a Jupyter kernel: {why}",
                 "run `%matplotlib inline` (or `%matplotlib widget` with ipympl installed) instead; "
                 "restart the kernel if figures still do not show")


def check_cuda(gpu_visible: bool = FROM_SYSTEM, cuda_version: str | None = FROM_SYSTEM,
               cuda_available: bool = FROM_SYSTEM, warning: str = "") -> Check:
    """When the system shows an NVIDIA GPU, torch is a CUDA build that can use it."""
    if gpu_visible is FROM_SYSTEM:
        gpu_visible = _gpu_visible()
    if cuda_version is FROM_SYSTEM or cuda_available is FROM_SYSTEM:
        read_version, read_available, read_warning = _torch_cuda()
        cuda_version = read_version if cuda_version is FROM_SYSTEM else cuda_version
        if cuda_available is FROM_SYSTEM:
            cuda_available, warning = read_available, read_warning
    if not gpu_visible:
        return Check("cuda", True, "no NVIDIA GPU visible; the labs run at CPU sizes")
    if cuda_version is None:
        return Check("cuda", False, "an NVIDIA GPU is visible but torch is a CPU-only build",
                     "install the CUDA wheel from pytorch.org's install selector, choosing a "
                     "CUDA version the driver supports (`nvidia-smi` shows it), then restart the kernel")
    if not cuda_available:
        seen = f": {warning}" if warning else ""
        return Check("cuda", False,
                     f"torch is built for CUDA {cuda_version} but cannot use the GPU{seen}",
                     "the driver is likely older than that CUDA; install the CUDA wheel from "
                     "pytorch.org's install selector for the CUDA version `nvidia-smi` shows "
                     "(or update the driver), then restart the kernel")
    return Check("cuda", True, f"CUDA {cuda_version} build, GPU available")


def check_shm(size_bytes: int | None = FROM_SYSTEM) -> Check:
    """/dev/shm, where there is one, holds at least SHM_MIN_BYTES (a warning, not an error)."""
    size_bytes = _shm_bytes() if size_bytes is FROM_SYSTEM else size_bytes
    if size_bytes is None:
        return Check("shm", True, "no /dev/shm (fine on macOS and Windows)")
    size = f"/dev/shm is {size_bytes / 2**20:.0f} MiB"
    if size_bytes < SHM_MIN_BYTES:
        return Check("shm", False,
                     f"{size}; DataLoader workers can crash with \"bus error\"",
                     "in Docker, run with `--shm-size=2g` or `--ipc=host`; or use num_workers=0",
                     severity="warning")
    return Check("shm", True, size)


def _gpu_state() -> Any:
    """labkit.env.gpuinfo.read(), None without torch or CUDA."""
    try:
        from labkit.env import gpuinfo
        return gpuinfo.read()
    except ImportError:
        return None


def check_gpu_share(state: Any = FROM_SYSTEM) -> Check:
    """A GPU's free memory is not well below its total (a warning: a shared GPU, sized for what is free)."""
    state = _gpu_state() if state is FROM_SYSTEM else state
    if state is None:
        return Check("gpu share", True, "no CUDA GPU")
    if not state.shared:
        return Check("gpu share", True, f"{state.free_bytes / 2**30:.1f} of {state.total_bytes / 2**30:.1f} GiB free")
    users = ("; in use by " + ", ".join(str(p.pid) for p in state.others)) if state.others else \
        "; the processes holding it are not visible from here"
    return Check("gpu share", False,
                 f"only {state.free_bytes / 2**30:.1f} of {state.total_bytes / 2**30:.1f} GiB free{users}",
                 "the labs size themselves to the memory free when a kernel starts; if the GPU's other users "
                 "grow later, a lab can run out of memory: restart the kernel to size again, set "
                 "LABKIT_GPU_MEMORY to the share agreed with them, or ask the hub's admin for a whole GPU or "
                 "a MIG slice", severity="warning")


def _allocator_state() -> tuple[int, int, str | None] | None:
    """(allocated, reserved) bytes of this process's CUDA caching allocator and its settings in force ("name=value"
    of the first of labkit.env.ALLOC_CONF_VARS that is set, "... (set after CUDA started: not in force)" when
    labkit set it too late); None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from labkit import env

    name = next((v for v in env.ALLOC_CONF_VARS if v in os.environ), None)
    conf = None if name is None else f"{name}={os.environ[name]}"
    if conf and env.SET_BY_KIT and env.CUDA_STARTED_FIRST and name == "PYTORCH_CUDA_ALLOC_CONF":
        conf += " (set after CUDA started: not in force)"
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), conf


def check_allocator(state: tuple[int, int, str | None] | None = FROM_SYSTEM, platform: str = sys.platform) -> Check:
    """On CUDA, this process's allocated against reserved bytes, and whether the caching allocator expands its
    segments (without, reserved memory was seen at 5x allocated: labkit.env sets it on Linux unless you did)."""
    state = _allocator_state() if state is FROM_SYSTEM else state
    if state is None:
        return Check("allocator", True, "no CUDA: allocated is all there is")
    allocated, reserved, conf = state
    now = f"{allocated / 2**30:.2f} GiB allocated, {reserved / 2**30:.2f} GiB reserved"
    expanding = "expandable_segments:true" in (conf or "").replace(" ", "").lower() and "not in force" not in conf
    if expanding or platform != "linux":  # elsewhere torch supports no expandable segments: nothing to advise
        return Check("allocator", True, f"{now}; {conf or 'the allocator as torch sets it'}")
    return Check("allocator", False, f"{now}; {conf or 'no allocator setting'}: the caching allocator keeps whole "
                 "segments, and reserved memory can grow to several times what is allocated",
                 "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA tensor (restart the "
                 "kernel), or call torch.cuda.empty_cache() between sections on a shared GPU", severity="warning")


# -- on a JupyterHub ------------------------------------------------------------

# A JupyterHub's single-user server sets these in every process it starts, its kernels' too
HUB_VARIABLES = ("JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_API_URL")


def on_hub(environ: Any = FROM_SYSTEM) -> str | None:
    """The JupyterHub user this process serves (or "?" when unnamed), None off a hub."""
    environ = os.environ if environ is FROM_SYSTEM else environ
    if not any(environ.get(name) for name in HUB_VARIABLES):
        return None
    return environ.get("JUPYTERHUB_USER") or "?"


def hub_line(environ: Any = FROM_SYSTEM) -> str:
    """On a hub: where the labs open, what the kit was tested on there and what not; empty elsewhere."""
    user = on_hub(environ)
    if user is None:
        return ""
    gpu = "; ".join(f"torch {'.'.join(map(str, r))}: {where}" for r, where in sorted(GPU_TORCH.items()))
    return (f"JupyterHub server of {user}: open the labs in this JupyterLab (`make lab` starts none here). Tested on "
            "a hub: labs 00-01 on the cpu profile, three students at once, the kit installed by `make hub` "
            f"(tests/test_hub.py); on a GPU, {gpu}. Not tested: KubeSpawner pods, several students' kernels on "
            "one GPU at once. lk.use(profile=..., gpu_memory=...), before anything else in a notebook, sets this "
            "kernel's profile or GPU share")


def check_hub(environ: Any = FROM_SYSTEM, prefix: str = FROM_SYSTEM, kit: str = FROM_SYSTEM) -> Check:
    """On a hub, the kernel runs in the hub's Python, not in a `.venv` of the kit (the second JupyterLab that
    `make lab` used to start inside a hub's server, which the student's browser cannot reach): a warning."""
    user = on_hub(environ)
    if user is None:
        return Check("hub", True, "not a JupyterHub server")
    prefix = sys.prefix if prefix is FROM_SYSTEM else prefix
    if kit is FROM_SYSTEM:
        kit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(os.path.dirname(kit), ".venv")
    if os.path.abspath(prefix) == os.path.abspath(venv):
        return Check("hub", False, f"on a JupyterHub this kernel runs in the kit's own {venv}, a server of its own "
                     "inside the hub's", "in a terminal of the hub, `make hub` in the kit's folder, then open the "
                     "notebooks in the hub's JupyterLab and choose its Python kernel", severity="warning")
    return Check("hub", True, f"JupyterHub server of {user}, this kernel in {prefix}")


CHECKS: tuple[Callable[[], Check], ...] = (
    check_packages, check_torch, check_profile, check_widgets, check_backend, check_cuda, check_shm, check_gpu_share, check_allocator,
    check_hub)


def _sizes_line(profile: str) -> str:
    """On the gpu profile: the note of the sizes chosen for this GPU; else empty."""
    if profile != "gpu":
        return ""
    try:
        from labkit.env.profile import gpu_choice
        return gpu_choice().note
    except (ValueError, RuntimeError) as e:
        return f"could not size the gpu profile: {e}"


def _profile_line(checks: tuple[Check, ...]) -> str:
    """The active profile's name from the profile check, "?" when it failed."""
    for c in checks:
        if c.name == "profile":
            return c.detail.removeprefix("profile ") if c.ok else "? (see profile below)"
    return "?"


def doctor(verbose: bool = True) -> DoctorReport:
    """Describe this machine, run every check, print a short report (when verbose) and return it."""
    state = _gpu_state()  # read once: nvidia-smi can be slow
    checks = tuple(check(state) if check is check_gpu_share else check() for check in CHECKS)
    version = _torch_version()
    profile = _profile_line(checks)
    report = DoctorReport(torch=version or "not importable", device=describe_device(), profile=profile,
                          checks=checks, gpu=state.summary() if state is not None else "",
                          sizes=_sizes_line(profile), hub=hub_line())
    if verbose:
        print(report)
    return report


def main() -> int:
    """`python -m labkit doctor`: print the report; exit status 0 when nothing is broken, else 1."""
    return 0 if doctor(verbose=True).ok else 1
