/* The mpi backend (ddp.h built with -DDDP_MPI), with ranks started by mpirun:
       mpirun -np 2 build/tests/test_mpi               every case below (tests/run.sh: -np 2 and -np 4)
       mpirun -np 2 build/tests/test_mpi --timeout     rank 0 calls a collective that rank 1 never calls
   The collective cases are tests/unit/test_pg.c's: every collective, dtype and op, sizes 0, 1, 7, one
   not divisible by the world size and 100003 (and 64 MiB with 2 ranks), each element checked
   against a reference computed in double from every rank's input, results bit-identical on every
   rank, collectives in flight completing in issue order. There ddp_spawn starts the ranks; here
   mpirun does, and rank 0 prints each case's line from the number of failures summed over the
   ranks with MPI_Allreduce (MPI itself, not the library under test).

   The program starts MPI itself (MPI_Init_thread), so it can open and close several groups: MPI
   starts only once per process, and ddp_destroy finalizes it only when ddp_init started it. */
#define DDP_TEST_PG_NO_MAIN
/* test_pg.c's spawn-based cases and the harness's runner are not used here */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "test_pg.c"
/* and test_own_model.c's model of one's own, its ranks and its one-process reference */
#define DDP_TEST_OWN_NO_MAIN
#include "test_own_model.c"
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

#if !DDP__MPI
#error "tests/unit/test_mpi.c needs the mpi backend: build it with -DDDP_MPI and mpicc's flags (make does)"
#endif

static int g_rank, g_world;

/* Every rank runs fn; rank 0 prints the case's line from every rank's count of failures. */
static void mpi_case(const char* name, int (*fn)(int, void*), void* arg) {
    int bad, total = 0;
    fflush(stdout);
    bad = fn(g_rank, arg);
    fflush(stdout);
    MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) {
        if (total) printf("FAIL %s (np %d): %d failed check(s) over all ranks, details above\n", name, g_world, total);
        else printf("ok   %s (np %d)\n", name, g_world);
    }
    fflush(stdout);
}

static ddp_status init_mpi(ddp_pg** pg) {
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_MPI;
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 60;
    return ddp_init(&d, pg);
}

/* The placement comes from MPI_COMM_WORLD, with no launcher variable and no MASTER_ADDR; every
   rank runs on this machine, so local rank = rank. */
static int placement_main(int rank, void* arg) {
    ddp_pg* pg;
    int bad = 0;
    (void)arg;
    if (init_mpi(&pg) != DDP_OK) {
        printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string());
        return 1;
    }
    bad += ddp_rank(pg) != rank;
    bad += ddp_world_size(pg) != g_world;
    bad += ddp__local_rank(pg) != rank;
    bad += ddp__local_world_size(pg) != g_world;
    bad += ddp_pg_backend(pg) != DDP_BACKEND_MPI;
    if (bad) printf("    rank %d: placement rank %d/%d local %d/%d backend %d\n", rank, ddp_rank(pg), ddp_world_size(pg),
                    ddp__local_rank(pg), ddp__local_world_size(pg), (int)ddp_pg_backend(pg));
    ddp_destroy(pg);
    return bad;
}

/* With MASTER_ADDR and MASTER_PORT set, rank 0 hosts the store there. */
static int master_port_main(int rank, void* arg) {
    ddp_pg* pg;
    int port = 0, bad = 0;
    char text[16];
    (void)arg;
    if (rank == 0) { /* a port that was free a moment ago */
        int fd = ddp__sock_listen(NULL, 0, &port);
        if (fd >= 0) close(fd);
    }
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(text, sizeof text, "%d", port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", text, 1);
    if (init_mpi(&pg) != DDP_OK) {
        printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string());
        bad = 1;
    } else {
        if (ddp__store_port(ddp_pg_store(pg)) != port) {
            printf("    rank %d: the store is at port %d, not MASTER_PORT=%d\n", rank, ddp__store_port(ddp_pg_store(pg)),
                   port);
            bad = 1;
        }
        ddp_destroy(pg);
    }
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    return bad;
}

