#!/usr/bin/python3
"""PyTorch DDP on the larger model of the performance reference: the twin of
examples/ch08_large_mlp.c.

MLP 1024 -> 4096 -> 4096 -> 1024 -> 10 (ReLU between the Linear layers, 25,185,290 parameters),
synthetic data (inputs uniform in [-1, 1), labels 0..9, a fixed set of 4 batches drawn once per
rank from a seeded generator), SGD lr 0.01, batch 64 per rank, gloo over loopback TCP, one
thread per rank. Each timed step: zero_grad, forward, loss, backward (DDP's wait for the last
buckets happens inside it), optimizer step; rank 0 prints the median of the steps after warm-up
and a "result ..." line in the format of the C program. The time backward waits for
communication is not observable from outside PyTorch's reducer, so wait_ms and exposed are nan.

Run with Debian's python3-torch (apt-get install python3-torch libopenblas0):
    /usr/bin/python3 bench/pytorch_ddp_large.py                 # DDP, 2 ranks, default buckets
    /usr/bin/python3 bench/pytorch_ddp_large.py --nproc 1       # one process, no DDP
    /usr/bin/python3 bench/pytorch_ddp_large.py --one-bucket    # all gradients in one bucket
    /usr/bin/python3 bench/pytorch_ddp_large.py --view          # gradient_as_bucket_view
    /usr/bin/python3 bench/pytorch_ddp_large.py --nproc 1 --threads 2   # one process, 2 threads
    python3 bench/pytorch_ddp_large.py --nproc 1 --device cuda   # one process on the GPU
    python3 bench/pytorch_ddp_large.py --nproc 1 --force-ddp --device cuda   # DDP (nccl), 1 rank
--threads N sets torch.set_num_threads(N) and, unless the environment already says otherwise,
OPENBLAS_NUM_THREADS and OMP_NUM_THREADS (read when torch loads, hence before the import).
On a GPU (--device cuda) every rank uses cuda:RANK and DDP uses nccl; the timer synchronises
the device at each mark, as examples/ch08_large_mlp.c does.
PyTorch is fastest here with OpenBLAS (Debian's libblas.so.3 alternative) and jemalloc that never
returns memory to the kernel; bench/large_model.sh runs it that way:
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
    MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 /usr/bin/python3 bench/pytorch_ddp_large.py
"""
import argparse
import os
import socket
import statistics
import sys
import time

# One BLAS and OpenMP thread per rank (or --threads N). Debian's torch reaches OpenBLAS through
# the generic libblas.so.3, so torch.set_num_threads does not reach OpenBLAS's own threads: the
# environment must say it before the library loads (at `import torch`), so --threads is read
# from the command line here, before argparse runs.
def _threads_from_argv():
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_from_argv())
os.environ.setdefault("OMP_NUM_THREADS", _threads_from_argv())

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print(f"skip: PyTorch not installed ({e}); apt-get install python3-torch libopenblas0, "
          "then run it with /usr/bin/python3")
    sys.exit(0)

NBATCHES = 4
BATCH = 64
SIZES = [1024, 4096, 4096, 1024, 10]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks; 1 = one process without DDP")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb (0 allowed)")
    p.add_argument("--first-bucket-mb", type=float, default=1.0,
                   help="first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)")
    p.add_argument("--one-bucket", action="store_true", help="everything in one bucket")
    p.add_argument("--view", action="store_true", help="gradient_as_bucket_view=True")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu, or cuda (rank R on cuda:R; DDP then uses nccl)")
    p.add_argument("--force-ddp", action="store_true",
                   help="wrap in DDP even with --nproc 1 (a world of one: DDP's own cost)")
    a = p.parse_args()
    if a.nproc < 1 or a.steps < 1 or a.warmup < 0 or a.bucket_cap_mb < 0 or a.first_bucket_mb < 0 or a.threads < 1:
        p.error("--nproc, --steps and --threads must be >= 1, the others >= 0")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False")
    return a


