# Figure 3: training loss per epoch on the wine data, 1 rank against 4 ranks.
# Data: data/loss.dat (epoch, then the loss rank 0 printed in each of three runs).
# With the same batch of 32 per rank, 4 ranks take a global batch of 128: 4x fewer optimizer
# steps per epoch, so the loss falls more slowly per epoch. With 8 per rank (global 32) the
# 4 ranks take as many steps as 1 rank and follow it closely.
load "style.gp"
set output "loss_1_vs_4_ranks.png"
set title "Training loss on the wine data (142 samples, 100 epochs, default options, CPU)\n" . \
          "4 ranks: rank 0 prints the loss of its own quarter of the data"
set xlabel "epoch"
set ylabel "training loss (cross-entropy, log scale)"
set logscale y
set format y "%g"
set xrange [0:100]
set key top right Left reverse samplen 3
set yrange [0.005:2]
plot "data/loss.dat" using 1:2 with lines lw 2.5 lc rgb "#222222" title "1 rank, batch 32 (5 steps per epoch)", \
     "" using 1:3 with lines lw 2 lc rgb "#e6550d" title "4 ranks, batch 32 per rank = global 128 (2 steps per epoch)", \
     "" using 1:4 with lines lw 1.5 lc rgb "#3182bd" title "4 ranks, batch 8 per rank = global 32 (5 steps per epoch)"
