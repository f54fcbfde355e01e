#!/usr/bin/python3
"""PyTorch on the tutorial's model: the twin of examples/ch01_single_gpu.c (one process) and
examples/ch03_multi_gpu.c (DDP), for step times only.

The wine data (examples/data/wine.csv: 13 features, 3 classes), 80% for training, standardised
with the training statistics; MLP 13 -> 64 -> 3 with ReLU, Adam lr 1e-3, cross-entropy, batch 32
per rank. Every epoch each rank visits its share of a fresh shuffle (DistributedSampler's rule:
the order padded to a multiple of the world size, rank r takes every world-th sample from r), in
batches of 32 with the last one short, as ddp.h's sampler and loader do; so one process takes
5 steps per epoch of the 142 training samples, and each of 2 ranks 3 steps (32, 32, 7).

Timing: after --warmup-epochs untimed epochs, the loop over --epochs epochs is timed as a whole
(batch gathering, zero_grad, forward, loss, backward with DDP's all-reduce, optimizer step, the
shuffles); rank 0 prints its mean time per step (loop time / steps), which is what bench/run.py
compares with ddp.h's examples, and the median of the individual steps. One thread per rank;
DDP uses gloo over loopback TCP.

    /usr/bin/python3 bench/pytorch_wine.py --nproc 1     # one process, no DDP
    /usr/bin/python3 bench/pytorch_wine.py --nproc 2     # DDP, 2 ranks x 32
    python3 bench/pytorch_wine.py --device cuda          # one process on a GPU (make bench-gpu)
Run it from the repository's top folder (or pass --data). Without torch it prints "skip: ...".
"""
import argparse
import csv
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print("skip: PyTorch not installed (%s); apt-get install python3-torch, run with /usr/bin/python3" % e)
    sys.exit(0)

BATCH = 32
HIDDEN = 64


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=1, help="ranks; 1 = one process without DDP")
    p.add_argument("--epochs", type=int, default=300, help="timed epochs")
    p.add_argument("--warmup-epochs", type=int, default=5, help="untimed epochs first")
    p.add_argument("--data", default=os.path.join("examples", "data", "wine.csv"))
    p.add_argument("--device", default="cpu", help="cpu, or cuda (one process: the GPU's timed loop ends with a "
                   "torch.cuda.synchronize after each epoch)")
    a = p.parse_args()
    if a.device != "cpu" and a.nproc != 1:
        p.error("--device cuda takes one process (--nproc 1)")
    if a.nproc < 1 or a.epochs < 1 or a.warmup_epochs < 0:
        p.error("--nproc and --epochs must be >= 1, --warmup-epochs >= 0")
    return a


def load(path):
    """Features and labels (the last column) of a CSV with a header line, as tensors."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    x = torch.tensor([[float(v) for v in r[:-1]] for r in rows], dtype=torch.float32)
    y = torch.tensor([int(r[-1]) for r in rows], dtype=torch.int64)
    return x, y


def run(rank, args, world, port):
    torch.set_num_threads(1)
    distributed = world > 1
    if distributed:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)

    x, y = load(args.data)
    g = torch.Generator().manual_seed(42)
    order = torch.randperm(len(y), generator=g)
    ntrain = len(y) - int(round(0.2 * len(y)))
    xtr, ytr = x[order[:ntrain]], y[order[:ntrain]]
    mean, std = xtr.mean(0), xtr.std(0)
    xtr = (xtr - mean) / std

    dev = torch.device(args.device)
    xtr, ytr = xtr.to(dev), ytr.to(dev)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(x.shape[1], HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, int(y.max()) + 1)).to(dev)
    if distributed:
        model = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    per_rank = -(-ntrain // world)     # DistributedSampler: ceil(n / world), the order padded
    steps_per_epoch = -(-per_rank // BATCH)

    shuffle = torch.Generator()

    def epoch_indices(epoch):
        perm = torch.randperm(ntrain, generator=shuffle.manual_seed(1000 + epoch))
        if per_rank * world > ntrain:
            perm = torch.cat([perm, perm[:per_rank * world - ntrain]])
        return perm[rank::world]

    step_times = []
    t_loop = 0.0
    for epoch in range(args.warmup_epochs + args.epochs):
        timed = epoch >= args.warmup_epochs
        t_epoch = time.perf_counter()
        idx = epoch_indices(epoch).to(dev)
        for lo in range(0, per_rank, BATCH):
            t0 = time.perf_counter()
            b = idx[lo:lo + BATCH]
            xb, yb = xtr[b], ytr[b]
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if timed:
                step_times.append((time.perf_counter() - t0) * 1e3)
        if dev.type == "cuda":
            torch.cuda.synchronize()  # the epoch's kernels are done: the loop time is the GPU's too
        if timed:
            t_loop += time.perf_counter() - t_epoch

    if rank == 0:
        steps = len(step_times)
        print("model: MLP %d -> %d -> %d, Adam lr 1e-3, batch %d per rank; PyTorch %s, %d process%s, %d thread "
              "per rank, device %s; %d training samples, %d steps per epoch" % (
                  x.shape[1], HIDDEN, int(y.max()) + 1, BATCH, torch.__version__, world,
                  "es, DDP gloo" if distributed else " (no DDP)", torch.get_num_threads(), args.device, ntrain,
                  steps_per_epoch))
        print("%d timed epochs (%d steps) after %d warm-up: %.4f ms per step (loop time / steps), median step "
              "%.4f ms; last loss %.4f" % (args.epochs, steps, args.warmup_epochs, t_loop * 1e3 / steps,
                                           statistics.median(step_times), loss.item()))
        print("result nproc=%d steps=%d step_ms=%.5f median_step_ms=%.5f" % (
            world, steps, t_loop * 1e3 / steps, statistics.median(step_times)), flush=True)
    if distributed:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    if args.nproc == 1:
        run(0, args, 1, 0)
    else:
        # fork: the ranks start at once instead of importing torch again (nothing has run in torch yet)
        mp.start_processes(run, args=(args, args.nproc, free_port()), nprocs=args.nproc, join=True,
                           start_method="fork")


if __name__ == "__main__":
    main()
