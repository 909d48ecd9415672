#!/usr/bin/env python3
"""Fault scenarios for PyTorch on a libnccl.so.2; run with torchrun, exactly 2 ranks:

    [LD_PRELOAD=/path/libnccl.so.2] torchrun --standalone --nproc-per-node 2 \\
        scripts/torch-faults.py abort|watchdog [--abort-with api|backend]

The parent (scripts/torch-all.sh) runs each under `timeout` and judges the outcome from the exit
status, the elapsed time and the marker lines below.

abort     Rank 1 never joins an all_reduce; rank 0's all_reduce spins on the GPU for the missing
          peer. After 3 s another thread of rank 0 aborts the process group
          (torch.distributed.distributed_c10d._abort_process_group(), which calls
          ProcessGroupNCCL::abort -> ncclCommAbort inside ncclGroupStart/End; or with
          --abort-with backend, the backend's .abort() alone). The abort must release the
          spinning kernel: a CUDA event recorded behind the collective completes (or raises).
          Markers: "FAULT-ABORT released after X s ..." (then exit 0), or
          "FAULT-ABORT FAIL ..." (exit 3/4). The watchdog is kept out of the way:
          TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (no teardown), timeout 600 s, no heartbeat monitor.
watchdog  A process group with timeout 5 s (dist.new_group(timeout=5 s): the default group keeps a
          long timeout so that uneven start-up of the ranks cannot trip the store); rank 1
          skips an all_reduce on it; torch's watchdog must time
          rank 0's collective out and take the process down with its usual message
          ("Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds
          before timing out."). Settings that make this quick and deterministic:
          TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (torch's default: tear down, skip comm cleanup),
          TORCH_NCCL_RETHROW_CUDA_ERRORS=1 and TORCH_NCCL_TEARDOWN_ON_TIMEOUT=1 (names in newer
          torch; ignored if unknown), TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=500 (the watchdog
          sleeps 4x this before it throws: 60 s at the default 15000),
          TORCH_NCCL_DUMP_ON_TIMEOUT=0, TORCH_NCCL_ENABLE_MONITORING=0 (no heartbeat monitor, so
          the watchdog is the only thing that can end the process).
          Marker if the process survives 75 s: "FAULT-WATCHDOG FAIL not torn down" (exit 3).

Both scenarios first run one all_reduce of the same shape on both ranks, so that connection
setup (which may block on the host waiting for a peer) is done before the fault. Ranks sync
through the torchrun store, never through NCCL, and leave with os._exit so that no teardown can
hang. Every rank prints "[rank R] pid P" first.
"""
import argparse
import os
import sys
import threading
import time
from datetime import timedelta

SHAPE = 1 << 20


def settings(scenario):
    common = {"TORCH_NCCL_BLOCKING_WAIT": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
              "TORCH_NCCL_ENABLE_MONITORING": "0", "NCCL_NVLS_ENABLE": "0",
              "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    if scenario == "abort":
        common.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_PROPAGATE_ERROR": "0"})
    else:
        common.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "1",
                       "TORCH_NCCL_TEARDOWN_ON_TIMEOUT": "1", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "500"})
    return common


def say(msg):
    print(msg, flush=True)


def leave(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["abort", "watchdog"])
    ap.add_argument("--abort-with", choices=["api", "backend"], default="api")
    args = ap.parse_args()
    # Before torch is imported: ProcessGroupNCCL reads these when the group is created.
    for k, v in settings(args.scenario).items():
        os.environ[k] = v

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    say(f"[rank {rank}] pid {os.getpid()}")
    if world != 2:
        say(f"FAULT-{args.scenario.upper()} FAIL needs exactly 2 ranks, got {world}")
        leave(2)
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=600))
    store = dist.distributed_c10d._get_default_store()
    group = None
    if args.scenario == "watchdog":
        group = dist.new_group([0, 1], timeout=timedelta(seconds=5))

    # Warm-up: the same collective on both ranks, completed.
    t = torch.full((SHAPE,), float(rank + 1), device=dev)
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    if not bool((t == 3.0).all()):
        say(f"FAULT-{args.scenario.upper()} FAIL warm-up all_reduce gave a wrong result on rank {rank}")
        leave(2)
    store.set(f"ready{rank}", "1")
    store.wait(["ready0", "ready1"], timedelta(seconds=60))
    say(f"[rank {rank}] warm-up done")

    if rank == 1:
        say("[rank 1] skipping the next all_reduce")
        try:  # rank 0 says when it is done; bounded either way
            store.wait(["fault-done"], timedelta(seconds=85))
        except Exception:
            pass
        leave(0)

    tag = f"FAULT-{args.scenario.upper()}"
    t.fill_(1.0)
    t0 = time.time()
    work = dist.all_reduce(t, group=group, async_op=True)

    if args.scenario == "watchdog":
        say(f"{tag} rank 0 waits for the watchdog (timeout 5 s)")
        while time.time() - t0 < 75:
            time.sleep(0.5)
        say(f"{tag} FAIL not torn down: the process is alive 75 s after the collective was issued")
        store.set("fault-done", "1")
        leave(3)

    # abort
    state = {"aborted_at": None, "abort_returned": None, "abort_error": None}

    def abort_later():
        time.sleep(3)
        state["aborted_at"] = time.time()
        say(f"{tag} aborting the process group ({args.abort_with}) after 3 s")
        try:
            if args.abort_with == "api":
                dist.distributed_c10d._abort_process_group()
            else:
                dist.group.WORLD._get_backend(dev).abort()
            state["abort_returned"] = time.time()
            say(f"{tag} abort call returned after {state['abort_returned'] - state['aborted_at']:.2f} s")
        except Exception as e:
            state["abort_error"] = f"{type(e).__name__}: {e}"
            state["abort_returned"] = time.time()
            say(f"{tag} abort call raised {state['abort_error'][:300]}")

    def deadline():
        time.sleep(45)
        say(f"{tag} FAIL no release: 45 s after the collective, 42 s after the abort "
            f"(abort call {'returned' if state['abort_returned'] else 'still running'})")
        leave(3)

    threading.Thread(target=abort_later, daemon=True).start()
    threading.Thread(target=deadline, daemon=True).start()

    outcome = None
    try:
        work.wait()  # without blocking wait this only orders the current stream after it
        ev = torch.cuda.Event()
        ev.record()
        while not ev.query():
            time.sleep(0.01)
        outcome = "clean"
    except Exception as e:
        outcome = f"raised {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    now = time.time()
    if state["aborted_at"] is None:
        say(f"{tag} FAIL the collective finished ({outcome}) after {now - t0:.2f} s without its peer, before the abort")
        store.set("fault-done", "1")
        leave(4)
    # Give the abort call a moment to return, so its outcome is in the marker.
    while state["abort_returned"] is None and time.time() - now < 10:
        time.sleep(0.05)
    call = ("returned" if state["abort_error"] is None else "raised") if state["abort_returned"] else "still running"
    say(f"{tag} released after {now - state['aborted_at']:.2f} s (wait: {outcome}; abort call {call})")
    store.set("fault-done", "1")
    leave(0)


if __name__ == "__main__":
    main()