/* A launcher variable that disagrees with MPI is refused, naming the variable, before anything
   else happens (every rank fails alike, so nobody waits). */
static int env_mismatch_main(int rank, void* arg) {
    ddp_pg* pg = NULL;
    char text[16];
    int bad = 0;
    ddp_status s;
    snprintf(text, sizeof text, "%d", rank); /* the rank agrees, the world size does not */
    setenv("RANK", text, 1);
    snprintf(text, sizeof text, "%d", g_world + 1);
    setenv("WORLD_SIZE", text, 1);
    (void)arg;
    s = init_mpi(&pg);
    if (s != DDP_ERR_WORLD_MISMATCH || !strstr(ddp_error_string(), "WORLD_SIZE=") ||
        !strstr(ddp_error_string(), "start the program with mpirun")) {
        printf("    rank %d: ddp_init returned %s: %s\n", rank, ddp_status_name(s), ddp_error_string());
        bad = 1;
    }
    if (s == DDP_OK) ddp_destroy(pg);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    return bad;
}

/* GPU buffers are staged through host memory: an f16 average and an f32 sum on cuda:LOCAL_RANK. */
static int gpu_main(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    float host[1000];
    uint16_t half[1000];
    void* dev = NULL;
    int bad = 0;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_MPI;
    d.device.type = DDP_DEVICE_CUDA;
    if (ddp_init(&d, &pg) != DDP_OK) {
        printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string());
        return 1;
    }
    if (ddp_alloc(ddp_pg_device(pg), sizeof host, &dev) != DDP_OK) bad++;
    fill(host, 1000, rank, 0, 900, DDP_F32);
    if (!bad && (ddp_copy(ddp_pg_device(pg), dev, cpu, host, sizeof host, NULL) != DDP_OK ||
                 ddp_all_reduce(pg, dev, 1000, DDP_F32, DDP_SUM, NULL) != DDP_OK ||
                 ddp_copy(cpu, host, ddp_pg_device(pg), dev, sizeof host, NULL) != DDP_OK))
        bad++, printf("    rank %d: %s\n", rank, ddp_error_string());
    if (!bad) bad += (int)check(host, 1000, g_world, 0, 900, DDP_F32, DDP_SUM, "gpu all_reduce f32 sum", rank);
    fill(half, 1000, rank, 0, 901, DDP_F16);
    if (!bad && (ddp_copy(ddp_pg_device(pg), dev, cpu, half, sizeof half, NULL) != DDP_OK ||
                 ddp_all_reduce(pg, dev, 1000, DDP_F16, DDP_AVG, NULL) != DDP_OK ||
                 ddp_copy(cpu, half, ddp_pg_device(pg), dev, sizeof half, NULL) != DDP_OK))
        bad++, printf("    rank %d: %s\n", rank, ddp_error_string());
    if (!bad) bad += (int)check(half, 1000, g_world, 0, 901, DDP_F16, DDP_AVG, "gpu all_reduce f16 avg", rank);
    ddp_free(ddp_pg_device(pg), dev);
    ddp_destroy(pg);
    return bad;
}

/* Rank 0 calls an all_reduce that rank 1 never calls. Its wait ends after DDP_TIMEOUT with a message
   naming the collective and saying that MPI cannot cancel it; the group then refuses further
   collectives. MPI_Finalize could wait for the pending collective for ever, so both ranks exit
   without it (mpirun then reports that they did). */
