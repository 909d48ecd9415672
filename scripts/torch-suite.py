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
"""
import argparse
import json
import os
import sys
import time


def compare(a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a["loss"], b["loss"]))
    ok = len(a["loss"]) == len(b["loss"]) and worst < 1e-4
    print(f"loss curves: {len(a['loss'])} steps, worst relative difference {worst:.2e}: {'PASS' if ok else 'FAIL'}")
    print(f"step time: {a['step_ms']:.3f} ms vs {b['step_ms']:.3f} ms (ratio {a['step_ms'] / b['step_ms']:.3f})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, default=None)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
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
    step_ms = (time.time() - t0) * 1000 / args.steps

    def same_params():
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        return bool(torch.equal(flat, ref))

    check(f"DDP {args.steps} steps, parameters identical across ranks", same_params)
    dist.barrier()
    if rank == 0:
        if args.out:
            json.dump({"loss": losses, "step_ms": step_ms}, open(args.out, "w"))
        passed = sum(1 for _, ok, _ in results if ok)
        print(f"DDP step {step_ms:.3f} ms, final loss {losses[-1]:.5f}")
        print(f"{passed} passed, {len(results) - passed} failed")
    dist.destroy_process_group()
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
