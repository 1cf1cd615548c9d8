/* The memory plan (invariant 4): before anything large is allocated, forecast every big user of
 * RAM from the checkpoint's headers and the options, compare the total with the budget, and
 * refuse with the numbers when it does not fit. The expert cache gets what is left.
 *
 * Items: resident weights (as weights.c lays them out: 64-byte aligned tensors, norm vectors
 * widened to f32), model tables (tensor index, shard headers, expert extents, policy counters),
 * per-session decode state at the planned context (sliding-window rings, compressor and indexer
 * entries, as session.c allocates them) and scratch (session scratch, MoE workspace, logits),
 * I/O threads, the expert cache slots, and a fixed runtime overhead (libraries, thread stacks,
 * allocator slack; measured, see README "## Streaming"). The page cache is not in the plan:
 * experts are read with direct I/O, and the resident weights' pages are dropped after loading.
 *
 * The session forecast mirrors session.c's allocations; a unit test compares it with a live
 * session so that the two cannot drift apart silently. */
#ifndef DS4F_STREAM_MEMORY_PLAN_H
#define DS4F_STREAM_MEMORY_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "model/checkpoint.h"

#define MEMORY_PLAN_MAX_ITEMS 12
/* Share of the available memory used when no budget is given. */
#define MEMORY_PLAN_DEFAULT_FRACTION 0.80
/* Libraries, thread stacks, allocator slack: measured RSS of a run minus its planned items. */
#define MEMORY_PLAN_RUNTIME_OVERHEAD_BYTES (64ull << 20)

typedef struct memory_plan_request {
    uint64_t budget_bytes;   /* 0: MEMORY_PLAN_DEFAULT_FRACTION of the available memory */
    int context;             /* positions per session */
    int sessions;            /* sessions planned for (>= 1) */
    int chunk;               /* prefill chunk (positions per matrix product) */
    int mtp;                 /* sessions keep states for the MTP block */
    int cache_slots;         /* 0: as many as fit (at most every expert) */
    uint64_t slot_bytes;     /* one cache slot (expert_store.slot_bytes) */
    int io_threads;
    int packed;              /* for the description only */
} memory_plan_request;

typedef struct memory_plan_item {
    char name[32];
    uint64_t bytes;
    char detail[96];
} memory_plan_item;

typedef struct memory_plan {
    uint64_t budget_bytes;
    char budget_source[96];      /* "--ram", "80% of 22.9 GB available (MemAvailable)" ... */
    memory_plan_item items[MEMORY_PLAN_MAX_ITEMS];
    int n_items;
    uint64_t total_bytes;
    uint64_t session_bytes;      /* one session's decode state + scratch (for session_create) */
    uint64_t sessions_reserved_bytes; /* what the plan holds for all planned sessions */
    int cache_slots;
    uint64_t slot_bytes;
    int total_experts;           /* routed experts in the checkpoint */
    int min_slots;               /* the fewest slots a run can work with */
    int fits;
    char refusal[512];           /* why it does not fit, with the numbers */
} memory_plan;

/* Builds the plan. Returns 0 also when it does not fit (plan->fits = 0, plan->refusal says
 * why); -1 only for invalid requests. */
int memory_plan_build(const checkpoint *ck, const memory_plan_request *req, memory_plan *plan, ds4f_error *err);
void memory_plan_print(const memory_plan *plan, FILE *out);

/* Forecasts, exposed for the session check and tests. */
uint64_t memory_plan_resident_bytes(const checkpoint *ck);
uint64_t memory_plan_session_bytes(const model_config *c, int context, int chunk, int mtp);

/* Memory the process may use: MemAvailable, lowered by a cgroup (v1 or v2) limit; source gets a
 * description. 0 if unknown. */
uint64_t memory_available_bytes(char *source, size_t source_size);
/* Peak resident set size of this process so far (VmHWM on Linux), 0 if unknown. */
uint64_t memory_peak_rss_bytes(void);
/* Parses "16G", "1.5g", "800M", "1T", or a plain byte count; 0 on error. */
uint64_t memory_parse_size(const char *text);

#endif
