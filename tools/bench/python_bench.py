"""The Python frontend's benchmarks (docs/benchmarks.md), run in every rank
of a kolorun job:

  kolorun -np 2 python3 tools/bench/python_bench.py step [--steps 50]
      200 x 4 KB float32 allreduce_async + synchronize per step from Python,
      then the same step through torch.distributed (gloo) in the same job;
      rank 0 prints "RESULT step kolo_py_us=X torch_gloo_us=Y" (medians).
  kolorun -np 2 python3 tools/bench/python_bench.py lone [--steps 2000]
      one 4 KB float32 allreduce at a time: hvd.allreduce_ (blocking),
      synchronize(allreduce_async_(...)) and torch.distributed (gloo)
      all_reduce; rank 0 prints "RESULT lone blocking_us=X async_us=Y
      torch_gloo_us=Z" (p50s).
  kolorun -np N python3 tools/bench/python_bench.py train [--steps 30]
      the mnist CNN (batch 64, Adam, synthetic data) with kolo.torch's
      DistributedOptimizer; "RESULT train ranks=N samples_per_s=X".
      and the memory: RSS of rank 0 after two local steps without kolo, and
      what joining and training with kolo added ("RESULT memory torch_mb=X
      kolo_extra_mb=Y").
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kolo.torch as hvd


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def step_bench(args):
    tensors = [torch.zeros(1024) for _ in range(200)]  # 4 KB each
    names = ["py.%d" % i for i in range(200)]

    def kolo_step():
        handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum)
                   for t, n in zip(tensors, names)]
        for h in handles:
            hvd.synchronize(h)

    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        kolo_step()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    kolo_us = statistics.median(times) * 1e6

    import torch.distributed as dist
    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, 0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=hvd.rank(), world_size=hvd.size())

    def gloo_step():
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()

    times = []
    for i in range(max(2, args.warmup // 5) + max(5, args.steps // 5)):
        start = time.perf_counter()
        gloo_step()
        if i >= max(2, args.warmup // 5):
            times.append(time.perf_counter() - start)
    gloo_us = statistics.median(times) * 1e6
    dist.destroy_process_group()
    if hvd.rank() == 0:
        print("RESULT step kolo_py_us=%.1f torch_gloo_us=%.1f" %
              (kolo_us, gloo_us), flush=True)


def lone_bench(args):
    t = torch.zeros(1024)  # 4 KB

    def p50(op, n):
        times = []
        for i in range(args.warmup + n):
            start = time.perf_counter()
            op()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    blocking_us = p50(lambda: hvd.allreduce_(t, name="lone", op=hvd.Sum),
                      args.steps)
    async_us = p50(lambda: hvd.synchronize(
        hvd.allreduce_async_(t, name="lone", op=hvd.Sum)), args.steps)

    import torch.distributed as dist
    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, 0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=hvd.rank(), world_size=hvd.size())
    gloo_us = p50(lambda: dist.all_reduce(t), max(50, args.steps // 10))
    dist.destroy_process_group()
    if hvd.rank() == 0:
        print("RESULT lone blocking_us=%.1f async_us=%.1f torch_gloo_us=%.1f"
              % (blocking_us, async_us, gloo_us), flush=True)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_bench(args):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "frontends", "python",
                                    "examples"))
    from mnist import SimpleCNN
    torch.manual_seed(0)
    model = SimpleCNN()
    plain = torch.optim.Adam(model.parameters(), 1e-3)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(10, (64,))

    def local_step(opt):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    # What training costs without kolo: torch, the model, its gradients,
    # Adam's state, the activations.
    for _ in range(2):
        local_step(plain)
    torch_mb = rss_mb()
    hvd.init()
    opt = hvd.DistributedOptimizer(plain,
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step():
        local_step(opt)

    for _ in range(args.warmup):
        step()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = hvd.allreduce(torch.tensor([time.perf_counter() - start]),
                            op=hvd.Max, name="train.time").item()
    if hvd.rank() == 0:
        print("RESULT train ranks=%d threads=%d samples_per_s=%.1f "
              "step_ms=%.2f" % (hvd.size(), torch.get_num_threads(),
                                64 * hvd.size() * args.steps / seconds,
                                1e3 * seconds / args.steps), flush=True)
        print("RESULT memory torch_mb=%.1f kolo_extra_mb=%.1f" %
              (torch_mb, rss_mb() - torch_mb), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["step", "lone", "train"])
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    if not args.steps:
        args.steps = {"step": 50, "lone": 2000}.get(args.mode, 30)
    if args.mode == "step":
        hvd.init()
        step_bench(args)
    elif args.mode == "lone":
        hvd.init()
        lone_bench(args)
    else:
        train_bench(args)


if __name__ == "__main__":
    main()
