#!/usr/bin/env python3
"""Measure the data behind docs/figures/*.png (python3 standard library only).

    python3 docs/figures/measure.py [BUILD] [ring|timeline|loss|sweep|scaling|busbw|zero|gpt|algos ...]

BUILD is the build folder (make's $(BUILD), default build); without names, every measurement
runs. Each one starts the project's own programs, parses what they print or write, and writes
docs/figures/data/<name>.dat with a header saying which command produced it, where and when.
`make figures` runs this, then gnuplot; `make figures-render` only runs gnuplot. With FIG_DATA=DIR
the data files go to DIR instead (make test measures `ring` and `loss` that way, so that a change in
what the programs print, which these parsers read, fails a test rather than this command).
"""
import datetime, json, os, platform, re, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))   # the repository: the examples find examples/data from here
DATA = os.environ.get("FIG_DATA") or os.path.join(HERE, "data")
REPEATS = 3                                      # timed runs per point; the figures show the fastest
# Why the fastest of the runs, not their median: other programs on the machine can only slow a run
# down, never speed it up, so the fastest run is the one they disturbed least. On a quiet machine
# the runs agree and it makes no difference; the data files keep every run.
LARGE = ["--steps", "8", "--warmup", "2"]        # ch08_large_mlp: short, but past the first slow steps


def clean_env(extra=None):
    """The environment for one run: none of the caller's DDP_*, launcher or BLAS-thread settings,
    so that a leftover DDP_TRACE or OPENBLAS_NUM_THREADS cannot change what we measure."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDP_", "SLURM_", "OMPI_")) and k not in drop}
    # The figures show the TCP ring, the transport between machines (ranks on one machine would
    # otherwise meet in shared memory); TUTORIAL chapter 10 compares the two from `make bench`.
    env["DDP_TRANSPORT"] = "tcp"
    env.update(extra or {})
    return env


def run(cmd, extra_env=None):
    """Run one command from the repository root; stop everything if it fails."""
    shown = " ".join(("%s=%s " % kv for kv in (extra_env or {}).items())) + " ".join(map(show, cmd))
    print("  $ " + shown, flush=True)
    p = subprocess.run(cmd, cwd=ROOT, env=clean_env(extra_env), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    if p.returncode != 0:
        sys.exit("measure.py: this command failed (exit %d):\n  %s\n%s" % (p.returncode, shown, p.stdout[-3000:]))
    return p.stdout, shown


def show(arg):
    """A path as the data files show it: relative to the repository, or $BUILD/... when the build
    folder lies elsewhere (no path of the measuring machine goes into a committed file)."""
    if isinstance(arg, str) and arg.startswith(BUILD + "/"):
        return arg if not os.path.isabs(BUILD) else "$BUILD" + arg[len(BUILD):]
    if isinstance(arg, str) and os.path.isabs(arg):
        return os.path.basename(arg)
    return str(arg)


def machine():
    """Which kind of machine measured: OS, architecture, cores, CPU model, and how busy it was."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return "%s %s, %d cores%s; %s" % (platform.system(), platform.machine(), os.cpu_count() or 0,
                                      " (%s)" % cpu if cpu else "", others_share())


def cpu_clock():
    """(CPU seconds the whole machine has been busy, CPU seconds used by us and our children, wall
    time); the first is Linux only (/proc/stat), None elsewhere."""
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK"), ours, time.time()
    except (OSError, ValueError):
        return None, ours, time.time()


START = None   # cpu_clock() when the current measurement began


def others_share():
    """How much of the machine other programs used while we measured: they make timings noisy."""
    busy0, ours0, t0 = START
    busy1, ours1, t1 = cpu_clock()
    if busy0 is None:
        return "CPU use of other programs not known"
    other = max(0.0, (busy1 - busy0) - (ours1 - ours0))
    return "other programs used %.0f%% of the CPU time while this was measured" % (
        100.0 * other / max(1e-9, (t1 - t0) * (os.cpu_count() or 1)))


def today():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def header(what, commands, notes=()):
    """The comment block at the top of every data file: what, which commands, which machine, when."""
    lines = ["# " + what, "# produced by: python3 docs/figures/measure.py (make figures), which ran:"]
    lines += ["#   " + c for c in commands]
    lines += ["# machine: " + machine(), "# date: " + today()]
    lines += ["# " + n for n in notes]
    return "\n".join(lines) + "\n"


