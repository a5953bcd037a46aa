"""The classic data-parallel example: a small CNN on Fashion-MNIST, made
data-parallel with Horovod's lines (init, DistributedOptimizer, broadcast of
parameters and optimizer state) on kolo.

    kolorun -np 2 python3 frontends/python/examples/mnist.py --epochs 2

Reads the real Fashion-MNIST files of Debian's dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist). Each rank trains on its own shard
(DistributedSampler) with a batch of 64; the running loss is printed every
200 steps and a line per epoch with the throughput; at the end every rank
prints "OK rank R of N: test accuracy X%" (the accuracy over the whole test
set, counted on every rank's shard).
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import kolo.torch as hvd

# Fashion-MNIST's mean and standard deviation of the training pixels.
MEAN, STD = 0.2860, 0.3530


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 14 * 14, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def read_idx(path):
    """An IDX file (gzip'ed) as a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
             for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split, limit):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.copy()).float().div_(255) - MEAN) / STD
    return TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=0,
                   help="use the first N training images (0: all)")
    p.add_argument("--limit-test", type=int, default=0,
                   help="use the first N test images (0: all)")
    p.add_argument("--log-interval", type=int, default=200,
                   help="steps between loss lines")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--min-accuracy", type=float, default=0,
                   help="exit 1 below this test accuracy (percent)")
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    if not os.path.exists(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz")):
        sys.exit("mnist.py: %s must hold the Fashion-MNIST files (Debian's "
                 "dataset-fashion-mnist)" % args.data_dir)
    train = load(args.data_dir, "train", args.limit_train)
    test = load(args.data_dir, "test", args.limit_test)
    sampler = DistributedSampler(train, num_replicas=size, rank=rank,
                                 shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = SimpleCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # Horovod's lines: every rank starts from rank 0's state, and the
    # optimizer averages the gradients.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        start, running, seen = time.time(), 0.0, 0
        for step, (x, y) in enumerate(loader, 1):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            running += loss.item()
            seen += len(x)
            if step % args.log_interval == 0 and rank == 0:
                print("epoch %d step %d/%d: loss %.4f" %
                      (epoch, step, len(loader), running / args.log_interval),
                      flush=True)
                running = 0.0
        elapsed = time.time() - start
        total = hvd.allreduce(torch.tensor([float(seen)]), op=hvd.Sum,
                              name="samples").item()
        if rank == 0:
            print("epoch %d/%d done: %.0f samples/s over %d ranks (%.0f per "
                  "rank), %.1f s" % (epoch, args.epochs, total / elapsed, size,
                                     total / elapsed / size, elapsed),
                  flush=True)

    model.eval()
    test_loader = DataLoader(
        test, batch_size=1000,
        sampler=DistributedSampler(test, num_replicas=size, rank=rank,
                                   shuffle=False))
    correct = total = 0
    with torch.no_grad():
        for x, y in test_loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.int64),
                           op=hvd.Sum, name="test.counts")
    accuracy = 100.0 * counts[0].item() / counts[1].item()
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        print("rank %d: test accuracy %.2f%% is below --min-accuracy %.2f%%" %
              (rank, accuracy, args.min_accuracy), flush=True)
        sys.exit(1)
    print("OK rank %d of %d: test accuracy %.2f%%" % (rank, size, accuracy),
          flush=True)


if __name__ == "__main__":
    main()
