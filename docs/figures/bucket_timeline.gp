# Figure 2: one steady-state training step of the 25M-parameter MLP on 2 ranks, from DDP_TRACE.
# Data: data/bucket_timeline.dat (rank row t_start_ms t_end_ms kind label). A label is drawn
# where it fits in its box (about 6 px a character on a 680 px wide plot). Each rank has two
# rows: compute (forward, the backward of each layer, the wait for buckets, the optimizer step)
# and communication (one all-reduce per bucket, labelled with its size). The ranks' traces have
# their own clocks; measure.py aligns them on the end of the step's last all-reduce. Boxes that overlap in time on the two rows of a
# rank are communication hidden behind backward.
load "style.gp"
set output "bucket_timeline.png"
stats "data/bucket_timeline.dat" using 4 nooutput
tmax = STATS_max
set title "One training step of the 25M-parameter MLP on 2 CPU ranks (DDP_TRACE of examples/ch08_large_mlp)\n" . \
          "buckets are all-reduced while backward still computes the earlier layers"
stats "data/bucket_timeline.dat" using 3 nooutput
tmin = (STATS_min < 0 ? STATS_min : 0)
set xlabel "time since rank 0's forward began (ms); rank 1's clock shifted so that the last all-reduce ends together"
set xrange [tmin - 0.01*tmax : tmax * 1.02]
set yrange [-0.6:3.6]
set ytics ("rank 0 compute" 3, "rank 0 communication" 2, "rank 1 compute" 1, "rank 1 communication" 0) scale 0
set grid xtics noytics
set key outside bottom center horizontal Left reverse maxrows 2 samplen 1.5 width 2 font ",9"
set bmargin 6.5
set style fill solid 0.9 border rgb "white"
array col[6] = [0x9ecae1, 0x3182bd, 0x08306b, 0xde2d26, 0x74c476, 0xfd8d3c]
rgb(i) = sprintf("#%06x", col[i])
h = 0.38
plot "data/bucket_timeline.dat" using (($3+$4)/2):2:(($4-$3)/2):(h):(col[int($5)]) with boxxyerror lc rgb variable notitle, \
     "" using (($4-$3)/tmax*680 > 6*strlen(strcol(6)) && strcol(6) ne "-" ? ($3+$4)/2 : 1/0):2:(strcol(6)) \
         with labels font ",8" tc rgb "black" notitle, \
     NaN with boxes lc rgb rgb(1) title "forward", NaN with boxes lc rgb rgb(2) title "backward of a Linear layer", \
     NaN with boxes lc rgb rgb(3) title "backward of a ReLU", \
     NaN with boxes lc rgb rgb(4) title "wait for buckets", NaN with boxes lc rgb rgb(5) title "optimizer step", \
     NaN with boxes lc rgb rgb(6) title "all-reduce of one bucket"
