/* Chapter 12 of TUTORIAL.md: a model of your own under DDP.

   Chapter 3's program, with the model written here instead of by ddp_model_mlp: a Linear layer,
   a LayerNorm and a ReLU (unit 1), then a Linear layer to the classes (unit 2), and softmax
   cross-entropy. ddp.h allocates the tensors this file describes (ddp_model_add); the forward and
   the backward below are plain C loops over them. What DDP needs from a backward of your own:
     - ddp_unit_begin(m, 0, DDP_BACKWARD) before it and ddp_unit_end(m, 0, DDP_BACKWARD) after it,
       where DDP waits for its all-reduces (unit 0 is the whole model; forward is bracketed alike);
     - ddp_param_grad_ready(p) for each tensor the moment its gradient is final, so that its
       bucket's all-reduce starts while backward goes on with the layers before;
     - each unit's forward and backward bracketed too: ZeRO-3 gathers a unit's weights at its
       begin and frees them at its end (p->data is valid only in between; read it there).
   And what GPT training does, which the chapter's GPT takes over: AdamW with betas (0.9, 0.95) and
   weight decay on the 2-D weights only, a learning rate set before every step (linear warmup, then
   cosine decay) and the gradients clipped to a global norm of 1.0, each gradient counted once over
   all ranks, also when each rank holds only a shard of them.

   Build and run (from the repository's top folder):
       make
       build/examples/ch12_own_model --nproc 2
       build/examples/ch12_own_model --nproc 4 --zero-stage 3
   Options: --zero-stage 0-3  --clip X (0: none)  --data wine|digits|FILE.csv  --data-dir DIR
            --epochs N  --batch-size N  --lr X (the peak)  --hidden N  --seed N  --nproc N
   The forward and backward here run on the CPU (--device is cpu); chapter 12's GPT adds the GPU. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

typedef struct options {
    const char* data;
    const char* data_dir;
    int epochs, batch_size, hidden, nproc, zero_stage;
    float lr, clip;
    unsigned long seed;
} options;

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--zero-stage 0-3] [--clip X] [--data wine|digits|FILE.csv] [--data-dir DIR]\n"
            "          [--epochs N] [--batch-size N] [--lr X] [--hidden N] [--seed N] [--nproc N]\n", prog);
    exit(2);
}

static options parse_args(int argc, char** argv) {
    options o = {.data = "wine", .epochs = 30, .batch_size = 16, .hidden = 32, .nproc = 2, .lr = 3e-3f, .clip = 1.f,
                 .seed = 1};
    int i;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(argv[0]);
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            usage(argv[0]);
        }
        i++;
        if (!strcmp(a, "--data")) o.data = v;
        else if (!strcmp(a, "--data-dir")) o.data_dir = v;
        else if (!strcmp(a, "--epochs")) o.epochs = atoi(v);
        else if (!strcmp(a, "--batch-size")) o.batch_size = atoi(v);
        else if (!strcmp(a, "--hidden")) o.hidden = atoi(v);
        else if (!strcmp(a, "--lr")) o.lr = (float)atof(v);
        else if (!strcmp(a, "--clip")) o.clip = (float)atof(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--nproc")) o.nproc = atoi(v);
        else if (!strcmp(a, "--zero-stage")) o.zero_stage = atoi(v);
        else if (!strcmp(a, "--device") && strcmp(v, "cpu") != 0) {
            fprintf(stderr, "this chapter's forward and backward are plain C loops over host memory: --device cpu "
                            "(chapter 12's GPT runs on GPUs)\n");
            exit(2);
        } else if (strcmp(a, "--device") != 0) {
            fprintf(stderr, "unknown option %s\n", a);
            usage(argv[0]);
        }
    }
    if (o.epochs < 1 || o.batch_size < 1 || o.hidden < 1 || !(o.lr > 0) || o.nproc < 1 || !(o.clip >= 0) ||
        o.zero_stage < 0 || o.zero_stage > 3) {
        fprintf(stderr, "--epochs, --batch-size, --hidden and --nproc must be >= 1, --lr > 0, --clip >= 0, "
                        "--zero-stage 0 to 3\n");
        exit(2);
    }
    return o;
}

/* ---- the model: its tensors, its forward, its backward ------------------------------------------- */

typedef struct net {
    ddp_model* m;
    ddp_param *w1, *b1, *ln_w, *ln_b, *w2, *b2;
    int in, hidden, classes, n;
    /* what forward keeps for backward, for up to `cap` rows */
    float *x, *xhat, *inv_std, *h, *dlogits;
    int cap;
} net;

