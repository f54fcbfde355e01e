#!/usr/bin/python3
"""PyTorch gloo all-reduce timer whose table reads like tools/allreduce_perf.c's.

The peer for ddp.h's CPU backend that most readers already know: torch.distributed with the gloo
backend over loopback TCP, one process per rank on this machine, one intra-op thread per rank.

Method (the same as allreduce_perf and bench/mpi_allreduce.c, so the three tables compare):
  * one buffer per rank, allocated and touched once at the largest size; the input pattern is the
    integers in [-15, 15] that the C timers use (exact in f32 for any sum of a few ranks);
  * per iteration: refill the buffer from the input (untimed; the all-reduce is in place),
    dist.barrier(), then ONE dist.all_reduce(view, SUM) timed alone with time.perf_counter;
  * after the loop the per-iteration times are all-reduced with MAX (the slowest rank's time of
    each iteration) and the table shows their MEDIAN;
  * algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes;
  * #wrong: one more all-reduce on another pattern, every element compared with the exact sum,
    for messages up to CHECK_MAX (16 MiB; above it "N/A": the check in Python would take longer
    than the timing, and gloo is the reference here, not the code under test).

Run it with a Python that has torch (Debian's python3-torch: /usr/bin/python3):
    /usr/bin/python3 bench/gloo_allreduce.py --nproc 2 -b 4K -e 256M -f 4
Flags (as allreduce_perf): -b minbytes (4K) -e maxbytes (64M), suffixes K/M/G = powers of 1024;
-f stepfactor (2); -n iterations (20); -w warm-up iterations (5); -c check 0/1 (1); --nproc N (2).
Rank 0 prints the table; without torch the script prints "skip: ..." and exits 0.
"""
import argparse
import os
import socket
import statistics
import sys
import time

# one BLAS/OpenMP thread per rank, before torch loads (ranks share the machine's cores)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:
    print("skip: PyTorch not installed (%s); apt-get install python3-torch, run with /usr/bin/python3" % e)
    sys.exit(0)

CHUNK = 1 << 20         # elements per piece when generating or checking (bounds the temporaries)
CHECK_MAX = 16 << 20    # bytes: larger messages are timed but not checked


def parse_bytes(s):
    """Bytes from "4096", "4K", "64M", "1G" or "64MB" (powers of 1024)."""
    t = s.strip().upper()
    if t.endswith(("KB", "MB", "GB")):
        t = t[:-1]
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    if mul > 1:
        t = t[:-1]
    if not t.isdigit():
        raise argparse.ArgumentTypeError("%r is not a size (bytes with K, M or G)" % s)
    return int(t) * mul


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("-b", type=parse_bytes, default=4 << 10, dest="minbytes")
    p.add_argument("-e", type=parse_bytes, default=64 << 20, dest="maxbytes")
    p.add_argument("-f", type=int, default=2, dest="factor")
    p.add_argument("-n", type=int, default=20, dest="iters")
    p.add_argument("-w", type=int, default=5, dest="warmup")
    p.add_argument("-c", type=int, default=1, choices=(0, 1), dest="check")
    a = p.parse_args()
    if a.nproc < 1 or a.factor < 2 or a.iters < 1 or a.warmup < 0 or a.maxbytes < a.minbytes:
        p.error("need --nproc >= 1, -f >= 2, -n >= 1, -w >= 0 and -e >= -b")
    return a


def pattern(out, rank, salt):
    """Fill the f32 tensor `out` with allreduce_perf's input_value(rank, i, salt), piece by piece."""
    n = out.numel()
    for lo in range(0, n, CHUNK):
        i = torch.arange(lo, min(n, lo + CHUNK), dtype=torch.int64)
        h = i * 7 + (i >> 9) + rank * 13 + salt * 5 + (rank * rank) * (i % 3)
        out[lo:lo + i.numel()].copy_(h % 31 - 15)


