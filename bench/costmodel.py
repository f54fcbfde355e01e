"""The cost model behind make bench's bucket section: pure functions, no I/O (bench/run.py prints).

A ring all-reduce of S bytes over n ranks takes T = 2(n-1) a + 2(n-1)/n S/B: 2(n-1) messages in
sequence, each rank sending and receiving 2(n-1)/n of the S bytes, with a the latency of one
message and B the bandwidth. fit_alpha_beta finds a and B from measured times; buckets_for and
model_exposed say what they imply for the large model's gradient buckets.
"""

MiB = 1 << 20
ONE_BUCKET = 1 << 62      # a cap no model reaches: every gradient in one bucket
DEFAULT_FIRST = MiB       # ddp.h's first bucket closes at 1 MiB, so that communication starts early

LAYERS = [(1024, 4096), (4096, 4096), (4096, 1024), (1024, 10)]   # examples/ch08_large_mlp.c


def ring_time(size, a, bw, n=2):
    """Seconds of one ring all-reduce of `size` bytes over n ranks (a in seconds, bw in bytes/s)."""
    return 2 * (n - 1) * a + 2.0 * (n - 1) / n * size / bw


def busbw(size, seconds, n):
    """Bus bandwidth in GB/s (GB = 1e9 B): what each rank's link carried, size * 2(n-1)/n, per second."""
    return size / seconds / 1e9 * 2.0 * (n - 1) / n


def fit_alpha_beta(n, points):
    """Fit T = 2(n-1) a + 2(n-1)/n * S/B (the ring all-reduce: 2(n-1) messages in sequence, each
    rank sending and receiving 2(n-1)/n of the S bytes) to measured (S, T) pairs. T is linear in
    S, T = c0 + c1 S with c0 = 2(n-1) a and c1 = 2(n-1)/(n B); we solve the least-squares problem
    in RELATIVE error (weights 1/T^2): plain least squares would let the 256 MiB point, whose time
    is 10^4 times the 4 KiB one's, decide everything, and the latency would come out as the
    noise of that point. Returns (a in seconds, B in bytes/s) or None; a is clamped at 0."""
    pts = [(s, t) for s, t in points if t and t > 0]
    if len(pts) < 2:
        return None
    w = [1.0 / (t * t) for _, t in pts]
    sw = sum(w)
    sx = sum(wi * s for wi, (s, _) in zip(w, pts))
    sy = sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx = sum(wi * s * s for wi, (s, _) in zip(w, pts))
    sxy = sum(wi * s * t for wi, (s, t) in zip(w, pts))
    det = sw * sxx - sx * sx
    if det <= 0:
        return None
    c1 = (sw * sxy - sx * sy) / det
    c0 = (sy - c1 * sx) / sw
    if c1 <= 0:
        return None
    return max(0.0, c0) / (2 * (n - 1)), 2.0 * (n - 1) / (n * c1)


def buckets_for(cap, first):
    """ddp.h's bucket assignment for the large model: parameters in the order backward makes them
    ready (last layer first, its bias then its weight), a bucket closes once it holds at least its
    cap (first bucket: `first`), a tensor is never split. Returns [(bytes, ready fraction of
    backward)], the ready fraction from the layer's share of the FLOPs (in * out)."""
    total = float(sum(i * o for i, o in LAYERS))
    done, tensors = 0.0, []
    for i, o in reversed(LAYERS):
        done += i * o
        tensors += [(4 * o, done / total), (4 * i * o, done / total)]
    out, cur, ready, limit = [], 0, 0.0, first
    for b, r in tensors:
        cur, ready = cur + b, r
        if cur >= limit:
            out.append((cur, ready))
            cur, limit = 0, cap
    if cur:
        out.append((cur, ready))
    return out


def bucket_layout(cap):
    """buckets_for with ddp.h's first bucket: DEFAULT_FIRST, except that one bucket has no first."""
    return buckets_for(cap, cap if cap >= ONE_BUCKET else DEFAULT_FIRST)


def model_exposed(buckets, tb, a, bw, n=2):
    """Exposed communication of one step under the cost model: bucket k becomes ready at its
    fraction of the backward time tb, all-reduces run one after another on the communication
    thread (FIFO, as ddp.h's reducer launches them), each taking 2(n-1)a + 2(n-1)/n S/B; the
    exposed part is how long the last one ends after backward's last layer. It assumes that the
    communication does not slow backward down: on 2 cores with 2 ranks it does, so measured
    exposed times are larger; the model ranks the bucket sizes, it does not predict the ms."""
    t = 0.0
    for size, frac in buckets:
        t = max(t, frac * tb) + ring_time(size, a, bw, n)
    return max(0.0, t - tb)


# the caps the model chooses among: 1 byte (one parameter per bucket) up to one bucket
CANDIDATE_CAPS = [1] + [int(x * MiB) for x in (0.25, 0.5, 1, 2, 4, 8, 16, 25, 32, 64, 100)] + [ONE_BUCKET]


def best_caps(tb, a, bw):
    """The caps the model prefers: the smallest predicted exposed time (seconds) over
    CANDIDATE_CAPS, backward taking tb seconds. As a tensor is never split, neighbouring caps often
    give the same buckets and tie: returns (that time, every tied cap in increasing order)."""
    scored = [(model_exposed(bucket_layout(c), tb, a, bw), c) for c in CANDIDATE_CAPS]
    best = min(t for t, _ in scored)
    return best, [c for t, c in scored if t - best < 1e-6]