/* Describe one tensor; ddp.h allocates it, initialised as `init` says, in unit `unit`. */
static ddp_param* tensor(ddp_model* m, const char* name, int rows, int cols, ddp_init_kind init, float scale,
                         int unit, int no_decay) {
    ddp_tensor_desc t = {.name = name, .init = init, .scale = scale, .unit = unit, .no_decay = no_decay};
    ddp_param* p;
    t.ndim = cols ? 2 : 1, t.shape[0] = rows, t.shape[1] = cols;
    DDP_CHECK(ddp_model_add(m, &t, &p));
    return p;
}

static void net_create(net* n, int in, int hidden, int classes, int cap, unsigned long seed) {
    ddp_model_desc md = {.device = {.type = DDP_DEVICE_CPU}, .seed = seed};
    float b1 = 1.f / sqrtf((float)in), b2 = 1.f / sqrtf((float)hidden); /* nn.Linear's bounds */
    memset(n, 0, sizeof *n);
    n->in = in, n->hidden = hidden, n->classes = classes, n->cap = cap;
    DDP_CHECK(ddp_model_create(&md, &n->m));
    /* unit 1: Linear, LayerNorm. Weight decay for the 2-D weights only (nanoGPT's parameter groups) */
    n->w1 = tensor(n->m, "fc1.weight", hidden, in, DDP_INIT_UNIFORM, b1, 1, 0);
    n->b1 = tensor(n->m, "fc1.bias", hidden, 0, DDP_INIT_UNIFORM, b1, 1, 1);
    n->ln_w = tensor(n->m, "ln.weight", hidden, 0, DDP_INIT_ONES, 0, 1, 1);
    n->ln_b = tensor(n->m, "ln.bias", hidden, 0, DDP_INIT_ZEROS, 0, 1, 1);
    /* unit 2: the classifier */
    n->w2 = tensor(n->m, "fc2.weight", classes, hidden, DDP_INIT_UNIFORM, b2, 2, 0);
    n->b2 = tensor(n->m, "fc2.bias", classes, 0, DDP_INIT_UNIFORM, b2, 2, 1);
    n->x = (float*)calloc((size_t)cap * in, sizeof(float));
    n->xhat = (float*)calloc((size_t)cap * hidden, sizeof(float));
    n->inv_std = (float*)calloc((size_t)cap, sizeof(float));
    n->h = (float*)calloc((size_t)cap * hidden, sizeof(float));
    n->dlogits = (float*)calloc((size_t)cap * classes, sizeof(float));
    if (!n->x || !n->xhat || !n->inv_std || !n->h || !n->dlogits) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
}

static void net_free(net* n) {
    ddp_model_destroy(n->m);
    free(n->x), free(n->xhat), free(n->inv_std), free(n->h), free(n->dlogits);
}

/* Forward on `rows` samples: h = relu(layernorm(x W1^T + b1)), logits = h W2^T + b2, then the mean
   cross-entropy against y (written to *loss) and its gradient for backward. *correct (may be NULL)
   counts the rows whose largest logit is their label. */
static void net_forward(net* n, const float* x, const int* y, int rows, float* loss, int* correct) {
    const int IN = n->in, H = n->hidden, C = n->classes;
    double total = 0;
    int r, i, j;
    n->n = rows;
    memcpy(n->x, x, (size_t)rows * IN * sizeof(float));
    if (correct) *correct = 0;
    DDP_CHECK(ddp_unit_begin(n->m, 0, DDP_FORWARD));
    DDP_CHECK(ddp_unit_begin(n->m, 1, DDP_FORWARD)); /* ZeRO-3 gathers fc1 and ln here */
    for (r = 0; r < rows; r++) {
        float* a = n->h + (size_t)r * H; /* the pre-activation, normalised in place */
        double mean = 0, var = 0;
        for (i = 0; i < H; i++) {
            float s = n->b1->data[i];
            for (j = 0; j < IN; j++) s += x[(size_t)r * IN + j] * n->w1->data[(size_t)i * IN + j];
            a[i] = s, mean += s;
        }
        mean /= H;
        for (i = 0; i < H; i++) var += (a[i] - mean) * (a[i] - mean);
        n->inv_std[r] = (float)(1.0 / sqrt(var / H + 1e-5));
        for (i = 0; i < H; i++) {
            float xh = (float)((a[i] - mean) * n->inv_std[r]), v = xh * n->ln_w->data[i] + n->ln_b->data[i];
            n->xhat[(size_t)r * H + i] = xh;
            a[i] = v > 0 ? v : 0;
        }
    }
    DDP_CHECK(ddp_unit_end(n->m, 1, DDP_FORWARD));
    DDP_CHECK(ddp_unit_begin(n->m, 2, DDP_FORWARD));
    for (r = 0; r < rows; r++) {
        float* z = n->dlogits + (size_t)r * C;
        float mx, sum = 0;
        int best = 0;
        for (i = 0; i < C; i++) {
            float s = n->b2->data[i];
            for (j = 0; j < H; j++) s += n->h[(size_t)r * H + j] * n->w2->data[(size_t)i * H + j];
            z[i] = s;
            if (s > z[best]) best = i;
        }
        mx = z[best];
        for (i = 0; i < C; i++) sum += expf(z[i] - mx);
        total += mx + logf(sum) - z[y[r]];
        if (correct) *correct += best == y[r];
        for (i = 0; i < C; i++) z[i] = (expf(z[i] - mx) / sum - (i == y[r])) / (float)rows; /* dloss/dz */
    }
    DDP_CHECK(ddp_unit_end(n->m, 2, DDP_FORWARD));
    DDP_CHECK(ddp_unit_end(n->m, 0, DDP_FORWARD));
    *loss = (float)(total / rows);
}

