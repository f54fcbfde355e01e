/* labs/resume/test.c: the tests of lab "resume", built together with the student's file and
   ddp.h's implementation.

   Every run of the student's lab_train happens in a child process: lab_after_step logs each step
   into shared memory and calls _exit at the step named by LAB_KILL_AT_STEP (a crash, as far as
   the run can tell); lab_finished copies the final weights out. A case runs the loop once without
   snapshots for the reference weights, then runs it with snapshots, killed at the chosen steps
   and started again after each kill, and compares: where each restart began, and the final
   weights, bit for bit. */
#include "../lab_test.h"

#include <dirent.h>
#include <sys/stat.h>

#include "ddp.h"
#include "resume.h"

#define EPOCHS 4
#define BATCH 16
#define SAMPLES 90 /* 6 batches per epoch (the last one of 10): 24 steps */
#define PER_EPOCH ((SAMPLES + BATCH - 1) / BATCH)
#define TOTAL_STEPS (EPOCHS * PER_EPOCH)
#define KILLED 42  /* the exit status of a run killed by the harness */
#define MAX_LOG 512
#define MAX_W 1024

/* A snapshot file as the harness saw it after a step: a hash of its bytes (0: no file), the step
   its metadata names, and whether its weights are those the uninterrupted run had after that step
   (1), after the step before (2), other (0), or could not be read (-1). */
typedef struct seen {
    uint64_t hash;
    long step;
    int w;
} seen;

typedef struct record {
    int run;                    /* the run now going: 0, 1, ... */
    int nlog;
    long log_step[MAX_LOG];     /* every lab_after_step, in order */
    int log_run[MAX_LOG];
    seen log_new[MAX_LOG];      /* the files at snapshot_path and previous_path at that moment */
    seen log_prev[MAX_LOG];
    int finished;               /* lab_finished was called (in the last run) */
    int first_seen[8];          /* run k has logged a step: its weights after that first step */
    float first_w[8][MAX_W];
    size_t nweights;
    float weights[MAX_W];
    int nparams;
    char names[16][48];
    size_t counts[16];
} record;

static record* g_rec;
static float g_ref[MAX_W]; /* the reference run's final weights */
static size_t g_nref;
static float (*g_step_w)[MAX_W]; /* shared: the weights after each step of the reference run */
static int g_recording;          /* set while the reference run goes */
static int g_watch;              /* set while a run with snapshots goes: look at its files */
static char g_path[512], g_prev[512];

/* The model's weights, one parameter after another, into dst (up to MAX_W); their number. */
static size_t copy_weights(ddp_model* model, float* dst) {
    int i;
    size_t n = 0;
    for (i = 0; i < ddp_model_num_params(model); i++) {
        ddp_param* p = ddp_model_param(model, i);
        if (n + p->count <= MAX_W) memcpy(dst + n, p->data, p->count * sizeof(float));
        n += p->count;
    }
    return n;
}

/* What a snapshot file holds, read by the harness (never through the student's structs). */
typedef struct snapinfo {
    int exists, loads; /* a file is there; ddp_snapshot_load takes it (into a model of its own) */
    seen s;
    int has_optim, has_loader;
    char holds[700];   /* its tensors' names and its metadata, in words */
} snapinfo;

static uint64_t hash_bytes(const unsigned char* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h | 1; /* never 0, which means "no file" */
}

static void append(char* dst, size_t cap, const char* fmt, const char* a, const char* b) {
    size_t at = strlen(dst);
    if (at + 1 < cap) snprintf(dst + at, cap - at, fmt, a, b);
}

