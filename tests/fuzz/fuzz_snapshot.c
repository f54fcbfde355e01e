/* tests/fuzz/fuzz_snapshot.c: libFuzzer target for the >>snapshot reader.

   Every input goes to ddp__st_parse, the safetensors header parser. When it accepts the input,
   the harness checks what the parser promises (every tensor F32, its bytes exactly its shape's,
   the tensors tiling the data section, the checksum's digits inside the header) and then loads
   the bytes, from a file, into a fixed small job (a 3 -> 4 -> 2 MLP with Adam, a sampler, a
   loader, a generator): once as they are, and once with the checksum recomputed so that the
   checks behind it are reached too. A refused load must return DDP_ERR_CHECKPOINT and leave the
   job exactly as it was; an accepted one must have copied the file's tensors. Any broken promise
   calls abort(), which libFuzzer reports as a crash with the input.

   Build:  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DDDP_NO_CUDA \
             -I. tests/fuzz/fuzz_snapshot.c -o fuzz_snapshot -lpthread -lm      (or: make fuzz)
   Seeds:  DDP_FUZZ_WRITE_SEEDS=DIR ./fuzz_snapshot   writes valid snapshots of the job to DIR and
           exits; tests/fuzz/corpus_snapshot/ holds a few more. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__extension__ typedef unsigned __int128 u128; /* exact products of shapes */

static const int g_sizes[] = {3, 4, 2};
static ddp_model* g_model;
static ddp_optim* g_optim;
static ddp_sampler g_sampler;
static ddp_loader g_loader;
static ddp_dataset g_data;
static ddp_rng g_rng;
static ddp_snapshot g_snap;
static char g_path[64];
static float* g_ref;   /* the job's floats as they must stay: parameters, then Adam's moments */
static size_t g_nref;
static ddp__st g_st;   /* large: kept out of the stack */
static unsigned char* g_buf;
static size_t g_cap;

static void quiet(ddp_log_level level, const char* line, void* user) { (void)level, (void)line, (void)user; }

static void cleanup(void) {
    if (g_path[0]) unlink(g_path);
}

/* Every float the job holds, in a fixed order, into out (NULL: just count). */
static size_t job_floats(float* out) {
    size_t n = 0;
    int i, k;
    for (i = 0; i < ddp_model_num_params(g_model); i++) {
        ddp_param* p = ddp_model_param(g_model, i);
        float* src[3];
        src[0] = p->data, src[1] = g_optim->state1[i], src[2] = g_optim->state2[i];
        for (k = 0; k < 3; k++) {
            if (out) memcpy(out + n, src[k], p->count * sizeof(float));
            n += p->count;
        }
    }
    return n;
}
static void job_reset(void) { /* put the floats and counters back */
    size_t n = 0;
    int i, k;
    for (i = 0; i < ddp_model_num_params(g_model); i++) {
        ddp_param* p = ddp_model_param(g_model, i);
        float* dst[3];
        dst[0] = p->data, dst[1] = g_optim->state1[i], dst[2] = g_optim->state2[i];
        for (k = 0; k < 3; k++) {
            memcpy(dst[k], g_ref + n, p->count * sizeof(float));
            n += p->count;
        }
    }
    g_optim->steps = 5;
    ddp_sampler_set_epoch(&g_sampler, 1);
    g_loader.resume_pos = 0;
    g_rng.state = 12345;
    g_snap.epoch = -1;
    g_snap.step = -1;
}
static int job_unchanged(void) {
    static float* now;
    if (!now) now = (float*)malloc(g_nref * sizeof(float));
    job_floats(now);
    return !memcmp(now, g_ref, g_nref * sizeof(float)) && g_optim->steps == 5 && g_sampler.epoch == 1 &&
           g_loader.resume_pos == 0 && g_rng.state == 12345 && g_snap.epoch == -1 && g_snap.step == -1;
}

static void die(const char* what) {
    fprintf(stderr, "fuzz_snapshot: %s (last error: %s: %s)\n", what, ddp_status_name(ddp__last_status()),
            ddp_error_string());
    abort();
}

/* Save the job in a few shapes to dir (the seed corpus), then exit. */
static void write_seeds(const char* dir) {
    char p[512];
    ddp_snapshot s = g_snap;
    int i;
    for (i = 0; i < 5; i++) {
        s = g_snap;
        s.epoch = i, s.step = 10 * i;
        if (i == 1) s.optim = NULL;
        if (i == 2) s.sampler = NULL, s.loader = NULL;
        if (i == 3) s.rng = NULL;
        if (i == 4) g_loader.pos = 3;
        snprintf(p, sizeof p, "%s/seed_snapshot_%d.safetensors", dir, i);
        if (ddp_snapshot_save(&s, p) != DDP_OK) die("writing a seed failed");
    }
    g_loader.pos = 0;
    exit(0);
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    ddp_model_desc md;
    ddp_optim_desc od;
    ddp_sampler_desc sd;
    int i, fd;
    (void)argc, (void)argv;
    ddp__set_log(quiet, NULL);
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 1;
    if (ddp_model_mlp(&md, g_sizes, 3, DDP_LAYER_RELU, &g_model) != DDP_OK) die("model");
    memset(&od, 0, sizeof od);
    od.kind = DDP_ADAM;
    if (ddp_optim_create(g_model, &od, &g_optim) != DDP_OK) die("optimizer");
    for (i = 0; i < ddp_model_num_params(g_model); i++) { /* moments that are not all zero */
        size_t k;
        for (k = 0; k < ddp_model_param(g_model, i)->count; k++) {
            g_optim->state1[i][k] = 0.25f * (float)k - 1.f;
            g_optim->state2[i][k] = 0.5f + (float)k;
        }
    }
    g_data.n = 50, g_data.nfeatures = 3, g_data.nclasses = 2;
    g_data.x = (float*)calloc(50 * 3, sizeof(float));
    g_data.y = (int*)calloc(50, sizeof(int));
    memset(&sd, 0, sizeof sd);
    sd.num_replicas = 2, sd.rank = 1, sd.seed = 7;
    if (ddp_sampler_init(&g_sampler, 50, &sd) != DDP_OK) die("sampler");
    if (ddp_loader_init(&g_loader, &g_data, &(ddp_loader_desc){.batch_size = 4}) != DDP_OK) die("loader");
    g_snap.model = g_model, g_snap.optim = g_optim, g_snap.sampler = &g_sampler, g_snap.loader = &g_loader;
    g_snap.rng = &g_rng;
    g_nref = job_floats(NULL);
    g_ref = (float*)malloc(g_nref * sizeof(float));
    job_floats(g_ref);
    job_reset();
    if (getenv("DDP_FUZZ_WRITE_SEEDS")) write_seeds(getenv("DDP_FUZZ_WRITE_SEEDS"));
    snprintf(g_path, sizeof g_path, "/tmp/ddp_fuzz_snapshot.XXXXXX");
    fd = mkstemp(g_path);
    if (fd < 0) die("mkstemp");
    close(fd);
    atexit(cleanup);
    return 0;
}