/* Backward: add each tensor's gradient into p->grad and announce it the moment it is final, last
   layer first. */
static void net_backward(net* n) {
    const int IN = n->in, H = n->hidden, C = n->classes, B = n->n;
    float* dh = (float*)calloc((size_t)B * H, sizeof(float));
    int r, i, j;
    if (!dh) exit(1);
    DDP_CHECK(ddp_unit_begin(n->m, 0, DDP_BACKWARD));
    DDP_CHECK(ddp_unit_begin(n->m, 2, DDP_BACKWARD)); /* under ZeRO-2 and -3, p->grad exists from here */
    for (r = 0; r < B; r++)
        for (i = 0; i < C; i++) {
            float d = n->dlogits[(size_t)r * C + i];
            n->b2->grad[i] += d;
            for (j = 0; j < H; j++) {
                n->w2->grad[(size_t)i * H + j] += d * n->h[(size_t)r * H + j];
                dh[(size_t)r * H + j] += d * n->w2->data[(size_t)i * H + j];
            }
        }
    DDP_CHECK(ddp_param_grad_ready(n->b2)); /* final: its bucket may go while we go on */
    DDP_CHECK(ddp_param_grad_ready(n->w2));
    DDP_CHECK(ddp_unit_end(n->m, 2, DDP_BACKWARD));
    DDP_CHECK(ddp_unit_begin(n->m, 1, DDP_BACKWARD));
    for (r = 0; r < B; r++) {
        const float* xh = n->xhat + (size_t)r * H;
        float* d = dh + (size_t)r * H;
        double m1 = 0, m2 = 0;
        for (i = 0; i < H; i++) {
            float v = xh[i] * n->ln_w->data[i] + n->ln_b->data[i];
            d[i] = v > 0 ? d[i] : 0; /* through the ReLU */
            n->ln_w->grad[i] += d[i] * xh[i];
            n->ln_b->grad[i] += d[i];
            d[i] *= n->ln_w->data[i]; /* now the gradient of xhat */
            m1 += d[i], m2 += d[i] * xh[i];
        }
        m1 /= H, m2 /= H;
        for (i = 0; i < H; i++) { /* through the normalisation, then into fc1 */
            float da = n->inv_std[r] * (float)(d[i] - m1 - xh[i] * m2);
            n->b1->grad[i] += da;
            for (j = 0; j < IN; j++) n->w1->grad[(size_t)i * IN + j] += da * n->x[(size_t)r * IN + j];
        }
    }
    DDP_CHECK(ddp_param_grad_ready(n->ln_b));
    DDP_CHECK(ddp_param_grad_ready(n->ln_w));
    DDP_CHECK(ddp_param_grad_ready(n->b1));
    DDP_CHECK(ddp_param_grad_ready(n->w1));
    DDP_CHECK(ddp_unit_end(n->m, 1, DDP_BACKWARD));
    DDP_CHECK(ddp_unit_end(n->m, 0, DDP_BACKWARD)); /* DDP waits for the all-reduces here */
    free(dh);
}

/* nanoGPT's schedule: linear warmup over the first tenth of the steps, then a cosine down to a
   tenth of the peak. */
static float lr_at(long step, long steps, float peak) {
    long warmup = steps / 10 > 0 ? steps / 10 : 1;
    double progress;
    if (step < warmup) return peak * (float)(step + 1) / (float)warmup;
    progress = (double)(step - warmup) / (double)(steps - warmup > 0 ? steps - warmup : 1);
    return (float)(peak / 10 + 0.5 * (peak - peak / 10) * (1 + cos(3.14159265358979 * progress)));
}

/* The sum of this rank's weights: replicas that stay in step agree to the last digit. */
static double weight_sum(ddp_model* m) {
    double sum = 0;
    int i;
    size_t j;
    for (i = 0; i < ddp_model_num_params(m); i++)
        for (j = 0; j < ddp_model_param(m, i)->count; j++) sum += ddp_model_param(m, i)->data[j];
    return sum;
}

