/* The expert cache: a fixed number of slots in RAM, each able to hold any one routed expert, fed
 * by the expert store through the I/O pool. It is the streaming expert_source.
 *
 * Slot states: EMPTY -> INFLIGHT (claimed for a key, read under way) -> READY (every byte arrived
 * and checked) -> evicted back to INFLIGHT for another key; INFLIGHT -> FAILED when a read fails
 * (kept until its waiters saw the error, then EMPTY).
 *
 * Three-phase fetch of a request (one block, the chunk's distinct experts):
 *   1. reserve, serially under the cache lock: READY experts are pinned (hits), INFLIGHT ones are
 *      joined (a speculative read is promoted to demand priority), the rest claim victim slots.
 *      A victim is EMPTY or READY with no pins; an INFLIGHT slot is never claimed twice and never
 *      evicted, a pinned slot (in use by a request) is never evicted.
 *   2. read in parallel: the claimed slots' reads go to the I/O pool, in file-offset order.
 *   3. publish: a read's completion marks its slot READY only if every byte arrived (and, packed,
 *      its checksum matches); next() delivers only READY slots.
 * When a request names more experts than there are free slots, the rest are reserved as the
 * caller finishes delivered ones.
 *
 * Prefetch hints claim slots the same way with speculative priority, under extra rules: a hint
 * never evicts a pinned slot nor an expert prefetched for a request still to come (protected
 * for one token's worth of requests), keeps enough evictable slots that a demand request never
 * waits for a slot, and is dropped when too many speculative reads are in flight.
 *
 * Hit = the expert was READY when the request began. Statistics (stream_stats) count hits,
 * misses, bytes, prefetches used / late / wasted, and the time requests spent waiting. */
#ifndef DS4F_STREAM_EXPERT_CACHE_H
#define DS4F_STREAM_EXPERT_CACHE_H

#include "model/expert_source.h"
#include "stream/cache_policy.h"
#include "stream/expert_store.h"
#include "stream/trace.h"

typedef struct stream_stats {
    uint64_t requests;              /* MoE requests (blocks x chunks) */
    uint64_t expert_requests;       /* experts asked for by requests */
    uint64_t hits;                  /* READY when asked */
    uint64_t misses;                /* read on demand, or joined while still in flight */
    uint64_t demand_reads, demand_bytes;
    uint64_t prefetch_reads[2], prefetch_bytes[2];    /* by prefetch_kind: exact, guess */
    uint64_t prefetch_used[2];      /* prefetched experts a request then asked for */
    uint64_t prefetch_late[2];      /* ... that were still in flight when asked (misses) */
    uint64_t prefetch_wasted[2];    /* evicted (or still unused at the end) without being asked for */
    uint64_t prefetch_dropped;      /* hints not followed: no slot could be taken for them */
    uint64_t evictions;
    uint64_t read_failures;
    uint64_t bytes_read;            /* all reads, as issued (aligned) */
    double seconds_waiting;         /* requests blocked in next() for reads */
    int slots, pinned_slots;
} stream_stats;

typedef struct expert_cache_options {
    int slots;                      /* >= 1 */
    int io_threads;                 /* >= 1 */
    uint64_t io_chunk_bytes;        /* IO_ALIGN multiple */
    int prefetch;                   /* follow prefetch hints (hash layers exact, router guesses) */
    int lookahead;                  /* ask the MoE sublayer for next-layer router guesses */
    policy_kind policy;
    double half_life_tokens;        /* LFRU */
    const io_ops *io;               /* NULL: the system's pread (tests inject faults here) */
    const char *trace_path;         /* NULL: no trace */
} expert_cache_options;

void expert_cache_options_init(expert_cache_options *opt);

/* Takes ownership of the store (closed by destroy). The slots are allocated here, all at once
 * (the memory plan counted them). */
int expert_cache_create(const model_weights *m, expert_store *store, const expert_cache_options *opt,
                        expert_source **out, ds4f_error *err);

/* Reads the given experts now and pins them for the cache's lifetime (a hot set: never evicted).
 * keys are block * n_experts + expert; at most slots - the experts one request needs. */
int expert_cache_pin(expert_source *src, const int32_t *keys, int n, ds4f_error *err);

/* src must come from expert_cache_create. */
void expert_cache_get_stats(expert_source *src, stream_stats *out);
void expert_cache_reset_stats(expert_source *src);
int expert_cache_direct_io(expert_source *src);
int expert_cache_is_packed(expert_source *src);
/* Tests: the state of a key's slot (0 EMPTY, 1 INFLIGHT, 2 READY, 3 FAILED), -1 if no slot has it. */
int expert_cache_key_state(expert_source *src, int32_t key);
/* Whether src is a streaming cache (the other implementations have no statistics). */
int expert_source_is_cache(const expert_source *src);

#endif
