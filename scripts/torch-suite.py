#!/usr/bin/env python3
"""PyTorch on a libnccl.so.2: run with torchrun, one process per GPU.

    LD_PRELOAD=/path/libnccl.so.2 torchrun --nproc-per-node N scripts/torch-suite.py [--steps S] [--out F]

Checks, each reported as PASS/FAIL on rank 0: the NCCL version torch sees; all_reduce with
every ReduceOp (incl. AVG and PREMUL_SUM); broadcast; reduce; all_gather and
all_gather_into_tensor; reduce_scatter and reduce_scatter_tensor; all_to_all_single (equal
and unequal splits); send/recv and batch_isend_irecv; new_group and split_group; an
all_reduce captured in a CUDA graph and replayed; then a small DDP training run whose loss
curve is written to --out (compare two runs, NVIDIA's library and ours, with compare mode:
`torch-suite.py --compare A.json B.json`).

Also: a MemPool through NCCL's allocator (ncclMemAlloc) registered with register_mem_pool
(ncclCommRegister) and all-reduced (skipped on a GPU without multicast, where torch refuses
its NCCL allocator whatever the library); with --symm, symmetric memory (torch's NCCL
symmetric-memory backend and register_mem_pool(symm=True), i.e. ncclCommWindowRegister) in a
child process pair, which passes if it works or raises a Python exception, and the process
group works afterwards; with --nonblocking, whether torch really chose non-blocking
communicators (needs TORCH_NCCL_USE_COMM_NONBLOCKING=1 and TORCH_CPP_LOG_LEVEL=INFO).

With --same-gpu (or env OXCCL_TORCH_SAME_GPU=1) every rank runs on cuda:0 (device_id,
set_device, DDP device_ids and every tensor), for a library that lets ranks share a GPU
(NCCL_MULTI_RANK_GPU_ENABLE=1, set here when unset; NVIDIA's NCCL before 2.30 refuses:
"Duplicate GPU detected"):

    torchrun --nproc-per-node 4 scripts/torch-suite.py --same-gpu --steps 50

It adds two checks (every rank is on the same device; the DDP parameters all-gathered from
every rank are bitwise identical) and skips --symm with a printed reason (symmetric memory
and window registration assume one GPU per rank).

With --hostid every rank is on cuda:0 as with --same-gpu, and also claims a host of its own:
before init_process_group it sets NCCL_HOSTID=torch-hostid-<rank> and, when unset,
NCCL_SOCKET_IFNAME=lo (torchrun cannot give each worker its own variables), so that the ranks
reach each other over the library's socket network, as ranks on different machines do. NVIDIA's
NCCL runs this too (no two ranks share a host, so no "Duplicate GPU"); NCCL_MULTI_RANK_GPU_ENABLE
is left alone:

    torchrun --nproc-per-node 2 scripts/torch-suite.py --hostid --steps 50 --out ours.json

Compare mode: `--compare A.json B.json [--tol T]`: the same number of steps and every step's
relative loss difference below T (default 1e-4; `--tol 0`: bitwise identical curves).

Helper mode (no torchrun): `--bindings-report DIR --expect LIB` reads LD_DEBUG=bindings
output files under DIR and reports which file every nccl*/pnccl* symbol of a torch library
was bound to; exit 0 iff all went to LIB.
Every rank prints "[rank R] pid P" first so that a driver can kill exactly these processes.
"""
import argparse
import faulthandler
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta

# `kill -USR1` a rank to see where every thread of it is (hang diagnosis).
if hasattr(faulthandler, "register"):
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)


def compare(a_path, b_path, tol=1e-4):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    if not a["loss"] or not b["loss"]:
        print("loss curves: a run recorded no steps: FAIL")
        return 1
    worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a["loss"], b["loss"]))
    same_len = len(a["loss"]) == len(b["loss"])
    if tol == 0:
        ok = same_len and a["loss"] == b["loss"]
        want = "bitwise identical"
    else:
        ok = same_len and worst < tol
        want = f"below {tol:g}"
    steps = f"{len(a['loss'])}" if same_len else f"{len(a['loss'])} and {len(b['loss'])}"
    print(f"loss curves: {steps} steps, worst relative difference {worst:.2e} (wanted: {want}): "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"step time: {a['step_ms']:.3f} ms vs {b['step_ms']:.3f} ms (ratio {a['step_ms'] / b['step_ms']:.3f})")
    return 0 if ok else 1


