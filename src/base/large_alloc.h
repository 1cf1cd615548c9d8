/* Allocations of gigabytes (resident weights, expert cache slots): 2 MiB aligned and, on Linux,
 * backed by transparent huge pages where the kernel allows them (MADV_HUGEPAGE; most distributions
 * default to "madvise", which gives none without asking).
 *
 * Why: filling and walking gigabytes through 4 KiB pages costs a page fault per 4 KiB at load and
 * a TLB entry per 4 KiB while the products stream the weights; 2 MiB pages cut both by 512. Measured
 * here: loading the full-size synthetic model took 18-36 s instead of 54-66 s; the decode speed-up
 * measured with it (docs/performance-log.md, "Experts side by side, huge pages") is mostly the
 * experts running side by side: a kernel benchmark over a 512 MB pool showed no difference between
 * the two page sizes. Speed only: the bytes are the same. Free with free(). */
#ifndef DS4F_BASE_LARGE_ALLOC_H
#define DS4F_BASE_LARGE_ALLOC_H

#include <stddef.h>

void *large_alloc(size_t bytes);

#endif
