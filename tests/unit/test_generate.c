/* Generation API on the golden `small` checkpoint (vocabulary 1024) with the synthetic tokenizer
 * padded to that size: prompt reuse (counted, and giving the same tokens as a fresh session),
 * replay on divergence, determinism, stop tokens and strings (no partial match leaks), length
 * limits, cancellation from a callback, from the prefill and from another thread. */
#include "test.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <string.h>

#include "ds4f.h"
#include "model/synth.h"
#include "text/tokenizer.h"

static ds4f_model *model;
static ds4f_tokenizer *tok;

/* Opened once for every test of this file (loading is the slow part). */
static int setup(void) {
    if (model) return 0;
    ds4f_error err;
    if (ds4f_model_open("tests/data/golden/small", NULL, &model, &err) != 0) {
        test_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return -1;
    }
    char *json;
    size_t len;
    if (synth_tokenizer_json(1024, &json, &len, &err) != 0 ||
        tokenizer_load_from_memory(json, len, "synthetic tokenizer.json", &tok, &err) != 0) {
        test_fail(__FILE__, __LINE__, "tokenizer: %s", err.msg);
        return -1;
    }
    free(json);
    return 0;
}

static ds4f_generator *new_generator(int context, int chunk) {
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = context;
    so.chunk = chunk;
    ds4f_generator *g = NULL;
    ds4f_error err;
    if (ds4f_generator_create(model, &so, tok, &g, &err) != 0) test_fail(__FILE__, __LINE__, "create: %s", err.msg);
    return g;
}

/* What the callbacks saw. */
typedef struct collected {
    int32_t ids[512];
    int n_ids;
    char text[8192];
    size_t text_len;
    int events, final_events;
    int cancel_at;             /* on_token returns 1 at this index (-1: never) */
    int prefill_calls, cancel_prefill_after; /* on_prefill returns 1 after this many chunks (-1: never) */
    int last_done, last_total;
} collected;

static void collected_init(collected *c) {
    memset(c, 0, sizeof *c);
    c->cancel_at = -1;
    c->cancel_prefill_after = -1;
}

static int on_token(void *user, const ds4f_token_event *ev) {
    collected *c = user;
    c->events++;
    if (ev->id < 0) {
        c->final_events++;
    } else {
        if (c->n_ids < 512) c->ids[c->n_ids++] = ev->id;
        if (ev->logits == NULL || ev->vocab != 1024) test_fail(__FILE__, __LINE__, "event without logits");
    }
    if (c->text_len + ev->len < sizeof c->text) {
        memcpy(c->text + c->text_len, ev->text, ev->len);
        c->text_len += ev->len;
    }
    return ev->id >= 0 && ev->index == c->cancel_at;
}

static int on_prefill(void *user, int done, int total) {
    collected *c = user;
    c->last_done = done;
    c->last_total = total;
    return c->prefill_calls++ == c->cancel_prefill_after + 1 && c->cancel_prefill_after >= 0;
}

static void params_for(ds4f_generate_params *p, collected *c, float temperature, uint64_t seed, int max_tokens) {
    ds4f_generate_params_init(p);
    p->sampling.temperature = temperature;
    p->sampling.seed = seed;
    p->max_tokens = max_tokens;
    p->on_token = on_token;
    p->on_prefill = on_prefill;
    p->user = c;
    /* the golden model is random: EOS (id 1) would end some runs early, which these tests do
     * not want unless they ask for it */
    p->stop_at_eos = 0;
}

static void prompt_of(int32_t *p, int n, int salt) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 37 + salt * 101 + 5) % 1000) + 2;
}

