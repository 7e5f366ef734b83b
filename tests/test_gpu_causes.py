"""The causes of the first full H200 run's failures, reproduced on a CPU (each of these failed before its fix):
ranks forked where CUDA is present, a selective policy counted across forward and recomputation, widgets and
batch searches capped at constants below a large card's batch, a recompile limit below blocks x budgets, and a
gpu-check that kept nothing when cut."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.env import ranks
from labkit.env.sizing import choose, parse_bytes

BIG = choose(parse_bytes("141GiB")).sizes  # what `labkit sizes --profile gpu --memory 141GiB` gives


def test_one_gpu_never_forks_its_ranks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # two ranks on one GPU: they run on the CPU
    assert not ranks.on_gpus(2)
    assert ranks._start_method(2) == "spawn"  # a CUDA backward in the parent would break a forked rank's autograd
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ranks._start_method(2) == ("fork" if sys.platform == "linux" else "spawn")


def test_sac_policy_counts_forward_and_recomputation_apart(monkeypatch):
    """torch 2.11 asks the policy during recomputation too (ctx.is_recompute True): one counter for both ran
    past the traced ops ("SACEstimator traced no more ops")."""
    import torch.utils.checkpoint as tuc
    from labkit.planners.sac_milp import _under_policy

    policies = []
    monkeypatch.setattr(tuc, "create_selective_checkpoint_contexts", lambda policy: policies.append(policy))
    monkeypatch.setattr(tuc, "checkpoint", lambda fn, *a, context_fn, **k: context_fn())
    names, save = ["mm", "relu", "mm"], [1, 0, 1]
    _under_policy(lambda x: x, names, save, "block")(None)
    (policy,) = policies
    ops = [torch.ops.aten.mm.default, torch.ops.aten.relu.default, torch.ops.aten.mm.default]
    want = [tuc.CheckpointPolicy.MUST_SAVE, tuc.CheckpointPolicy.PREFER_RECOMPUTE, tuc.CheckpointPolicy.MUST_SAVE]
    for recompute in (False, True):  # forward, then the recomputation as 2.11 asks it
        ctx = tuc.SelectiveCheckpointContext(is_recompute=recompute)
        assert [policy(ctx, op) for op in ops] == want
    with pytest.raises(ValueError, match="traced no more ops"):  # a fourth op in forward is still refused
        policy(tuc.SelectiveCheckpointContext(is_recompute=False), ops[0])


def test_a_large_cards_batch_fits_the_explorer_and_the_batch_searches():
    assert BIG.batch > 64  # x94 on 141 GiB: above every constant the widgets and searches had
    states = {"bf16": 2**30}
    box = lk.widgets.crossover_explorer(1000.0, 2.0, BIG.batch, states, batch=500, seq=BIG.seq)
    batch, _ = box.children[0].children
    assert batch.max >= 500 and batch.value == 500
    from labkit.bench.plan import batch_ceiling
    from labkit.planners.applying import largest_batch

    assert largest_batch(lambda b: b <= 700, 500, batch_ceiling(500)) == 700  # found above the start, not capped
    with pytest.raises(ValueError, match="start=500 is above most=64"):  # never clamped to `most` silently
        largest_batch(lambda b: True, 500, 64)


def test_the_predicted_batch_search_starts_at_a_large_cards_batch():
    from labkit.bench.plan import predicted_batch
    from labkit.plans import BlockCosts, Profile

    one, two = (Profile((BlockCosts(act, 100, 1.0),), base=0, floor=0, step=1.0) for act in (2000, 3000))  # batch 2, 3
    fits = lambda profile, budget: [] if profile.blocks[0].act <= budget else None  # noqa: E731  (1000 B a sample)
    assert predicted_batch(one, two, fits, budget=1000 * 600, start=500) == 600


def test_the_recompile_limit_grows_with_blocks_times_budgets(monkeypatch):
    """Lab 07 compiles each of 8 blocks (one forward's code) at 9 budgets: 72 entries, over the old fixed 64."""
    import torch._dynamo.config as dynamo_config
    from labkit.instruments import compiled as C

    monkeypatch.setattr(C, "_SHARING", {}, raising=False)
    blocks = [torch.nn.Linear(4, 4) for _ in range(8)]
    made = [C.Compiled(b.forward, budget) for budget in [i / 8 for i in range(9)] for b in blocks]
    seen = []
    made[-1]._compiled = lambda *a: seen.append((dynamo_config.recompile_limit,
                                                 dynamo_config.accumulated_recompile_limit))
    made[-1](torch.zeros(4))
    limit, accumulated = seen[0]
    assert limit >= 72 and accumulated >= 72
    assert C.recompile_limits(torch.nn.ReLU().forward)[0] == 8  # another code object: dynamo's default


def _writer(tmp: Path) -> str:
    """A fake row: writes its Row as gpurows would, or sleeps (the row a SIGTERM catches)."""
    return textwrap.dedent(f"""
        import json, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'tools')!r})
        import gpucheck

        def command(key, out):
            if key == "slow":  # says where it is, then sleeps: the row a signal catches
                pid = {str(tmp / 'slow.pid')!r}
                return [sys.executable, "-c", f"import os, time; open({{pid!r}}, 'w').write(str(os.getpid())); time.sleep(120)"]
            row = json.dumps({{"name": key, "value": "measured", "bar": "-", "ok": True}})
            return [sys.executable, "-c", f"open({{str(out)!r}}, 'w').write({{row!r}})"]

        run = gpucheck.Run(Path({str(tmp / 'run')!r}), {{"device": "fake"}}, time.monotonic() + 300)
        gpucheck.run_rows(["fast", "slow", "never"], run, command, limits={{"fast": 30, "slow": 200, "never": 30}})
        run.finish()
    """)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_killed_gpu_check_keeps_the_rows_it_measured_and_ends_the_running_one(tmp_path, sig):
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", _writer(tmp_path)], cwd=Path(__file__).resolve().parents[1])
    lines, pid = tmp_path / "run.jsonl", tmp_path / "slow.pid"  # Run's path is tmp/run: run.jsonl and run.json
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (pid.exists() and pid.read_text()):
        time.sleep(0.2)
    slow = psutil.Process(int(pid.read_text()))  # the row's process, in a session of its own
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig
    assert not _running(slow)  # ended with the run, not left behind (a lab's kernel would hold the GPU)
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert rows[0] == {"header": {"device": "fake"}}
    assert [(r["name"], r["ok"]) for r in rows[1:]] == [("fast", True), ("slow", False)]
    assert f"interrupted ({sig.name})" in rows[2]["value"]
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [r["name"] for r in summary["rows"]] == ["fast", "slow"] and summary["ok"] is False


def _running(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:  # noqa: BLE001 - gone
        return False


def test_a_row_past_its_limit_is_cut_and_the_run_goes_on(tmp_path):
    import gpucheck  # tools/gpucheck.py

    def command(key: str, out: Path) -> list[str]:
        if key == "slow":
            return [sys.executable, "-c", "import time; time.sleep(60)"]
        return [sys.executable, "-c", f"open({str(out)!r}, 'w').write({json.dumps({'name': key, 'value': 'v', 'bar': 'b', 'ok': True})!r})"]

    run = gpucheck.Run(tmp_path / "run", {"device": "fake"}, time.monotonic() + 300)
    gpucheck.run_rows(["slow", "after"], run, command, limits={"slow": 2, "after": 30})
    summary = json.loads(run.finish().read_text())
    slow, after = summary["rows"]
    assert not slow["ok"] and "cut at its time limit, 2 s" in slow["value"] and after["ok"]


def test_the_doctor_shows_allocated_against_reserved():
    from labkit.env.doctor import check_allocator

    assert check_allocator(None).ok
    ok = check_allocator((2**30, 2**31, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    assert ok.ok and "1.00 GiB allocated, 2.00 GiB reserved" in ok.detail
    bare = check_allocator((2**30, 5 * 2**30, None))
    assert not bare.ok and bare.severity == "warning" and "expandable_segments:True" in bare.fix
    late = check_allocator((0, 0, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set after CUDA started: "
                                  "not in force)"))
    assert not late.ok and "not in force" in late.detail
    assert check_allocator((2**30, 5 * 2**30, None), platform="win32").ok  # no expandable segments there


@pytest.mark.parametrize("theirs", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"])
def test_the_kit_never_sets_the_allocator_over_a_students_setting(theirs):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                                                          "PYTORCH_HIP_ALLOC_CONF")}
    code = "import os, labkit.env; print(os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))"
    run = lambda extra: subprocess.run([sys.executable, "-c", code], env={**env, **extra},  # noqa: E731
                                       capture_output=True, text=True, check=True).stdout.strip()
    assert run({}) == ("expandable_segments:True" if sys.platform == "linux" else "None")
    assert run({theirs: "backend:cudaMallocAsync"}) == ("backend:cudaMallocAsync" if theirs ==
                                                        "PYTORCH_CUDA_ALLOC_CONF" else "None")