def make_model():
    layers = []
    for i in range(len(SIZES) - 1):
        layers.append(nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def run(rank, args, world, port):
    torch.set_num_threads(args.threads)
    distributed = world > 1 or args.force_ddp
    on_gpu = args.device == "cuda"
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    backend = "nccl" if on_gpu else "gloo"
    if distributed:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port if port else free_port())
        dist.init_process_group(backend, rank=rank, world_size=world)

    def sync():   # finished work only, as the C program's ddp_stream_sync
        if on_gpu:
            torch.cuda.synchronize(device)

    torch.manual_seed(1)
    model = make_model().to(device)
    nparams = sum(p.numel() for p in model.parameters())
    if distributed:
        cap_mb = 1e9 if args.one_bucket else args.bucket_cap_mb
        # PyTorch's own knob for the first bucket (read when DDP is constructed)
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(1e9 * 2**20 if args.one_bucket else args.first_bucket_mb * 2**20)
        model = DDP(model, device_ids=[rank] if on_gpu else None, bucket_cap_mb=cap_mb,
                    gradient_as_bucket_view=args.view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    g = torch.Generator().manual_seed(1000 + rank)
    xs = torch.rand(NBATCHES, BATCH, SIZES[0], generator=g) * 2 - 1
    ys = torch.randint(0, SIZES[-1], (NBATCHES, BATCH), generator=g)
    xs, ys = xs.to(device), ys.to(device)

    if rank == 0:
        print(f"model: MLP {' -> '.join(map(str, SIZES))}, {nparams} parameters "
              f"({nparams * 4 / 2**20:.2f} MiB of gradients), SGD lr 0.01, batch {BATCH} per rank")
        print(f"setup: PyTorch {torch.__version__}, {world} process{'es' if world > 1 else ''}"
              f"{', DDP ' + backend if distributed else ' (no DDP)'} on {device}, "
              f"{torch.get_num_threads()} thread(s) per rank, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, "
              f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '(none)')}; "
              f"{args.warmup} warm-up + {args.steps} timed steps", flush=True)

    step, fwd, bwd, upd = [], [], [], []
    loss = None
    for i in range(args.warmup + args.steps):
        x, y = xs[i % NBATCHES], ys[i % NBATCHES]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()
        sync()
        t3 = time.perf_counter()
        if i >= args.warmup:
            step.append((t3 - t0) * 1e3), fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3), upd.append((t3 - t2) * 1e3)

    nbuckets = 0
    if distributed:
        info = model._get_ddp_logging_data()
        # DDP rebuilds its buckets in gradient-ready order after the first step; before that
        # (or with one bucket) only the construction-time map exists
        sizes = str(info.get("rebuilt_bucket_sizes", info.get("bucket_sizes", "")))
        sizes = [int(s) for s in sizes.split(",") if s.strip()]
        nbuckets = len(sizes)
        if rank == 0:
            print(f"buckets: {nbuckets}{', gradient_as_bucket_view' if args.view else ''} (after the rebuild): "
                  + ", ".join(f"{s / 2**20:.2f} MiB" for s in sizes))
    if rank == 0:
        med = [statistics.median(v) for v in (step, fwd, bwd, upd)]
        print(f"median over {args.steps} steps (ms):  step {med[0]:.1f}  forward+loss {med[1]:.1f}  "
              f"backward (incl. wait) {med[2]:.1f}  optimizer {med[3]:.1f}; last loss {loss.item():.4f}")
        print(f"result nproc={world} buckets={nbuckets} view={int(args.view)} step_ms={med[0]:.2f} wait_ms=nan "
              f"exposed=nan fwd_ms={med[1]:.2f} bwd_ms={med[2]:.2f} opt_ms={med[3]:.2f}", flush=True)
    if distributed:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    if args.nproc == 1:
        run(0, args, 1, 0)   # --force-ddp picks its own port
    else:
        # on the CPU, fork: the ranks start at once instead of importing torch again; CUDA does not
        # survive a fork, so GPU ranks are spawned
        mp.start_processes(run, args=(args, args.nproc, free_port()), nprocs=args.nproc, join=True,
                           start_method="spawn" if args.device == "cuda" else "fork")


if __name__ == "__main__":
    main()
