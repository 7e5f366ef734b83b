"""Where the labs run: the profiles and their sizes, the gpu profile fitted to free memory, the GPU probe, the
doctor, and the processes a sharded step runs on."""
import os as _os
import sys as _sys

# The caching allocator keeps every segment it reserved: the first run of every lab on an H200 at full size
# (torch 2.11, before this setting) saw lab 02 allocate at most 11.6 GB and reserve 57.9 GB, which the next user of
# a shared card cannot have. Expandable segments map pages as a segment grows instead of reserving whole new
# segments, so reserved stays near allocated (gpu-check's record in docs/gpu/: at most 1.30x). Set before anything
# allocates on the GPU (the allocator reads it once), on Linux only (elsewhere torch ignores it with a warning), and
# never over a setting of the student's own: torch reads PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (and
# PYTORCH_HIP_ALLOC_CONF on ROCm). labkit.env.doctor reports what is in force.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
# CUDA had started before labkit could set it: the setting, if set here, is not in force
CUDA_STARTED_FIRST = "torch" in _sys.modules and bool(getattr(_sys.modules["torch"], "cuda", None)
                                                       and _sys.modules["torch"].cuda.is_initialized())
SET_BY_KIT = _sys.platform == "linux" and not any(v in _os.environ for v in ALLOC_CONF_VARS)
if SET_BY_KIT:
    _os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
