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

METHOD. The launches of one round go round-robin over every setup of a section, so that a change
in the machine's load hits peers alike; a cell is the MEDIAN of its launches (rounds), a launch's
figure the median of its iterations or steps. Rounds: all-reduce 5 for 4 KiB-1 MiB and 3 for 16-256
MiB, training steps 5. On this kind of virtual machine the same program runs in a fast or a slow
state of the host, for seconds at a time (Open MPI's 1 MiB took 138 us in some launches and 387 us
in others; ddp.h's 256 MiB over shared memory 38 ms or 220 ms), so every cell
gets an odd number of launches and a median that one odd launch cannot move. The
sections, in the order each round runs them: all-reduce 4 KiB-1 MiB (30 iterations per size),
the large model (sections 2, 3 and 4 share its launches), wine, all-reduce 16-256 MiB (3
iterations). Round 1 of every section runs first, then round 2 of every section, and so on,
except that the later rounds of the 16-256 MiB all-reduce, the longest by far on a busy machine,
come after all the others. Before a later round starts, its section's round-1 duration (plus
15%) is compared with the time budget left, and the round is skipped (the table says so) when it
would not fit. Compare ratios measured in one run, never a figure against
another day's; on a busy machine (the header says how much CPU other programs took) Open MPI's
shared memory, which polls and yields, suffers far more than the others.

KNOBS (environment variables)
  BENCH_QUICK=1           a smoke run (~3 min): 1 round, all-reduce up to 16 MiB, 3 steps
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


QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
BUDGET_S = env_num("BENCH_BUDGET_S", 200.0 if QUICK else 720.0)
HARD_S = BUDGET_S + 90.0   # past this, not even round 1 starts another launch
AR_ROUNDS = env_num("BENCH_AR_ROUNDS", 1 if QUICK else 3, int)
AR_SMALL_ROUNDS = env_num("BENCH_AR_SMALL_ROUNDS", 1 if QUICK else 5, int)
STEP_ROUNDS = env_num("BENCH_STEP_ROUNDS", 1 if QUICK else 5, int)
STEPS = env_num("BENCH_STEPS", 3 if QUICK else 10, int)
WARMUP = env_num("BENCH_WARMUP", 1 if QUICK else 2, int)
LAUNCH_TIMEOUT_S = env_num("BENCH_LAUNCH_TIMEOUT_S", 240.0)
RANKS = [int(x) for x in os.environ.get("BENCH_RANKS", "2 4").split()]
PY = os.environ.get("BENCH_PY", "/usr/bin/python3")

# all-reduce sizes: two launches per setup and round, so that big messages get fewer iterations
AR_GROUPS = [
    # (name, -b, -e, -f, iterations, warm-up)
    ("small", "4K", "1M", 16, 30, 5),      # 4 KiB, 64 KiB, 1 MiB
    ("large", "16M", "256M", 4, 3, 1),     # 16, 64, 256 MiB
]
if QUICK:   # one launch per setup: 4 KiB, 64 KiB, 1 MiB, 16 MiB
    AR_GROUPS = [("quick", "4K", "16M", 16, 8, 2)]
AR_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
AR_IMPLS = ["ddp_shm", "ddp_tcp", "mpi_shm", "mpi_tcp", "gloo"]
AR_LABEL = {"ddp_shm": "ddp.h shm", "ddp_tcp": "ddp.h tcp", "mpi_shm": "MPI shm", "mpi_tcp": "MPI tcp",
            "gloo": "gloo"}

# wine: epochs of the short and the long run of a ddp.h launch; PyTorch's timed epochs
WINE_EPOCHS = {"c1": (10, 10000 if QUICK else 30000), "c2": (10, 1500 if QUICK else 5000)}
WINE_TORCH_EPOCHS = {"p1": 100 if QUICK else 400, "p2": 60 if QUICK else 200}

T0 = time.time()
DONE, DONE_TOOK = {}, {}   # section -> rounds done, seconds its first round took
NOTES = []        # lines printed under the table: skipped rounds, failures
SKIP = {}         # cell key -> why it has no figure
LOGDIR = None


def elapsed():
    return time.time() - T0


def note(line):
    if line not in NOTES:
        NOTES.append(line)
    print("   note: " + line, flush=True)


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


def shown(cmd, extra):
    def rel(a):
        a = str(a)
        return os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT + os.sep) else a
    return " ".join(["%s=%s" % kv for kv in sorted((extra or {}).items())] + [rel(a) for a in cmd])


LAUNCHES = [0]


def disp(path):
    """A path as printed: relative when inside the repository, else as it is."""
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def launch(tag, cmd, extra=None, timeout=None, check_budget=True):
    """Run one command from the repository root, output kept in LOGDIR/NNN_tag.txt.
    Returns (output or None, seconds, why it failed or "")."""
    if check_budget and elapsed() > HARD_S:
        return None, 0.0, "time budget spent (BENCH_BUDGET_S=%g, nothing starts after %.0f s)" % (BUDGET_S, HARD_S)
    LAUNCHES[0] += 1
    log = os.path.join(LOGDIR, "%03d_%s.txt" % (LAUNCHES[0], re.sub(r"[^A-Za-z0-9_.-]", "_", tag)))
    line = shown(cmd, extra)
    print("  [%4.0f s] %s" % (elapsed(), line), flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=clean_env(extra), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True, errors="replace",
                             start_new_session=True)
    except OSError as e:
        return None, 0.0, "cannot start %s: %s" % (cmd[0], e)
    try:
        out, _ = p.communicate(timeout=timeout or LAUNCH_TIMEOUT_S)
        why = ""
        if p.returncode != 0:
            err = re.search(r"(DDP_ERR_\w+: [^\n]*|\w*Error: [^\n]*)", out or "")
            why = "exit status %d%s (log: %s)" % (p.returncode, ": " + err.group(1)[:160] if err else "", disp(log))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)      # the launcher and every rank it started
        out, _ = p.communicate()
        why = "stopped after %.0f s (BENCH_LAUNCH_TIMEOUT_S; log: %s)" % (timeout or LAUNCH_TIMEOUT_S, disp(log))
    secs = time.perf_counter() - t
    with open(log, "w") as f:
        f.write("# %s\n# exit %s, %.2f s\n%s" % (line, p.returncode, secs, out))
    if why:
        print("    failed: " + why, flush=True)
        tail = "\n".join(out.strip().splitlines()[-4:])
        if tail:
            print("    " + tail.replace("\n", "\n    "), flush=True)
    return out, secs, why


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


# ---- what is installed -----------------------------------------------------------------------

class Env:
    pass


ENV = Env()


def find_jemalloc():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
        p = os.path.join(d, "libjemalloc.so.2")
        if os.path.exists(p):
            return p
    return None


