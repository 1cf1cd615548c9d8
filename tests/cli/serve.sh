#!/bin/sh
# `ds4f serve` on a synthetic tiny model (gibberish text, but every stage runs), with curl and with
# the official `openai` npm client (tests/cli/serve_openai.mjs, installed into $DS4F_BUILD/node on
# first use). Covered: streaming and non-streaming chat and completions, models and health,
# request validation (malformed JSON, wrong types, an over-long prompt), SSE keep-alive comments
# during a long prefill, the rendering of tool calls and tool results, cancellation by a client
# that goes away (streaming, and waiting in the queue), the queue limit (429), prefix reuse across
# turns, and a graceful shutdown that ends a running stream. The server runs on a port the OS
# picks (--port 0, read back from its log) and is always killed when the script exits.
#
# Not covered here: a model writing a DSML tool call by itself (a synthetic model never does);
# the DSML -> tool_calls conversion is tested in tests/unit/test_server.c on the same code path.
. "$(dirname "$0")/lib.sh"
setup_tmp

server_pid=
hold_pid=
cleanup() {
    [ -n "$hold_pid" ] && kill "$hold_pid" 2>/dev/null
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE

if ! command -v curl >/dev/null 2>&1; then
    fail "curl is needed for the server tests (apt-get install curl / brew install curl)"
    finish
    exit 1
fi

model="$tmp/model"
if ! "$DS4F_BIN" synth "$model" --preset tiny --seed 7 >"$tmp/synth.log" 2>&1; then
    fail "synth tiny model: $(tail -2 "$tmp/synth.log")"
    finish
    exit 1
fi

# start_server ARGS...: starts `ds4f serve` in the background and sets $base (http://127.0.0.1:PORT).
start_server() {
    "$DS4F_BIN" serve -m "$model" --host 127.0.0.1 --port 0 "$@" >"$tmp/server.log" 2>&1 &
    server_pid=$!
    base=
    i=0
    while [ $i -lt 150 ]; do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$tmp/server.log" | head -n 1)
        if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
            base="http://127.0.0.1:$port"
            return 0
        fi
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.2
        i=$((i + 1))
    done
    return 1
}

# post PATH BODY OUT: POSTs JSON, writes the body to OUT, prints the HTTP status.
post() {
    curl -s -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "$base$1"
}

# expect_status NAME STATUS PATTERN PATH BODY: the answer has this status and matches PATTERN.
expect_status() {
    name=$1; want=$2; pattern=$3
    got=$(post "$4" "$5" "$tmp/resp")
    if [ "$got" = "$want" ] && grep -q -- "$pattern" "$tmp/resp"; then
        pass "$name"
    else
        fail "$name (status $got, want $want; body: $(head -c 300 "$tmp/resp"))"
    fi
}

# wait_log PATTERN SECONDS: waits until the server log matches.
wait_log() {
    i=0
    while [ $i -lt $(($2 * 10)) ]; do
        grep -q -- "$1" "$tmp/server.log" && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# ---- command line ---------------------------------------------------------------------------------

if "$DS4F_BIN" serve --help | grep -q "usage: ds4f serve -m DIR" && "$DS4F_BIN" serve --help | grep -q -- "--queue N"; then
    pass "serve --help"
else
    fail "serve --help"
fi
expect_failure "serve without -m is refused" "give -m DIR" "$DS4F_BIN" serve
expect_failure "serve with a bad --port is refused" "port expects an integer" "$DS4F_BIN" serve -m "$model" --port 99999
expect_failure "serve with a missing checkpoint fails, naming it" "ds4f serve: .*/nothing" "$DS4F_BIN" serve -m "$tmp/nothing" --port 0

# ---- a server -------------------------------------------------------------------------------------

if ! start_server --ctx 4096 --queue 2 --keepalive 0; then
    fail "server starts: $(tail -3 "$tmp/server.log")"
    finish
    exit 1
fi
pass "server starts and binds 127.0.0.1 ($base)"

hello='"messages":[{"role":"user","content":"Tell me about the library."}]'

if curl -s "$base/health" | grep -q '"status":"ok"'; then pass "GET /health"; else fail "GET /health"; fi
if curl -s "$base/v1/models" | grep -q '"data":\[{"id":"model","object":"model"'; then
    pass "GET /v1/models lists the model"
else
    fail "GET /v1/models: $(curl -s "$base/v1/models")"
fi

expect_status "chat, non-streaming" 200 '"object":"chat.completion"' /v1/chat/completions \
    "{$hello,\"max_tokens\":8,\"temperature\":0}"
if grep -q '"finish_reason":"length"' "$tmp/resp" && grep -q '"completion_tokens":8' "$tmp/resp" &&
    grep -q '"role":"assistant","content":"' "$tmp/resp" && grep -q '"prompt_tokens_details":{"cached_tokens":' "$tmp/resp"; then
    pass "chat answer: content, finish_reason, usage with cached_tokens"
else
    fail "chat answer fields: $(head -c 400 "$tmp/resp")"
fi

curl -sN -H 'Content-Type: application/json' \
    --data-binary "{$hello,\"max_tokens\":6,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
    "$base/v1/chat/completions" >"$tmp/stream"
chunks=$(grep -c '^data: {.*"object":"chat.completion.chunk"' "$tmp/stream")
if [ "$chunks" -ge 3 ] && tail -n 2 "$tmp/stream" | grep -q '^data: \[DONE\]$' &&
    grep -q '"delta":{"role":"assistant"' "$tmp/stream" && grep -q '"finish_reason":"length"' "$tmp/stream" &&
    grep -q '"choices":\[\],"usage":{"prompt_tokens":' "$tmp/stream"; then
    pass "chat, streaming: chunks, role, finish_reason, usage chunk, [DONE]"
else
    fail "chat, streaming: $(head -c 600 "$tmp/stream")"
fi

expect_status "completions, non-streaming" 200 '"object":"text_completion"' /v1/completions \
    '{"prompt":"Once upon a time","max_tokens":5,"temperature":0}'
curl -sN --data-binary '{"prompt":"Once upon a time","max_tokens":4,"temperature":0,"stream":true}' "$base/v1/completions" >"$tmp/stream"
if grep -q '^data: {.*"object":"text_completion".*"text":' "$tmp/stream" && grep -q '^data: \[DONE\]$' "$tmp/stream"; then
    pass "completions, streaming"
else
    fail "completions, streaming: $(head -c 400 "$tmp/stream")"
fi

# ---- refusals -------------------------------------------------------------------------------------

expect_status "malformed JSON: 400 invalid_json" 400 '"code":"invalid_json"' /v1/chat/completions '{"messages": [1, 2'
if grep -q '^{"error":{"message":"[^"]*","type":"invalid_request_error","param":null,"code":"invalid_json"}}$' "$tmp/resp"; then
    pass "errors are OpenAI error objects"
else
    fail "error object: $(cat "$tmp/resp")"
fi
expect_status "wrong type: 400 naming temperature" 400 '"param":"temperature"' /v1/chat/completions \
    "{$hello,\"temperature\":\"hot\"}"
expect_status "temperature out of range: 400" 400 'temperature must be between 0 and 2' /v1/chat/completions \
    "{$hello,\"temperature\":3}"
expect_status "unknown role: 400" 400 'unknown role' /v1/chat/completions '{"messages":[{"role":"robot","content":"x"}]}'
expect_status "empty messages: 400" 400 'messages must not be empty' /v1/chat/completions '{"messages":[]}'
expect_status "unsupported n: 400" 400 'not supported' /v1/chat/completions "{$hello,\"n\":3}"
awk 'BEGIN { printf "{\"messages\":[{\"role\":\"user\",\"content\":\""; for (i = 0; i < 3000; i++) printf "the quiet library "; printf "\"}],\"max_tokens\":4}" }' >"$tmp/long.json"
expect_status "prompt longer than the context: 400 with the counts" 400 'context_length_exceeded' /v1/chat/completions "@$tmp/long.json"
if grep -q "context is 4096 tokens.*prompt has [0-9][0-9]* tokens" "$tmp/resp"; then
    pass "over-long prompt: the message gives both token counts"
else
    fail "over-long prompt message: $(cat "$tmp/resp")"
fi
expect_status "unknown endpoint: 404" 404 '"code":"not_found"' /v1/embeddings '{}'
got=$(curl -s -o "$tmp/resp" -w '%{http_code}' "$base/v1/chat/completions")
if [ "$got" = 405 ]; then pass "GET on a POST endpoint: 405"; else fail "GET on a POST endpoint: $got"; fi

# ---- keep-alive comments during a long prefill ------------------------------------------------------

awk 'BEGIN { printf "{\"messages\":[{\"role\":\"user\",\"content\":\""; for (i = 0; i < 300; i++) printf "the quiet library "; printf "\"}],\"max_tokens\":2,\"stream\":true}" }' >"$tmp/mid.json"
curl -sN --data-binary "@$tmp/mid.json" "$base/v1/chat/completions" >"$tmp/stream"
first_data=$(grep -n '^data:' "$tmp/stream" | head -n 1 | cut -d: -f1)
first_comment=$(grep -n '^: keep-alive$' "$tmp/stream" | head -n 1 | cut -d: -f1)
if [ -n "$first_comment" ] && [ -n "$first_data" ] && [ "$first_comment" -lt "$first_data" ]; then
    pass "SSE keep-alive comments while the prompt is prefilled"
else
    fail "no keep-alive comment before the first event: $(head -c 300 "$tmp/stream")"
fi

# ---- tool calls and tool results -----------------------------------------------------------------

tools='"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
expect_status "chat with tools (stopped by max_tokens)" 200 '"finish_reason":"length"' /v1/chat/completions \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],$tools,\"max_tokens\":4,\"temperature\":0}"
round='"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C and sunny"}]'
expect_status "tool results: rendered prompt" 200 '"prompt":' /apply-template "{$round,$tools}"
# The assistant's call as DSML, closed by the EOS, then the result in a user turn and a new answer.
dsml='\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>18C and sunny</tool_result><｜Assistant｜></think>"'
if grep -qF "Weather in Paris?<｜Assistant｜></think>$dsml" "$tmp/resp" && grep -q '## Tools' "$tmp/resp"; then
    pass "tool calls render as DSML and tool results as <tool_result> in a user turn"
else
    fail "tool round trip rendering: $(head -c 1500 "$tmp/resp")"
fi
expect_status "chat after tool results" 200 '"object":"chat.completion"' /v1/chat/completions \
    "{$round,$tools,\"max_tokens\":3,\"temperature\":0}"

# ---- the OpenAI client library ----------------------------------------------------------------------

node_prefix="${DS4F_BUILD:-build}/node"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    fail "openai client tests: node and npm are needed (scripts/install-deps.sh installs them)"
else
    if [ ! -f "$node_prefix/node_modules/openai/package.json" ]; then
        mkdir -p "$node_prefix"
        if ! npm install --silent --no-audit --no-fund --prefix "$node_prefix" openai@4 >"$tmp/npm.log" 2>&1; then
            fail "openai client tests: npm install openai@4 failed: $(tail -3 "$tmp/npm.log")"
        fi
    fi
    if [ -f "$node_prefix/node_modules/openai/package.json" ]; then
        DS4F_NODE_PREFIX="$node_prefix" node tests/cli/serve_openai.mjs "$base/v1" >"$tmp/openai.log" 2>&1
        status=$?
        while IFS= read -r line; do
            case $line in
                "ok   "*) pass "openai: ${line#ok   }" ;;
                "FAIL "*) fail "openai: ${line#FAIL }" ;;
            esac
        done <"$tmp/openai.log"
        grep -q '^ok   \|^FAIL ' "$tmp/openai.log" || fail "openai client tests did not run: $(tail -5 "$tmp/openai.log")"
        [ $status -eq 0 ] || grep -q '^FAIL ' "$tmp/openai.log" || fail "openai client tests: exit status $status: $(tail -3 "$tmp/openai.log")"
        if grep -q "cancelled stream (client disconnected)" "$tmp/server.log"; then
            pass "the server logs the client's abort as a cancellation"
        else
            fail "no cancellation in the server log"
        fi
    fi
