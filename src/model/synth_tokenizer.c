/* The synthetic checkpoint's tokenizer: byte-level BPE with merges learned from an embedded
 * English text, the real DeepSeek-V4 added tokens, and the real file's pre-processing sections.
 *
 * Id layout (the real file's, shrunk): 0..2 BOS / EOS / pad (in the vocabulary and as added
 * tokens), then the 256 byte symbols in the byte-level alphabet's order, then one token per new
 * merge result, then filler words up to the requested size, then the remaining added tokens at
 * the top ids (the real file has them at 128800..129279). */
#include "model/synth.h"

#include <cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/str_map.h"

/* Enough for every merge the training text allows. */
#define SYNTH_MAX_MERGES 8192

/* Written for this project: ordinary English prose, so the merges cover common words, suffixes
 * and the leading-space forms that the pre-tokenizer produces. No digits (they are split into
 * groups of three before BPE anyway). */
static const char training_text[] =
    "Every morning the old library on the corner of the square opens its doors a little before nine. "
    "The first person to arrive is usually the caretaker, who unlocks the side gate, turns on the lights in "
    "the reading room and waters the plants that stand along the windows. Then come the people who have made "
    "the library a part of their day: a retired teacher who reads the newspapers from front to back, two "
    "students who share a table near the stairs, and a man who has been writing the same book for as long as "
    "anyone can remember.\n\n"
    "The building itself is not large. It has one main room with tall shelves, a smaller room for children, "
    "and an office at the back where the books are repaired and sorted. The floors are made of wood and they "
    "make a soft sound when you walk across them. In the winter the heating is never quite warm enough, so "
    "most of the regular visitors keep their coats on and hold their cups of tea with both hands.\n\n"
    "What makes the place special is not the number of books but the way they are looked after. Each new "
    "book is checked, stamped and given a small paper label with its number. When a book comes back damaged, "
    "someone takes the time to fix the spine or clean the pages instead of throwing it away. The people who "
    "work there know which shelves are popular and which ones are almost never touched, and they move the "
    "books around so that the quiet corners are not forgotten.\n\n"
    "In the afternoon the children arrive from school. Some of them come to do their homework, some to "
    "borrow stories, and some simply because their parents will pick them up later and the library is a safe "
    "and friendly place to wait. The librarian reads aloud to the younger ones on Wednesdays. She has a clear "
    "voice and a good memory for the voices of different characters, and the children sit very still while "
    "she turns the pages. \"It's the only place in town where you don't have to buy anything to stay,\" one "
    "of the students said.\n\n"
    "There are also problems, of course. The roof needs to be repaired, the computers are slow, and there is "
    "never enough money for everything that should be done. Every year the town council talks about closing "
    "the library or moving it to a new building outside the center. Every year the people who use it write "
    "letters, sign their names on long lists and come to the meetings to explain why it matters to them. So "
    "far the library has stayed where it is.\n\n"
    "When the evening comes, the light from the tall windows turns orange and then grey. The last visitors "
    "return their books to the desk, put their chairs back under the tables and say good night. The "
    "caretaker walks through the rooms one more time, checks that the windows are closed and switches off "
    "the lights. For a few hours the building is quiet and dark, and the books wait on their shelves for the "
    "morning, when the doors will open again and the day will begin in the same way as before.\n\n"
    "People often ask why such a small place should matter in a world where almost any text can be found on "
    "a screen in a few seconds. The answer is not simple, but it has something to do with time and "
    "attention. In the library nobody is trying to sell you anything. You can sit for an hour with one book, "
    "follow a thought to its end, and leave with a question that you did not have when you came in. That is "
    "a rare thing, and it is worth keeping. What would you choose to read first?\n";

/* The added tokens of the official tokenizer.json (exact strings and flags), without the
 * "place holder" series; ids 0..2 keep their ids, the rest go to the top of the id range. */
typedef struct {
    const char *content;
    int normalized, special;
} added_token;

