#!/usr/bin/env python3
"""The TUTORIAL's numbers that come from docs/figures/data, checked against those files.

    python3 docs/figures/claims.py        (make test runs it as figures_claims)

`make figures` rewrites the data; the tables and sentences that quote it are written by hand.
This says which quoted number no longer matches its data file, so that a new measurement cannot
leave the text telling another run's story. Exit 0 when every number matches, 1 otherwise.
"""
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "docs", "figures", "data")
problems = []
count = [0]  # the numbers compared


def rows(name, index=0):
    """The data rows of gnuplot index `index` of a .dat file, as lists of fields."""
    text = open(os.path.join(DATA, name)).read()
    blocks = re.split(r"\n\s*\n\s*\n", text)
    return [l.split() for l in blocks[index].splitlines() if l.strip() and not l.startswith("#")]


def header(name):
    return "\n".join(l for l in open(os.path.join(DATA, name)) if l.startswith("#"))


def table_after(text, anchor):
    """The first markdown table after `anchor`, as lists of cells (header and rule left out)."""
    at = text.index(anchor)
    lines = text[at:].splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("|"))
    table = []
    for l in lines[start + 2:]:
        if not l.startswith("|"):
            break
        table.append([c.strip() for c in l.strip("|").split("|")])
    return table


def expect(what, shown, measured):
    count[0] += 1
    if shown != measured:
        problems.append("%s: TUTORIAL.md says %s, the data says %s" % (what, shown, measured))


def r0(x):
    """x to a whole number as people round (868.5 -> 869), not as Python's round does."""
    return "%d" % math.floor(x + 0.5)


def time_text(us):
    """allreduce_perf's microseconds as the chapter writes them: 6.0 µs, 134 µs, 4.99 ms, 87.6 ms."""
    if us < 100:
        return "%.1f µs" % us
    if us < 1000:
        return "%s µs" % r0(us)
    ms = us / 1000
    return "%.2f ms" % ms if ms < 10 else "%.1f ms" % ms


def contains(text, sentence, what):
    count[0] += 1
    if sentence not in text:
        problems.append("%s: the text lacks \"%s\"" % (what, sentence))


