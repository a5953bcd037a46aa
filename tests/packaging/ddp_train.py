"""A DDP program on the kolo backend, as a user writes one: a small model
trained for a few steps on data of its own. Checks that the ranks' weights
stay bitwise equal and the loss falls; prints "DDP OK rank R of N".
Run under kolorun: kolorun -np 2 python ddp_train.py
"""

import torch
import torch.distributed as dist
import kolo.torch  # noqa: F401  (registers the backend "kolo")


def main():
    dist.init_process_group("kolo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same model everywhere; DDP broadcasts anyway
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its shard
    truth = torch.linspace(-1, 1, 16)
    losses = []
    for _ in range(30):
        x = torch.randn(64, 16, generator=data)
        y = (x @ truth).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(every, flat)
    if not all(torch.equal(every[0], w) for w in every):
        raise SystemExit("rank %d: the ranks' weights differ after DDP" % rank)
    if not losses[-1] < 0.5 * losses[0]:
        raise SystemExit("rank %d: the loss did not fall: %s" % (rank, losses))
    dist.destroy_process_group()
    print("DDP OK rank %d of %d: loss %.4f -> %.4f" %
          (rank, size, losses[0], losses[-1]))


if __name__ == "__main__":
    main()
