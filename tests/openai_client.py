#!/usr/bin/env python3
"""The official `openai` package, unmodified, against a spawned CPU worker (issue 16).

The chat and text completion endpoints and the stateless Responses API (its function tools too), streaming and not, with log-probabilities, stop strings, seeds
(same seed, same text), usage, `ignore_eos`, tool calls (issue 43: a round trip whole and streamed, the
client's own stream accumulation, arguments validated against each tool's schema with `jsonschema`), and
refusals surfacing as the client's typed exceptions (BadRequestError, NotFoundError, APIStatusError 503
for a full queue).

    python tests/openai_client.py --worker target/debug/worker-orcd \
        --model .models/smollm2-135m-instruct-q4_1.gguf

Exits non-zero on the first failed check. The worker's log is kept in a
temporary file and printed when a check fails.
"""

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import jsonschema
import openai

WORKER_ID = "6f1d7a2e-0000-4000-8000-000000000016"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def worker(binary: str, model: str, *flags: str, backend: str = "cpu"):
    """A worker (CPU unless `backend` says otherwise) on a free port, ready; yields its base URL."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)
    cmd = [binary, "--worker-id", WORKER_ID, "--model", os.path.abspath(model), "--gpu-device", "0",
           "--port", str(port), "--backend", backend, *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited {proc.returncode}: {open(log.name).read()[-4000:]}")
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("worker not ready after 120 s")
                time.sleep(0.2)
        yield base
    except BaseException:
        print(open(log.name).read()[-4000:], file=sys.stderr)
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log.name)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


def expect(exc_type, call, what):
    try:
        call()
    except exc_type as e:
        print(f"ok  {what}: {type(e).__name__} {getattr(e, 'status_code', '')} param={getattr(e, 'param', None)}")
        return e
    raise AssertionError(f"{what}: no {exc_type.__name__}")


def chat_stream_text(client, **kw):
    """Joined text, finish reason and usage of a streamed chat."""
    text, finish, usage, logprobs = "", None, None, []
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
            if c.logprobs and c.logprobs.content:
                logprobs += c.logprobs.content
    return text, finish, usage, logprobs


def test_chat(client, model):
    msgs = [{"role": "user", "content": "Write a haiku about GPU computing"}]
    whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0.8, seed=7,
                                           logprobs=True, top_logprobs=3)
    choice = whole.choices[0]
    check(whole.object == "chat.completion" and choice.message.role == "assistant", "chat: a chat.completion")
    check(bool(choice.message.content), f"chat: text {choice.message.content!r}")
    check(choice.finish_reason in ("stop", "length"), f"chat: finish_reason {choice.finish_reason}")
    u = whole.usage
    check(u.prompt_tokens > 0 and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens,
          f"chat: usage {u.prompt_tokens}+{u.completion_tokens}={u.total_tokens}")
    lps = choice.logprobs.content
    check(len(lps) == u.completion_tokens, f"chat: {len(lps)} logprob entries for {u.completion_tokens} tokens")
    check(all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lps), "chat: 3 top_logprobs per token, each <= 0")
    text, finish, usage, slps = chat_stream_text(client, model=model, messages=msgs, max_tokens=16, temperature=0.8,
                                                 seed=7, logprobs=True, top_logprobs=3)
    check(text == choice.message.content, "chat: the stream gives the same text for the same seed")
    check(finish == choice.finish_reason and usage.completion_tokens == u.completion_tokens,
          "chat: the stream's finish_reason and usage agree")
    check([t.token for t in slps] == [t.token for t in lps], "chat: the stream's logprobs agree")
    again = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0.8, seed=7)
    check(again.choices[0].message.content == choice.message.content, "chat: same seed, same text")
    others = {client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=1.0,
                                             seed=s).choices[0].message.content for s in (1, 2, 3)}
    check(len(others) > 1, f"chat: other seeds give other texts ({len(others)} distinct of 3)")


def test_completions(client, model):
    prompt = "1, 2, 3, 4,"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stop=[" 7"],
                                      logprobs=2)
    c = whole.choices[0]
    check(whole.object == "text_completion", "completions: a text_completion")
    check(" 7" not in c.text and c.text.strip() != "", f"completions: text {c.text!r} stops before ' 7'")
    check(c.finish_reason == "stop", f"completions: finish_reason {c.finish_reason}")
    lp = c.logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == whole.usage.completion_tokens,
          f"completions: {len(lp.tokens)} tokens with logprobs")
    check(all(len(t) <= 2 for t in lp.top_logprobs), "completions: at most 2 top_logprobs per token")
    text, finish = "", None
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stop=" 7",
                                           stream=True):
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
    check(text == c.text and finish == "stop", "completions: the stream gives the same text and finish_reason")
    short = client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
    check(short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2,
          "completions: max_tokens ends with length")


def test_ignore_eos(client, model):
    """vLLM's and llama-server's `ignore_eos` (guidellm sends it): the same greedy chat that ends at the model's
    end-of-sequence token runs on to exactly max_tokens, its first tokens unchanged."""
    msgs = [{"role": "user", "content": "Say hello."}]
    short = client.chat.completions.create(model=model, messages=msgs, max_tokens=64, temperature=0)
    n = short.usage.completion_tokens
    check(short.choices[0].finish_reason == "stop" and n < 64, f"ignore_eos: without it, EOS after {n} tokens")
    long = client.chat.completions.create(model=model, messages=msgs, max_tokens=64, temperature=0,
                                          extra_body={"ignore_eos": True})
    check(long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 64,
          f"ignore_eos: with it, {long.usage.completion_tokens} tokens, finish_reason {long.choices[0].finish_reason}")
    check(long.choices[0].message.content.startswith(short.choices[0].message.content),
          "ignore_eos: the greedy text before the EOS is unchanged")
    text, finish, usage, _ = chat_stream_text(client, model=model, messages=msgs, max_tokens=64, temperature=0,
                                              extra_body={"ignore_eos": True})
    check(text == long.choices[0].message.content and usage.completion_tokens == 64 and finish == "length",
          "ignore_eos: the stream agrees")
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=40, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(c.usage.completion_tokens == 40 and c.choices[0].finish_reason == "length",
          f"ignore_eos: completions give {c.usage.completion_tokens} of 40 tokens")


def test_bias(client, model):
    """logit_bias, presence_penalty and frequency_penalty as the client sends them: a +100 bias makes every
    token that one, whole and streamed; the penalties cut a greedy repetition; a bad id is refused by name."""
    comma = client.completions.create(model=model, prompt="Hello", max_tokens=6, temperature=1, seed=3,
                                      logit_bias={"28": 100})
    check(comma.choices[0].text == "," * 6, f"bias: +100 on token 28 gives {comma.choices[0].text!r}")
    text, _, _, _ = chat_stream_text(client, model=model, messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=5, temperature=1, seed=4, logit_bias={"28": 100})
    check(text == "," * 5, f"bias: the stream gives {text!r}")
    prompt = "one one one one one one one one"
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    pen = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0,
                                    presence_penalty=2, frequency_penalty=2)
    words = lambda c: re.findall(r"\w+", c.choices[0].text)
    check(len(set(words(pen))) > len(set(words(plain))),
          f"bias: penalties vary the text: {plain.choices[0].text!r} vs {pen.choices[0].text!r}")
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], logit_bias={"99999999": 5}),
        "errors: a logit_bias id outside the vocabulary")
    check(e.param == "logit_bias", f"bias: the bad id names logit_bias ({e.param})")


def test_choices(client, model):
    """n > 1 (issue 43): choice i is what seed + i gives alone, whole and streamed."""
    kw = dict(model=model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=1.0)
    whole = client.chat.completions.create(n=2, seed=11, **kw)
    check([c.index for c in whole.choices] == [0, 1], "choices: two, indexed 0 and 1")
    alone = [client.chat.completions.create(seed=11 + i, **kw) for i in (0, 1)]
    check([c.message.content for c in whole.choices] == [a.choices[0].message.content for a in alone],
          "choices: choice i is the answer of seed + i alone")
    u = whole.usage
    check(u.prompt_tokens == alone[0].usage.prompt_tokens
          and u.completion_tokens == sum(a.usage.completion_tokens for a in alone),
          f"choices: usage counts the prompt once and both choices ({u})")
    texts, finishes, usages = ["", ""], [None, None], 0
    for chunk in client.chat.completions.create(n=2, seed=11, stream=True, stream_options={"include_usage": True},
                                                **kw):
        usages += chunk.usage is not None
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
    check(texts == [c.message.content for c in whole.choices]
          and finishes == [c.finish_reason for c in whole.choices] and usages == 1,
          f"choices: the stream gives each choice's text and finish_reason, and one usage ({texts}, {usages})")
    c = client.completions.create(model=model, prompt="Colours:", n=2, seed=11, max_tokens=8, temperature=1.0)
    check([x.index for x in c.choices] == [0, 1], "choices: completions index their choices")
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(n=3, **kw),
               "choices: more than this worker holds (--queue-depth 1)")
    check(e.param == "n", f"choices: the refusal names n ({e.param})")


def test_errors(client, model):
    msgs = [{"role": "user", "content": "hi"}]
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(model=model, messages=msgs, n=0),
               "errors: n=0")
    check(e.param == "n" and e.type == "invalid_request_error", "errors: n=0 names its param")
    e = expect(openai.BadRequestError,
               lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=100000),
               "errors: max_tokens too large")
    check(e.param == "max_tokens", "errors: max_tokens names its param")
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, messages=msgs, tools=[{"type": "function", "function": {"name": "get weather"}}]),
        "errors: a bad tool name")
    check(e.param == "tools[0].function.name", f"errors: the bad tool name is named ({e.param})")
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, messages=msgs, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}),
        "errors: tool_choice names a function not in tools")
    check(e.param == "tool_choice", "errors: tool_choice names its param")
    expect(openai.NotFoundError, lambda: client.chat.completions.create(model="gpt-4o", messages=msgs),
           "errors: another model")
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, messages=msgs, reasoning_effort="max"), "errors: reasoning_effort max")
    check(e.param == "reasoning_effort", "errors: reasoning_effort names its param")
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, messages=msgs, extra_body={"chat_template_kwargs": {"messages": []}}),
        "errors: chat_template_kwargs setting the template's own messages")
    check(e.param == "chat_template_kwargs", "errors: chat_template_kwargs names its param")


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 40},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
         "required": ["timezone"], "additionalProperties": False}
TOOLS = [
    # strict: the client's stream helper accumulates only strict tools.
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                      "parameters": CLOCK, "strict": True}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def valid_calls(calls, allowed, what):
    """Every call names an allowed tool and its arguments validate against that tool's schema."""
    check(bool(calls), f"{what}: the answer holds calls")
    for c in calls:
        check(c.type == "function" and c.id.startswith("call_"), f"{what}: call id {c.id}")
        check(c.function.name in allowed, f"{what}: calls {c.function.name}")
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        check(True, f"{what}: arguments {c.function.arguments} validate against {c.function.name}'s schema")