def torch_env(threads):
    e = {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if ENV.jemalloc:
        # never give memory back to the kernel: PyTorch's fastest setting on this machine
        e.update(LD_PRELOAD=ENV.jemalloc, MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")
    return e


def probe(build):
    ENV.build = build
    b = lambda *p: os.path.join(build, *p)
    ENV.ddprun, ENV.arperf = b("ddprun"), b("allreduce_perf")
    ENV.large = b("examples", "ch08_large_mlp")
    ENV.ex1, ENV.ex2 = b("examples", "ch01_single_gpu"), b("examples", "ch03_multi_gpu")
    missing = [p for p in (ENV.ddprun, ENV.arperf, ENV.large, ENV.ex1, ENV.ex2) if not os.access(p, os.X_OK)]
    if missing:
        sys.exit("bench/run.py: not built: %s (run `make BUILD=%s bench`, which builds them)" % (" ".join(missing), build))
    ENV.cores = os.cpu_count() or 1
    ENV.cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            ENV.cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    # ddp.h's BLAS, as the large example reports it
    ENV.ddp_blas = "?"
    # Open MPI: build the timer with mpicc when needed
    os.makedirs(os.path.join(build, "bench"), exist_ok=True)
    ENV.mpi_why, ENV.mpi_bin, ENV.mpi_version = "", b("bench", "mpi_allreduce"), ""
    if not shutil.which("mpicc"):
        ENV.mpi_why = "mpicc not found (apt-get install openmpi-bin libopenmpi-dev)"
    elif not shutil.which("mpirun"):
        ENV.mpi_why = "mpirun not found (apt-get install openmpi-bin)"
    else:
        src = os.path.join(ROOT, "bench", "mpi_allreduce.c")
        if not os.path.exists(ENV.mpi_bin) or os.path.getmtime(ENV.mpi_bin) < os.path.getmtime(src):
            print("  mpicc -O2 bench/mpi_allreduce.c -o %s" % disp(ENV.mpi_bin), flush=True)
            rc, out = quiet(["mpicc", "-O2", src, "-o", ENV.mpi_bin], timeout=120)
            if rc != 0:
                ENV.mpi_why = "mpicc failed on bench/mpi_allreduce.c: " + out.strip().splitlines()[-1:][0] if out.strip() else "mpicc failed"
        rc, out = quiet(["mpirun", "--version"])
        ENV.mpi_version = out.strip().splitlines()[0] if rc == 0 and out.strip() else "?"
    # PyTorch
    ENV.torch_why, ENV.torch_version = "", ""
    if not os.access(PY, os.X_OK):
        ENV.torch_why = "%s not found (BENCH_PY)" % PY
    else:
        rc, out = quiet([PY, "-c", "import torch, torch.distributed as d; print(torch.__version__, d.is_gloo_available())"])
        if rc != 0:
            ENV.torch_why = "%s has no torch (apt-get install python3-torch)" % PY
        elif not out.strip().endswith("True"):
            ENV.torch_why = "%s's torch has no gloo backend" % PY
        else:
            ENV.torch_version = out.split()[0]
    ENV.jemalloc = find_jemalloc()
    ENV.torch_blas = ""
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
        p = os.path.join(d, "libblas.so.3")
        if os.path.exists(p):
            ENV.torch_blas = os.path.realpath(p)
            break


def transport_lines():
    """Which transport ddp.h says it uses with each DDP_TRANSPORT setting (DDP_DEBUG=INFO)."""
    res = {}
    for t in ("shm", "tcp", None):
        extra = {"DDP_DEBUG": "INFO"}
        if t:
            extra["DDP_TRANSPORT"] = t
        rc, out = quiet([ENV.ddprun, "--standalone", "--nproc-per-node", "2", ENV.arperf, "-b", "4K", "-e", "4K",
                         "-n", "1", "-w", "0", "-c", "0"], extra, timeout=60)
        m = [re.sub(r"^.*?transport: ", "", l).strip() for l in out.splitlines() if "transport:" in l]
        if rc != 0:
            res[t] = "the probe failed (exit %d): %s" % (rc, (out.strip().splitlines() or ["?"])[-1][:150])
        else:
            res[t] = m[0] if m else "not reported (this ddp.h ignores DDP_TRANSPORT: TCP ring)"
    return res


# ---- 1. all-reduce ----------------------------------------------------------------------------

AR = {}      # (impl, ranks, size) -> [time in us per launch]
AR_WRONG = {}

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(float)\s+(sum)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\S+)\s*$")


def ar_cmd(impl, n, grp):
    _, lo, hi, f, iters, warm = grp
    flags = ["-b", lo, "-e", hi, "-f", str(f), "-n", str(iters), "-w", str(warm)]
    if impl.startswith("ddp"):
        return ([ENV.ddprun, "--standalone", "--nproc-per-node", str(n), ENV.arperf] + flags,
                {"DDP_TRANSPORT": impl[4:]})
    if impl.startswith("mpi"):
        btl = ["--mca", "btl", "tcp,self"] if impl == "mpi_tcp" else []
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + btl + [ENV.mpi_bin] + flags, {}
    return [PY, os.path.join(ROOT, "bench", "gloo_allreduce.py"), "--nproc", str(n)] + flags, {}


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


def ar_launches(s):
    """Rounds done for the group holding size s (the launches behind its cells)."""
    for g in AR_GROUPS:
        if s in group_sizes(g):
            return DONE.get("all-reduce %s" % group_name(g), 0)
    return 0


def ar_unavailable(impl):
    if impl.startswith("mpi"):
        return ENV.mpi_why
    if impl == "gloo":
        return ENV.torch_why
    return ""


def ar_round(rnd, grp):
    """One round of the all-reduce for one group of sizes: every world size, every timer."""
    sizes = group_sizes(grp)
    for n in RANKS:
        for impl in AR_IMPLS:
            why = ar_unavailable(impl)
            if why:
                for s in sizes:
                    SKIP.setdefault((impl, n, s), why)
                continue
            cmd, extra = ar_cmd(impl, n, grp)
            out, _, why = launch("ar_%s_n%d_%s_r%d" % (impl, n, grp[0], rnd), cmd, extra)
            got = {}
            for line in (out or "").splitlines():
                if line.startswith("[rank ") and not line.startswith("[rank 0]: "):
                    continue
                m = ROW.match(re.sub(r"^\[rank 0\]: ", "", line))
                if m:
                    got[int(m.group(1))] = m
            for s in sizes:
                if s in got:
                    m = got[s]
                    AR.setdefault((impl, n, s), []).append(float(m.group(5)))
                    if m.group(8).isdigit() and int(m.group(8)) > 0:
                        AR_WRONG[(impl, n, s)] = AR_WRONG.get((impl, n, s), 0) + int(m.group(8))
                else:
                    SKIP.setdefault((impl, n, s), why or "no row for this size in the output")


def ar_time(impl, n, s):
    return med(AR.get((impl, n, s), []))


def ar_busbw(impl, n, s):
    t = ar_time(impl, n, s)
    return costmodel.busbw(s, t * 1e-6, n) if t else None


# ---- 2, 3, 4. the large model -------------------------------------------------------------------

STEP = {}    # setup -> [result dicts]
BUCKETS = {}  # setup -> bucket map line
# the bucket sweep: (setup, cap as printed, the example's flags, the cap in bytes for the model)
SWEEP_CAPS = [("cap0", "0", ["--bucket-cap-mb", "0"], 1), ("cap4", "4", ["--bucket-cap-mb", "4"], 4 * MiB),
              ("c2", "25 (default)", [], 25 * MiB), ("cap100", "100", ["--bucket-cap-mb", "100"], 100 * MiB),
              ("c2one", "one bucket", ["--one-bucket"], costmodel.ONE_BUCKET)]


SLOW_NS = "2"  # DDP_SIMULATE_NS_PER_BYTE of the overlap rows


def large_setups():
    """(key, label, command, environment); ddp.h and PyTorch alternate so that they share load."""
    common = ["--steps", str(STEPS), "--warmup", str(WARMUP)]
    one = {"OPENBLAS_NUM_THREADS": "1"}
    tp = [PY, os.path.join(ROOT, "bench", "pytorch_ddp_large.py")]
    s = [("c1", "ddp.h, 1 process, 1 thread", [ENV.large, "--nproc", "1"] + common, one),
         ("p1", "PyTorch, 1 process, 1 thread", tp + ["--nproc", "1"] + common, torch_env(1)),
         ("c2", "ddp.h DDP, 2 ranks, default buckets", [ENV.large, "--nproc", "2"] + common, one),
         ("p2", "PyTorch DDP, 2 ranks, default buckets", tp + ["--nproc", "2"] + common, torch_env(1)),
         ("c2one", "ddp.h DDP, 2 ranks, one bucket", [ENV.large, "--nproc", "2", "--one-bucket"] + common, one),
         ("p2one", "PyTorch DDP, 2 ranks, one bucket", tp + ["--nproc", "2", "--one-bucket"] + common, torch_env(1)),
         ("c1t2", "ddp.h, 1 process, 2 threads", [ENV.large, "--nproc", "1"] + common, {"OPENBLAS_NUM_THREADS": "2"}),
         ("p1t2", "PyTorch, 1 process, 2 threads", tp + ["--nproc", "1", "--threads", "2"] + common, torch_env(2)),
         ("c2tcp", "ddp.h DDP, 2 ranks, default buckets, DDP_TRANSPORT=tcp", [ENV.large, "--nproc", "2"] + common,
          dict(one, DDP_TRANSPORT="tcp")),
         # overlap on a slow network: 96 MiB at SLOW_NS ns per byte is about 200 ms of "network" a step
         ("c2slow", "ddp.h DDP, 2 ranks, default buckets, slow network", [ENV.large, "--nproc", "2"] + common,
          dict(one, DDP_SIMULATE_NS_PER_BYTE=SLOW_NS)),
         ("c2oneslow", "ddp.h DDP, 2 ranks, one bucket, slow network", [ENV.large, "--nproc", "2", "--one-bucket"]
          + common, dict(one, DDP_SIMULATE_NS_PER_BYTE=SLOW_NS))]
    for key, _, opts, _ in SWEEP_CAPS:
        if key not in ("c2", "c2one"):
            s.append((key, "ddp.h DDP, 2 ranks, --bucket-cap-mb " + opts[1], [ENV.large, "--nproc", "2"] + opts + common, one))
    return s


def large_round(rnd):
    for key, label, cmd, extra in large_setups():
        if key.startswith("p") and ENV.torch_why:
            SKIP.setdefault(key, ENV.torch_why)
            continue
        out, _, why = launch("large_%s_r%d" % (key, rnd), cmd, extra)
        res = result_fields(out)
        if res:
            STEP.setdefault(key, []).append(res)
            m = re.search(r"^(?:\[rank 0\]: )?buckets: (.*)$", out, re.M)
            if m:
                BUCKETS[key] = re.sub(r" \((reduced in this order|after the rebuild)\)", "", m.group(1))
            m = re.search(r"OpenBLAS with \d+ threads?", out)
            if key == "c1" and m:
                ENV.ddp_blas = "OpenBLAS"
            elif key == "c1" and ENV.ddp_blas == "?":
                ENV.ddp_blas = "not OpenBLAS (the example does not report OpenBLAS: built-in loop or another CBLAS)"
        else:
            SKIP.setdefault(key, why or "no result line in the output")


def step(key, field="step_ms"):
    return med([fnum(r, field) for r in STEP.get(key, [])])


# ---- 5. wine ----------------------------------------------------------------------------------

WINE = {}   # setup -> [ms per step, one per launch]


def wine_steps(out, nproc):
    """Steps per epoch from the example's first line: '... : 142 training and 36 test samples, batch 32'."""
    m = re.search(r"(\d+) training and \d+ test samples, batch (\d+)", out or "")
    if not m:
        return None
    n, b = int(m.group(1)), int(m.group(2))
    per_rank = -(-n // nproc)          # the sampler pads the order to a multiple of the ranks
    return -(-per_rank // b)           # the loader keeps the last, shorter batch


def wine_round(rnd):
    one = {"OPENBLAS_NUM_THREADS": "1"}
    setups = [("c1", 1, [ENV.ex1, "--device", "cpu", "--save-every", "0"]),
              ("p1", 1, None),
              ("c2", 2, [ENV.ex2, "--device", "cpu", "--nproc", "2", "--save-every", "0"]),
              ("p2", 2, None)]
    for key, nproc, cmd in setups:
        if cmd is None:
            if ENV.torch_why:
                SKIP.setdefault("wine_" + key, ENV.torch_why)
                continue
            out, _, why = launch("wine_%s_r%d" % (key, rnd), [PY, os.path.join(ROOT, "bench", "pytorch_wine.py"),
                                 "--nproc", str(nproc), "--epochs", str(WINE_TORCH_EPOCHS[key])], torch_env(1))
            r = result_fields(out)
            if r and fnum(r, "step_ms"):
                WINE.setdefault(key, []).append(fnum(r, "step_ms"))
                WINE.setdefault(key + "_median", []).append(fnum(r, "median_step_ms"))
            else:
                SKIP.setdefault("wine_" + key, why or "no result line in the output")
            continue
        lo, hi = WINE_EPOCHS[key]
        o1, t1, w1 = launch("wine_%s_e%d_r%d" % (key, lo, rnd), cmd + ["--epochs", str(lo)], one)
        o2, t2, w2 = launch("wine_%s_e%d_r%d" % (key, hi, rnd), cmd + ["--epochs", str(hi)], one)
        spe = wine_steps(o2, nproc)
        if w1 or w2 or not spe:
            SKIP.setdefault("wine_" + key, w1 or w2 or "no 'training ... samples, batch' line in the output")
            continue
        WINE.setdefault(key, []).append((t2 - t1) * 1e3 / ((hi - lo) * spe))
        WINE.setdefault(key + "_spe", [spe])


# ---- the report -------------------------------------------------------------------------------

OUT = []           # the final table's lines (also written to table.txt)
CSV_ROWS = []
TARGETS = []       # (text, value, verdict)


def p(line=""):
    OUT.append(line)


def csv_row(section, setup, ranks, size, metric, value, unit, values):
    CSV_ROWS.append([section, setup, ranks, size, metric, "" if value is None else "%.6g" % value, unit, len(values),
                     ";".join("%.6g" % v for v in values if v is not None)])


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


def target(text, value, limit, higher_is_better):
    if value is None:
        TARGETS.append((text, "-", "n/a"))
        return
    ok = value >= limit if higher_is_better else value <= limit
    TARGETS.append((text, "%.2fx" % value, "met" if ok else "MISSED"))


def size_label(s):
    return "%d KiB" % (s >> 10) if s < MiB else "%d MiB" % (s >> 20)


def report_allreduce():
    p("1. ALL-REDUCE, f32 sum, in place: busbw GB/s (GB = 1e9 B); cell = median of its launches (%s), launch = "
      "median of iterations" % ", ".join("%s: %d" % (group_name(g), ar_launches(group_sizes(g)[0])) for g in AR_GROUPS))
    p("   ratios > 1: ddp.h faster. The 4 KiB rows below the table: time in us, ratios < 1: ddp.h faster.")
    head = "%-5s %-8s" % ("ranks", "size") + "".join("%10s" % AR_LABEL[i] for i in AR_IMPLS) + \
        "%12s%12s%11s" % ("shm/MPIshm", "tcp/MPItcp", "best/gloo")
    p(head)
    for n in RANKS:
        for s in AR_SIZES:
            bws = {i: ar_busbw(i, n, s) for i in AR_IMPLS}
            best = max([v for v in (bws["ddp_shm"], bws["ddp_tcp"]) if v is not None], default=None)
            cells = ""
            for i in AR_IMPLS:
                c = fmt(bws[i], 3 if (bws[i] or 1) < 0.1 else 2, 9)
                if (i, n, s) in AR_WRONG:
                    c = c[:-1] + "!"
                cells += " " + c
            p("%-5d %-8s" % (n, size_label(s)) + cells + "%12s%12s%11s" % (
                fmt(ratio(bws["ddp_shm"], bws["mpi_shm"]), 2, 8), fmt(ratio(bws["ddp_tcp"], bws["mpi_tcp"]), 2, 8),
                fmt(ratio(best, bws["gloo"]), 1, 8)))
            for i in AR_IMPLS:
                vals = AR.get((i, n, s), [])
                csv_row("allreduce", AR_LABEL[i], n, s, "busbw", bws[i], "GB/s",
                        [costmodel.busbw(s, t * 1e-6, n) for t in vals])
                csv_row("allreduce", AR_LABEL[i], n, s, "time", ar_time(i, n, s), "us", vals)
    p()
    p("%-5s %-8s" % ("ranks", "4 KiB") + "".join("%10s" % AR_LABEL[i] for i in AR_IMPLS) +
      "%12s%12s%11s" % ("shm/MPIshm", "tcp/MPItcp", "best/gloo"))
    for n in RANKS:
        s = 4 << 10
        t = {i: ar_time(i, n, s) for i in AR_IMPLS}
        best = min([v for v in (t["ddp_shm"], t["ddp_tcp"]) if v is not None], default=None)
        p("%-5d %-8s" % (n, "time us") + "".join(" " + fmt(t[i], 1, 9) for i in AR_IMPLS) + "%12s%12s%11s" % (
            fmt(ratio(t["ddp_shm"], t["mpi_shm"]), 2, 8), fmt(ratio(t["ddp_tcp"], t["mpi_tcp"]), 2, 8),
            fmt(ratio(best, t["gloo"]), 3, 8)))
    if AR_WRONG:
        p("   '!' = wrong elements in the check: " + ", ".join("%s %d ranks %s: %d" % (AR_LABEL[k[0]], k[1],
                                                                                     size_label(k[2]), v)
                                                            for k, v in sorted(AR_WRONG.items())))
    skipped = {}
    for key, why in sorted(SKIP.items(), key=lambda kv: str(kv[0])):
        if isinstance(key, tuple) and not AR.get(key):
            skipped.setdefault((AR_LABEL[key[0]], why), []).append("%d ranks %s" % (key[1], size_label(key[2])))
    if QUICK:
        p("   64 MiB, 256 MiB: skipped: BENCH_QUICK=1 measures up to 16 MiB")
    for (label, why), where in sorted(skipped.items()):
        p("   %s: skipped (%s): %s" % (label, ", ".join(where) if len(where) < len(RANKS) * len(AR_SIZES) else "all",
                                       why))
    # targets (2 ranks, the peers' figures of the issue)
    n = 2
    bw = lambda i, s: ar_busbw(i, n, s)
    target("shm busbw 256 MiB >= 2.0x MPI shm (2 ranks)", ratio(bw("ddp_shm", 256 * MiB), bw("mpi_shm", 256 * MiB)),
           2.0, True)
    r = [ratio(bw("ddp_shm", s), bw("mpi_shm", s)) for s in (MiB, 16 * MiB)]
    target("shm busbw 1 and 16 MiB >= 1.15x MPI shm (2 ranks; the smaller)", min(r) if None not in r else None,
           1.15, True)
    target("tcp busbw 256 MiB >= 1.4x MPI tcp (2 ranks)", ratio(bw("ddp_tcp", 256 * MiB), bw("mpi_tcp", 256 * MiB)),
           1.4, True)
    target("shm 4 KiB time <= 1.2x MPI shm (2 ranks)", ratio(ar_time("ddp_shm", n, 4096), ar_time("mpi_shm", n, 4096)),
           1.2, False)
    target("tcp 4 KiB time <= 1.1x MPI tcp (2 ranks)", ratio(ar_time("ddp_tcp", n, 4096), ar_time("mpi_tcp", n, 4096)),
           1.1, False)
    r = []
    for s in (MiB, 16 * MiB, 64 * MiB, 256 * MiB):
        best = max([v for v in (bw("ddp_shm", s), bw("ddp_tcp", s)) if v is not None], default=None)
        r.append(ratio(best, bw("gloo", s)))
    r = [v for v in r if v is not None]
    target("busbw >= 3x gloo at 1 MiB and above (2 ranks; the smallest ratio of %d sizes)" % len(r),
           min(r) if r else None, 3.0, True)


def report_large():
    p("2. DDP TRAINING STEP, MLP 1024-4096-4096-1024-10 (25.2M parameters, 96 MiB of gradients), SGD, batch 64 per "
      "rank, 1 BLAS thread per rank")
    p("   cell = median of %d launch(es), launch = median of %d steps after %d warm-up; exposed = backward's wait "
      "for buckets / step; eff = 1-process step / DDP step; added = DDP step - 1-process step"
      % (DONE.get("large model", 0), STEPS, WARMUP))
    p("%-56s %9s %8s %6s %9s %8s" % ("setup", "ms/step", "exposed", "eff", "added ms", "added/PT"))
    rows = [("c1", None, None), ("c2", "c1", "p2"), ("c2one", "c1", "p2one"), ("c2tcp", "c1", "p2"),
            ("c2slow", "c1", None), ("c2oneslow", "c1", None), ("p1", None, None), ("p2", "p1", None),
            ("p2one", "p1", None)]
    labels = {k: l for k, l, _, _ in large_setups()}
    added = {}
    for key, base, twin in rows:
        s = step(key)
        e = step(key, "exposed") if key.startswith("c") and base else None
        eff = ratio(step(base), s) if base else None
        add = s - step(base) if base and s is not None and step(base) is not None else None
        added[key] = add
        rel = None
        if twin and add is not None:
            tb = step(twin)
            tadd = tb - step("p1") if tb is not None and step("p1") is not None else None
            rel = ratio(add, tadd) if tadd and tadd > 0 else None
        p("%-56s %9s %8s %6s %9s %8s" % (labels[key], fmt(s, 1, 9), fmt(e, 2, 8), fmt(eff, 2, 6),
                                           fmt(add, 1, 9), fmt(rel, 2, 8)) + skip_suffix(key, s))
        csv_row("large_step", labels[key], 1 if key in ("c1", "p1") else 2, "", "step", s, "ms",
                [fnum(r, "step_ms") for r in STEP.get(key, [])])
        if e is not None:
            csv_row("large_step", labels[key], 2, "", "exposed_fraction", e, "", [fnum(r, "exposed") for r in STEP[key]])
        if eff is not None:
            csv_row("large_step", labels[key], 2, "", "weak_scaling_efficiency", eff, "", [])
        if add is not None:
            csv_row("large_step", labels[key], 2, "", "added_over_one_process", add, "ms", [])
        if rel is not None:
            csv_row("large_step", labels[key], 2, "", "added_ratio_to_pytorch", rel, "", [])
    if "c2" in BUCKETS or "p2" in BUCKETS:
        p("   buckets: ddp.h default: %s; PyTorch default: %s" % (BUCKETS.get("c2", "?"), BUCKETS.get("p2", "?")))
    p("   PyTorch's exposed time is not observable from outside its reducer. The DDP_TRANSPORT=tcp row's added/PT "
      "compares with PyTorch's default row.")
    ov = ratio(step("c2slow"), step("c2oneslow"))
    p("   overlap: on a slow network (DDP_SIMULATE_NS_PER_BYTE=%s, about %.0f ms of network a step) a step with the "
      "default buckets takes %s of a step with one bucket, which can only start after backward (test_ddp's "
      "overlap_by_order proves the overlap by order; this is its size)"
      % (SLOW_NS, 96 * MiB * float(SLOW_NS) / 1e6, fmt(ov, 2, 4).strip() + "x" if ov is not None else "-"))
    csv_row("large_step", "overlap: default buckets / one bucket, slow network", 2, "", "step_ratio", ov, "", [])
    target("large model, slow network: default buckets' step <= 0.95x one bucket's (overlap)", ov, 0.95, False)
    for key, name in (("c2", "default buckets"), ("c2one", "one bucket")):
        tw = "p2" if key == "c2" else "p2one"
        tadd = step(tw) - step("p1") if step(tw) is not None and step("p1") is not None else None
        target("large model: ddp.h DDP-added <= 0.5x PyTorch-added (%s)" % name,
               ratio(added.get(key), tadd) if tadd and tadd > 0 else None, 0.5, False)


def skip_suffix(key, value):
    if value is not None:
        return ""
    return "   skipped: " + SKIP.get(key, "no launch finished")


def report_sweep(fits):
    p("3. BUCKET SIZE, ddp.h DDP on 2 ranks, same model (first bucket 1 MiB; a parameter is never split, so every "
      "cap below 16 MiB gives the same 3 buckets)")
    p("%-14s %-44s %9s %11s %8s %11s" % ("cap MiB", "buckets", "ms/step", "exposed ms", "exposed", "model ms"))
    a_b = fits.get("ddp_shm") or fits.get("ddp_tcp")
    tb = step("c1", "bwd_ms")
    for key, cap, _, cap_bytes in SWEEP_CAPS:
        mod = costmodel.model_exposed(costmodel.bucket_layout(cap_bytes), tb / 1e3, *a_b) * 1e3 if a_b and tb else None
        s = step(key)
        bk = re.sub(r" \(\d+ params?\)", "", BUCKETS.get(key, ""))
        bk = bk if len(bk) <= 44 else bk[:40] + " ..."
        p("%-14s %-44s %9s %11s %8s %11s" % (cap, bk, fmt(s, 1, 9), fmt(step(key, "wait_ms"), 1, 11),
                                             fmt(step(key, "exposed"), 2, 8), fmt(mod, 1, 11)) + skip_suffix(key, s))
        csv_row("bucket_sweep", "ddp.h cap " + cap, 2, "", "step", s, "ms", [fnum(r, "step_ms") for r in STEP.get(key, [])])
        csv_row("bucket_sweep", "ddp.h cap " + cap, 2, "", "exposed", step(key, "wait_ms"), "ms",
                [fnum(r, "wait_ms") for r in STEP.get(key, [])])
        csv_row("bucket_sweep", "ddp.h cap " + cap, 2, "", "model_exposed", mod, "ms", [])
    p("   cost model of a 2-rank all-reduce, T = 2a + S/B (= 2(n-1)a + 2(n-1)/n S/B at n = 2), least squares in "
      "relative error over section 1's 2-rank times:")
    for impl in AR_IMPLS:
        f = fits.get(impl)
        if f:
            p("     %-10s a = %7.2f us   B = %6.2f GB/s   (latency <= 5%% of the transfer from S = 40 a B = %s)"
              % (AR_LABEL[impl], f[0] * 1e6, f[1] / 1e9, size_label_any(40 * f[0] * f[1])))
            csv_row("cost_model", AR_LABEL[impl], 2, "", "alpha", f[0] * 1e6, "us", [])
            csv_row("cost_model", AR_LABEL[impl], 2, "", "bandwidth", f[1] / 1e9, "GB/s", [])
        else:
            p("     %-10s no fit (needs at least 2 sizes at 2 ranks)" % AR_LABEL[impl])
    if a_b and tb:
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
    else:
        p("   model: skipped (needs the 1-process backward time and a transport fit)")


def size_label_any(b):
    if b >= MiB:
        return "%.1f MiB" % (b / MiB)
    if b >= 1024:
        return "%.0f KiB" % (b / 1024)
    return "%.0f B" % b


def report_one_process():
    p("4. ONE PROCESS, no DDP, same model, batch 64: ms/step (OpenBLAS on both sides)")
    p("%-10s %10s %10s %8s" % ("threads", "ddp.h", "PyTorch", "ratio"))
    for th, c, pt in ((1, "c1", "p1"), (2, "c1t2", "p1t2")):
        a, b = step(c), step(pt)
        why = "" if a is not None and b is not None else "   skipped: " + SKIP.get(c if a is None else pt, "no launch finished")
        p("%-10d %10s %10s %8s" % (th, fmt(a, 1, 10), fmt(b, 1, 10), fmt(ratio(a, b), 2, 8)) + why)
        csv_row("one_process", "ddp.h %d thread(s)" % th, 1, "", "step", a, "ms",
                [fnum(r, "step_ms") for r in STEP.get(c, [])])
        csv_row("one_process", "PyTorch %d thread(s)" % th, 1, "", "step", b, "ms",
                [fnum(r, "step_ms") for r in STEP.get(pt, [])])
        target("one process, %d thread%s: ddp.h <= 1.2x PyTorch's time" % (th, "s" if th > 1 else ""), ratio(a, b),
               1.2, False)


def report_wine():
    p("5. TUTORIAL MODEL, wine 13 -> 64 -> 3, Adam 1e-3, batch 32 per rank: mean ms per training-loop step")
    p("   ddp.h: (wall time of a %d-epoch run - that of a %d-epoch run) / extra steps (1 process: %d vs %d "
      "epochs); PyTorch: its loop time / steps. Median of %d launch(es)."
      % (WINE_EPOCHS["c2"][1], WINE_EPOCHS["c2"][0], WINE_EPOCHS["c1"][1], WINE_EPOCHS["c1"][0], DONE.get("wine", 0)))
    p("%-32s %10s %10s" % ("setup", "ddp.h", "PyTorch"))
    c1, c2, p1, p2 = (med(WINE.get(k, [])) for k in ("c1", "c2", "p1", "p2"))
    p("%-32s %10s %10s" % ("1 process x 32", fmt(c1, 4, 10), fmt(p1, 4, 10)))
    p("%-32s %10s %10s" % ("DDP 2 ranks x 32", fmt(c2, 4, 10), fmt(p2, 4, 10)))
    p("%-32s %10s %10s" % ("DDP step / 1-process step", fmt(ratio(c2, c1), 2, 10), fmt(ratio(p2, p1), 2, 10)))
    pm1, pm2 = med(WINE.get("p1_median", [])), med(WINE.get("p2_median", []))
    if pm1 is not None or pm2 is not None:
        p("   PyTorch's median single step: 1 process %s ms, DDP %s ms" % (fmt(pm1, 4, 0), fmt(pm2, 4, 0)))
    steps_note = []
    if WINE.get("c1_spe"):
        steps_note.append("1 process %d steps/epoch" % WINE["c1_spe"][0])
    if WINE.get("c2_spe"):
        steps_note.append("2 ranks %d steps/epoch each (the last batch short)" % WINE["c2_spe"][0])
    if steps_note:
        p("   " + "; ".join(steps_note))
    for k in ("c1", "c2", "p1", "p2"):
        if med(WINE.get(k, [])) is None:
            p("   %s %s: skipped: %s" % ("ddp.h" if k[0] == "c" else "PyTorch", "1 process" if k[1] == "1" else "DDP",
                                        SKIP.get("wine_" + k, "no launch finished")))
    for k, label in (("c1", "ddp.h 1 process"), ("c2", "ddp.h DDP 2 ranks"), ("p1", "PyTorch 1 process"),
                     ("p2", "PyTorch DDP 2 ranks")):
        csv_row("wine_step", label, 1 if k[1] == "1" else 2, "", "step", med(WINE.get(k, [])), "ms", WINE.get(k, []))
    target("wine: ddp.h DDP step (2 ranks x 32) <= 2x one process's", ratio(c2, c1), 2.0, False)


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


def write_outputs(bench_dir):
    with open(os.path.join(bench_dir, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["section", "setup", "ranks", "size_bytes", "metric", "value", "unit", "launches", "per_launch"])
        w.writerows(CSV_ROWS)
        for text, val, verdict in TARGETS:
            w.writerow(["target", text, "", "", "ratio", val.rstrip("x"), "", "", verdict])
    with open(os.path.join(bench_dir, "table.txt"), "w") as f:
        f.write("\n".join(OUT) + "\n")


# ---- the CPU benchmark ------------------------------------------------------------------------

def main_cpu(build):
    global LOGDIR
    bench_dir = os.path.join(build, "bench")
    LOGDIR = os.path.join(bench_dir, "logs")
    print("make bench: %s; budget %.0f s of measuring%s" % (
        "BENCH_QUICK=1 (smoke run)" if QUICK else "full run", BUDGET_S, "" if QUICK else " (BENCH_QUICK=1: ~3 min)"),
        flush=True)
    probe(build)   # exits when the programs are not built, before anything is written
    if os.path.isdir(LOGDIR):
        shutil.rmtree(LOGDIR)
    os.makedirs(LOGDIR)
    clock0, load0 = cpu_clock(), loadavg()
    print("== which transport ddp.h uses", flush=True)
    tl = transport_lines()
    for k, v in tl.items():
        print("   DDP_TRANSPORT=%s: %s" % (k or "(unset)", v), flush=True)
    # The all-reduce's size groups are sections of their own. The big messages' later rounds come
    # after every other round: on a busy machine their round is the longest by far (Open MPI's
    # shared memory slows down most), so when the budget runs short they are what is skipped, not
    # the training rounds or the small messages'.
    ar = [("all-reduce %s" % group_name(g), (lambda r, g=g: ar_round(r, g)),
           AR_SMALL_ROUNDS if g[0] == "small" else AR_ROUNDS) for g in AR_GROUPS]
    sections = ar[:1] + [("large model", large_round, STEP_ROUNDS), ("wine", wine_round, STEP_ROUNDS)] + ar[1:]
    deferred = set(name for name, _, _ in ar[1:])
    schedule = [(rnd, sec) for rnd in range(1, max(r for _, _, r in sections) + 1) for sec in sections
                if rnd <= sec[2] and (rnd == 1 or sec[0] not in deferred)]
    schedule += [(rnd, sec) for sec in sections if sec[0] in deferred for rnd in range(2, sec[2] + 1)]
    took, done = DONE_TOOK, DONE
    for rnd, (name, fn, rounds) in schedule:
        # a later round starts only when its round 1's duration, with 15% to spare, fits the budget
        if rnd > 1 and elapsed() + 1.15 * took[name] > BUDGET_S:
            note("%s: round %d of %d skipped: its round 1 took %.0f s and %.0f s of the %.0f s budget (BENCH_BUDGET_S) "
                 "were left" % (name, rnd, rounds, took[name], max(0.0, BUDGET_S - elapsed()), BUDGET_S))
            continue
        print("== %s, round %d of %d" % (name, rnd, rounds), flush=True)
        t = time.time()
        fn(rnd)
        took.setdefault(name, time.time() - t)
        done[name] = rnd
    clock1, load1 = cpu_clock(), loadavg()

    fits = {}
    for impl in AR_IMPLS:
        f = costmodel.fit_alpha_beta(2, [(s, ar_time(impl, 2, s) * 1e-6) for s in AR_SIZES if ar_time(impl, 2, s)])
        if f:
            fits[impl] = f

    p("=" * 118)
    p("make bench: ddp.h beside Open MPI, PyTorch gloo and PyTorch DDP, measured in one run (%s)"
      % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    p("machine: %s %s, %d cores%s; load average %s before, %s after; other programs took %s of the CPU meanwhile"
      % (platform.system(), platform.machine(), ENV.cores, " (%s)" % ENV.cpu if ENV.cpu else "", load0, load1,
         others_share(clock0, clock1)))
    p("ddp.h transport: DDP_TRANSPORT=shm -> %s; =tcp -> %s; unset (training rows) -> %s"
      % (tl.get("shm"), tl.get("tcp"), tl.get(None)))
    p("ddp.h BLAS: %s. Open MPI: %s. PyTorch: %s" % (
        ENV.ddp_blas, ENV.mpi_version or ("skipped: " + ENV.mpi_why),
        ("%s (%s), gloo, BLAS %s, %s" % (ENV.torch_version, PY, ENV.torch_blas or "?",
                                         "jemalloc (never returns memory)" if ENV.jemalloc else "glibc malloc"))
        if not ENV.torch_why else "skipped: " + ENV.torch_why))
    p("rounds done: " + ", ".join("%s %d of %d" % (n, done.get(n, 0), r) for n, _, r in sections) +
      "; launches interleaved round-robin; cell = median of launches, launch = median of iterations/steps")
    p()
    report_allreduce()
    p()
    report_large()
    p()
    report_sweep(fits)
    p()
    report_one_process()
    p()
    report_wine()
    p()
    p("TARGETS (from the issue; ratios measured in this run)")
    for text, val, verdict in TARGETS:
        p("  %-7s %-78s %s" % (verdict, text, val))
    if NOTES:
        p()
        p("NOTES")
        for n in NOTES:
            p("  " + n)
    p()
    p("took %.0f s of measuring (%d launches); CSV: %s; logs: %s" % (
        elapsed(), LAUNCHES[0], disp(os.path.join(bench_dir, "results.csv")), disp(LOGDIR)))
    write_outputs(bench_dir)
    print("\n".join(OUT), flush=True)


# ---- the GPU benchmark (make bench-gpu) ------------------------------------------------------

def main_gpu(build):
    """One GPU: the large model's step on the GPU, ddp.h against PyTorch; ddp.h's DDP over NCCL
    with one rank (the wrapper's and NCCL's cost over the bare step, beside PyTorch DDP's with
    one rank); and 2 ranks on the CPU backend with their buffers on the GPU (DDP_BACKEND=cpu, both
    ranks sharing the one GPU). Every row is skipped, with the reason, when there is no GPU."""
    global LOGDIR
    fake = os.environ.get("BENCH_FAKEGPU") == "1"
    bench_dir = os.path.join(build, "bench")
    LOGDIR = os.path.join(bench_dir, "logs_gpu_standin" if fake else "logs_gpu")
    if os.path.isdir(LOGDIR):
        shutil.rmtree(LOGDIR)
    os.makedirs(LOGDIR)
    steps, warm = env_num("BENCH_STEPS", 50, int), env_num("BENCH_WARMUP", 10, int)
    rounds = env_num("BENCH_STEP_ROUNDS", 3, int)
    b = lambda *q: os.path.join(build, *q)
    progs = b("fakegpu") if fake else build
    large, launched = os.path.join(progs, "examples", "ch08_large_mlp"), os.path.join(progs, "bench", "large_mlp_launched")
    ddprun = b("ddprun")
    stand_in = {"FAKEGPU_DEVICES": "1", "FAKEGPU_CACHE": b("fakegpu", "kernels")} if fake else {}

    gpu_why, gpu_name = "", ""
    if fake:
        gpu_name = "the GPU stand-in (tests/fakegpu): the code path only, its figures mean nothing"
    elif not shutil.which("nvidia-smi"):
        gpu_why = "no GPU: nvidia-smi not found"
    else:
        rc, out = quiet(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
        if rc != 0 or not out.strip():
            gpu_why = "no GPU: nvidia-smi lists none (%s)" % (out.strip().splitlines() or ["exit %d" % rc])[-1]
        else:
            gpu_name = out.strip().splitlines()[0]
    ddp_why = gpu_why or ("" if os.environ.get("BENCH_HAVE_CUDA") == "1" else
                          "ddp.h was built without CUDA (make found no CUDA toolkit: see its first line; "
                          "BENCH_HAVE_CUDA=1 says otherwise when running this script by hand)")
    # a Python whose torch sees the GPU
    torch_why, py = "", None
    if fake:
        torch_why = "PyTorch cannot run on the GPU stand-in"
    elif not gpu_why:
        cands = [c for c in (os.environ.get("BENCH_PY"), shutil.which("python3"), "/usr/bin/python3") if c]
        tried = []
        for c in dict.fromkeys(cands):
            rc, out = quiet([c, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"], timeout=120)
            tried.append("%s: %s" % (c, out.strip().splitlines()[-1] if out.strip() else "exit %d" % rc))
            if rc == 0 and out.strip().endswith("True"):
                py = c
                break
        if not py:
            torch_why = "no Python whose torch.cuda.is_available() is True (%s)" % "; ".join(tried)
    else:
        torch_why = gpu_why

    tp = [py or PY, os.path.join(ROOT, "bench", "pytorch_ddp_large.py")]
    common = ["--steps", str(steps), "--warmup", str(warm)]
    setups = [
        ("g1", "ddp.h, 1 process, GPU", ddp_why, [large, "--nproc", "1", "--device", "cuda"] + common, dict(stand_in)),
        ("t1", "PyTorch, 1 process, GPU", torch_why, tp + ["--nproc", "1", "--device", "cuda"] + common, {}),
        ("gnccl", "ddp.h DDP, 1 rank, NCCL", ddp_why,
         [ddprun, "--standalone", "--nproc-per-node", "1", "--backend", "nccl", launched, "--device", "cuda"] + common,
         dict(stand_in)),
        ("tnccl", "PyTorch DDP, 1 rank, NCCL", torch_why,
         tp + ["--nproc", "1", "--force-ddp", "--device", "cuda"] + common, {}),
        ("gcpu2", "ddp.h DDP, 2 ranks, CPU backend, GPU buffers", ddp_why,
         [large, "--nproc", "2", "--device", "cuda"] + common,
         dict(stand_in, DDP_BACKEND="cpu", OPENBLAS_NUM_THREADS="1")),
    ]
    if not ddp_why and not os.access(launched, os.X_OK):
        setups[2] = setups[2][:2] + ("%s not built" % launched,) + setups[2][3:]
    # the tutorial's model (wine, 13 -> 64 -> 3, Adam, batch 32) on the GPU: ddp.h's example timed as
    # the difference of two launches (lo and hi epochs) per step, PyTorch's twin by its own loop
    ex1 = os.path.join(progs, "examples", "ch01_single_gpu")
    wlo, whi = (2, 12) if fake else (20, 2020)
    print("make bench-gpu: %s" % (gpu_name or gpu_why), flush=True)
    for rnd in range(1, rounds + 1):
        for key, label, why, cmd, extra in setups:
            if why:
                SKIP.setdefault(key, why)
                continue
            out, _, w = launch("gpu_%s_r%d" % (key, rnd), cmd, extra, check_budget=False)
            res = result_fields(out)
            if res:
                STEP.setdefault(key, []).append(res)
            else:
                SKIP.setdefault(key, w or "no result line in the output")
        if ddp_why:
            SKIP.setdefault("wg1", ddp_why)
        else:
            wcmd = [ex1, "--device", "cuda", "--save-every", "0"]
            o1, t1, w1 = launch("gpu_wine_e%d_r%d" % (wlo, rnd), wcmd + ["--epochs", str(wlo)], dict(stand_in),
                                check_budget=False)
            o2, t2, w2 = launch("gpu_wine_e%d_r%d" % (whi, rnd), wcmd + ["--epochs", str(whi)], dict(stand_in),
                                check_budget=False)
            spe = wine_steps(o2, 1)
            if w1 or w2 or not spe:
                SKIP.setdefault("wg1", w1 or w2 or "no 'training ... samples, batch' line in the output")
            else:
                WINE.setdefault("wg1", []).append((t2 - t1) * 1e3 / ((whi - wlo) * spe))
        if torch_why:
            SKIP.setdefault("wt1", torch_why)
        else:
            out, _, w = launch("gpu_wine_torch_r%d" % rnd, [py, os.path.join(ROOT, "bench", "pytorch_wine.py"),
                               "--device", "cuda", "--epochs", "400"], {}, check_budget=False)
            r = result_fields(out)
            if r and fnum(r, "step_ms"):
                WINE.setdefault("wt1", []).append(fnum(r, "step_ms"))
            else:
                SKIP.setdefault("wt1", w or "no result line in the output")
    p("=" * 100)
    p("make bench-gpu: the 25M-parameter MLP (batch 64) on one GPU: %s" % (gpu_name or gpu_why))
    p("cell = median of %d launches, launch = median of %d steps after %d warm-up; overhead = step - the same "
      "library's 1-process GPU step" % (rounds, steps, warm))
    p("%-48s %9s %10s %9s %10s" % ("setup", "ms/step", "exposed ms", "overhead", "vs PyTorch"))
    base = {"g1": "g1", "gnccl": "g1", "gcpu2": "g1", "t1": "t1", "tnccl": "t1"}
    for key, label, _, _, _ in setups:
        s = step(key)
        over = s - step(base[key]) if key != base[key] and s is not None and step(base[key]) is not None else None
        vs = None
        if key == "g1":
            vs = ratio(s, step("t1"))
        elif key == "gnccl" and over is not None and step("tnccl") is not None and step("t1") is not None:
            vs = ratio(over, step("tnccl") - step("t1")) if step("tnccl") - step("t1") > 0 else None
        wait = step(key, "wait_ms") if key.startswith("g") and key != "g1" else None
        p("%-48s %9s %10s %9s %10s" % (label, fmt(s, 2, 9), fmt(wait, 2, 10), fmt(over, 2, 9), fmt(vs, 2, 10))
          + skip_suffix(key, s))
        csv_row("gpu", label, 2 if key == "gcpu2" else 1, "", "step", s, "ms",
                [fnum(r, "step_ms") for r in STEP.get(key, [])])
    p("   vs PyTorch: 1-process row: ddp.h step / PyTorch step; NCCL row: ddp.h's overhead / PyTorch DDP's")
    wg, wt = med(WINE.get("wg1", [])), med(WINE.get("wt1", []))
    p("the tutorial's model (wine 13 -> 64 -> 3, Adam, batch 32), one process on the GPU: ms per training-loop step")
    p("%-48s %9s %10s" % ("setup", "ms/step", "vs PyTorch"))
    p("%-48s %9s %10s" % ("ddp.h, tutorial model, 1 process, GPU", fmt(wg, 3, 9), fmt(ratio(wg, wt), 2, 10))
      + skip_suffix("wg1", wg))
    p("%-48s %9s %10s" % ("PyTorch, tutorial model, 1 process, GPU", fmt(wt, 3, 9), "") + skip_suffix("wt1", wt))
    csv_row("gpu", "wine, ddp.h, 1 process, GPU", 1, "", "step", wg, "ms", WINE.get("wg1", []))
    csv_row("gpu", "wine, PyTorch, 1 process, GPU", 1, "", "step", wt, "ms", WINE.get("wt1", []))
    target("GPU: the large model's step <= 1.1x PyTorch's", ratio(step("g1"), step("t1")), 1.1, False)
    target("GPU: the tutorial model's step <= 0.5x PyTorch's", ratio(wg, wt), 0.5, False)
    p("TARGETS (ratios measured in this run%s)" % ("; meaningless on the stand-in" if fake else ""))
    for text, val, verdict in TARGETS:
        p("  %-7s %-78s %s" % (verdict, text, val))
    suffix = "_standin" if fake else ""  # a stand-in run never overwrites a real GPU's figures
    p("took %.0f s; CSV: %s" % (elapsed(), disp(os.path.join(bench_dir, "results_gpu%s.csv" % suffix))))
    with open(os.path.join(bench_dir, "results_gpu%s.csv" % suffix), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["section", "setup", "ranks", "size_bytes", "metric", "value", "unit", "launches", "per_launch"])
        w.writerows(CSV_ROWS)
    with open(os.path.join(bench_dir, "table_gpu%s.txt" % suffix), "w") as f:
        f.write("\n".join(OUT) + "\n")
    print("\n".join(OUT), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    gpu = "--gpu" in args
    args = [a for a in args if a != "--gpu"]
    if any(a.startswith("-") for a in args) or len(args) > 1:
        sys.exit(__doc__.split("\n\n")[1])
    build = args[0] if args else os.environ.get("BUILD", "build")
    build = os.path.abspath(os.path.join(ROOT, build)) if not os.path.isabs(build) else build
    (main_gpu if gpu else main_cpu)(build)
