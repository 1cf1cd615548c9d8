#!/bin/sh
# `ds4f chat` on a synthetic tiny checkpoint, from a pipe and through a pseudo-terminal (tmux):
# the second turn prefills only its new tokens (asserted from /stats), the commands, history,
# and Ctrl-C stopping an answer without ending the session.
. "$(dirname "$0")/lib.sh"
setup_tmp

model=$tmp/tiny
if ! "$DS4F_BIN" synth "$model" --preset tiny --seed 4 >"$tmp/log" 2>&1; then
    fail "ds4f synth tiny: $(tail -2 "$tmp/log")"
    finish
    exit 1
fi

# field NAME LINE: the number before " NAME" in a /stats "last turn:" line.
field() { printf '%s\n' "$2" | sed -n "s/.* \([0-9][0-9]*\) $1.*/\1/p"; }
# suffix_tokens TEXT: tokens of a later user turn rendered alone (chat mode).
suffix_tokens() {
    printf '"<｜User｜>%s<｜Assistant｜></think>"\n' "$1" | "$DS4F_BIN" tokenize -m "$model" | tr ',' '\n' | wc -l
}

# check_reuse LABEL FILE: FILE holds the output of two turns each followed by /stats.
# Turn 2 must reuse every token the session evaluated in turn 1 (its prompt and answer, but the
# answer's last sampled token, which is evaluated with turn 2) and prefill only: that token, the
# EOS closing the answer unless the model ended it with EOS, and the new user turn.
check_reuse() {
    label=$1
    s1=$(grep '^last turn:' "$2" | sed -n 1p)
    s2=$(grep '^last turn:' "$2" | sed -n 2p)
    p1=$(printf '%s\n' "$s1" | sed -n 's/^last turn: prompt \([0-9]*\) tokens.*/\1/p')
    g1=$(field generated "$s1")
    reused=$(field reused "$s2")
    prefilled=$(field prefilled "$s2")
    close=1
    case "$s1" in *"finish stop"*) close=0 ;; esac
    want_new=$((1 + close + $(suffix_tokens "Second question")))
    if [ -n "$p1" ] && [ -n "$reused" ] && [ "$(field reused "$s1")" -eq 0 ] &&
        [ "$reused" -eq $((p1 + g1 - 1)) ] && [ "$prefilled" -eq "$want_new" ]; then
        pass "$label: turn 2 reuses $reused tokens and prefills only its $prefilled new ones"
    else
        fail "$label: turn 1 [$s1] turn 2 [$s2]; want $((p1 + g1 - 1)) reused and $want_new prefilled"
    fi
    if grep -q '0 replays' "$2"; then pass "$label: no replay"; else fail "$label: the session replayed"; fi
}

# ---- from a pipe -----------------------------------------------------------------------------
printf 'Hello there\n/stats\nSecond question\n/stats\n/think on\n/help\n/reset\n/stats\n/nonsense\n/quit\nnever read\n' |
    "$DS4F_BIN" chat -m "$model" -n 8 --seed 1 >"$tmp/pipe.out" 2>"$tmp/pipe.err"
status=$?
if [ $status -eq 0 ]; then pass "piped chat ends cleanly"; else fail "piped chat: status $status, $(tail -2 "$tmp/pipe.err")"; fi
check_reuse "piped" "$tmp/pipe.out"
if grep -q '^thinking on$' "$tmp/pipe.out" && grep -q '^/reset ' "$tmp/pipe.out" &&
    grep -q '^conversation cleared$' "$tmp/pipe.out" && grep -q '^last turn: none yet$' "$tmp/pipe.out" &&
    grep -q '^unknown command /nonsense' "$tmp/pipe.out"; then
    pass "commands /think /help /reset /stats and unknown ones"
else
    fail "commands: $(tail -5 "$tmp/pipe.out")"
fi
if grep -q '^report: chat of 2 turns: prompt [0-9]* tok ([0-9]* reused)' "$tmp/pipe.err" && ! grep -q 'never read' "$tmp/pipe.out"; then
    pass "/quit leaves, with the report on stderr"
else
    fail "report or /quit: $(tail -2 "$tmp/pipe.err")"
fi

# ---- thinking mode: earlier reasoning ---------------------------------------------------------
# The official encoding renders an earlier answer without its reasoning, so by default the second
# turn replays the conversation; --keep-reasoning keeps it and reuses the session.
printf 'Hello there\nSecond question\n/stats\n' |
    "$DS4F_BIN" chat -m "$model" --think -n 8 --seed 1 >"$tmp/think.out" 2>&1
if grep -q '^last turn: prompt [0-9]* tokens = 0 reused .*replayed from 0' "$tmp/think.out" && grep -q ' 1 replays' "$tmp/think.out"; then
    pass "thinking mode drops the earlier reasoning (the conversation is replayed)"
else
    fail "thinking mode: $(grep -E '^(last turn|session)' "$tmp/think.out")"
fi
printf 'Hello there\nSecond question\n/stats\n' |
    "$DS4F_BIN" chat -m "$model" --think --keep-reasoning -n 8 --seed 1 >"$tmp/keep.out" 2>&1
if grep -q ' 0 replays' "$tmp/keep.out" && ! grep -q '^last turn: prompt [0-9]* tokens = 0 reused' "$tmp/keep.out"; then
    pass "--keep-reasoning keeps it and reuses the session"