fi

# ---- cancellation with curl: a client that stops reading mid-stream ----------------------------------

before=$(grep -c "cancelled stream (client disconnected)" "$tmp/server.log")
curl -sN --data-binary "{$hello,\"max_tokens\":3000,\"ignore_eos\":true,\"temperature\":0,\"stream\":true}" \
    "$base/v1/chat/completions" 2>/dev/null | head -c 3000 >/dev/null
if wait_log "cancelled stream (client disconnected).*prompt" 20 &&
    [ "$(grep -c "cancelled stream (client disconnected)" "$tmp/server.log")" -gt "$before" ]; then
    generated=$(grep "cancelled stream (client disconnected)" "$tmp/server.log" | tail -n 1 | sed -n 's/.* \([0-9][0-9]*\) generated.*/\1/p')
    if [ -n "$generated" ] && [ "$generated" -lt 3000 ]; then
        pass "a client that disconnects mid-stream cancels its generation ($generated of 3000 tokens)"
    else
        fail "cancelled generation ran to $generated tokens"
    fi
else
    fail "disconnect not logged as a cancellation: $(tail -3 "$tmp/server.log")"
fi
expect_status "the next request is served after a cancellation" 200 '"object":"chat.completion"' /v1/chat/completions \
    "{$hello,\"max_tokens\":2}"

