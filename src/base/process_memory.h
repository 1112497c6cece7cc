// Process-wide memory policy: what the allocator does with freed blocks.
#pragma once

namespace kestrel {

// Keeps freed memory in the process for reuse instead of handing it back to the kernel (glibc; elsewhere a no-op).
// Every forward hands back a vocabulary's worth of logits per sequence (620 KB at GLM-5.3-Flash's 154,880) that the
// engine frees after sampling; with glibc's defaults those blocks went back to the kernel and the next step faulted
// every page in again (BM_LogitsHandOff in bench/engine_bench.cpp). Blocks under 32 MiB, glibc's largest setting, come
// from the heap, and up to 256 MiB freed at its top stays mapped. Call once, before the threads start.
void keep_freed_memory();

}  // namespace kestrel