BINDING = re.compile(r"binding file (.+?) \[\d+\] to (.+?) \[\d+\]: \w+ symbol `([^']+)'")


def bindings_report(directory, expect):
    """Summarise LD_DEBUG=bindings files: nccl symbols bound from torch libraries, by target."""
    expect_real = os.path.realpath(expect)
    from_torch = {}  # symbol -> set of targets
    from_other = {}  # (referencing file, symbol) -> target, for nccl symbols outside torch
    files = [os.path.join(directory, f) for f in sorted(os.listdir(directory))]
    for path in files:
        with open(path, errors="replace") as f:
            for line in f:
                if "nccl" not in line:
                    continue
                m = BINDING.search(line)
                if not m or not re.match(r"p?nccl", m.group(3)):
                    continue
                src, dst, sym = m.groups()
                if "torch" in os.path.basename(src) or "/torch/" in src:
                    from_torch.setdefault(sym, set()).add(os.path.realpath(dst))
                else:
                    from_other[(os.path.basename(src), sym)] = os.path.realpath(dst)
    print(f"bindings: {len(files)} LD_DEBUG files; expected target {expect} (= {expect_real})")
    if not from_torch:
        print("FAIL no nccl symbol binding from a torch library was found (did LD_DEBUG reach the ranks?)")
        return 1
    good = sorted(s for s, t in from_torch.items() if t == {expect_real})
    bad = {s: t for s, t in from_torch.items() if t != {expect_real}}
    print(f"{len(good)} nccl symbols from torch libraries bound to the expected file:")
    print("  " + " ".join(good))
    for sym, targets in sorted(bad.items()):
        print(f"  ELSEWHERE {sym} -> {', '.join(sorted(targets))}")
    for (src, sym), dst in sorted(from_other.items()):
        note = "expected file" if dst == expect_real else dst
        print(f"  (not from torch) {src}: {sym} -> {note}")
    if bad:
        print(f"FAIL {len(bad)} symbols bound elsewhere: {' '.join(sorted(bad))}")
        return 1
    print(f"PASS all {len(good)} bound to {expect}")
    return 0


