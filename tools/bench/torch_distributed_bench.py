#!/usr/bin/env python3
"""Benchmarks of the torch.distributed backend "kolo" against "gloo" in the
same job (docs/torch_distributed.md), run in every rank under kolorun:

  kolorun -np 2 python3 tools/bench/torch_distributed_bench.py allreduce
      dist.all_reduce (SUM, float32, in place) from 4 B to 256 MB on a
      "kolo" group and a "gloo" group of the same ranks, alternating; rank 0
      prints one line per size:
        RESULT allreduce <bytes> kolo_us=<p50> gloo_us=<p50>
               kolo_busbw=<GB/s> gloo_busbw=<GB/s>
      (bus bandwidth = 2 (n-1)/n bytes / time, as NCCL's tests define it).
  kolorun -np 2 python3 tools/bench/torch_distributed_bench.py sendrecv
      point-to-point ping-pong between ranks 0 and 1 (dist.send then
      dist.recv of the same float32 tensor, 4 B to 64 MB) on a "kolo" and a
      "gloo" group of the same ranks, alternating; rank 0 prints
        RESULT sendrecv <bytes> kolo_us=<p50 one way> gloo_us=<p50 one way>
               kolo_GBps=<bytes / one way> gloo_GBps=<...>
  kolorun -np 2 python3 tools/bench/torch_distributed_bench.py ddp \\
      --backend kolo|gloo [--model mnist|mlp] [--steps 30]
      DistributedDataParallel training with the given backend as the
      default group, synthetic data, Adam: the mnist CNN
      (frontends/python/examples/mnist.py; batch 64 per rank: compute
      bound) or an MLP of 3 x 2048 x 2048 (12.6 M parameters, batch 16 per
      rank: communication bound); --batch N and --optimizer sgd change the
      batch per rank and the optimizer:
        RESULT ddp model=<m> backend=<b> ranks=<n> samples_per_s=<x> step_ms=<y>
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import kolo.torch  # noqa: F401  (registers "kolo")

SIZES = [4, 64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20,
         16 << 20, 64 << 20, 256 << 20]


def iterations_for(nbytes):
    if nbytes <= 64 << 10:
        return 200
    if nbytes <= 1 << 20:
        return 50
    if nbytes <= 16 << 20:
        return 10
    return 3


def timed(group, tensor, iters):
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        times.append(time.perf_counter() - start)
    # The slowest rank's time of each iteration, as every rank waits for it.
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(t.tolist())


def compare(args, measure, max_bytes):
    """measure(group, tensor, iters) on a "kolo" and a "gloo" group of the
    same ranks, for each size up to max_bytes (or --max-bytes): yields
    (bytes, kolo seconds, gloo seconds)."""
    dist.init_process_group("kolo")
    gloo = dist.new_group(backend="gloo")
    for nbytes in SIZES:
        if nbytes > (args.max_bytes or max_bytes):
            break
        x = torch.ones(max(1, nbytes // 4))
        iters = iterations_for(nbytes)
        for group in (None, gloo):  # warm up both
            measure(group, x, 2)
        kolo_s = measure(None, x, iters)
        gloo_s = measure(gloo, x, iters)
        yield x.numel() * 4, kolo_s, gloo_s
        dist.barrier()
    dist.destroy_process_group()


def allreduce_bench(args):
    for b, kolo_s, gloo_s in compare(args, timed, 256 << 20):
        n = dist.get_world_size()
        factor = 2.0 * (n - 1) / n * b / 1e9
        if dist.get_rank() == 0:
            print("RESULT allreduce %d kolo_us=%.1f gloo_us=%.1f "
                  "kolo_busbw=%.3f gloo_busbw=%.3f" %
                  (b, kolo_s * 1e6, gloo_s * 1e6,
                   factor / kolo_s, factor / gloo_s), flush=True)


def pingpong(group, tensor, iters):
    """Median one-way time of a send and its reply between ranks 0 and 1."""
    rank = dist.get_rank()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        if rank == 0:
            dist.send(tensor, 1, group=group)
            dist.recv(tensor, 1, group=group)
        elif rank == 1:
            dist.recv(tensor, 0, group=group)
            dist.send(tensor, 0, group=group)
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times)


def sendrecv_bench(args):
    for b, kolo_s, gloo_s in compare(args, pingpong, 64 << 20):
        if dist.get_rank() == 0:
            print("RESULT sendrecv %d kolo_us=%.1f gloo_us=%.1f "
                  "kolo_GBps=%.3f gloo_GBps=%.3f" %
                  (b, kolo_s * 1e6, gloo_s * 1e6, b / kolo_s / 1e9,
                   b / gloo_s / 1e9), flush=True)


def ddp_bench(args):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "frontends", "python",
                                    "examples"))
    from mnist import SimpleCNN
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    if args.model == "mnist":
        net, batch = SimpleCNN(), 64
    else:
        net, batch = torch.nn.Sequential(
            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 10)), 16
    batch = args.batch or batch
    if args.model == "mnist":
        x = torch.randn(batch, 1, 28, 28)
    else:
        x = torch.randn(batch, 2048)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = (torch.optim.Adam(model.parameters(), 1e-3) if args.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), 1e-3))
    y = torch.randint(10, (batch,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    n = dist.get_world_size()
    if dist.get_rank() == 0:
        print("RESULT ddp model=%s batch=%d optimizer=%s backend=%s ranks=%d "
              "threads=%d samples_per_s=%.1f step_ms=%.2f" % (
                  args.model, batch, args.optimizer, args.backend, n,
                  torch.get_num_threads(),
                  batch * n * args.steps / seconds.item(),
                  1e3 * seconds.item() / args.steps), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["allreduce", "sendrecv", "ddp"])
    p.add_argument("--backend", default="kolo", choices=["kolo", "gloo"])
    p.add_argument("--model", default="mnist", choices=["mnist", "mlp"])
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-bytes", type=int, default=0,
                   help="stop after this size (0: 256 MB for allreduce, "
                   "64 MB for sendrecv)")
    args = p.parse_args()
    if args.mode == "allreduce":
        allreduce_bench(args)
    elif args.mode == "sendrecv":
        sendrecv_bench(args)
    else:
        ddp_bench(args)


if __name__ == "__main__":
    main()
