#!/usr/bin/env python3
"""NVIDIA's NCCL driving the OxTest net plugin (oxtest_net.c), on one GPU.

Two processes share GPU 0 and claim different hosts (NCCL_HOSTID), so NCCL connects them
through its network transport, which NCCL_NET=OxTest points at the plugin: listen, connect,
accept, regMr, isend, irecv, test and the closes all run from NCCL's proxy threads. The
collectives and send/receive below are checked on the GPU.

Usage: python3 ffi-tests/net_plugin/with_nvidia.py [--plugin PATH | --export-only N] [--logs DIR]
PyTorch with CUDA; its NCCL is the one tested unless LD_PRELOAD names another libnccl.so.2.
Without --plugin it compiles oxtest_net.c with cc, exporting only ncclNetPlugin_vN with
--export-only N (8..11; default all four, of which NCCL takes v11). Exit status 0 when every
check passed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [1, 1000, 4096, (1 << 20) + 3, 16 << 20]


def build_plugin(out_dir, export_only):
    lib = os.path.join(out_dir, "liboxtest_net.so")
    src = os.path.join(HERE, "oxtest_net.c")
    only = [f"-DOXTEST_EXPORT_ONLY={export_only}"] if export_only else []
    subprocess.check_call(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", *only, "-o", lib, src])
    return lib


def check(cond, what, failures):
    print(("PASS  " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def run_checks(rank, world, failures):
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", 0)
    for n in SIZES:
        x = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        check(bool(torch.all(x == world * (world + 1) / 2)), f"rank {rank}: all_reduce of {n} floats", failures)
        g = [torch.empty(n, device=dev) for _ in range(world)]
        dist.all_gather(g, torch.full((n,), float(rank), device=dev))
        check(all(bool(torch.all(t == r)) for r, t in enumerate(g)), f"rank {rank}: all_gather of {n} floats", failures)
    for n in SIZES:
        peer = 1 - rank
        out = torch.arange(n, device=dev, dtype=torch.float32) + 10 * rank
        into = torch.zeros(n, device=dev)
        ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        want = torch.arange(n, device=dev, dtype=torch.float32) + 10 * peer
        check(bool(torch.equal(into, want)), f"rank {rank}: send/recv of {n} floats", failures)
    torch.cuda.synchronize()


def worker(rank, world, port, plugin, logs, results):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        NCCL_HOSTID=f"oxtest-host-{rank}",
        NCCL_NET="OxTest",
        NCCL_NET_PLUGIN=plugin,
        NCCL_SOCKET_IFNAME="lo",
        NCCL_NVLS_ENABLE="0",
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,NET",
        NCCL_DEBUG_FILE=os.path.join(logs, f"nccl.rank{rank}.log"),
    )
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    failures = []
    try:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", 0))
        if rank == 0:
            print("NCCL version", ".".join(map(str, torch.cuda.nccl.version())), flush=True)
        run_checks(rank, world, failures)
        dist.destroy_process_group()
    except Exception as e:  # reported as a failure of this rank
        failures.append(f"rank {rank}: {type(e).__name__}: {e}")
        print(f"FAIL  rank {rank}: {type(e).__name__}: {e}", flush=True)
    results.put((rank, failures))


def summarize_logs(logs, world):
    keys = ("Plugin", "plugin", "OxTest", "Using network", "NET/")
    for rank in range(world):
        path = os.path.join(logs, f"nccl.rank{rank}.log")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            lines = [l.rstrip() for l in f if any(k in l for k in keys)]
        print(f"--- rank {rank}: {len(lines)} NET lines of {path}")
        for l in lines[:25]:
            print("   ", l)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin")
    ap.add_argument("--export-only", type=int, choices=[8, 9, 10, 11])
    ap.add_argument("--logs")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="oxtest-net-")
    plugin = os.path.abspath(args.plugin) if args.plugin else build_plugin(tmp, args.export_only)
    logs = args.logs or tmp
    os.makedirs(logs, exist_ok=True)

    import torch.multiprocessing as mp

    world, port = 2, 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, plugin, logs, results)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    failures = []
    got = 0
    while not results.empty():
        _, f = results.get()
        failures += f
        got += 1
    if got != world:
        failures.append(f"{world - got} rank(s) reported nothing (exit codes {[p.exitcode for p in procs]})")
    summarize_logs(logs, world)
    print(f"with_nvidia: {'all passed' if not failures else f'{len(failures)} failed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