static int train(int rank, void* arg) {
    const options* opt = (const options*)arg;
    ddp_dataset all, data, test;
    ddp_desc desc = {.device = {.type = DDP_DEVICE_CPU}};
    ddp_wrap_desc wd = {0};
    ddp_optim_desc od = {.kind = DDP_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f};
    ddp_sampler_desc sd = {0};
    ddp_pg* pg;
    ddp_wrapper* ddp;
    ddp_optim* optim;
    ddp_sampler sampler;
    ddp_loader loader;
    net n;
    long step = 0, steps;
    int epoch, r;
    float norm = 0;

    DDP_CHECK(ddp_dataset_load(opt->data, opt->data_dir, &all));
    DDP_CHECK(ddp_dataset_split(&all, 0.2, 42, &data, &test));
    ddp_dataset_standardize(&data, &test);
    DDP_CHECK(ddp_init(&desc, &pg));
    rank = ddp_rank(pg);

    net_create(&n, data.nfeatures, opt->hidden, all.nclasses, opt->batch_size > test.n ? opt->batch_size : test.n,
               opt->seed);
    wd.zero_stage = opt->zero_stage;
    DDP_CHECK(ddp_wrap(pg, n.m, &wd, &ddp)); /* your tensors, hooked and bucketed like the MLP's */
    od.lr = opt->lr;
    DDP_CHECK(ddp_optim_create(n.m, &od, &optim));
    if (rank == 0)
        printf("your model: %d -> %d (layernorm, relu) -> %d, %zu parameters in %d tensors, zero_stage %d, %d ranks\n",
               data.nfeatures, opt->hidden, all.nclasses, ddp_model_num_elements(n.m), ddp_model_num_params(n.m),
               opt->zero_stage, ddp_world_size(pg));

    sd.seed = opt->seed, sd.pg = pg;
    DDP_CHECK(ddp_sampler_init(&sampler, data.n, &sd));
    DDP_CHECK(ddp_loader_init(&loader, &data, &(ddp_loader_desc){.batch_size = opt->batch_size}));
    steps = (long)opt->epochs * ((sampler.num_samples + opt->batch_size - 1) / opt->batch_size);
    for (epoch = 1; epoch <= opt->epochs; epoch++) {
        const float* xb;
        const int* yb;
        double loss_sum = 0;
        int rows;
        ddp_sampler_set_epoch(&sampler, epoch);
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        while ((rows = ddp_loader_next(&loader, &xb, &yb)) > 0) {
            float loss;
            DDP_CHECK(ddp_optim_set_lr(optim, lr_at(step++, steps, opt->lr)));
            DDP_CHECK(ddp_model_zero_grad(n.m));
            net_forward(&n, xb, yb, rows, &loss, NULL);
            net_backward(&n);
            if (opt->clip > 0) DDP_CHECK(ddp_optim_clip_grad_norm(optim, opt->clip, &norm)); /* every rank: one norm */
            DDP_CHECK(ddp_optim_step(optim));
            loss_sum += (double)loss * rows;
        }
        if (rank == 0 && (epoch % 10 == 0 || epoch == opt->epochs)) {
            printf("epoch %3d/%d  loss %.4f  lr %.2e", epoch, opt->epochs, loss_sum / sampler.num_samples,
                   lr_at(step - 1, steps, opt->lr));
            if (opt->clip > 0) printf("  gradient norm %.3f", norm); /* the last step's, before clipping */
            printf("\n");
        }
    }

    /* Evaluate on rank 0. Under ZeRO-3 every rank first gathers the whole model (collective). */
    DDP_CHECK(ddp_full_params(ddp, 1));
    if (rank == 0) {
        float loss;
        int correct;
        net_forward(&n, test.x, test.y, test.n, &loss, &correct);
        printf("test loss: %.4f\ntest accuracy: %.4f\n", loss, (double)correct / test.n);
    }
    for (r = 0; r < ddp_world_size(pg); r++) { /* every replica the same, to the last digit */
        if (r == rank) printf("rank %d: sum of the weights %.9f\n", rank, weight_sum(n.m)), fflush(stdout);
        DDP_CHECK(ddp_barrier(pg));
    }
    DDP_CHECK(ddp_full_params(ddp, 0));

    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_wrapper_destroy(ddp), ddp_destroy(pg);
    net_free(&n);
    ddp_dataset_free(&data), ddp_dataset_free(&test), ddp_dataset_free(&all);
    return 0;
}

int main(int argc, char** argv) {
    options opt = parse_args(argc, argv);
    return ddp_spawn(opt.nproc, train, &opt) == DDP_OK ? 0 : 1;
}
