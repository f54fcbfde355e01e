# Classroom labs (labs/GUIDE.md; instructors: labs/README.md), included by the top Makefile.
#   make lab-NAME                 build labs/NAME/starter.c with the lab's tests and run them
#   make lab-NAME LAB_FILE=my.c   the same with your own file
#   make lab-NAME SOLUTION=1      the same with the reference solution, labs/solutions/NAME.c
#   make lab-NAME WRONG=W         the same with one of the deliberately wrong solutions
#   make lab-handout              $(BUILD)/ddp-labs.tar.gz: what students get, without labs/solutions
#   make lab-wrong [LAB=NAME]     check that the tests catch every wrong solution (instructors)
# Each test prints one line: "ok   name", "FAIL name" (details below it), or "skip name: reason"
# when it cannot run on this machine.
LABS := sampler ring buckets no_sync resume measure zero1 gpt
LAB_TARGETS := $(addprefix lab-,$(LABS))
.PHONY: $(LAB_TARGETS) lab-handout lab-wrong

# ddp.h's implementation, compiled once for every lab (CPU only: the labs need no GPU)
$(BUILD)/labs/ddp.o: labs/ddp_impl.c ddp.h
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) -DDDP_NO_CUDA -I. -c labs/ddp_impl.c -o $@

$(LAB_TARGETS): lab-%: $(BUILD)/labs/ddp.o
	@BUILD="$(BUILD)" CC="$(CC)" CFLAGS="$(CFLAGS)" LDFLAGS="$(LDFLAGS)" WARN="$(WARN)" SOLUTION="$(SOLUTION)" WRONG="$(WRONG)" \
	 bash labs/run_lab.sh $* $(LAB_FILE)

# The handout, from committed files only (labs/pack_handout.sh says what goes in and when it refuses).
lab-handout:
	@if [ -f labs/pack_handout.sh ]; then bash labs/pack_handout.sh $(BUILD); \
	 else echo "this folder is a handout already: make lab-handout runs in the ddp.h repository"; exit 2; fi

# Each reference solution with one deliberate mistake (labs/solutions/wrong/NAME/*.patch): the
# tests must catch every one and name the rule it breaks. Instructors only; make test runs it.
lab-wrong: $(BUILD)/labs/ddp.o
	@if [ -f labs/solutions/check_wrong.sh ]; then \
	   BUILD="$(BUILD)" CC="$(CC)" CFLAGS="$(CFLAGS)" LDFLAGS="$(LDFLAGS)" WARN="$(WARN)" bash labs/solutions/check_wrong.sh $(LAB); \
	 else echo "skip lab_wrong_solutions: labs/solutions is not here (it is not in the handout)"; fi

lab-%:
	@echo "there is no lab \"$*\"; the labs are: $(LABS) (make lab-NAME)"; exit 2
