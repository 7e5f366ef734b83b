"""Where the labs run: the profiles and their sizes, the gpu profile fitted to free memory, the GPU probe, the
doctor, and the processes a sharded step runs on."""
import os as _os
import sys as _sys

# The caching allocator keeps every segment it reserved: a lab at full size allocated at most 11.6 GB and
# reserved 57.9 GB on an H200 (gpu-check's record, docs/gpu/), which the next user of a shared card cannot have.
# Expandable segments map pages as a segment grows instead of reserving whole new segments, so reserved stays
# near allocated; set before anything allocates on the GPU (the allocator reads it once), Linux only, and never
# over a setting of the student's own. labkit.env.doctor reports it; gpu-check measures reserved against allocated.
if _sys.platform == "linux":
    _os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
