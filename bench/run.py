#!/usr/bin/env python3
"""make bench: ddp.h measured side by side with its peers on this machine, in one run.

    python3 bench/run.py [BUILD]            # what `make bench` runs (BUILD: make's $(BUILD))
    python3 bench/run.py --gpu [BUILD]      # what `make bench-gpu` runs
    BENCH_QUICK=1 python3 bench/run.py      # a smoke run of about 3 minutes

Python standard library only. Start it from anywhere: it runs everything from the repository's
top folder (the examples find their data there).
The programs it starts must already be built (the make targets build them first); the Open MPI
timer is compiled here, with mpicc, into BUILD/bench/. Raw output of every launch goes to
BUILD/bench/logs/, the figures to BUILD/bench/results.csv (one row per figure, with every
launch's value) and the final table to BUILD/bench/table.txt as well as the terminal.

WHAT EACH SECTION MEASURES
  1. all-reduce, f32 sum, in place, 2 and 4 ranks, 4 KiB .. 256 MiB. ddp.h's timer
     (tools/allreduce_perf under BUILD/ddprun) with DDP_TRANSPORT=shm and with DDP_TRANSPORT=tcp;
     Open MPI's MPI_Allreduce (bench/mpi_allreduce.c) over shared memory (default btl) and over
     TCP (--mca btl tcp,self); PyTorch's gloo (bench/gloo_allreduce.py). All three timers do the
     same thing per iteration: refill the buffer (untimed), barrier, time ONE all-reduce; the
     figure of a launch is the median over iterations of the slowest rank's time. Reported:
     busbw = size / time * 2(n-1)/n (GB = 1e9 B), the time at 4 KiB, and ratios (ddp.h shm / MPI
     shm, ddp.h tcp / MPI tcp, the better ddp.h / gloo; at 4 KiB, time ratios: lower is better).
     Every timer checks one more all-reduce element by element; a wrong element marks the cell.
  2. a DDP training step of the 25M-parameter MLP (examples/ch08_large_mlp.c; its PyTorch twin is
     bench/pytorch_ddp_large.py), batch 64 per rank, one BLAS thread per rank, 2 ranks, default
     buckets (25 MiB, first 1 MiB) and one bucket. ms/step, the exposed-communication fraction
     (ddp.h: the time backward waited for buckets after its last layer, / step; PyTorch does not
     expose it), weak-scaling efficiency = one process's step / the DDP step (same per-rank
     batch), and "added" = DDP step - one process's step, with ddp.h-added / PyTorch-added. The
     ddp.h rows run with the default transport (automatic); one more runs DDP_TRANSPORT=tcp. Two more
     run on a slow network (DDP_SIMULATE_NS_PER_BYTE=2: about 200 ms a step), with the default
     buckets and with one bucket: their ratio is how much of the network backward hides (overlap).
  3. the bucket-size sweep of ddp.h on that model (caps 0 = one parameter per bucket, 4, 25,
     100 MiB, one bucket), and the transport's latency a and bandwidth B fitted to section 1's
     2-rank times (T = 2(n-1)a + 2(n-1)/n S/B, n = 2), with what that cost model says about
     buckets (see fit_alpha_beta and model_exposed in bench/costmodel.py for the formulas).
  4. one process, no DDP: ms/step of the same model, ddp.h against PyTorch, with 1 and 2 BLAS
     threads (OpenBLAS on both sides; PyTorch with jemalloc when installed, its fastest setting).
  5. the tutorial's model (wine, 13 -> 64 -> 3, Adam, batch 32 per rank): ddp.h one process
     (examples/ch01_single_gpu) against 2 ranks (examples/ch03_multi_gpu), and PyTorch's
     (bench/pytorch_wine.py). The examples print no step times, so a ddp.h launch is a pair of
     runs, short and long (only the number of epochs differs), and its figure is
     (wall time of the long run - wall time of the short one) / (difference in steps): start-up,
     data loading and evaluation cancel out; what remains is the mean time of a training-loop
     step (loader, forward, backward with the all-reduce, optimizer). PyTorch's script times its
     own loop the same way (loop time / steps).
  6. chapter 12's GPT (examples/ch12_gpt.c; its PyTorch twin, module for module, bench/gpt_torch.py),
     nanoGPT's laptop setting (0.8M parameters, context 64), batch 12 per rank, AdamW, clipping,
     one BLAS thread per rank: one process and DDP on 2 ranks (gloo for PyTorch). ddp.h's figure
     is the median of its progress lines' ms/step (each the mean of 2 steps, the first 4 steps
     left out), PyTorch's the median step of its loop; "added" = DDP step - one process's step.

METHOD. The launches of one round go round-robin over every setup of a section, so that a change
in the machine's load hits peers alike; a cell is the MEDIAN of its launches (rounds), a launch's
figure the median of its iterations or steps. Rounds: all-reduce 5 for 4 KiB-1 MiB and 3 for 16-256
MiB, training steps 5. On this kind of virtual machine the same program runs in a fast or a slow
state of the host, for seconds at a time (Open MPI's 1 MiB took 138 us in some launches and 387 us
in others; ddp.h's 256 MiB over shared memory 38 ms or 220 ms), so every cell
gets an odd number of launches and a median that one odd launch cannot move. The
sections, in the order each round runs them: all-reduce 4 KiB-1 MiB (30 iterations per size),
the large model (sections 2, 3 and 4 share its launches), wine, the GPT, all-reduce 16-256 MiB (3
iterations). Round 1 of every section runs first, then round 2 of every section, and so on,
except that the later rounds of the 16-256 MiB all-reduce, the longest by far on a busy machine,
come after all the others. Before a later round starts, its section's round-1 duration (plus
15%) is compared with the time budget left, and the round is skipped (the table says so) when it
would not fit. Compare ratios measured in one run, never a figure against
another day's; on a busy machine (the header says how much CPU other programs took) Open MPI's
shared memory, which polls and yields, suffers far more than the others.

KNOBS (environment variables)
  BENCH_QUICK=1           a smoke run (~3 min): 1 round, all-reduce up to 16 MiB, 3 steps
  BENCH_SMOKE=1           every program and parser once at the smallest sizes (~1 min; make test
                          runs it): its figures mean nothing, a row without one means a parser broke
  BENCH_BUDGET_S          seconds of measuring after which no later round starts (720; quick 200);
                          past it plus 90 s no launch starts at all (its cells say so)
  BENCH_AR_ROUNDS         launches per all-reduce cell of 16 MiB and more (3; quick 1)
  BENCH_AR_SMALL_ROUNDS   launches per all-reduce cell of 4 KiB-1 MiB (5; quick 1)
  BENCH_STEP_ROUNDS       launches per training cell (5; quick 1)
  BENCH_STEPS, BENCH_WARMUP  timed and warm-up steps per large-model launch (10, 2; quick 3, 1;
                          --gpu 50, 10, with BENCH_STEP_ROUNDS 3)
  BENCH_RANKS             all-reduce world sizes ("2 4")
  BENCH_LAUNCH_TIMEOUT_S  a launch running longer is stopped and its cell marked (240)
  BENCH_PY                the Python with torch for the PyTorch rows (/usr/bin/python3)
  BENCH_OUT               the folder for results.csv, table.txt and logs/ (BUILD/bench)
  BENCH_HAVE_CUDA         set by make bench-gpu: 1 when ddp.h was built with CUDA
  BENCH_FAKEGPU=1         --gpu on the GPU stand-in (tests/fakegpu; programs from BUILD/fakegpu):
                          the code path of make bench-gpu, run to the end; its figures mean nothing
"""
import csv
import datetime
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:    # python3 -P or -I leaves the script's folder out
    sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ left in the checkout by a benchmark run
import costmodel  # noqa: E402  (bench/costmodel.py, found through the line above)
from costmodel import MiB  # noqa: E402


def env_num(name, default, kind=float):
    v = os.environ.get(name, "")
    try:
        return kind(v) if v.strip() else default
    except ValueError:
        sys.exit("bench/run.py: %s=%r is not a number" % (name, v))


SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")   # make test: every parser once, about a minute
QUICK = SMOKE or os.environ.get("BENCH_QUICK", "") not in ("", "0")
BUDGET_S = env_num("BENCH_BUDGET_S", 150.0 if SMOKE else 200.0 if QUICK else 720.0)
HARD_MARGIN_S = 90.0   # past the budget plus this, not even round 1 starts another launch
AR_ROUNDS = env_num("BENCH_AR_ROUNDS", 1 if QUICK else 3, int)
AR_SMALL_ROUNDS = env_num("BENCH_AR_SMALL_ROUNDS", 1 if QUICK else 5, int)
STEP_ROUNDS = env_num("BENCH_STEP_ROUNDS", 1 if QUICK else 5, int)
STEPS = env_num("BENCH_STEPS", 1 if SMOKE else 3 if QUICK else 10, int)
WARMUP = env_num("BENCH_WARMUP", 0 if SMOKE else 1 if QUICK else 2, int)
LAUNCH_TIMEOUT_S = env_num("BENCH_LAUNCH_TIMEOUT_S", 240.0)
RANKS = [int(x) for x in os.environ.get("BENCH_RANKS", "2 4").split()]
PY = os.environ.get("BENCH_PY", "/usr/bin/python3")
# make bench-gpu's own defaults: a GPU step is short, so more of them per launch
GPU_STEPS = env_num("BENCH_STEPS", 50, int)
GPU_WARMUP = env_num("BENCH_WARMUP", 10, int)
GPU_ROUNDS = env_num("BENCH_STEP_ROUNDS", 3, int)
FAKEGPU = os.environ.get("BENCH_FAKEGPU") == "1"
HAVE_CUDA = os.environ.get("BENCH_HAVE_CUDA") == "1"

# all-reduce sizes: two launches per setup and round, so that big messages get fewer iterations
#   (name, -b, -e, -f, iterations, warm-up)
AR_GROUPS = ([("smoke", "4K", "64K", 16, 2, 0)] if SMOKE else    # 4 and 64 KiB, 2 iterations
             [("quick", "4K", "16M", 16, 8, 2)] if QUICK else   # one launch per setup: 4 KiB .. 16 MiB
             [("tiny", "4K", "4K", 16, 200, 200),               # 4 KiB: latency, so a longer run
              ("small", "64K", "1M", 16, 30, 5),                # 64 KiB, 1 MiB
              ("large", "16M", "256M", 4, 3, 1)])               # 16, 64, 256 MiB
