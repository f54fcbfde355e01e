# Chapter 12: the GPT's loss while it learns Shakespeare, nanoGPT's laptop setting on 2 ranks.
# Data: data/gpt_loss.dat; index 0: step, the training loss of the last 50 steps (averaged over
# the ranks); index 1: step, train and held-out loss estimated on 20 batches by both ranks.
load "style.gp"
set output "gpt_loss.png"
set title "examples/ch12_gpt: 0.8M parameters, 2 ranks x 6 sequences of 64 characters, 2,000 steps (CPU)"
set xlabel "optimizer step"
set ylabel "loss (cross-entropy per character)"
set xrange [0:2000]
set yrange [1.5:4.5]
set key top right Left reverse samplen 3
set arrow from 0,1.88 to 2000,1.88 nohead dt 2 lc rgb "#888888"
set label "1.88: nanoGPT's held-out loss for this setting" at 1000,1.72 tc rgb "#666666"
plot "data/gpt_loss.dat" index 0 using 1:2 with lines lw 2 lc rgb "#3182bd" title "training loss (last 50 steps)", \
     "" index 1 using 1:3 with linespoints lw 2 pt 7 ps 0.8 lc rgb "#e6550d" title "held-out loss", \
     "" index 1 using 1:2 with points pt 6 ps 0.8 lc rgb "#222222" title "training loss, estimated the same way"