def write(name, text):
    with open(os.path.join(DATA, name), "w") as f:
        f.write(text)
    print("  wrote docs/figures/data/" + name, flush=True)


def result_fields(out):
    """ch08_large_mlp's machine-readable line: 'result nproc=2 buckets=3 ... step_ms=214.82 ...'."""
    line = next(l for l in out.splitlines() if l.startswith("result "))
    return dict(kv.split("=", 1) for kv in line.split()[1:])


# ---- 1. the ring all-reduce, step by step, from DDP_DEBUG=DETAIL --------------------------------
def ring():
    cmd = [BUILD + "/ddprun", "--standalone", "--nproc-per-node", "4", BUILD + "/allreduce_perf",
           "-b", "16", "-e", "16", "-n", "1", "-w", "0", "-c", "0"]
    out, shown = run(cmd, {"DDP_DEBUG": "DETAIL", "DDP_ALGO": "ring"})
    # A rank labels its lines "[rank 2/4] ..." when started by hand, and ddprun relays them as
    # "[rank 2]: ..." (without the library's label); the world size then follows from the 2(N-1) steps.
    pat = re.compile(r"\[rank (\d+)(?:/(\d+))?\]:? all_reduce #(\d+) step (\d+)/(\d+) \(([a-z-]+)\): "
                     r"(send|received) segment (\d+) \[(\d+), (\d+)\) (?:to|from) rank (\d+)(?: and (.*))?")
    ops = {}
    for m in pat.finditer(out):
        g = list(m.groups())
        g[1] = g[1] or str(int(g[4]) // 2 + 1)
        ops.setdefault(int(m.group(3)), []).append(tuple(g))
    # The job also runs tiny all-reduces of its own (one element: only segment 0 moves). The 16-byte
    # one is the first in which every rank sends at every one of the 2(N-1) steps.
    ev = next((e for _, e in sorted(ops.items())
               if len([x for x in e if x[6] == "send"]) == int(e[0][1]) * int(e[0][4])), None)
    if not ev:
        sys.exit("measure.py: no complete ring all-reduce in the DDP_DEBUG=DETAIL log; its output:\n" + out[-3000:])
    n, steps = int(ev[0][1]), int(ev[0][4])
    ev.sort(key=lambda x: (int(x[3]), int(x[0]), x[6] != "send"))
    rows = ["# step phase rank action segment first_elem end_elem peer what_it_did_with_it"]
    rows += ['%s %s %s %s %s %s %s %s "%s"' % (x[3], x[5], x[0], x[6], x[7], x[8], x[9], x[10], x[11] or "-")
             for x in ev]
    write("ring_steps.dat", header("ring all-reduce of 16 bytes (4 floats, one segment per rank) on %d ranks: "
                                   "every send and receive of all_reduce #%s, parsed from the DDP_DEBUG=DETAIL log"
                                   % (n, ev[0][2]), [shown]) + "\n".join(rows) + "\n")
    # Replay the log: have[r][s] = whose gradients rank r's copy of segment s holds so far.
    have = [[{r} for _ in range(n)] for r in range(n)]
    blocks = []
    for step in range(steps + 1):
        got = {}
        if step:
            old = [[set(c) for c in row] for row in have]
            for x in ev:
                if int(x[3]) == step and x[6] == "received":
                    r, s, p = int(x[0]), int(x[7]), int(x[10])
                    add = x[11].startswith("added")
                    have[r][s] = old[r][s] | old[p][s] if add else set(old[p][s])
                    got[(r, s)] = ("+" if add else "=") + str(p)
        phase = "start" if step == 0 else ("reduce-scatter" if step <= n - 1 else "all-gather")
        blocks.append("# step %d (%s)\n" % (step, phase) + "\n".join(
            "%d %d %d %d %s %s" % (r, s, len(have[r][s]), (r, s) in got, got.get((r, s), "-"),
                                   ",".join(map(str, sorted(have[r][s])))) for r in range(n) for s in range(n)))
    write("ring_state.dat", header(
        "state of every rank's buffer after each step of the ring all-reduce above (replayed from ring_steps.dat)",
        [shown], ["one block per step (gnuplot index 0 = before the first step ... index %d)" % steps,
                  "rank segment how_many_ranks_summed changed_in_this_step how(+p: received from p and added, "
                  "=p: received from p and copied, -: unchanged) whose_gradients_it_holds"])
          + "\n\n\n".join(blocks) + "\n")


# ---- 2. one training step of 2 ranks, from DDP_TRACE --------------------------------------------
def timeline():
    tmp = tempfile.mkdtemp(prefix="ddp_figures_")
    try:
        cmd = [BUILD + "/examples/ch08_large_mlp", "--nproc", "2", "--steps", "4", "--warmup", "1"]
        out, shown = run(cmd, {"DDP_TRACE": os.path.join(tmp, "trace")})
        shown = shown.replace(os.path.join(tmp, "trace"), "trace")
        ranks = []
        for r in (0, 1):
            with open(os.path.join(tmp, "trace.rank%d.json" % r)) as f:
                trace = json.load(f)
            ranks.append([e for e in trace["traceEvents"] if e.get("ph") == "X"])
            # Kept for ui.perfetto.dev; JSON has no comments, so the provenance goes in the
            # trace format's own metadata field, otherData.
            trace["otherData"] = {"produced_by": "python3 docs/figures/measure.py (make figures): " + shown,
                                  "machine": machine(), "date": today()}
            with open(os.path.join(DATA, "bucket_timeline.rank%d.json" % r), "w") as f:
                f.write('{"displayTimeUnit": "ms", "otherData": %s, "traceEvents": [\n%s\n]}\n' % (
                    json.dumps(trace["otherData"]), ",\n".join(json.dumps(e) for e in trace["traceEvents"])))
    finally:
        shutil.rmtree(tmp)
    # A step runs from its forward to the end of its optimizer step (rank 0's clock). Skip the
    # first step (cold caches, first allocations); of the rest, draw the one of median length.
    def steps_of(evs):
        fw = sorted(e["ts"] for e in evs if e["name"] == "forward")
        opt = sorted(e["ts"] + e["dur"] for e in evs if e["name"] == "optimizer step")
        return list(zip(fw, opt))
    s0 = steps_of(ranks[0])[1:]
    pick = 1 + sorted(range(len(s0)), key=lambda i: s0[i][1] - s0[i][0])[len(s0) // 2]
    rows = ["# rank row t_start_ms t_end_ms kind label   (rows: 2*rank+1 compute, 2*rank communication; "
            "kind 1 forward, 2 backward of a Linear, 3 backward of a ReLU, 4 wait for buckets, "
            "5 optimizer step, 6 all-reduce of a bucket, labelled with its size)"]
    # Each rank's trace has its own clock. A ring all-reduce ends at the same moment on every rank
    # (its last step is an exchange), so rank 1's clock is shifted to make this step's last
    # all-reduce end when rank 0's does; t = 0 is rank 0's forward.
    def last_ar_end(evs, t0, t1):
        return max(e["ts"] + e["dur"] for e in evs if e["name"].startswith("all_reduce") and t0 <= e["ts"] < t1)
    spans = [steps_of(evs)[pick] for evs in ranks]
    ends = [last_ar_end(evs, *sp) for evs, sp in zip(ranks, spans)]
    for r, evs in enumerate(ranks):
        t0, t1 = spans[r]
        origin = spans[0][0] + ends[r] - ends[0]      # rank r's time that stands for rank 0's forward
        for e in sorted(evs, key=lambda e: (e["tid"], e["ts"])):
            if not (t0 <= e["ts"] < t1):
                continue
            name = e["name"]
            if name == "forward": kind, label = 1, "forward"
            elif name.startswith("backward relu"): kind, label = 3, "-"
            elif name.startswith("backward"): kind, label = 2, name.split()[-1]
            elif name.startswith("wait"): kind, label = 4, "wait"
            elif name.startswith("optimizer"): kind, label = 5, "optimizer"
            elif name.startswith("all_reduce"):
                kind, label = 6, "%.0f MiB" % (int(name.split()[1]) / 1048576.0)
            else: continue
            row = 2 * (1 - r) + (1 if e["tid"] == 1 else 0)   # rank 0 on top
            rows.append('%d %d %.3f %.3f %d "%s"' % (r, row, (e["ts"] - origin) / 1000.0,
                                                   (e["ts"] + e["dur"] - origin) / 1000.0, kind, label))
    res = result_fields(out)
    write("bucket_timeline.dat", header(
        "timeline of training step %d of the %d traced (1 warm-up + 4 timed) of the 25M-parameter MLP on 2 ranks, "
        "from the DDP_TRACE files (kept beside this file as bucket_timeline.rank<R>.json)" % (pick + 1, 5),
        [shown], ["times in ms from rank 0's forward of this step; each rank's trace has its own clock: rank 1's "
                  "is shifted so that the step's last all-reduce ends at the same time on both ranks",
                  "the run's medians (rank 0): step %s ms, exposed communication %s ms"
                  % (res["step_ms"], res["wait_ms"])]) + "\n".join(rows) + "\n")


# ---- 3. training loss per epoch, 1 rank against 4 ranks ----------------------------------------
def loss():
    runs = [("1 rank, batch 32", [BUILD + "/examples/ch01_single_gpu", "--device", "cpu", "--save-every", "0"]),
            ("4 ranks, batch 32 per rank (global 128)",
             [BUILD + "/examples/ch03_multi_gpu", "--nproc", "4", "--device", "cpu", "--save-every", "0"]),
            ("4 ranks, batch 8 per rank (global 32)",
             [BUILD + "/examples/ch03_multi_gpu", "--nproc", "4", "--device", "cpu", "--save-every", "0",
              "--batch-size", "8"])]
    cols, cmds, notes = [], [], []
    for label, cmd in runs:
        out, shown = run(cmd)
        cmds.append(shown)
        cols.append([float(m.group(2)) for m in re.finditer(r"epoch +(\d+)/\d+ +loss ([0-9.]+)", out)])
        acc = re.search(r"test accuracy: ([0-9.]+)", out)
        notes.append("column %d: %s; test accuracy %s" % (len(cols) + 1, label, acc.group(1) if acc else "?"))
    rows = ["# epoch loss_1rank loss_4ranks_b32 loss_4ranks_b8"]
    rows += ["%d %s" % (i + 1, " ".join("%.4f" % c[i] for c in cols)) for i in range(min(map(len, cols)))]
    write("loss.dat", header("training loss per epoch on the wine data (142 training samples), as rank 0 prints it",
                             cmds, notes + ["with 4 ranks the printed loss is rank 0's own quarter of the data"])
          + "\n".join(rows) + "\n")


# ---- 4. step time against the bucket size -------------------------------------------------------
def sweep():
    # (plot position on the log x axis, label, options): 0 and "one bucket" have no place on a log
    # axis, so they stand left and right of the numbers, and the figure labels them.
    points = [(0.3, "0", ["--bucket-cap-mb", "0"])] + \
             [(c, str(c), ["--bucket-cap-mb", str(c)]) for c in (1, 10, 25, 100)] + \
             [(300, "one", ["--one-bucket"])]
    res = {p[1]: [] for p in points}
    cmds = []
    for rep in range(REPEATS):        # round robin, so slow spells of the machine hit every point
        for x, label, opts in points:
            out, shown = run([BUILD + "/examples/ch08_large_mlp", "--nproc", "2"] + LARGE + opts)
            res[label].append(result_fields(out))
            if rep == 0: cmds.append(shown)
    rows = ["# x bucket_cap_mb buckets step_ms_fastest wait_ms_of_fastest " +
            " ".join("step_ms_run%d" % i for i in range(1, REPEATS + 1)) + " " +
            " ".join("wait_ms_run%d" % i for i in range(1, REPEATS + 1)) + " step_ms_median"]
    for x, label, _ in points:
        rs = res[label]
        st, wt = [float(r["step_ms"]) for r in rs], [float(r["wait_ms"]) for r in rs]
        best = st.index(min(st))
        rows.append("%g %s %s %.2f %.2f %s %s %.2f" % (x, label, rs[0]["buckets"], st[best], wt[best],
                    " ".join("%.2f" % v for v in st), " ".join("%.2f" % v for v in wt), statistics.median(st)))
    write("bucket_sweep.dat", header(
        "ch08_large_mlp on 2 ranks: step time and exposed communication (time backward waited for "
        "the all-reduces after its last layer) against --bucket-cap-mb, %d runs per point" % REPEATS, cmds,
        ["each run prints medians over its 8 timed steps; below: the fastest run, every run, and their median",
         "x: plot position (0.3 stands for --bucket-cap-mb 0, one parameter per bucket; 300 for --one-bucket)"])
          + "\n".join(rows) + "\n")


# ---- 5a. the large model on 1, 2, 4 ranks -------------------------------------------------------
def scaling():
    cores = os.cpu_count() or 1
    # 1 rank with 1 BLAS thread is the per-core rate; 1 rank with every core as BLAS threads is
    # what one process gets from the machine without DDP. "|" is a line break in the figure.
    configs = [("1 rank|1 thread", 1, {"OPENBLAS_NUM_THREADS": "1"}),
               ("1 rank|%d threads" % cores, 1, {"OPENBLAS_NUM_THREADS": str(cores)}),
               ("2 ranks", 2, {}), ("4 ranks", 4, {})]
    res = {c[0]: [] for c in configs}
    cmds, batch, threads = [], {}, {}
    for rep in range(REPEATS):
        for label, nproc, env in configs:
            out, shown = run([BUILD + "/examples/ch08_large_mlp", "--nproc", str(nproc)] + LARGE, env)
            res[label].append(result_fields(out))
            batch[label] = int(re.search(r"batch (\d+) per rank", out).group(1))
            m = re.search(r"OpenBLAS with (\d+) thread", out)
            threads[label] = m.group(1) if m else "-"
            if rep == 0: cmds.append(shown)
    rows = ["# config nproc blas_threads_per_rank step_ms fwd_ms bwd_ms opt_ms wait_ms samples_per_s "
            "cores (the fastest of %d runs, each printing medians over its 8 timed steps; samples/s = nproc * "
            "batch per rank / step time; cores: this machine's)" % REPEATS]
    for i, (label, nproc, _) in enumerate(configs):
        fastest = min(res[label], key=lambda r: float(r["step_ms"]))   # its parts add up to its step
        best = {k: float(fastest[k]) for k in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms", "wait_ms")}
        th, shown_label = threads[label], label
        if nproc > 1:
            shown_label += "|%s thread%s|each" % (th, "" if th == "1" else "s")
        rows.append('%d "%s" %d %s %.2f %.2f %.2f %.2f %.2f %.1f %d' % (
            i, shown_label, nproc, th, best["step_ms"], best["fwd_ms"], best["bwd_ms"], best["opt_ms"],
            best["wait_ms"], nproc * batch[label] / (best["step_ms"] / 1000.0), cores))
    write("scaling.dat", header(
        "ch08_large_mlp (25M parameters, batch %d per rank) on 1, 2 and 4 ranks of this %d-core machine"
        % (batch[configs[0][0]], cores), cmds,
        ["bwd_ms includes wait_ms (the exposed communication); 2 and 4 ranks get cores/ranks BLAS threads "
         "each (at least 1): with more ranks than cores they share cores"]) + "\n".join(rows) + "\n")


# ---- 5b. all-reduce bus bandwidth against message size -------------------------------------------
def busbw():
    blocks, cmds = [], []
    for n in (2, 4):
        runs = []                              # runs[i][size] = allreduce_perf's row for that size
        for rep in range(2):                   # two runs; per size, the faster one (see REPEATS)
            out, shown = run([BUILD + "/ddprun", "--standalone", "--nproc-per-node", str(n),
                              BUILD + "/allreduce_perf", "-b", "1K", "-e", "256M", "-f", "2", "-n", "10", "-w", "2"])
            if rep == 0: cmds.append(shown + "   (twice)")
            rows = {}
            for line in out.splitlines():
                f = line.split("]: ", 1)[-1].split()
                if len(f) == 8 and f[0].isdigit() and f[2] == "float":
                    rows[int(f[0])] = f
            runs.append(rows)
        lines = ["# %d ranks: size_B count time_us algbw_GBps busbw_GBps wrong ranks cores busbw_run1 busbw_run2" % n]
        for size in sorted(runs[0]):
            f = min((r[size] for r in runs), key=lambda f: float(f[4]))      # the faster run
            lines.append(" ".join(f[:2] + f[4:] + [str(n), str(os.cpu_count() or 0)] + [r[size][6] for r in runs]))
        blocks.append("\n".join(lines))
    write("allreduce_busbw.dat", header(
        "allreduce_perf (float sum, in place, checked) under ddprun on 2 and 4 ranks of one machine (TCP on "
        "127.0.0.1)", cmds, ["time: median of 10 iterations of the slowest rank, from the faster of 2 runs; "
                             "busbw = size/time * 2(n-1)/n, GB = 1e9 bytes; the last columns: each run's busbw",
                             "gnuplot index 0: 2 ranks, index 1: 4 ranks"])
          + "\n\n\n".join(blocks) + "\n")


# ---- 6. ZeRO: training state per rank against the number of ranks --------------------------------
def zero():
    # The program counts the bytes it allocated for each part (ddp_wrapper_stats), so one step is
    # enough and nothing here is a timing: the numbers are the same on any machine.
    pat = re.compile(r"rank 0 holds: weights ([0-9.]+) MiB \(([0-9.]+) at most[^)]*\), gradients ([0-9.]+) MiB, "
                     r"optimizer state ([0-9.]+) MiB; sent ([0-9.]+) MiB per step \(zero_stage (\d)\)")
    blocks, cmds = [], []
    for z in (0, 1, 2, 3):
        rows = ["# %s: nproc zero_stage weights_peak_mib gradients_mib optimizer_state_mib total_mib "
                "sent_mib_per_step weights_held_mib" % ("DDP" if z == 0 else "ZeRO-%d" % z)]
        for n in (2, 3, 4):
            out, shown = run([BUILD + "/examples/ch08_large_mlp", "--nproc", str(n), "--adam", "--zero-stage", str(z),
                              "--steps", "1", "--warmup", "0"])
            cmds.append(shown)
            m = pat.search(out)
            if not m or int(m.group(6)) != z:
                sys.exit("measure.py: no 'rank 0 holds: ...' line for zero_stage %d in the output of:\n  %s\n%s"
                         % (z, shown, out[-3000:]))
            held, peak, grad, opt, sent = (float(m.group(i)) for i in range(1, 6))
            rows.append("%d %d %.2f %.2f %.2f %.2f %.2f %.2f" % (n, z, peak, grad, opt, peak + grad + opt, sent, held))
        blocks.append("\n".join(rows))
    write("zero_memory.dat", header(
        "ch08_large_mlp (25M parameters, Adam) on 2, 3 and 4 ranks: what rank 0 holds of the training state, "
        "for DDP (zero_stage 0) and ZeRO-1, -2, -3, from its 'rank 0 holds:' line", cmds,
        ["MiB = 2^20 bytes, as the program counts them (ddp_wrapper_stats: allocated buffers, not the process's "
         "memory), so they do not depend on the machine",
         "weights_peak: the most weight memory in use at once (ZeRO-3: its shards plus the layers gathered); "
         "gradients: p->grad and the buckets (ZeRO-2/3: the gradient shards and the buffers backward uses); "
         "optimizer_state: Adam's two moments (ZeRO-1..3: this rank's shard); total = the three added",
         "sent_mib_per_step: what rank 0 sent per step; weights_held: the line's first weights number (ZeRO-3: "
         "its shards and the buffers gathered layers go into), which the figure does not use",
         "gnuplot index 0: DDP, 1: ZeRO-1, 2: ZeRO-2, 3: ZeRO-3"])
          + "\n\n\n".join(blocks) + "\n")


# ---- 8. chapter 12's GPT: nanoGPT's laptop setting on 2 ranks, 2,000 steps ------------------------
def gpt():
    cmd = [BUILD + "/examples/ch12_gpt", "--nproc", "2", "--batch-size", "6", "--log-every", "50", "--eval-all", "1",
           "--sample", "300"]
    t0 = time.time()
    out, shown = run(cmd)
    minutes = (time.time() - t0) / 60
    steps = re.findall(r"^step +(\d+)/\d+ +loss ([0-9.]+) ", out, re.M)
    evals = re.findall(r"^step (\d+): train loss ([0-9.]+), val loss ([0-9.]+)$", out, re.M)
    whole = re.search(r"^val loss on the whole held-out text \((\d+) batches\): ([0-9.]+)$", out, re.M)
    if len(steps) < 2 or len(evals) < 2 or not whole:
        sys.exit("measure.py: no progress or evaluation lines in the output of:\n  %s\n%s" % (shown, out[-3000:]))
    rows = ["# step training_loss (the mean over the last 50 steps, averaged over the ranks)"]
    rows += ["%s %s" % s for s in steps]
    rows += ["", "", "# step train_loss val_loss (20 batches of 6 training or held-out windows, all ranks together)"]
    rows += ["%s %s %s" % e for e in evals]
    write("gpt_loss.dat", header(
        "examples/ch12_gpt: nanoGPT's laptop setting (4 layers, 4 heads, 128 wide, context 64, 0.8M parameters) "
        "on 2 ranks of 6 sequences (global batch 12), AdamW, warmup then cosine, clipping at 1.0", [shown],
        ["%.1f minutes in all on this machine (the evaluations included)" % minutes,
         "at the end, the loss on the whole held-out text (%s batches): %s" % whole.groups(),
         "gnuplot index 0: the progress lines, index 1: the evaluations"])
          + "\n".join(rows) + "\n")
    sample = out[out.find("---- "):] if "---- " in out else ""
    write("gpt_sample.txt", "# the text rank 0 wrote at the end of: %s\n%s" % (shown, sample))


# ---- 9. small all-reduces over TCP: the ring against recursive doubling (chapter 10) --------------
def algos():
    """4 ranks, 1 KiB to 1 MiB, each algorithm forced by DDP_ALGO, the runs alternating."""
    n, times, cmds = 4, {"ring": {}, "doubling": {}}, []
    for rep in range(REPEATS):
        for algo in ("ring", "doubling"):
            out, shown = run([BUILD + "/ddprun", "--standalone", "--nproc-per-node", str(n), BUILD + "/allreduce_perf",
                              "-b", "1K", "-e", "1M", "-f", "2", "-n", "200"], {"DDP_ALGO": algo})
            if rep == 0: cmds.append(shown + "   (%d times, alternating)" % REPEATS)
            for line in out.splitlines():
                f = line.split("]: ", 1)[-1].split()
                if len(f) == 8 and f[0].isdigit() and f[2] == "float":
                    if f[7] != "0":
                        sys.exit("measure.py: allreduce_perf found %s wrong values at %s bytes (%s)" % (f[7], f[0], algo))
                    times[algo].setdefault(int(f[0]), []).append(float(f[4]))
    # the cost model's crossover (ddp__use_doubling, alpha/beta = 32 KiB): doubling's log2(4) = 2 steps
    # against the ring's 2*4 - 1 = 7 trips save 5 alphas and add (2 - 1.5) x the size in bytes
    model = 5 * 32768 / (2 - 1.5)
    rows = ["# size_B ring_us doubling_us (each: the fastest of the runs) ranks cores model_crossover_B "
            "ring_runs_us... doubling_runs_us..."]
    for size in sorted(times["ring"]):
        r, d = times["ring"][size], times["doubling"][size]
        rows.append(" ".join(["%d" % size, "%.1f" % min(r), "%.1f" % min(d), str(n), str(os.cpu_count() or 0),
                              "%d" % model] + ["%.1f" % x for x in r + d]))
    write("allreduce_algos.dat", header(
        "allreduce_perf (float sum, in place, checked) on %d ranks of one machine over TCP (127.0.0.1), the "
        "algorithm forced by DDP_ALGO" % n, cmds,
        ["time: median of 200 iterations of the slowest rank, in microseconds; per size the fastest of %d runs"
         % REPEATS]) + "\n".join(rows) + "\n")


ALL = {"ring": ring, "timeline": timeline, "loss": loss, "sweep": sweep, "scaling": scaling, "busbw": busbw,
       "zero": zero, "gpt": gpt, "algos": algos}

if __name__ == "__main__":
    args = sys.argv[1:]
    BUILD = args.pop(0).rstrip("/") if args and args[0] not in ALL else "build"
    if not os.path.isabs(BUILD) and not os.path.exists(os.path.join(ROOT, BUILD, "ddprun")):
        sys.exit("measure.py: %s/ddprun not found: run make first (BUILD=%s)" % (BUILD, BUILD))
    os.makedirs(DATA, exist_ok=True)
    for name in args or list(ALL):
        if name not in ALL:
            sys.exit("measure.py: unknown measurement %r (known: %s)" % (name, " ".join(ALL)))
        print("== %s" % name, flush=True)
        START = cpu_clock()
        ALL[name]()
        print("   %.0f s; %s" % (time.time() - START[2], others_share()), flush=True)