# A 4 KiB all-reduce takes tens to hundreds of microseconds, and with more ranks than cores the first
# few hundred of a launch ran slower in our runs, Open MPI's as well as ddp.h's; so the tiny group
# warms up with 200 and times 200 more, still well under a second per launch.
AR_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
AR_IMPLS = ["ddp_shm", "ddp_tcp", "mpi_shm", "mpi_tcp", "gloo"]
AR_LABEL = {"ddp_shm": "ddp.h shm", "ddp_tcp": "ddp.h tcp", "mpi_shm": "MPI shm", "mpi_tcp": "MPI tcp",
            "gloo": "gloo"}
AR_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(float)\s+(sum)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\S+)\s*$")

# the bucket sweep: (setup, cap as printed, the example's flags, the cap in bytes for the model)
SWEEP_CAPS = [("cap0", "0", ["--bucket-cap-mb", "0"], 1), ("cap4", "4", ["--bucket-cap-mb", "4"], 4 * MiB),
              ("c2", "25 (default)", [], 25 * MiB), ("cap100", "100", ["--bucket-cap-mb", "100"], 100 * MiB),
              ("c2one", "one bucket", ["--one-bucket"], costmodel.ONE_BUCKET)]
SLOW_NS = "2"  # DDP_SIMULATE_NS_PER_BYTE of the overlap rows

# wine: epochs of the short and the long run of a ddp.h launch; PyTorch's timed epochs
WINE_EPOCHS = {"c1": (1, 3), "c2": (1, 3)} if SMOKE else \
    {"c1": (10, 10000 if QUICK else 30000), "c2": (10, 1500 if QUICK else 5000)}
WINE_TORCH_EPOCHS = {"p1": 3, "p2": 3} if SMOKE else {"p1": 100 if QUICK else 400, "p2": 60 if QUICK else 200}
SMOKE_LARGE = ("c1", "p1", "c2", "p2")   # BENCH_SMOKE=1: the large model's setups it runs (each program once)

CSV_HEADER = ["section", "setup", "ranks", "size_bytes", "metric", "value", "unit", "launches", "per_launch"]


# ---- running things --------------------------------------------------------------------------

def clean_env(extra=None):
    """This run's environment without the caller's launcher, DDP_*, thread or preload settings,
    so that nothing left over in the shell changes what is measured; then `extra`."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDP_", "SLURM_", "OMPI_", "PMIX_", "BENCH_")) and k not in drop}
    env.update(extra or {})
    return env


def disp(path):
    """A path as printed: relative when inside the repository, else as it is."""
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def shown(cmd, extra):
    def rel(a):
        a = str(a)
        return os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT + os.sep) else a
    return " ".join(["%s=%s" % kv for kv in sorted((extra or {}).items())] + [rel(a) for a in cmd])


def quiet(cmd, extra=None, timeout=60):
    """A probe: (exit status, output); never raises."""
    try:
        p = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=clean_env(extra), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, errors="replace", timeout=timeout)
        return p.returncode, p.stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, str(e)


def med(v):
    v = [x for x in v if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(v) if v else None


def result_fields(out):
    """The last 'result k=v ...' line of an output (ddprun's "[rank 0]: " prefix allowed)."""
    for line in reversed((out or "").splitlines()):
        line = re.sub(r"^\[rank \d+\]: ", "", line)
        if line.startswith("result "):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return None


def fnum(d, k):
    try:
        return float(d[k])
    except (KeyError, TypeError, ValueError):
        return None


class Run:
    """One benchmark run: its clock, its launches (each logged to logdir/NNN_tag.txt) and what they
    measured. Every section's round adds to it; the report reads it."""

    def __init__(self, logdir, installed, budget_s, t0):
        self.logdir, self.installed, self.t0 = logdir, installed, t0
        self.budget_s = budget_s       # None: no launch is refused for time
        self.launches = 0
        self.done, self.took = {}, {}  # section -> rounds done, seconds its first round took
        self.notes = []                # lines printed under the table: skipped rounds, failures
        self.skip = {}                 # cell key -> why it has no figure
        self.ar, self.ar_wrong = {}, {}  # (impl, ranks, size) -> [us per launch], wrong elements
        self.step = {}                 # large-model setup -> [result dicts, one per launch]
        self.buckets = {}              # large-model setup -> its bucket map as the example printed it
        self.wine = {}                 # wine setup -> [ms per step, one per launch]
        self.gpt = {}                  # GPT setup -> [ms per step, one per launch]
        self.ddp_blas = "?"            # ddp.h's BLAS, as the large example reports it

    def elapsed(self):
        return time.time() - self.t0

    def note(self, line):
        if line not in self.notes:
            self.notes.append(line)
        print("   note: " + line, flush=True)

    def skipped(self, key, why):
        """Why cell `key` has no figure; the first reason stays."""
        self.skip.setdefault(key, why)

    def launch(self, tag, cmd, extra=None):
        """Run one command from the repository root, output kept in logdir/NNN_tag.txt.
        Returns (output or None, seconds, why it failed or "")."""
        if self.budget_s is not None and self.elapsed() > self.budget_s + HARD_MARGIN_S:
            return None, 0.0, "time budget spent (BENCH_BUDGET_S=%g, nothing starts after %.0f s)" % (
                self.budget_s, self.budget_s + HARD_MARGIN_S)
        self.launches += 1
        log = os.path.join(self.logdir, "%03d_%s.txt" % (self.launches, re.sub(r"[^A-Za-z0-9_.-]", "_", tag)))
        line = shown(cmd, extra)
        print("  [%4.0f s] %s" % (self.elapsed(), line), flush=True)
        t = time.perf_counter()
        try:
            p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=clean_env(extra), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True, errors="replace",
                                 start_new_session=True)
        except OSError as e:
            return None, 0.0, "cannot start %s: %s" % (cmd[0], e)
        try:
            out, _ = p.communicate(timeout=LAUNCH_TIMEOUT_S)
            why = ""
            if p.returncode != 0:
                err = re.search(r"(DDP_ERR_\w+: [^\n]*|\w*Error: [^\n]*)", out or "")
                why = "exit status %d%s (log: %s)" % (p.returncode, ": " + err.group(1)[:160] if err else "",
                                                      disp(log))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)      # the launcher and every rank it started
            out, _ = p.communicate()
            why = "stopped after %.0f s (BENCH_LAUNCH_TIMEOUT_S; log: %s)" % (LAUNCH_TIMEOUT_S, disp(log))
        secs = time.perf_counter() - t
        with open(log, "w") as f:
            f.write("# %s\n# exit %s, %.2f s\n%s" % (line, p.returncode, secs, out))
        if why:
            print("    failed: " + why, flush=True)
            tail = "\n".join(out.strip().splitlines()[-4:])
            if tail:
                print("    " + tail.replace("\n", "\n    "), flush=True)
        return out, secs, why

    def step_ms(self, key, field="step_ms"):
        """A large-model cell: the median over launches of one field of their result lines."""
        return med([fnum(r, field) for r in self.step.get(key, [])])

    def ar_time(self, impl, n, s):
        return med(self.ar.get((impl, n, s), []))

    def ar_busbw(self, impl, n, s):
        t = self.ar_time(impl, n, s)
        return costmodel.busbw(s, t * 1e-6, n) if t else None


def fresh_logdir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


# ---- scheduling -------------------------------------------------------------------------------

def plan(sections, deferred):
    """The order of the rounds, as (round, section name), from [(section name, rounds)]: round 1 of
    every section, then round 2 of every section, and so on, so that a change in the machine's load
    hits every section alike; the later rounds of the `deferred` sections come after all the others."""
    order = [(rnd, name) for rnd in range(1, max(r for _, r in sections) + 1) for name, rounds in sections
             if rnd <= rounds and (rnd == 1 or name not in deferred)]
    return order + [(rnd, name) for name, rounds in sections if name in deferred for rnd in range(2, rounds + 1)]


def round_fits(first_round_s, elapsed_s, budget_s):
    """A later round starts only when its round 1's duration, with 15% to spare, fits the budget left."""
    return elapsed_s + 1.15 * first_round_s <= budget_s


def run_rounds(run, sections, deferred):
    """Every round of `sections` ([(name, function of the round number, rounds)]) in plan's order."""
    fn = {name: f for name, f, _ in sections}
    rounds = {name: r for name, _, r in sections}
    for rnd, name in plan([(name, r) for name, _, r in sections], deferred):
        if rnd > 1 and not round_fits(run.took[name], run.elapsed(), run.budget_s):
            run.note("%s: round %d of %d skipped: its round 1 took %.0f s and %.0f s of the %.0f s budget "
                     "(BENCH_BUDGET_S) were left" % (name, rnd, rounds[name], run.took[name],
                                                     max(0.0, run.budget_s - run.elapsed()), run.budget_s))
            continue
        print("== %s, round %d of %d" % (name, rnd, rounds[name]), flush=True)
        t = time.time()
        fn[name](rnd)
        run.took.setdefault(name, time.time() - t)
        run.done[name] = rnd


# ---- what is installed -----------------------------------------------------------------------

class Installed:
    """The programs and peers this machine has (probe fills it in): paths, versions, and for a
    peer that cannot run, why (an empty string when it can)."""


def find_jemalloc():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
        p = os.path.join(d, "libjemalloc.so.2")
        if os.path.exists(p):
            return p
    return None


