/* ddprun: the launcher, torchrun's analogue. Starts one process per rank with the environment
   that ddp_init reads, prefixes their output with "[rank R]: ", and stops them all when one fails.
       build/ddprun --standalone --nproc-per-node 4 build/allreduce_perf -b 4K -e 64M
   Everything is in ddp.h (>>launch, ddp_launcher_main); this file only gives it a main. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

int main(int argc, char** argv) { return ddp_launcher_main(argc, argv); }