static const added_token added_tokens[] = {
    {"<｜begin▁of▁sentence｜>", 0, 1},
    {"<｜end▁of▁sentence｜>", 0, 1},
    {"<｜▁pad▁｜>", 0, 1},
    {"<｜fim▁hole｜>", 1, 0},
    {"<｜fim▁begin｜>", 1, 0},
    {"<｜fim▁end｜>", 1, 0},
    {"<｜User｜>", 1, 0},
    {"<｜Assistant｜>", 1, 0},
    {"<|EOT|>", 1, 0},
    {"<｜tool▁calls▁begin｜>", 1, 0},
    {"<｜tool▁calls▁end｜>", 1, 0},
    {"<｜tool▁call▁begin｜>", 1, 0},
    {"<｜tool▁call▁end｜>", 1, 0},
    {"<｜tool▁outputs▁begin｜>", 1, 0},
    {"<｜tool▁outputs▁end｜>", 1, 0},
    {"<｜tool▁output▁begin｜>", 1, 0},
    {"<｜tool▁output▁end｜>", 1, 0},
    {"<｜tool▁sep｜>", 1, 0},
    {"<｜begin▁of▁repo▁name｜>", 1, 0},
    {"<｜end▁of▁repo▁name｜>", 1, 0},
    {"<｜begin▁of▁file▁name｜>", 1, 0},
    {"<｜end▁of▁file▁name｜>", 1, 0},
    {"<｜begin▁of▁file｜>", 1, 0},
    {"<｜end▁of▁file｜>", 1, 0},
    {"<think>", 1, 0},
    {"</think>", 1, 0},
    {"<｜place▁holder▁for▁copy｜>", 1, 0},
    {"<｜place▁holder▁for▁pointer▁replace｜>", 1, 0},
    {"｜DSML｜", 1, 0},
    {"<｜begin▁sys｜>", 1, 0},
    {"<｜end▁sys｜>", 1, 0},
    {"<｜latest_reminder｜>", 1, 0},
    {"<｜action｜>", 1, 0},
    {"<｜query｜>", 1, 0},
    {"<｜authority｜>", 1, 0},
    {"<｜domain｜>", 1, 0},
    {"<｜task｜>", 1, 0},
    {"<｜political｜>", 1, 0},
    {"<｜entity｜>", 1, 0},
    {"<｜title｜>", 1, 0},
    {"<｜safety｜>", 1, 0},
    {"<｜answer｜>", 1, 0},
    {"<｜search｜>", 1, 0},
    {"<dsml:", 1, 0},
    {"</dsml:", 1, 0},
    {"<｜search▁begin｜>", 1, 0},
    {"<｜search▁end｜>", 1, 0},
    {"<｜extracted_url｜>", 1, 0},
    {"<｜read_url｜>", 1, 0},
    {"<｜end_of_query｜>", 0, 1},
    {"<｜rl_image_pad｜>", 0, 1},
    {"<｜rl_image_start｜>", 0, 1},
    {"<｜image2｜>", 0, 0},
    {"<｜/table>｜", 0, 0},
    {"<｜table｜>", 0, 0},
    {"<｜/td｜>", 0, 0},
    {"<｜td｜>", 0, 0},
    {"<｜/tr｜>", 0, 0},
    {"<｜tr｜>", 0, 0},
    {"<｜/polygon｜>", 0, 1},
    {"<｜polygon｜>", 0, 1},
    {"<｜/point｜>", 0, 1},
    {"<｜point｜>", 0, 1},
    {"<｜/box｜>", 0, 1},
    {"<｜box｜>", 0, 1},
    {"<｜/ref｜>", 0, 1},
    {"<｜ref｜>", 0, 1},
    {"<｜image｜>", 0, 1},
};
#define N_ADDED ((int)(sizeof added_tokens / sizeof added_tokens[0]))
#define N_LEADING_SPECIALS 3 /* BOS, EOS, pad: ids 0..2 */

/* Sections copied verbatim from the official tokenizer.json: the Split regexes must be identical,
 * or the synthetic tokenizer would exercise a different pre-tokenizer than the real one. */
static const char normalizer_json[] = "{\"type\": \"Sequence\", \"normalizers\": []}";
static const char pre_tokenizer_json[] =
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, "
    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Split\", \"pattern\": {\"Regex\": "
    "\"[一-龥぀-ゟ゠-ヿ]+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Split\", \"pattern\": "
    "{\"Regex\": \"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?"
    "[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": "
    "\"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": "
    "true, \"use_regex\": false}]}";