def torch_env(inst, threads):
    e = {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if inst.jemalloc:
        # never give memory back to the kernel: PyTorch's fastest setting on this machine
        e.update(LD_PRELOAD=inst.jemalloc, MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")
    return e


def probe(build):
    inst = Installed()
    b = lambda *p: os.path.join(build, *p)
    inst.ddprun, inst.arperf = b("ddprun"), b("allreduce_perf")
    inst.large = b("examples", "ch08_large_mlp")
    inst.ex1, inst.ex2 = b("examples", "ch01_single_gpu"), b("examples", "ch03_multi_gpu")
    inst.gpt = b("examples", "ch12_gpt")
    missing = [p for p in (inst.ddprun, inst.arperf, inst.large, inst.ex1, inst.ex2, inst.gpt)
               if not os.access(p, os.X_OK)]
    if missing:
        sys.exit("bench/run.py: not built: %s (run `make BUILD=%s bench`, which builds them)" % (" ".join(missing), build))
    inst.cores = os.cpu_count() or 1
    inst.cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            inst.cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    # Open MPI: build the timer with mpicc when needed
    os.makedirs(os.path.join(build, "bench"), exist_ok=True)
    inst.mpi_why, inst.mpi_bin, inst.mpi_version = "", b("bench", "mpi_allreduce"), ""
    if not shutil.which("mpicc"):
        inst.mpi_why = "mpicc not found (apt-get install openmpi-bin libopenmpi-dev)"
    elif not shutil.which("mpirun"):
        inst.mpi_why = "mpirun not found (apt-get install openmpi-bin)"
    else:
        src = os.path.join(ROOT, "bench", "mpi_allreduce.c")
        if not os.path.exists(inst.mpi_bin) or os.path.getmtime(inst.mpi_bin) < os.path.getmtime(src):
            print("  mpicc -O2 bench/mpi_allreduce.c -o %s" % disp(inst.mpi_bin), flush=True)
            rc, out = quiet(["mpicc", "-O2", src, "-o", inst.mpi_bin], timeout=120)
            if rc != 0:
                inst.mpi_why = ("mpicc failed on bench/mpi_allreduce.c: " + out.strip().splitlines()[-1:][0]
                                if out.strip() else "mpicc failed")
        rc, out = quiet(["mpirun", "--version"])
        inst.mpi_version = out.strip().splitlines()[0] if rc == 0 and out.strip() else "?"
    # PyTorch
    inst.torch_why, inst.torch_version = "", ""
    if not os.access(PY, os.X_OK):
        inst.torch_why = "%s not found (BENCH_PY)" % PY
    else:
        rc, out = quiet([PY, "-c", "import torch, torch.distributed as d; print(torch.__version__, d.is_gloo_available())"])
        if rc != 0:
            inst.torch_why = "%s has no torch (apt-get install python3-torch)" % PY
        elif not out.strip().endswith("True"):
            inst.torch_why = "%s's torch has no gloo backend" % PY
        else:
            inst.torch_version = out.split()[0]
    inst.jemalloc = find_jemalloc()
    inst.torch_blas = ""
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
        p = os.path.join(d, "libblas.so.3")
        if os.path.exists(p):
            inst.torch_blas = os.path.realpath(p)
            break
    return inst


def transport_lines(inst):
    """Which transport ddp.h says it uses with each DDP_TRANSPORT setting (DDP_DEBUG=INFO)."""
    res = {}
    for t in ("shm", "tcp", None):
        extra = {"DDP_DEBUG": "INFO"}
        if t:
            extra["DDP_TRANSPORT"] = t
        rc, out = quiet([inst.ddprun, "--standalone", "--nproc-per-node", "2", inst.arperf, "-b", "4K", "-e", "4K",
                         "-n", "1", "-w", "0", "-c", "0"], extra, timeout=60)
        m = [re.sub(r"^.*?transport: ", "", l).strip() for l in out.splitlines() if "transport:" in l]
        if rc != 0:
            res[t] = "the probe failed (exit %d): %s" % (rc, (out.strip().splitlines() or ["?"])[-1][:150])
        else:
            res[t] = m[0] if m else "not reported (this ddp.h ignores DDP_TRANSPORT: TCP ring)"
    return res


# ---- 1. all-reduce ----------------------------------------------------------------------------

def size_label(s):
    return "%d KiB" % (s >> 10) if s < MiB else "%d MiB" % (s >> 20)


def group_sizes(grp):
    _, lo, hi, f, _, _ = grp
    def b(s):
        return int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]]
    out, x = [], b(lo)
    while x <= b(hi):
        out.append(x)
        x *= f
    return out


def group_name(grp):
    z = group_sizes(grp)
    return "%s-%s" % (size_label(z[0]), size_label(z[-1])) if len(z) > 1 else size_label(z[0])


def ar_cmd(inst, impl, n, grp):
    _, lo, hi, f, iters, warm = grp
    flags = ["-b", lo, "-e", hi, "-f", str(f), "-n", str(iters), "-w", str(warm)]
    if impl.startswith("ddp"):
        return ([inst.ddprun, "--standalone", "--nproc-per-node", str(n), inst.arperf] + flags,
                {"DDP_TRANSPORT": impl[4:]})
    if impl.startswith("mpi"):
        btl = ["--mca", "btl", "tcp,self"] if impl == "mpi_tcp" else []
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + btl + [inst.mpi_bin] + flags, {}
    return [PY, os.path.join(ROOT, "bench", "gloo_allreduce.py"), "--nproc", str(n)] + flags, {}


def ar_unavailable(inst, impl):
    if impl.startswith("mpi"):
        return inst.mpi_why
    if impl == "gloo":
        return inst.torch_why
    return ""


def ar_rows(out):
    """Rank 0's table rows of an all-reduce timer's output: size -> the row's match."""
    got = {}
    for line in (out or "").splitlines():
        if line.startswith("[rank ") and not line.startswith("[rank 0]: "):
            continue
        m = AR_ROW.match(re.sub(r"^\[rank 0\]: ", "", line))
        if m:
            got[int(m.group(1))] = m
    return got


def ar_round(run, rnd, grp):
    """One round of the all-reduce for one group of sizes: every world size, every timer."""
    sizes = group_sizes(grp)
    for n in RANKS:
        for impl in AR_IMPLS:
            why = ar_unavailable(run.installed, impl)
            if why:
                for s in sizes:
                    run.skipped((impl, n, s), why)
                continue
            cmd, extra = ar_cmd(run.installed, impl, n, grp)
            out, _, why = run.launch("ar_%s_n%d_%s_r%d" % (impl, n, grp[0], rnd), cmd, extra)
            got = ar_rows(out)
            for s in sizes:
                if s in got:
                    m = got[s]
                    run.ar.setdefault((impl, n, s), []).append(float(m.group(5)))
                    if m.group(8).isdigit() and int(m.group(8)) > 0:
                        run.ar_wrong[(impl, n, s)] = run.ar_wrong.get((impl, n, s), 0) + int(m.group(8))
                else:
                    run.skipped((impl, n, s), why or "no row for this size in the output")


def ar_launches(run, s):
    """Rounds done for the group holding size s (the launches behind its cells)."""
    for g in AR_GROUPS:
        if s in group_sizes(g):
            return run.done.get("all-reduce %s" % group_name(g), 0)
    return 0


def ar_fits(run):
    """The cost model fitted to each timer's 2-rank times: impl -> (a in s, B in bytes/s)."""
    fits = {}
    for impl in AR_IMPLS:
        f = costmodel.fit_alpha_beta(2, [(s, run.ar_time(impl, 2, s) * 1e-6) for s in AR_SIZES
                                         if run.ar_time(impl, 2, s)])
        if f:
            fits[impl] = f
    return fits


# ---- 2, 3, 4. the large model -------------------------------------------------------------------

def large_setups(inst):
    """(key, label, command, environment); ddp.h and PyTorch alternate so that they share load."""
    common = ["--steps", str(STEPS), "--warmup", str(WARMUP)]
    one = {"OPENBLAS_NUM_THREADS": "1"}
    tp = [PY, os.path.join(ROOT, "bench", "pytorch_ddp_large.py")]
    s = [("c1", "ddp.h, 1 process, 1 thread", [inst.large, "--nproc", "1"] + common, one),
         ("p1", "PyTorch, 1 process, 1 thread", tp + ["--nproc", "1"] + common, torch_env(inst, 1)),
         ("c2", "ddp.h DDP, 2 ranks, default buckets", [inst.large, "--nproc", "2"] + common, one),
         ("p2", "PyTorch DDP, 2 ranks, default buckets", tp + ["--nproc", "2"] + common, torch_env(inst, 1)),
         ("c2one", "ddp.h DDP, 2 ranks, one bucket", [inst.large, "--nproc", "2", "--one-bucket"] + common, one),
         ("p2one", "PyTorch DDP, 2 ranks, one bucket", tp + ["--nproc", "2", "--one-bucket"] + common,
          torch_env(inst, 1)),
         ("c1t2", "ddp.h, 1 process, 2 threads", [inst.large, "--nproc", "1"] + common, {"OPENBLAS_NUM_THREADS": "2"}),
         ("p1t2", "PyTorch, 1 process, 2 threads", tp + ["--nproc", "1", "--threads", "2"] + common,
          torch_env(inst, 2)),
         ("c2view", "ddp.h DDP, 2 ranks, default buckets, bucket view", [inst.large, "--nproc", "2", "--view"] + common,
          one),
         ("p2view", "PyTorch DDP, 2 ranks, default buckets, bucket view", tp + ["--nproc", "2", "--view"] + common,
          torch_env(inst, 1)),
         ("c2tcp", "ddp.h DDP, 2 ranks, default buckets, DDP_TRANSPORT=tcp", [inst.large, "--nproc", "2"] + common,
          dict(one, DDP_TRANSPORT="tcp")),
         # overlap on a slow network: 96 MiB at SLOW_NS ns per byte is about 200 ms of "network" a step
         ("c2slow", "ddp.h DDP, 2 ranks, default buckets, slow network", [inst.large, "--nproc", "2"] + common,
          dict(one, DDP_SIMULATE_NS_PER_BYTE=SLOW_NS)),
         ("c2oneslow", "ddp.h DDP, 2 ranks, one bucket, slow network", [inst.large, "--nproc", "2", "--one-bucket"]
          + common, dict(one, DDP_SIMULATE_NS_PER_BYTE=SLOW_NS))]
    for key, _, opts, _ in SWEEP_CAPS:
        if key not in ("c2", "c2one"):
            s.append((key, "ddp.h DDP, 2 ranks, --bucket-cap-mb " + opts[1], [inst.large, "--nproc", "2"] + opts + common,
                      one))
    return s


