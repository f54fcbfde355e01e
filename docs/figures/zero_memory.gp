# Figure 7: what one rank holds of the training state of the 25M-parameter MLP with Adam, on 2, 3
# and 4 ranks, for DDP and the three ZeRO stages.
# Data: data/zero_memory.dat (index 0 DDP, 1..3 ZeRO-1..3; per row: ranks, stage, weights at their
# peak, gradients, Adam state, their total, MiB sent per step). The dashed line is DDP's total
# divided by the ranks: what a rank would hold if every byte of the state were split evenly.
# Points that coincide (ZeRO-1 and -3 at N = 2, ZeRO-2 and -3 at N = 3) stay visible: ZeRO-1 and
# -2 have large open marks, ZeRO-3 a small filled one drawn last.
load "style.gp"
set output "zero_memory.png"
stats "data/zero_memory.dat" index 0 using 6 nooutput
ddp = STATS_max                                          # DDP's total: the same for every N
set title "Training state held by one rank: DDP against ZeRO-1, -2, -3\n" . \
          "examples/ch08_large_mlp, the 25M-parameter MLP of chapter 8, trained with Adam" font ",11"
set xlabel "number of ranks N"
set ylabel "MiB per rank (weights + gradients + Adam state)"
set xrange [1.8:4.2]
set xtics 1
set yrange [0:ddp * 1.12]
set rmargin 40
set key at screen 0.67, 0.86 left top vertical Left reverse samplen 3 spacing 1.5 font ",10"
stage(i) = i == 0 ? "DDP" : sprintf("ZeRO-%d", i)
array col[4] = ["#444444", "#3182bd", "#31a354", "#de2d26"]
array pts[4] = [7, 4, 8, 13]
array psz[4] = [1.3, 2.0, 2.2, 1.2]
set label 1 at screen 0.67, 0.47 left font ",9" tc rgb "#444444" \
    "weights: the most held at once during the step\n\n" . \
    "Why ZeRO stays above 1/N of DDP here:\n" . \
    "- ZeRO-2, -3 keep two buffers that backward\n" . \
    "  writes a layer's gradients into (even and\n" . \
    "  odd layers: 64 + 16 MiB, whatever N)\n" . \
    "- ZeRO-3 gathers each layer in full while\n" . \
    "  it is used (the largest: 64 MiB)\n" . \
    "- DDP and ZeRO-1 hold the gradients twice:\n" . \
    "  in the parameters and in the buckets"
plot for [i=0:3] "data/zero_memory.dat" index i using 1:6 with linespoints lw 2 pt pts[i+1] ps psz[i+1] \
         lc rgb col[i+1] title stage(i), \
     "" index 0 using 1:($6/$1) with linespoints dt 2 lw 2 pt 6 ps 1 lc rgb "#888888" title "1/N of DDP"