def main():
    text = open(os.path.join(ROOT, "TUTORIAL.md")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()

    # chapter 10: 2 ranks over TCP (allreduce_busbw.dat, index 0: size_B count time_us algbw busbw ...)
    busbw = {int(r[0]): r for r in rows("allreduce_busbw.dat", 0)}
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    table = table_after(text, "Our figures for 2 ranks over TCP")
    for size, shown_time, shown_bw in table:
        n, unit = size.split()
        r = busbw[int(n) * units[unit]]
        expect("chapter 10, %s all-reduce time" % size, shown_time, time_text(float(r[2])))
        expect("chapter 10, %s busbw" % size, shown_bw, "%s GB/s" % r[4])
    first, last = busbw[min(busbw)], busbw[max(busbw)]
    contains(text, "Small messages cost about %s µs" % r0(float(first[2])), "chapter 10, small-message time")
    contains(text, "Large messages run at B = %.1f GB/s" % float(last[4]), "chapter 10, bandwidth")

    # chapter 10: the ring against recursive doubling, 4 ranks over TCP (allreduce_algos.dat:
    # size_B ring_us doubling_us ...)
    algos = {int(r[0]): (float(r[1]), float(r[2])) for r in rows("allreduce_algos.dat")}
    small = [v for s, v in algos.items() if s <= 32 << 10]
    contains(text, "From 1 KiB to 32 KiB doubling took %s to %s µs where the ring took %s to %s µs" %
             (r0(min(d for _, d in small)), r0(max(d for _, d in small)), r0(min(r for r, _ in small)),
              r0(max(r for r, _ in small))), "chapter 10, doubling against the ring, small sizes")
    contains(text, "between 512 KiB (doubling %s µs, the ring %s) and 1 MiB, where the ring won (%s against %s\nµs)" %
             (r0(algos[512 << 10][1]), r0(algos[512 << 10][0]), r0(algos[1 << 20][0]), r0(algos[1 << 20][1])),
             "chapter 10, where the two meet")
    if not (algos[512 << 10][1] < algos[512 << 10][0] and algos[1 << 20][0] < algos[1 << 20][1]):
        problems.append("chapter 10: allreduce_algos.dat no longer has doubling ahead at 512 KiB and the ring at 1 MiB")

    # chapter 10: scaling.dat (config label nproc threads step_ms fwd bwd opt wait samples_per_s cores)
    data = []
    for r in rows("scaling.dat"):
        label = re.search(r'"[^"]*"', " ".join(r)).group(0)
        f = " ".join(r).replace(label, "L").split()
        data.append([float(x) for x in f[2:10]])  # nproc threads step fwd bwd opt wait samples
    table = table_after(text, "Our figures (`docs/figures/data/scaling.dat`")
    for (setup, step, wait, samples), d in zip(table, data):
        expect("chapter 10, %s, step" % setup, step, r0(d[2]) + " ms")
        expect("chapter 10, %s, wait" % setup, wait, "-" if d[0] == 1 else r0(d[6]) + " ms")
        expect("chapter 10, %s, samples/s" % setup, samples, r0(d[7]))
    if len(table) != len(data):
        problems.append("chapter 10: the scaling table has %d rows, scaling.dat %d" % (len(table), len(data)))
    contains(text, "Two DDP ranks process 128 samples per %s ms step: %s samples a second, **less** than the %s"
             % (r0(data[2][2]), r0(data[2][7]), r0(data[1][7])), "chapter 10, the scaling sentence")
    contains(text, "Backward itself got slower (%s ms against %s ms for one rank alone), and\n   %s ms"
             % (r0(data[2][4]), r0(data[0][4]), r0(data[2][6])), "chapter 10, backward's times")

    # chapter 12: gpt_loss.dat (its header: the minutes and the loss on the whole held-out text;
    # index 1: step, training loss, held-out loss on the evaluated batches)
    h = header("gpt_loss.dat")
    minutes = re.search(r"# ([0-9.]+) minutes in all", h).group(1)
    whole = float(re.search(r"held-out text \([0-9]+ batches\): ([0-9.]+)", h).group(1))
    share = re.search(r"other programs used ([0-9]+)%", h).group(1)
    final = rows("gpt_loss.dat", 1)[-1]
    contains(text, "other programs taking %s%% of the CPU) the run took %s minutes" % (share, minutes),
             "chapter 12, the run's time")
    contains(text, "The held-out loss after 2,000 steps was %.3f on the 20 batches" % float(final[2]),
             "chapter 12, the held-out loss")
    contains(text, "and %.3f on the whole held-out text" % whole, "chapter 12, the loss on the whole text")
    contains(readme, "held-out loss %.3f after 2,000 steps in %s minutes" % (float(final[2]), minutes),
             "README.md, the GPT row")

    # chapter 12: gpt_quality.csv (bench/gpt_quality.sh: seed, ddp.h's 20-batch and whole-text
    # held-out losses and minutes, then PyTorch's)
    q = [l.strip().split(",") for l in open(os.path.join(DATA, "gpt_quality.csv")) if l[:1].isdigit()]
    table = table_after(text, "Our figures (`docs/figures/data/gpt_quality.csv`")
    for cells, d in zip(table, q):
        expect("chapter 12, the seeds' table, seed %s" % d[0], cells, [d[0], d[1], d[2], d[4], d[5]])
    mean = {i: sum(float(d[i]) for d in q) / len(q) for i in (1, 2, 4, 5)}
    expect("chapter 12, the seeds' table, the means", table[len(q)] if len(table) > len(q) else None,
           ["mean"] + ["%.4f" % mean[i] for i in (1, 2, 4, 5)])
    if len(table) != len(q) + 1:
        problems.append("chapter 12: the seeds' table has %d rows, gpt_quality.csv %d seeds and a mean" %
                        (len(table), len(q)))
    tv = sorted(float(d[4]) for d in q)
    dv = sorted(float(d[1]) for d in q)
    contains(text, "Their averages differ by %.3f" % abs(mean[1] - mean[4]), "chapter 12, the averages' gap")
    contains(text, "(%.4f to %.4f on the 20 batches)" % (tv[0], tv[-1]), "chapter 12, PyTorch's range")
    contains(text, "(%.3f from the\nlowest to the highest, against %.3f)" % (dv[-1] - dv[0], tv[-1] - tv[0]),
             "chapter 12, the two spreads")
    contains(readme, "over %s seeds %.4f on average, against %.4f for nanoGPT's own loop" %
             ({5: "five"}.get(len(q), str(len(q))), mean[1], mean[4]), "README.md, the seeds' averages")

    for p in problems:
        print("claims.py: " + p)
    if problems:
        print("claims.py: fix the text, or run `make figures` again if the data is what is wrong")
        return 1
    print("claims.py: %d quoted numbers and sentences checked against docs/figures/data" % count[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
