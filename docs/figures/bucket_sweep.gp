# Figure 4: step time of the 25M-parameter MLP on 2 ranks against the bucket size.
# Data: data/bucket_sweep.dat (x, --bucket-cap-mb, buckets, the fastest run, every run). x is only a
# plot position: 0.3 stands for --bucket-cap-mb 0 (one parameter per bucket), 300 for --one-bucket.
# The model's 8 parameters are large (two of them 16 MiB, one 64 MiB), so caps from 1 to 50 MiB
# give the same 3 buckets: the number above each point is the count of buckets.
load "style.gp"
set output "bucket_sweep.png"
ytop = 0                                               # room above the slowest run for the labels
do for [c=6:8] { stats "data/bucket_sweep.dat" using c nooutput; ytop = (STATS_max > ytop ? STATS_max : ytop) }
ytop = ytop * 1.15
set title "examples/ch08_large_mlp on 2 CPU ranks: time per training step against --bucket-cap-mb\n" . \
          "fastest of 3 runs (small points: every run; a run reports the median of its 8 timed steps); at the top: buckets"
set xlabel "bucket cap (MiB, log scale)"
set ylabel "time per step (ms)"
set logscale x
set xrange [0.2:450]
set xtics ("0\n(one param\nper bucket)" 0.3, "1" 1, "10" 10, "25\n(default)" 25, "100" 100, "one\nbucket" 300)
set yrange [0:ytop]
set key outside bottom center horizontal maxrows 1 Left reverse samplen 2 font ",9"
set bmargin 7
set xlabel offset 0,-0.8
plot "data/bucket_sweep.dat" using 1:4 with linespoints lw 2 pt 7 ps 1.2 lc rgb "#3182bd" title "time per step (fastest run)", \
     for [i=6:8] "" using 1:i with points pt 6 ps 0.7 lc rgb "#3182bd" notitle, \
     "" using 1:5 with linespoints lw 2 pt 5 ps 1.1 lc rgb "#de2d26" title "exposed communication: backward waiting for the all-reduces (same run)", \
     for [i=9:11] "" using 1:i with points pt 4 ps 0.6 lc rgb "#de2d26" notitle, \
     "" using 1:(ytop*0.96):(sprintf("%s bucket%s", strcol(3), strcol(3) eq "1" ? "" : "s")) with labels font ",9" tc rgb "#555555" notitle