static const char post_processor_json[] =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true}";
static const char decoder_json[] =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}";

static const char tokenizer_config_json[] =
    "{\n"
    "  \"add_bos_token\": false,\n"
    "  \"add_eos_token\": false,\n"
    "  \"bos_token\": {\n"
    "    \"__type\": \"AddedToken\",\n"
    "    \"content\": \"<｜begin▁of▁sentence｜>\",\n"
    "    \"lstrip\": false,\n"
    "    \"normalized\": true,\n"
    "    \"rstrip\": false,\n"
    "    \"single_word\": false\n"
    "  },\n"
    "  \"clean_up_tokenization_spaces\": false,\n"
    "  \"eos_token\": {\n"
    "    \"__type\": \"AddedToken\",\n"
    "    \"content\": \"<｜end▁of▁sentence｜>\",\n"
    "    \"lstrip\": false,\n"
    "    \"normalized\": true,\n"
    "    \"rstrip\": false,\n"
    "    \"single_word\": false\n"
    "  },\n"
    "  \"legacy\": true,\n"
    "  \"model_max_length\": 1048576,\n"
    "  \"pad_token\": {\n"
    "    \"__type\": \"AddedToken\",\n"
    "    \"content\": \"<｜end▁of▁sentence｜>\",\n"
    "    \"lstrip\": false,\n"
    "    \"normalized\": true,\n"
    "    \"rstrip\": false,\n"
    "    \"single_word\": false\n"
    "  },\n"
    "  \"sp_model_kwargs\": {},\n"
    "  \"unk_token\": null,\n"
    "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n"
    "}";

const char *synth_tokenizer_config_json(void) { return tokenizer_config_json; }

/* The byte-level alphabet (GPT-2's bytes_to_unicode): printable bytes stand for themselves, the
 * other 68 map to U+0100 onwards in byte order. byte_order lists bytes printable-first, which is
 * the order of the byte symbols in the vocabulary. */
static int is_printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

static void byte_level_alphabet(char symbol[256][3], int byte_order[256]) {
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++)
        if (is_printable_byte(b)) byte_order[n++] = b;
    for (int b = 0; b < 256; b++)
        if (!is_printable_byte(b)) byte_order[n++] = b;
    for (int b = 0; b < 256; b++) {
        unsigned cp = is_printable_byte(b) ? (unsigned)b : 256u + (unsigned)extra++;
        if (cp < 0x80) {
            symbol[b][0] = (char)cp;
            symbol[b][1] = 0;
        } else {
            symbol[b][0] = (char)(0xC0 | (cp >> 6));
            symbol[b][1] = (char)(0x80 | (cp & 0x3F));
            symbol[b][2] = 0;
        }
    }
}

/* ---- BPE training ---- */

typedef struct {
    int *symbols;
    int n, count;
} word;

typedef struct {
    char **strings; /* symbol id -> byte-level string; ids 0..255 are the bytes */
    int n, capacity;
    str_map by_string;
    int *merge_left, *merge_right; /* [SYNTH_MAX_MERGES] */
    int n_merges;
} bpe_model;

static int add_symbol(bpe_model *m, char *s) {
    if (m->n == m->capacity) {
        int cap = m->capacity ? 2 * m->capacity : 1024;
        char **p = realloc(m->strings, (size_t)cap * sizeof *p);
        if (!p) return -1;
        m->strings = p;
        m->capacity = cap;
    }
    m->strings[m->n] = s;
    if (str_map_put(&m->by_string, s, (void *)(intptr_t)(m->n + 1)) < 0) return -1;
    return m->n++;
}

static void bpe_free(bpe_model *m) {
    for (int i = 0; i < m->n; i++) free(m->strings[i]);
    free(m->strings);
    free(m->merge_left);
    free(m->merge_right);
    str_map_free(&m->by_string);
}

/* The pieces the official pre-tokenizer makes of plain ASCII prose, closely enough for learning
 * merges: "[punct][A-Za-z]+", an optional non-letter (usually a space) + letters, " ?[punct]+"
 * with trailing newlines, and whitespace runs (the space before a word stays with the word). */
