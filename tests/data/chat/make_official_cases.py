#!/usr/bin/env python3
"""Records what DeepSeek's official encoder does, as test data for tests/unit/test_chat_template.c.

Not needed to run the tests (its outputs are committed); kept to show where the data came from.

    python3 tests/data/chat/make_official_cases.py /path/to/encoding_dsv4.py tests/data/chat

encoding_dsv4.py: GitHub Nicooo-Wang/DeepSeek-V4-Pro-code, commit 0ec3a03, encoding/encoding_dsv4.py
(git show 0ec3a03:encoding/encoding_dsv4.py). Writes:

* official_render_cases.jsonl: {"name", "messages", "request_tools"?, "thinking", "drop", "effort",
  "bos", "text" | "error"}: encode_messages(messages, ...) or the exception it raised. Messages
  are in the OpenAI-style form both encoders take; "request_tools" are attached as ds4f's
  chat_from_openai does (to a first system message, else to a new empty system message first).
* official_parse_cases.jsonl: {"name", "text", "thinking", "eos_optional", "result" | "error"}:
  parse_message_from_completion_text(text (+ EOS when eos_optional and absent), mode).

Named cases are written by hand; the "random-N" ones come from a seeded generator. Floats whose
value is an integer are kept out of tool schemas: ds4f reads those through cJSON, which cannot
tell 1.0 from 1 (see text/dsml.h).
"""
import copy
import importlib.util
import json
import random
import sys

spec = importlib.util.spec_from_file_location("encoding_dsv4", sys.argv[1])
E = importlib.util.module_from_spec(spec)
spec.loader.exec_module(E)
OUT = sys.argv[2]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 3},
                          "scale": {"type": "number", "default": 0.5}}, "required": ["city"]}}}
