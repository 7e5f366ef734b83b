"""What a GPU on a shared hub looks like from inside a kernel: memory total and free, MIG, other processes.

torch gives the memory (cudaMemGetInfo sees a MIG slice as the whole card);
nvidia-smi, where it is on the PATH, gives MIG mode and the processes it can
see (inside a container, often none but our own, though their memory still
shows as used). Parsers take text, so tests feed them other machines' output.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

SHARED_BELOW = 0.75  # free under this share of total: someone else is using the GPU
QUERY_GPU = ["--query-gpu=name,memory.total,memory.used,mig.mode.current", "--format=csv,noheader,nounits"]
QUERY_APPS = ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class GPUProcess:
    """A process nvidia-smi lists on the GPU."""

    pid: int
    name: str
    used_bytes: int | None  # None where nvidia-smi prints "[N/A]" (no permission, or a MIG device)


@dataclass(frozen=True)
class GPUState:
    """One CUDA device as this process sees it."""

    name: str
    total_bytes: int
    free_bytes: int
    mig: str | None  # "enabled", "disabled", or None when nvidia-smi does not say
    others: tuple[GPUProcess, ...] | None  # processes other than this one; None when nvidia-smi is missing

    @property
    def shared(self) -> bool:
        """Free memory well below total: other processes (or an earlier lab in this one) hold the rest."""
        return self.free_bytes < SHARED_BELOW * self.total_bytes

    def summary(self) -> str:
        """One line for the doctor's report."""
        gib = 2**30
        mig = {"enabled": "MIG on (this is a slice)", "disabled": "MIG off"}.get(self.mig or "", "MIG unknown")
        if self.others is None:
            seen = "other processes: nvidia-smi not found"
        elif self.others:
            seen = "other processes: " + ", ".join(
                f"{p.pid} {os.path.basename(p.name)} ({'?' if p.used_bytes is None else f'{p.used_bytes / gib:.1f} GiB'})"
                for p in self.others)
        else:
            seen = "no other process seen"
        return (f"{self.name}: {self.free_bytes / gib:.1f} of {self.total_bytes / gib:.1f} GiB free; "
                f"{mig}; {seen}")


def _na(field: str) -> bool:
    return field.strip().strip("[]").lower() in ("n/a", "not supported", "")


def parse_gpu_query(text: str) -> list[str | None]:
    """MIG mode of each GPU from `nvidia-smi --query-gpu=name,memory.total,memory.used,mig.mode.current
    --format=csv,noheader,nounits` ("NVIDIA H200, 143771, 0, Disabled"): "enabled", "disabled" or None."""
    modes: list[str | None] = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        mode = fields[-1].lower()
        modes.append(mode if mode in ("enabled", "disabled") else None)
    return modes


def parse_apps(text: str) -> list[GPUProcess]:
    """Processes from `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,
    nounits` ("1234, /usr/bin/python3, 2048"); used memory is in MiB."""
    found = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        pid, name, used = int(fields[0]), ",".join(fields[1:-1]), fields[-1]
        found.append(GPUProcess(pid, name, None if _na(used) or not used.isdigit() else int(used) * 2**20))
    return found


def _smi(args: list[str]) -> str | None:
    """nvidia-smi's output, None when it is missing, fails or hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        run = subprocess.run([exe, *args], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 else None


def read(device: int = 0) -> GPUState | None:
    """CUDA device `device` as this process sees it, None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    queried = _smi(QUERY_GPU)
    modes = parse_gpu_query(queried) if queried is not None else []
    apps = _smi(QUERY_APPS)
    others = None if apps is None else tuple(p for p in parse_apps(apps) if p.pid != os.getpid())
    return GPUState(torch.cuda.get_device_name(device), total, free, modes[device] if device < len(modes) else None,
                    others)
