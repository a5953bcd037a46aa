"""The mnist example made elastic with Horovod's elastic API
(``hvd.elastic``): it keeps training when workers are lost or added.

    kolorun -np 4 --min-np 2 python3 frontends/python/examples/elastic_mnist.py

The model, data and optimizer are mnist.py's (Fashion-MNIST from Debian's
dataset-fashion-mnist); an ElasticSampler shards the data, and the state
(parameters, Adam's moments, the sampler's progress, epoch) is committed
every --commit-every steps. At the end every rank prints "OK rank R of N:
test accuracy X%". For measuring (tools/bench/elastic_bench.sh):
--kill-rank/--kill-step make that first-generation rank SIGKILL itself, and
every rank prints "COMMIT_MS <mean> <count>" (the cost of commit()) and,
after a reset, "RESUMED <seconds>" (from the kill, written by the dying
rank to --kill-file, to the first step done after the reset).
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import kolo.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist import SimpleCNN, load  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--limit-test", type=int, default=0)
    p.add_argument("--commit-every", type=int, default=10,
                   help="steps between commits")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--kill-file", default="")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    first_rank = int(os.environ.get("KOLO_RANK", "0"))
    torch.manual_seed(args.seed)
    train = load(args.data_dir, "train", args.limit_train)
    test = load(args.data_dir, "test", args.limit_test)
    model = SimpleCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train, shuffle=True, seed=args.seed)
    loss_fn = nn.CrossEntropyLoss()
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler,
                                   epoch=0, steps=0)
    commit_times = []
    resumed = {"pending": False}

    def on_reset():
        resumed["pending"] = True
        if hvd.rank() == 0:
            print("reset: generation %d, %d ranks" % (
                hvd.elastic.generation(), hvd.size()), flush=True)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def training(state):
        while state.epoch < args.epochs:
            model.train()
            loader = DataLoader(train, batch_size=args.batch_size,
                                sampler=sampler)
            for batch_idx, (x, y) in enumerate(loader):
                if (first_rank == args.kill_rank and
                        state.steps == args.kill_step and
                        hvd.elastic.generation() == 0):
                    if args.kill_file:
                        with open(args.kill_file, "w") as f:
                            f.write(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                sampler.record_batch(batch_idx, args.batch_size)
                state.steps += 1
                if resumed["pending"]:
                    resumed["pending"] = False
                    if args.kill_file and os.path.exists(args.kill_file):
                        with open(args.kill_file) as f:
                            killed_at = float(f.read())
                        print("RESUMED %.3f" % (time.time() - killed_at),
                              flush=True)
                if state.steps % args.commit_every == 0:
                    start = time.perf_counter()
                    state.commit()
                    commit_times.append(time.perf_counter() - start)
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    training(state)
    model.eval()
    correct = torch.zeros(1)
    shard = range(hvd.rank(), len(test), hvd.size())
    with torch.no_grad():
        for i in range(0, len(shard), 1000):
            idx = list(shard[i:i + 1000])
            x = torch.stack([test[j][0] for j in idx])
            y = torch.tensor([int(test[j][1]) for j in idx])
            correct += (model(x).argmax(1) == y).sum()
    correct = hvd.allreduce(correct, op=hvd.Sum, name="correct")
    if commit_times:
        print("COMMIT_MS %.2f %d" % (
            1000 * sum(commit_times) / len(commit_times), len(commit_times)),
            flush=True)
    print("OK rank %d of %d: test accuracy %.2f%%" % (
        hvd.rank(), hvd.size(), 100.0 * correct.item() / len(test)),
        flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
