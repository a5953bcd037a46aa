#!/usr/bin/env python3
"""kolo_bench's torch.distributed baseline (gloo backend, Debian's
python3-torch): spawns --nproc processes on this host and prints, from rank
0, one line per measurement:

    RESULT torch <op> <bytes> <p50_us> <p99_us> <mean_us>

It takes the workload flags kolo_bench passes on; sizes, element counts and
iteration counts follow kolo_bench's rules (tools/bench/bench_common.cc).
Collectives that torch's gloo backend does not implement (reducescatter in
torch 1.13) are skipped and show as n/a.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "int8": torch.int8,
}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


def iterations_for(nbytes):
    if nbytes <= 64 << 10:
        return 200
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 16 << 20:
        return 20
    return 5


def count_for(op, nbytes, elem, n):
    count = max(1, nbytes // elem)
    if op in ("allgather", "reducescatter", "alltoall"):
        count = max(n, count // n * n)
    return count


def report(rank, op, nbytes, us, loop):
    if rank != 0:
        return
    us = sorted(us)
    mean = sum(us) / len(us)
    if loop:
        p50 = p99 = mean
    else:
        p50 = us[min(len(us) - 1, int(0.5 * len(us)))]
        p99 = us[min(len(us) - 1, int(0.99 * len(us)))]
    print(f"RESULT torch {op} {nbytes} {p50:.3f} {p99:.3f} {mean:.3f}", flush=True)


def make_op(op, count, n, dtype, redop):
    share = count // n
    if op == "allreduce":
        t = torch.ones(count, dtype=dtype)
        return lambda: dist.all_reduce(t, op=redop)
    if op == "broadcast":
        t = torch.ones(count, dtype=dtype)
        return lambda: dist.broadcast(t, 0)
    if op == "allgather":
        t = torch.ones(share, dtype=dtype)
        out = [torch.empty(share, dtype=dtype) for _ in range(n)]
        return lambda: dist.all_gather(out, t)
    if op == "reducescatter":
        t = [torch.ones(share, dtype=dtype) for _ in range(n)]
        out = torch.empty(share, dtype=dtype)
        return lambda: dist.reduce_scatter(out, t, op=redop)
    if op == "alltoall":
        t = torch.ones(count, dtype=dtype)
        out = torch.empty(count, dtype=dtype)
        return lambda: dist.all_to_all_single(out, t)
    raise ValueError(op)


def timed(fn, warmup, iters, loop):
    for _ in range(warmup):
        fn()
    if loop:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return [(time.perf_counter() - t0) * 1e6 / iters] * iters
    us = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        us.append((time.perf_counter() - t0) * 1e6)
    return us


def worker(rank, args, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.nproc)
    n = args.nproc
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    redop = OPS[args.op]
    loop = args.mode == "loop"
    if args.mode == "fusion":
        iters = args.iters or 20
        each = args.fusion_bytes // elem
        tensors = [torch.ones(each, dtype=dtype) for _ in range(args.fusion_tensors)]
        fused = torch.ones(each * args.fusion_tensors, dtype=dtype)
        total = each * args.fusion_tensors * elem

        def per_tensor():
            for t in tensors:
                dist.all_reduce(t, op=redop)

        def asynchronous():
            for w in [dist.all_reduce(t, op=redop, async_op=True) for t in tensors]:
                w.wait()

        report(rank, "fusion_per_tensor", total,
               timed(per_tensor, args.warmup, max(1, iters // 4), False), False)
        report(rank, "fusion_async", total, timed(asynchronous, args.warmup, iters, False),
               False)
        report(rank, "fusion_fused", total,
               timed(lambda: dist.all_reduce(fused, op=redop), args.warmup, iters, False),
               False)
    else:
        for op in args.ops.split(","):
            for nbytes in [int(s) for s in args.sizes.split(",")]:
                count = count_for(op, nbytes, elem, n)
                try:
                    fn = make_op(op, count, n, dtype, redop)
                    us = timed(fn, args.warmup, args.iters or iterations_for(nbytes), loop)
                except RuntimeError as e:  # not implemented by torch's gloo backend
                    if rank == 0:
                        print(f"torch_bench: {op}: {e}", file=sys.stderr, flush=True)
                    dist.barrier()
                    break
                report(rank, op, nbytes, us, loop)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--ops", default="allreduce")
    p.add_argument("--sizes", default="4096")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--op", default="sum", choices=sorted(OPS))
    p.add_argument("--mode", default="latency", choices=["latency", "loop", "fusion"])
    p.add_argument("--fusion-tensors", type=int, default=200)
    p.add_argument("--fusion-bytes", type=int, default=4096)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(args, port), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