CALC = {"type": "function", "function": {"name": "calc", "description": "Évalue une expression — exacte",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


NAMED = [
    ("chat_multi_turn", dict(thinking=False), [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"}]),
    ("chat_ignores_reasoning", dict(thinking=False), [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "greet", "content": "Hello."},
        {"role": "user", "content": "Bye"}]),
    ("thinking_single_turn", dict(), [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"}]),
    ("thinking_drop_earlier", dict(), [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "A greeting.", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "reasoning_content": "Paris.", "content": "Paris."},
        {"role": "user", "content": "And Italy?"}]),
    ("thinking_keep_earlier", dict(drop=False), [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "A greeting.", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"}]),
    ("thinking_tools_keep_reasoning", dict(), [
        {"role": "system", "content": "Use tools.", "tools": [WEATHER]},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "A greeting.", "content": "Hello!"},
        {"role": "user", "content": "Weather in Oslo?"}]),
    ("thinking_last_assistant_open", dict(), [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "Say hi", "content": "Hel", "wo_eos": True}]),
    ("effort_max", dict(effort="max"), [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Prove it."}]),
    ("effort_max_no_system", dict(effort="max"), [
        {"role": "user", "content": "Prove it."}]),
    ("effort_max_chat_mode", dict(effort="max", thinking=False), [
        {"role": "user", "content": "Prove it."}]),
    ("effort_high", dict(effort="high"), [
        {"role": "user", "content": "Prove it."}]),
    ("tools_on_system", dict(), [
        {"role": "system", "content": "You help.", "tools": [WEATHER, CALC]},
        {"role": "user", "content": "Weather in Oslo for 2 days?"}]),
    ("tools_empty_system", dict(), [
        {"role": "system", "tools": [CALC]},
        {"role": "user", "content": "1+1"}]),
    ("request_tools_with_system", dict(request_tools=[WEATHER]), [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather?"}]),
    ("request_tools_without_system", dict(request_tools=[WEATHER, CALC]), [
        {"role": "user", "content": "Weather?"}]),
    ("tool_results_merged_and_sorted", dict(), [
        {"role": "system", "content": "S", "tools": [WEATHER]},
        {"role": "user", "content": "Oslo, Rome and Lima?"},
        {"role": "assistant", "reasoning_content": "Three calls.", "content": "",
         "tool_calls": [call("c1", "get_weather", '{"city": "Oslo"}'),
                        call("c2", "get_weather", '{"city": "Rome", "days": 2}'),
                        call("c3", "get_weather", '{"city": "Lima", "scale": 1.5e-3}')]},
        {"role": "tool", "tool_call_id": "c3", "content": "lima: 18C"},
        {"role": "tool", "tool_call_id": "c1", "content": "oslo: -2C"},
        {"role": "tool", "tool_call_id": "c2", "content": "rome: 14C"},
        {"role": "user", "content": "Also, which is warmest?"},
        {"role": "assistant", "reasoning_content": "Lima.", "content": "Lima is warmest."}]),
    ("tool_result_parts", dict(), [
        {"role": "user", "content": "Look"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "calc", '{"expr": "1+1"}')]},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "2"},
                                                         {"type": "image_url", "image_url": {"url": "x"}},
                                                         {"type": "text", "text": "done"}]}]),
    ("consecutive_users_merge", dict(thinking=False), [
        {"role": "user", "content": "First part."},
        {"role": "user", "content": "Second part."}]),
    ("tool_then_user_continue", dict(), [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "Calling.", "tool_calls": [call("x", "calc", "{}")]},
        {"role": "tool", "tool_call_id": "x", "content": "{}"}]),
    ("developer_dropped_before_last_user", dict(), [
        {"role": "system", "content": "S"},
        {"role": "developer", "content": "Dev instructions"},
        {"role": "assistant", "reasoning_content": "r", "content": "a"},
        {"role": "user", "content": "Next"}]),
    ("developer_with_tools_last", dict(), [
        {"role": "system", "content": "S"},
        {"role": "latest_reminder", "content": "2026-01-01,Oslo"},
        {"role": "developer", "content": "Search this", "tools": [CALC]}]),
    ("response_format", dict(thinking=False), [
        {"role": "system", "content": "Reply in JSON.",
         "response_format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "number"}}}}},
        {"role": "user", "content": "Go"}]),
    ("latest_reminder", dict(), [
        {"role": "system", "content": "S"},
        {"role": "latest_reminder", "content": "2026-02-21,Sat"},
        {"role": "user", "content": "Date?"}]),
    ("user_then_reminder", dict(), [
        {"role": "user", "content": "Q"},
        {"role": "latest_reminder", "content": "R"},
        {"role": "assistant", "reasoning_content": "t", "content": "A"}]),
    ("task_query", dict(thinking=False), [
        {"role": "user", "content": "best hot springs", "task": "query"}]),
    ("task_action_thinking", dict(), [
        {"role": "user", "content": "weather now", "task": "action"}]),
    ("task_title", dict(), [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "r", "content": "Hello", "task": "title"},
        {"role": "assistant", "content": "Greeting"}]),
    ("no_bos", dict(bos=False, thinking=False), [
        {"role": "user", "content": "Hi"}]),
    ("argument_forms", dict(), [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "reasoning_content": "", "content": "Sure.", "tool_calls": [
            call("1", "f", '{"s": "line\\nbreak \\"q\\" \\u00e9\\ud83d\\ude00", "n": 1.0, "big": 123456789012345678901234567890,'
                           ' "e": 1E5, "neg0": -0, "tiny": 1e-7, "inf": 1e400, "nan": NaN, "arr": [1, "x", null, true],'
                           ' "obj": {"k": {"z": []}}, "dup": 1, "dup": 2}'),
            call("2", "g", "not json at all"),
            call("3", "h", "  {}  ")]}]),
    ("developer_without_content_dropped", dict(), [
        {"role": "developer", "content": ""},
        {"role": "user", "content": "x"}]),
    ("error_developer_without_content", dict(thinking=False), [
        {"role": "developer", "content": ""},
        {"role": "user", "content": "x"}]),
    ("error_arguments_not_object", dict(), [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call("1", "f", "[1, 2]")]}]),
]

WORDS = ["hello", "世界", "a\nb", "\n\n", "tab\there", 'quote"q', "back\\slash", "</think>", "emoji 😀",
         "", " ", "【{id}†L1】", "\r\n", "x" * 5]


