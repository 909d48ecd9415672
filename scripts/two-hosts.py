"""One rank of scripts/two-hosts.sh: a process in its own network namespace and hostname.
Joins a 2-rank torch.distributed NCCL group at MASTER_ADDR (the other namespace's veth
address), on cuda:0, and checks exact results of all_reduce, all_gather, broadcast and
send/recv of 1 MiB + 4 B and 8 B; prints "TWO_HOSTS_OK rank R" when all match.
usage: python3 two-hosts.py RANK   (MASTER_ADDR, MASTER_PORT in the environment)"""
import os
import sys

import torch
import torch.distributed as dist


def main():
    rank = int(sys.argv[1])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda:0"))
    for n in (2, 262145):  # 8 B and 1 MiB + 4 B of float
        base = torch.arange(n, dtype=torch.float32, device="cuda:0")
        x = base + rank
        dist.all_reduce(x)
        assert torch.equal(x, 2 * base + 1), f"all_reduce of {n}"
        got = [torch.empty(n, device="cuda:0") for _ in range(2)]
        dist.all_gather(got, base * (rank + 1))
        assert torch.equal(got[0], base) and torch.equal(got[1], 2 * base), f"all_gather of {n}"
        y = base + 7 if rank == 1 else torch.zeros(n, device="cuda:0")
        dist.broadcast(y, src=1)
        assert torch.equal(y, base + 7), f"broadcast of {n}"
        if rank == 0:
            dist.send(base * 3, dst=1)
        else:
            z = torch.zeros(n, device="cuda:0")
            dist.recv(z, src=0)
            assert torch.equal(z, base * 3), f"send/recv of {n}"
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print(f"TWO_HOSTS_OK rank {rank} host {os.uname().nodename}", flush=True)


if __name__ == "__main__":
    main()