static int timeout_main(void) {
    ddp_desc d;
    ddp_pg* pg;
    const char* keys[1] = {"test/timeout/done"};
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_MPI;
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 2;
    if (ddp_init(&d, &pg) != DDP_OK) {
        printf("FAIL mpi_timeout: ddp_init failed: %s\n", ddp_error_string());
        return 1;
    }
    if (g_rank == 0) {
        float x = 1.f;
        ddp_work* w = NULL;
        ddp_status s = ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, &w);
        const char* want = "all_reduce #1 (1 x f32, sum) did not finish within 2 s on the mpi backend";
        if (s == DDP_OK) s = ddp_work_wait(w);
        if (s == DDP_ERR_TIMEOUT && strstr(ddp_error_string(), want) && strstr(ddp_error_string(), "MPI cannot cancel"))
            printf("ok   mpi_timeout_names_the_collective (np %d)\n", g_world);
        else printf("FAIL mpi_timeout_names_the_collective (np %d): %s: %s\n", g_world, ddp_status_name(s),
                    ddp_error_string());
        s = ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL);
        if (s == DDP_ERR_TIMEOUT && strstr(ddp_error_string(), "can no longer be used"))
            printf("ok   mpi_timeout_breaks_the_group (np %d)\n", g_world);
        else printf("FAIL mpi_timeout_breaks_the_group (np %d): %s: %s\n", g_world, ddp_status_name(s), ddp_error_string());
        fflush(stdout);
        ddp_store_set(ddp_pg_store(pg), keys[0], "1", 1);
    } else {
        ddp__store_wait(ddp_pg_store(pg), keys, 1, 30);
    }
    ddp_destroy(pg); /* leaves MPI as it is: a collective is pending */
    fflush(stdout);
    return 0;
}

/* Ranks that call different collectives. MPI pairs collectives by their order alone: rank 1's
   all-gather of 3 floats against the others' all-reduce of 10 ended in MPI_ERR_TRUNCATE or a heap
   overrun inside MPI. The headers' all-gather comes first: every rank fails with DDP_ERR_DESYNC
   naming both calls, and no buffer is touched. */
static int disagree_main(int rank, void* arg) {
    ddp_pg* pg;
    float x[10], out[3 * 8 + 1];
    int bad = 0, i;
    ddp_status s;
    char want[64];
    (void)arg;
    if (init_mpi(&pg) != DDP_OK) return printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string()), 1;
    for (i = 0; i < 10; i++) x[i] = (float)(rank + i);
    for (i = 0; i < 3 * 8 + 1; i++) out[i] = -7.f;
    s = rank == 1 ? ddp_all_gather(pg, x, out, 3, DDP_F32, NULL) : ddp_all_reduce(pg, x, 10, DDP_F32, DDP_SUM, NULL);
    snprintf(want, sizeof want, "but rank %d calls %s #", rank == 1 ? 0 : 1, rank == 1 ? "all_reduce" : "all_gather");
    if (s != DDP_ERR_DESYNC || !strstr(ddp_error_string(), want)) {
        printf("    rank %d: %s, want DDP_ERR_DESYNC with \"%s\": %s\n", rank, ddp_status_name(s), want, ddp_error_string());
        bad++;
    }
    for (i = 0; i < 10; i++) bad += x[i] != (float)(rank + i);
    for (i = 0; i < 3 * 8 + 1; i++) bad += out[i] != -7.f;
    ddp_destroy(pg);
    return bad;
}

/* A collective that rank 0 alone calls (a ZeRO-3 forward on one rank, ddp_full_params on one):
   the others have finished and call ddp_destroy, whose leaving header reaches rank 0 in place of
   theirs, so rank 0 is told at once, instead of pairing with the next MPI call anybody makes. */
static int lone_main(int rank, void* arg) {
    ddp_pg* pg;
    float x[4] = {1, 2, 3, 4}, out[4 * 8];
    int bad = 0;
    (void)arg;
    if (init_mpi(&pg) != DDP_OK) return printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string()), 1;
    bad += ddp_barrier(pg) != DDP_OK;
    if (rank == 0) {
        ddp_status s = ddp_all_gather(pg, x, out, 4, DDP_F32, NULL);
        const char* want = "has left the job (it called ddp_destroy after ";
        if (s != DDP_ERR_DESYNC || !strstr(ddp_error_string(), want) || !strstr(ddp_error_string(), "calls all_gather #")) {
            printf("    rank 0: %s, want DDP_ERR_DESYNC with \"%s\" and the all_gather: %s\n", ddp_status_name(s), want,
                   ddp_error_string());
            bad++;
        }
    }
    ddp_destroy(pg);
    return bad;
}