TEST(generate_prefix_reuse_evaluates_only_new_tokens) {
    if (setup()) return;
    ds4f_generator *g = new_generator(256, 16), *fresh = new_generator(256, 16);
    REQUIRE(g && fresh, "generators");
    ds4f_error err;
    int32_t prompt[64];
    prompt_of(prompt, 40, 1);
    collected c1;
    collected_init(&c1);
    ds4f_generate_params p;
    params_for(&p, &c1, 0, 0, 5);
    ds4f_generate_result r;
    REQUIRE(ds4f_generate(g, prompt, 40, &p, &r, &err) == 0, "turn 1: %s", err.msg);
    CHECK(r.finish == DS4F_FINISH_LENGTH && r.generated_tokens == 5 && c1.n_ids == 5, "turn 1 length: %d", r.generated_tokens);
    CHECK(r.cached_tokens == 0 && r.prefill_tokens == 40 && !r.replayed, "turn 1 prefills all");
    CHECK(r.decode_tokens == 4, "the last sampled token is not evaluated (%d)", r.decode_tokens);
    CHECK(c1.last_done == 40 && c1.last_total == 40 && c1.prefill_calls == 1 + 3, "prefill progress in chunks of 16");
    int n_consumed;
    const int32_t *consumed = ds4f_generator_tokens(g, &n_consumed);
    CHECK(n_consumed == 44, "consumed %d", n_consumed);
    CHECK(memcmp(consumed, prompt, 40 * sizeof *prompt) == 0 && memcmp(consumed + 40, c1.ids, 4 * sizeof *prompt) == 0,
          "consumed = prompt + generated tokens but the last");

    /* turn 2: the conversation so far + the last answer token + 3 new tokens */
    int32_t prompt2[64];
    memcpy(prompt2, prompt, 40 * sizeof *prompt);
    memcpy(prompt2 + 40, c1.ids, 5 * sizeof *prompt);
    prompt2[45] = 7, prompt2[46] = 8, prompt2[47] = 9;
    collected c2, c2_fresh;
    collected_init(&c2);
    collected_init(&c2_fresh);
    params_for(&p, &c2, 0, 0, 6);
    REQUIRE(ds4f_generate(g, prompt2, 48, &p, &r, &err) == 0, "turn 2: %s", err.msg);
    CHECK(r.cached_tokens == 44 && r.prefill_tokens == 4 && !r.replayed, "turn 2 reuses 44 and prefills 4 (cached %d, prefill %d)",
          r.cached_tokens, r.prefill_tokens);
    params_for(&p, &c2_fresh, 0, 0, 6);
    REQUIRE(ds4f_generate(fresh, prompt2, 48, &p, &r, &err) == 0, "fresh: %s", err.msg);
    CHECK(r.cached_tokens == 0 && r.prefill_tokens == 48, "fresh session prefills all");
    CHECK(c2.n_ids == 6 && memcmp(c2.ids, c2_fresh.ids, 6 * sizeof *c2.ids) == 0, "reuse gives the tokens of a fresh session");

    ds4f_generator_stats st;
    ds4f_generator_get_stats(g, &st);
    CHECK(st.requests == 2 && st.prompt_evaluated == 44 && st.prompt_reused == 44 && st.replays == 0 &&
              st.generated == 11 && st.position == 53 && st.context == 256,
          "stats: requests %lld evaluated %lld reused %lld replays %lld generated %lld position %lld", (long long)st.requests,
          (long long)st.prompt_evaluated, (long long)st.prompt_reused, (long long)st.replays, (long long)st.generated,
          (long long)st.position);
    ds4f_generator_free(g);
    ds4f_generator_free(fresh);
}

