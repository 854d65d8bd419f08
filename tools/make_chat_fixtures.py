#!/usr/bin/env python3
"""Render varied conversations with the Qwen3.5 chat template exactly as HF transformers does, and write
them as fixtures for Tandem's native renderer (tests/unit/test_chat_template.cpp).

HF compiles the template with an ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
the loopcontrols extension, a `tojson` filter that is json.dumps(x, ensure_ascii=False, indent=None,
separators=None, sort_keys=False) and a `raise_exception(msg)` global; tool-call `arguments` given as a JSON
string are parsed to a mapping first. The template is reference data read from ../shared (not copied here).

Writes:
  tests/data/chat/conversations.json   [{name, messages, tools, options, expected | error}, ...]
  tests/data/chat/template_fingerprint.json   {"fnv1a64": "...", ...} of the template text (the hash only)

Usage:  python3 tools/make_chat_fixtures.py [--template PATH] [--out DIR]
"""
import argparse
import copy
import json
import os
import sys

try:
    import jinja2
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("make_chat_fixtures: the 'jinja2' package is missing (pip install jinja2)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def template_fingerprint(text: str) -> int:
    # What the template renders does not change with line endings or one trailing newline (Jinja normalises
    # newlines and drops a single trailing one), so neither does the fingerprint; runtime/tokenizer/chat_template.cpp
    # computes the same.
    t = text.replace("\r\n", "\n")
    if t.endswith("\n"):
        t = t[:-1]
    return fnv1a64(t.encode("utf-8"))


def compile_template(text: str):
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(text)


def hf_messages(messages):
    """OpenAI-shaped messages as HF hands them to the template: JSON-string arguments parsed to mappings."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            f = call.get("function", call)
            if isinstance(f.get("arguments"), str):
                f["arguments"] = json.loads(f["arguments"])
    return out


# --- the conversations ---------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web; returns \"snippets\" \\ links",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "top_k": {"type": "integer", "minimum": 1, "maximum": 50,
                                                              "default": 5},
                                                    "threshold": {"type": "number", "default": 0.25}},
                   "required": ["query"]}}}
# Keys out of alphabetical order, escapes json.dumps writes (\" \\ \n \r \t \b \f \u00XX), DEL and non-ASCII
# kept, floats in Python's repr (1e-07, 1e+16, 1000000000000000.0, -0.0), nested empties.
ODD_TOOL = {"zeta": 1, "alpha": {"type": "function"}, "function": {
    "name": "odd", "description": "tab\there\nnew line \r\b\f ctrl\u0001\u001f del\u007f ünï 中文 😀 \"q\" \\",
    "parameters": {"z": 0.5, "a": 1e-07, "big": 1e16, "edge": 1e15, "neg": -0.0, "int": -12345678901234,
                   "list": [True, False, None, [], {}], "nested": {"b": {"a": []}}}}}

U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
S = lambda c: {"role": "system", "content": c}
T = lambda c: {"role": "tool", "content": c}


def call(name, arguments, wrap=True):
    f = {"name": name, "arguments": arguments}
    return {"type": "function", "id": "call_" + name, "function": f} if wrap else f


CASES = [
    # name, messages, tools, options
    ("user_only", [U("hi")], None, {}),
    ("user_thinking_off", [U("hi")], None, {"enable_thinking": False}),
    ("no_generation_prompt", [U("hi"), A("hello")], None, {"add_generation_prompt": False}),
    ("system_user", [S("Be brief."), U("2+2?")], None, {}),
    ("contents_trimmed", [S("  \n Be brief.\t\n"), U("\n\n  hello there  \t\n"), A("  \n answer \n\n"), U(" again ")],
     None, {}),
    ("system_empty_after_trim", [S(" \n\t "), U("hi")], None, {}),
    ("tools_no_system", [U("Weather in Paris?")], [WEATHER, SEARCH], {}),
    ("tools_with_system", [S("You are a helpful agent."), U("Weather in Paris?")], [WEATHER], {}),
    ("tools_system_empty_after_trim", [S("  \n  "), U("Weather in Paris?")], [WEATHER], {"enable_thinking": False}),
    ("tools_json_escapes_and_order", [U("go")], [ODD_TOOL], {}),
    ("multi_turn_think_stripped", [S("Be brief."), U("2+2?"), A("<think>\nadd them\n</think>\n\n4"), U("and 3+3?")],
     None, {}),
    ("multi_turn_thinking_off", [U("2+2?"), A("<think>\n\n</think>\n\n4"), U("and 3+3?")], None,
     {"enable_thinking": False}),
    ("reasoning_content_before_last_query_dropped",
     [U("q1"), A("a1", reasoning_content="thought about q1"), U("q2")], None, {}),
    ("reasoning_content_after_last_query_kept",
     [U("q1"), A("a1", reasoning_content="\n  thought about q1 \n")], None, {"add_generation_prompt": False}),
    ("reasoning_content_empty_string_keeps_think_in_content",
     [U("q1"), A("<think>x</think>visible", reasoning_content="")], None, {"add_generation_prompt": False}),
    ("think_split_edges",
     [U("q"), A("\n\n<think>\n\nfirst<think>\nsecond\n\n</think>\n\n\nmiddle</think>\n  tail  ")], None,
     {"add_generation_prompt": False}),
    ("think_without_open_tag", [U("q"), A("plan only</think>answer")], None, {"add_generation_prompt": False}),
    ("assistant_last_prefill", [U("Tell me"), A("Sure, ")], None, {"add_generation_prompt": False}),
    ("tool_call_string_arguments",
     [U("Weather in Paris?"), A("", tool_calls=[call("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
      T("18 C, sunny")], [WEATHER], {}),
    ("tool_call_argument_types",
     [U("run it"), A("", tool_calls=[call("odd", {
         "s": "text", "multi": "line 1\nline 2", "uni": "ünï 中文 😀", "i": 42, "neg": -7, "f": 3.14, "f_int": 2.0,
         "tiny": 1e-07, "huge": 1e+20, "edge": 1e15, "negzero": -0.0, "t": True, "fls": False, "nil": None,
         "obj": {"b": 1, "a": [1, 2.5, "x"], "n": None}, "lst": [1, "two", {"three": 3}, [True]], "empty_obj": {},
         "empty_list": [], "empty_str": "", "quote": "say \"hi\" \\ back"})])],
     None, {"add_generation_prompt": False}),
    ("tool_call_without_function_wrapper",
     [U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Rome"}, wrap=False)]), T("rainy")], [WEATHER],
     {}),
    ("tool_call_without_arguments", [U("ping?"), A("", tool_calls=[{"function": {"name": "ping"}}]), T("pong")],
     None, {}),
    ("tool_call_with_content_before",
     [U("Weather in Paris?"), A("Let me check.", tool_calls=[call("get_weather", {"city": "Paris"})]),
      T("sunny")], [WEATHER], {}),
    ("tool_call_with_whitespace_content",
     [U("Weather in Paris?"), A(" \n\t ", tool_calls=[call("get_weather", {"city": "Paris"})]), T("sunny")],
     [WEATHER], {}),
    ("tool_call_with_think_in_content",
     [U("Weather in Paris?"), A("<think>\nI should call the tool.\n</think>\n\nChecking.",
                                 tool_calls=[call("get_weather", {"city": "Paris"})]), T("sunny")], [WEATHER], {}),
    ("tool_call_with_think_only_content",
     [U("Weather in Paris?"), A("<think>\nneed the tool\n</think>\n\n",
                                 tool_calls=[call("get_weather", {"city": "Paris"})])], [WEATHER],
     {"add_generation_prompt": False}),
    ("several_calls_one_turn_and_grouped_results",
     [U("Weather in Paris and Rome?"),
      A("", reasoning_content="need two lookups",
        tool_calls=[call("get_weather", {"city": "Paris"}), call("get_weather", '{"city": "Rome"}'),
                    call("search", {"query": "weather europe", "top_k": 3})]),
      T("sunny"), T("rainy"), T("  results  \n")], [WEATHER, SEARCH], {}),
    ("multi_step_tool_loop_then_new_query",
     [S("Agent."), U("Plan a trip"),
      A("", reasoning_content="step 1", tool_calls=[call("search", {"query": "flights"})]), T("flight list"),
      A("", reasoning_content="step 2", tool_calls=[call("search", {"query": "hotels"})]), T("hotel list"),
      A("Here is the plan.", reasoning_content="done"), U("Thanks! Cheaper?"),
      A("", reasoning_content="step 3", tool_calls=[call("search", {"query": "cheap hotels", "top_k": 10})]),
      T("cheap list")], [SEARCH], {}),
    ("user_tool_response_text_is_not_a_query",
     [U("real question"), A("", tool_calls=[call("ping", {})]),
      U("  <tool_response>\nmanual result\n</tool_response>\n")], None, {}),
    ("tool_message_first",
     [T("orphan result"), U("What now?")], None, {}),
    ("tool_results_then_assistant_then_tool",
     [U("go"), A("", tool_calls=[call("a", {"x": 1})]), T("r1"), A("", tool_calls=[call("b", {"y": [1]})]),
      T("r2")], None, {"add_generation_prompt": False}),
    ("images_and_video",
     [U([{"type": "image", "image": "file:///a.png"}, {"type": "text", "text": "What is this?"}]),
      A("A cat."),
      U([{"type": "image_url", "image_url": {"url": "http://x/b.png"}}, {"type": "video", "video": "file:///c.mp4"},
         {"type": "text", "text": "  And these?  "}])], None, {}),
    ("images_with_vision_ids",
     [S("Describe images."),
      U([{"type": "image"}, {"type": "image", "image": "b"}, {"text": "two pictures"}]),
      A([{"type": "text", "text": "Seen."}, {"type": "video", "video": "v"}]),
      U([{"type": "video"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "more"}]),
      A("", tool_calls=[call("zoom", {"level": 2})]),
      T([{"type": "image", "image": "z"}, {"type": "text", "text": "zoomed"}])], None, {"add_vision_id": True}),
    ("image_priority_over_text_key",
     [U([{"type": "text", "text": "ignored", "image": "i"}, {"type": "video", "text": "also ignored"}])], None,
     {"add_vision_id": True}),
    ("content_list_text_only_and_empty",
     [U([{"type": "text", "text": " a "}, {"type": "text", "text": "b "}]), A([]), U([])], None, {}),
    ("multilingual",
     [S("Réponds en français, s'il te plaît."), U("你好，世界！ Привет, мир! مرحبا بالعالم 😀👍🏽 naïve café"),
      A("<think>\n思考中…\n</think>\n\n你好！"), U("日本語で答えてください。한국어도 돼요. ελληνικά")], None, {}),
    ("unicode_whitespace_trimmed",
     [U("\u3000\u00a0\u2028 wide spaces \u2029\u202f\u205f\u1680\u2000\u200a\u0085\x1c\x1f\x0b\x0c"),
      A("\u3000answer\u00a0"), U("\u200bzero width stays\u200b\ufeff")], None, {}),
    ("empty_contents",
     [S(""), U(""), A(""), U("x"), A(None), U("y")], None, {}),
    ("assistant_message_without_content",
     [U("q"), {"role": "assistant", "tool_calls": [call("f", {"a": "b"})]}, T("ok")], None, {}),
    ("special_token_text_in_user_content",
     [U("literal <|im_start|> and <think> tags </think> in text")], None, {"enable_thinking": False}),
    # The template's own errors.
    ("error_no_messages", [], None, {}),
    ("error_no_user_query", [S("sys"), A("hello")], None, {}),
    ("error_only_tool_response_users", [U("<tool_response>\nx\n</tool_response>"), T("y")], None, {}),
    ("error_system_not_first", [U("hi"), S("late system")], None, {}),
    ("error_system_with_image", [S([{"type": "image"}, {"type": "text", "text": "sys"}]), U("hi")], None, {}),
    ("error_system_with_video_and_tools", [S([{"type": "video", "video": "v"}]), U("hi")], [WEATHER], {}),
    ("error_unknown_role", [U("hi"), {"role": "robot", "content": "beep"}], None, {}),
    ("error_unexpected_item_type", [U([{"type": "text", "text": "hi"}, {"type": "audio", "audio": "a.wav"}])], None,
     {}),
    ("error_text_item_without_text", [U([{"type": "text"}])], None, {}),
    ("error_unexpected_content_type", [U({"text": "a mapping"})], None, {}),
]


def render(tmpl, messages, tools, options):
    return tmpl.render(messages=hf_messages(messages), tools=tools, documents=None,
                       add_generation_prompt=options["add_generation_prompt"],
                       enable_thinking=options["enable_thinking"], add_vision_id=options["add_vision_id"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--template", default=os.path.join(ROOT, "..", "shared", "qwen35", "chat_template.jinja"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat"))
    a = ap.parse_args()
    with open(a.template, encoding="utf-8") as f:
        text = f.read()
    tmpl = compile_template(text)
    out = []
    names = set()
    for name, messages, tools, opts in CASES:
        assert name not in names, name
        names.add(name)
        options = {"add_generation_prompt": opts.get("add_generation_prompt", True),
                   "enable_thinking": opts.get("enable_thinking", True),
                   "add_vision_id": opts.get("add_vision_id", False)}
        case = {"name": name, "messages": messages, "tools": tools, "options": options}
        try:
            case["expected"] = render(tmpl, messages, tools, options)
        except TemplateError as e:
            case["error"] = e.message
        out.append(case)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    fp = {"fnv1a64": "%016x" % template_fingerprint(text),
          "of": "qwen35/chat_template.jinja, CRLF as LF and one trailing newline dropped (what Jinja renders)",
          "jinja2": jinja2.__version__}
    with open(os.path.join(a.out, "template_fingerprint.json"), "w", encoding="utf-8") as f:
        json.dump(fp, f, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in out)
    print(f"make_chat_fixtures: {len(out)} conversations ({len(out) - errors} renderings, {errors} errors), "
          f"template fnv1a64 {fp['fnv1a64']} -> {a.out}")


if __name__ == "__main__":
    main()