/* ZeRO and uneven inputs over MPI's own collectives: the weights match one process that applies
   the same rule. Rank r's batch of step t is drawn from the seed (r, t); each step of the one
   process sums the gradients of the ranks that train in it and divides by the world size. With
   zero_stage 1, 2 or 3 every rank trains every step (Adam, sharded state, then consolidated onto
   rank 0); with uneven inputs rank r stops after 8 - 2r steps and joins (SGD with momentum). */
enum { MPI_FEAT = 5, MPI_B = 3, MPI_STEPS = 8 };
static ddp_model* mpi_model(uint64_t seed) {
    int sizes[3] = {MPI_FEAT, 7, 3};
    ddp_model_desc md;
    ddp_model* m = NULL;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = seed;
    return ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &m) == DDP_OK ? m : NULL;
}
static ddp_optim* mpi_optim(ddp_model* m, int adam) {
    ddp_optim_desc od;
    ddp_optim* o = NULL;
    memset(&od, 0, sizeof od);
    od.kind = adam ? DDP_ADAM : DDP_SGD;
    od.lr = adam ? 0.01f : 0.1f;
    od.momentum = adam ? 0.f : 0.9f;
    return ddp_optim_create(m, &od, &o) == DDP_OK ? o : NULL;
}
static int mpi_steps_of(int rank, int uneven) { return uneven ? MPI_STEPS - 2 * rank : MPI_STEPS; }
static void mpi_batch(int rank, int step, float* x, int* y) {
    ddp_rng r = ddp_rng_seed(900 + (uint64_t)rank * 50 + (uint64_t)step);
    int i;
    for (i = 0; i < MPI_B * MPI_FEAT; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
    for (i = 0; i < MPI_B; i++) y[i] = (int)ddp_rng_below(&r, 3);
}
static int sharding_main(int rank, void* arg) {
    const int mode = *(const int*)arg, uneven = mode < 0, stage = uneven ? 0 : mode; /* -1: uneven inputs */
    ddp_pg* pg;
    ddp_model *m, *ref;
    ddp_optim *o, *ro;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float x[MPI_B * MPI_FEAT], loss;
    int y[MPI_B], t, r, i, bad = 0;
    size_t k;
    double num = 0, den = 0;
    if (init_mpi(&pg) != DDP_OK) {
        printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string());
        return 1;
    }
    m = mpi_model(10 + (uint64_t)rank), ref = mpi_model(10);
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = stage, wd.uneven_inputs = uneven;
    if (!m || !ref || ddp_wrap(pg, m, &wd, &w) != DDP_OK || !(o = mpi_optim(m, !uneven)) || !(ro = mpi_optim(ref, !uneven))) {
        printf("    rank %d: setting up: %s\n", rank, ddp_error_string());
        return 1;
    }
    for (t = 0; t < mpi_steps_of(rank, uneven); t++) {
        mpi_batch(rank, t, x, y);
        if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x, MPI_B) != DDP_OK ||
            ddp_loss_cross_entropy(m, y, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK ||
            ddp_optim_step(o) != DDP_OK) {
            printf("    rank %d step %d: %s\n", rank, t, ddp_error_string());
            return 1;
        }
    }
    if (uneven && ddp_join(w) != DDP_OK) {
        printf("    rank %d: ddp_join: %s\n", rank, ddp_error_string());
        return 1;
    }
    if (!uneven && ddp_optim_consolidate(o, 0) != DDP_OK) {
        printf("    rank %d: ddp_optim_consolidate: %s\n", rank, ddp_error_string());
        bad++;
    }
    for (t = 0; t < MPI_STEPS; t++) { /* the rule, in this process */
        ddp_model_zero_grad(ref);
        for (r = 0; r < g_world; r++) {
            if (t >= mpi_steps_of(r, uneven)) continue;
            mpi_batch(r, t, x, y);
            ddp_model_forward(ref, x, MPI_B);
            ddp_loss_cross_entropy(ref, y, &loss);
            ddp_model_backward(ref);
        }
        for (i = 0; i < ddp_model_num_params(ref); i++)
            for (k = 0; k < ddp_model_param(ref, i)->count; k++) ddp_model_param(ref, i)->grad[k] /= (float)g_world;
        ddp_optim_step(ro);
    }
    if (ddp_full_params(w, 1) != DDP_OK) { /* zero_stage 3: the weights are sharded until then */
        printf("    rank %d: ddp_full_params: %s\n", rank, ddp_error_string());
        return 1;
    }
    for (i = 0; i < ddp_model_num_params(m); i++)
        for (k = 0; k < ddp_model_param(m, i)->count; k++) {
            double e = (double)ddp_model_param(m, i)->data[k] - ddp_model_param(ref, i)->data[k];
            num += e * e, den += (double)ddp_model_param(ref, i)->data[k] * ddp_model_param(ref, i)->data[k];
        }
    if (sqrt(num / den) > 1e-5) {
        printf("    rank %d (%s, zero_stage %d): the weights are %.3g relative from one process applying the rule\n",
               rank, uneven ? "uneven inputs" : "sharded", stage, sqrt(num / den));
        bad++;
    }
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o), ddp_optim_destroy(ro);
    ddp_model_destroy(m), ddp_model_destroy(ref);
    ddp_destroy(pg);
    return bad;
}