TEST(generate_divergent_prompt_replays) {
    if (setup()) return;
    ds4f_generator *g = new_generator(256, 64), *fresh = new_generator(256, 64);
    REQUIRE(g && fresh, "generators");
    ds4f_error err;
    int32_t a[32], b[32];
    prompt_of(a, 30, 2);
    memcpy(b, a, sizeof a);
    b[12] = 3; /* diverges in the middle */
    collected c, cf;
    collected_init(&c);
    collected_init(&cf);
    ds4f_generate_params p;
    params_for(&p, &c, 0, 0, 2);
    ds4f_generate_result r;
    REQUIRE(ds4f_generate(g, a, 30, &p, &r, &err) == 0, "%s", err.msg);
    collected_init(&c);
    params_for(&p, &c, 0, 0, 4);
    REQUIRE(ds4f_generate(g, b, 30, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.replayed && r.cached_tokens == 0 && r.prefill_tokens == 30, "divergence replays from 0");
    params_for(&p, &cf, 0, 0, 4);
    REQUIRE(ds4f_generate(fresh, b, 30, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(memcmp(c.ids, cf.ids, 4 * sizeof *c.ids) == 0, "replay gives the tokens of a fresh session");
    /* a prompt that is a strict prefix of what was consumed cannot be rewound either */
    collected_init(&c);
    params_for(&p, &c, 0, 0, 1);
    REQUIRE(ds4f_generate(g, b, 20, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.replayed && r.prefill_tokens == 20, "shorter prompt replays");
    ds4f_generator_stats st;
    ds4f_generator_get_stats(g, &st);
    CHECK(st.replays == 2, "replays counted: %lld", (long long)st.replays);
    /* after a reset nothing is reused, and it is not counted as a replay */
    ds4f_generator_reset(g);
    REQUIRE(ds4f_generate(g, b, 20, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(!r.replayed && r.cached_tokens == 0, "reset forgets");
    ds4f_generator_free(g);
    ds4f_generator_free(fresh);
}

TEST(generate_same_seed_same_tokens) {
    if (setup()) return;
    ds4f_generator *g = new_generator(128, 64);
    REQUIRE(g, "generator");
    ds4f_error err;
    int32_t prompt[16];
    prompt_of(prompt, 12, 3);
    collected runs[3];
    const uint64_t seeds[3] = {99, 99, 100};
    for (int i = 0; i < 3; i++) {
        collected_init(&runs[i]);
        ds4f_generate_params p;
        params_for(&p, &runs[i], 1.0f, seeds[i], 12);
        ds4f_generate_result r;
        REQUIRE(ds4f_generate(g, prompt, 12, &p, &r, &err) == 0, "%s", err.msg);
        CHECK(r.generated_tokens == 12, "run %d generated %d", i, r.generated_tokens);
    }
    CHECK(runs[0].n_ids == 12 && memcmp(runs[0].ids, runs[1].ids, sizeof runs[0].ids) == 0, "same seed, same tokens");
    CHECK(runs[0].text_len == runs[1].text_len && memcmp(runs[0].text, runs[1].text, runs[0].text_len) == 0, "same text");
    CHECK(memcmp(runs[0].ids, runs[2].ids, 12 * sizeof *runs[0].ids) != 0, "another seed, other tokens");
    ds4f_generator_free(g);
}

TEST(generate_streamed_text_is_the_decoded_text) {
    if (setup()) return;
    ds4f_generator *g = new_generator(128, 64);
    REQUIRE(g, "generator");
    ds4f_error err;
    int32_t prompt[16];
    prompt_of(prompt, 10, 4);
    collected c;
    collected_init(&c);
    ds4f_generate_params p;
    params_for(&p, &c, 1.0f, 5, 24);
    ds4f_generate_result r;
    REQUIRE(ds4f_generate(g, prompt, 10, &p, &r, &err) == 0, "%s", err.msg);
    char *text;
    size_t len;
    REQUIRE(tokenizer_decode(tok, c.ids, (size_t)c.n_ids, &text, &len, &err) == 0, "%s", err.msg);
    CHECK(len == c.text_len && memcmp(text, c.text, len) == 0, "streamed pieces concatenate to the decoded text");
    free(text);
    ds4f_generator_free(g);
}

/* Greedy text of the golden model for a prompt, without stop strings: the reference for the
 * stop-string runs. */
static void greedy_reference(ds4f_generator *g, const int32_t *prompt, int n, int max_tokens, collected *out) {
    ds4f_error err;
    collected_init(out);
    ds4f_generate_params p;
    params_for(&p, out, 0, 0, max_tokens);
    ds4f_generate_result r;
    if (ds4f_generate(g, prompt, n, &p, &r, &err) != 0) test_fail(__FILE__, __LINE__, "%s", err.msg);
}

static size_t find(const char *hay, size_t hay_len, const char *needle) {
    const char *at = memmem(hay, hay_len, needle, strlen(needle));
    return at ? (size_t)(at - hay) : hay_len;
}

TEST(generate_stop_strings_do_not_leak) {
    if (setup()) return;
    ds4f_generator *g = new_generator(128, 64);
    REQUIRE(g, "generator");
    ds4f_error err;
    int32_t prompt[16];
    prompt_of(prompt, 10, 5);
    collected ref;
    greedy_reference(g, prompt, 10, 20, &ref);
    REQUIRE(ref.text_len > 12, "reference text long enough (%zu bytes)", ref.text_len);

    /* a stop string that spans tokens in the middle of the text: the text ends right before its
     * first occurrence, and nothing of it was streamed */
    char stop[8] = {0};
    const size_t at = ref.text_len / 2;
    memcpy(stop, ref.text + at, 4);
    if (strlen(stop) == 4) {
        const size_t first = find(ref.text, ref.text_len, stop);
        collected c;
        collected_init(&c);
        ds4f_generate_params p;
        params_for(&p, &c, 0, 0, 20);
        const char *stops[2] = {"\x01never", stop};
        p.stop_strings = stops;
        p.n_stop_strings = 2;
        ds4f_generate_result r;
        REQUIRE(ds4f_generate(g, prompt, 10, &p, &r, &err) == 0, "%s", err.msg);
        CHECK(r.finish == DS4F_FINISH_STOP && r.stop_string == 1 && r.stop_token == -1, "stopped by string 1 (%s, %d)",
              ds4f_finish_reason_name(r.finish), r.stop_string);
        CHECK(c.text_len == first && memcmp(c.text, ref.text, first) == 0, "text is the reference up to the stop string (%zu vs %zu)",
              c.text_len, first);
        CHECK(c.final_events == 0, "no final flush after a stop string");
    } else {
        test_fail(__FILE__, __LINE__, "reference text has a NUL byte at %zu; choose another prompt", at);
    }

    /* a stop string whose beginning appears at the very end but never completes: held back until
     * the end, then handed over in the final event */
    {
        char almost[64];
        const size_t tail = ref.text_len >= 3 ? 3 : ref.text_len;
        memcpy(almost, ref.text + ref.text_len - tail, tail);
        memcpy(almost + tail, "\x02zz", 4);
        collected c;
        collected_init(&c);
        ds4f_generate_params p;
        params_for(&p, &c, 0, 0, 20);
        const char *stops[1] = {almost};
        p.stop_strings = stops;
        p.n_stop_strings = 1;
        ds4f_generate_result r;
        REQUIRE(ds4f_generate(g, prompt, 10, &p, &r, &err) == 0, "%s", err.msg);
        CHECK(r.finish == DS4F_FINISH_LENGTH && r.stop_string == -1, "no match");
        CHECK(c.text_len == ref.text_len && memcmp(c.text, ref.text, ref.text_len) == 0, "whole text delivered");
        CHECK(c.final_events == 1, "the held-back end comes in one final event (%d)", c.final_events);
        CHECK(memcmp(c.ids, ref.ids, 20 * sizeof *c.ids) == 0, "stop strings do not change tokens");
    }
    ds4f_generator_free(g);
}

TEST(generate_stop_tokens_and_length) {
    if (setup()) return;
    ds4f_generator *g = new_generator(32, 64);
    REQUIRE(g, "generator");
    ds4f_error err;
    int32_t prompt[32];
    prompt_of(prompt, 10, 6);
    collected ref;
    greedy_reference(g, prompt, 10, 6, &ref);
    REQUIRE(ref.n_ids == 6, "reference");
    int k = 0; /* first position of a token that did not occur before it */
    for (int i = 3; i < 6 && !k; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= ref.ids[j] == ref.ids[i];
        if (!seen) k = i;
    }
    REQUIRE(k, "reference has a fresh token at 3..5");
    collected c;
    collected_init(&c);
    ds4f_generate_params p;
    params_for(&p, &c, 0, 0, 20);
    p.stop_tokens = &ref.ids[k];
    p.n_stop_tokens = 1;
    ds4f_generate_result r;
    REQUIRE(ds4f_generate(g, prompt, 10, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.finish == DS4F_FINISH_STOP && r.stop_token == ref.ids[k] && r.generated_tokens == k + 1, "stop token");
    CHECK(c.n_ids == k, "the stop token is not reported (%d events)", c.n_ids);

    /* the context (32) fills up: prompt 30 -> samples at 30, 31, 32 consumed */
    prompt_of(prompt, 30, 7);
    collected_init(&c);
    params_for(&p, &c, 0, 0, 0);
    REQUIRE(ds4f_generate(g, prompt, 30, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.finish == DS4F_FINISH_LENGTH && r.generated_tokens == 3, "context full after %d tokens", r.generated_tokens);

    /* refusals */
    CHECK(ds4f_generate(g, prompt, 33, &p, &r, &err) != 0 && strstr(err.msg, "context"), "too long: %s", err.msg);
    CHECK(ds4f_generate(g, prompt, 0, &p, &r, &err) != 0 && strstr(err.msg, "empty"), "empty prompt: %s", err.msg);
    int32_t bad[2] = {5, 1024};
    CHECK(ds4f_generate(g, bad, 2, &p, &r, &err) != 0 && strstr(err.msg, "index 1"), "bad id: %s", err.msg);
    CHECK(r.finish == DS4F_FINISH_ERROR, "error result");
    const char *empty[1] = {""};
    p.stop_strings = empty;
    p.n_stop_strings = 1;
    CHECK(ds4f_generate(g, prompt, 3, &p, &r, &err) != 0 && strstr(err.msg, "empty"), "empty stop string: %s", err.msg);
    p.n_stop_strings = 0;
    p.sampling.top_p = 0;
    CHECK(ds4f_generate(g, prompt, 3, &p, &r, &err) != 0 && strstr(err.msg, "top_p"), "bad top_p: %s", err.msg);
    ds4f_generator_free(g);

    /* without a tokenizer: ids only, and stop strings refused */
    ds4f_generator *bare = NULL;
    REQUIRE(ds4f_generator_create(model, NULL, NULL, &bare, &err) == 0, "%s", err.msg);
    params_for(&p, &c, 0, 0, 2);
    p.stop_strings = empty;
    p.n_stop_strings = 1;
    CHECK(ds4f_generate(bare, prompt, 3, &p, &r, &err) != 0 && strstr(err.msg, "tokenizer"), "%s", err.msg);
    ds4f_generator_free(bare);
}

TEST(generate_cancel_from_callbacks) {
    if (setup()) return;
    ds4f_generator *g = new_generator(256, 8);
    REQUIRE(g, "generator");
    ds4f_error err;
    int32_t prompt[40];
    prompt_of(prompt, 40, 8);
    collected c;
    collected_init(&c);
    c.cancel_at = 2;
    ds4f_generate_params p;
    params_for(&p, &c, 0, 0, 50);
    ds4f_generate_result r;
    REQUIRE(ds4f_generate(g, prompt, 40, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.finish == DS4F_FINISH_CANCELLED && r.generated_tokens == 3 && c.n_ids == 3, "cancelled after token 2");

    /* cancelled during the prefill after two chunks of 8: what was evaluated stays and the
     * retry only evaluates the rest */
    ds4f_generator_reset(g);
    collected_init(&c);
    c.cancel_prefill_after = 1;
    params_for(&p, &c, 0, 0, 50);
    REQUIRE(ds4f_generate(g, prompt, 40, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.finish == DS4F_FINISH_CANCELLED && r.prefill_tokens == 16 && r.generated_tokens == 0,
          "prefill cancelled after 16 tokens (%s, %d)", ds4f_finish_reason_name(r.finish), r.prefill_tokens);
    collected_init(&c);
    params_for(&p, &c, 0, 0, 2);
    REQUIRE(ds4f_generate(g, prompt, 40, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(r.cached_tokens == 16 && r.prefill_tokens == 24 && r.finish == DS4F_FINISH_LENGTH, "retry reuses 16 (%d)",
          r.cached_tokens);
    ds4f_generator_free(g);
}

/* Another thread cancels while a token callback holds the generation: deterministic, because the
 * callback waits until the cancel has been issued. */
typedef struct canceller {
    ds4f_generator *g;
    atomic_int go, done;
    collected c;
} canceller;

static void *cancel_thread(void *arg) {
    canceller *k = arg;
    while (!atomic_load(&k->go)) sched_yield();
    ds4f_generator_cancel(k->g);
    atomic_store(&k->done, 1);
    return NULL;
}

static int on_token_wait(void *user, const ds4f_token_event *ev) {
    canceller *k = user;
    on_token(&k->c, ev);
    if (ev->index == 1) {
        atomic_store(&k->go, 1);
        while (!atomic_load(&k->done)) sched_yield();
    }
    return 0;
}

TEST(generate_cancel_from_another_thread) {
    if (setup()) return;
    canceller k;
    memset(&k, 0, sizeof k);
    collected_init(&k.c);
    k.g = new_generator(256, 64);
    REQUIRE(k.g, "generator");
    /* a cancel issued before a generation starts does not affect it */
    ds4f_generator_cancel(k.g);
    ds4f_error err;
    int32_t prompt[16];
    prompt_of(prompt, 10, 9);
    ds4f_generate_params p;
    params_for(&p, &k.c, 0, 0, 100);
    p.on_token = on_token_wait;
    p.on_prefill = NULL;
    p.user = &k;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, cancel_thread, &k) == 0, "thread");
    ds4f_generate_result r;
    int rc = ds4f_generate(k.g, prompt, 10, &p, &r, &err);
    atomic_store(&k.go, 1); /* releases the thread if the generation ended before token 1 */
    pthread_join(th, NULL);
    CHECK(rc == 0 && r.finish == DS4F_FINISH_CANCELLED && r.generated_tokens == 2, "cancelled after token 1 (%s, %d)",
          ds4f_finish_reason_name(r.finish), r.generated_tokens);
    ds4f_generator_free(k.g);
}
