# Shared look of every figure: 900x500 PNG, plain style. Each NAME.gp loads this file and then
# sets `set output "NAME.png"`; figures.mk runs gnuplot from this folder.
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 900,500 font "Sans,10" noenhanced
} else {
    set terminal png size 900,500 noenhanced   # older or minimal gnuplot builds
}
set border 3 lw 1
set tics nomirror out
set grid lc rgb "#dddddd" lw 1
set key noopaque
