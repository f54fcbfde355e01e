# The tutorial's figures, drawn by gnuplot from this project's own measurements.
# The main Makefile includes this file (-include docs/figures/figures.mk).
#   make figures          runs the programs under $(BUILD) (docs/figures/measure.py: about 5 minutes on a quiet
#                         2-core machine, more while other programs run, and about 2 more for chapter 12's
#                         2,000-step GPT), writes docs/figures/data/*.dat, then renders every PNG
#   make figures-render   renders the PNGs from the committed data only (a few seconds)
# Each NAME.gp in docs/figures draws NAME.png; gnuplot runs in that folder, so the scripts name
# their data as data/... and a student can also run `cd docs/figures && gnuplot NAME.gp`.

FIG_DIR   := docs/figures
FIG_NAMES := ring_steps bucket_timeline loss_1_vs_4_ranks bucket_sweep scaling allreduce_busbw zero_memory gpt_loss \
             allreduce_algos

# Checked when make reads this file, so a missing gnuplot stops make before it builds or measures.
ifneq ($(filter figures figures-render,$(MAKECMDGOALS)),)
  ifeq ($(shell command -v gnuplot 2>/dev/null),)
    $(error gnuplot is not installed: apt-get install gnuplot-nox)
  endif
endif

FIG_RENDER = cd $(FIG_DIR) && for f in $(FIG_NAMES); do gnuplot $$f.gp || exit 1; echo "  drew $(FIG_DIR)/$$f.png"; done

.PHONY: figures figures-render
figures: all
	@t0=$$(date +%s); python3 $(FIG_DIR)/measure.py $(BUILD) && ( $(FIG_RENDER) ) && \
	 echo "make figures: measured and drew $(words $(FIG_NAMES)) figures in $$(( $$(date +%s) - t0 )) s"

figures-render:
	@$(FIG_RENDER)