/* What ddp__st_parse promises about a file it accepts. */
static void check_parse(const uint8_t* data, size_t size) {
    uint64_t hlen = 0, end = 0;
    int i, d, k;
    for (i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    if (size < 8 || hlen < 2 || hlen > size - 8 || g_st.data_off != 8 + hlen) die("accepted a bad header length");
    if (g_st.nt < 0 || g_st.nt > DDP__ST_MAX_TENSORS || g_st.nmeta < 0 || g_st.nmeta > 32) die("table overflow");
    if (g_st.checksum_at && (g_st.checksum_at < 8 || g_st.checksum_at >= g_st.data_off))
        die("the checksum's position is outside the header");
    for (k = 0; k < g_st.nmeta; k++)
        if (!memchr(g_st.meta[k].key, 0, sizeof g_st.meta[k].key) || !memchr(g_st.meta[k].val, 0, sizeof g_st.meta[k].val))
            die("a metadata string is not terminated");
    for (i = 0; i < g_st.nt; i++) {
        const ddp__st_tensor* t = &g_st.t[i];
        u128 elems = 1;
        if (!memchr(t->name, 0, sizeof t->name) || strcmp(t->dtype, "F32") != 0) die("a bad name or dtype");
        if (t->ndim < 0 || t->ndim > 4) die("a bad ndim");
        for (d = 0; d < t->ndim; d++) { /* saturates above 2^64: no 64-bit offset pair can hold that */
            elems *= t->shape[d];
            if (elems > ((u128)1 << 64)) elems = ((u128)1 << 64) + 1;
        }
        /* exact arithmetic: the tensor's bytes are its shape's, with no 64-bit wrap-around */
        if (t->begin != end || t->end < t->begin || (u128)(t->end - t->begin) != elems * 4)
            die("a tensor's data_offsets do not hold its shape, or the tensors do not tile the data");
        end = t->end;
    }
    if (end != size - g_st.data_off) die("the tensors do not cover the data section");
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FILE* f;
    int pass;
    if (ddp__st_parse(data, size, "fuzz", &g_st) != DDP_OK) {
        if (ddp__last_status() != DDP_ERR_CHECKPOINT) die("the parser failed with another status");
        return 0;
    }
    check_parse(data, size);
    if (size + 1 > g_cap) {
        free(g_buf);
        g_cap = size + 1;
        g_buf = (unsigned char*)malloc(g_cap);
    }
    memcpy(g_buf, data, size);
    for (pass = 0; pass < 2; pass++) {
        ddp_status s;
        if (pass == 1) { /* the checksum recomputed: reach the checks behind it */
            char hex[17];
            const char* v = ddp__st_get(&g_st, "checksum");
            if (!g_st.checksum_at || !v || strlen(v) != 16) break;
            memset(g_buf + g_st.checksum_at, '0', 16);
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ddp__fnv1a(g_buf, size));
            memcpy(g_buf + g_st.checksum_at, hex, 16);
        }
        f = fopen(g_path, "wb");
        if (!f || fwrite(g_buf, 1, size, f) != size || fclose(f) != 0) die("cannot write the temporary file");
        job_reset();
        s = ddp_snapshot_load(&g_snap, g_path);
        if (s != DDP_OK) {
            if (s != DDP_ERR_CHECKPOINT) die("a load failed with a status other than DDP_ERR_CHECKPOINT");
            if (!job_unchanged()) die("a refused load changed the job");
            if (!strstr(ddp_error_string(), g_path)) die("the message does not name the file");
        } else {
            /* accepted: the parameters are the file's bytes */
            int i, k;
            if (ddp__st_parse(g_buf, size, "fuzz", &g_st) != DDP_OK) die("a loaded file does not parse");
            for (i = 0; i < ddp_model_num_params(g_model); i++) {
                ddp_param* p = ddp_model_param(g_model, i);
                for (k = 0; k < g_st.nt && strcmp(g_st.t[k].name, p->name); k++) {
                }
                if (k == g_st.nt) die("a load succeeded without the parameter's tensor");
                if (memcmp(p->data, g_buf + g_st.data_off + g_st.t[k].begin, p->count * sizeof(float)))
                    die("a loaded parameter differs from the file");
            }
            if (g_loader.resume_pos < 0) die("a negative loader position");
        }
    }
    job_reset();
    return 0;
}
