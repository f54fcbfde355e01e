/* labs/ddp_impl.c: ddp.h's implementation, compiled once (into $(BUILD)/labs/ddp.o) and linked
   into every lab's test program; the labs' own files include ddp.h for its declarations only. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
