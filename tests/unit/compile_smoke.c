/* Compiled by tests/run.sh in every mode the header promises: C99 with and without CUDA headers,
   C++, and DDP_STATIC, each with warnings as errors. It calls into the library (so the
   implementation really compiled and linked) and trains two steps on the CPU. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

int main(void) {
    ddp_model* m = NULL;
    ddp_optim* o = NULL;
    ddp_model_desc md;
    ddp_optim_desc od;
    int sizes[3] = {4, 8, 2}, y[2] = {0, 1}, step;
    float x[8] = {1, 2, 3, 4, -1, -2, -3, -4}, loss = 0, first = 0;
    memset(&md, 0, sizeof md);
    memset(&od, 0, sizeof od);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 5;
    od.lr = 0.1f;
    DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_GELU, &m));
    DDP_CHECK(ddp_optim_create(m, &od, &o));
    for (step = 0; step < 20; step++) {
        DDP_CHECK(ddp_model_zero_grad(m));
        DDP_CHECK(ddp_model_forward(m, x, 2));
        DDP_CHECK(ddp_loss_cross_entropy(m, y, &loss));
        DDP_CHECK(ddp_model_backward(m));
        DDP_CHECK(ddp_optim_step(o));
        if (step == 0) first = loss;
    }
    printf("%s | loss %.4f -> %.4f\n", ddp_build_info(), first, loss);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return loss < first ? 0 : 1;
}
