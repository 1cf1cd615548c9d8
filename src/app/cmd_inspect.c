/* ds4f inspect DIR: binds every tensor of a checkpoint against the model description and prints
 * the inventory; lists every problem and exits 1 if anything is wrong. Reads headers only. */
#include <stdio.h>
#include <string.h>

#include "app/commands.h"
#include "model/checkpoint.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: ds4f inspect DIR\n\n"
            "Checks config.json and every tensor of the checkpoint in DIR (names, dtypes, shapes,\n"
            "extents; reads headers only) and prints the inventory. Exit status 1 on any problem.\n");
}

int cmd_inspect(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        print_usage(argc == 2 ? stdout : stderr);
        return argc == 2 ? 0 : 2;
    }
    const char *dir = argv[1];
    checkpoint ck;
    ds4f_error err = {{0}};
    if (checkpoint_open(&ck, dir, &err) != 0) {
        if (ck.n_problems) {
            fprintf(stderr, "ds4f inspect: %s: %zu problem%s:\n", dir, ck.n_problems, ck.n_problems == 1 ? "" : "s");
            for (size_t i = 0; i < ck.n_problems_kept; i++) fprintf(stderr, "  %s\n", ck.problems[i]);
            if (ck.n_problems > ck.n_problems_kept)
                fprintf(stderr, "  ... and %zu more\n", ck.n_problems - ck.n_problems_kept);
        } else {
            fprintf(stderr, "ds4f inspect: %s\n", err.msg);
        }
        checkpoint_close(&ck);
        return 1;
    }
    const model_config *c = &ck.config;
    inventory inv;
    checkpoint_inventory(&ck, &inv);
    printf("checkpoint  %s\n", dir);
    printf("model       %d layers + %d MTP, hidden %d, %d heads x %d, %d routed experts (top %d), vocab %d\n",
           c->num_hidden_layers, c->num_nextn_predict_layers, c->hidden_size, c->num_attention_heads, c->head_dim,
           c->n_routed_experts, c->num_experts_per_tok, c->vocab_size);
    printf("shards      %zu\n", ck.n_shards);
    printf("tensors     %zu\n", inv.tensors);
    printf("bytes       %llu (%.2f GB)\n", (unsigned long long)inv.bytes, (double)inv.bytes / 1e9);
    for (int t = 0; t < 16; t++) {
        if (!inv.tensors_by_dtype[t]) continue;
        printf("  %-8s  %7zu tensors  %15llu bytes\n", dtype_name((dtype)t), inv.tensors_by_dtype[t],
               (unsigned long long)inv.bytes_by_dtype[t]);
    }
    printf("routed experts  %zu x %llu bytes = %llu (%.2f GB; %llu without MTP)\n", inv.routed_experts,
           (unsigned long long)inv.expert_bytes_each, (unsigned long long)inv.routed_expert_bytes,
           (double)inv.routed_expert_bytes / 1e9, (unsigned long long)inv.routed_expert_bytes_main);
    printf("resident    %llu bytes (%.2f GB): everything but the routed experts\n",
           (unsigned long long)(inv.bytes - inv.routed_expert_bytes), (double)(inv.bytes - inv.routed_expert_bytes) / 1e9);
    printf("ok\n");
    checkpoint_close(&ck);
    return 0;
}
