#include "stream/checksum.h"

#include <string.h>

/* Each lane absorbs a word w as state = mix((state ^ w) * odd), where mix is an xor-shift: both
 * steps are bijections of the state for a fixed word, so changing any single word always changes
 * its lane, and the final fold spreads every lane over all output bits. */
#define CHECKSUM_MUL_A 0x9fb21c651e98df25ull
#define CHECKSUM_MUL_B 0xd6e8feb86659fd93ull

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t absorb(uint64_t state, uint64_t word) {
    state = (state ^ word) * CHECKSUM_MUL_A;
    return state ^ (state >> 29);
}

static inline uint64_t finalize(uint64_t h) {
    h ^= h >> 32;
    h *= CHECKSUM_MUL_B;
    h ^= h >> 29;
    h *= CHECKSUM_MUL_A;
    return h ^ (h >> 32);
}

void checksum_begin(checksum_state *st, uint64_t seed) {
    for (int i = 0; i < 4; i++) st->lane[i] = finalize(seed + (uint64_t)(i + 1) * CHECKSUM_MUL_B);
    st->total_bytes = 0;
}

void checksum_update(checksum_state *st, const void *data, size_t bytes) {
    const uint8_t *p = data;
    uint64_t a = st->lane[0], b = st->lane[1], c = st->lane[2], d = st->lane[3];
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
        a = absorb(a, load64(p + i));
        b = absorb(b, load64(p + i + 8));
        c = absorb(c, load64(p + i + 16));
        d = absorb(d, load64(p + i + 24));
    }
    /* A tail shorter than 32 bytes: zero-padded words into the lanes in turn. */
    uint64_t *lanes[4] = {&a, &b, &c, &d};
    for (int lane = 0; i < bytes; lane++, i += 8) {
        uint8_t word[8] = {0};
        memcpy(word, p + i, bytes - i < 8 ? bytes - i : 8);
        *lanes[lane] = absorb(*lanes[lane], load64(word));
    }
    st->lane[0] = a, st->lane[1] = b, st->lane[2] = c, st->lane[3] = d;
    st->total_bytes += bytes;
}

uint64_t checksum_end(const checksum_state *st) {
    uint64_t h = st->total_bytes * CHECKSUM_MUL_B;
    for (int i = 0; i < 4; i++) h = absorb(h, finalize(st->lane[i]));
    return finalize(h);
}

uint64_t checksum64(const void *data, size_t bytes, uint64_t seed) {
    checksum_state st;
    checksum_begin(&st, seed);
    checksum_update(&st, data, bytes);
    return checksum_end(&st);
}
