"""Synthetic training benchmark, as Horovod's PyTorch one: a model on random
data, images/s per worker and in total, mean +- 95% interval over several
iterations of several batches.

    kolorun -np 2 python3 frontends/python/examples/synthetic_benchmark.py
    kolorun -np 2 python3 .../synthetic_benchmark.py --model resnet18

--model small (the default) is the CNN of mnist.py on 1x28x28 images; any
other name is a torchvision model (3x224x224 images), when Debian's
python3-torchvision is installed.
"""

import argparse
import math
import timeit

import torch
import torch.nn.functional as F

import kolo.torch as hvd


def small_model():
    from mnist import SimpleCNN  # the example's model, next to this file
    return SimpleCNN()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true")
    args = p.parse_args()

    hvd.init()
    if args.model == "small":
        model, shape, classes = small_model(), (1, 28, 28), 10
    else:
        try:
            import torchvision.models as models
        except ImportError:
            raise SystemExit("--model %s needs python3-torchvision" % args.model)
        model, shape, classes = getattr(models, args.model)(), (3, 224, 224), 1000
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce
        else hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, classes, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log("Model: %s, batch size %d, %d ranks" % (args.model, args.batch_size,
                                               hvd.size()))
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    for i in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per rank" % (i, rate))
        img_secs.append(rate)
    mean = sum(img_secs) / len(img_secs)
    conf = 1.96 * math.sqrt(sum((x - mean) ** 2 for x in img_secs) /
                            max(1, len(img_secs) - 1))
    log("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f" %
        (hvd.size(), hvd.size() * mean, hvd.size() * conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
