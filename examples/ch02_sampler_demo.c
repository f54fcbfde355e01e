/* Chapter 2 of TUTORIAL.md: what the distributed sampler gives each rank.

   Prints, for a small data set, the samples each rank visits in two epochs: the shared shuffle of
   the epoch, every rank taking every world-size-th position of it, and the padding that makes the
   ranks' shares equal (marked with *). No process is started: a sampler only needs the world size
   and its rank, so one program can show every rank's view.
       build/examples/ch02_sampler_demo                       # 10 samples, 4 ranks
       build/examples/ch02_sampler_demo --n 10 --world 4 --drop-last
       build/examples/ch02_sampler_demo --no-set-epoch        # forget set_epoch: every epoch the same */
#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
    int n = 10, world = 4, drop_last = 0, set_epoch = 1, i, epoch, r, counted = 0, padding = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--world") && i + 1 < argc) world = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--drop-last")) drop_last = 1;
        else if (!strcmp(argv[i], "--no-set-epoch")) set_epoch = 0;
        else {
            fprintf(stderr, "usage: %s [--n N] [--world W] [--drop-last] [--no-set-epoch]\n", argv[0]);
            return 2;
        }
    }
    for (epoch = 1; epoch <= 2; epoch++) {
        printf("epoch %d%s\n", epoch, set_epoch ? "" : " (set_epoch not called)");
        counted = padding = 0;
        for (r = 0; r < world; r++) {
            ddp_sampler s;
            ddp_sampler_desc sd = {0};
            int* idx;
            sd.num_replicas = world, sd.rank = r, sd.drop_last = drop_last, sd.seed = 1;
            DDP_CHECK(ddp_sampler_init(&s, n, &sd));
            if (set_epoch) ddp_sampler_set_epoch(&s, epoch);
            idx = (int*)malloc((size_t)(s.num_samples ? s.num_samples : 1) * sizeof *idx);
            if (!idx) return 1;
            ddp_sampler_indices(&s, idx);
            printf("  rank %d:", r);
            for (i = 0; i < s.num_samples; i++) /* only the last index of a rank can be padding */
                printf(" %2d%s", idx[i], i == s.num_samples - 1 && ddp_sampler_padding(&s) ? "*" : " ");
            printf("\n");
            counted += s.num_samples, padding += ddp_sampler_padding(&s);
            free(idx);
        }
    }
    printf("%d samples, %d ranks: %d visits per epoch, %d of them padding (*)%s\n", n, world, counted, padding,
           drop_last ? ", the tail dropped" : "");
    return 0;
}
