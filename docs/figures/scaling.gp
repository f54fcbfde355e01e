# Figure 5: the 25M-parameter MLP on 1, 2 and 4 ranks of one machine.
# Data: data/scaling.dat (one row per setup: the fastest of 3 runs). Left: where a step's time goes;
# right: samples per second over all ranks, against what perfect use of every core would give
# (the number of cores times the 1-thread rate). "|" in a setup's name is a line break.
load "style.gp"
set output "scaling.png"
nl(s) = (i = strstrt(s, "|")) > 0 ? s[1:i-1] . "\n" . nl(s[i+1:]) : s
stats "data/scaling.dat" using 10 every ::0::0 nooutput
rate1 = STATS_max                                    # 1 rank, 1 BLAS thread
stats "data/scaling.dat" using 11 every ::0::0 nooutput
cores = int(STATS_max)                               # of the machine that measured
set multiplot layout 1,2 title sprintf("examples/ch08_large_mlp (25M parameters, batch 64 per rank) on 1, 2 and 4 CPU ranks of one %d-core machine\n", cores) . \
    "threads: OpenBLAS threads per rank; the fastest of 3 runs of 8 timed steps each" font ",11"
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border rgb "white"
set boxwidth 0.6
set xrange [-0.6:3.6]
set bmargin 4.5
set grid ytics noxtics
set xtics scale 0 font ",9"
set yrange [0:*]
set title "time per training step"
set ylabel "ms per step (each rank: 64 samples)"
set key top left Left reverse font ",9" samplen 1.5
plot "data/scaling.dat" using 6:xticlabels(nl(strcol(2))) lc rgb "#9ecae1" title "forward + loss", \
     "" using ($7-$9) lc rgb "#3182bd" title "backward (computing)", \
     "" using 9 lc rgb "#de2d26" title "backward waiting for all-reduces", \
     "" using 8 lc rgb "#74c476" title "optimizer step", \
     "" using 1:($5):(sprintf("%.0f", $5)) with labels offset 0,0.7 font ",9" notitle
set title "throughput"
set ylabel "samples per second, all ranks together"
set style fill solid 0.9 border rgb "white"
set key top left
set yrange [0:*]
plot "data/scaling.dat" using 1:10:xticlabels(nl(strcol(2))) with boxes lc rgb "#6baed6" notitle, \
     "" using 1:10:(sprintf("%.0f", $10)) with labels offset 0,0.7 font ",9" notitle, \
     rate1 * cores with lines dt 2 lw 2 lc rgb "#444444" title sprintf("%d cores x the 1-thread rate", cores)
unset multiplot
