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

#include "ddp.h"
#include "resume.h"

#define EPOCHS 4
#define BATCH 16
#define SAMPLES 90 /* 6 batches per epoch (the last one of 10): 24 steps */
#define TOTAL_STEPS (EPOCHS * ((SAMPLES + BATCH - 1) / BATCH))
#define KILLED 42  /* the exit status of a run killed by the harness */
#define MAX_LOG 512
#define MAX_W 1024

typedef struct record {
    int run;                    /* the run now going: 0, 1, ... */
    int nlog;
    long log_step[MAX_LOG];     /* every lab_after_step, in order */
    int log_run[MAX_LOG];
    int finished;               /* lab_finished was called (in the last run) */
    int first_seen[8];          /* run k has logged a step: its weights after that first step */
    float first_w[8][MAX_W];
    size_t nweights;
    float weights[MAX_W];
    int nparams;
    char names[16][32];
    size_t counts[16];
} record;

static record* g_rec;
static float g_ref[MAX_W]; /* the reference run's final weights */
static size_t g_nref;
static float (*g_step_w)[MAX_W]; /* shared: the weights after each step of the reference run */
static int g_recording;          /* set while the reference run goes */

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

void lab_after_step(long step, ddp_model* model) {
    const char* kill_at = getenv("LAB_KILL_AT_STEP");
    if (g_rec->nlog < MAX_LOG) {
        g_rec->log_step[g_rec->nlog] = step;
        g_rec->log_run[g_rec->nlog] = g_rec->run;
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

/* What a snapshot file holds: the names in its header, its step, and its weights against the
   reference run's after that step. hard = 1: a snapshot without the optimizer's state, or with
   the weights of another step, is a failure (rules RS2 and RS3); hard = 0: only say what is
   missing, to explain final weights that differ. Returns the number of problems it reported. */
static int inspect_snapshot(const char* path, int hard) {
    FILE* f = fopen(path, "rb");
    unsigned char len8[8];
    char* json = NULL;
    uint64_t hlen = 0;
    int k, problems = 0;
    long step = -1;
    const char* at;
    if (!f) return 0;
    if (fread(len8, 1, 8, f) == 8) {
        for (k = 7; k >= 0; k--) hlen = hlen << 8 | len8[k];
        if (hlen < (1u << 20) && (json = (char*)calloc(1, (size_t)hlen + 1)) != NULL &&
            fread(json, 1, (size_t)hlen, f) != (size_t)hlen)
            json[0] = 0;
    }
    fclose(f);
    if (!json) return 0;
    if ((at = strstr(json, "\"step\":\"")) != NULL) step = atol(at + 8);
    if (!strstr(json, "\"optim.")) {
        lab_failf("[rule RS3: the snapshot holds every piece of state the next step reads] %s holds no optimizer state "
                  "(no optim.* tensors): Adam's two running averages per weight and its step count are lost, so every "
                  "step after a restart differs (snap.optim)", path);
        problems++;
    }
    if (!hard && !strstr(json, "\"loader_position\"")) {
        lab_failf("[rule RS3: the snapshot holds every piece of state the next step reads] %s holds no loader position: "
                  "a run resumed mid-epoch starts that epoch again at its first batch (snap.loader)", path);
        problems++;
    }
    if (!hard && !strstr(json, "\"sampler_epoch\"") && problems == 0)
        lab_note("(%s holds no sampler; that is fine as long as the loop sets the sampler's epoch itself)", path);
    free(json);
    if (step >= 1 && step <= TOTAL_STEPS) { /* its weights: those after its step? */
        int sizes[3] = {6, 16, 3};
        ddp_model* m;
        ddp_model_desc md;
        ddp_snapshot snap;
        float w[MAX_W];
        size_t n;
        memset(&md, 0, sizeof md);
        md.device.type = DDP_DEVICE_CPU;
        memset(&snap, 0, sizeof snap);
        if (ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &m) != DDP_OK) return problems;
        snap.model = m;
        if (ddp_snapshot_load(&snap, path) == DDP_OK) {
            n = copy_weights(m, w);
            if (memcmp(w, g_step_w[step], n * sizeof(float)) != 0) {
                if (step > 1 && memcmp(w, g_step_w[step - 1], n * sizeof(float)) == 0)
                    lab_failf("[rule RS2: save once the step is complete] %s says step %ld but holds the weights "
                              "after step %ld: is it written before the optimizer step?", path, step, step - 1);
                else
                    lab_failf("[rule RS2: the snapshot of step N holds the state after step N] %s says step %ld, but "
                              "its weights are not those the uninterrupted run had after step %ld", path, step, step);
                problems++;
            }
        }
        ddp_model_destroy(m);
    }
    return problems;
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

/* A whole job: started, killed at kills[0], started again, killed at kills[1], ..., and started
   once more to run to the end. Checks where each restart began. Returns 1 if it finished. */
static int run_job(const char* dir, int save_every, const long* kills, int nkills, char* path, size_t path_cap) {
    static ddp_dataset data;
    lab_resume_opts o;
    int k, i;
    if (!data.n) make_data(&data);
    snprintf(path, path_cap, "%s/snap%d.safetensors", dir, save_every);
    memset(&o, 0, sizeof o);
    o.data = &data, o.snapshot_path = path, o.save_every = save_every;
    o.epochs = EPOCHS, o.batch_size = BATCH, o.seed = 5;
    memset(g_rec, 0, sizeof *g_rec);
    for (k = 0; k <= nkills; k++) {
        int first_log = g_rec->nlog, st;
        long first, want_first, last;
        g_rec->run = k;
        st = start_run(&o, k < nkills ? kills[k] : 0);
        if (st < 0) return 0;
        if (g_rec->nlog == first_log) {
            lab_failf("[rule RS5: call lab_after_step after every step] run %d called lab_after_step not once", k);
            return 0;
        }
        first = g_rec->log_step[first_log], last = g_rec->log_step[g_rec->nlog - 1];
        /* the last snapshot before the previous kill: its step, plus one */
        want_first = k == 0 || save_every == 0 ? 1 : kills[k - 1] / save_every * save_every + 1;
        if (k > 0 && first != want_first) {
            if (first == 1 && k < 8 && g_nref && g_rec->first_seen[k] &&
                !memcmp(g_rec->first_w[k], g_step_w[want_first], sizeof(float) * g_nref))
                lab_failf("[rule RS1: resume from the snapshot, step counter included] after the kill at step %ld the "
                          "restarted run carried on from the snapshot (the weights after its first step are those of "
                          "step %ld) but called that step 1: restore the step counter too", kills[k - 1], want_first);
            else if (first == 1)
                lab_failf("[rule RS1: resume from the snapshot] after the kill at step %ld the restarted run began at "
                          "step 1, from scratch; expected step "
                          "%ld: the last snapshot was taken after step %ld", kills[k - 1], want_first, want_first - 1);
            else
                lab_failf("[rule RS1: resume from the snapshot, step counter included] after the kill at step %ld the "
                          "restarted run began at step %ld; expected step %ld (the "
                          "last snapshot was taken after step %ld; is the step counter restored from the snapshot?)",
                          kills[k - 1], first, want_first, want_first - 1);
        }
        for (i = first_log + 1; i < g_rec->nlog; i++)
            if (g_rec->log_step[i] != g_rec->log_step[i - 1] + 1) {
                lab_failf("[rule RS5: the true step number] run %d reported step %ld after step %ld; steps go up by "
                          "one", k, g_rec->log_step[i],
                          g_rec->log_step[i - 1]);
                break;
            }
        if (k == nkills && last != TOTAL_STEPS)
            lab_failf("[rule RS1: carry on in the epoch the snapshot was taken in] the last run ended at step %ld; the "
                      "job has %d steps (%d epochs of %d batches)", last, TOTAL_STEPS,
                      EPOCHS, TOTAL_STEPS / EPOCHS);
    }
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
    char path[512];
    int k;
    g_rec = (record*)lab_shared(sizeof(record));
    if (!g_rec) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    snprintf(g_dir, sizeof g_dir, "%s/lab_resume.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) LAB_SKIP("cannot make a temporary folder %s: %s", g_dir, strerror(errno));
    /* the reference: the same loop, never saving, never killed, its weights after every step kept */
    g_step_w = (float(*)[MAX_W])lab_shared(sizeof(float) * MAX_W * (TOTAL_STEPS + 1));
    if (!g_step_w) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    g_recording = 1;
    k = run_job(g_dir, 0, NULL, 0, path, sizeof path);
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
static void expect_reference_weights(const char* what, const char* path) {
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
        if (path && inspect_snapshot(path, 0) > 0) return; /* it named what the snapshot lacks */
        while (p < g_rec->nparams - 1 && first >= off + g_rec->counts[p]) off += g_rec->counts[p++];
        lab_failf("[rule RS4: bit for bit] %s: the final weights differ from the uninterrupted run's in %zu of %zu "
                  "values; the first is %s[%zu] = %.9g, uninterrupted %.9g. What does the next step read that the "
                  "snapshot does not restore?", what, differ, g_nref, g_rec->names[p], first - off,
                  (double)g_rec->weights[first], (double)g_ref[first]);
    }
}

static void killed_job(int save_every, const long* kills, int nkills) {
    char path[512], what[128];
    size_t pos = 0;
    int k;
    setup();
    pos += (size_t)snprintf(what, sizeof what, "snapshot every %d steps, killed at step", save_every);
    for (k = 0; k < nkills; k++) pos += (size_t)snprintf(what + pos, sizeof what - pos, "%s %ld", k ? " and" : "", kills[k]);
    if (g_nref && run_job(g_dir, save_every, kills, nkills, path, sizeof path)) expect_reference_weights(what, path);
    cleanup();
}

/* ---- the cases ----------------------------------------------------------------------------- */

static void uninterrupted_run_writes_snapshots(void) {
    char path[512];
    setup();
    if (g_nref && run_job(g_dir, 5, NULL, 0, path, sizeof path)) {
        EXPECT(ddp_snapshot_exists(path), "[rule RS2: save every save_every steps] no snapshot at %s after a run of %d "
               "steps with save_every = 5", path, TOTAL_STEPS);
        inspect_snapshot(path, 1);
        expect_reference_weights("saving a snapshot every 5 steps (never killed)", NULL);
    }
    cleanup();
}

static void killed_mid_epoch(void) {
    long kills[1] = {13}; /* last snapshot: step 10, batch 4 of epoch 2 */
    killed_job(5, kills, 1);
}

static void killed_right_after_a_save(void) {
    long kills[1] = {10};
    killed_job(5, kills, 1);
}

static void killed_before_the_first_save(void) {
    long kills[1] = {3};
    killed_job(5, kills, 1);
}

static void killed_twice(void) {
    long kills[2] = {7, 17};
    killed_job(5, kills, 2);
}

static void killed_after_an_epoch_boundary_save(void) {
    long kills[1] = {14}; /* snapshots at the end of each epoch (every 6 steps): resume at epoch 3 */
    killed_job(6, kills, 1);
}

/* Kills at steps drawn from the seed (LAB_SEED), with a save interval drawn too. */
static void killed_at_random_steps(void) {
    lab_rng g;
    long kills[2];
    int every, nk;
    lab_rng_seed(&g, lab_seed(), 31);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    every = 1 + (int)lab_rng_below(&g, 8);
    nk = 1 + (int)lab_rng_below(&g, 2);
    kills[0] = 1 + (long)lab_rng_below(&g, TOTAL_STEPS - 2);
    kills[1] = kills[0] + 1 + (long)lab_rng_below(&g, (size_t)(TOTAL_STEPS - 1 - kills[0]));
    killed_job(every, kills, nk);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(uninterrupted_run_writes_snapshots, 30);
    LAB_CASE(killed_mid_epoch, 30);
    LAB_CASE(killed_right_after_a_save, 30);
    LAB_CASE(killed_before_the_first_save, 30);
    LAB_CASE(killed_twice, 30);
    LAB_CASE(killed_after_an_epoch_boundary_save, 30);
    LAB_CASE(killed_at_random_steps, 30);
    return lab_end();
}
