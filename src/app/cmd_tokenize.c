/* ds4f tokenize: JSON strings on stdin -> id arrays on stdout (or the reverse with --decode), one
 * per line, with the checkpoint's own tokenizer.json. Used to compare against HF tokenizers. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "app/commands.h"
#include "base/file_io.h"
#include "text/tokenizer.h"
#include "text/tokenizer_jsonl.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: ds4f tokenize --tokenizer PATH [--decode] [--plain]\n"
            "\n"
            "Reads one JSON string per line on stdin and writes its token ids as one JSON array per\n"
            "line on stdout, exactly as Hugging Face tokenizers' encode(text, add_special_tokens=False).\n"
            "\n"
            "  --tokenizer PATH  tokenizer.json, or a checkpoint directory that contains it\n"
            "  -m DIR            same as --tokenizer DIR\n"
            "  --decode          the reverse: JSON arrays of ids in, JSON strings out (bytes that are\n"
            "                    not valid UTF-8 are written as U+FFFD, as HF's decode does)\n"
            "  --plain           do not match added tokens such as <｜User｜>: encode them as text\n"
            "  -h, --help        this help\n"
            "\n"
            "A malformed line stops the command with its line and column on stderr and exit status 1.\n"
            "example: echo '\"Hello world\"' | ds4f tokenize --tokenizer ~/models/DeepSeek-V4-Flash\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    bool decode = false;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--decode")) decode = true;
        else if (!strcmp(a, "--plain")) flags |= TOKENIZER_PLAIN_TEXT;
        else if (!strcmp(a, "--tokenizer") || !strcmp(a, "-m")) {
            if (i + 1 >= argc) { fprintf(stderr, "ds4f tokenize: %s needs a path\n", a); return 2; }
            path = argv[++i];
        } else if (!strncmp(a, "--tokenizer=", 12)) path = a + 12;
        else {
            fprintf(stderr, "ds4f tokenize: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "ds4f tokenize: --tokenizer PATH is required\n\n");
        usage(stderr);
        return 2;
    }
    char file[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) path_join(file, sizeof file, path, "tokenizer.json");
    else snprintf(file, sizeof file, "%s", path);

    ds4f_error err = {{0}};
    tokenizer *tok;
    if (tokenizer_load(file, &tok, &err) != 0) {
        fprintf(stderr, "ds4f tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = tokenizer_jsonl_run(tok, stdin, stdout, decode, flags, &err);
    tokenizer_free(tok);
    if (rc != 0) {
        fprintf(stderr, "ds4f tokenize: %s\n", err.msg);
        return 1;
    }
    return 0;
}
