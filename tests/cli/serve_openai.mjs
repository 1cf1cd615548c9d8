// `ds4f serve` through the official OpenAI client library (the `openai` npm package, v4), as an
// editor or agent would use it. Run by tests/cli/serve.sh against a synthetic tiny model:
//
//   DS4F_NODE_PREFIX=build/node node tests/cli/serve_openai.mjs http://127.0.0.1:PORT/v1
//
// DS4F_NODE_PREFIX is where `npm install --prefix` put the package. Prints "ok   NAME" or
// "FAIL NAME: why" per test; exits 1 if any failed. The model writes gibberish, so the tests check
// formats, determinism, token accounting and behaviour, never the meaning of the text.
import { createRequire } from 'node:module';
import path from 'node:path';

const base = process.argv[2];
const prefix = process.env.DS4F_NODE_PREFIX || 'build/node';
const require = createRequire(path.resolve(prefix, 'package.json'));
const openaiModule = require('openai');
const OpenAI = openaiModule.default ?? openaiModule.OpenAI ?? openaiModule;

// No retries: a 429 or a 5xx must show up as it is.
const client = new OpenAI({ baseURL: base, apiKey: 'not-needed', maxRetries: 0, timeout: 120000 });
let failed = 0;

async function test(name, fn) {
    try {
        await fn();
        console.log(`ok   ${name}`);
    } catch (e) {
        failed++;
        console.log(`FAIL ${name}: ${(e && e.stack) || e}`.split('\n').slice(0, 3).join(' | '));
    }
}

function assert(cond, message) {
    if (!cond) throw new Error(message);
}

async function expectError(promise, check) {
    try {
        await promise;
    } catch (e) {
        check(e);
        return;
    }
    throw new Error('the request was accepted');
}

const models = await client.models.list();
const model = models.data[0]?.id;

await test('models.list names the served model', async () => {
    assert(models.data.length === 1 && typeof model === 'string' && models.data[0].object === 'model',
        JSON.stringify(models.data));
});

const user1 = { role: 'user', content: 'Tell me about the old library on the square.' };

let plain;
await test('chat.completions.create (non-streaming)', async () => {
    plain = await client.chat.completions.create({ model, messages: [user1], max_tokens: 8, temperature: 0 });
    assert(plain.object === 'chat.completion', plain.object);
    const c = plain.choices[0];
    assert(c.message.role === 'assistant' && typeof c.message.content === 'string', JSON.stringify(c.message));
    assert(['length', 'stop'].includes(c.finish_reason), c.finish_reason);
    const u = plain.usage;
    assert(u.prompt_tokens > 0 && u.completion_tokens > 0 && u.completion_tokens <= 8, JSON.stringify(u));
    assert(u.total_tokens === u.prompt_tokens + u.completion_tokens, JSON.stringify(u));
    assert(typeof u.prompt_tokens_details?.cached_tokens === 'number', JSON.stringify(u));
});

