/* Chapter 12 of TUTORIAL.md: train a GPT with DDP.

   A character-level GPT (examples/gpt.h: written out by hand, forward and backward) learns to
   write like Shakespeare, trained data-parallel the way nanoGPT trains it with PyTorch's DDP:
     - each rank reads its own share of the training windows (ddp.h's sampler, as in chapter 3);
     - AdamW with weight decay 0.1 on the 2-D tensors only, a learning rate that warms up linearly
       and then decays along a cosine, gradients clipped to a global norm of 1.0; betas (0.9, 0.99)
       as nanoGPT's Shakespeare setting has them (its default for larger batches is 0.95: --beta2);
     - --accum K micro-batches per step, the first K-1 under ddp_no_sync (chapter 7);
     - the loss on the held-out text estimated by all ranks together, each a share of the batches,
       and averaged, so the number printed is the job's, not rank 0's;
     - snapshots every --save-every steps, resumed on start (ddprun --max-restarts, chapter 6), with
       nanoGPT's tensor names, so Python loads the weights into nanoGPT's GPT class;
     - --zero-stage 1-3 shards the optimizer state, the gradients, the weights (chapter 11), one
       ZeRO-3 unit per transformer block;
     - at the end rank 0 writes text from the model: --sample N characters at --temperature T.

   Run (from the repository's top folder):
       make
       build/examples/ch12_gpt --nproc 2 --steps 200
       build/ddprun --standalone --nproc-per-node 2 --max-restarts 3 build/examples/ch12_gpt --save-every 50
   nanoGPT's CPU setting (its defaults here): 4 layers, 4 heads, 128 wide, context 64, batch 12.
   Options: --nproc N (N ranks on this machine; without it, the launcher's ranks, or one process)
            --steps N  --batch-size B (sequences per rank per micro-batch)  --accum K  --zero-stage 0-3
            --layers L  --heads H  --width C  --ctx T  --lr X (the peak)  --min-lr X  --warmup N
            --weight-decay X  --beta2 X  --clip X (0: none)  --log-every N  --eval-every N (0: at the
            end only)  --eval-batches N (0: no evaluation)  --eval-all 1 (at the end, also the loss
            on the whole held-out text, all its windows side by side)  --save-every N (0: no snapshots, none
            resumed)  --snapshot FILE  --data FILE  --sample N  --temperature X  --seed N
            --sample-seed N  --device cpu|cuda|cuda:N|auto (cuda: each rank on its own GPU, over NCCL;
            the model's operations run as the kernels in gpt.h) */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "gpt.h"

#include <time.h>

typedef struct options {
    const char *data, *snapshot, *device;
    gpt_config cfg;
    int batch_size, accum, nproc, zero_stage, log_every, eval_every, eval_batches, eval_all, save_every, sample;
    long steps, warmup;
    float lr, min_lr, clip, temperature, weight_decay, beta2;
    unsigned long seed, sample_seed;
} options;

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--nproc N] [--steps N] [--batch-size B] [--accum K] [--zero-stage 0-3]\n"
            "          [--layers L] [--heads H] [--width C] [--ctx T] [--lr X] [--min-lr X] [--warmup N]\n"
            "          [--weight-decay X] [--beta2 X] [--clip X] [--log-every N] [--eval-every N] [--eval-batches N]\n"
            "          [--eval-all 0|1] [--save-every N] [--snapshot FILE] [--data FILE] [--sample N]\n"
            "          [--temperature X] [--seed N] [--sample-seed N] [--device cpu|cuda|cuda:N|auto]\n", prog);
    exit(2);
}

