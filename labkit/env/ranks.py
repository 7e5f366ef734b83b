"""Processes joined by torch.distributed, started and always torn down: what lab 07's sharding runs on.

``launch(work, *args)`` starts `ranks` processes in one process group (gloo on the CPU; nccl when there is a
CUDA device per rank) and returns each rank's ``work(rank, ranks, *args)``, a dict, in rank order.

Start and teardown. The ranks are forked on Linux where torch sees no CUDA (they share the imports already
made, which saves seconds a rank on a small machine); elsewhere, and wherever CUDA is available (even with fewer
GPUs than ranks: the parent may have run a CUDA backward, after which a forked rank's autograd fails), spawned. Each rank sends its figures or
its error on its own pipe before it leaves the process group, so a rank's own error arrives before its peer's
"connection closed". The parent waits for all ranks up to a timeout, then ends and reaps every child in all
cases (a moment to exit, then SIGTERM, then SIGKILL): ``RankError`` names the rank that failed.
"""
from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["RankError", "Fault", "launch", "on_gpus", "device_of"]


class RankError(RuntimeError):
    """A rank failed or hung: names the rank; .detail keeps the rank's traceback."""

    def __init__(self, message: str, rank: int | None = None, detail: str = "", pids: tuple[int, ...] = ()):
        super().__init__(message)
        self.rank = rank  # the rank that failed, None for a timeout
        self.detail = detail  # the rank's traceback, "" when it sent none
        self.pids = pids  # the ranks' process ids (all ended and reaped when this is raised)


@dataclass(frozen=True)
class Fault:
    """Test hook: rank `rank` raises (or, with hang=True, sleeps forever) where work calls trigger(rank)."""

    rank: int
    hang: bool = False

    def trigger(self, rank: int) -> None:
        """Raise or hang when `rank` is the faulty one; else return."""
        if rank != self.rank:
            return
        while self.hang:
            time.sleep(1)
        raise RuntimeError(f"fault injected on rank {rank} (a test hook)")


def on_gpus(ranks: int) -> bool:
    """True when each of `ranks` ranks can have a CUDA device of its own (nccl needs one per rank)."""
    return torch.cuda.is_available() and torch.cuda.device_count() >= ranks


def device_of(rank: int, ranks: int) -> torch.device:
    """cuda:rank when every rank has a GPU of its own, else the CPU."""
    if not on_gpus(ranks):
        return torch.device("cpu")
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    return device


def launch(work: Callable[..., dict[str, Any]], *args: Any, ranks: int = 2,
           timeout: float = 120.0) -> list[dict[str, Any]]:
    """Run work(rank, ranks, *args) on `ranks` processes in one process group; each rank's dict, in rank order.
    Raises RankError naming the rank that failed, or the ranks that gave nothing within `timeout` seconds;
    every child is ended and reaped before this returns or raises."""
    context = multiprocessing.get_context(_start_method(ranks))
    port, procs, readers, done = _free_port(), [], [], False
    try:
        for rank in range(ranks):
            reader, writer = context.Pipe(duplex=False)
            proc = context.Process(target=_rank_main, args=(rank, ranks, port, timeout, writer, work, args),
                                   name=f"labkit-rank{rank}", daemon=True)
            proc.start()
            writer.close()  # the child holds the only writer: its exit shows here as end of file
            procs.append(proc)
            readers.append(reader)
        found = _collect(procs, readers, timeout)
        done = True
        return found
    finally:
        _stop(procs, grace=5.0 if done else 0.0)


def _rank_main(rank: int, ranks: int, port: int, timeout: float, conn: Connection,
               work: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    """A rank's process: join the group, run work, send ("ok", figures) or ("error", line, traceback), leave."""
    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        backend = "nccl" if on_gpus(ranks) else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=ranks, timeout=timedelta(seconds=timeout))
        message: tuple[Any, ...] = ("ok", work(rank, ranks, *args))
    except BaseException as e:  # noqa: BLE001 - sent to the parent, which raises it with the rank's name
        first = str(e).splitlines()[0] if str(e) else ""
        message = ("error", f"{type(e).__name__}: {first}", traceback.format_exc())
    try:
        conn.send(message)  # before leaving the group (the module's doc)
    finally:
        conn.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _collect(procs: list[Any], readers: list[Connection], timeout: float) -> list[dict[str, Any]]:
    """Each rank's figures, in rank order; RankError on the first error, early exit, or the timeout."""
    pids = tuple(p.pid for p in procs)
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(procs):
        waiting = {readers[r]: r for r in range(len(procs)) if r not in found}
        ready = wait(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            late = ", ".join(map(str, sorted(waiting.values())))
            raise RankError(f"rank(s) {late} sent nothing within timeout={timeout:g} s (a hang: a rank stuck "
                                 "in a collective that its peer never joins?); all ranks were stopped", pids=pids)
        for reader in ready:
            rank = waiting[reader]
            try:
                message = reader.recv()
            except EOFError:
                procs[rank].join(1.0)  # its pipe closed as it exited: reap it to read its exit code
                raise RankError(f"rank {rank} exited with code {procs[rank].exitcode} before sending its "
                                     "figures (killed, or out of memory?)", rank=rank, pids=pids) from None
            if message[0] == "error":
                raise RankError(f"rank {rank} failed: {message[1]}  (its traceback is in .detail)",
                                     rank=rank, detail=message[2], pids=pids)
            found[rank] = message[1]
    return [found[r] for r in range(len(procs))]


def _stop(procs: list[Any], grace: float) -> None:
    """End and reap every child: `grace` seconds to exit by itself, then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _start_method(ranks: int) -> str:
    """fork on Linux where this process can use no CUDA at all (the ranks share the parent's imports); spawn
    elsewhere. A process that has run a CUDA backward cannot fork ranks that use autograd ("Unable to handle
    autograd's threading in combination with fork-based multiprocessing"): one GPU, whose ranks run on the CPU,
    is such a process."""
    return "fork" if sys.platform == "linux" and not torch.cuda.is_available() else "spawn"


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
