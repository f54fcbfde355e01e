"""tests/crosscheck/sampler_torch.py: compare ddp.h's distributed sampler with PyTorch's
torch.utils.data.distributed.DistributedSampler over many shapes.

usage: /usr/bin/python3 tests/crosscheck/sampler_torch.py SAMPLER_DUMP
SAMPLER_DUMP is the program built from tests/crosscheck/sampler_dump.c. Prints "N cases" (one case: one rank
of one sampler in one epoch) and exits 0, or prints the first differences and exits 1.

Without shuffling the lists must be PyTorch's exactly. With shuffling the permutation is each
library's own (PyTorch: torch.randperm seeded with seed + epoch; ddp.h: its splitmix64 shuffle), so
the rules around it are compared instead:
  - num_samples and total_size are PyTorch's;
  - there is one order per (n, seed + epoch), whatever the world size, rank or drop_last: ours is
    the list a 1-replica sampler gives, and it is a permutation of 0..n-1;
  - position p of the padded (or cut) list holds order[p % n] (PyTorch repeats the order from its
    front, several times over when total_size > 2n; drop_last keeps the front), and rank r takes
    positions r, r + R, r + 2R, ...: so ours is PyTorch's list with PyTorch's permutation replaced
    entry for entry by ours, which is what is checked;
  - together the ranks cover every index (without drop_last), or hold distinct ones (with it);
  - other epochs give other orders, the same seed + epoch the same order, from any process;
  - ddp_sampler_padding is the number of the rank's entries at positions >= n (the padding).
"""
import subprocess
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

NS = list(range(0, 41)) + [1000, 1437]
WORLD = range(1, 9)
SEEDS = [0, 1, 2024]
EPOCHS = [0, 1, 2, 5]
MAX_REPORTS = 10


class Failures:
    def __init__(self):
        self.lines = []
        self.count = 0

    def add(self, case, what):
        self.count += 1
        if self.count <= MAX_REPORTS:
            self.lines.append("%s: %s" % (fmt(case), what))


def fmt(case):
    n, R, rank, sh, dl, ep, seed = case
    return "n=%d R=%d rank=%d shuffle=%d drop_last=%d epoch=%d seed=%d" % (n, R, rank, sh, dl, ep, seed)


def short(xs, limit=12):
    xs = list(xs)
    return "[%s%s]" % (", ".join(map(str, xs[:limit])), ", ..." if len(xs) > limit else "")


def all_cases():
    for n in NS:
        for sh in (0, 1):
            for dl in (0, 1):
                for seed in SEEDS:
                    for ep in EPOCHS:
                        for R in WORLD:
                            for rank in range(R):
                                yield (n, R, rank, sh, dl, ep, seed)