static options parse_args(int argc, char** argv) {
    options o = {.data = "examples/data/tinyshakespeare.txt", .snapshot = "gpt.safetensors", .device = "cpu",
                 .cfg = {.layers = 4, .heads = 4, .width = 128, .ctx = 64},
                 .batch_size = 12, .accum = 1, .log_every = 10, .eval_every = 250, .eval_batches = 20,
                 .sample = 300, .steps = 2000, .warmup = 100, .lr = 1e-3f, .min_lr = 1e-4f, .clip = 1.f,
                 .temperature = 0.8f, .weight_decay = 0.1f, .beta2 = 0.99f, .seed = 1337, .sample_seed = 42};
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(argv[0]);
        if (!v) fprintf(stderr, "%s needs a value\n", a), usage(argv[0]);
        i++;
        if (!strcmp(a, "--nproc")) o.nproc = atoi(v);
        else if (!strcmp(a, "--steps")) o.steps = atol(v);
        else if (!strcmp(a, "--batch-size")) o.batch_size = atoi(v);
        else if (!strcmp(a, "--accum")) o.accum = atoi(v);
        else if (!strcmp(a, "--zero-stage")) o.zero_stage = atoi(v);
        else if (!strcmp(a, "--layers")) o.cfg.layers = atoi(v);
        else if (!strcmp(a, "--heads")) o.cfg.heads = atoi(v);
        else if (!strcmp(a, "--width")) o.cfg.width = atoi(v);
        else if (!strcmp(a, "--ctx")) o.cfg.ctx = atoi(v);
        else if (!strcmp(a, "--lr")) o.lr = (float)atof(v);
        else if (!strcmp(a, "--min-lr")) o.min_lr = (float)atof(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atol(v);
        else if (!strcmp(a, "--weight-decay")) o.weight_decay = (float)atof(v);
        else if (!strcmp(a, "--beta2")) o.beta2 = (float)atof(v);
        else if (!strcmp(a, "--clip")) o.clip = (float)atof(v);
        else if (!strcmp(a, "--log-every")) o.log_every = atoi(v);
        else if (!strcmp(a, "--eval-every")) o.eval_every = atoi(v);
        else if (!strcmp(a, "--eval-batches")) o.eval_batches = atoi(v);
        else if (!strcmp(a, "--eval-all")) o.eval_all = atoi(v);
        else if (!strcmp(a, "--save-every")) o.save_every = atoi(v);
        else if (!strcmp(a, "--snapshot")) o.snapshot = v;
        else if (!strcmp(a, "--data")) o.data = v;
        else if (!strcmp(a, "--sample")) o.sample = atoi(v);
        else if (!strcmp(a, "--temperature")) o.temperature = (float)atof(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--sample-seed")) o.sample_seed = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--device")) o.device = v;
        else fprintf(stderr, "unknown option %s\n", a), usage(argv[0]);
    }
    if (o.steps < 0 || o.batch_size < 1 || o.accum < 1 || o.nproc < 0 || o.zero_stage < 0 || o.zero_stage > 3 ||
        o.cfg.layers < 1 || o.cfg.heads < 1 || o.cfg.width < 1 || o.cfg.ctx < 2 || o.cfg.width % o.cfg.heads ||
        !(o.lr > 0) || !(o.beta2 > 0 && o.beta2 < 1) || o.min_lr < 0 || o.warmup < 0 || !(o.clip >= 0) ||
        o.log_every < 1 || o.eval_every < 0 || o.eval_batches < 0 || o.save_every < 0 || o.sample < 0 ||
        !(o.temperature > 0)) {
        fprintf(stderr, "an option is out of range: sizes, --batch-size, --accum and --log-every >= 1, "
                        "--width a multiple of --heads, --zero-stage 0 to 3, --lr and --temperature > 0, "
                        "--beta2 in (0, 1)\n");
        exit(2);
    }
    return o;
}

/* ---- the text: characters to numbers, 90% to train on, 10% held out ---------------------------- */

typedef struct text {
    int* ids; /* the whole text as character numbers */
    long n, ntrain;
    char chars[256]; /* number -> character */
    int vocab;
} text;