def random_cases(rng, n):
    def text():
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 3)))

    def jval(d=0):
        r = rng.random()
        if d > 2 or r < 0.3:
            return rng.choice([1, -7, 0, 123456789012, 3.5, -0.25, 1e-7, True, False, None, text(), "s p"])
        if r < 0.6:
            return [jval(d + 1) for _ in range(rng.randint(0, 3))]
        return {text() or "k": jval(d + 1) for _ in range(rng.randint(0, 3))}

    def args():
        r = rng.random()
        if r < 0.1:
            return text()
        d = {rng.choice(["a", "b", "loc", "名"]): jval() for _ in range(rng.randint(0, 3))}
        return json.dumps(d, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))

    def msg():
        role = rng.choice(["system", "user", "user", "assistant", "assistant", "tool", "developer", "latest_reminder"])
        m = {"role": role}
        if role in ("user", "tool", "latest_reminder"):
            m["content"] = text()
        elif role == "developer":
            m["content"] = text() or "dev"
        elif rng.random() < 0.8:
            m["content"] = text()
        if role == "assistant":
            if rng.random() < 0.6:
                m["reasoning_content"] = text()
            if rng.random() < 0.4:
                m["tool_calls"] = [call(rng.choice(["c1", "c2", "c3", ""]), rng.choice(["get", "search"]), args())
                                   for _ in range(rng.randint(0, 3))]
            if rng.random() < 0.1:
                m["wo_eos"] = True
        if role == "tool" and rng.random() < 0.8:
            m["tool_call_id"] = rng.choice(["c1", "c2", "c3", "zz"])
        if role in ("system", "developer") and rng.random() < 0.3:
            m["tools"] = [rng.choice([WEATHER, CALC])]
        if role in ("user", "assistant") and rng.random() < 0.08:
            m["task"] = rng.choice(sorted(E.VALID_TASKS))
        return m

    for i in range(n):
        yield (f"random-{i}", dict(thinking=rng.random() < 0.6, drop=rng.random() < 0.7,
                                   effort=rng.choice([None, "high", "max"]), bos=rng.random() < 0.9),
               [msg() for _ in range(rng.randint(1, 7))])


def render_case(name, opts, messages):
    case = {"name": name, "messages": messages, "thinking": opts.get("thinking", True),
            "drop": opts.get("drop", True), "effort": opts.get("effort"), "bos": opts.get("bos", True)}
    msgs = copy.deepcopy(messages)
    if opts.get("request_tools"):
        case["request_tools"] = opts["request_tools"]
        if msgs and msgs[0].get("role") == "system":
            msgs[0]["tools"] = opts["request_tools"]
        else:
            msgs.insert(0, {"role": "system", "tools": opts["request_tools"]})
    try:
        case["text"] = E.encode_messages(msgs, thinking_mode="thinking" if case["thinking"] else "chat",
                                         drop_thinking=case["drop"], add_default_bos_token=case["bos"],
                                         reasoning_effort=case["effort"])
    except Exception as ex:
        case["error"] = type(ex).__name__
    return case


EOS = E.eos_token
TC = "\n\n<｜DSML｜tool_calls>\n"
INV = '<｜DSML｜invoke name="{}">\n'
PAR = '<｜DSML｜parameter name="{}" string="{}">{}</｜DSML｜parameter>\n'
END_INV = "</｜DSML｜invoke>\n"
END_TC = "</｜DSML｜tool_calls>"

NAMED_PARSE = [
    ("thinking_plain", True, "Simple arithmetic.</think>2 + 2 = 4." + EOS),
    ("chat_plain", False, "Just text, 多语言 😀." + EOS),
    ("thinking_empty", True, "</think>" + EOS),
    ("thinking_tool_call", True, "Need weather.</think>" + TC + INV.format("get_weather")
     + PAR.format("city", "true", "Oslo") + PAR.format("days", "false", "3")
     + PAR.format("opts", "false", '{"a": [1, 2.50]}') + END_INV + END_TC + EOS),
    ("chat_two_tool_calls_with_content", False, "Let me check." + TC + INV.format("a") + PAR.format("q", "true", 'say "hi"\nnow')
     + END_INV + INV.format("b") + END_INV + END_TC + EOS),
    ("string_false_copied_verbatim", False, TC + INV.format("f") + PAR.format("x", "false", "not json") + END_INV + END_TC + EOS),
    ("header_with_extra_newline", False, TC + '<｜DSML｜invoke name="f">\n\n' + END_INV + END_TC + EOS),
    ("error_missing_think_end", True, "reasoning without end" + EOS),
    ("error_tool_calls_inside_reasoning", True, "thinking" + TC + INV.format("f") + END_INV + END_TC + EOS),
    ("error_missing_eos", False, "no eos"),
    ("error_text_after_eos", False, "a" + EOS + "b"),
    ("error_text_after_tool_calls", False, TC + INV.format("f") + END_INV + END_TC + "trailing" + EOS),
    ("error_bad_string_attr", False, TC + INV.format("f") + '<｜DSML｜parameter name="x" string="maybe">1</｜DSML｜parameter>\n'
     + END_INV + END_TC + EOS),
    ("error_duplicate_param", False, TC + INV.format("f") + PAR.format("x", "true", "1") + PAR.format("x", "true", "2")
     + END_INV + END_TC + EOS),
    ("error_missing_newline", False, TC + INV.format("f") + PAR.format("x", "true", "1").rstrip("\n") + END_INV + END_TC + EOS),
    ("error_bad_invoke_header", False, TC + '<｜DSML｜invoke nam="f">\n' + END_INV + END_TC + EOS),
    ("error_special_token_in_content", False, "a <think> b" + EOS),
    ("error_dsml_in_reasoning", True, "x ｜DSML｜ y</think>z" + EOS),
    ("truncated_block_accepted_officially", False, "Checking." + TC + INV.format("f") + PAR.format("x", "true", "1")),
    ("truncated_block_eos_optional", False, "Checking." + TC + INV.format("f") + PAR.format("x", "true", "1"), True),
    ("eos_optional_plain", True, "r</think>c", True),
    ("eos_optional_still_rejects_after_eos", False, "a" + EOS + "b", True),
]