def large_round(run, rnd):
    for key, label, cmd, extra in large_setups(run.installed):
        if SMOKE and key not in SMOKE_LARGE:
            run.skipped(key, "BENCH_SMOKE=1 runs each program once: %s" % " ".join(SMOKE_LARGE))
            continue
        if key.startswith("p") and run.installed.torch_why:
            run.skipped(key, run.installed.torch_why)
            continue
        out, _, why = run.launch("large_%s_r%d" % (key, rnd), cmd, extra)
        res = result_fields(out)
        if not res:
            run.skipped(key, why or "no result line in the output")
            continue
        run.step.setdefault(key, []).append(res)
        m = re.search(r"^(?:\[rank 0\]: )?buckets: (.*)$", out, re.M)
        if m:
            run.buckets[key] = re.sub(r" \((reduced in this order|after the rebuild)\)", "", m.group(1))
        if key == "c1" and re.search(r"OpenBLAS with \d+ threads?", out):
            run.ddp_blas = "OpenBLAS"
        elif key == "c1" and run.ddp_blas == "?":
            run.ddp_blas = "not OpenBLAS (the example does not report OpenBLAS: built-in loop or another CBLAS)"


# ---- 5. wine ----------------------------------------------------------------------------------

def wine_steps(out, nproc):
    """Steps per epoch from the example's first line: '... : 142 training and 36 test samples, batch 32'."""
    m = re.search(r"(\d+) training and \d+ test samples, batch (\d+)", out or "")
    if not m:
        return None
    n, b = int(m.group(1)), int(m.group(2))
    per_rank = -(-n // nproc)          # the sampler pads the order to a multiple of the ranks
    return -(-per_rank // b)           # the loader keeps the last, shorter batch


def wine_pair(run, tag, cmd, lo, hi, nproc, extra):
    """A ddp.h wine launch: the same command with lo and then hi epochs (`tag` % epochs names the
    logs). Returns (ms per training-loop step, steps per epoch) or (None, why)."""
    _, t1, w1 = run.launch(tag % lo, cmd + ["--epochs", str(lo)], extra)
    o2, t2, w2 = run.launch(tag % hi, cmd + ["--epochs", str(hi)], extra)
    spe = wine_steps(o2, nproc)
    if w1 or w2 or not spe:
        return None, w1 or w2 or "no 'training ... samples, batch' line in the output"
    return (t2 - t1) * 1e3 / ((hi - lo) * spe), spe


def wine_torch(run, tag, cmd, extra):
    """A PyTorch wine launch: (its result fields, "") or (None, why)."""
    out, _, why = run.launch(tag, cmd, extra)
    r = result_fields(out)
    if r and fnum(r, "step_ms"):
        return r, ""
    return None, why or "no result line in the output"


def wine_round(run, rnd):
    inst = run.installed
    one = {"OPENBLAS_NUM_THREADS": "1"}
    setups = [("c1", 1, [inst.ex1, "--device", "cpu", "--save-every", "0"]),
              ("p1", 1, None),
              ("c2", 2, [inst.ex2, "--device", "cpu", "--nproc", "2", "--save-every", "0"]),
              ("p2", 2, None)]
    for key, nproc, cmd in setups:
        if cmd is None:
            if inst.torch_why:
                run.skipped("wine_" + key, inst.torch_why)
                continue
            r, why = wine_torch(run, "wine_%s_r%d" % (key, rnd),
                                [PY, os.path.join(ROOT, "bench", "pytorch_wine.py"), "--nproc", str(nproc),
                                 "--epochs", str(WINE_TORCH_EPOCHS[key])], torch_env(inst, 1))
            if r:
                run.wine.setdefault(key, []).append(fnum(r, "step_ms"))
                run.wine.setdefault(key + "_median", []).append(fnum(r, "median_step_ms"))
            else:
                run.skipped("wine_" + key, why)
            continue
        lo, hi = WINE_EPOCHS[key]
        ms, spe = wine_pair(run, "wine_%s_e%%d_r%d" % (key, rnd), cmd, lo, hi, nproc, one)
        if ms is None:
            run.skipped("wine_" + key, spe)
            continue
        run.wine.setdefault(key, []).append(ms)
        run.wine.setdefault(key + "_spe", [spe])


GPT_STEPS = 2 if SMOKE else 6 if QUICK else 20   # timed steps per GPT launch (after 4 untimed ones)


def gpt_c_ms(out):
    """ch12_gpt's step time: the median of its progress lines' 'N ms/step' (each the mean of 2 steps,
    --log-every 2) after the first two lines (4 steps: the first allocations and the first buckets)."""
    ms = [float(m) for m in re.findall(r" ([0-9.]+) ms/step", out or "")][2:]
    return med(ms)


def gpt_round(run, rnd):
    inst = run.installed
    one = {"OPENBLAS_NUM_THREADS": "1"}
    c = ["--steps", str(GPT_STEPS + 4), "--log-every", "2", "--warmup", "1", "--batch-size", "12",
         "--eval-batches", "0", "--sample", "0"]
    py = [PY, os.path.join(ROOT, "bench", "gpt_torch.py"), "step", "--threads", "1", "--batch-size", "12",
          "--steps", str(GPT_STEPS + 2)]
    setups = [("c1", [inst.gpt] + c, one), ("p1", py + ["--world", "1"], None),
              ("c2", [inst.gpt, "--nproc", "2"] + c, one), ("p2", py + ["--world", "2"], None)]
    for key, cmd, extra in setups:
        if extra is None and inst.torch_why:
            run.skipped("gpt_" + key, inst.torch_why)
            continue
        out, _, why = run.launch("gpt_%s_r%d" % (key, rnd), cmd, extra if extra is not None else torch_env(inst, 1))
        ms = gpt_c_ms(out) if extra is not None else fnum(result_fields(out) or {}, "step_ms")
        if ms is None:
            run.skipped("gpt_" + key, why or "no step time in the output")
            continue
        run.gpt.setdefault(key, []).append(ms)


# ---- the report -------------------------------------------------------------------------------

class Report:
    """The final table's lines (also written to table.txt), the CSV's rows and the targets' verdicts."""

    def __init__(self):
        self.lines, self.csv_rows, self.targets = [], [], []   # targets: (text, value, verdict)

    def p(self, line=""):
        self.lines.append(line)

    def csv_row(self, section, setup, ranks, size, metric, value, unit, values):
        self.csv_rows.append([section, setup, ranks, size, metric, "" if value is None else "%.6g" % value, unit,
                              len(values), ";".join("%.6g" % v for v in values if v is not None)])

    def target(self, text, value, limit, higher_is_better):
        if value is None:
            self.targets.append((text, "-", "n/a"))
            return
        ok = value >= limit if higher_is_better else value <= limit
        self.targets.append((text, "%.2fx" % value, "met" if ok else "MISSED"))

    def list_targets(self, heading):
        self.p(heading)
        for text, val, verdict in self.targets:
            self.p("  %-7s %-78s %s" % (verdict, text, val))

    def write(self, csv_path, table_path, targets_in_csv):
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_HEADER)
            w.writerows(self.csv_rows)
            if targets_in_csv:
                for text, val, verdict in self.targets:
                    w.writerow(["target", text, "", "", "ratio", val.rstrip("x"), "", "", verdict])
        with open(table_path, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        print("\n".join(self.lines), flush=True)


def fmt(v, nd=2, width=9):
    if v is None:
        return "%*s" % (width, "-")
    if abs(v) >= 1000:
        s = "%.0f" % v
    elif abs(v) >= 100:
        s = "%.1f" % v if nd > 0 else "%.0f" % v
    else:
        s = "%.*f" % (nd, v)
    return "%*s" % (width, s)


def ratio(a, b):
    return a / b if a is not None and b else None


def size_label_any(b):
    if b >= MiB:
        return "%.1f MiB" % (b / MiB)
    if b >= 1024:
        return "%.0f KiB" % (b / 1024)
    return "%.0f B" % b


def skip_suffix(run, key, value):
    if value is not None:
        return ""
    return "   skipped: " + run.skip.get(key, "no launch finished")


def report_allreduce(run, rep):
    p = rep.p
    p("1. ALL-REDUCE, f32 sum, in place: busbw GB/s (GB = 1e9 B); cell = median of its launches (%s), launch = "
      "median of iterations" % ", ".join("%s: %d" % (group_name(g), ar_launches(run, group_sizes(g)[0]))
                                         for g in AR_GROUPS))
    p("   ratios > 1: ddp.h faster. The 4 KiB rows below the table: time in us, ratios < 1: ddp.h faster.")
    ratio_heads = "%12s%12s%11s" % ("shm/MPIshm", "tcp/MPItcp", "best/gloo")
    p("%-5s %-8s" % ("ranks", "size") + "".join("%10s" % AR_LABEL[i] for i in AR_IMPLS) + ratio_heads)
    for n in RANKS:
        for s in AR_SIZES:
            bws = {i: run.ar_busbw(i, n, s) for i in AR_IMPLS}
            best = max([v for v in (bws["ddp_shm"], bws["ddp_tcp"]) if v is not None], default=None)
            cells = ""
            for i in AR_IMPLS:
                c = fmt(bws[i], 3 if (bws[i] or 1) < 0.1 else 2, 9)
                if (i, n, s) in run.ar_wrong:
                    c = c[:-1] + "!"
                cells += " " + c
            p("%-5d %-8s" % (n, size_label(s)) + cells + "%12s%12s%11s" % (
                fmt(ratio(bws["ddp_shm"], bws["mpi_shm"]), 2, 8), fmt(ratio(bws["ddp_tcp"], bws["mpi_tcp"]), 2, 8),
                fmt(ratio(best, bws["gloo"]), 1, 8)))
            for i in AR_IMPLS:
                vals = run.ar.get((i, n, s), [])
                rep.csv_row("allreduce", AR_LABEL[i], n, s, "busbw", bws[i], "GB/s",
                            [costmodel.busbw(s, t * 1e-6, n) for t in vals])
                rep.csv_row("allreduce", AR_LABEL[i], n, s, "time", run.ar_time(i, n, s), "us", vals)
    p()
    p("%-5s %-8s" % ("ranks", "4 KiB") + "".join("%10s" % AR_LABEL[i] for i in AR_IMPLS) + ratio_heads)
    for n in RANKS:
        t = {i: run.ar_time(i, n, 4 << 10) for i in AR_IMPLS}
        best = min([v for v in (t["ddp_shm"], t["ddp_tcp"]) if v is not None], default=None)
        p("%-5d %-8s" % (n, "time us") + "".join(" " + fmt(t[i], 1, 9) for i in AR_IMPLS) + "%12s%12s%11s" % (
            fmt(ratio(t["ddp_shm"], t["mpi_shm"]), 2, 8), fmt(ratio(t["ddp_tcp"], t["mpi_tcp"]), 2, 8),
            fmt(ratio(best, t["gloo"]), 3, 8)))
    if run.ar_wrong:
        p("   '!' = wrong elements in the check: " + ", ".join(
            "%s %d ranks %s: %d" % (AR_LABEL[k[0]], k[1], size_label(k[2]), v) for k, v in sorted(run.ar_wrong.items())))
    skipped = {}
    for key, why in sorted(run.skip.items(), key=lambda kv: str(kv[0])):
        if isinstance(key, tuple) and not run.ar.get(key):
            skipped.setdefault((AR_LABEL[key[0]], why), []).append("%d ranks %s" % (key[1], size_label(key[2])))
    if SMOKE:
        p("   1 MiB and up: skipped: BENCH_SMOKE=1 measures 4 and 64 KiB")
    elif QUICK:
        p("   64 MiB, 256 MiB: skipped: BENCH_QUICK=1 measures up to 16 MiB")
    for (label, why), where in sorted(skipped.items()):
        p("   %s: skipped (%s): %s" % (label, ", ".join(where) if len(where) < len(RANKS) * len(AR_SIZES) else "all",
                                       why))
    # targets (2 ranks, the peers' figures of the issue)
    n = 2
    bw = lambda i, s: run.ar_busbw(i, n, s)
    rep.target("shm busbw 256 MiB >= 2.0x MPI shm (2 ranks)",
               ratio(bw("ddp_shm", 256 * MiB), bw("mpi_shm", 256 * MiB)), 2.0, True)
    r = [ratio(bw("ddp_shm", s), bw("mpi_shm", s)) for s in (MiB, 16 * MiB)]
    rep.target("shm busbw 1 and 16 MiB >= 1.15x MPI shm (2 ranks; the smaller)", min(r) if None not in r else None,
               1.15, True)
    rep.target("tcp busbw 256 MiB >= 1.4x MPI tcp (2 ranks)",
               ratio(bw("ddp_tcp", 256 * MiB), bw("mpi_tcp", 256 * MiB)), 1.4, True)
    rep.target("shm 4 KiB time <= 1.2x MPI shm (2 ranks)",
               ratio(run.ar_time("ddp_shm", n, 4096), run.ar_time("mpi_shm", n, 4096)), 1.2, False)
    rep.target("tcp 4 KiB time <= 1.1x MPI tcp (2 ranks)",
               ratio(run.ar_time("ddp_tcp", n, 4096), run.ar_time("mpi_tcp", n, 4096)), 1.1, False)
    # the small-message targets on more ranks than cores (4 and 8 ranks, whichever BENCH_RANKS measures)
    for m in [k for k in RANKS if k > 2]:
        for tr in ("shm", "tcp"):
            rep.target("%s 4 KiB time <= 1.0x MPI %s (%d ranks)" % (tr, tr, m),
                       ratio(run.ar_time("ddp_" + tr, m, 4096), run.ar_time("mpi_" + tr, m, 4096)), 1.0, False)
    r = []
    for s in (MiB, 16 * MiB, 64 * MiB, 256 * MiB):
        best = max([v for v in (bw("ddp_shm", s), bw("ddp_tcp", s)) if v is not None], default=None)
        r.append(ratio(best, bw("gloo", s)))
    r = [v for v in r if v is not None]
    rep.target("busbw >= 3x gloo at 1 MiB and above (2 ranks; the smallest ratio of %d sizes)" % len(r),
               min(r) if r else None, 3.0, True)


def added_over(run, key, base):
    """A DDP step minus the same library's one-process step, or None."""
    s, b = run.step_ms(key), run.step_ms(base)
    return s - b if s is not None and b is not None else None


def report_large(run, rep):
    p, step = rep.p, run.step_ms
    p("2. DDP TRAINING STEP, MLP 1024-4096-4096-1024-10 (25.2M parameters, 96 MiB of gradients), SGD, batch 64 per "
      "rank, 1 BLAS thread per rank")
    p("   cell = median of %d launch(es), launch = median of %d steps after %d warm-up; exposed = backward's wait "
      "for buckets / step; eff = 1-process step / DDP step; added = DDP step - 1-process step"
      % (run.done.get("large model", 0), STEPS, WARMUP))
    p("%-56s %9s %8s %6s %9s %8s" % ("setup", "ms/step", "exposed", "eff", "added ms", "added/PT"))
    rows = [("c1", None, None), ("c2", "c1", "p2"), ("c2one", "c1", "p2one"), ("c2view", "c1", "p2view"),
            ("c2tcp", "c1", "p2"), ("c2slow", "c1", None), ("c2oneslow", "c1", None), ("p1", None, None),
            ("p2", "p1", None), ("p2one", "p1", None), ("p2view", "p1", None)]
    labels = {k: l for k, l, _, _ in large_setups(run.installed)}
    for key, base, twin in rows:
        s = step(key)
        e = step(key, "exposed") if key.startswith("c") and base else None
        eff = ratio(step(base), s) if base else None
        add = added_over(run, key, base) if base else None
        rel = None
        if twin and add is not None:
            tadd = added_over(run, twin, "p1")
            rel = ratio(add, tadd) if tadd and tadd > 0 else None
        p("%-56s %9s %8s %6s %9s %8s" % (labels[key], fmt(s, 1, 9), fmt(e, 2, 8), fmt(eff, 2, 6),
                                           fmt(add, 1, 9), fmt(rel, 2, 8)) + skip_suffix(run, key, s))
        rep.csv_row("large_step", labels[key], 1 if key in ("c1", "p1") else 2, "", "step", s, "ms",
                    [fnum(r, "step_ms") for r in run.step.get(key, [])])
        if e is not None:
            rep.csv_row("large_step", labels[key], 2, "", "exposed_fraction", e, "",
                        [fnum(r, "exposed") for r in run.step[key]])
        if eff is not None:
            rep.csv_row("large_step", labels[key], 2, "", "weak_scaling_efficiency", eff, "", [])
        if add is not None:
            rep.csv_row("large_step", labels[key], 2, "", "added_over_one_process", add, "ms", [])
        if rel is not None:
            rep.csv_row("large_step", labels[key], 2, "", "added_ratio_to_pytorch", rel, "", [])
    if "c2" in run.buckets or "p2" in run.buckets:
        p("   buckets: ddp.h default: %s; PyTorch default: %s" % (run.buckets.get("c2", "?"),
                                                                   run.buckets.get("p2", "?")))
    p("   PyTorch's exposed time is not observable from outside its reducer. The DDP_TRANSPORT=tcp row's added/PT "
      "compares with PyTorch's default row; bucket view = gradient_as_bucket_view on both sides.")
    ov = ratio(step("c2slow"), step("c2oneslow"))
    p("   overlap: on a slow network (DDP_SIMULATE_NS_PER_BYTE=%s, about %.0f ms of network a step) a step with the "
      "default buckets takes %s of a step with one bucket, which can only start after backward (test_ddp's "
      "overlap_by_order proves the overlap by order; this is its size)"
      % (SLOW_NS, 96 * MiB * float(SLOW_NS) / 1e6, fmt(ov, 2, 4).strip() + "x" if ov is not None else "-"))
    rep.csv_row("large_step", "overlap: default buckets / one bucket, slow network", 2, "", "step_ratio", ov, "", [])
    rep.target("large model, slow network: default buckets' step <= 0.95x one bucket's (overlap)", ov, 0.95, False)
    for key, twin, name, goal in (("c2", "p2", "default buckets", 0.5), ("c2one", "p2one", "one bucket", 0.5),
                                  ("c2view", "p2view", "gradient_as_bucket_view on both", 0.3)):
        tadd = added_over(run, twin, "p1")
        rep.target("large model: ddp.h DDP-added <= %.1fx PyTorch-added (%s)" % (goal, name),
                   ratio(added_over(run, key, "c1"), tadd) if tadd and tadd > 0 else None, goal, False)


def report_sweep(run, rep):
    p, step, fits = rep.p, run.step_ms, ar_fits(run)
    p("3. BUCKET SIZE, ddp.h DDP on 2 ranks, same model (first bucket 1 MiB; a parameter is never split, so every "
      "cap below 16 MiB gives the same 3 buckets)")
    p("%-14s %-44s %9s %11s %8s %11s" % ("cap MiB", "buckets", "ms/step", "exposed ms", "exposed", "model ms"))
    a_b = fits.get("ddp_shm") or fits.get("ddp_tcp")
    tb = step("c1", "bwd_ms")
    for key, cap, _, cap_bytes in SWEEP_CAPS:
        mod = costmodel.model_exposed(costmodel.bucket_layout(cap_bytes), tb / 1e3, *a_b) * 1e3 if a_b and tb else None
        s = step(key)
        bk = re.sub(r" \(\d+ params?\)", "", run.buckets.get(key, ""))
        bk = bk if len(bk) <= 44 else bk[:40] + " ..."
        p("%-14s %-44s %9s %11s %8s %11s" % (cap, bk, fmt(s, 1, 9), fmt(step(key, "wait_ms"), 1, 11),
                                             fmt(step(key, "exposed"), 2, 8), fmt(mod, 1, 11))
          + skip_suffix(run, key, s))
        rep.csv_row("bucket_sweep", "ddp.h cap " + cap, 2, "", "step", s, "ms",
                    [fnum(r, "step_ms") for r in run.step.get(key, [])])
        rep.csv_row("bucket_sweep", "ddp.h cap " + cap, 2, "", "exposed", step(key, "wait_ms"), "ms",
                    [fnum(r, "wait_ms") for r in run.step.get(key, [])])
        rep.csv_row("bucket_sweep", "ddp.h cap " + cap, 2, "", "model_exposed", mod, "ms", [])
    p("   cost model of a 2-rank all-reduce, T = 2a + S/B (= 2(n-1)a + 2(n-1)/n S/B at n = 2), least squares in "
      "relative error over section 1's 2-rank times:")
    for impl in AR_IMPLS:
        f = fits.get(impl)
        if f:
            p("     %-10s a = %7.2f us   B = %6.2f GB/s   (latency <= 5%% of the transfer from S = 40 a B = %s)"
              % (AR_LABEL[impl], f[0] * 1e6, f[1] / 1e9, size_label_any(40 * f[0] * f[1])))
            rep.csv_row("cost_model", AR_LABEL[impl], 2, "", "alpha", f[0] * 1e6, "us", [])
            rep.csv_row("cost_model", AR_LABEL[impl], 2, "", "bandwidth", f[1] / 1e9, "GB/s", [])
        else:
            p("     %-10s no fit (needs at least 2 sizes at 2 ranks)" % AR_LABEL[impl])
    if not (a_b and tb):
        p("   model: skipped (needs the 1-process backward time and a transport fit)")
        return
    best_t, same = costmodel.best_caps(tb / 1e3, *a_b)

    def capname(c):
        return "one bucket" if c >= costmodel.ONE_BUCKET else "0 (per parameter)" if c == 1 else size_label_any(c)
    best_b = costmodel.bucket_layout(same[0])
    p("   model's best cap (backward %.1f ms from the 1-process run, fit of %s): %s, i.e. %d bucket%s of %s; "
      "predicted exposed %.1f ms" % (
          tb, "ddp.h shm" if fits.get("ddp_shm") else "ddp.h tcp",
          capname(same[0]) if len(same) == 1 else "any cap from %s to %s" % (capname(same[0]), capname(same[-1])),
          len(best_b), "" if len(best_b) == 1 else "s", ", ".join("%.2f" % (b / MiB) for b, _ in best_b) + " MiB",
          best_t * 1e3))
    p("   rule of thumb: a bucket is bandwidth-bound once its latency is <= 5% of its transfer time, S >= 40 a B "
      "(above); smaller buckets than that waste latency, larger ones only delay the overlap.")


def report_one_process(run, rep):
    p, step = rep.p, run.step_ms
    p("4. ONE PROCESS, no DDP, same model, batch 64: ms/step (OpenBLAS on both sides)")
    p("%-10s %10s %10s %8s" % ("threads", "ddp.h", "PyTorch", "ratio"))
    for th, c, pt in ((1, "c1", "p1"), (2, "c1t2", "p1t2")):
        a, b = step(c), step(pt)
        why = "" if a is not None and b is not None else skip_suffix(run, c if a is None else pt, None)
        p("%-10d %10s %10s %8s" % (th, fmt(a, 1, 10), fmt(b, 1, 10), fmt(ratio(a, b), 2, 8)) + why)
        rep.csv_row("one_process", "ddp.h %d thread(s)" % th, 1, "", "step", a, "ms",
                    [fnum(r, "step_ms") for r in run.step.get(c, [])])
        rep.csv_row("one_process", "PyTorch %d thread(s)" % th, 1, "", "step", b, "ms",
                    [fnum(r, "step_ms") for r in run.step.get(pt, [])])
        rep.target("one process, %d thread%s: ddp.h <= 1.2x PyTorch's time" % (th, "s" if th > 1 else ""),
                   ratio(a, b), 1.2, False)


def report_wine(run, rep):
    p, wine = rep.p, run.wine
    p("5. TUTORIAL MODEL, wine 13 -> 64 -> 3, Adam 1e-3, batch 32 per rank: mean ms per training-loop step")
    p("   ddp.h: (wall time of a %d-epoch run - that of a %d-epoch run) / extra steps (1 process: %d vs %d "
      "epochs); PyTorch: its loop time / steps. Median of %d launch(es)."
      % (WINE_EPOCHS["c2"][1], WINE_EPOCHS["c2"][0], WINE_EPOCHS["c1"][1], WINE_EPOCHS["c1"][0],
         run.done.get("wine", 0)))
    p("%-32s %10s %10s" % ("setup", "ddp.h", "PyTorch"))
    c1, c2, p1, p2 = (med(wine.get(k, [])) for k in ("c1", "c2", "p1", "p2"))
    p("%-32s %10s %10s" % ("1 process x 32", fmt(c1, 4, 10), fmt(p1, 4, 10)))
    p("%-32s %10s %10s" % ("DDP 2 ranks x 32", fmt(c2, 4, 10), fmt(p2, 4, 10)))
    p("%-32s %10s %10s" % ("DDP step / 1-process step", fmt(ratio(c2, c1), 2, 10), fmt(ratio(p2, p1), 2, 10)))
    pm1, pm2 = med(wine.get("p1_median", [])), med(wine.get("p2_median", []))
    if pm1 is not None or pm2 is not None:
        p("   PyTorch's median single step: 1 process %s ms, DDP %s ms" % (fmt(pm1, 4, 0), fmt(pm2, 4, 0)))
    steps_note = []
    if wine.get("c1_spe"):
        steps_note.append("1 process %d steps/epoch" % wine["c1_spe"][0])
    if wine.get("c2_spe"):
        steps_note.append("2 ranks %d steps/epoch each (the last batch short)" % wine["c2_spe"][0])
    if steps_note:
        p("   " + "; ".join(steps_note))
    for k in ("c1", "c2", "p1", "p2"):
        if med(wine.get(k, [])) is None:
            p("   %s %s: skipped: %s" % ("ddp.h" if k[0] == "c" else "PyTorch", "1 process" if k[1] == "1" else "DDP",
                                        run.skip.get("wine_" + k, "no launch finished")))
    for k, label in (("c1", "ddp.h 1 process"), ("c2", "ddp.h DDP 2 ranks"), ("p1", "PyTorch 1 process"),
                     ("p2", "PyTorch DDP 2 ranks")):
        rep.csv_row("wine_step", label, 1 if k[1] == "1" else 2, "", "step", med(wine.get(k, [])), "ms",
                    wine.get(k, []))
    rep.target("wine: ddp.h DDP step (2 ranks x 32) <= 2x one process's", ratio(c2, c1), 2.0, False)


def report_gpt(run, rep):
    p, g = rep.p, run.gpt
    p("6. CHAPTER 12'S GPT, nanoGPT's laptop setting (4 layers, 4 heads, 128 wide, context 64, 0.8M parameters),")
    p("   batch 12 per rank, AdamW, clipping, one BLAS thread per rank: median ms per step (ddp.h: "
      "examples/ch12_gpt; PyTorch eager: bench/gpt_torch.py, the same model; DDP over gloo). %d launch(es)."
      % run.done.get("gpt", 0))
    p("%-32s %10s %10s %8s" % ("setup", "ddp.h", "PyTorch", "ratio"))
    c1, c2, p1, p2 = (med(g.get(k, [])) for k in ("c1", "c2", "p1", "p2"))
    ca = c2 - c1 if c1 is not None and c2 is not None else None
    pa = p2 - p1 if p1 is not None and p2 is not None else None
    p("%-32s %10s %10s %8s" % ("1 process", fmt(c1, 1, 10), fmt(p1, 1, 10), fmt(ratio(c1, p1), 2, 8)))
    p("%-32s %10s %10s %8s" % ("DDP 2 ranks", fmt(c2, 1, 10), fmt(p2, 1, 10), fmt(ratio(c2, p2), 2, 8)))
    p("%-32s %10s %10s %8s" % ("added by DDP (2 ranks - 1)", fmt(ca, 1, 10), fmt(pa, 1, 10), fmt(ratio(ca, pa), 2, 8)))
    for k in ("c1", "c2", "p1", "p2"):
        if med(g.get(k, [])) is None:
            p("   %s %s: skipped: %s" % ("ddp.h" if k[0] == "c" else "PyTorch", "1 process" if k[1] == "1" else "DDP",
                                        run.skip.get("gpt_" + k, "no launch finished")))
    for k, label in (("c1", "ddp.h 1 process"), ("c2", "ddp.h DDP 2 ranks"), ("p1", "PyTorch 1 process"),
                     ("p2", "PyTorch DDP 2 ranks")):
        rep.csv_row("gpt_step", label, 1 if k[1] == "1" else 2, "", "step", med(g.get(k, [])), "ms", g.get(k, []))
    rep.target("GPT, one process, 1 thread: ddp.h's step <= 1.0x PyTorch eager's", ratio(c1, p1), 1.0, False)
    rep.target("GPT, 2 ranks: the time DDP adds to a step <= 0.5x what PyTorch DDP (gloo) adds", ratio(ca, pa), 0.5,
               False)


def others_share(start, end):
    """CPU share other programs took while we measured (they make timings noisy)."""
    try:
        busy = [s[0] for s in (start, end)]
        ours = [s[1] for s in (start, end)]
        other = max(0.0, (busy[1] - busy[0]) - (ours[1] - ours[0]))
        return "%.0f%%" % (100.0 * other / max(1e-9, (end[2] - start[2]) * (os.cpu_count() or 1)))
    except TypeError:
        return "?"


def cpu_clock():
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK"), ours, time.time()
    except (OSError, ValueError):
        return None, ours, time.time()


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def report_header(run, rep, sections, tl, before, after):
    """The table's first lines: when, where, which versions, how many rounds ran."""
    inst, p = run.installed, rep.p
    p("=" * 118)
    p("make bench: ddp.h beside Open MPI, PyTorch gloo and PyTorch DDP, measured in one run (%s)"
      % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    p("machine: %s %s, %d cores%s; load average %s before, %s after; other programs took %s of the CPU meanwhile"
      % (platform.system(), platform.machine(), inst.cores, " (%s)" % inst.cpu if inst.cpu else "", before[1],
         after[1], others_share(before[0], after[0])))
    p("ddp.h transport: DDP_TRANSPORT=shm -> %s; =tcp -> %s; unset (training rows) -> %s"
      % (tl.get("shm"), tl.get("tcp"), tl.get(None)))
    p("ddp.h BLAS: %s. Open MPI: %s. PyTorch: %s" % (
        run.ddp_blas, inst.mpi_version or ("skipped: " + inst.mpi_why),
        ("%s (%s), gloo, BLAS %s, %s" % (inst.torch_version, PY, inst.torch_blas or "?",
                                         "jemalloc (never returns memory)" if inst.jemalloc else "glibc malloc"))
        if not inst.torch_why else "skipped: " + inst.torch_why))
    p("rounds done: " + ", ".join("%s %d of %d" % (n, run.done.get(n, 0), r) for n, _, r in sections) +
      "; launches interleaved round-robin; cell = median of launches, launch = median of iterations/steps")


# ---- the CPU benchmark ------------------------------------------------------------------------

def main_cpu(build):
    t0 = time.time()
    bench_dir = os.environ.get("BENCH_OUT") or os.path.join(build, "bench")
    print("make bench: %s; budget %.0f s of measuring%s" % (
        "BENCH_SMOKE=1 (each parser once)" if SMOKE else "BENCH_QUICK=1 (smoke run)" if QUICK else "full run",
        BUDGET_S, "" if QUICK else " (BENCH_QUICK=1: ~3 min)"),
        flush=True)
    inst = probe(build)   # exits when the programs are not built, before anything is written
    run = Run(os.path.join(bench_dir, "logs"), inst, BUDGET_S, t0)
    fresh_logdir(run.logdir)
    before = cpu_clock(), loadavg()
    print("== which transport ddp.h uses", flush=True)
    tl = transport_lines(inst)
    for k, v in tl.items():
        print("   DDP_TRANSPORT=%s: %s" % (k or "(unset)", v), flush=True)
    # The all-reduce's size groups are sections of their own. The big messages' later rounds come
    # after every other round: on a busy machine their round is the longest by far (Open MPI's
    # shared memory slows down most), so when the budget runs short they are what is skipped, not
    # the training rounds or the small messages'.
    ar = [("all-reduce %s" % group_name(g), (lambda r, g=g: ar_round(run, r, g)),
           AR_SMALL_ROUNDS if g[0] in ("tiny", "small") else AR_ROUNDS) for g in AR_GROUPS]
    early = 2 if len(ar) > 2 else 1  # the large messages' group goes last (above)
    sections = ar[:early] + [("large model", lambda r: large_round(run, r), STEP_ROUNDS),
                             ("wine", lambda r: wine_round(run, r), STEP_ROUNDS),
                             ("gpt", lambda r: gpt_round(run, r), STEP_ROUNDS)] + ar[early:]
    run_rounds(run, sections, deferred=set(name for name, _, _ in ar[early:]))
    after = cpu_clock(), loadavg()

    rep = Report()
    report_header(run, rep, sections, tl, before, after)
    for section in (report_allreduce, report_large, report_sweep, report_one_process, report_wine, report_gpt):
        rep.p()
        section(run, rep)
    rep.p()
    rep.list_targets("TARGETS (from the issue; ratios measured in this run)")
    if run.notes:
        rep.p()
        rep.p("NOTES")
        for n in run.notes:
            rep.p("  " + n)
    rep.p()
    rep.p("took %.0f s of measuring (%d launches); CSV: %s; logs: %s" % (
        run.elapsed(), run.launches, disp(os.path.join(bench_dir, "results.csv")), disp(run.logdir)))
    rep.write(os.path.join(bench_dir, "results.csv"), os.path.join(bench_dir, "table.txt"), targets_in_csv=True)
    if SMOKE:
        sys.exit(smoke_verdict(run))


def smoke_verdict(run):
    """BENCH_SMOKE=1's exit status: 1 when a cell it ran has no figure (a parser no longer finds what it
    looks for, or a program failed) or a check found wrong elements; the skips it expects are its own,
    a missing PyTorch or Open MPI (said as such) and the time budget."""
    inst = run.installed
    expected = ("BENCH_SMOKE=1", "time budget spent")
    bad = ["%s: %s" % (k, why) for k, why in sorted(run.skip.items(), key=lambda kv: str(kv[0]))
           if not why.startswith(expected) and why not in (inst.torch_why, inst.mpi_why)]
    bad += ["%s: %d wrong elements" % (k, v) for k, v in sorted(run.ar_wrong.items())]
    if bad:
        print("bench/run.py: BENCH_SMOKE=1: %d cell(s) without a figure:" % len(bad))
        for b in bad:
            print("   " + b)
        return 1
    print("bench/run.py: BENCH_SMOKE=1: every cell it ran has a figure (%d launches)" % run.launches)
    return 0


# ---- the GPU benchmark (make bench-gpu) ------------------------------------------------------

GPU_WINE_EPOCHS = (2, 12) if FAKEGPU else (20, 2020)   # ddp.h's short and long wine runs on the GPU
GPU_BASE = {"g1": "g1", "gnccl": "g1", "gcpu2": "g1", "t1": "t1", "tnccl": "t1"}   # overhead = step - base's


def gpu_name():
    """(the GPU's name, "") or ("", why there is none); the stand-in names itself."""
    if FAKEGPU:
        return "the GPU stand-in (tests/fakegpu): the code path only, its figures mean nothing", ""
    if not shutil.which("nvidia-smi"):
        return "", "no GPU: nvidia-smi not found"
    rc, out = quiet(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    if rc != 0 or not out.strip():
        return "", "no GPU: nvidia-smi lists none (%s)" % (out.strip().splitlines() or ["exit %d" % rc])[-1]
    return out.strip().splitlines()[0], ""


def torch_on_gpu(gpu_why):
    """(a Python whose torch sees the GPU, "") or (None, why there is none)."""
    if FAKEGPU:
        return None, "PyTorch cannot run on the GPU stand-in"
    if gpu_why:
        return None, gpu_why
    cands = [c for c in (os.environ.get("BENCH_PY"), shutil.which("python3"), "/usr/bin/python3") if c]
    tried = []
    for c in dict.fromkeys(cands):
        rc, out = quiet([c, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"], timeout=120)
        tried.append("%s: %s" % (c, out.strip().splitlines()[-1] if out.strip() else "exit %d" % rc))
        if rc == 0 and out.strip().endswith("True"):
            return c, ""
    return None, "no Python whose torch.cuda.is_available() is True (%s)" % "; ".join(tried)


def probe_gpu(build):
    """The GPU, the programs that run on it (the stand-in's under BUILD/fakegpu) and why a library's
    rows cannot run (an empty string when they can)."""
    inst = Installed()
    b = lambda *q: os.path.join(build, *q)
    progs = b("fakegpu") if FAKEGPU else build
    inst.large, inst.launched = os.path.join(progs, "examples", "ch08_large_mlp"), os.path.join(progs, "bench",
                                                                                                "large_mlp_launched")
    inst.ex1 = os.path.join(progs, "examples", "ch01_single_gpu")
    inst.gpt = os.path.join(progs, "examples", "ch12_gpt")
    inst.ddprun = b("ddprun")
    inst.stand_in = {"FAKEGPU_DEVICES": "1", "FAKEGPU_CACHE": b("fakegpu", "kernels")} if FAKEGPU else {}
    inst.gpu_name, inst.gpu_why = gpu_name()
    inst.ddp_why = inst.gpu_why or ("" if HAVE_CUDA else
                                    "ddp.h was built without CUDA (make found no CUDA toolkit: see its first line; "
                                    "BENCH_HAVE_CUDA=1 says otherwise when running this script by hand)")
    inst.py, inst.torch_why = torch_on_gpu(inst.gpu_why)
    return inst


def gpu_setups(inst):
    """(key, label, why it cannot run or "", command, environment) of the large model's GPU rows."""
    tp = [inst.py or PY, os.path.join(ROOT, "bench", "pytorch_ddp_large.py")]
    common = ["--steps", str(GPU_STEPS), "--warmup", str(GPU_WARMUP)]
    launched_why = inst.ddp_why or ("" if os.access(inst.launched, os.X_OK) else "%s not built" % inst.launched)
    return [
        ("g1", "ddp.h, 1 process, GPU", inst.ddp_why, [inst.large, "--nproc", "1", "--device", "cuda"] + common,
         dict(inst.stand_in)),
        ("t1", "PyTorch, 1 process, GPU", inst.torch_why, tp + ["--nproc", "1", "--device", "cuda"] + common, {}),
        ("gnccl", "ddp.h DDP, 1 rank, NCCL", launched_why,
         [inst.ddprun, "--standalone", "--nproc-per-node", "1", "--backend", "nccl", inst.launched, "--device", "cuda"]
         + common, dict(inst.stand_in)),
        ("tnccl", "PyTorch DDP, 1 rank, NCCL", inst.torch_why,
         tp + ["--nproc", "1", "--force-ddp", "--device", "cuda"] + common, {}),
        ("gcpu2", "ddp.h DDP, 2 ranks, CPU backend, GPU buffers", inst.ddp_why,
         [inst.large, "--nproc", "2", "--device", "cuda"] + common,
         dict(inst.stand_in, DDP_BACKEND="cpu", OPENBLAS_NUM_THREADS="1")),
    ]


def gpu_round(run, rnd):
    """One round of every GPU row: the large model's setups, then the tutorial model (wine, 13 -> 64
    -> 3, Adam, batch 32): ddp.h's example timed as the difference of two launches per step,
    PyTorch's twin by its own loop."""
    inst = run.installed
    for key, label, why, cmd, extra in gpu_setups(inst):
        if why:
            run.skipped(key, why)
            continue
        out, _, w = run.launch("gpu_%s_r%d" % (key, rnd), cmd, extra)
        res = result_fields(out)
        if res:
            run.step.setdefault(key, []).append(res)
        else:
            run.skipped(key, w or "no result line in the output")
    if inst.ddp_why:
        run.skipped("wg1", inst.ddp_why)
    else:
        lo, hi = GPU_WINE_EPOCHS
        ms, spe = wine_pair(run, "gpu_wine_e%%d_r%d" % rnd, [inst.ex1, "--device", "cuda", "--save-every", "0"],
                            lo, hi, 1, dict(inst.stand_in))
        if ms is None:
            run.skipped("wg1", spe)
        else:
            run.wine.setdefault("wg1", []).append(ms)
    if inst.torch_why:
        run.skipped("wt1", inst.torch_why)
    else:
        r, why = wine_torch(run, "gpu_wine_torch_r%d" % rnd, [inst.py, os.path.join(ROOT, "bench", "pytorch_wine.py"),
                                                               "--device", "cuda", "--epochs", "400"], {})
        if r:
            run.wine.setdefault("wt1", []).append(fnum(r, "step_ms"))
        else:
            run.skipped("wt1", why)
    gpt_gpu_round(run, rnd)


# nanoGPT's GPU setting (6 layers, 6 heads, 384 wide, context 256, batch 64: 10.7M parameters); on
# the stand-in, whose kernels run on the CPU one thread at a time, a tiny one (the code path only)
GPT_GPU = (["--layers", "2", "--heads", "2", "--width", "32", "--ctx", "32", "--batch-size", "4"] if FAKEGPU else
           ["--layers", "6", "--heads", "6", "--width", "384", "--ctx", "256", "--batch-size", "64"])


def gpt_flops_per_token(args, vocab=65):
    """Training FLOPs per token, as nanoGPT's estimate_mfu counts them: 6 per parameter (forward and
    backward's two products) plus attention's 12 L T C (scores and the weighted sum, both ways)."""
    v = dict(zip(args[0::2], args[1::2]))
    L, C, T = int(v["--layers"]), int(v["--width"]), int(v["--ctx"])
    params = vocab * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * params + 12 * L * T * C


def gpt_gpu_round(run, rnd):
    """One process on the GPU, the GPT: ch12_gpt --device cuda against PyTorch eager (bench/gpt_torch.py
    step --device cuda), the same model, batch and optimizer."""
    inst = run.installed
    c = [inst.gpt, "--device", "cuda", "--steps", str(GPT_STEPS + 4), "--log-every", "2", "--warmup", "1",
         "--eval-batches", "0", "--sample", "0"] + GPT_GPU
    py = [inst.py or PY, os.path.join(ROOT, "bench", "gpt_torch.py"), "step", "--device", "cuda",
          "--steps", str(GPT_STEPS + 2)] + GPT_GPU
    for key, cmd, why, extra in (("gptg", c, inst.ddp_why, dict(inst.stand_in)), ("gptt", py, inst.torch_why, {})):
        if why:
            run.skipped(key, why)
            continue
        out, _, w = run.launch("gpu_%s_r%d" % (key, rnd), cmd, extra)
        ms = gpt_c_ms(out) if key == "gptg" else fnum(result_fields(out) or {}, "step_ms")
        if ms is None:
            run.skipped(key, w or "no step time in the output")
        else:
            run.gpt.setdefault(key, []).append(ms)


def report_gpu(run, rep):
    inst, p, step = run.installed, rep.p, run.step_ms
    p("=" * 100)
    p("make bench-gpu: the 25M-parameter MLP (batch 64) on one GPU: %s" % (inst.gpu_name or inst.gpu_why))
    p("cell = median of %d launches, launch = median of %d steps after %d warm-up; overhead = step - the same "
      "library's 1-process GPU step" % (GPU_ROUNDS, GPU_STEPS, GPU_WARMUP))
    p("%-48s %9s %10s %9s %10s" % ("setup", "ms/step", "exposed ms", "overhead", "vs PyTorch"))
    for key, label, _, _, _ in gpu_setups(inst):
        s = step(key)
        over = added_over(run, key, GPU_BASE[key]) if key != GPU_BASE[key] else None
        vs = None
        if key == "g1":
            vs = ratio(s, step("t1"))
        elif key == "gnccl" and over is not None:
            tover = added_over(run, "tnccl", "t1")
            vs = ratio(over, tover) if tover is not None and tover > 0 else None
        wait = step(key, "wait_ms") if key.startswith("g") and key != "g1" else None
        p("%-48s %9s %10s %9s %10s" % (label, fmt(s, 2, 9), fmt(wait, 2, 10), fmt(over, 2, 9), fmt(vs, 2, 10))
          + skip_suffix(run, key, s))
        rep.csv_row("gpu", label, 2 if key == "gcpu2" else 1, "", "step", s, "ms",
                    [fnum(r, "step_ms") for r in run.step.get(key, [])])
    p("   vs PyTorch: 1-process row: ddp.h step / PyTorch step; NCCL row: ddp.h's overhead / PyTorch DDP's")
    wg, wt = med(run.wine.get("wg1", [])), med(run.wine.get("wt1", []))
    p("the tutorial's model (wine 13 -> 64 -> 3, Adam, batch 32), one process on the GPU: ms per training-loop step")
    p("%-48s %9s %10s" % ("setup", "ms/step", "vs PyTorch"))
    p("%-48s %9s %10s" % ("ddp.h, tutorial model, 1 process, GPU", fmt(wg, 3, 9), fmt(ratio(wg, wt), 2, 10))
      + skip_suffix(run, "wg1", wg))
    p("%-48s %9s %10s" % ("PyTorch, tutorial model, 1 process, GPU", fmt(wt, 3, 9), "") + skip_suffix(run, "wt1", wt))
    rep.csv_row("gpu", "wine, ddp.h, 1 process, GPU", 1, "", "step", wg, "ms", run.wine.get("wg1", []))
    rep.csv_row("gpu", "wine, PyTorch, 1 process, GPU", 1, "", "step", wt, "ms", run.wine.get("wt1", []))
    v = dict(zip(GPT_GPU[0::2], GPT_GPU[1::2]))
    tokens = int(v["--batch-size"]) * int(v["--ctx"])
    gg, gt = med(run.gpt.get("gptg", [])), med(run.gpt.get("gptt", []))
    peak = gpu_fp32_peak(inst.gpu_name or "")
    p("the GPT (chapter 12), %s layers, %s heads, %s wide, context %s, batch %s, AdamW, one process on the GPU"
      % tuple(v[k] for k in ("--layers", "--heads", "--width", "--ctx", "--batch-size")))
    p("%-48s %9s %10s %10s %7s" % ("setup", "ms/step", "vs PyTorch", "tokens/s", "MFU"))
    for key, label, ms in (("gptg", "ddp.h, GPT, 1 process, GPU", gg), ("gptt", "PyTorch eager, GPT, 1 process, GPU", gt)):
        tps = tokens / (ms / 1e3) if ms else None
        mfu = tps * gpt_flops_per_token(GPT_GPU) / peak if tps and peak else None
        p("%-48s %9s %10s %10s %7s" % (label, fmt(ms, 2, 9), fmt(ratio(gg, gt), 2, 10) if key == "gptg" else "",
                                       fmt(tps, 0, 10), "%.1f%%" % (100 * mfu) if mfu else "-") + skip_suffix(run, key, ms))
        rep.csv_row("gpu", label, 1, "", "step", ms, "ms", run.gpt.get(key, []))
    p("   MFU: model FLOPs (nanoGPT's count: 6 per parameter per token, plus attention) per second over the GPU's")
    p("   float32 peak without tensor cores (%s)" % ("%.1f TFLOPS" % (peak / 1e12) if peak else "not known for this GPU"))
    rep.target("GPU: the large model's step <= 1.1x PyTorch's", ratio(step("g1"), step("t1")), 1.1, False)
    rep.target("GPU: the GPT's step <= 1.0x PyTorch eager's", ratio(gg, gt), 1.0, False)
    rep.target("GPU: the tutorial model's step <= 0.5x PyTorch's", ratio(wg, wt), 0.5, False)
    rep.list_targets("TARGETS (ratios measured in this run%s)" % ("; meaningless on the stand-in" if FAKEGPU else ""))


def gpu_fp32_peak(name):
    """The float32 peak (FLOP/s, no tensor cores) of a few data-centre GPUs, from NVIDIA's data
    sheets (SXM parts); None for another GPU."""
    for key, tflops in (("H200", 67.0), ("H100", 67.0), ("A100", 19.5), ("L40S", 91.6), ("V100", 15.7)):
        if key in name:
            return tflops * 1e12
    return None


def main_gpu(build):
    """One GPU: the large model's step on the GPU, ddp.h against PyTorch; ddp.h's DDP over NCCL
    with one rank (the wrapper's and NCCL's cost over the bare step, beside PyTorch DDP's with
    one rank); and 2 ranks on the CPU backend with their buffers on the GPU (DDP_BACKEND=cpu, both
    ranks sharing the one GPU). Every row is skipped, with the reason, when there is no GPU."""
    t0 = time.time()
    bench_dir = os.path.join(build, "bench")
    logdir = os.path.join(bench_dir, "logs_gpu_standin" if FAKEGPU else "logs_gpu")
    fresh_logdir(logdir)
    run = Run(logdir, probe_gpu(build), None, t0)
    print("make bench-gpu: %s" % (run.installed.gpu_name or run.installed.gpu_why), flush=True)
    for rnd in range(1, GPU_ROUNDS + 1):
        gpu_round(run, rnd)
    rep = Report()
    report_gpu(run, rep)
    suffix = "_standin" if FAKEGPU else ""  # a stand-in run never overwrites a real GPU's figures
    csv_path = os.path.join(bench_dir, "results_gpu%s.csv" % suffix)
    rep.p("took %.0f s; CSV: %s" % (run.elapsed(), disp(csv_path)))
    rep.write(csv_path, os.path.join(bench_dir, "table_gpu%s.txt" % suffix), targets_in_csv=False)


if __name__ == "__main__":
    args = sys.argv[1:]
    gpu = "--gpu" in args
    args = [a for a in args if a != "--gpu"]
    if any(a.startswith("-") for a in args) or len(args) > 1:
        sys.exit(__doc__.split("\n\n")[1])
    build = args[0] if args else os.environ.get("BUILD", "build")
    build = os.path.abspath(os.path.join(ROOT, build)) if not os.path.isabs(build) else build
    (main_gpu if gpu else main_cpu)(build)