static void read_snapshot(const char* path, snapinfo* si) {
    FILE* f = fopen(path, "rb");
    unsigned char* buf = NULL;
    long size = 0;
    uint64_t hlen = 0;
    int k;
    memset(si, 0, sizeof *si);
    si->s.step = -1, si->s.w = -1;
    if (!f) return;
    si->exists = 1;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = (unsigned char*)malloc((size_t)size + 1)) != NULL && fread(buf, 1, (size_t)size, f) == (size_t)size) {
        si->s.hash = hash_bytes(buf, (size_t)size);
        for (k = 7; k >= 0 && size >= 8; k--) hlen = hlen << 8 | buf[k];
    } else
        si->s.hash = 1;
    fclose(f);
    if (buf && size >= 8 && hlen <= (uint64_t)size - 8) { /* the header: metadata, then tensors */
        char* json = (char*)buf + 8;
        char *at, *meta_end, tensors[400] = "", meta[300] = "";
        json[hlen] = 0;
        at = strstr(json, "\"__metadata__\":{");
        meta_end = at ? strchr(at + 16, '}') : NULL;
        if (at && meta_end) {
            char *key = at + 16, *val, *q;
            *meta_end = 0;
            while ((key = strchr(key, '"')) != NULL && (q = strchr(key + 1, '"')) != NULL &&
                   (val = strchr(q + 1, '"')) != NULL && strchr(val + 1, '"')) {
                char* vend = strchr(val + 1, '"');
                static const char* skip[] = {"format", "checksum", "lr", "betas", "eps", "weight_decay", "momentum",
                                             "no_decay", "sampler_n", "sampler_replicas", "sampler_seed",
                                             "sampler_shuffle", "sampler_drop_last", NULL};
                int i, shown = 1;
                *q = 0, *vend = 0;
                for (i = 0; skip[i]; i++) shown = shown && strcmp(key + 1, skip[i]) != 0;
                if (!strcmp(key + 1, "step")) si->s.step = atol(val + 1);
                if (!strcmp(key + 1, "loader_position")) si->has_loader = 1;
                if (shown) append(meta, sizeof meta, meta[0] ? ", %s %s" : "%s %s", key + 1, val + 1);
                key = vend + 1;
            }
            at = meta_end + 1;
            while ((q = strstr(at, "\":{\"dtype\"")) != NULL) { /* "name":{"dtype":... */
                char* name = q;
                while (name > at && name[-1] != '"') name--;
                *q = 0;
                if (!strncmp(name, "optim.", 6)) si->has_optim = 1;
                append(tensors, sizeof tensors, tensors[0] ? "%s%s" : "%s%s", tensors[0] ? ", " : "", name);
                at = q + 1;
            }
        }
        snprintf(si->holds, sizeof si->holds, "tensors %s; metadata %s", tensors[0] ? tensors : "(none)",
                 meta[0] ? meta : "(none)");
    } else
        snprintf(si->holds, sizeof si->holds, "%ld bytes without a readable header", size);
    free(buf);
    { /* does it load, and whose weights are these? */
        int sizes[3] = {6, 16, 3};
        ddp_model* m;
        ddp_model_desc md;
        ddp_snapshot snap;
        float w[MAX_W];
        size_t n;
        memset(&md, 0, sizeof md);
        md.device.type = DDP_DEVICE_CPU;
        memset(&snap, 0, sizeof snap);
        if (ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &m) != DDP_OK) return;
        snap.model = m;
        if (ddp_snapshot_load(&snap, path) == DDP_OK) {
            si->loads = 1;
            si->s.step = snap.step;
            n = copy_weights(m, w);
            si->s.w = 0;
            if (g_step_w && snap.step >= 1 && snap.step <= TOTAL_STEPS && n <= MAX_W) {
                if (!memcmp(w, g_step_w[snap.step], n * sizeof(float))) si->s.w = 1;
                else if (snap.step > 1 && !memcmp(w, g_step_w[snap.step - 1], n * sizeof(float))) si->s.w = 2;
            }
        }
        ddp_model_destroy(m);
    }
}

void lab_after_step(long step, ddp_model* model) {
    const char* kill_at = getenv("LAB_KILL_AT_STEP");
    if (g_rec->nlog < MAX_LOG) {
        g_rec->log_step[g_rec->nlog] = step;
        g_rec->log_run[g_rec->nlog] = g_rec->run;
        if (g_watch) { /* which snapshots are on disk now */
            snapinfo a;
            read_snapshot(g_path, &a);
            g_rec->log_new[g_rec->nlog] = a.s;
            read_snapshot(g_prev, &a);
            g_rec->log_prev[g_rec->nlog] = a.s;
        }
        g_rec->nlog++;
    }
    if (g_recording && model && step >= 1 && step <= TOTAL_STEPS) copy_weights(model, g_step_w[step]);
    if (model && g_rec->run < 8 && !g_rec->first_seen[g_rec->run]) {
        copy_weights(model, g_rec->first_w[g_rec->run]);
        g_rec->first_seen[g_rec->run] = 1;
    }
    if (kill_at && atol(kill_at) == step) {
        fflush(NULL);
        _exit(KILLED); /* no clean-up, no final save: as a crash */
    }
}