def run_dump(exe, cases, args=False):
    if args:
        p = subprocess.run([exe] + [str(v) for c in cases for v in c], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    else:
        text = "".join("%d %d %d %d %d %d %d\n" % c for c in cases)
        p = subprocess.run([exe], input=text, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
    out = {}
    errors = []
    for line in p.stdout.splitlines():
        head, sep, tail = line.partition(" :")
        words = head.split()
        key = tuple(int(w) for w in words[:7])
        if not sep:
            errors.append(line)
            continue
        ns, total, pad = (int(w) for w in words[7:10])
        out[key] = (ns, total, pad, words[10], [int(w) for w in tail.split()])
    if p.returncode != 0 and not errors:
        errors.append("%s exited with status %d: %s" % (exe, p.returncode, p.stderr.strip()[-300:]))
    return out, errors


def torch_list(n, R, rank, sh, dl, ep, seed):
    s = DistributedSampler(range(n), num_replicas=R, rank=rank, shuffle=bool(sh), seed=seed, drop_last=bool(dl))
    s.set_epoch(ep)
    return len(s), s.total_size, list(iter(s))


def torch_perm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


def main(exe):
    cases = list(all_cases())
    ours, errors = run_dump(exe, cases)
    bad = Failures()
    for e in errors[:MAX_REPORTS]:
        bad.lines.append("sampler_dump: " + e)
        bad.count += 1
    missing = [c for c in cases if c not in ours]
    for c in missing:
        bad.add(c, "no line from sampler_dump")
    if missing or errors:
        report(bad)

    # our order for each (n, seed + epoch): the one-replica list, a permutation of 0..n-1
    order = {}
    for n in NS:
        for seed in SEEDS:
            for ep in EPOCHS:
                c = (n, 1, 0, 1, 0, ep, seed)
                o = ours[c][4]
                if sorted(o) != list(range(n)):
                    bad.add(c, "the one-replica list %s is not a permutation of 0..%d" % (short(o), n - 1))
                key = (n, seed + ep)
                if key in order and order[key] != o:
                    bad.add(c, "seed + epoch = %d gave another order before: %s, now %s"
                            % (seed + ep, short(order[key]), short(o)))
                order.setdefault(key, o)

    # other epochs (other seed + epoch) give other orders: every pair for n >= 8 (a repeat by
    # chance is then below 1 in 40000), for 3 <= n < 8 not all the same
    for n in NS:
        if n < 3:
            continue
        sums = sorted({s + e for s in SEEDS for e in EPOCHS})
        orders = [tuple(order[(n, t)]) for t in sums]
        if n >= 8:
            seen = {}
            for t, o in zip(sums, orders):
                if o in seen:
                    bad.add((n, 1, 0, 1, 0, t, 0), "seed + epoch %d and %d give the same order %s"
                            % (seen[o], t, short(o)))
                seen.setdefault(o, t)
        elif len(set(orders)) == 1:
            bad.add((n, 1, 0, 1, 0, 0, 0), "every seed + epoch gives the same order %s" % short(orders[0]))

    checked = 0
    groups = {}
    for c in cases:
        groups.setdefault(c[:2] + c[3:], []).append(c)
    relabels = {}
    for (n, R, sh, dl, ep, seed), group in groups.items():
        union = []
        for c in group:
            rank = c[2]
            ns, total, pad, paths, lst = ours[c]
            pt_ns, pt_total, pt = torch_list(*c)
            checked += 1
            if paths != "ok":
                bad.add(c, "ddp.h's own paths disagree: %s (ddp_sampler_indices gave %s)" % (paths, short(lst)))
            if (ns, total) != (pt_ns, pt_total):
                bad.add(c, "num_samples, total_size = %d, %d; PyTorch: %d, %d" % (ns, total, pt_ns, pt_total))
                continue
            if len(lst) != ns:
                bad.add(c, "%d indices printed, num_samples is %d" % (len(lst), ns))
                continue
            want_pad = sum(1 for k in range(pt_ns) if rank + k * R >= n)
            if pad != want_pad:
                bad.add(c, "ddp_sampler_padding = %d; PyTorch's list has %d padded entries (positions >= n)"
                        % (pad, want_pad))
            if not sh:
                if lst != pt:
                    k = next(k for k in range(ns) if lst[k] != pt[k])
                    bad.add(c, "entry %d is %d, PyTorch's is %d: %s vs %s" % (k, lst[k], pt[k], short(lst), short(pt)))
            else:
                # PyTorch's permutation entry i -> ours entry i
                key = (n, seed + ep)
                if key not in relabels:
                    relabel = [0] * n
                    for i, x in enumerate(torch_perm(n, seed + ep)):
                        relabel[x] = order[key][i]
                    relabels[key] = relabel
                relabel = relabels[key]
                want = [relabel[x] for x in pt]
                if lst != want:
                    k = next(k for k in range(ns) if lst[k] != want[k])
                    p = rank + k * R
                    bad.add(c, "entry %d (position %d of the padded list) is %d; the rule gives order[%d %% %d] = %d"
                            " (ours %s, PyTorch's relabelled %s)" % (k, p, lst[k], p, n, want[k], short(lst),
                                                                     short(want)))
            union.extend(lst)
        c0 = group[0]
        size = len(union)
        if not dl and set(union) != set(range(n)):
            bad.add(c0, "the %d ranks together miss %s" % (R, short(sorted(set(range(n)) - set(union)))))
        if dl and (len(set(union)) != size or any(not 0 <= x < n for x in union)):
            bad.add(c0, "with drop_last the ranks' indices are not distinct samples: %s" % short(sorted(union)))

    # the same order from another process, the cases given as arguments this time
    again_cases = [c for c in cases if c[0] == 1437 and c[3] == 1 and c[1] in (1, 3) and c[5] in (0, 1)]
    again, errors = run_dump(exe, again_cases, args=True)
    for c in again_cases:
        if again.get(c) != ours[c]:
            bad.add(c, "another run of sampler_dump gave another list")
            break
    for e in errors[:3]:
        bad.lines.append("sampler_dump (second run): " + e)
        bad.count += 1

    report(bad)
    print("%d cases" % checked)


def report(bad):
    if bad.count:
        print("%d mismatches; the first:" % bad.count)
        for line in bad.lines:
            print("  " + line)
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: %s SAMPLER_DUMP" % sys.argv[0])
    main(sys.argv[1])
