# Figure 9: the time of one all-reduce against its size, 4 ranks over TCP: the ring against
# recursive doubling (chapter 10). Data: data/allreduce_algos.dat (allreduce_perf, DDP_ALGO forcing
# each algorithm). Lines: the fastest run at each size; the dashed line: where the cost model
# ddp.h uses switches from doubling to the ring.
load "style.gp"
set output "allreduce_algos.png"
stats "data/allreduce_algos.dat" using 5 nooutput
cores = int(STATS_max)
stats "data/allreduce_algos.dat" using 6 nooutput
model = STATS_max
set title sprintf("One all-reduce on 4 ranks over TCP (127.0.0.1), one %d-core machine: the ring against recursive doubling\n", cores) . \
          "build/allreduce_perf under build/ddprun, DDP_ALGO=ring and DDP_ALGO=doubling (float sum; fastest of 3 alternating runs)"
set xlabel "message size (bytes, log scale)"
set ylabel "time per all-reduce (microseconds, log scale)"
set logscale xy 2
set xtics ("1K" 2**10, "4K" 2**12, "16K" 2**14, "64K" 2**16, "256K" 2**18, "1M" 2**20)
set xrange [2**9.6:2**20.4]
set key top left Left reverse
set arrow 1 from model, graph 0 to model, graph 1 nohead dt 2 lc rgb "#777777"
set label 1 sprintf("the cost model's switch (%d KiB) ", int(model / 1024)) at model, graph 0.08 right tc rgb "#555555"
plot "data/allreduce_algos.dat" using 1:2 with linespoints lw 2 pt 7 lc rgb "#3182bd" title "ring: 2(N-1) steps of S/N bytes", \
     "" using 1:3 with linespoints lw 2 pt 5 lc rgb "#e6550d" title "recursive doubling: log2(N) steps of S bytes"