static void text_load(text* t, const char* path) {
    FILE* f = fopen(path, "rb");
    unsigned char* buf;
    int seen[256] = {0}, map[256], c;
    long i;
    if (!f) {
        fprintf(stderr, "cannot open %s: %s (run from the repository's top folder, or pass --data FILE)\n", path,
                strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    t->n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (unsigned char*)malloc((size_t)t->n + 1);
    t->ids = (int*)malloc((size_t)t->n * sizeof(int) + 1);
    if (!buf || !t->ids || (long)fread(buf, 1, (size_t)t->n, f) != t->n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    for (i = 0; i < t->n; i++) seen[buf[i]] = 1;
    for (c = 0, t->vocab = 0; c < 256; c++) /* the sorted characters, as nanoGPT's prepare.py numbers them */
        if (seen[c]) map[c] = t->vocab, t->chars[t->vocab++] = (char)c;
    for (i = 0; i < t->n; i++) t->ids[i] = map[buf[i]];
    t->ntrain = t->n * 9 / 10;
    free(buf);
}

/* ---- the schedule ----------------------------------------------------------------------------------- */

/* nanoGPT's: linear warmup to lr, then a cosine down to min_lr at the last step. */
static float lr_at(const options* o, long step) {
    double progress;
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    if (o->steps <= o->warmup) return o->lr;
    progress = (double)(step - o->warmup) / (double)(o->steps - o->warmup);
    return (float)(o->min_lr + 0.5 * (o->lr - o->min_lr) * (1 + cos(3.14159265358979 * progress)));
}

/* ---- batches ---------------------------------------------------------------------------------------- */

/* This rank's training windows: window w is characters w .. w+T of the training text (T inputs, each
   followed by its target). The sampler deals each epoch's shuffled windows out to the ranks; a
   step takes the next B x K of this rank's. Where a step's batches come from follows from the
   step number alone, so a resumed run reads exactly what the uninterrupted one would have. */
typedef struct batches {
    ddp_sampler sampler;
    int* order; /* this rank's windows in the current epoch */
    int epoch, per_epoch;
} batches;

static void batch_at(batches* b, const text* t, long micro, int B, int T, int* x, int* y) {
    long first = micro * B;
    int epoch = (int)(first / b->per_epoch) + 1, i, j;
    if (epoch != b->epoch) {
        ddp_sampler_set_epoch(&b->sampler, epoch);
        ddp_sampler_indices(&b->sampler, b->order);
        b->epoch = epoch;
    }
    for (i = 0; i < B; i++) {
        int w = b->order[(first % b->per_epoch) + i];
        for (j = 0; j < T; j++) x[i * T + j] = t->ids[w + j], y[i * T + j] = t->ids[w + j + 1];
    }
}

/* An all-reduce of n <= 2 numbers of the host's: a collective's buffer is on the rank's device (a
   GPU's memory under NCCL), so they go there and back, as torch.tensor(x, device=...) does. */
static void all_reduce_host(ddp_pg* pg, float* x, int n, ddp_reduce_op op) {
    static float* buf; /* on this rank's device, made at the first call */
    const ddp_device host = {DDP_DEVICE_CPU, 0}, dev = ddp_pg_device(pg);
    if (!buf) DDP_CHECK(ddp_alloc(dev, 2 * sizeof(float), (void**)&buf));
    DDP_CHECK(ddp_copy(dev, buf, host, x, (size_t)n * sizeof(float), NULL));
    DDP_CHECK(ddp_all_reduce(pg, buf, (size_t)n, DDP_F32, op, NULL));
    DDP_CHECK(ddp_copy(host, x, dev, buf, (size_t)n * sizeof(float), NULL));
}

/* The mean loss over about `nb` batches spread evenly over [from, to) of the text, the batches dealt
   out to the ranks (batch e to rank e mod world) and the sums added over all ranks: every rank
   returns the same number. Every rank runs as many forwards as the others (nb is rounded up to a
   multiple of the world size): under ZeRO-3 each forward gathers weights, a collective. */
static float estimate_loss(gpt* g, ddp_pg* pg, const text* t, long from, long to, int nb, int B, int T, int* x,
                           int* y) {
    const int rank = ddp_rank(pg), world = ddp_world_size(pg);
    float sums[2] = {0, 0}; /* the losses of this rank's batches, and how many */
    long stride;
    int e, i, j;
    nb = (nb + world - 1) / world * world;
    stride = (to - from - T - 1) / ((long)nb * B);
    if (stride < 1) stride = 1;
    for (e = rank; e < nb; e += world) {
        for (i = 0; i < B; i++) {
            long w = from + ((long)e * B + i) * stride;
            if (w + T + 1 > to) w = to - T - 1;
            for (j = 0; j < T; j++) x[i * T + j] = t->ids[w + j], y[i * T + j] = t->ids[w + j + 1];
        }
        sums[0] += gpt_forward(g, x, y, B, T), sums[1] += 1;
    }
    all_reduce_host(pg, sums, 2, DDP_SUM);
    return sums[0] / sums[1];
}

/* Rank 0 alone: n characters, each drawn from the model's next-character distribution at the given
   temperature, starting from a newline (nanoGPT's sample.py). */
static void sample_text(gpt* g, const text* t, int n, float temperature, unsigned long seed) {
    const int T = g->cfg.ctx, V = g->cfg.vocab;
    int* ctx = (int*)malloc((size_t)(n + 1) * sizeof(int));
    ddp_rng r = ddp_rng_seed(seed);
    int len = 0, k, v;
    const char* nl = memchr(t->chars, '\n', (size_t)t->vocab);
    ctx[len++] = nl ? (int)(nl - t->chars) : 0;
    for (k = 0; k < n; k++) {
        int from = len > T ? len - T : 0, rows = len - from;
        const float* p;
        double z = 0, u, acc = 0;
        gpt_forward(g, ctx + from, NULL, 1, rows);
        p = gpt_probs(g, rows - 1); /* the last position's next-character probabilities */
        for (v = 0; v < V; v++) z += pow(p[v], 1.0 / temperature); /* softmax(logits / temperature) */
        u = ddp_rng_uniform(&r) * z;
        for (v = 0; v < V - 1; v++)
            if ((acc += pow(p[v], 1.0 / temperature)) > u) break;
        ctx[len++] = v;
        putchar(t->chars[v]);
    }
    putchar('\n');
    free(ctx);
}

/* ---- training ------------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int train(int rank, void* arg) {
    const options* opt = (const options*)arg;
    const int B = opt->batch_size, T = opt->cfg.ctx, K = opt->accum;
    ddp_desc desc = {0};
    ddp_wrap_desc wd = {0};
    ddp_optim_desc od = {.kind = DDP_ADAMW, .beta1 = 0.9f};
    ddp_sampler_desc sd = {0};
    ddp_snapshot snap = {0};
    ddp_pg* pg;
    ddp_wrapper* ddp;
    ddp_optim* optim;
    text txt;
    gpt g;
    gpt_config cfg = opt->cfg;
    batches bt = {0};
    int *x, *y, world, k;
    long step;
    double t0, tokens_per_step;
    float norm = 0, loss_sum = 0;

    text_load(&txt, opt->data);
    DDP_CHECK(ddp_device_parse(opt->device, &desc.device)); /* cuda: this rank's GPU (its local rank) */
    DDP_CHECK(ddp_init(&desc, &pg));
    rank = ddp_rank(pg), world = ddp_world_size(pg);
    cfg.vocab = txt.vocab;
    gpt_create(&g, &cfg, ddp_pg_device(pg), B * T, opt->seed); /* kernels compiled here on a GPU */
    wd.zero_stage = opt->zero_stage;
    DDP_CHECK(ddp_wrap(pg, g.m, &wd, &ddp)); /* rank 0's weights everywhere; hooks on every tensor */
    od.lr = opt->lr, od.weight_decay = opt->weight_decay, od.beta2 = opt->beta2;
    DDP_CHECK(ddp_optim_create(g.m, &od, &optim));

    sd.pg = pg, sd.seed = opt->seed, sd.drop_last = 1;
    DDP_CHECK(ddp_sampler_init(&bt.sampler, (int)(txt.ntrain - T), &sd)); /* windows that fit the training text */
    bt.per_epoch = bt.sampler.num_samples / B * B;
    bt.order = (int*)malloc((size_t)bt.sampler.num_samples * sizeof(int));
    x = (int*)malloc((size_t)B * T * sizeof(int)), y = (int*)malloc((size_t)B * T * sizeof(int));
    if (!bt.order || !x || !y || bt.per_epoch < 1) {
        fprintf(stderr, "out of memory, or a batch larger than this rank's share of the text\n");
        return 1;
    }
    tokens_per_step = (double)B * T * K * world;
    if (rank == 0)
        printf("GPT: %d layers, %d heads, %d wide, context %d, %d characters: %zu parameters in %d tensors\n"
               "%d ranks x %d micro-batches x %d sequences x %d characters = %.0f tokens per step; zero_stage %d\n",
               cfg.layers, cfg.heads, cfg.width, T, cfg.vocab, ddp_model_num_elements(g.m), ddp_model_num_params(g.m),
               world, K, B, T, tokens_per_step, opt->zero_stage);

    snap.model = g.m, snap.optim = optim, snap.sampler = &bt.sampler;
    if (opt->save_every && ddp_snapshot_exists(opt->snapshot)) { /* every rank reads it, after ddp_wrap */
        DDP_CHECK(ddp_snapshot_load(&snap, opt->snapshot));
        if (rank == 0)
            printf("resuming from %s at step %ld (restart %s)\n", opt->snapshot, snap.step,
                   getenv("DDP_RESTART_COUNT") ? getenv("DDP_RESTART_COUNT") : "0");
    }

    t0 = now_s();
    for (step = snap.step; step < opt->steps; step++) {
        int last = step == opt->steps - 1;
        if (opt->eval_every && opt->eval_batches && step % opt->eval_every == 0) { /* every rank takes part */
            float tr = estimate_loss(&g, pg, &txt, 0, txt.ntrain, opt->eval_batches, B, T, x, y);
            float va = estimate_loss(&g, pg, &txt, txt.ntrain, txt.n, opt->eval_batches, B, T, x, y);
            if (rank == 0) printf("step %ld: train loss %.4f, val loss %.4f\n", step, tr, va), fflush(stdout);
            t0 = now_s();
        }
        DDP_CHECK(ddp_optim_set_lr(optim, lr_at(opt, step)));
        DDP_CHECK(ddp_model_zero_grad(g.m));
        for (k = 0; k < K; k++) { /* the first K-1 only add into p->grad; the last all-reduces */
            ddp_no_sync(ddp, k < K - 1);
            batch_at(&bt, &txt, step * K + k, B, T, x, y);
            loss_sum += gpt_forward(&g, x, y, B, T) / K;
            gpt_backward(&g, 1.f / K);
        }
        if (opt->clip > 0) DDP_CHECK(ddp_optim_clip_grad_norm(optim, opt->clip, &norm)); /* the same on every rank */
        DDP_CHECK(ddp_optim_step(optim));
        if ((step + 1) % opt->log_every == 0 || last) { /* the job's mean loss, not rank 0's */
            int done = (int)(step % opt->log_every) + 1;
            float sum = loss_sum / done;
            double dt = now_s() - t0;
            all_reduce_host(pg, &sum, 1, DDP_AVG);
            if (rank == 0)
                printf("step %5ld/%ld  loss %.4f  lr %.2e  norm %.3f  %.1f ms/step  %.0f tokens/s\n", step + 1,
                       opt->steps, sum, lr_at(opt, step), norm, dt / done * 1e3, tokens_per_step * done / dt);
            fflush(stdout); /* a line as it happens, also into a pipe or a log file */
            loss_sum = 0, t0 = now_s();
        }
        if (opt->save_every && ((step + 1) % opt->save_every == 0 || last)) {
            snap.step = step + 1, snap.epoch = bt.epoch;
            DDP_CHECK(ddp_optim_consolidate(optim, 0)); /* sharded state (ZeRO) onto rank 0 */
            if (rank == 0) DDP_CHECK(ddp_snapshot_save(&snap, opt->snapshot));
            t0 = now_s();
        }
    }
    if (opt->eval_batches) { /* the losses of the weights the job ends with (also with --steps 0, --eval-every 0) */
        float tr = estimate_loss(&g, pg, &txt, 0, txt.ntrain, opt->eval_batches, B, T, x, y);
        float va = estimate_loss(&g, pg, &txt, txt.ntrain, txt.n, opt->eval_batches, B, T, x, y);
        if (rank == 0) printf("step %ld: train loss %.4f, val loss %.4f\n", opt->steps, tr, va);
    }
    if (opt->eval_all) { /* the held-out text from end to end: its windows of T characters side by side */
        int all = (int)((txt.n - txt.ntrain - T - 1) / ((long)T * B));
        float whole = estimate_loss(&g, pg, &txt, txt.ntrain, txt.n, all, B, T, x, y);
        if (rank == 0)
            printf("val loss on the whole held-out text (%d batches): %.4f\n", (all + world - 1) / world * world,
                   whole);
    }

    if (rank == 0) { /* what this rank held: ZeRO's savings, in numbers */
        ddp_wrap_stats st;
        ddp_wrapper_stats(ddp, &st);
        const double MiB = 1024.0 * 1024.0;
        printf("memory on rank 0: weights %.2f MiB (at most %.2f MiB at once), gradients %.2f MiB, optimizer state "
               "%.2f MiB\n", st.param_bytes / MiB, st.param_peak_bytes / MiB, st.grad_bytes / MiB,
               st.optim_state_bytes / MiB);
    }
    DDP_CHECK(ddp_full_params(ddp, 1)); /* ZeRO-3: every rank gathers every block, then rank 0 writes */
    if (rank == 0 && opt->sample) {
        printf("---- %d characters at temperature %.2f ----\n", opt->sample, opt->temperature);
        sample_text(&g, &txt, opt->sample, opt->temperature, opt->sample_seed);
    }
    DDP_CHECK(ddp_full_params(ddp, 0));

    free(x), free(y), free(bt.order), free(txt.ids);
    ddp_optim_destroy(optim);
    ddp_wrapper_destroy(ddp), ddp_destroy(pg);
    gpt_free(&g);
    return 0;
}

int main(int argc, char** argv) {
    options opt = parse_args(argc, argv);
    if (opt.nproc > 0) return ddp_spawn(opt.nproc, train, &opt) == DDP_OK ? 0 : 1;
    return train(0, &opt); /* started by a launcher (ddprun, torchrun, srun, mpirun), or alone */
}
