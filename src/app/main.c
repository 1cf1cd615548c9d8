/* ds4f command-line entry point: dispatches to the subcommands in src/app/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "app/commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"inspect", cmd_inspect, "check every tensor of a checkpoint and print its inventory"},
    {"synth", cmd_synth, "write a deterministic synthetic checkpoint in the official layout"},
    {"logits", cmd_logits, "run given tokens and write per-position logits (numerics check)"},
    {"tokenize", cmd_tokenize, "encode JSON strings from stdin to token ids (or --decode)"},
    {"plan", cmd_plan, "print the memory plan of a run (refuses if it cannot fit)"},
    {"pack", cmd_pack, "write all routed experts into one file of aligned records (--experts)"},
    {"bench", cmd_bench, "decode speed with expert streaming on synthetic tokens, with the run report"},
    {"replay", cmd_replay, "hit rates of cache policies (LRU, LFRU, next-use, Belady) on an expert trace"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (chat and completions, streaming, tools)"},
    {"run", cmd_run, "generate one answer to a prompt, streamed to stdout"},
    {"chat", cmd_chat, "talk with the model: interactive multi-turn chat"},
    {"check", cmd_check, "run the official continuation vectors on a real checkpoint"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: ds4f COMMAND [options]   (ds4f COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ds4f: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