def count_wrong(got, world, salt):
    n, wrong = got.numel(), 0
    for lo in range(0, n, CHUNK):
        m = min(n, lo + CHUNK) - lo
        want = torch.zeros(m, dtype=torch.float64)
        part = torch.empty(m, dtype=torch.float32)
        for r in range(world):
            i = torch.arange(lo, lo + m, dtype=torch.int64)
            h = i * 7 + (i >> 9) + r * 13 + salt * 5 + (r * r) * (i % 3)
            part.copy_(h % 31 - 15)
            want += part.double()
        wrong += int((got[lo:lo + m].double() != want).sum())
    return wrong


def sizes(a):
    out, b = [], a.minbytes
    while True:
        out.append(b)
        if b > a.maxbytes // a.factor or b == 0:
            return out
        b *= a.factor


def fmt_time(us):
    return "%7.0f" % us if us >= 10000 else "%7.1f" % us if us >= 100 else "%7.2f" % us


def run(rank, a, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    maxcount = max(s // 4 for s in sizes(a))
    buf = torch.zeros(max(1, maxcount), dtype=torch.float32)    # touched once, reused
    inp = torch.zeros(max(1, maxcount), dtype=torch.float32)
    pattern(inp, rank, 0)   # once: element i does not depend on the size, so every size uses a prefix
    if rank == 0:
        print("# gloo_allreduce (PyTorch %s, gloo): minBytes %d maxBytes %d step: %d(factor) warmup iters: %d "
              "iters: %d validation: %d" % (torch.__version__, a.minbytes, a.maxbytes, a.factor, a.warmup,
                                            a.iters, a.check))
        print("# world size %d, %d thread per rank; in place; time: median over iterations of the slowest rank "
              "(barrier, then one all_reduce timed alone; the refill is not timed)" % (world, torch.get_num_threads()))
        print("# algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes\n#")
        print("#       size         count      type   redop    time   algbw   busbw  #wrong")
        print("#        (B)    (elements)                       (us)  (GB/s)  (GB/s)", flush=True)
    total_wrong = 0
    for nbytes in sizes(a):
        count = nbytes // 4
        nbytes = count * 4
        view, src = buf[:count], inp[:count]
        for _ in range(a.warmup):
            view.copy_(src)
            dist.barrier()
            dist.all_reduce(view, op=dist.ReduceOp.SUM)
        times = torch.zeros(a.iters, dtype=torch.float64)
        for it in range(a.iters):
            view.copy_(src)                      # untimed refill
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(view, op=dist.ReduceOp.SUM)
            times[it] = (time.perf_counter() - t0) * 1e6
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t = statistics.median(times.tolist())
        algbw = nbytes / (t * 1e-6) / 1e9 if t > 0 else 0.0
        busbw = algbw * 2.0 * (world - 1) / world
        wstr = "N/A"
        if a.check and nbytes <= CHECK_MAX:
            pattern(view, rank, 1)
            dist.all_reduce(view, op=dist.ReduceOp.SUM)
            w = torch.tensor([count_wrong(view, world, 1)], dtype=torch.int64)
            dist.all_reduce(w, op=dist.ReduceOp.SUM)
            total_wrong += int(w)
            wstr = str(int(w))
        if rank == 0:
            print("%12d  %12d  %8s  %6s  %7s  %6.2f  %6.2f  %6s" % (nbytes, count, "float", "sum", fmt_time(t),
                                                                  algbw, busbw, wstr), flush=True)
    if rank == 0:
        print("# Out of bounds values : %d %s\n#" % (total_wrong, "FAILED" if total_wrong else "OK"), flush=True)
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse_args()
    # fork: the ranks start at once instead of importing torch again (nothing has run in torch yet)
    mp.start_processes(run, args=(a, a.nproc, free_port()), nprocs=a.nproc, join=True, start_method="fork")


if __name__ == "__main__":
    main()