# ---- queue full ---------------------------------------------------------------------------------------

# Hold the generator with a long request, wait until two more are queued (--queue 2), then one
# more must be refused at once with 429.
curl -sN --data-binary "{$hello,\"max_tokens\":3000,\"ignore_eos\":true,\"temperature\":0,\"stream\":true}" \
    "$base/v1/chat/completions" >"$tmp/hold" 2>/dev/null &
hold_pid=$!
i=0
while [ $i -lt 100 ] && ! grep -qs '"content"' "$tmp/hold"; do sleep 0.1; i=$((i + 1)); done
queued_pids=
for k in 1 2; do
    curl -s -o "$tmp/queued$k" -w '%{http_code}' --data-binary "{$hello,\"max_tokens\":2}" \
        "$base/v1/chat/completions" >"$tmp/queued$k.status" 2>/dev/null &
    queued_pids="$queued_pids $!"
done
i=0
while [ $i -lt 100 ] && ! curl -s "$base/health" | grep -q '"queued":2'; do sleep 0.1; i=$((i + 1)); done
expect_status "queue full: 429" 429 '"code":"queue_full"' /v1/chat/completions "{$hello,\"max_tokens\":2}"
if grep -q '"type":"rate_limit_error"' "$tmp/resp" && grep -q 'retry later' "$tmp/resp"; then
    pass "429 is an OpenAI rate-limit error"
