/* labs/ddp_impl.c: ddp.h's implementation, compiled once (into $(BUILD)/labs/ddp.o) and linked
   into every lab's test program; the labs' own files include ddp.h for its declarations only.
   DDP_NO_FIX_HINTS: ddp.h's warnings say what went wrong but not how to fix it (the no_sync
   off-by-one's fix is lab no_sync's answer). */
#define DDP_NO_FIX_HINTS
#define DDP_IMPLEMENTATION
#include "ddp.h"