/* A model of one's own (test_own_model.c) over MPI: each rank trains its share, clipped, at ZeRO
   stage `arg` (SGD with momentum at stages 0 and 2, AdamW with parameter groups at 1 and 3); rank 0 compares every rank's weights and norms
   with one process on the whole batch (at stage 2 under no_sync, 2 micro-batches, where the rows
   divide). */
/* Rank 1 wraps at ZeRO stage 2, the others at 0: on this backend too, ddp_wrap fails on every rank
   naming the setting and each rank's value, before a collective could differ (the first
   reduce-scatter against an all-reduce crashed ranks here). The group stays usable: a barrier. */
static int settings_main(int rank, void* arg) {
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w = NULL;
    ddp_wrap_desc wd;
    ddp_status s;
    char want[96];
    (void)arg;
    if (init_mpi(&pg) != DDP_OK) return printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string()), 1;
    m = mpi_model(10);
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = rank == 1 ? 2 : 0;
    {
        int r, n = snprintf(want, sizeof want, "zero_stage is 0 on rank%s 0", g_world > 2 ? "s" : "");
        for (r = 2; r < g_world && r < 9 && n < (int)sizeof want; r++)
            n += snprintf(want + n, sizeof want - n, ", %d", r);
        if (n < (int)sizeof want) snprintf(want + n, sizeof want - n, "%s", g_world > 9 ? "" : "; 2 on rank 1");
    }
    s = ddp_wrap(pg, m, &wd, &w);
    if (s != DDP_ERR_MODEL_MISMATCH || !strstr(ddp_error_string(), want)) {
        printf("    rank %d: ddp_wrap returned %s (want DDP_ERR_MODEL_MISMATCH, \"%s\"): %s\n", rank,
               ddp_status_name(s), want, ddp_error_string());
        return 1;
    }
    s = ddp_barrier(pg);
    if (s != DDP_OK) return printf("    rank %d: the barrier after it: %s\n", rank, ddp_error_string()), 1;
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}

