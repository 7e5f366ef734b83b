"""Profiles: one notebook, three problem sizes (tiny for tests, cpu for laptops, gpu for hubs).

tiny and cpu are fixed; gpu is sized to the memory the GPU has free when a
process first asks (labkit.env.sizing), or to $LABKIT_GPU_MEMORY, which also caps
the process's CUDA allocator there (a hub sharing one GPU among several users).
$LABKIT_AUTOCAST (bfloat16 or none) sets the dtype the time labs' steps run
in under torch.autocast, over the profile's own (bfloat16 on gpu, none on the CPU
profiles): none times a GPU in float32, bfloat16 runs the gpu profile's code path on
a CPU.

On a hub, where the hub starts Jupyter and no variable can be set before it, `use(profile=..., gpu_memory=...)`
sets both for this kernel from a notebook: right after `import labkit as lk`, before anything chooses sizes.
"""
from __future__ import annotations

import functools
import os
import warnings
from dataclasses import replace

import torch

from labkit.env.sizes import FIXED, PROFILES, Sizes
from labkit.env.sizing import Choice, choose, parse_bytes


# What this process has chosen sizes with, once it has: (the profile, $LABKIT_GPU_MEMORY) when sizes() or
# gpu_choice() first ran; use() refuses to change either after that.
_chosen: tuple[str, str] | None = None


def _choosing(name: str) -> None:
    global _chosen
    if _chosen is None:
        _chosen = (name, os.environ.get("LABKIT_GPU_MEMORY", "").strip())


def use(profile: str | None = None, gpu_memory: str | None = None) -> None:
    """Set this kernel's profile (`"cpu"`, `"gpu"` or `"tiny"`: $LABKIT_PROFILE) and GPU share (`"12GiB"`:
    $LABKIT_GPU_MEMORY) from a notebook, as on a hub where Jupyter is started for you: call it right after
    `import labkit as lk`, before `lk.doctor()` or `lk.sizes()`. Refused, naming why, once this kernel chose its
    sizes with other settings (the cells run since used them): restart the kernel and call it first."""
    global _chosen
    wanted = {}
    if profile is not None:
        name = str(profile).strip().lower()
        if name not in PROFILES:
            raise ValueError(f"lk.use(profile={profile!r}): not a profile; choose one of {', '.join(PROFILES)}")
        if name == "gpu" and not torch.cuda.is_available():
            raise ValueError("lk.use(profile='gpu'): torch sees no CUDA device here; choose 'cpu'")
        wanted["LABKIT_PROFILE"] = name
    if gpu_memory is not None:
        try:
            parse_bytes(str(gpu_memory))
        except ValueError as e:
            raise ValueError(f"lk.use(gpu_memory={gpu_memory!r}): {e}") from None
        wanted["LABKIT_GPU_MEMORY"] = str(gpu_memory).strip()
    if _chosen is not None:
        chosen_profile, chosen_memory = _chosen
        now = {"LABKIT_PROFILE": chosen_profile, "LABKIT_GPU_MEMORY": chosen_memory}
        changed = [k for k, v in wanted.items() if not _same(k, v, now[k])]
        if changed:
            raise RuntimeError(
                f"lk.use: this kernel already chose its sizes (profile {chosen_profile}"
                f"{', GPU share ' + chosen_memory if chosen_memory else ''}) when a cell first asked for them "
                "(lk.doctor() or lk.sizes()), and the cells run since used them; restart the kernel (Kernel > "
                "Restart Kernel) and call lk.use(...) right after `import labkit as lk`")
    os.environ.update(wanted)


def _same(key: str, wanted: str, chosen: str | None) -> bool:
    """A setting asked again equals the one chosen: a GPU share by its bytes ("12GiB" is "12 GiB" is "12288MiB")."""
    if key == "LABKIT_GPU_MEMORY" and chosen:
        return parse_bytes(wanted) == parse_bytes(chosen)
    return wanted == chosen


def profile() -> str:
    """Name of the active profile: $LABKIT_PROFILE, else "gpu" with CUDA, else "cpu"."""
    name = os.environ.get("LABKIT_PROFILE", "").strip().lower()
    if not name:
        return "gpu" if torch.cuda.is_available() else "cpu"
    if name not in PROFILES:
        raise ValueError(f"LABKIT_PROFILE={name!r} is not a profile; choose one of {', '.join(PROFILES)}")
    if name == "gpu" and not torch.cuda.is_available():
        raise ValueError("LABKIT_PROFILE='gpu' but torch sees no CUDA device; unset it or choose 'cpu'")
    return name


def sizes(name: str | None = None) -> Sizes:
    """Problem sizes of profile `name` (default: the active profile); gpu: sized to this process's GPU; the
    autocast of $LABKIT_AUTOCAST where it is set."""
    if name is None:
        name = profile()
        _choosing(name)
    if name == "gpu":
        return _autocast(gpu_choice().sizes)
    if name not in FIXED:
        raise ValueError(f"profile {name!r} is unknown; choose one of {', '.join(PROFILES)}")
    return _autocast(FIXED[name])


def _autocast(size: Sizes) -> Sizes:
    """`size` with the autocast $LABKIT_AUTOCAST names (bfloat16, or none: float32), else as it is."""
    raw = os.environ.get("LABKIT_AUTOCAST", "")
    value = raw.strip().lower()
    if not value:
        return size
    if value not in ("bfloat16", "none"):
        raise ValueError(f"LABKIT_AUTOCAST={raw!r} is not an autocast; choose bfloat16 or none (float32 "
                         "throughout), or unset it for the profile's own")
    return replace(size, autocast=None if value == "none" else value)


def gpu_choice() -> Choice:
    """The gpu profile's sizes for this process's GPU, and why: chosen once per process and value of
    $LABKIT_GPU_MEMORY, so that every cell of a lab sees the same sizes. The allocator's cap follows the
    variable's current value on every call (lifted when it is unset)."""
    cap = os.environ.get("LABKIT_GPU_MEMORY", "").strip()
    if not torch.cuda.is_available():
        raise ValueError("the gpu profile is sized from a CUDA device's free memory, and torch sees no CUDA "
                         "device; for a given memory run `python -m labkit sizes --profile gpu --memory 16GiB`")
    try:
        limit = parse_bytes(cap) if cap else None
    except ValueError as e:
        raise ValueError(f"LABKIT_GPU_MEMORY: {e}") from None
    _choosing("gpu")
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    # the allocator refuses to grow past the cap, as on a card of that size; 1.0 lifts an earlier cap
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total) if limit else 1.0)
    return _gpu_choice(limit)


@functools.cache
def _gpu_choice(limit: int | None) -> Choice:
    free, _ = torch.cuda.mem_get_info()
    choice = choose(min(free, limit) if limit else free)
    if choice.profile != "gpu":
        warnings.warn(f"labkit: {choice.note}", stacklevel=3)
    return choice