def random_completions(rng, n):
    w = ["hi", "世界", "\n", "\n\n", "<", ">", "/", '"', "x", "</think>", "<think>", EOS, "｜DSML｜", "😀", " ",
         "<｜DSML｜parameter", "</｜DSML｜invoke>", "\u3000"]

    def text(k=3):
        return "".join(rng.choice(w[:9] if rng.random() < 0.8 else w) for _ in range(rng.randint(0, k)))

    def jv(d=0):
        r = rng.random()
        if d > 2 or r < 0.5:
            return rng.choice([1, 2.5, True, None, "s", text(), -3])
        if r < 0.75:
            return [jv(d + 1) for _ in range(rng.randint(0, 2))]
        return {text() or "k": jv(d + 1) for _ in range(rng.randint(0, 2))}

    for i in range(n):
        thinking = rng.random() < 0.5
        m = {"role": "assistant", "content": text(), "reasoning_content": text()}
        if rng.random() < 0.6:
            m["tool_calls"] = [call("", rng.choice(["get", "a b", "名", 'q"x']),
                                    json.dumps({rng.choice(["a", "b", "c d", "名"]): jv() for _ in range(rng.randint(0, 3))},
                                               ensure_ascii=False)) for _ in range(rng.randint(1, 3))]
        s = E.render_message(0, [m], thinking_mode="thinking" if thinking else "chat", drop_thinking=False)
        r = rng.random()
        if r < 0.35:
            pass
        elif r < 0.5:
            s = s[:rng.randint(0, len(s))]
        elif r < 0.65:
            k = rng.randint(0, len(s))
            s = s[:k] + rng.choice(w + ["\n\n<｜DSML｜tool_calls>\n", ">\n", 'string="false">']) + s[k:]
        elif r < 0.8:
            k = rng.randint(0, len(s))
            s = s[:k] + s[min(len(s), k + rng.randint(1, 5)):]
        elif r < 0.9:
            s = s.replace(EOS, "")
        else:
            s = s + text()
        yield f"random-{i}", thinking, s, rng.random() < 0.3


def parse_case(name, thinking, text, eos_optional=False):
    case = {"name": name, "text": text, "thinking": thinking, "eos_optional": eos_optional}
    t = text + EOS if eos_optional and EOS not in text else text
    try:
        p = E.parse_message_from_completion_text(t, thinking_mode="thinking" if thinking else "chat")
        case["result"] = {"reasoning_content": p["reasoning_content"], "content": p["content"],
                          "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                         for c in p["tool_calls"]]}
    except Exception as ex:
        case["error"] = type(ex).__name__
    return case


def main():
    rng = random.Random(20260707)
    with open(f"{OUT}/official_render_cases.jsonl", "w", encoding="utf-8") as f:
        for name, opts, msgs in NAMED + list(random_cases(rng, 250)):
            f.write(json.dumps(render_case(name, opts, msgs), ensure_ascii=False) + "\n")
    with open(f"{OUT}/official_parse_cases.jsonl", "w", encoding="utf-8") as f:
        for c in NAMED_PARSE:
            f.write(json.dumps(parse_case(*c), ensure_ascii=False) + "\n")
        for c in random_completions(rng, 600):
            f.write(json.dumps(parse_case(*c), ensure_ascii=False) + "\n")


main()