void lab_finished(ddp_model* model) {
    int i;
    g_rec->nparams = ddp_model_num_params(model) < 16 ? ddp_model_num_params(model) : 16;
    for (i = 0; i < g_rec->nparams; i++) {
        ddp_param* p = ddp_model_param(model, i);
        snprintf(g_rec->names[i], sizeof g_rec->names[i], "%s", p->name);
        g_rec->counts[i] = p->count;
    }
    g_rec->nweights = copy_weights(model, g_rec->weights);
    g_rec->finished++;
}

/* "5, 10, 15" (at most cap bytes; "..." when cut) */
static const char* steps_list(const long* v, int n, char* buf, size_t cap) {
    size_t at = 0;
    int i;
    buf[0] = 0;
    for (i = 0; i < n && at + 24 < cap; i++) at += (size_t)snprintf(buf + at, cap - at, "%s%ld", i ? ", " : "", v[i]);
    if (i < n) snprintf(buf + at, cap - at, ", ...");
    if (n == 0) snprintf(buf, cap, "none");
    return buf;
}

/* Rules RS2 and RS6 on the first run of a job (from nothing, never restarted): which steps saved,
   what each snapshot holds, and what previous_path holds after each save. */
static void check_saves(int every) {
    long saved[MAX_LOG], due[MAX_LOG], end = 0, last_step = -1;
    uint64_t last = 0;
    int ns = 0, nd = 0, i, label = 0, before = 0, other = 0, rotation = 0, same;
    char a[300], b[300];
    for (i = 0; i < g_rec->nlog && g_rec->log_run[i] == 0; i++) {
        const seen* n = &g_rec->log_new[i];
        const seen* p = &g_rec->log_prev[i];
        long at = g_rec->log_step[i];
        end = at;
        if (!n->hash || n->hash == last) continue;
        saved[ns++] = at; /* a new snapshot appeared at snapshot_path during step `at` */
        if (n->step != at && !label++)
            lab_failf("[rule RS2: the snapshot taken at step N holds the state after step N] the snapshot written "
                      "during step %ld says it is the snapshot of step %ld", at, n->step);
        else if (n->step == at && n->w == 2 && !before++)
            lab_failf("[rule RS2: save once the step is complete] the snapshot of step %ld holds the weights the "
                      "uninterrupted run had after step %ld: the state before step %ld's optimizer update, not after "
                      "it", at, at - 1, at);
        else if (n->step == at && n->w == 0 && !other++)
            lab_failf("[rule RS2: the snapshot taken at step N holds the state after step N] the snapshot of step %ld "
                      "holds weights that are not those the uninterrupted run had after step %ld", at, at);
        if (last && p->hash != last && !rotation++)
            lab_failf("[rule RS6: keep two snapshots] after the save of step %ld, %s holds %s; expected the snapshot "
                      "that %s held before that save (of step %ld)", at, g_prev,
                      !p->hash ? "nothing" : p->hash == n->hash ? "the same bytes as the newest" :
                      (snprintf(a, sizeof a, "another file (one of step %ld)", p->step), a),
                      g_path, last_step);
        last = n->hash, last_step = n->step;
    }
    for (i = every; every > 0 && i <= end; i += every) due[nd++] = i;
    same = ns == nd;
    for (i = 0; same && i < ns; i++) same = saved[i] == due[i];
    if (nd == 0) snprintf(b, sizeof b, "none yet (the first is due after step %d)", every);
    else steps_list(due, nd, b, 200);
    if (!same && ns == 0)
        lab_failf("[rule RS2: save every save_every steps] up to step %ld of the first run, with save_every = %d, nothing was "
                  "written at %s; snapshots were due after steps: %s", end, every, g_path, b);
    else if (!same)
        lab_failf("[rule RS2: save every save_every steps] up to step %ld of the first run, with save_every = %d, a new snapshot "
                  "appeared at %s during steps %s; they were due after steps: %s", end, every, g_path,
                  steps_list(saved, ns, a, 200), b);
}

