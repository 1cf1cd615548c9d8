/* ds4f synth DIR --preset tiny|small|full [--experts N] [--layers L] [--seed S]: writes a
 * deterministic synthetic checkpoint in the official Hugging Face layout (see model/synth.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "model/synth.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: ds4f synth DIR --preset tiny|small|full [--experts N] [--layers L] [--seed S] [--threads T]\n"
            "\n"
            "Writes a deterministic synthetic DeepSeek-V4-Flash checkpoint into DIR, in exactly the layout of\n"
            "the official Hugging Face checkpoint: config.json, model-000NN-of-000MM.safetensors shards of at\n"
            "most 4 GB, model.safetensors.index.json, tokenizer.json and tokenizer_config.json.\n"
            "\n"
            "  --preset P    tiny:  hidden 256, 4 layers + MTP, 16 experts (about 13 MB, seconds)\n"
            "                small: hidden 1024, 8 layers + MTP, 32 experts (about 300 MB)\n"
            "                full:  the real dimensions (43 layers + MTP, hidden 4096, vocab 129280)\n"
            "                       with 8 routed experts per layer unless --experts says otherwise\n"
            "                       (8 experts: about 14 GB; 256, the real count: about 160 GB)\n"
            "  --experts N   routed experts per layer (at least 6, the experts each token uses)\n"
            "  --layers L    main layers (the MTP block comes on top; compress ratios follow the real\n"
            "                pattern 0, 0, 4, 128, 4, ...)\n"
            "  --seed S      the values are a function of the seed (default 0): same seed, same bytes\n"
            "  --threads T   value generation threads (default: up to 4)\n"
            "\n"
            "The same options always give byte-identical files. Free space is checked before writing.\n");
}

static int parse_int(const char *flag, const char *text, long long min, long long max, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) {
        fprintf(stderr, "ds4f synth: %s must be an integer in [%lld, %lld], not '%s'\n", flag, min, max, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    synth_options opt;
    synth_options_init(&opt);
    opt.show_progress = 1;
    const char *dir = NULL;
    int have_preset = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_usage(stdout);
            return 0;
        }
        if (a[0] == '-' && a[1]) {
            /* --flag VALUE or --flag=VALUE */
            const char *eq = strchr(a, '=');
            size_t flag_len = eq ? (size_t)(eq - a) : strlen(a);
            const char *value = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
            char flag[32];
            snprintf(flag, sizeof flag, "%.*s", (int)(flag_len < sizeof flag - 1 ? flag_len : sizeof flag - 1), a);
            int known = !strcmp(flag, "--preset") || !strcmp(flag, "--experts") || !strcmp(flag, "--layers") ||
                        !strcmp(flag, "--seed") || !strcmp(flag, "--threads");
            if (!known) {
                fprintf(stderr, "ds4f synth: unknown option '%s' (see ds4f synth --help)\n", a);
                return 2;
            }
            if (!value) {
                fprintf(stderr, "ds4f synth: %s needs a value\n", flag);
                return 2;
            }
            if (!eq) i++;
            long long v;
            if (!strcmp(flag, "--preset")) {
                if (synth_preset_from_name(value, &opt.preset) != 0) {
                    fprintf(stderr, "ds4f synth: unknown preset '%s' (tiny, small or full)\n", value);
                    return 2;
                }
                have_preset = 1;
            } else if (!strcmp(flag, "--experts")) {
                if (parse_int(flag, value, 6, 65536, &v)) return 2;
                opt.experts = (int)v;
            } else if (!strcmp(flag, "--layers")) {
                if (parse_int(flag, value, 1, 126, &v)) return 2;
                opt.layers = (int)v;
            } else if (!strcmp(flag, "--seed")) {
                char *end;
                errno = 0;
                unsigned long long s = strtoull(value, &end, 0);
                if (errno || end == value || *end || value[0] == '-') {
                    fprintf(stderr, "ds4f synth: --seed must be a non-negative integer, not '%s'\n", value);
                    return 2;
                }
                opt.seed = s;
            } else {
                if (parse_int(flag, value, 1, 16, &v)) return 2;
                opt.threads = (int)v;
            }
            continue;
        }
        if (dir) {
            fprintf(stderr, "ds4f synth: more than one output directory ('%s' and '%s')\n", dir, a);
            return 2;
        }
        dir = a;
    }
    if (!dir || !have_preset) {
        fprintf(stderr, "ds4f synth: %s\n\n", !dir ? "missing the output directory" : "missing --preset");
        print_usage(stderr);
        return 2;
    }
    synth_result res;
    ds4f_error err = {{0}};
    if (synth_write(dir, &opt, &res, &err) != 0) {
        fprintf(stderr, "ds4f synth: %s\n", err.msg);
        return 1;
    }
    printf("synth: %s: %d files (%d shard%s), %zu tensors, %llu tensor bytes (%.2f GB), %.1f s, %.0f MB/s\n", dir,
           res.files, res.shards, res.shards == 1 ? "" : "s", res.tensors, (unsigned long long)res.bytes,
           (double)res.bytes / 1e9, res.seconds, res.seconds > 0 ? (double)res.file_bytes / 1e6 / res.seconds : 0.0);
    return 0;
}