else
    fail "--keep-reasoning: $(grep -E '^(last turn|session)' "$tmp/keep.out")"
fi

# ---- through a pseudo-terminal ------------------------------------------------------------------
if ! command -v tmux >/dev/null 2>&1; then
    fail "tmux is not installed (scripts/install-deps.sh installs it)"
    finish
    exit 1
fi
# Each chat gets its own tmux server (socket), so that one shutting down never meets the next.
sock=$tmp/chat1.sock
trap 'for s in "$tmp"/*.sock; do tmux -S "$s" kill-server 2>/dev/null; done; rm -rf "$tmp"' EXIT
pane() { tmux -S "$sock" capture-pane -p -J -S -200 -t chat 2>/dev/null; }
keys() { tmux -S "$sock" send-keys -t chat "$@" 2>/dev/null; }
# wait_for PATTERN: polls the screen until grep finds PATTERN (at most 60 s: a slow machine only
# makes it wait longer, never fail).
wait_for() {
    i=0
    while [ $i -lt 300 ]; do
        pane >"$tmp/pane" 2>/dev/null
        grep -q -- "$1" "$tmp/pane" && return 0
        sleep 0.2
        i=$((i + 1))
    done
    return 1
}
count() { pane | grep -c -- "$1"; }
# wait_count PATTERN N: polls until N lines of the screen match (at most 60 s).
wait_count() {
    i=0
    while [ "$(count "$1")" -lt "$2" ]; do
        [ $i -ge 300 ] && return 1
        sleep 0.2
        i=$((i + 1))
    done
}

# start_chat SOCKET-NAME ARGS...
start_chat() {
    [ -S "$sock" ] && tmux -S "$sock" kill-server 2>/dev/null
    sock=$tmp/$1.sock
    shift
    # a tmux server that fails to start (it happens, rarely, on a loaded machine) gets a second try
    for attempt in 1 2 3; do
        HOME=$tmp tmux -S "$sock" new-session -d -s chat -x 250 -y 60 \
            "\"$DS4F_BIN\" chat -m \"$model\" $* 2>&1; echo CHAT-EXITED \$?; sleep 600" 2>>"$tmp/tmux.err" &&
            tmux -S "$sock" has-session -t chat 2>/dev/null && return 0
        sleep 1
    done
    echo "tmux would not start: $(tail -1 "$tmp/tmux.err")"
    return 1
}

start_chat chat1 -n 8 --seed 1
if wait_for '/help lists the commands'; then pass "pty: chat starts with its banner"; else fail "pty: no banner: $(tail -3 "$tmp/pane")"; fi
# Each step waits for the prompt that follows the previous one (one more line starting with
# "> "), so typing never races the answer.
keys 'Hello there' Enter
wait_count '^>' 2 && keys '/stats' Enter
wait_count '^>' 3 && keys 'Second question' Enter
wait_count '^>' 4 && keys '/stats' Enter
wait_count '^>' 5
pane >"$tmp/pty.out"
check_reuse "pty" "$tmp/pty.out"
# history: the up arrow brings back the previous lines
keys Up Up
i=0
until pane | grep -v '^ *$' | tail -n 1 | grep -q '^> Second question$' || [ $i -ge 50 ]; do sleep 0.2; i=$((i + 1)); done
if pane | grep -v '^ *$' | tail -n 1 | grep -q '^> Second question$'; then pass "pty: history recalls earlier lines"; else fail "pty: history: $(pane | tail -n 2)"; fi
keys C-u '/quit' Enter
if wait_for 'CHAT-EXITED 0'; then pass "pty: /quit leaves with status 0"; else fail "pty: /quit: $(tail -3 "$tmp/pane")"; fi

# Ctrl-C while an answer streams: the answer stops, the session goes on, the next turn reuses it.
start_chat chat2 -n 0 --ctx 2048 --seed 2
wait_for '/help lists the commands'
keys 'Tell me a long story' Enter
# the answer has started once something follows the input line
i=0
while [ $i -lt 300 ]; do
    pane | awk 'found && NF { ok = 1 } /^> Tell me a long story$/ { found = 1 } END { exit !ok }' && break
    sleep 0.2
    i=$((i + 1))
done
keys C-c
if wait_for '^\[stopped\]$'; then pass "pty: Ctrl-C stops the answer"; else fail "pty: Ctrl-C: $(tail -3 "$tmp/pane")"; fi
wait_count '^>' 2
keys '/stats' Enter
if wait_for 'finish cancelled'; then pass "pty: the stopped turn reports finish cancelled"; else fail "pty: stats after Ctrl-C: $(grep 'last turn' "$tmp/pane")"; fi
wait_count '^>' 3
keys 'abc' C-c
wait_count '^>' 4
keys '/stats' Enter
wait_count '^>' 5
if pane | grep -q 'CHAT-EXITED'; then fail "pty: Ctrl-C at the prompt ended the chat"; else pass "pty: Ctrl-C at the prompt keeps the chat"; fi
keys C-d
if wait_for 'CHAT-EXITED 0'; then pass "pty: Ctrl-D leaves"; else fail "pty: Ctrl-D: $(tail -3 "$tmp/pane")"; fi

finish
