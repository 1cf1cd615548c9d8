/* 64-bit checksum of a byte range, for the records of a packed expert file and the checkpoint
 * fingerprint. Four independent lanes over 8-byte words keep it near memory speed (it runs on an
 * I/O thread for every packed record read). It detects accidental damage (flipped bits, torn or
 * misplaced records, a file from another checkpoint); it is not a defence against tampering. */
#ifndef DS4F_STREAM_CHECKSUM_H
#define DS4F_STREAM_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t checksum64(const void *data, size_t bytes, uint64_t seed);

/* Incremental form: the result equals checksum64 over the concatenation only when every update
 * but the last has a multiple of 32 bytes. */
typedef struct checksum_state {
    uint64_t lane[4];
    uint64_t total_bytes;
} checksum_state;
void checksum_begin(checksum_state *st, uint64_t seed);
void checksum_update(checksum_state *st, const void *data, size_t bytes);
uint64_t checksum_end(const checksum_state *st);

#endif
