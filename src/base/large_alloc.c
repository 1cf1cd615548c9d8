#include "base/large_alloc.h"

#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define LARGE_PAGE_BYTES ((size_t)2 << 20)

void *large_alloc(size_t bytes) {
    const size_t rounded = (bytes + LARGE_PAGE_BYTES - 1) & ~(LARGE_PAGE_BYTES - 1);
    void *p = aligned_alloc(LARGE_PAGE_BYTES, rounded ? rounded : LARGE_PAGE_BYTES);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* A refusal (THP disabled, old kernel) only leaves the 4 KiB pages: not an error. */
    if (p) (void)madvise(p, rounded ? rounded : LARGE_PAGE_BYTES, MADV_HUGEPAGE);
#endif
    return p;
}