await test('streaming gives the same text as non-streaming, with a usage chunk', async () => {
    const stream = await client.chat.completions.create({
        model, messages: [user1], max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let text = '', finish = null, usage = null, chunks = 0, role = null;
    for await (const chunk of stream) {
        chunks++;
        assert(chunk.object === 'chat.completion.chunk', chunk.object);
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices[0];
        if (!choice) continue;
        role = role ?? choice.delta.role;
        text += choice.delta.content ?? '';
        finish = choice.finish_reason ?? finish;
    }
    assert(role === 'assistant', `role ${role}`);
    assert(text === plain.choices[0].message.content, `${JSON.stringify(text)} vs ${JSON.stringify(plain.choices[0].message.content)}`);
    assert(finish === plain.choices[0].finish_reason, `finish ${finish}`);
    assert(usage && usage.completion_tokens === plain.usage.completion_tokens, JSON.stringify(usage));
    assert(chunks >= 3, `${chunks} chunks`);
});

await test('same seed, same text (temperature 1)', async () => {
    const ask = () => client.chat.completions.create({ model, messages: [user1], max_tokens: 12, temperature: 1, top_p: 0.95, seed: 1234 });
    const [a, b] = [await ask(), await ask()];
    assert(a.choices[0].message.content === b.choices[0].message.content, 'texts differ');
});

await test('stop strings end the text before them', async () => {
    const full = plain.choices[0].message.content;
    // A stop string taken from the known answer: two ASCII letters after its start (ASCII, because
    // the answer may hold U+FFFD where the model wrote bytes that are not UTF-8).
    const m = /[A-Za-z]{2}/.exec(full.slice(1));
    assert(m, `no letters to stop at in ${JSON.stringify(full)}`);
    const cut = m[0];
    const r = await client.chat.completions.create({ model, messages: [user1], max_tokens: 8, temperature: 0, stop: [cut] });
    assert(r.choices[0].finish_reason === 'stop', r.choices[0].finish_reason);
    assert(r.choices[0].message.content === full.slice(0, full.indexOf(cut)), JSON.stringify(r.choices[0].message.content));
});

await test('next turn of a conversation reuses the session (cached_tokens)', async () => {
    const t1 = await client.chat.completions.create({ model, messages: [user1], max_tokens: 6, temperature: 0 });
    const t2 = await client.chat.completions.create({
        model, max_tokens: 4, temperature: 0,
        messages: [user1, { role: 'assistant', content: t1.choices[0].message.content }, { role: 'user', content: 'And then?' }],
    });
    const want = t1.usage.prompt_tokens + t1.usage.completion_tokens - 1; // the last sampled token is never evaluated
    const got = t2.usage.prompt_tokens_details.cached_tokens;
    assert(got === want, `cached ${got}, want ${want} (turn 1: ${JSON.stringify(t1.usage)})`);
    assert(t2.usage.prompt_tokens > got, 'the new turn has new tokens');
});

await test('thinking mode: reasoning_content; the next turn drops it as the official encoder does', async () => {
    const t1 = await client.chat.completions.create({
        model, messages: [user1], max_tokens: 6, temperature: 0, thinking: { type: 'enabled' },
    });
    const m = t1.choices[0].message;
    assert(typeof m.reasoning_content === 'string' && m.reasoning_content.length > 0, JSON.stringify(m));
    assert(t1.usage.completion_tokens_details.reasoning_tokens > 0, JSON.stringify(t1.usage));
    const t2 = await client.chat.completions.create({
        model, max_tokens: 4, temperature: 0, reasoning_effort: 'high',
        messages: [user1, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content },
            { role: 'user', content: 'Why?' }],
    });
    // The earlier answer is rendered without its reasoning, so the prompt diverges from the
    // session inside turn 1 and the conversation is replayed (--keep-reasoning would reuse it).
    assert(t2.usage.prompt_tokens_details.cached_tokens === 0,
        `cached ${t2.usage.prompt_tokens_details.cached_tokens}, want 0`);
    assert(t2.usage.prompt_tokens < t1.usage.prompt_tokens + t1.usage.completion_tokens + 8,
        `turn 2 prompt ${t2.usage.prompt_tokens} tokens should not hold the ${t1.usage.completion_tokens}-token reasoning`);
});

const tools = [{
    type: 'function',
    function: {
        name: 'get_weather', description: 'Current weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
}];

await test('tools: a request with tools is answered (stopped by max_tokens)', async () => {
    const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'auto', max_tokens: 4, temperature: 0,
    });
    // A synthetic model does not write DSML; had it, finish_reason would be "tool_calls".
    assert(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
});

await test('tools: assistant tool_calls and tool results render back into the prompt', async () => {
    const messages = [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_7', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_7', content: '18C and sunny' },
    ];
    const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 3, temperature: 0 });
    const rendered = await (await fetch(`${base.replace(/\/v1$/, '')}/apply-template`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ messages, tools }),
    })).json();
    const call = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>';
    assert(rendered.prompt.includes('Weather in Paris?<｜Assistant｜></think>' + call), rendered.prompt);
    assert(rendered.prompt.endsWith('<｜User｜><tool_result>18C and sunny</tool_result><｜Assistant｜></think>'), rendered.prompt);
    assert(rendered.tokens === r.usage.prompt_tokens, `rendered ${rendered.tokens} tokens, generation saw ${r.usage.prompt_tokens}`);
});

await test('completions.create, non-streaming and streaming', async () => {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
    assert(r.object === 'text_completion' && typeof r.choices[0].text === 'string', JSON.stringify(r));
    const stream = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert(text === r.choices[0].text, `${JSON.stringify(text)} vs ${JSON.stringify(r.choices[0].text)}`);
});

await test('invalid parameters raise BadRequestError naming them', async () => {
    await expectError(client.chat.completions.create({ model, messages: [user1], temperature: 5 }), (e) => {
        assert(e instanceof OpenAI.BadRequestError && e.status === 400, `${e}`);
        assert(e.param === 'temperature' && e.code === 'invalid_value', `param ${e.param} code ${e.code}`);
    });
    await expectError(client.chat.completions.create({ model, messages: [{ role: 'robot', content: 'x' }] }), (e) => {
        assert(e.status === 400 && /unknown role/.test(e.message), e.message);
    });
});

await test('an over-long prompt raises context_length_exceeded', async () => {
    const long = 'the quiet library '.repeat(3000);
    await expectError(client.chat.completions.create({ model, messages: [{ role: 'user', content: long }], max_tokens: 2 }), (e) => {
        assert(e.status === 400 && e.code === 'context_length_exceeded', `${e.status} ${e.code}`);
        assert(/prompt has \d+ tokens/.test(e.message), e.message);
    });
});

await test('aborting a stream cancels the generation; the next request is served at once', async () => {
    const before = await (await fetch(`${base.replace(/\/v1$/, '')}/health`)).json();
    const stream = await client.chat.completions.create({
        model, messages: [user1], max_tokens: 3000, ignore_eos: true, temperature: 0, stream: true,
    });
    let chunks = 0, aborted = false;
    try {
        for await (const chunk of stream) {
            if (++chunks === 5) stream.controller.abort();
        }
    } catch (e) {
        aborted = e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError';
    }
    assert(aborted || chunks >= 5, `aborted ${aborted}, ${chunks} chunks`);
    const t0 = Date.now();
    const r = await client.chat.completions.create({ model, messages: [user1], max_tokens: 2, temperature: 0 });
    const seconds = (Date.now() - t0) / 1000;
    assert(r.choices.length === 1, 'answered');
    // 3000 tokens would take far longer than this on the synthetic model.
    assert(seconds < 15, `the next request took ${seconds} s`);
    const after = await (await fetch(`${base.replace(/\/v1$/, '')}/health`)).json();
    assert(after.cancelled === before.cancelled + 1, `cancelled ${before.cancelled} -> ${after.cancelled}`);
});

process.exit(failed ? 1 : 0);