static size_t next_piece(const char *t, size_t i, size_t len) {
    size_t j = i;
    unsigned char c = (unsigned char)t[i];
    if (ispunct(c) && i + 1 < len && isalpha((unsigned char)t[i + 1])) {
        j = i + 1;
        while (j < len && isalpha((unsigned char)t[j])) j++;
        return j;
    }
    if (isalpha(c) || (c != '\n' && c != '\r' && !ispunct(c) && i + 1 < len && isalpha((unsigned char)t[i + 1]))) {
        j = i + 1;
        while (j < len && isalpha((unsigned char)t[j])) j++;
        return j;
    }
    if (ispunct(c) || (c == ' ' && i + 1 < len && ispunct((unsigned char)t[i + 1]))) {
        j = c == ' ' ? i + 1 : i;
        while (j < len && ispunct((unsigned char)t[j])) j++;
        while (j < len && (t[j] == '\n' || t[j] == '\r')) j++;
        return j;
    }
    while (j < len && isspace((unsigned char)t[j])) j++;
    /* A run of spaces before a word gives up its last space to the word. */
    if (j < len && j - i > 1 && t[j - 1] == ' ') j--;
    return j > i ? j : i + 1; /* anything else (a digit, say) is a piece of its own */
}

typedef struct {
    uint64_t pair; /* left << 32 | right */
    int count;
} pair_count;

static int compare_pairs(const void *a, const void *b) {
    uint64_t x = ((const pair_count *)a)->pair, y = ((const pair_count *)b)->pair;
    return x < y ? -1 : x > y;
}

/* Learns merges in order of pair frequency: first every pair seen at least twice (the "natural"
 * vocabulary), then, when max_new_symbols asks for more, pairs seen once (whole words of the
 * text), until the text is all whole pieces. */
