# Classroom labs (labs/README.md), included by the top Makefile.
#   make lab-NAME                 build labs/NAME/starter.c with the lab's tests and run them
#   make lab-NAME LAB_FILE=my.c   the same with your own file
#   make lab-NAME SOLUTION=1      the same with the reference solution, labs/solutions/NAME.c
#   make lab-handout              $(BUILD)/ddp-labs.tar.gz: what students get, without labs/solutions
# Each test prints one line: "ok   name", "FAIL name" (details below it), or "skip name: reason"
# when it cannot run on this machine.
LABS := sampler ring buckets resume no_sync
LAB_TARGETS := $(addprefix lab-,$(LABS))
.PHONY: $(LAB_TARGETS) lab-handout

# ddp.h's implementation, compiled once for every lab (CPU only: the labs need no GPU)
$(BUILD)/labs/ddp.o: labs/ddp_impl.c ddp.h
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) -DDDP_NO_CUDA -I. -c labs/ddp_impl.c -o $@

$(LAB_TARGETS): lab-%: $(BUILD)/labs/ddp.o
	@BUILD="$(BUILD)" CC="$(CC)" CFLAGS="$(CFLAGS)" LDFLAGS="$(LDFLAGS)" WARN="$(WARN)" SOLUTION="$(SOLUTION)" WRONG="$(WRONG)" \
	 bash labs/run_lab.sh $* $(LAB_FILE)

lab-handout:
	@mkdir -p $(BUILD)
	tar -czf $(BUILD)/ddp-labs.tar.gz --exclude=labs/solutions ddp.h Makefile LICENSE labs
	@echo "$(BUILD)/ddp-labs.tar.gz: ddp.h, Makefile and labs/ without labs/solutions"

lab-%:
	@echo "there is no lab \"$*\"; the labs are: $(LABS) (make lab-NAME)"; exit 2
