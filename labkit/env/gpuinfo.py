"""What a GPU on a shared hub looks like from inside a kernel: memory total and free, MIG, other processes.

torch gives the memory (cudaMemGetInfo sees a MIG slice as the whole card);
nvidia-smi, where it is on the PATH, gives MIG mode and the processes it can
see (inside a container, often none but our own, though their memory still
shows as used). Parsers take text, so tests feed them other machines' output.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

SHARED_BELOW = 0.75  # free under this share of total: someone else is using the GPU
QUERY_GPU = ["--query-gpu=uuid,name,memory.total,mig.mode.current", "--format=csv,noheader,nounits"]
QUERY_APPS = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class GPUProcess:
    """A process nvidia-smi lists on a GPU."""

    pid: int
    name: str
    used_bytes: int | None  # None where nvidia-smi prints "[N/A]" (no permission, or a MIG device)
    gpu: str = ""  # the GPU's uuid, normalised (labkit.env.gpuinfo.uuid_key)


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


def uuid_key(uuid: str) -> str:
    """A GPU uuid as nvidia-smi ("GPU-58d2...") and torch ("58d2...") write it, reduced to one form."""
    return re.sub(r"^(gpu|mig)-", "", str(uuid).strip().lower())


def parse_gpu_query(text: str) -> list[tuple[str, str | None]]:
    """(uuid, MIG mode) of each GPU from `nvidia-smi --query-gpu=uuid,name,memory.total,mig.mode.current
    --format=csv,noheader,nounits` ("GPU-58d2..., NVIDIA H200, 143771, Disabled"); the mode is "enabled",
    "disabled" or None."""
    found: list[tuple[str, str | None]] = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        mode = fields[-1].lower()
        found.append((uuid_key(fields[0]), mode if mode in ("enabled", "disabled") else None))
    return found


def parse_apps(text: str) -> list[GPUProcess]:
    """Processes from `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,
    noheader,nounits` ("GPU-58d2..., 1234, /usr/bin/python3, 2048"); used memory is in MiB."""
    found = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not fields[1].isdigit():
            continue
        gpu, pid, name, used = uuid_key(fields[0]), int(fields[1]), ",".join(fields[2:-1]), fields[-1]
        found.append(GPUProcess(pid, name, int(used) * 2**20 if used.isdigit() else None, gpu))
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
    """CUDA device `device` as this process sees it, None without CUDA. nvidia-smi's rows are matched to it by
    uuid (its order differs from torch's under CUDA_VISIBLE_DEVICES); without a match, by position."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    mine = uuid_key(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    queried = _smi(QUERY_GPU)
    gpus = parse_gpu_query(queried) if queried is not None else []
    row = next((g for g in gpus if g[0] == mine), gpus[device] if device < len(gpus) else None)
    apps = _smi(QUERY_APPS)
    others = None if apps is None else tuple(
        p for p in parse_apps(apps) if p.pid != os.getpid() and (row is None or p.gpu in ("", row[0])))
    return GPUState(torch.cuda.get_device_name(device), total, free, row[1] if row else None, others)