else
    fail "429 body: $(cat "$tmp/resp")"
fi
kill "$hold_pid" 2>/dev/null
wait "$hold_pid" 2>/dev/null
hold_pid=
for pid in $queued_pids; do wait "$pid"; done
if [ "$(cat "$tmp/queued1.status")" = 200 ] && [ "$(cat "$tmp/queued2.status")" = 200 ]; then
    pass "queued requests are served once the generator is free"
else
    fail "queued requests: $(cat "$tmp/queued1.status") $(cat "$tmp/queued2.status")"
fi

# A non-streaming client that gives up while queued is skipped.
curl -sN --data-binary "{$hello,\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true}" \
    "$base/v1/chat/completions" >"$tmp/hold" 2>/dev/null &
hold_pid=$!
i=0
while [ $i -lt 100 ] && ! grep -qs '"content"' "$tmp/hold"; do sleep 0.1; i=$((i + 1)); done
curl -s --max-time 1 --data-binary "{$hello,\"max_tokens\":2}" "$base/v1/chat/completions" >/dev/null 2>&1
kill "$hold_pid" 2>/dev/null
wait "$hold_pid" 2>/dev/null
hold_pid=
if wait_log "cancelled (client disconnected while queued)" 20; then
    pass "a client that leaves while queued is not served"
else
    fail "queued client's departure not noticed: $(tail -3 "$tmp/server.log")"
fi