def streamed_calls(client, **kw):
    """A streamed chat read by hand (content and finish_reason) and by the client's own accumulator."""
    content, finish, pieces = "", None, {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                p = pieces.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                p["id"] = tc.id or p["id"]
                p["name"] += (tc.function.name or "") if tc.function else ""
                p["arguments"] += (tc.function.arguments or "") if tc.function else ""
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    return content, finish, [pieces[i] for i in sorted(pieces)], final


def test_tools(client, model):
    """Tools on the reference model, whose template ignores them (the worker writes them the Hermes way).
    With tool_choice named or required, every call must parse and validate, at temperature 1 over several
    seeds: this needs the grammar of the calls enforced while decoding."""
    for choice, allowed in (({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
                            ("required", set(SCHEMAS))):
        label = "named" if isinstance(choice, dict) else choice
        for seed in (1, 2, 3):
            # One call per answer: the grammar then ends the answer after it (a model free to add calls
            # may run into max_tokens mid-call; the grammars of several calls are unit-tested).
            kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                      max_tokens=128, temperature=1.0, seed=seed)
            whole = client.chat.completions.create(**kw)
            c = whole.choices[0]
            check(c.finish_reason == "tool_calls", f"tools {label} seed {seed}: finish_reason {c.finish_reason}")
            check(c.message.content is None, f"tools {label} seed {seed}: no content beside the calls")
            valid_calls(c.message.tool_calls, allowed, f"tools {label} seed {seed}")
            content, finish, calls, final = streamed_calls(client, **kw)
            check(finish == "tool_calls" and content == "", f"tools {label} seed {seed}: the stream ends tool_calls")
            check([(p["name"], p["arguments"]) for p in calls]
                  == [(t.function.name, t.function.arguments) for t in c.message.tool_calls],
                  f"tools {label} seed {seed}: the streamed calls are the whole answer's")
            check([(t.function.name, t.function.arguments) for t in final.choices[0].message.tool_calls]
                  == [(p["name"], p["arguments"]) for p in calls],
                  f"tools {label} seed {seed}: the client's stream accumulator agrees")
    # The round trip: the reply's own message object back in the history, the tool's result after it.
    kw = dict(model=model, tools=TOOLS, max_tokens=64, temperature=0)
    first = client.chat.completions.create(messages=ASK, tool_choice="required", parallel_tool_calls=False,
                                           **kw).choices[0].message
    history = ASK + [first] + [{"role": "tool", "tool_call_id": t.id, "content": "22 C, sunny"}
                               for t in first.tool_calls]
    after = client.chat.completions.create(messages=history, **kw).choices[0]
    check(after.finish_reason in ("stop", "length", "tool_calls"),
          f"tools: the round trip is answered ({after.finish_reason}: {after.message.content!r})")
    if after.message.tool_calls:
        valid_calls(after.message.tool_calls, set(SCHEMAS), "tools: auto after the result")
    plain = client.chat.completions.create(messages=ASK, tool_choice="none", **kw).choices[0]
    check(plain.finish_reason != "tool_calls" and plain.message.tool_calls is None,
          "tools: tool_choice none answers with text")


def test_reasoning_effort(client, model):
    """`reasoning_effort` goes to the chat template (gpt-oss's harmony system message); SmolLM2's template does
    not read it, so a greedy answer with it is the answer without it."""
    msgs = [{"role": "user", "content": "Say hello."}]
    plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    for effort in ("low", "medium", "high"):
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0,
                                           reasoning_effort=effort)
        check(r.choices[0].message.content == plain.choices[0].message.content,
              f"reasoning_effort {effort}: the same greedy answer")
    # chat_template_kwargs (vLLM's and llama-server's extension) are the template's variables: Qwen3's
    # enable_thinking; SmolLM2's template reads none of them, so the greedy answer is the same.
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    check(r.choices[0].message.content == plain.choices[0].message.content,
          "chat_template_kwargs: the same greedy answer")


def test_responses(client, model):
    """`/v1/responses`, stateless: whole and streamed (the client's own event handling), instructions, status."""
    ask = dict(model=model, instructions="Answer in one sentence.", input="What is a GPU used for?",
               max_output_tokens=16, temperature=0)
    whole = client.responses.create(**ask)
    check(whole.object == "response" and whole.status in ("completed", "incomplete"),
          f"responses: a response, {whole.status}")
    check(bool(whole.output_text) and whole.output[0].role == "assistant", f"responses: text {whole.output_text!r}")
    u = whole.usage
    check(u.input_tokens > 0 and 0 < u.output_tokens <= 16 and u.total_tokens == u.input_tokens + u.output_tokens,
          f"responses: usage {u.input_tokens}+{u.output_tokens}")
    deltas, final = [], None
    for event in client.responses.create(stream=True, **ask):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    check("".join(deltas) == whole.output_text == final.output_text,
          "responses: the stream's deltas and final response give the whole answer's text")
    check(final.usage.output_tokens == u.output_tokens and final.status == whole.status,
          "responses: the stream's usage and status agree")
    short = client.responses.create(model=model, input="Hi", max_output_tokens=2, temperature=0)
    check(short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens",
          "responses: max_output_tokens leaves it incomplete")
    e = expect(openai.BadRequestError, lambda: client.responses.create(model=model, input="hi", store=True),
               "responses: store")
    check(e.param == "store", "responses: store names its param")
    e = expect(openai.BadRequestError, lambda: client.responses.create(
        model=model, input="hi", tools=[{"type": "web_search"}]), "responses: a web_search tool")
    check(e.param == "tools[0].type", f"responses: the tool's type names its param ({e.param})")


RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


def function_calls(response):
    return [o for o in response.output if o.type == "function_call"]


def test_responses_tools(client, model):
    """Function tools on `/v1/responses`: a forced call at temperature 1 over several seeds (arguments validated
    against the tool's schema), whole, as raw events and through the client's stream helper; then the round
    trip: the reply's output items back in the input, the function_call_output after them."""
    ask = "What is the weather in Paris, in celsius?"
    for seed in (1, 2, 3):
        kw = dict(model=model, input=ask, tools=RESPONSES_TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                  parallel_tool_calls=False, max_output_tokens=128, temperature=1.0, extra_body={"seed": seed})
        whole = client.responses.create(**kw)
        calls = function_calls(whole)
        check(whole.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather",
              f"responses tools seed {seed}: {whole.status}, {len(calls)} function_call")
        c = calls[0]
        check(c.call_id.startswith("call_") and c.id.startswith("fc_"), f"responses tools seed {seed}: ids {c.id}")
        jsonschema.validate(json.loads(c.arguments), WEATHER)
        check(True, f"responses tools seed {seed}: arguments {c.arguments} validate against the schema")
        deltas, final = "", None
        for event in client.responses.create(stream=True, **kw):
            if event.type == "response.function_call_arguments.delta":
                deltas += event.delta
            if event.type == "response.completed":
                final = event.response
        check(deltas == c.arguments and function_calls(final)[0].arguments == c.arguments,
              f"responses tools seed {seed}: the stream's argument deltas and final response are the whole answer's")
        with client.responses.stream(**kw) as stream:
            helped = stream.get_final_response()
        check([(f.name, f.arguments) for f in function_calls(helped)] == [(c.name, c.arguments)],
              f"responses tools seed {seed}: the client's stream helper agrees")
    first = client.responses.create(model=model, input=ask, tools=RESPONSES_TOOLS, tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=64, temperature=0)
    call = function_calls(first)[0]
    history = [{"role": "user", "content": ask}] + first.output + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}]
    kw = dict(model=model, input=history, tools=RESPONSES_TOOLS, max_output_tokens=48, temperature=0)
    after = client.responses.create(**kw)
    check(after.status in ("completed", "incomplete"),
          f"responses tools: the round trip is answered ({after.status}: {after.output_text!r})")
    text, last = "", None
    for event in client.responses.create(stream=True, **kw):
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            last = event.response
    check(text == after.output_text == last.output_text and last.status == after.status,
          "responses tools: the streamed round trip gives the same greedy text and status")