/* A small data set that a model can learn: the class is the largest of three linear scores. */
static void make_data(ddp_dataset* d) {
    ddp_rng r = ddp_rng_seed(2024);
    int i, f;
    d->n = SAMPLES, d->nfeatures = 6, d->nclasses = 3;
    d->x = (float*)malloc(sizeof(float) * SAMPLES * 6);
    d->y = (int*)malloc(sizeof(int) * SAMPLES);
    for (i = 0; i < SAMPLES; i++) {
        float s[3] = {0, 0, 0};
        for (f = 0; f < 6; f++) {
            float v = 2 * ddp_rng_uniform(&r) - 1;
            d->x[i * 6 + f] = v;
            s[0] += v * (float)(f - 2), s[1] += v * (float)(f % 3 - 1), s[2] += v * (float)(3 - f);
        }
        d->y[i] = s[0] > s[1] ? (s[0] > s[2] ? 0 : 2) : (s[1] > s[2] ? 1 : 2);
    }
}

/* One start of the training loop in a child process; kill_at > 0 asks for a kill at that step.
   Returns 0 when it finished, KILLED when killed, -1 after reporting anything else. */
static int start_run(const lab_resume_opts* o, long kill_at) {
    pid_t pid;
    int status;
    fflush(NULL);
    pid = fork();
    if (pid < 0) LAB_SKIP("cannot fork: %s", strerror(errno));
    if (pid == 0) {
        char v[32];
        snprintf(v, sizeof v, "%ld", kill_at);
        if (kill_at > 0) setenv("LAB_KILL_AT_STEP", v, 1);
        else unsetenv("LAB_KILL_AT_STEP");
        lab_train(o);
        fflush(NULL);
        _exit(0);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == KILLED)) {
        if (kill_at > 0 && WEXITSTATUS(status) == 0)
            lab_failf("[rule RS1: resume where the snapshot was taken] run %d was to be killed at step %ld, but it ended "
                      "before reaching that step", g_rec->run, kill_at);
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status))
        lab_failf("run %d was killed by signal %d (%s): a crash in lab_train", g_rec->run, WTERMSIG(status),
                  strsignal(WTERMSIG(status)));
    else
        lab_failf("run %d exited with status %d (a failed DDP_CHECK? its message is above)", g_rec->run,
                  WEXITSTATUS(status));
    return -1;
}

/* What a case does to the newest snapshot between the first kill and the restart. */
enum { INTACT, FLIP_A_BIT, CUT_IN_HALF, MOVED_ASIDE };

/* Damage snapshot_path as `how` says; describe it in words into what. */
static void damage(int how, const lab_resume_opts* o, char* what, size_t cap) {
    snapinfo a;
    FILE* f;
    read_snapshot(o->snapshot_path, &a);
    what[0] = 0;
    if (how == INTACT || !a.exists) return;
    if (how == FLIP_A_BIT && (f = fopen(o->snapshot_path, "r+b")) != NULL) {
        int c;
        if (fseek(f, -1, SEEK_END) == 0 && (c = fgetc(f)) != EOF && fseek(f, -1, SEEK_END) == 0) fputc(c ^ 0x10, f);
        fclose(f);
        snprintf(what, cap, "the test flipped one bit of %s (the newest snapshot, of step %ld), as a failing disk can",
                 o->snapshot_path, a.s.step);
    } else if (how == CUT_IN_HALF) {
        struct stat st;
        if (stat(o->snapshot_path, &st) == 0 && truncate(o->snapshot_path, st.st_size / 2) == 0)
            snprintf(what, cap, "the test cut %s (the newest snapshot, of step %ld) to half its length, as a copy cut "
                     "short leaves it", o->snapshot_path, a.s.step);
    } else if (how == MOVED_ASIDE && rename(o->snapshot_path, o->previous_path) == 0)
        snprintf(what, cap, "the test left nothing at %s and the snapshot of step %ld at %s, as a crash in the middle "
                 "of a save can leave them", o->snapshot_path, a.s.step, o->previous_path);
}

/* A whole job: started, killed at kills[0], started again, killed at kills[1], ..., and started
   once more to run to the end; the newest snapshot damaged as `how` says before the first restart.
   Checks the saves of the first run (RS2, RS6), where each restart began (RS1, RS6), its first
   step (RS3) and how many steps the job took. Returns 1 if it finished. */
