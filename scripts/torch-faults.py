#!/usr/bin/env python3
"""Fault scenarios for PyTorch on a libnccl.so.2; run with torchrun, exactly 2 ranks:

    [LD_PRELOAD=/path/libnccl.so.2] torchrun --standalone --nproc-per-node 2 \\
        [--monitor-interval 30] scripts/torch-faults.py abort|watchdog|kill|hang-report \\
        [--abort-with api|backend]

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
kill      Mid-training: both ranks train a small DDP model (a step is forward, backward with
          DDP's gradient all_reduce, optimizer step, synchronize); rank 1 SIGKILLs itself at
          the start of step 10, so rank 0's backward waits for a dead peer. Torch's error
          handling is left as it is by default (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, the
          default 600 s timeout, no blocking wait): it must proceed, with the library's
          message naming the dead rank, within 20 s of the kill. Either rank 0's Python sees an
          exception (its NCCL call or wait raises): "FAULT-KILL raised after X s (names rank 1,
          pid P | does not name rank 1, pid P): <Type>: <the line naming it>", then it aborts
          the process group ("FAULT-KILL abort returned after Y s"), exit 0; or torch's
          watchdog takes the process down first (the library's message in its log). Meanwhile
          rank 0 prints "FAULT-KILL rank 0 alive X s after the kill" every second, and after
          45 s "FAULT-KILL FAIL no error 45 s after rank 1 was killed" (exit 3); "FAULT-KILL
          FAIL training went on" (exit 4) if every step completes. Run under torchrun with
          --monitor-interval 30, so that torchrun's agent, which stops the other workers when
          one dies, does so only after rank 0's own handling had its chance (as when the dead
          rank is on another node).
hang-report
          A process group with timeout 30 s carries the fault: rank 1 skips an all_reduce on
          it. OXCCL_HANG_REPORT_S=5, NCCL_DEBUG=WARN and each rank's NCCL_DEBUG_FILE in a
          temporary folder: rank 0 watches its own log for the library's hang report, prints
          "FAULT-HANG-REPORT report after X s (torch's timeout: 30 s; names rank 1, pid P |
          does not name rank 1, pid P): <the line>", aborts the process group (bounded) and
          exits 0; or "FAULT-HANG-REPORT FAIL no report within 28 s" (exit 3), before torch's
          own timeout. Rank 1 prints "FAULT-HANG-REPORT rank 1 logged: <line>" when its log says
          why rank 0 waits on it.

Every scenario first runs one all_reduce of the same shape on both ranks, so that connection
setup (which may block on the host waiting for a peer) is done before the fault. Ranks sync
through the torchrun store, never through NCCL, and leave with os._exit so that no teardown can
hang. Every rank prints "[rank R] pid P" first.
"""
import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from datetime import timedelta

SHAPE = 1 << 20
KILL_STEP = 10
HANG_TIMEOUT_S = 30
REPORT_S = 5


def settings(scenario):
    common = {"TORCH_NCCL_BLOCKING_WAIT": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
              "TORCH_NCCL_ENABLE_MONITORING": "0", "NCCL_NVLS_ENABLE": "0",
              "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    if scenario == "abort":
        common.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_PROPAGATE_ERROR": "0"})
    elif scenario == "kill":
        # WARN at least: the library's own line naming the dead rank is in the log too.
        common.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")})
    elif scenario == "hang-report":
        common.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "OXCCL_HANG_REPORT_S": str(REPORT_S),
                       "NCCL_DEBUG": "WARN"})
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
    ap.add_argument("scenario", choices=["abort", "watchdog", "kill", "hang-report"])
    ap.add_argument("--abort-with", choices=["api", "backend"], default="api")
    args = ap.parse_args()
    # Before torch is imported: ProcessGroupNCCL reads these when the group is created.
    for k, v in settings(args.scenario).items():
        os.environ[k] = v
    logdir = None
    if args.scenario == "hang-report":
        # Each rank's library log, which the rank reads back (set before the library starts).
        logdir = tempfile.mkdtemp(prefix="torch-faults-")
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(logdir, "nccl.log")

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
    elif args.scenario == "hang-report":
        group = dist.new_group([0, 1], timeout=timedelta(seconds=HANG_TIMEOUT_S))

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
    store.set(f"pid{rank}", str(os.getpid()))

    if args.scenario == "kill":
        kill_scenario(torch, dist, store, rank, dev)
    if args.scenario == "hang-report":
        hang_report_scenario(dist, store, rank, t, group, logdir)

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


