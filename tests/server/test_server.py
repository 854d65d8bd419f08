"""tandem serve end to end, driven by the official openai and anthropic Python clients.

The model is the tiny synthetic one (`tandem synth --preset tiny`: random weights, so the text is noise)
on `--device cpu`, whose batched rows equal the rows alone bit for bit: greedy replies must not depend
on what else is in flight. Each server listens on a free loopback port (`--port 0`) and stops on SIGTERM.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

TANDEM = os.environ.get("TANDEM_CLI", "build/tandem")


class Server:
    def __init__(self, model, *flags):
        self.proc = subprocess.Popen([TANDEM, "serve", "--model", model, "--device", "cpu", "--threads", "1", "--port", "0", *flags],
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 60
        while True:
            line = self.proc.stderr.readline()
            assert line, "tandem serve exited before listening:\n" + "".join(self.log)
            self.log.append(line)
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                break
            assert time.time() < deadline, "tandem serve did not start:\n" + "".join(self.log)
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self.reader.join(timeout=5)
        return rc

    def raw(self, method, path, body=None, headers=None):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def metric(self, name):
        key = self.proc.args[self.proc.args.index("--api-key") + 1] if "--api-key" in self.proc.args else None
        _, _, text = self.raw("GET", "/metrics", headers={"Authorization": "Bearer " + key} if key else None)
        m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
        assert m, name + " not in /metrics:\n" + text
        return float(m.group(1))


@pytest.fixture(scope="module")
def model():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "tiny")
        subprocess.run([TANDEM, "synth", "--preset", "tiny", "--out", out], check=True, stdout=subprocess.DEVNULL)
        yield out


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, "--slots", "4")
    yield s
    assert s.stop() == 0, "".join(s.log)


def oai(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("key", "none"), max_retries=0, **kw)


def chat(server, content, **kw):
    return oai(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], **kw)


def streamed_chat(server, content, **kw):
    reasoning, text, finish, usage = "", "", None, None
    for chunk in oai(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], stream=True,
                                                     stream_options={"include_usage": True}, **kw):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return reasoning, text, finish, usage


NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def test_chat_reply_and_usage(server):
    r = chat(server, "Hello there", max_tokens=12, temperature=0, extra_body=NO_THINK)
    assert r.object == "chat.completion" and r.model == "tiny"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 12


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "extra_body": {"top_k": 40, "min_p": 0.01}}])
def test_stream_concatenates_to_the_whole_reply(server, sampling):
    whole = chat(server, "Tell me a story", max_tokens=24, **sampling)
    reasoning, text, finish, usage = streamed_chat(server, "Tell me a story", max_tokens=24, **sampling)
    msg = whole.choices[0].message
    assert (getattr(msg, "reasoning_content", None) or "") == reasoning
    assert (msg.content or "") == text
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens


def test_thinking_on_and_off(server):
    on = chat(server, "Think about it", max_tokens=10, temperature=0)
    off = chat(server, "Think about it", max_tokens=10, temperature=0, extra_body=NO_THINK)
    # thinking on: the prompt opens <think>, and the random model never closes it: all reasoning
    assert getattr(on.choices[0].message, "reasoning_content", None)
    assert not getattr(off.choices[0].message, "reasoning_content", None)
    assert off.choices[0].message.content
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the empty think block of thinking off


def test_stop_string(server):
    full = chat(server, "Count with me", max_tokens=30, temperature=0, extra_body=NO_THINK).choices[0].message.content
    words = [w for w in re.findall(r"[A-Za-z]{3,}", full)]
    assert len(words) >= 3, full
    stop = words[2]
    cut = chat(server, "Count with me", max_tokens=30, temperature=0, stop=[stop], extra_body=NO_THINK)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(stop)]


def test_eight_concurrent_streams_equal_one_at_a_time(server):
    prompts = [f"Request number {i}: say something" for i in range(8)]
    alone = [streamed_chat(server, p, max_tokens=20, temperature=0)[:2] for p in prompts]
    together = [None] * 8

    def run(i):
        together[i] = streamed_chat(server, prompts[i], max_tokens=20, temperature=0)[:2]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone


def test_disconnect_frees_the_slot(server):
    cancelled = server.metric("tandem_requests_cancelled_total")
    stream = oai(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go on forever"}], stream=True,
                                                 max_tokens=200000, temperature=0, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.time() + 20
    while time.time() < deadline and (server.metric("tandem_slots_in_use") > 0 or server.metric("tandem_requests_cancelled_total") <= cancelled):
        time.sleep(0.1)
    assert server.metric("tandem_slots_in_use") == 0
    assert server.metric("tandem_requests_cancelled_total") == cancelled + 1
    assert chat(server, "still there?", max_tokens=4, temperature=0).choices[0].message


def test_a_non_streaming_client_that_leaves_frees_its_slot_too(server):
    # Past a second the reply is sent chunked with whitespace every second; the write after the client
    # went away fails and the request is cancelled like a stream's.
    cancelled = server.metric("tandem_requests_cancelled_total")
    with pytest.raises(openai.APITimeoutError):
        oai(server, timeout=2.5).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go on forever"}],
                                                         max_tokens=200000, temperature=0, extra_body={"ignore_eos": True})
    deadline = time.time() + 20
    while time.time() < deadline and (server.metric("tandem_slots_in_use") > 0 or server.metric("tandem_requests_cancelled_total") <= cancelled):
        time.sleep(0.1)
    assert server.metric("tandem_slots_in_use") == 0
    assert server.metric("tandem_requests_cancelled_total") == cancelled + 1


def test_a_long_non_streaming_reply_is_whole_json(server):
    # Longer than the one-body wait: whitespace first, then the same reply as the stream's pieces.
    kw = dict(max_tokens=12000, temperature=0, extra_body={"ignore_eos": True})  # ~6 s on the 2-core dev box
    t0 = time.time()
    status, headers, body = server.raw("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "long"}], **{
        "max_tokens": 12000, "temperature": 0, "ignore_eos": True}})
    took = time.time() - t0
    assert status == 200, body
    reply = json.loads(body)
    assert reply["usage"]["completion_tokens"] == 12000 and reply["choices"][0]["finish_reason"] == "length"
    if took > 2.5:  # the heartbeats only come after the first second
        assert body.startswith(" ") and headers.get("Transfer-Encoding") == "chunked"
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(server, "long", stream=True, **kw) if c.choices)
    assert reply["choices"][0]["message"]["content"] == streamed


def test_completions(server):
    c = oai(server).completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0)
    assert c.object == "text_completion" and c.usage.completion_tokens <= 10
    text = "".join(ch.choices[0].text for ch in oai(server).completions.create(model="tiny", prompt="Once upon a time", max_tokens=10,
                                                                                 temperature=0, stream=True) if ch.choices)
    assert text == c.choices[0].text


def test_models_tokenize_detokenize_health(server):
    assert [m.id for m in oai(server).models.list().data] == ["tiny"]
    st, _, body = server.raw("POST", "/tokenize", {"content": "hello world"})
    assert st == 200
    ids = json.loads(body)["tokens"]
    assert ids
    st, _, body = server.raw("POST", "/detokenize", {"tokens": ids})
    assert st == 200 and json.loads(body)["content"] == "hello world"
    st, _, body = server.raw("POST", "/detokenize", {"tokens": [10 ** 9]})
    assert st == 400 and json.loads(body)["error"]["param"] == "tokens[0]"
    st, _, body = server.raw("GET", "/health")
    assert st == 200 and json.loads(body)["status"] == "ok"


def test_anthropic_messages(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    m = client.messages.create(model="tiny", max_tokens=12, extra_body={"temperature": 0}, system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    assert m.type == "message" and m.role == "assistant" and m.stop_reason in ("max_tokens", "end_turn")
    assert m.usage.output_tokens <= 12 and m.usage.input_tokens > 5
    text = "".join(b.text for b in m.content if b.type == "text")
    with client.messages.stream(model="tiny", max_tokens=12, extra_body={"temperature": 0}, system="Be brief.", messages=[{"role": "user", "content": "Hi"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_anthropic_tool_history_renders(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather of a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    m = client.messages.create(model="tiny", max_tokens=4, tools=tools, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    assert m.usage.input_tokens > 100  # the tools block, the call and its result are in the prompt


def test_tool_choice_makes_the_reply_call(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for choice, opening in ((forced, "<tool_call>\n<function=get_weather>\n"), ("required", "<tool_call>")):
        r = chat(server, "Weather in Paris?", max_tokens=24, temperature=0, tools=tools, tool_choice=choice, extra_body=NO_THINK)
        msg = r.choices[0].message
        # the random model's call stays malformed, so it comes back as content (never as an error); a whole one as tool_calls
        if msg.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls"
            assert choice == "required" or msg.tool_calls[0].function.name == "get_weather"
        else:
            assert (msg.content or "").startswith(opening), msg.content
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    atools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    m = client.messages.create(model="tiny", max_tokens=24, tools=atools, tool_choice={"type": "tool", "name": "get_weather"},
                               extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Weather in Paris?"}])
    text = "".join(b.text for b in m.content if b.type == "text")
    assert any(b.type == "tool_use" and b.name == "get_weather" for b in m.content) or text.startswith("<tool_call>\n<function=get_weather>\n"), m.content


def test_bad_requests(server):
    client = oai(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=5)
    assert e.value.body["param"] == "temperature" and "[0, 2]" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "x"}])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    st, _, body = server.raw("POST", "/v1/chat/completions", b"{not json", {"Content-Type": "application/json"})
    assert st == 400 and "not valid JSON" in json.loads(body)["error"]["message"]
    st, _, body = server.raw("POST", "/v1/chat/completions", {"messages": "hi"})
    assert st == 400 and json.loads(body)["error"]["param"] == "messages"
    st, _, body = server.raw("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": [""]})
    assert st == 400 and json.loads(body)["error"]["param"] == "stop[0]"
    st, _, body = server.raw("GET", "/v1/nope")
    assert st == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    st, _, body = server.raw("POST", "/v1/messages", {"messages": [{"role": "user", "content": "x"}]})
    err = json.loads(body)
    assert st == 400 and err["type"] == "error" and "max_tokens" in err["error"]["message"]
    assert chat(server, "fine after all that", max_tokens=3, temperature=0).choices[0].message  # still serving


def test_auth_limits_queue_timeout_and_drain(model):
    s = Server(model, "--slots", "1", "--max-queue", "0", "--api-key", "sekrit", "--max-body", "4096", "--timeout", "3")
    try:
        with pytest.raises(openai.AuthenticationError):
            chat(s, "hi", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            oai(s, key="wrong").models.list()
        good = oai(s, key="sekrit")
        assert good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices
        a = anthropic.Anthropic(base_url=s.url, api_key="sekrit", max_retries=0)  # x-api-key
        assert a.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}]).content is not None
        st, _, _ = s.raw("GET", "/health")
        assert st == 200  # health needs no key
        st, _, body = s.raw("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 8000}]}, {"Authorization": "Bearer sekrit"})
        assert st == 413 and "4096" in json.loads(body)["error"]["message"]
        # one slot, no queue: a second request while the first runs is refused with Retry-After
        first = {}

        def long_one():
            first["r"] = good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "long"}], max_tokens=10 ** 6,
                                                       extra_body={"ignore_eos": True})

        t = threading.Thread(target=long_one)
        t.start()
        deadline = time.time() + 10
        while time.time() < deadline and s.metric("tandem_slots_in_use") < 1:
            time.sleep(0.05)
        st, headers, body = s.raw("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                                  {"Authorization": "Bearer sekrit"})
        assert st == 503 and headers.get("Retry-After") == "1", body
        t.join(timeout=30)  # the wall-clock limit (3 s) ends the first one
        assert first["r"].choices[0].finish_reason == "length"
        assert s.metric("tandem_requests_timed_out_total") == 1
        # SIGTERM while a stream runs: the stream finishes, then the server exits 0
        stream = good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "drain"}], max_tokens=40, stream=True, temperature=0)
        it = iter(stream)
        next(it)
        s.proc.send_signal(signal.SIGTERM)
        rest = list(it)
        assert rest and rest[-1].choices[0].finish_reason in ("length", "stop")
        assert s.proc.wait(timeout=30) == 0
    finally:
        if s.proc.poll() is None:
            s.stop()


def test_second_turn_hits_the_prefix_cache_and_gives_the_same_reply(server, model):
    turn1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    r1 = oai(server).chat.completions.create(model="tiny", messages=turn1, max_tokens=12, temperature=0, extra_body=NO_THINK)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "Another one?"}]
    hits = server.metric("tandem_prefix_cache_hits_total")
    r2 = oai(server).chat.completions.create(model="tiny", messages=turn2, max_tokens=12, temperature=0, extra_body=NO_THINK)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < r2.usage.prompt_tokens
    assert server.metric("tandem_prefix_cache_hits_total") == hits + 1
    assert server.metric("tandem_prefix_cache_reused_tokens_total") >= cached
    plain = Server(model, "--cache-bytes", "0")
    try:
        again = oai(plain).chat.completions.create(model="tiny", messages=turn2, max_tokens=12, temperature=0, extra_body=NO_THINK)
        assert again.usage.prompt_tokens_details.cached_tokens == 0
        assert again.choices[0].message.content == r2.choices[0].message.content
        assert again.usage.prompt_tokens == r2.usage.prompt_tokens
    finally:
        assert plain.stop() == 0
    # the same conversation through the Anthropic API: the system and first turn come from the cache
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    a = client.messages.create(model="tiny", max_tokens=4, system="You are terse.", messages=[
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "And a third?"}], extra_body={"temperature": 0})
    assert a.usage.cache_read_input_tokens > 0
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens > 20


def test_drafts_give_the_same_greedy_replies_and_their_statistics(server, model):
    """A server with --draft 2 (the MTP head drafts, every step verifies): greedy replies equal the
    plain server's, a second turn still resumes from the prefix cache (the head's side is saved too), and
    /metrics counts verification steps and drafts by position."""
    spec = Server(model, "--draft", "2", "--slots", "2")
    try:
        for content in ("Name a colour.", "Count to five."):
            want = chat(server, content, max_tokens=20, temperature=0, extra_body=NO_THINK)
            got = chat(spec, content, max_tokens=20, temperature=0, extra_body=NO_THINK)
            assert got.choices[0].message.content == want.choices[0].message.content
            assert got.usage.completion_tokens == want.usage.completion_tokens
        assert spec.metric("tandem_verify_steps_total") > 0
        assert spec.metric('tandem_drafts_total{position="1"}') > 0
        assert spec.metric('tandem_drafts_accepted_total{position="2"}') >= 0
        turn = [{"role": "user", "content": "Name a colour."}]
        r1 = oai(spec).chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0, extra_body=NO_THINK)
        turn += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "Another?"}]
        r2 = oai(spec).chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0, extra_body=NO_THINK)
        plain = oai(server).chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0, extra_body=NO_THINK)
        assert r2.usage.prompt_tokens_details.cached_tokens > 0
        assert r2.choices[0].message.content == plain.choices[0].message.content
    finally:
        assert spec.stop() == 0
