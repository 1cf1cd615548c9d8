/* ds4f plan -m DIR [--ram SIZE] [--ctx N] ...: the memory plan of a run, without running it
 * (reads headers only). Exit status 1 when the plan does not fit the budget. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "app/report.h"
#include "model/checkpoint.h"
#include "stream/expert_store.h"
#include "stream/memory_plan.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: ds4f plan -m DIR [--ram SIZE] [--ctx N] [--chunk N] [--sessions N] [--cache-slots N]\n"
            "                 [--experts FILE] [--io-threads N]\n\n"
            "Prints the memory plan a run of the model in DIR would make: resident weights, decode state at\n"
            "the context, scratch, I/O, expert cache slots; refuses (exit 1) when it exceeds the budget.\n"
            "Reads headers only.\n\n"
            "  -m DIR            checkpoint directory\n"
            "  --sessions N      sessions to plan for (default 1)\n%s",
            stream_flags_help);
}

int cmd_plan(int argc, char **argv) {
    const char *dir = NULL;
    ds4f_model_options opt;
    ds4f_model_options_init(&opt);
    int sessions = 1;
    for (int i = 1; i < argc;) {
        int r = stream_flag_parse(argc, argv, &i, &opt);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--sessions") && i + 1 < argc) {
            sessions = atoi(argv[++i]);
        } else {
            fprintf(stderr, "ds4f plan: unknown or incomplete argument '%s'\n\n", argv[i]);
            print_usage(stderr);
            return 2;
        }
        i++;
    }
    if (!dir) {
        print_usage(stderr);
        return 2;
    }
    ds4f_error err = {{0}};
    checkpoint ck;
    if (checkpoint_open(&ck, dir, &err) != 0) {
        fprintf(stderr, "ds4f plan: %s\n", err.msg);
        checkpoint_close(&ck);
        return 1;
    }
    expert_extent *extents = NULL;
    expert_store store = {0};
    expert_store_options so = {.direct_io = !opt.buffered_io, .verify_checksums = 1};
    int rc = 1;
    if (expert_extents_from_checkpoint(&ck, &extents, &err) != 0 ||
        (opt.experts_file ? expert_store_open_packed(&store, opt.experts_file, &ck, extents, &so, &err)
                          : expert_store_open_shards(&store, &ck, extents, &so, &err)) != 0) {
        fprintf(stderr, "ds4f plan: %s\n", err.msg);
        goto done;
    }
    memory_plan_request req = {.budget_bytes = opt.ram_bytes,
                               .context = opt.context > 0 ? opt.context : DS4F_DEFAULT_CONTEXT,
                               .sessions = sessions,
                               .chunk = opt.chunk > 0 ? opt.chunk : DS4F_DEFAULT_CHUNK,
                               .cache_slots = opt.cache_slots,
                               .slot_bytes = store.slot_bytes,
                               .io_threads = opt.io_threads > 0 ? opt.io_threads : DS4F_DEFAULT_IO_THREADS,
                               .packed = store.packed};
    memory_plan plan;
    if (memory_plan_build(&ck, &req, &plan, &err) != 0) {
        fprintf(stderr, "ds4f plan: %s\n", err.msg);
        goto done;
    }
    memory_plan_print(&plan, stdout);
    printf("  experts from %s, %s I/O\n", store.packed ? store.files[0].path : "the checkpoint's shards",
           store.direct_io ? "direct" : "buffered (page cache)");
    rc = plan.fits ? 0 : 1;
    if (!plan.fits) fprintf(stderr, "ds4f plan: %s\n", plan.refusal);
done:
    expert_store_close(&store);
    free(extents);
    checkpoint_close(&ck);
    return rc;
}