def abort_bounded(dist, tag, limit=10.0):
    """Abort the process group from another thread; say how it went (bounded)."""
    done = {}

    def run():
        t0 = time.time()
        try:
            dist.distributed_c10d._abort_process_group()
            done["how"] = f"returned after {time.time() - t0:.2f} s"
        except Exception as e:
            done["how"] = f"raised after {time.time() - t0:.2f} s: {type(e).__name__}: {str(e)[:200]}"

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    say(f"{tag} abort {done.get('how', f'still running after {limit:.0f} s')}")


def naming_line(text, markers):
    """The first line of `text` holding every marker, else its first non-empty line."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    for ln in lines:
        if all(m in ln for m in markers):
            return ln
    return lines[0] if lines else ""


def kill_scenario(torch, dist, store, rank, dev):
    tag = "FAULT-KILL"
    store.wait([f"pid{1 - rank}"], timedelta(seconds=60))
    other = store.get(f"pid{1 - rank}").decode()
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    state = {"killed_at": None}

    def killed_at():
        if state["killed_at"] is None and store.check(["killed-at"]):
            state["killed_at"] = float(store.get("killed-at").decode())
        return state["killed_at"]

    def heartbeat():
        while killed_at() is None:
            time.sleep(0.05)
        while True:
            since = time.time() - state["killed_at"]
            if since > 45:
                say(f"{tag} FAIL no error 45 s after rank 1 was killed")
                leave(3)
            say(f"{tag} rank 0 alive {since:.1f} s after the kill")
            time.sleep(1.0)

    if rank == 0:
        threading.Thread(target=heartbeat, daemon=True).start()
    try:
        for step in range(1000):
            if rank == 1 and step == KILL_STEP:
                store.set("killed-at", repr(time.time()))
                say(f"[rank 1] SIGKILL at the start of step {step}")
                os.kill(os.getpid(), signal.SIGKILL)
            x = torch.randn(64, 256, generator=gen).to(dev)
            y = torch.randint(0, 10, (64,), generator=gen).to(dev)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
    except Exception as e:
        t_err = time.time()
        for _ in range(100):  # the kill time, if not known yet
            if killed_at() is not None:
                break
            time.sleep(0.05)
        since = t_err - state["killed_at"] if state["killed_at"] else float("nan")
        text = str(e)
        names = "is gone" in text and f"pid {other}," in text and "rank 1 (" in text
        who = f"{'names' if names else 'does not name'} rank 1, pid {other}"
        line = naming_line(text, ["is gone"])[:700]
        say(f"{tag} raised after {since:.2f} s ({who}): {type(e).__name__}: {line}")
        abort_bounded(dist, tag)
        leave(0)
    say(f"{tag} FAIL training went on: 1000 steps without an error after rank 1 was killed")
    leave(4)


def hang_report_scenario(dist, store, rank, t, group, logdir):
    tag = "FAULT-HANG-REPORT"
    store.wait([f"pid{1 - rank}"], timedelta(seconds=60))
    other = store.get(f"pid{1 - rank}").decode()
    log = os.path.join(logdir, "nccl.log")

    def find(what):
        try:
            with open(log, errors="replace") as f:
                for ln in f:
                    if what in ln:
                        return ln.strip()
        except OSError:
            pass
        return None

    if rank == 1:
        say("[rank 1] skipping the next all_reduce")
        t0 = time.time()
        while time.time() - t0 < HANG_TIMEOUT_S:
            line = find("which rank 1 has not called")
            if line:
                say(f"{tag} rank 1 logged: {line[:700]}")
                break
            time.sleep(0.2)
        try:
            store.wait(["fault-done"], timedelta(seconds=60))
        except Exception:
            pass
        leave(0)
    t.fill_(1.0)
    t0 = time.time()
    dist.all_reduce(t, group=group, async_op=True)
    limit = HANG_TIMEOUT_S - 2
    while time.time() - t0 < limit:
        line = find("has made no progress")
        if line:
            names = "not called by 1 rank: rank 1 (" in line and f"pid {other}," in line
            who = f"{'names' if names else 'does not name'} rank 1, pid {other}"
            say(f"{tag} report after {time.time() - t0:.1f} s (torch's timeout: {HANG_TIMEOUT_S} s; {who}): "
                f"{line[:900]}")
            abort_bounded(dist, tag)
            store.set("fault-done", "1")
            leave(0)
        time.sleep(0.2)
    say(f"{tag} FAIL no report within {limit} s (torch's timeout: {HANG_TIMEOUT_S} s)")
    store.set("fault-done", "1")
    leave(3)


if __name__ == "__main__":
    main()
