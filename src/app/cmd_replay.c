/* ds4f replay TRACE --slots a,b,c: hit rates of the cache policies on a recorded expert trace,
 * at each cache size, to choose the policy and size the cache from data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "stream/replay.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: ds4f replay TRACE --slots A,B,C [--half-life T,...]\n\n"
            "Replays an expert trace (recorded with --trace FILE) against caches of A, B, C slots and prints\n"
            "the hit rate of LRU, LFRU (decayed request counts, half-life in tokens), next-use (the engine's\n"
            "default: LFRU's counts and the layer cycle give each expert an expected time to its next request)\n"
            "and Belady's optimum (evicts the expert needed furthest in the future; no real cache can beat it).\n\n"
            "  --slots LIST        cache sizes (slots of one expert each)\n"
            "  --half-life LIST    half-lives in tokens to compare (default: the engine's, %.0f)\n",
            POLICY_DEFAULT_HALF_LIFE_TOKENS);
}

static int parse_list(const char *s, double *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        out[n] = strtod(s, &end);
        if (end == s || !(out[n] > 0)) return -1;
        n++;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int cmd_replay(int argc, char **argv) {
    const char *path = NULL;
    double slots[64], half[16] = {POLICY_DEFAULT_HALF_LIFE_TOKENS};
    int n_slots = 0, n_half = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--slots") && i + 1 < argc) {
            n_slots = parse_list(argv[++i], slots, 64);
        } else if (!strcmp(argv[i], "--half-life") && i + 1 < argc) {
            n_half = parse_list(argv[++i], half, 16);
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            fprintf(stderr, "ds4f replay: unknown or incomplete argument '%s'\n\n", argv[i]);
            print_usage(stderr);
            return 2;
        }
    }
    if (!path || n_slots < 1 || n_half < 1) {
        if (path && (n_slots < 0 || n_half < 0)) fprintf(stderr, "ds4f replay: lists are positive numbers, comma-separated\n");
        print_usage(stderr);
        return 2;
    }
    ds4f_error err = {{0}};
    trace_data t;
    if (trace_load(path, &t, &err) != 0) {
        fprintf(stderr, "ds4f replay: %s\n", err.msg);
        return 1;
    }
    const int total = t.header.blocks * t.header.experts;
    replay_result r;
    if (replay_simulate(&t, 1, POLICY_LRU, 1, &r, &err) != 0) {
        fprintf(stderr, "ds4f replay: %s\n", err.msg);
        trace_free(&t);
        return 1;
    }
    printf("trace %s: %llu tokens, %llu expert requests, %d blocks x %d experts (%.2f MB each)\n", path,
           (unsigned long long)r.tokens, (unsigned long long)r.requests, t.header.blocks, t.header.experts,
           (double)t.header.expert_bytes / 1e6);
    printf("%8s %7s %8s", "slots", "cache", "lru");
    for (int h = 0; h < n_half; h++) {
        char name[32];
        snprintf(name, sizeof name, "lfru/%g", half[h]);
        printf(" %10s", name);
    }
    for (int h = 0; h < n_half; h++) {
        char name[32];
        snprintf(name, sizeof name, "next/%g", half[h]);
        printf(" %10s", name);
    }
    printf(" %8s\n", "belady");
    int rc = 0;
    for (int s = 0; s < n_slots && rc == 0; s++) {
        const int n = (int)slots[s];
        printf("%8d %6.1f%%", n, 100.0 * n / total);
        rc |= replay_simulate(&t, n, POLICY_LRU, 1, &r, &err);
        printf(" %7.2f%%", 100.0 * r.hits / (r.requests ? r.requests : 1));
        for (int h = 0; h < n_half && rc == 0; h++) {
            rc |= replay_simulate(&t, n, POLICY_LFRU, half[h], &r, &err);
            printf(" %9.2f%%", 100.0 * r.hits / (r.requests ? r.requests : 1));
        }
        for (int h = 0; h < n_half && rc == 0; h++) {
            rc |= replay_simulate(&t, n, POLICY_NEXTUSE, half[h], &r, &err);
            printf(" %9.2f%%", 100.0 * r.hits / (r.requests ? r.requests : 1));
        }
        rc |= replay_simulate(&t, n, POLICY_BELADY, 1, &r, &err);
        printf(" %7.2f%%\n", 100.0 * r.hits / (r.requests ? r.requests : 1));
    }
    if (rc) fprintf(stderr, "ds4f replay: %s\n", err.msg);
    trace_free(&t);
    return rc ? 1 : 0;
}
