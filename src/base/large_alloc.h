/* Allocations of gigabytes (resident weights, expert cache slots): 2 MiB aligned and, on Linux,
 * backed by transparent huge pages where the kernel allows them (MADV_HUGEPAGE).
 *
 * Why: the products stream these bytes once per token, 16 rows at a time; with 4 KiB pages each
 * 16-row tile touches a new page per row every few kilobytes and the TLB misses cost more than the
 * arithmetic (worst under a hypervisor with shadow page tables). 2 MiB pages make the same walk
 * touch one page per 2 MiB. Speed only: the bytes are the same. Free with free(). */
#ifndef DS4F_BASE_LARGE_ALLOC_H
#define DS4F_BASE_LARGE_ALLOC_H

#include <stddef.h>

void *large_alloc(size_t bytes);

#endif
