/* examples/ch08_large_mlp.c as ONE rank of a job that a launcher started (make bench-gpu).

   The example starts its own ranks with ddp_spawn, and with --nproc 1 it runs without a process
   group at all. To measure what DDP itself costs on one GPU (ddp_init with NCCL, ddp_wrap, a
   world of one), this file compiles the example unchanged and replaces only its main: each
   process is one rank, and the world comes from the launcher's variables:

       build/ddprun --standalone --nproc-per-node 1 --backend nccl build/bench/large_mlp_launched --device cuda

   It takes the example's flags (--steps, --warmup, --bucket-cap-mb, --one-bucket, --view,
   --device); --nproc is ignored. Built by `make bench-gpu` into $(BUILD)/bench/. */
#define main large_mlp_example_main /* the example's own main, unused here */
#include "../examples/ch08_large_mlp.c"
#undef main

int main(int argc, char** argv) {
    options opt = parse_args(argc, argv);
    const char* rank = getenv("RANK");
    if (!rank || !getenv("WORLD_SIZE")) {
        fprintf(stderr, "%s: start it under a launcher (build/ddprun, torchrun-style variables RANK and WORLD_SIZE)\n",
                argv[0]);
        return 2;
    }
    /* run() takes its distributed path (ddp_init, ddp_wrap) when nproc > 1; the real world size,
       which may be 1, is the launcher's and ddp_init reads it */
    opt.nproc = 2;
    return run(atoi(rank), &opt);
}
