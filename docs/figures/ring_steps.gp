# Figure 1: the ring all-reduce of 4 ranks, after each of its 2(N-1) = 6 steps.
# Data: data/ring_state.dat (replayed from the DDP_DEBUG=DETAIL log in data/ring_steps.dat).
# One panel per step; rows are ranks, columns the 4 segments (one float each); a cell says whose
# gradients that rank's copy of the segment holds, darker = more ranks summed in.
load "style.gp"
set output "ring_steps.png"
rs = "#e6550d"    # reduce-scatter: received and added
ag = "#c51b7d"    # all-gather: received and copied
set palette defined (1 "#f2f2f2", 2 "#c6dbef", 3 "#6baed6", 4 "#2c5a8c")
set cbrange [0.5:4.5]
unset colorbox
unset grid
set border 0
set size ratio -1
set xrange [-0.5:3.5]
set yrange [3.5:-0.5]          # rank 0 at the top
set xtics 1 scale 0 offset 0,0.4
set ytics 1 scale 0
set xlabel "segment" offset 0,0.9 font ",9"
set ylabel "rank" offset 1,0 font ",9"
set style fill solid 1.0 border rgb "white"
set multiplot layout 2,4 title "Ring all-reduce of 4 floats on 4 ranks, replayed from a real run's DDP_DEBUG=DETAIL log\n" . \
    "At every step each rank sends one segment to rank+1 (rank 3 to rank 0)" font ",11"
do for [k=0:6] {
    c = (k == 0 ? "black" : (k <= 3 ? rs : ag))
    set title (k == 0 ? "before: own gradients" : sprintf("step %d/6: %s", k, k <= 3 ? "reduce-scatter" : "all-gather")) tc rgb c
    plot "data/ring_state.dat" index k using 2:1:(0.5):(0.5):3 with boxxyerror lc palette notitle, \
         "" index k using ($4 > 0 ? $2 : 1/0):1:(0.45):(0.45) with boxxyerror fs empty border rgb c lw 4 lc rgb c notitle, \
         "" index k using 2:1:(strcol(6) eq "0,1,2,3" ? "all" : strcol(6)):($3 == 4 ? 0xffffff : 0) \
             with labels tc rgb variable font ",9" notitle
}
# the eighth cell: the legend
unset title; unset xtics; unset ytics; unset xlabel; unset ylabel
set xrange [0:1]; set yrange [0:1]
set label 1 "A cell lists whose gradients\nthat copy of the segment holds\n(all = 0,1,2,3)." at 0.0, 0.85 left font ",9"
set label 2 "Reduce-scatter: received\nand added (orange frame)" at 0.0, 0.5 left tc rgb rs font ",9"
set label 3 "All-gather: received and\ncopied (pink frame)" at 0.0, 0.22 left tc rgb ag font ",9"
plot 1/0 notitle
unset multiplot
