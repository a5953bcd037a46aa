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
  kolorun -np 2 python3 tools/bench/python_bench.py calls [--steps 300]
      the submission loop of the step above alone, per call: through
      hvd.allreduce_async_ and through the binding (kolo._C) directly;
      "RESULT calls python_us=X binding_us=Y" (medians).
  kolorun -np N python3 tools/bench/python_bench.py hooks [--steps 400]
      the DistributedOptimizer over 200 parameters of 4 KB whose backward
      is trivial, against the plain optimizer in the same job: what kolo
      adds to backward (where the gradient hooks submit) and to step()
      (which waits for the allreduces); "RESULT hooks backward_extra_us=X
      step_extra_us=Y" (medians per step).
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


def calls_bench(args):
    from kolo import _C
    tensors = [torch.zeros(1024) for _ in range(200)]  # 4 KB each
    names = ["py.%d" % i for i in range(200)]

    def through_python():
        return [hvd.allreduce_async_(t, name=n, op=hvd.Sum)
                for t, n in zip(tensors, names)]

    def through_binding():
        # kolo._C.allreduce_async(tensor, name, op, prescale, postscale,
        # process set, in place): what hvd.allreduce_async_ calls.
        return [_C.allreduce_async(t, n, hvd.Sum, 1.0, 1.0, 0, True)
                for t, n in zip(tensors, names)]

    def per_call_us(submit):
        times = []
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            handles = submit()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
            for h in handles:
                hvd.synchronize(h)
        return statistics.median(times) * 1e6 / len(tensors)

    python_us = per_call_us(through_python)
    binding_us = per_call_us(through_binding)
    if hvd.rank() == 0:
        print("RESULT calls python_us=%.2f binding_us=%.2f" %
              (python_us, binding_us), flush=True)


def hooks_bench(args):
    params = [torch.zeros(1024, requires_grad=True) for _ in range(200)]
    named = [("layer%03d.weight" % i, p) for i, p in enumerate(params)]
    x = torch.ones(1024)

    def medians(opt):
        backward, step = [], []
        for i in range(args.warmup + args.steps):
            opt.zero_grad()
            loss = sum((p * x).sum() for p in params)
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            if i >= args.warmup:
                backward.append(t1 - t0)
                step.append(t2 - t1)
        return (statistics.median(backward) * 1e6,
                statistics.median(step) * 1e6)

    plain = torch.optim.SGD(params, lr=0.0)
    local_backward, local_step = medians(plain)
    opt = hvd.DistributedOptimizer(plain, named_parameters=named)
    kolo_backward, kolo_step = medians(opt)
    if hvd.rank() == 0:
        print("RESULT hooks ranks=%d backward_extra_us=%.0f "
              "step_extra_us=%.0f local_backward_us=%.0f local_step_us=%.0f"
              % (hvd.size(), kolo_backward - local_backward,
                 kolo_step - local_step, local_backward, local_step),
              flush=True)


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
    p.add_argument("mode", choices=["step", "lone", "calls", "hooks",
                                    "train"])
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    if not args.steps:
        args.steps = {"step": 50, "lone": 2000, "calls": 300,
                      "hooks": 400}.get(args.mode, 30)
    if args.mode == "step":
        hvd.init()
        step_bench(args)
    elif args.mode == "lone":
        hvd.init()
        lone_bench(args)
    elif args.mode == "calls":
        hvd.init()
        calls_bench(args)
    elif args.mode == "hooks":
        hvd.init()
        torch.set_num_threads(1)
        hooks_bench(args)
    else:
        train_bench(args)


if __name__ == "__main__":
    main()