def test_queue_full(base, model):
    """Queue depth 1: one running, one waiting, the third refused with 503."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    long = dict(model=model, prompt="Once upon a time", max_tokens=2048, temperature=1.0, stream=True)
    running = client.completions.create(**long)
    next(iter(running))
    waiting = client.completions.create(**long)
    e = expect(openai.APIStatusError, lambda: client.completions.create(model=model, prompt="x", max_tokens=1),
               "queue: a third job")
    check(e.status_code == 503 and e.response.headers.get("retry-after") == "1",
          "queue: 503 with Retry-After: 1")
    check(e.code == "queue_full", "queue: code queue_full")
    running.close()
    waiting.close()
    # The waiting job leaves the queue when its turn comes; the client's own
    # retries (honouring Retry-After) cover that moment.
    t = time.monotonic()
    ok = client.with_options(max_retries=5).completions.create(model=model, prompt="x", max_tokens=1)
    check(ok.choices[0].finish_reason in ("stop", "length") and time.monotonic() - t < 10,
          f"queue: closing the streams cancels their jobs; the next is answered in {time.monotonic() - t:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", default="target/debug/worker-orcd")
    ap.add_argument("--model", default=".models/smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--backend", default="cpu", help="cpu, or cuda on a GPU machine")
    args = ap.parse_args()
    print(f"openai {openai.__version__}")
    with worker(args.worker, args.model, "--queue-depth", "1", backend=args.backend) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
        models = client.models.list().data
        check(len(models) == 1 and models[0].owned_by == "worker-orcd", f"models: {models[0].id}")
        model = models[0].id
        test_chat(client, model)
        test_completions(client, model)
        test_ignore_eos(client, model)
        test_reasoning_effort(client, model)
        test_errors(client, model)
        test_choices(client, model)
        test_bias(client, model)
        test_tools(client, model)
        test_responses(client, model)
        test_responses_tools(client, model)
        test_queue_full(base, model)
    print("all checks passed")


if __name__ == "__main__":
    main()
