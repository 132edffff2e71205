/* jemalloc_conf.cpp: jemalloc's options for every Tessera executable (Note [Allocator] in the top
 * CMakeLists.txt). jemalloc reads this symbol at start-up; the MALLOC_CONF environment variable
 * still overrides it.
 *
 * Freed pages are returned to the kernel after 60 s instead of jemalloc's default 10 s: a
 * training step frees and reallocates the same large tensor buffers every second or so, and
 * with the default decay part of them was purged in between and faulted back in on reuse.
 * `tessera demo` on the 2-vCPU machine: 96 s with the default (twice), 88 s with 60 s, 85 s
 * never purging, 86-89 s with glibc's malloc. A process idle for a minute still gives its
 * memory back. */
extern "C" {
const char* malloc_conf = "dirty_decay_ms:60000,muzzy_decay_ms:60000";
}
