// jemalloc's settings for the programs: jemalloc reads this symbol when it starts, before
// MALLOC_CONF from the environment (which still overrides it).
//
// tcache_max: each thread keeps freed blocks of up to 1 MiB (jemalloc's default: 32 KiB)
// for its next allocations. Value blocks of 64 KiB-1 MiB are allocated by one thread
// (a data-plane reader) and freed by another (an actor) many times a second; above the
// default they went through the arena's lock each time. 2x2 at 64 KiB over TCP: pull at
// window 8 moved 4.06 against 3.29 GB/s, push 3.74 against 2.50 (docs/wire-and-caf.md, "Allocator").
extern "C" {
const char* malloc_conf = "tcache_max:1048576";
}