static int own_model_main(int rank, void* arg) {
    cfg c;
    double ne = 0, e;
    int bad;
    memset(&c, 0, sizeof c);
    c.zero = *(const int*)arg, c.adamw = c.zero % 2, c.clip = 0.5f;
    c.accum = c.zero == 2 && GB % (2 * g_world) == 0 ? 2 : 1;
    if (rank == 0 && !g_dir[0]) {
        char tmpl[] = "/tmp/ddp_own_mpi_XXXXXX";
        if (mkdtemp(tmpl)) snprintf(g_dir, sizeof g_dir, "%s", tmpl);
    }
    MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    bad = train_rank(rank, &c);
    if (bad) printf("    rank %d: train_rank returned %d\n", rank, bad);
    MPI_Barrier(MPI_COMM_WORLD); /* every rank's weights are written */
    if (rank != 0 || bad) return bad;
    e = compare_ranks(g_world, &c, &ne);
    if (e > 2e-5 || ne > 2e-5) {
        printf("    zero_stage %d: weights %.3g, clipped norms %.3g relative from one process\n", c.zero, e, ne);
        return 1;
    }
    return 0;
}

int main(int argc, char** argv) {
    int provided = 0, timeout_mode = argc > 1 && !strcmp(argv[1], "--timeout");
    suite_arg a;
    /* SERIALIZED: what the mpi backend asks for when it starts MPI itself */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    /* nothing but MPI places the ranks here (a stray MASTER_ADDR would hide a bootstrap bug) */
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    setenv("DDP_BACKEND", "mpi", 1); /* test_pg.c's cases leave the backend to the environment */
    if (timeout_mode) {
        if (g_world < 2) {
            if (g_rank == 0) printf("skip mpi_timeout_names_the_collective: needs 2 ranks or more\n");
            MPI_Finalize();
            return 0;
        }
        timeout_main();
        _exit(0); /* without MPI_Finalize: see timeout_main */
    }
    mpi_case("mpi_placement_from_mpi_comm_world", placement_main, NULL);
    mpi_case("mpi_store_at_master_port", master_port_main, NULL);
    mpi_case("mpi_launcher_variables_disagreeing_refused", env_mismatch_main, NULL);
    a.big = g_world == 2 ? (size_t)16 << 20 : 0; /* 64 MiB once, with 2 ranks (as test_pg.c) */
    mpi_case(g_world == 2 ? "mpi_every_collective_dtype_op_and_64MiB" : "mpi_every_collective_dtype_op", rank_main, &a);
    mpi_case("mpi_collectives_in_flight_complete_in_order", in_flight_main, NULL);
    if (g_world == 2) mpi_case("mpi_misuse_refused", misuse_main, NULL); /* its check assumes 2 ranks */
    mpi_case("mpi_settings_that_differ_named", settings_main, NULL);
    mpi_case("mpi_different_collectives_desync", disagree_main, NULL);
    mpi_case("mpi_lone_collective_told", lone_main, NULL);
    {
        int stages[3] = {1, 2, 3}, uneven = -1;
        mpi_case("mpi_zero1_equals_one_process", sharding_main, &stages[0]);
        mpi_case("mpi_zero2_equals_one_process", sharding_main, &stages[1]);
        mpi_case("mpi_zero3_equals_one_process", sharding_main, &stages[2]);
        if (g_world <= 4) mpi_case("mpi_uneven_inputs_join", sharding_main, &uneven); /* 8 - 2r steps */
        if (GB % g_world == 0) { /* each rank its share of the 12 rows */
            static const int own[4] = {0, 1, 2, 3};
            mpi_case("mpi_own_model_zero0", own_model_main, (void*)&own[0]);
            mpi_case("mpi_own_model_zero1", own_model_main, (void*)&own[1]);
            mpi_case("mpi_own_model_zero2", own_model_main, (void*)&own[2]);
            mpi_case("mpi_own_model_zero3", own_model_main, (void*)&own[3]);
            if (g_rank == 0) h_remove_tree(g_dir);
        }
    }
    if (ddp__cuda_device_count() >= g_world) mpi_case("mpi_gpu_buffers_staged", gpu_main, NULL);
    else if (g_rank == 0) printf("skip mpi_gpu_buffers_staged (np %d): %d GPU(s) for %d ranks%s%s\n", g_world,
                                 ddp__cuda_device_count(), g_world, *ddp__cuda_unavailable_reason() ? ": " : "",
                                 ddp__cuda_unavailable_reason());
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