static int run_job(const char* dir, int save_every, const long* kills, int nkills, int how) {
    static ddp_dataset data;
    lab_resume_opts o;
    snapinfo from; /* the snapshot the last restart should have resumed from */
    int k, i;
    if (!data.n) make_data(&data);
    snprintf(g_path, sizeof g_path, "%s/snap%d.safetensors", dir, save_every);
    snprintf(g_prev, sizeof g_prev, "%s/snap%d.previous.safetensors", dir, save_every);
    memset(&o, 0, sizeof o);
    o.data = &data, o.snapshot_path = g_path, o.previous_path = g_prev, o.save_every = save_every;
    o.epochs = EPOCHS, o.batch_size = BATCH, o.seed = 5;
    memset(g_rec, 0, sizeof *g_rec);
    memset(&from, 0, sizeof from);
    g_watch = save_every > 0;
    for (k = 0; k <= nkills; k++) {
        int first_log = g_rec->nlog, st;
        long first, want_first = 1, last, s = 0;
        char damaged[600] = "", where[700] = "";
        g_rec->run = k;
        if (k > 0) { /* what is on disk: the newest snapshot that loads is where the restart must begin */
            snapinfo a, b;
            if (k == 1) damage(how, &o, damaged, sizeof damaged);
            read_snapshot(g_path, &a);
            read_snapshot(g_prev, &b);
            if (a.loads) from = a;
            else if (b.loads) from = b;
            else memset(&from, 0, sizeof from);
            s = from.loads ? from.s.step : 0;
            want_first = s + 1;
            if (from.loads)
                snprintf(where, sizeof where, "%s holds the snapshot of step %ld, which loads",
                         a.loads ? g_path : g_prev, s);
            else
                snprintf(where, sizeof where, "no snapshot that loads is on disk");
        }
        st = start_run(&o, k < nkills ? kills[k] : 0);
        if (st < 0) {
            if (damaged[0])
                lab_failf("[rule RS6: resume from the newest snapshot that loads] before run %d %s; %s. Expected: run "
                          "%d %s; it stopped instead (above)", k, damaged, where, k,
                          from.loads ? "resumes after that step" : "starts from the beginning");
            return 0;
        }
        if (g_rec->nlog == first_log) {
            lab_failf("[rule RS5: call lab_after_step after every step] run %d called lab_after_step not once", k);
            return 0;
        }
        if (k == 0 && save_every > 0) check_saves(save_every);
        first = g_rec->log_step[first_log], last = g_rec->log_step[g_rec->nlog - 1];
        if (k > 0 && first != want_first) {
            if (first == 1 && s > 0 && k < 8 && g_nref && g_rec->first_seen[k] &&
                !memcmp(g_rec->first_w[k], g_step_w[want_first], sizeof(float) * g_nref))
                lab_failf("[rule RS1: the first step after a restart is the one after the snapshot's] after the kill at "
                          "step %ld the restarted run carried on from the snapshot of step %ld (the weights after its "
                          "first step are those of step %ld) but reported that step as step 1", kills[k - 1], s,
                          want_first);
            else if (damaged[0])
                lab_failf("[rule RS6: resume from the newest snapshot that loads] before run %d %s; %s. Expected: run "
                          "%d begins at step %ld; it began at step %ld%s", k, damaged, where, k, want_first, first,
                          first == 1 ? ", from scratch" : "");
            else if (first == 1)
                lab_failf("[rule RS1: resume from the snapshot] after the kill at step %ld the restarted run began at "
                          "step 1, from scratch; %s, so it should begin at step %ld", kills[k - 1], where, want_first);
            else
                lab_failf("[rule RS1: the first step after a restart is the one after the snapshot's] after the kill at "
                          "step %ld the restarted run began at step %ld; %s, so it should begin at step %ld",
                          kills[k - 1], first, where, want_first);
        } else if (k > 0 && s > 0 && from.s.w == 1 && k < 8 && g_nref && g_rec->first_seen[k] &&
                   want_first <= TOTAL_STEPS &&
                   memcmp(g_rec->first_w[k], g_step_w[want_first], sizeof(float) * g_nref)) {
            size_t differ = 0, j;
            for (j = 0; j < g_nref; j++) differ += memcmp(&g_rec->first_w[k][j], &g_step_w[want_first][j], sizeof(float)) != 0;
            lab_failf("[rule %s] run %d resumed from the snapshot of step %ld, whose weights are exactly those the "
                      "uninterrupted run had after step %ld; yet its first step, step %ld, gave other weights than the "
                      "uninterrupted run's step %ld (%zu of %zu values differ). The snapshot holds: %s. What else did "
                      "the uninterrupted run's step %ld read?",
                      !from.has_optim || !from.has_loader
                          ? "RS3: the snapshot holds every piece of state the next step reads"
                          : "RS4: bit for bit",
                      k, s, s, want_first, want_first, differ, g_nref, from.holds, want_first);
        }
        for (i = first_log + 1; i < g_rec->nlog; i++)
            if (g_rec->log_step[i] != g_rec->log_step[i - 1] + 1) {
                lab_failf("[rule RS5: the true step number] run %d reported step %ld after step %ld; steps go up by "
                          "one", k, g_rec->log_step[i],
                          g_rec->log_step[i - 1]);
                break;
            }
        if (k == nkills && last != TOTAL_STEPS) {
            long s0 = from.loads ? from.s.step : 0, ran = last - first + 1, left = TOTAL_STEPS - (first - 1);
            if (k == 0 || !from.loads || first != s0 + 1)
                lab_failf("[rule RS1: carry on in the epoch the snapshot was taken in] the last run ended at step %ld; "
                          "the job has %d steps (%d epochs of %d batches)", last, TOTAL_STEPS, EPOCHS, PER_EPOCH);
            else
                lab_failf("[rule %s] the last run resumed from the snapshot of step %ld, taken after batch %ld of epoch "
                          "%ld, and took %ld steps where %ld remained (the job has %d steps: %d epochs of %d batches): "
                          "%ld batch(es) %s than the uninterrupted run from there on.%s%s",
                          ran > left && !from.has_loader ? "RS3: the snapshot holds every piece of state the next step "
                                                           "reads"
                                                         : "RS1: carry on in the epoch the snapshot was taken in",
                          s0, (s0 - 1) % PER_EPOCH + 1, (s0 - 1) / PER_EPOCH + 1, ran, left, TOTAL_STEPS, EPOCHS,
                          PER_EPOCH, ran > left ? ran - left : left - ran, ran > left ? "more" : "fewer",
                          ran > left && !from.has_loader ? " The snapshot holds: " : "",
                          ran > left && !from.has_loader ? from.holds : "");
        }
    }
    g_watch = 0;
    if (!g_rec->finished) {
        lab_failf("[rule RS5: call lab_finished at the end] lab_finished(model) was never called: the tests cannot see "
                  "the final weights");
        return 0;
    }
    return 1;
}