static int bpe_train(bpe_model *m, int max_new_symbols, ds4f_error *err) {
    memset(m, 0, sizeof *m);
    str_map_init(&m->by_string);
    m->merge_left = malloc(SYNTH_MAX_MERGES * sizeof *m->merge_left);
    m->merge_right = malloc(SYNTH_MAX_MERGES * sizeof *m->merge_right);
    if (!m->merge_left || !m->merge_right) {
        bpe_free(m);
        return error_set(err, "out of memory");
    }
    char symbol[256][3];
    int byte_order[256];
    byte_level_alphabet(symbol, byte_order);
    for (int b = 0; b < 256; b++) {
        char *s = strdup(symbol[b]);
        if (!s || add_symbol(m, s) < 0) { free(s); return error_set(err, "out of memory"); }
    }
    /* Distinct pieces with their counts. */
    const size_t len = sizeof training_text - 1;
    word *words = NULL;
    int n_words = 0, cap_words = 0, rc = -1;
    str_map piece_index;
    str_map_init(&piece_index);
    char **piece_keys = NULL;
    pair_count *pairs = NULL;
    for (size_t i = 0; i < len;) {
        size_t j = next_piece(training_text, i, len);
        char *key = strndup(training_text + i, j - i);
        if (!key) goto oom;
        intptr_t found = (intptr_t)str_map_get(&piece_index, key);
        if (found) {
            words[found - 1].count++;
            free(key);
        } else {
            if (n_words == cap_words) {
                cap_words = cap_words ? 2 * cap_words : 256;
                word *w = realloc(words, (size_t)cap_words * sizeof *w);
                char **k = realloc(piece_keys, (size_t)cap_words * sizeof *k);
                if (w) words = w;
                if (k) piece_keys = k;
                if (!w || !k) { free(key); goto oom; }
            }
            word *w = &words[n_words];
            w->n = (int)(j - i);
            w->count = 1;
            w->symbols = malloc((size_t)w->n * sizeof *w->symbols);
            if (!w->symbols) { free(key); goto oom; }
            for (int k = 0; k < w->n; k++) w->symbols[k] = (unsigned char)key[k];
            piece_keys[n_words] = key;
            n_words++;
            if (str_map_put(&piece_index, key, (void *)(intptr_t)n_words) < 0) goto oom;
        }
        i = j;
    }
    size_t max_pairs = len;
    pairs = malloc(max_pairs * sizeof *pairs);
    if (!pairs) goto oom;
    while (m->n_merges < SYNTH_MAX_MERGES) {
        size_t np = 0;
        for (int w = 0; w < n_words; w++)
            for (int k = 0; k + 1 < words[w].n; k++) {
                pairs[np].pair = (uint64_t)words[w].symbols[k] << 32 | (uint32_t)words[w].symbols[k + 1];
                pairs[np].count = words[w].count;
                np++;
            }
        qsort(pairs, np, sizeof *pairs, compare_pairs);
        uint64_t best = 0;
        int best_count = 0;
        for (size_t a = 0; a < np;) {
            size_t b = a;
            int count = 0;
            while (b < np && pairs[b].pair == pairs[a].pair) count += pairs[b++].count;
            /* Ties go to the lexicographically smaller pair of strings: a fixed, readable order. */
            int better = count > best_count;
            if (!better && count == best_count && count > 0) {
                int c = strcmp(m->strings[pairs[a].pair >> 32], m->strings[best >> 32]);
                if (c == 0) c = strcmp(m->strings[(uint32_t)pairs[a].pair], m->strings[(uint32_t)best]);
                better = c < 0;
            }
            if (better) { best = pairs[a].pair; best_count = count; }
            a = b;
        }
        if (best_count < 1 || (best_count < 2 && m->n - 256 >= max_new_symbols)) break;
        int left = (int)(best >> 32), right = (int)(uint32_t)best;
        size_t ll = strlen(m->strings[left]), rl = strlen(m->strings[right]);
        char *joined = malloc(ll + rl + 1);
        if (!joined) goto oom;
        memcpy(joined, m->strings[left], ll);
        memcpy(joined + ll, m->strings[right], rl + 1);
        /* Training text is byte-level encoded only through the symbol strings, so the joined
         * string may already exist (the same text reached through another split). */
        intptr_t existing = (intptr_t)str_map_get(&m->by_string, joined);
        int merged;
        if (existing) {
            merged = (int)existing - 1;
            free(joined);
        } else if ((merged = add_symbol(m, joined)) < 0) {
            free(joined);
            goto oom;
        }
        m->merge_left[m->n_merges] = left;
        m->merge_right[m->n_merges] = right;
        m->n_merges++;
        for (int w = 0; w < n_words; w++) {
            int *s = words[w].symbols, out = 0;
            for (int k = 0; k < words[w].n; k++) {
                if (k + 1 < words[w].n && s[k] == left && s[k + 1] == right) {
                    s[out++] = merged;
                    k++;
                } else {
                    s[out++] = s[k];
                }
            }
            words[w].n = out;
        }
    }
    rc = 0;
    goto done;
oom:
    rc = error_set(err, "out of memory training the synthetic tokenizer");
done:
    for (int w = 0; w < n_words; w++) {
        free(words[w].symbols);
        free(piece_keys[w]);
    }
    free(words);
    free(piece_keys);
    free(pairs);
    str_map_free(&piece_index);
    if (rc != 0) bpe_free(m);
    return rc;
}

int synth_tokenizer_natural_size(void) {
    bpe_model m;
    ds4f_error err;
    if (bpe_train(&m, 0, &err) != 0) return -1;
    int merged_symbols = m.n - 256;
    bpe_free(&m);
    return N_LEADING_SPECIALS + 256 + merged_symbols + (N_ADDED - N_LEADING_SPECIALS);
}

/* Filler word i: a space and three consonant-vowel syllables (" kotabe"), so sampled filler ids
 * read as made-up words. 17 * 5 = 85 syllables give 614,125 words, far more than any vocabulary
 * needs. */
static void filler_word(uint32_t i, char *out) {
    static const char consonants[] = "bdfghjklmnprstvwz", vowels[] = "aeiou";
    memcpy(out, "\xC4\xA0", 2); /* "Ġ", the byte-level space */
    char *p = out + 2;
    for (int s = 0; s < 3; s++) {
        uint32_t syllable = i % 85;
        i /= 85;
        *p++ = consonants[syllable / 5];
        *p++ = vowels[syllable % 5];
    }
    *p = 0;
}

