"""The training benchmark's baseline: the same CNN, optimizer, batch and
synthetic data as train_bench_worker.cc, with PyTorch DDP over gloo.

  python3 train_bench_ddp.py --ranks N --threads T [--steps S] [--warmup W]

prints "RESULT ranks=N threads=T samples_per_s=X step_ms=Y" (the slowest
rank's time over S steps after W warm-up steps).
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 14 * 14, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.ranks)
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, 1, 28, 28)
    y = torch.randint(10, (BATCH,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    if rank == 0:
        s = seconds.item()
        print(f"RESULT ranks={args.ranks} threads={torch.get_num_threads()} "
              f"samples_per_s={args.ranks * BATCH * args.steps / s:.1f} "
              f"step_ms={1000 * s / args.steps:.1f}", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
