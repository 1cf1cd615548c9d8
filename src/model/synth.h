/* Synthetic checkpoints: a deterministic DeepSeek-V4-Flash model in exactly the official Hugging
 * Face layout (config.json, model-000NN-of-000MM.safetensors shards, model.safetensors.index.json,
 * tokenizer.json, tokenizer_config.json), for tests, the demo and I/O / speed work at the real
 * dimensions without downloading 160 GB.
 *
 * The shards hold every tensor of tensor_list_build(config) exactly once. Values are a pure
 * function of (seed, tensor name, element index) through a counter-based generator, so tensors
 * are produced in row chunks in any order and by any number of threads, and the same seed gives
 * byte-identical files. Scales are chosen so that the model computes sanely (see synth.c):
 * activations stay bounded through every layer, the router has clear margins, and the logits have
 * a spread of a few units, so that sampling from a synthetic model gives varied text. */
#ifndef DS4F_MODEL_SYNTH_H
#define DS4F_MODEL_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum {
    SYNTH_PRESET_TINY,  /* hidden 256, 4 layers + MTP, 16 experts: seconds to write and to run */
    SYNTH_PRESET_SMALL, /* hidden 1024, 8 layers + MTP, 32 experts: a few hundred MB */
    SYNTH_PRESET_FULL,  /* the real dimensions (43 layers, hidden 4096, vocab 129280), few experts */
} synth_preset;

typedef struct synth_options {
    synth_preset preset;
    int experts;              /* routed experts per layer; 0: the preset's (tiny 16, small 32, full 8) */
    int layers;               /* main layers (the MTP block comes on top); 0: the preset's */
    uint64_t seed;
    int threads;              /* value generation threads; 0: up to 4, as many as there are CPUs */
    uint64_t max_shard_bytes; /* tensor bytes per shard at most (a bigger tensor gets its own); 0: 4 GB */
    int show_progress;        /* progress bar on stderr (drawn only on a terminal) */
} synth_options;

void synth_options_init(synth_options *opt);
/* "tiny", "small", "full" -> preset; -1 if unknown. */
int synth_preset_from_name(const char *name, synth_preset *out);

/* The config.json text the options imply (malloc'd). It passes config_parse. */
int synth_config_json(const synth_options *opt, char **json, ds4f_error *err);

typedef struct synth_result {
    int files;          /* files written, the index included */
    int shards;
    size_t tensors;
    uint64_t bytes;     /* tensor bytes (metadata.total_size) */
    uint64_t file_bytes; /* everything written, headers and JSON included */
    double seconds;
} synth_result;

/* Writes the checkpoint into dir (created if missing). Refuses before writing anything when the
 * file system lacks the space. Each file goes through a temporary name; the index is written last
 * (and an index left by an earlier run is removed first), so an interrupted run never leaves a
 * directory that looks complete. */
int synth_write(const char *dir, const synth_options *opt, synth_result *result, ds4f_error *err);

/* Tokenizer (synth_tokenizer.c): a byte-level BPE vocabulary (the 256 byte symbols plus merges
 * learned from an embedded English text) with the real DeepSeek-V4 added tokens (BOS id 0, EOS
 * id 1, the chat and tool markers) and the real file's normalizer, pre-tokenizer and decoder.
 * Its natural size is the number of ids it needs; synth_tokenizer_json pads the vocabulary with
 * pronounceable filler words up to vocab_size (>= the natural size), so every id the model can
 * produce decodes. The tokenizer does not depend on the seed. */
int synth_tokenizer_natural_size(void);
int synth_tokenizer_json(int vocab_size, char **json, size_t *len, ds4f_error *err);
/* tokenizer_config.json (the official file: no BOS added automatically). */
const char *synth_tokenizer_config_json(void);

#endif
