/* ds4f pack MODEL --out FILE: every routed expert of a checkpoint in one file of fixed-size,
 * 4 KiB-aligned records (stream/expert_store.h has the format), so that the engine reads each
 * expert with one aligned read (`--experts FILE`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/commands.h"
#include "model/checkpoint.h"
#include "stream/expert_store.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: ds4f pack MODEL_DIR --out FILE [--io-threads N] [--buffered]\n\n"
            "Writes every routed expert of the checkpoint in MODEL_DIR into FILE: fixed-size 4 KiB-aligned\n"
            "records, (layer, expert) -> offset in O(1), a header naming the checkpoint and a checksum\n"
            "per record (verified on every read). Give FILE to the engine with --experts FILE.\n\n"
            "  --out FILE        the packed file (written as FILE.partial, renamed when complete)\n"
            "  --io-threads N    parallel reads (default 4)\n"
            "  --buffered        read and write through the page cache (default: direct I/O)\n");
}

int cmd_pack(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    expert_pack_options opt = {.show_progress = isatty(2), .io_threads = 4, .direct_io = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--io-threads") && i + 1 < argc) {
            opt.io_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--buffered")) {
            opt.direct_io = 0;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "ds4f pack: unknown or incomplete argument '%s'\n\n", argv[i]);
            print_usage(stderr);
            return 2;
        }
    }
    if (!dir || !out) {
        print_usage(stderr);
        return 2;
    }
    ds4f_error err = {{0}};
    checkpoint ck;
    if (checkpoint_open(&ck, dir, &err) != 0) {
        fprintf(stderr, "ds4f pack: %s\n", err.msg);
        checkpoint_close(&ck);
        return 1;
    }
    expert_pack_result res;
    int rc = expert_pack_write(&ck, out, &opt, &res, &err);
    checkpoint_close(&ck);
    if (rc != 0) {
        fprintf(stderr, "ds4f pack: %s\n", err.msg);
        return 1;
    }
    printf("packed %llu experts into %s: %.2f GB in %.1f s (%.2f GB/s read)\n", (unsigned long long)res.records, out,
           (double)res.file_bytes / 1e9, res.seconds, res.seconds > 0 ? (double)res.bytes_read / 1e9 / res.seconds : 0);
    return 0;
}