int synth_tokenizer_json(int vocab_size, char **json, size_t *json_len, ds4f_error *err) {
    *json = NULL;
    bpe_model m;
    const int fixed_ids = 256 + N_ADDED; /* byte symbols and added tokens */
    if (bpe_train(&m, vocab_size - fixed_ids, err) != 0) return -1;
    const int merged_symbols = m.n - 256;
    const int natural = fixed_ids + merged_symbols;
    if (vocab_size < natural) {
        bpe_free(&m);
        return error_set(err, "the synthetic tokenizer needs %d ids; vocab_size %d is too small", natural, vocab_size);
    }
    char symbol[256][3];
    int byte_order[256];
    byte_level_alphabet(symbol, byte_order);

    int rc = -1;
    cJSON *root = cJSON_CreateObject(), *sections[4] = {0};
    const char *section_text[4] = {normalizer_json, pre_tokenizer_json, post_processor_json, decoder_json};
    const char *section_name[4] = {"normalizer", "pre_tokenizer", "post_processor", "decoder"};
    char **fillers = NULL;
    int n_fillers = vocab_size - natural;
    if (!root) goto oom;
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    const int first_top_added = vocab_size - (N_ADDED - N_LEADING_SPECIALS);
    for (int i = 0; i < N_ADDED; i++) {
        cJSON *a = cJSON_CreateObject();
        if (!a) goto oom;
        cJSON_AddNumberToObject(a, "id", i < N_LEADING_SPECIALS ? i : first_top_added + i - N_LEADING_SPECIALS);
        cJSON_AddStringToObject(a, "content", added_tokens[i].content);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", added_tokens[i].normalized);
        cJSON_AddBoolToObject(a, "special", added_tokens[i].special);
        cJSON_AddItemToArray(added, a);
    }
    for (int s = 0; s < 4; s++) {
        sections[s] = cJSON_Parse(section_text[s]);
        if (!sections[s]) {
            rc = error_set(err, "internal: the embedded %s section is not valid JSON", section_name[s]);
            goto done;
        }
        cJSON_AddItemToObject(root, section_name[s], sections[s]);
        sections[s] = NULL;
    }
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    if (!model) goto oom;
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    if (!vocab) goto oom;
    int id = 0;
    for (int i = 0; i < N_LEADING_SPECIALS; i++) cJSON_AddNumberToObject(vocab, added_tokens[i].content, id++);
    for (int i = 0; i < 256; i++) cJSON_AddNumberToObject(vocab, symbol[byte_order[i]], id++);
    for (int s = 256; s < m.n; s++) cJSON_AddNumberToObject(vocab, m.strings[s], id++);
    if (n_fillers > 0) {
        fillers = calloc((size_t)n_fillers, sizeof *fillers);
        if (!fillers) goto oom;
    }
    for (uint32_t candidate = 0, made = 0; (int)made < n_fillers; candidate++) {
        char word_text[16];
        filler_word(candidate, word_text);
        if (str_map_get(&m.by_string, word_text)) continue; /* already a merge result */
        fillers[made] = strdup(word_text);
        if (!fillers[made]) goto oom;
        cJSON_AddNumberToObject(vocab, fillers[made], id++);
        made++;
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    if (!merges) goto oom;
    for (int k = 0; k < m.n_merges; k++) {
        char text[256];
        snprintf(text, sizeof text, "%s %s", m.strings[m.merge_left[k]], m.strings[m.merge_right[k]]);
        cJSON *s = cJSON_CreateString(text);
        if (!s) goto oom;
        cJSON_AddItemToArray(merges, s);
    }
    if (id != first_top_added) {
        rc = error_set(err, "internal: synthetic tokenizer ids end at %d, expected %d", id, first_top_added);
        goto done;
    }
    *json = cJSON_Print(root);
    if (!*json) goto oom;
    *json_len = strlen(*json);
    rc = 0;
    goto done;
oom:
    rc = error_set(err, "out of memory building the synthetic tokenizer");
done:
    for (int s = 0; s < 4; s++) cJSON_Delete(sections[s]);
    cJSON_Delete(root);
    for (int i = 0; fillers && i < n_fillers; i++) free(fillers[i]);
    free(fillers);
    bpe_free(&m);
    return rc;
}
