/* Where routed experts live on disk and how one is read into a cache slot.
 *
 * Two layouts:
 *  - shards: the official safetensors files as published. An expert's six tensors are found by
 *    their extents; parts that lie close together in one file are read as one range. Ranges are
 *    widened to IO_ALIGN boundaries so that direct I/O works, and each lands at an aligned place
 *    in the slot; the views then point at the parts inside the slot (no copy).
 *  - packed (`ds4f pack`): one file of fixed-size records, record (block, expert) at
 *    header_bytes + (block * n_experts + expert) * record_stride, so an expert is one aligned
 *    read at an offset computed in O(1). The header names the checkpoint it was made from (a
 *    fingerprint of its config and expert extents) and holds a checksum of every record, verified
 *    after each read: a damaged record stops the run with its file and offset.
 *
 * Direct I/O (O_DIRECT on Linux, F_NOCACHE on macOS) keeps expert bytes out of the page cache:
 * the expert cache owns the RAM they occupy, and the memory plan can count it. When a file system
 * refuses direct I/O the store falls back to buffered reads and says so (direct_io = 0).
 *
 * Packed file header (little-endian; the record checksums follow at byte 512):
 *     0  8  magic "DS4FXPK1"          32 4  n_blocks
 *     8  4  version (1)               36 4  n_experts
 *    12  4  header_bytes              40 8  checkpoint fingerprint
 *    16  8  record_stride             48 8  checksum of the header (this field read as zero)
 *    24  8  expert_bytes              56 56 offsets of the six parts + end (expert_record_layout)
 *   512 8N  checksum64 of each record's expert_bytes, N = n_blocks * n_experts */
#ifndef DS4F_STREAM_EXPERT_STORE_H
#define DS4F_STREAM_EXPERT_STORE_H

#include "model/checkpoint.h"
#include "model/weights.h"
#include "stream/io_pool.h"

#define PACK_MAGIC "DS4FXPK1"
#define PACK_VERSION 1
#define PACK_FIXED_HEADER_BYTES 512u

typedef struct store_file {
    char *path;
    int fd;
    uint64_t bytes;
    int direct;      /* opened for direct I/O */
} store_file;

typedef struct expert_store {
    int n_blocks, n_experts;
    uint64_t expert_bytes;       /* the six parts of one expert */
    uint64_t slot_bytes;         /* a slot that can receive any expert as this store reads it */
    uint64_t part_bytes[EXPERT_PARTS];
    int packed;
    int direct_io;               /* every file is read with direct I/O */
    store_file *files;
    int n_files;
    expert_extent *extents;      /* shards layout: [n_blocks][n_experts][EXPERT_PARTS] (a copy) */
    /* packed layout */
    uint64_t header_bytes, record_stride;
    uint64_t record_offsets[EXPERT_PARTS + 1];
    uint64_t *record_checksums;  /* [n_blocks * n_experts] */
    uint64_t fingerprint;
} expert_store;

typedef struct expert_store_options {
    int direct_io;               /* try direct I/O (falls back to buffered when refused) */
    int verify_checksums;        /* packed: check every record read against its checksum */
} expert_store_options;

/* Extents of every routed expert from the checkpoint's bound tensors (what model_weights holds,
 * without loading the resident weights): [n_blocks][n_experts][EXPERT_PARTS], malloc'd. */
int expert_extents_from_checkpoint(const checkpoint *ck, expert_extent **out, ds4f_error *err);

/* Shards layout. extents as above (copied). */
int expert_store_open_shards(expert_store *st, const checkpoint *ck, const expert_extent *extents,
                             const expert_store_options *opt, ds4f_error *err);
/* Packed layout: refuses a file whose header is damaged, whose fingerprint is not the
 * checkpoint's, or whose sample records differ from the checkpoint's bytes. */
int expert_store_open_packed(expert_store *st, const char *path, const checkpoint *ck, const expert_extent *extents,
                             const expert_store_options *opt, ds4f_error *err);
void expert_store_close(expert_store *st);

/* Fills job's segments to read expert (block, expert) into slot (slot_bytes, IO_ALIGN-aligned)
 * and tells where each part will lie in the slot. */
void expert_store_plan_read(const expert_store *st, int block, int expert, uint8_t *slot, io_job *job,
                            uint64_t part_offsets[EXPERT_PARTS]);
/* After a successful read: packed records are checked against their checksum (error names the
 * file, the record and its offset); shards layout: nothing to check. */
int expert_store_check(const expert_store *st, int block, int expert, const uint8_t *slot, ds4f_error *err);
/* File and offset of an expert's first byte (messages). */
void expert_store_locate(const expert_store *st, int block, int expert, const char **path, uint64_t *offset);

/* The checkpoint's fingerprint: its config.json and every routed expert's extent (shard file
 * name, offset, size). Two checkpoints with equal fingerprints have their experts in the same
 * places; the sample check of open_packed catches different bytes in the same places. */
int expert_checkpoint_fingerprint(const checkpoint *ck, const expert_extent *extents, uint64_t *out,
                                  ds4f_error *err);

/* Record stride of a packed file for this config. */
uint64_t expert_pack_record_stride(const model_config *c);

typedef struct expert_pack_options {
    int show_progress;
    int io_threads;              /* 0: 4 */
    int direct_io;
} expert_pack_options;

typedef struct expert_pack_result {
    uint64_t records, file_bytes, bytes_read;
    double seconds;
} expert_pack_result;

/* Writes every routed expert of the checkpoint into one packed file (via a temporary name; the
 * header goes last, so an interrupted pack never leaves a file that opens). */
int expert_pack_write(const checkpoint *ck, const char *out_path, const expert_pack_options *opt,
                      expert_pack_result *result, ds4f_error *err);

#endif
