/* tests/multiproc/snapshot_writer.c: helper for test_restart.sh's "killed mid-write" case.
     snapshot_writer write PATH   save a 1M-parameter model with Adam state (about 12 MB) over PATH
                                  again and again, each time with the next step number, until killed
     snapshot_writer check PATH   load PATH into the same model; print "step N" and exit 0, or print
                                  the error and exit 1
   Every saved step has its weights filled with the step number, so `check` also verifies that the
   file it loaded is one whole snapshot, not a mix of two. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

int main(int argc, char** argv) {
    static const int sizes[3] = {1024, 1000, 8};
    ddp_model_desc md;
    ddp_model* m;
    ddp_optim* o;
    ddp_snapshot snap;
    int i;
    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "check"))) {
        fprintf(stderr, "usage: %s write|check PATH\n", argv[0]);
        return 2;
    }
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &m));
    DDP_CHECK(ddp_optim_create(m, NULL, &o));
    memset(&snap, 0, sizeof snap);
    snap.model = m, snap.optim = o;
    if (!strcmp(argv[1], "write")) {
        for (snap.step = 1;; snap.step++) {
            for (i = 0; i < ddp_model_num_params(m); i++) {
                ddp_param* p = ddp_model_param(m, i);
                size_t k;
                for (k = 0; k < p->count; k++) p->data[k] = (float)snap.step;
            }
            DDP_CHECK(ddp_snapshot_save(&snap, argv[2]));
            printf("saved step %ld\n", snap.step);
            fflush(stdout);
        }
    }
    if (ddp_snapshot_load(&snap, argv[2]) != DDP_OK) {
        printf("load failed: %s\n", ddp_error_string());
        return 1;
    }
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        size_t k;
        for (k = 0; k < p->count; k++)
            if (p->data[k] != (float)snap.step) {
                printf("step %ld but %s[%zu] = %g: a mix of two snapshots\n", snap.step, p->name, k, p->data[k]);
                return 1;
            }
    }
    printf("step %ld\n", snap.step);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return 0;
}
