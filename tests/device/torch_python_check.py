"""kolo.torch and the torch.distributed backend on CUDA tensors, for the GPU
machine: tools/device_check.sh installs there the wheel that `prepare` built
here against that machine's torch (tools/torch-device.txt) and runs this
under kolorun at -np 1.

A plain program, no test framework: prints "PASS <check>", "FAIL <check>:
why" or "SKIP <check>: why" per check and a last line "torch_python_check:
N passed, N failed, N skipped"; exits 1 if anything failed.

World size 1 (NCCL refuses two ranks of one communicator on one GPU), so
each result is checked against what the collective means for one rank,
with scale factors that make it differ from its input. KOLO_CHECK_DEVICE=cpu
runs the same checks on CPU tensors (how the script itself is tested where
there is no GPU).
"""

import os
import sys
import traceback

import torch
import torch.distributed as dist

import kolo.torch as hvd

passed = failed = skipped = 0


def check(name):
    def run(body):
        global passed, failed
        try:
            body()
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            failed += 1
            print("FAIL %s: %s: %s" % (name, type(e).__name__, e), flush=True)
            traceback.print_exc()
        else:
            passed += 1
            print("PASS %s" % name, flush=True)
        return body
    return run


def same(got, want, what, exact=True):
    assert got.device == want.device, "%s on %s, not %s" % (
        what, got.device, want.device)
    assert got.dtype == want.dtype, "%s is %s, not %s" % (
        what, got.dtype, want.dtype)
    ok = torch.equal(got, want) if exact else torch.allclose(
        got.double(), want.double(), rtol=1e-3, atol=1e-3)
    assert ok, "%s: got %s, want %s" % (what, got.flatten()[:6].tolist(),
                                        want.flatten()[:6].tolist())


def main():
    wanted = os.environ.get("KOLO_CHECK_DEVICE", "cuda")
    if wanted == "cuda" and not torch.cuda.is_available():
        print("SKIP all: no GPU (torch.cuda.is_available() is False)")
        print("torch_python_check: 0 passed, 0 failed, 1 skipped")
        return 0
    dev = torch.device("cuda:0" if wanted == "cuda" else "cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(0)
    hvd.init()
    print("torch %s (CUDA %s), kolo.torch world size %d, NCCL %s, device %s"
          % (torch.__version__, torch.version.cuda, hvd.size(),
             hvd.nccl_built(), dev), flush=True)
    assert hvd.size() == 1, "run at -np 1 (one GPU)"

    dtypes = [torch.float32, torch.float64, torch.float16, torch.int32,
              torch.int64]
    if dev.type == "cuda":
        dtypes.append(torch.bfloat16)

    @check("allreduce every dtype, sum with scale factors and average")
    def _():
        for dtype in dtypes:
            x = (torch.arange(1000, device=dev) % 7 + 1).to(dtype)
            same(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                               postscale_factor=3.0,
                               name="scaled.%s" % dtype),
                 x * 6, "sum x2 x3 of %s" % dtype)
            same(hvd.allreduce(x, op=hvd.Average, name="avg.%s" % dtype), x,
                 "average of %s" % dtype)

    @check("in-place and asynchronous allreduce")
    def _():
        x = torch.ones(70001, device=dev)
        handle = hvd.allreduce_async_(x, op=hvd.Sum, postscale_factor=4.0,
                                      name="async")
        got = hvd.synchronize(handle)
        same(x, torch.full((70001,), 4.0, device=dev), "the tensor itself")
        assert got.data_ptr() == x.data_ptr(), "not in place"

    @check("a kernel still queued when the collective is submitted")
    def _():
        x = torch.zeros(1 << 22, device=dev)
        y = x + 1.0  # queued on the current stream
        for _ in range(8):
            y = y * 1.0 + 0.0
        same(hvd.allreduce(y, op=hvd.Sum, postscale_factor=2.0,
                           name="queued"),
             torch.full_like(y, 2.0), "after the queued kernels")

    @check("grouped allreduce of CPU and CUDA tensors in one step")
    def _():
        ts = [torch.full((100,), float(i), device=dev if i % 2 else "cpu")
              for i in range(6)]
        outs = hvd.grouped_allreduce(ts, op=hvd.Sum, prescale_factor=2.0,
                                     name="mixed")
        for t, o in zip(ts, outs):
            same(o, t * 2, "grouped on %s" % t.device)

    @check("allgather, broadcast, alltoall, reducescatter")
    def _():
        x = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)
        same(hvd.allgather(x, name="gather"), x, "allgather")
        same(hvd.broadcast(x, root_rank=0, name="bcast"), x, "broadcast")
        same(hvd.alltoall(x, name="a2a"), x, "alltoall")
        same(hvd.reducescatter(x, op=hvd.Sum, postscale_factor=2.0,
                               name="rs"), x * 2, "reducescatter")
        obj = hvd.broadcast_object({"step": 7}, root_rank=0)
        assert obj == {"step": 7}, obj

    def model_and_data():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)).to(dev)
        gen = torch.Generator().manual_seed(1)
        data = [(torch.randn(8, 16, generator=gen).to(dev),
                 torch.randn(8, 4, generator=gen).to(dev)) for _ in range(5)]
        return model, data

    def train(model, opt, data, wrap=None):
        net = wrap(model) if wrap else model
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    def trains_as_plain_sgd(got):
        model, data = model_and_data()
        want = train(model, torch.optim.SGD(model.parameters(), lr=0.1),
                     data)
        for g, w in zip(got, want):
            same(g, w, "parameters", exact=False)

    @check("DistributedOptimizer trains a model as plain SGD does")
    def _():
        model, data = model_and_data()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dopt = hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters())
        trains_as_plain_sgd(train(model, dopt, data))

    # The torch.distributed backend, in the same process: it shares the
    # runtime kolo.torch joined (kolorun exports torch's variables).
    dist.init_process_group("kolo")

    @check("torch.distributed collectives on the kolo backend")
    def _():
        x = torch.arange(8, dtype=torch.float32, device=dev)
        y = x.clone()
        dist.all_reduce(y)
        same(y, x, "all_reduce")
        out = torch.empty(8, device=dev)
        dist.all_gather_into_tensor(out, x)
        same(out, x, "all_gather_into_tensor")
        dist.reduce_scatter_tensor(out, x)
        same(out, x, "reduce_scatter_tensor")
        dist.broadcast(y, src=0)
        same(y, x, "broadcast")
        dist.barrier()

    @check("DDP on the kolo backend trains as plain SGD does")
    def _():
        model, data = model_and_data()
        ids = [0] if dev.type == "cuda" else None
        trains_as_plain_sgd(train(
            model, torch.optim.SGD(model.parameters(), lr=0.1), data,
            wrap=lambda m: torch.nn.parallel.DistributedDataParallel(
                m, device_ids=ids)))

    dist.destroy_process_group()
    hvd.shutdown()
    print("torch_python_check: %d passed, %d failed, %d skipped"
          % (passed, failed, skipped), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