# ---- thinking mode: earlier reasoning --------------------------------------------------------------
# By default an earlier answer is rendered without its reasoning (the official encoding); with
# --keep-reasoning it stays, and the next turn reuses the session.
think_turn2() {
    printf '{"messages":[{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi","reasoning_content":"Let me think about it"},{"role":"user","content":"Why?"}],"thinking":{"type":"enabled"}}'
}
post /apply-template "$(think_turn2)" "$tmp/resp" >/dev/null
if grep -q '"prompt":' "$tmp/resp" && ! grep -q 'Let me think about it' "$tmp/resp" &&
    grep -q '<｜Assistant｜></think>Hi<｜end▁of▁sentence｜>' "$tmp/resp"; then
    pass "thinking mode: an earlier answer is rendered without its reasoning (official encoding)"
else
    fail "thinking mode rendering: $(head -c 400 "$tmp/resp")"
fi

# ---- log and shutdown ----------------------------------------------------------------------------------

if grep -q 'POST /v1/chat/completions 200: prompt [0-9]* tokens ([0-9]* cached), [0-9]* generated, finish length' "$tmp/server.log" &&
    grep -q 'POST /v1/chat/completions 400: the request body is not valid JSON' "$tmp/server.log"; then
    pass "one log line per request"
else
    fail "request log: $(head -5 "$tmp/server.log")"
fi

curl -sN --data-binary "{$hello,\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true}" \
    "$base/v1/chat/completions" >"$tmp/last" 2>/dev/null &
hold_pid=$!
i=0
while [ $i -lt 100 ] && ! grep -qs '"content"' "$tmp/last"; do sleep 0.1; i=$((i + 1)); done
kill -TERM "$server_pid"
i=0
while [ $i -lt 100 ] && kill -0 "$server_pid" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$server_pid" 2>/dev/null; then
    fail "SIGTERM: the server is still running after 10 s"
else
    wait "$server_pid"
    code=$?
    server_pid=
    if [ $code -eq 0 ] && grep -q "stopped:" "$tmp/server.log"; then
        pass "SIGTERM stops the server gracefully (exit 0)"
    else
        fail "SIGTERM: exit $code, log: $(tail -2 "$tmp/server.log")"
    fi
fi
wait "$hold_pid" 2>/dev/null
hold_pid=
if grep -q '"code":"shutting_down"' "$tmp/last" && tail -n 2 "$tmp/last" | grep -q '^data: \[DONE\]$'; then
    pass "a stream cut by the shutdown ends with an error event and [DONE]"
else
    fail "stream at shutdown: $(tail -c 300 "$tmp/last")"
fi

# --keep-reasoning: a second server renders the earlier reasoning and reuses the session.
if start_server --ctx 4096 --keep-reasoning; then
    post /apply-template "$(think_turn2)" "$tmp/resp" >/dev/null
    if grep -q 'Let me think about it</think>Hi' "$tmp/resp"; then
        pass "--keep-reasoning keeps earlier reasoning in the prompt"
    else
        fail "--keep-reasoning rendering: $(head -c 400 "$tmp/resp")"
    fi
    post /v1/chat/completions '{"messages":[{"role":"user","content":"Hello"}],"thinking":{"type":"enabled"},"max_tokens":4,"temperature":0}' "$tmp/t1" >/dev/null
    t1_reasoning=$(sed -n 's/.*"reasoning_content":"\([^"]*\)".*/\1/p' "$tmp/t1")
    t1_content=$(sed -n 's/.*"content":"\([^"]*\)".*/\1/p' "$tmp/t1")
    post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"},{\"role\":\"assistant\",\"content\":\"$t1_content\",\"reasoning_content\":\"$t1_reasoning\"},{\"role\":\"user\",\"content\":\"Why?\"}],\"thinking\":{\"type\":\"enabled\"},\"max_tokens\":2,\"temperature\":0}" "$tmp/t2" >/dev/null
    cached=$(sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' "$tmp/t2")
    if [ -n "$cached" ] && [ "$cached" -gt 0 ]; then
        pass "--keep-reasoning: the next thinking turn reuses $cached tokens"
    else
        fail "--keep-reasoning reuse: $(head -c 400 "$tmp/t2")"
    fi
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=
else
    fail "server with --keep-reasoning did not start: $(tail -3 "$tmp/server.log")"
fi

finish