def symm_child(path, rank, world, local):
    """One rank of the symmetric-memory pair (a child of a torch-suite rank): prints SYMM lines."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl", init_method="file://" + path, rank=rank, world_size=world, device_id=dev,
        timeout=timedelta(seconds=60),
    )
    expect = float(world * (world + 1) // 2)
    all_ok = True

    def group_still_works(after):
        t = torch.full((4096,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        ok = bool((t == expect).all())
        print(f"SYMM after {after}: plain all_reduce {'correct' if ok else 'WRONG'}", flush=True)
        return ok

    def attempt(name, fn):
        nonlocal all_ok
        try:
            correct = fn()
            print(f"SYMM {name}: worked, all_reduce on it {'correct' if correct else 'WRONG'}", flush=True)
            all_ok = all_ok and correct
        except Exception as e:  # a clean Python exception is an acceptable outcome
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(f"SYMM {name}: raised {type(e).__name__}: {first[:300]}", flush=True)
        try:
            all_ok = group_still_works(name) and all_ok
        except Exception as e:
            print(f"SYMM after {name}: plain all_reduce raised {type(e).__name__}: {e}", flush=True)
            all_ok = False

    def symm_backend():
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
        buf = symm_mem.empty(1 << 18, dtype=torch.float32, device=dev)
        buf.fill_(float(rank + 1))
        symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        return bool((buf == expect).all())

    def window_pool():
        backend = dist.group.WORLD._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            t = torch.full((1 << 18,), float(rank + 1), device=dev)
        backend.register_mem_pool(pool, symm=True)
        try:
            dist.all_reduce(t)
            torch.cuda.synchronize()
            return bool((t == expect).all())
        finally:
            backend.deregister_mem_pool(pool)

    attempt("symmetric memory (NCCL backend: empty + rendezvous)", symm_backend)
    attempt("register_mem_pool(symm=True)", window_pool)
    print(f"SYMM-RESULT {'ok' if all_ok else 'fail'}", flush=True)
    dist.destroy_process_group()
    return 0 if all_ok else 1


def device_multicast(ordinal):
    """CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED of a device from the driver: 1, 0, or None when
    the driver cannot be asked."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, value = ctypes.c_int(), ctypes.c_int()
        if cu.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return None
        if cu.cuDeviceGetAttribute(ctypes.byref(value), 132, dev) != 0:
            return None
        return value.value
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, default=None)
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="--compare: the largest relative loss difference allowed (0: identical)")
    ap.add_argument("--symm", action="store_true", help="also run the symmetric-memory check")
    ap.add_argument("--nonblocking", action="store_true",
                    help="record TORCH_NCCL_USE_COMM_NONBLOCKING and check torch used it")
    ap.add_argument("--bindings-report", default=None, metavar="DIR")
    ap.add_argument("--expect", default=None, metavar="LIB")
    ap.add_argument("--same-gpu", action="store_true",
                    help="every rank on cuda:0 (also env OXCCL_TORCH_SAME_GPU=1); needs a library that "
                         "accepts ranks sharing a GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, set when unset)")
    ap.add_argument("--hostid", action="store_true",
                    help="every rank on cuda:0 and claiming its own host (NCCL_HOSTID=torch-hostid-<rank>, "
                         "NCCL_SOCKET_IFNAME=lo when unset): the ranks talk over the socket network")
    ap.add_argument("--symm-child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if os.environ.get("OXCCL_TORCH_SAME_GPU", "") not in ("", "0"):
        args.same_gpu = True
    if args.compare:
        return compare(*args.compare, tol=args.tol)
    if args.bindings_report:
        return bindings_report(args.bindings_report, args.expect)
    if args.symm_child:
        path, rank, world, local = args.symm_child
        return symm_child(path, int(rank), int(world), int(local))

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    print(f"[rank {rank}] pid {os.getpid()}", flush=True)
    if args.hostid:
        # A host of its own for every rank, set before the library reads the variables (at
        # the communicator's creation in init_process_group below).
        args.same_gpu = True
        os.environ["NCCL_HOSTID"] = f"torch-hostid-{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        if rank == 0:
            print(f"hostid: all {world} ranks on cuda:0, rank r with NCCL_HOSTID=torch-hostid-r, "
                  f"NCCL_SOCKET_IFNAME={os.environ['NCCL_SOCKET_IFNAME']}", flush=True)
    if args.same_gpu:
        # Every rank on GPU 0: the device index used for set_device, device_id, DDP's
        # device_ids, every tensor and the symmetric-memory child. The library reads the
        # variable when the communicator is created (in init_process_group below).
        local = 0
        if not args.hostid:
            os.environ.setdefault("NCCL_MULTI_RANK_GPU_ENABLE", "1")
        if rank == 0 and not args.hostid:
            print(f"same-gpu: all {world} ranks on cuda:0 "
                  f"(NCCL_MULTI_RANK_GPU_ENABLE={os.environ['NCCL_MULTI_RANK_GPU_ENABLE']})", flush=True)
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    nonblocking_env = os.environ.get("TORCH_NCCL_USE_COMM_NONBLOCKING")
    init_log = ""
    if args.nonblocking:
        # Capture what torch's C++ logging writes to stderr during init: with
        # TORCH_CPP_LOG_LEVEL=INFO, ProcessGroupNCCL::useNonblocking() logs its decision.
        captured = tempfile.TemporaryFile()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            dist.init_process_group("nccl", device_id=dev)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        init_log = captured.read().decode(errors="replace")
        sys.stderr.write(init_log)
        sys.stderr.flush()
    else:
        dist.init_process_group("nccl", device_id=dev)
    results = []

    def check(name, fn):
        try:
            ok = bool(fn())
            err = ""
        except Exception as e:  # report, keep going
            ok, err = False, f"{type(e).__name__}: {e}"
        oks = torch.tensor([1 if ok else 0], device=dev)
        try:
            dist.all_reduce(oks, op=dist.ReduceOp.MIN)
            ok_all = bool(oks.item())
        except Exception:
            ok_all = False
        results.append((name, ok_all, err))
        if rank == 0:
            print(f"{'PASS' if ok_all else 'FAIL'} {name} {err}", flush=True)

    check("nccl version", lambda: torch.cuda.nccl.version() >= (2, 28))

    if args.same_gpu:
        def one_device():
            # Every rank's current device is 0 and has the same UUID (when torch exposes it).
            here = torch.tensor([torch.cuda.current_device()], device=dev, dtype=torch.int64)
            lo, hi = here.clone(), here.clone()
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            uuid_text = str(getattr(torch.cuda.get_device_properties(dev), "uuid", ""))
            uuids = [None] * world
            dist.all_gather_object(uuids, uuid_text)
            if rank == 0:
                print(f"    same-gpu: device {torch.cuda.get_device_name(dev)} uuid {uuid_text or '(not exposed)'}",
                      flush=True)
            return lo.item() == 0 and hi.item() == 0 and len(set(uuids)) == 1

        check("same-gpu: every rank on cuda:0 (one device uuid)", one_device)
    if args.nonblocking:
        if rank == 0:
            print(f"TORCH_NCCL_USE_COMM_NONBLOCKING={nonblocking_env!r}", flush=True)

        def nonblocking_taken():
            if nonblocking_env is None:
                raise RuntimeError("--nonblocking given but TORCH_NCCL_USE_COMM_NONBLOCKING is not set")
            m = re.findall(r"non-?blocking mode:\s*(\w+)", init_log, re.IGNORECASE)
            if not m:
                raise RuntimeError(
                    "not observable: torch logged no 'Using non-blocking mode' line during init "
                    "(set TORCH_CPP_LOG_LEVEL=INFO)"
                )
            if m[-1].lower() not in ("1", "true"):
                raise RuntimeError(f"torch logged 'non-blocking mode: {m[-1]}'")
            return True

        check("communicators created non-blocking (torch's own log)", nonblocking_taken)

    def red(op, expect_fn, dtype=torch.float32):
        t = torch.full((1000,), float(rank + 1), device=dev, dtype=dtype)
        dist.all_reduce(t, op=op)
        return torch.allclose(t.float(), torch.full_like(t.float(), expect_fn()), rtol=1e-2)

    ranks = list(range(1, world + 1))
    check("all_reduce SUM", lambda: red(dist.ReduceOp.SUM, lambda: sum(ranks)))
    check("all_reduce PRODUCT", lambda: red(dist.ReduceOp.PRODUCT, lambda: float(torch.tensor(ranks).prod())))
    check("all_reduce MAX", lambda: red(dist.ReduceOp.MAX, lambda: world))
    check("all_reduce MIN", lambda: red(dist.ReduceOp.MIN, lambda: 1))
    check("all_reduce AVG", lambda: red(dist.ReduceOp.AVG, lambda: sum(ranks) / world))
    check("all_reduce bf16 SUM", lambda: red(dist.ReduceOp.SUM, lambda: sum(ranks), torch.bfloat16))
    check(
        "all_reduce PREMUL_SUM",
        lambda: red(dist._make_nccl_premul_sum(2.0), lambda: 2.0 * sum(ranks)),
    )

    def bcast():
        t = torch.full((4097,), float(rank), device=dev)
        dist.broadcast(t, src=world - 1)
        return bool((t == world - 1).all())

    check("broadcast", bcast)

    def reduce():
        t = torch.full((333,), float(rank + 1), device=dev)
        dist.reduce(t, dst=0)
        return rank != 0 or bool((t == sum(ranks)).all())

    check("reduce", reduce)

    def all_gather():
        t = torch.full((17,), float(rank), device=dev)
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t)
        big = torch.empty(17 * world, device=dev)
        dist.all_gather_into_tensor(big, t)
        return all(bool((o == i).all()) for i, o in enumerate(outs)) and bool(
            (big.view(world, 17) == torch.arange(world, device=dev).float()[:, None]).all()
        )

    check("all_gather / all_gather_into_tensor", all_gather)

    def reduce_scatter():
        ins = [torch.full((19,), float(rank + i), device=dev) for i in range(world)]
        out = torch.empty(19, device=dev)
        dist.reduce_scatter(out, ins)
        out2 = torch.empty(19, device=dev)
        dist.reduce_scatter_tensor(out2, torch.cat(ins))
        expect = sum(r + rank for r in range(world))
        return bool((out == expect).all()) and bool((out2 == expect).all())

    check("reduce_scatter / reduce_scatter_tensor", reduce_scatter)

    def a2a():
        t = torch.arange(world * 5, device=dev, dtype=torch.float32) + 1000 * rank
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)
        exp = torch.cat([torch.arange(rank * 5, rank * 5 + 5, device=dev).float() + 1000 * r for r in range(world)])
        # unequal splits: rank r sends (p+1) elements to peer p
        send_splits = [p + 1 for p in range(world)]
        recv_splits = [rank + 1] * world
        t2 = torch.full((sum(send_splits),), float(rank), device=dev)
        out2 = torch.empty(sum(recv_splits), device=dev)
        dist.all_to_all_single(out2, t2, recv_splits, send_splits)
        exp2 = torch.cat([torch.full((rank + 1,), float(r), device=dev) for r in range(world)])
        return bool((out == exp).all()) and bool((out2 == exp2).all())

    check("all_to_all_single (equal, unequal)", a2a)

    def p2p():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        s = torch.full((1 << 20,), float(rank), device=dev)
        r = torch.empty_like(s)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)])
        for q in reqs:
            q.wait()
        ok = bool((r == prv).all())
        if world >= 2:
            t = torch.full((10,), float(rank), device=dev)
            if rank == 0:
                dist.send(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                ok = ok and bool((t == 0).all())
        return ok

    check("send/recv, batch_isend_irecv", p2p)

    def groups():
        evens = [r for r in range(world) if r % 2 == 0]
        g = dist.new_group(evens)
        ok = True
        if rank in evens:
            t = torch.ones(8, device=dev)
            dist.all_reduce(t, group=g)
            ok = bool((t == len(evens)).all())
        sg = dist.split_group(split_ranks=[[r for r in range(world) if r % 2 == 0], [r for r in range(world) if r % 2 == 1]])
        t = torch.ones(8, device=dev)
        dist.all_reduce(t, group=sg)
        mine = sum(1 for r in range(world) if r % 2 == rank % 2)
        return ok and bool((t == mine).all())

    check("new_group, split_group", groups)

    def graph():
        t = torch.ones(1 << 16, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(s)
        t.fill_(1.0)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(t)
        ok = True
        for i in range(5):
            t.fill_(1.0)
            g.replay()
            torch.cuda.synchronize()
            ok = ok and bool((t == world).all())
        return ok

    check("all_reduce in a CUDA graph, replayed", graph)

    def mempool():
        # torch.cuda.MemPool over ProcessGroupNCCL's allocator (ncclMemAlloc/ncclMemFree),
        # registered with register_mem_pool (ncclCommRegister for every segment).
        backend = dist.group.WORLD._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            t = torch.full((1 << 20,), float(rank + 1), device=dev)
        backend.register_mem_pool(pool)
        try:
            dist.all_reduce(t)
            ok = bool((t == sum(ranks)).all())
            part = t[1000:5096]  # an interior slice of the registered segment
            part.fill_(1.0)
            dist.all_reduce(part)
            ok = ok and bool((part == world).all()) and bool((t[:1000] == sum(ranks)).all())
            torch.cuda.synchronize()
        finally:
            backend.deregister_mem_pool(pool)
        del t, part
        torch.cuda.synchronize()
        del pool
        return ok

    mempool_name = "MemPool(ncclMemAlloc) + register_mem_pool (ncclCommRegister), all_reduce"
    multicast = device_multicast(dev.index if dev.index is not None else 0)
    if multicast == 0:
        # torch's ProcessGroupNCCL::supportsTensorAlloc is deviceSupportsMulticast: without
        # NVLink multicast (a lone GPU, no fabric) torch refuses with "NCCL mem allocator is
        # not supported in this NCCL version" whatever the library.
        if rank == 0:
            print(f"SKIP {mempool_name}: this GPU reports no multicast support "
                  "(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0), and torch offers its NCCL "
                  "allocator only on such devices", flush=True)
    else:
        check(mempool_name, mempool)

    def symm():
        # In a child process pair, so that an abort inside torch or the library cannot take
        # this suite down; the children rendezvous through a FileStore whose path rank 0
        # publishes in the default store.
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.set("torch-suite-symm-path", os.path.join(tempfile.gettempdir(), f"torch-suite-symm-{uuid.uuid4().hex}"))
        path = store.get("torch-suite-symm-path").decode()
        env = dict(os.environ, TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NCCL_NVLS_ENABLE="0", NVSHMEM_DISABLE_NVLS="1")
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--symm-child", path, str(rank), str(world), str(local)]
        try:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=90)
            out, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout (90 s)"
        finally:
            if rank == 0:
                try:
                    os.remove(path)
                except OSError:
                    pass
        lines = [l for l in out.splitlines() if l.startswith("SYMM")]
        if rank == 0:
            for l in lines:
                print("    " + l, flush=True)
        if rc != 0 or "SYMM-RESULT ok" not in out:
            tail = (lines or out.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"child rank {rank} exit {rc}: {tail[:300]}")
        return True

    if args.symm and args.same_gpu:
        if rank == 0:
            print("SKIP symmetric memory / window registration: not run with --same-gpu (torch's symmetric "
                  "memory and NCCL windows assume one GPU per rank: peer mappings and multicast)", flush=True)
    elif args.symm:
        check("symmetric memory / window registration: works or raises cleanly (child processes)", symm)

    # DDP training with a fixed seed.
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    losses = []
    torch.cuda.synchronize()
    t0 = time.time()
    for step in range(args.steps):
        x = torch.randn(64, 256, generator=gen).to(dev)
        y = torch.randint(0, 10, (64,), generator=gen).to(dev)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lt = loss.detach().clone()
        dist.all_reduce(lt, op=dist.ReduceOp.AVG)
        losses.append(lt.item())
    torch.cuda.synchronize()
    step_ms = (time.time() - t0) * 1000 / max(args.steps, 1)

    def same_params():
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        return bool(torch.equal(flat, ref))

    check(f"DDP {args.steps} steps, parameters identical across ranks", same_params)

    if args.same_gpu:
        def gathered_params():
            # Every rank's flattened parameters, all-gathered, compared bitwise with rank 0's
            # (ranks sharing a GPU must still hold separate, identical replicas).
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            every = torch.empty(world * flat.numel(), device=dev, dtype=flat.dtype)
            dist.all_gather_into_tensor(every, flat)
            rows = every.view(world, -1)
            same = [bool(torch.equal(rows[r], rows[0])) for r in range(world)]
            if rank == 0:
                print(f"    same-gpu: parameter checksum {float(flat.double().sum()):.10e} "
                      f"({flat.numel()} values); ranks equal to rank 0: {same}", flush=True)
            return all(same) and bool(torch.equal(rows[rank], flat))

        check("same-gpu: DDP parameters all-gathered from every rank are bitwise identical", gathered_params)
    dist.barrier()
    if rank == 0:
        if args.out:
            json.dump(
                {"loss": losses, "step_ms": step_ms, "nonblocking_env": nonblocking_env,
                 "checks": {name: ok for name, ok, _ in results}},
                open(args.out, "w"),
            )
        passed = sum(1 for _, ok, _ in results if ok)
        if losses:
            print(f"DDP step {step_ms:.3f} ms, final loss {losses[-1]:.5f}")
        print(f"{passed} passed, {len(results) - passed} failed")
    dist.destroy_process_group()
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
