/* Replays an expert trace against a cache of S slots under a policy (stream/cache_policy.h):
 * how many of the trace's expert requests would have found their expert already cached. The
 * engine's cache is simulated as it works: one request per REQ number of the trace (a block of a
 * chunk), every expert of a request held while it runs (never evicted for another of the
 * same request), eviction of the lowest score among the others. */
#ifndef DS4F_STREAM_REPLAY_H
#define DS4F_STREAM_REPLAY_H

#include "stream/cache_policy.h"
#include "stream/trace.h"

typedef struct replay_result {
    uint64_t requests;   /* expert requests (distinct experts per request, summed) */
    uint64_t hits;
    uint64_t tokens;     /* distinct positions in the trace */
} replay_result;

int replay_simulate(const trace_data *t, int slots, policy_kind kind, double half_life_tokens, replay_result *out,
                    ds4f_error *err);

#endif