static char g_dir[256];
static void setup(void) {
    const char* tmp = getenv("TMPDIR");
    int k;
    g_rec = (record*)lab_shared(sizeof(record));
    if (!g_rec) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    snprintf(g_dir, sizeof g_dir, "%s/lab_resume.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) LAB_SKIP("cannot make a temporary folder %s: %s", g_dir, strerror(errno));
    /* the reference: the same loop, never saving, never killed, its weights after every step kept */
    g_step_w = (float(*)[MAX_W])lab_shared(sizeof(float) * MAX_W * (TOTAL_STEPS + 1));
    if (!g_step_w) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    g_recording = 1;
    k = run_job(g_dir, 0, NULL, 0, INTACT);
    g_recording = 0;
    if (!k) {
        lab_note("(that was the reference run: no snapshots, no kill)");
        return;
    }
    g_nref = g_rec->nweights;
    memcpy(g_ref, g_rec->weights, sizeof(float) * (g_nref < MAX_W ? g_nref : MAX_W));
}

/* Remove the temporary folder and the files in it (snapshots and their temporary files). */
static void cleanup(void) {
    DIR* d = g_dir[0] ? opendir(g_dir) : NULL;
    struct dirent* e;
    char p[600];
    if (!d) return;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    if (rmdir(g_dir) != 0) lab_note("could not remove %s: %s", g_dir, strerror(errno));
}

/* The final weights against the reference, bit for bit. */
static void expect_reference_weights(const char* what) {
    size_t i, differ = 0, first = 0;
    if (!g_nref) return;
    if (g_rec->nweights != g_nref) {
        lab_failf("%s: %zu weights, the reference run has %zu", what, g_rec->nweights, g_nref);
        return;
    }
    for (i = 0; i < g_nref; i++)
        if (memcmp(&g_rec->weights[i], &g_ref[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    if (differ) {
        size_t off = 0;
        int p = 0;
        while (p < g_rec->nparams - 1 && first >= off + g_rec->counts[p]) off += g_rec->counts[p++];
        lab_failf("[rule RS4: bit for bit] %s: the final weights differ from the uninterrupted run's in %zu of %zu "
                  "values; the first is %s[%zu] = %.9g, uninterrupted %.9g", what, differ, g_nref, g_rec->names[p],
                  first - off, (double)g_rec->weights[first], (double)g_ref[first]);
    }
}

static const char* const damage_words[] = {"", ", the newest snapshot then damaged (one bit flipped)",
                                           ", the newest snapshot then cut in half",
                                           ", then a crash in the middle of a save"};

static void killed_job(int save_every, const long* kills, int nkills, int how) {
    char what[200];
    size_t pos = 0;
    int k;
    setup();
    pos += (size_t)snprintf(what, sizeof what, "snapshot every %d steps, killed at step", save_every);
    for (k = 0; k < nkills; k++) pos += (size_t)snprintf(what + pos, sizeof what - pos, "%s %ld", k ? " and" : "", kills[k]);
    snprintf(what + pos, sizeof what - pos, "%s", damage_words[how]);
    if (g_nref && run_job(g_dir, save_every, kills, nkills, how)) expect_reference_weights(what);
    cleanup();
}

/* ---- the cases ----------------------------------------------------------------------------- */

static void uninterrupted_run_writes_snapshots(void) {
    setup();
    if (g_nref && run_job(g_dir, 5, NULL, 0, INTACT))
        expect_reference_weights("saving a snapshot every 5 steps (never killed)");
    cleanup();
}

static void killed_mid_epoch(void) {
    long kills[1] = {13}; /* last snapshot: step 10, batch 4 of epoch 2 */
    killed_job(5, kills, 1, INTACT);
}

static void killed_right_after_a_save(void) {
    long kills[1] = {10};
    killed_job(5, kills, 1, INTACT);
}

static void killed_before_the_first_save(void) {
    long kills[1] = {3};
    killed_job(5, kills, 1, INTACT);
}

static void killed_twice(void) {
    long kills[2] = {7, 17};
    killed_job(5, kills, 2, INTACT);
}

static void killed_after_an_epoch_boundary_save(void) {
    long kills[1] = {14}; /* snapshots at the end of each epoch (every 6 steps): resume at epoch 3 */
    killed_job(6, kills, 1, INTACT);
}

/* Rule RS6: the newest snapshot does not load, or is not there; the one before it does. */
static void newest_snapshot_damaged(void) {
    long kills[1] = {13}; /* snapshots of steps 10 (damaged) and 5: resume at step 6 */
    killed_job(5, kills, 1, FLIP_A_BIT);
}

static void newest_snapshot_cut_short(void) {
    long kills[1] = {17}; /* snapshots of steps 15 (cut) and 10: resume at step 11 */
    killed_job(5, kills, 1, CUT_IN_HALF);
}

static void crash_in_the_middle_of_a_save(void) {
    long kills[1] = {12}; /* nothing at snapshot_path, step 10 at previous_path: resume at step 11 */
    killed_job(5, kills, 1, MOVED_ASIDE);
}

static void only_snapshot_damaged(void) {
    long kills[1] = {8}; /* one snapshot (step 5), damaged, none before it: start from the beginning */
    killed_job(5, kills, 1, FLIP_A_BIT);
}

/* Kills at steps drawn from the seed (LAB_SEED), with a save interval and a damage drawn too. */
static void killed_at_random_steps(void) {
    lab_rng g;
    long kills[2];
    int every, nk, how;
    lab_rng_seed(&g, lab_seed(), 31);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    every = 1 + (int)lab_rng_below(&g, 8);
    nk = 1 + (int)lab_rng_below(&g, 2);
    kills[0] = 1 + (long)lab_rng_below(&g, TOTAL_STEPS - 2);
    kills[1] = kills[0] + 1 + (long)lab_rng_below(&g, (size_t)(TOTAL_STEPS - 1 - kills[0]));
    how = (int)lab_rng_below(&g, 4);
    killed_job(every, kills, nk, how);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(uninterrupted_run_writes_snapshots, 30);
    LAB_CASE(killed_mid_epoch, 30);
    LAB_CASE(killed_right_after_a_save, 30);
    LAB_CASE(killed_before_the_first_save, 30);
    LAB_CASE(killed_twice, 30);
    LAB_CASE(killed_after_an_epoch_boundary_save, 30);
    LAB_CASE(newest_snapshot_damaged, 30);
    LAB_CASE(newest_snapshot_cut_short, 30);
    LAB_CASE(crash_in_the_middle_of_a_save, 30);
    LAB_CASE(only_snapshot_damaged, 30);
    LAB_CASE(killed_at_random_steps, 30);
    return lab_end();
}
