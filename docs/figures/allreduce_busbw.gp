# Figure 6: all-reduce bus bandwidth against message size, 2 and 4 ranks on one machine.
# Data: data/allreduce_busbw.dat (allreduce_perf's table; index 0: 2 ranks, index 1: 4 ranks).
# busbw = size/time * 2(n-1)/n: what each rank's link carries, comparable across rank counts.
# Lines: the faster of the two runs at each size; small open points: each run.
load "style.gp"
set output "allreduce_busbw.png"
stats "data/allreduce_busbw.dat" using 8 nooutput
cores = int(STATS_max)                       # of the machine that measured
set title sprintf("All-reduce bus bandwidth on one %d-core machine: CPU backend, a TCP ring on 127.0.0.1\n", cores) . \
          "build/allreduce_perf under build/ddprun (float sum; median of 10 iterations; line: faster of 2 runs, small points: each run)"
set xlabel "message size (bytes, log scale)"
set ylabel "bus bandwidth (GB/s, 1 GB = 1e9 bytes)"
set logscale x 2
set xtics ("1K" 2**10, "4K" 2**12, "16K" 2**14, "64K" 2**16, "256K" 2**18, "1M" 2**20, "4M" 2**22, \
           "16M" 2**24, "64M" 2**26, "256M" 2**28)
set xrange [2**9.6:2**28.4]
set yrange [0:*]
set key top left Left reverse
plot "data/allreduce_busbw.dat" index 0 using 1:5 with linespoints lw 2 pt 7 lc rgb "#3182bd" title "2 ranks", \
     for [c=9:10] "" index 0 using 1:c with points pt 6 ps 0.6 lc rgb "#3182bd" notitle, \
     for [c=9:10] "" index 1 using 1:c with points pt 4 ps 0.6 lc rgb "#e6550d" notitle, \
     "" index 1 using 1:5 with linespoints lw 2 pt 5 lc rgb "#e6550d" title sprintf("4 ranks%s", cores < 4 ? sprintf(" (more ranks than the %d cores: they take turns)", cores) : "")
