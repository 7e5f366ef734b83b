"""labkit.env.gpuinfo: nvidia-smi's output read, and the doctor's shared-GPU warning, with other machines' values."""
from __future__ import annotations

import importlib

from labkit.env import gpuinfo

dr = importlib.import_module("labkit.env.doctor")
GIB = 2**30


def test_mig_mode_and_uuid_per_gpu():
    text = ("GPU-58d2aa01-0000, NVIDIA H200, 143771, Disabled\nGPU-77ab, NVIDIA A100-SXM4-80GB, 81920, Enabled\n"
            "GPU-0c0c, Tesla T4, 15360, [N/A]\n")
    assert gpuinfo.parse_gpu_query(text) == [("58d2aa01-0000", "disabled"), ("77ab", "enabled"), ("0c0c", None)]
    assert gpuinfo.parse_gpu_query("") == []
    assert gpuinfo.uuid_key("GPU-58D2aa01-0000") == gpuinfo.uuid_key("58d2aa01-0000")


def test_processes_with_and_without_their_memory():
    text = "GPU-77ab, 1234, /usr/bin/python3, 2048\nGPU-0c0c, 77, jupyter-lab, [N/A]\nNo running processes found\n"
    assert gpuinfo.parse_apps(text) == [gpuinfo.GPUProcess(1234, "/usr/bin/python3", 2 * GIB, "77ab"),
                                        gpuinfo.GPUProcess(77, "jupyter-lab", None, "0c0c")]
    assert gpuinfo.parse_apps("") == []


def _state(free_gib, others=()):
    return gpuinfo.GPUState("Tesla T4", 16 * GIB, free_gib * GIB, "disabled", tuple(others))


def test_a_whole_gpu_passes_and_a_shared_one_warns_naming_who_holds_it():
    assert dr.check_gpu_share(None).ok
    assert dr.check_gpu_share(_state(15)).ok
    c = dr.check_gpu_share(_state(6, [gpuinfo.GPUProcess(4242, "python", 9 * GIB)]))
    assert not c.ok and c.severity == "warning"
    assert "only 6.0 of 16.0 GiB free" in c.detail and "4242" in c.detail
    assert "LABKIT_GPU_MEMORY" in c.fix and "restart the kernel" in c.fix
    hidden = dr.check_gpu_share(_state(6))
    assert not hidden.ok and "not visible" in hidden.detail


def test_the_summary_line_says_memory_mig_and_processes():
    line = _state(6, [gpuinfo.GPUProcess(4242, "/opt/conda/bin/python", 9 * GIB)]).summary()
    assert line == "Tesla T4: 6.0 of 16.0 GiB free; MIG off; other processes: 4242 python (9.0 GiB)"
    assert "nvidia-smi not found" in gpuinfo.GPUState("X", GIB, GIB, None, None).summary()
