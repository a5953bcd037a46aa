"""An elastic training job for the launch tests (test_elastic.py): a small
regression model on a fixed dataset, one commit per step, under kolorun's
elastic mode. Events are triggered by environment variables:

  KILL_RANK/KILL_STEP   the workers of these first-generation ranks
                        ("2" or "1,2") SIGKILL themselves at that step of
                        generation 0
  STOP_RANK/STOP_STEP   ... SIGSTOPs itself instead (hangs)
  FAIL_ALWAYS_RANK      every worker started as that rank (newcomers
                        included) kills itself at its first step
  GROW_AT_STEP          rank 0 writes "localhost:<GROW_TO>" to HOSTS_FILE at
                        that step (the discovery script prints the file)
  SHRINK_AT_STEP        likewise with SHRINK_TO slots
  STEP_DELAY            seconds each step sleeps (to give kolorun's
                        discovery time to act between steps)

Every worker prints "START pid <pid> rank <r>" and at the end "FINAL pid
<pid> rank <r> of <n> gen <g> params <repr>"; rank 0 also prints "REPLAY
<max abs difference>" between its parameters and a single-process replay
of the committed steps, and "COVERAGE <unique> <total> <dataset>".
"""

import os
import signal
import sys
import time

import torch

import kolo.torch as hvd

N = int(os.environ.get("DATASET", "96"))
BATCH = 4
EPOCHS = int(os.environ.get("EPOCHS", "2"))


def env_int(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def make_data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N, 6, generator=g, dtype=torch.float64)
    w = torch.randn(6, 1, generator=g, dtype=torch.float64)
    return x, x @ w + 0.1 * torch.randn(N, 1, generator=g, dtype=torch.float64)


def make_model():
    torch.manual_seed(7)
    return torch.nn.Linear(6, 1).double()


def main():
    hvd.init()
    first_rank = int(os.environ["KOLO_RANK"])
    generation0 = hvd.elastic.generation() == 0
    print("START pid %d rank %d" % (os.getpid(), hvd.rank()), flush=True)
    x, y = make_data()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(opt,
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(N)), shuffle=False)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0,
                                   step=0, history=[])
    kill_ranks = [int(r) for r in os.environ.get("KILL_RANK", "").split(",")
                  if r]
    kill_step = env_int("KILL_STEP")
    stop = (env_int("STOP_RANK"), env_int("STOP_STEP"))
    fail_always = env_int("FAIL_ALWAYS_RANK")
    delay = float(os.environ.get("STEP_DELAY", "0"))

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            for batch_idx, idx in enumerate(torch.utils.data.DataLoader(
                    list(range(N)), batch_size=BATCH, sampler=sampler)):
                step = state.step
                if fail_always is not None and first_rank == fail_always:
                    os.kill(os.getpid(), signal.SIGKILL)
                if generation0 and hvd.elastic.generation() == 0:
                    if first_rank in kill_ranks and step == kill_step:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if (first_rank, step) == stop:
                        os.kill(os.getpid(), signal.SIGSTOP)
                if hvd.rank() == 0 and step == env_int("GROW_AT_STEP"):
                    with open(os.environ["HOSTS_FILE"], "w") as f:
                        f.write("localhost:%s\n" % os.environ["GROW_TO"])
                if hvd.rank() == 0 and step == env_int("SHRINK_AT_STEP"):
                    with open(os.environ["HOSTS_FILE"], "w") as f:
                        f.write("localhost:%s\n" % os.environ["SHRINK_TO"])
                if delay:
                    time.sleep(delay)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                sampler.record_batch(batch_idx, BATCH)
                # What this step trained on, in every rank's order, for the
                # replay (the sampler shares the indices at commit).
                batch = hvd.allgather_object([int(i) for i in idx])
                state.history = state.history + [batch]
                state.step = step + 1
                state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("FINAL pid %d rank %d of %d gen %d params %s" % (
        os.getpid(), hvd.rank(), hvd.size(), hvd.elastic.generation(),
        ",".join(repr(v) for v in params.tolist())), flush=True)
    if hvd.rank() == 0:
        # The committed steps again, in one process: each rank's mean
        # gradient averaged = the mean over the global batch when every
        # rank's batch has the same size (the sampler pads to that).
        ref = make_model()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        for batch in state.history:
            grads = []
            for part in batch:
                ref.zero_grad()
                torch.nn.functional.mse_loss(ref(x[part]), y[part]).backward()
                grads.append([p.grad.clone() for p in ref.parameters()])
            for i, p in enumerate(ref.parameters()):
                p.grad = sum(g[i] for g in grads) / len(grads)
            ref_opt.step()
        ref_params = torch.cat([p.detach().flatten() for p in ref.parameters()])
        print("REPLAY %.3g" % (params - ref_params).abs().max().item(),
              flush=True)
        seen = [i for batch in state.history for part in batch for i in part]
        print("COVERAGE %d %d %d" % (len(set(seen)), len(seen), N), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
