#!/usr/bin/env python3
"""The official `anthropic` package, unmodified, against a spawned CPU worker (issue 43).

`/v1/messages` whole and streamed (the client's own event accumulation), system prompts,
stop sequences, `max_tokens`, usage, tool use (a tool_use forced by tool_choice, its input
validated against the tool's input_schema with `jsonschema`, then the tool_result sent back
and answered, whole and streamed), the `x-api-key` header the client sends, and refusals
surfacing as the client's typed exceptions (BadRequestError for server tools and images,
NotFoundError for another model, AuthenticationError for a wrong key).

    python tests/anthropic_client.py --worker target/debug/worker-orcd \
        --model .models/smollm2-135m-instruct-q4_1.gguf

Exits non-zero on the first failed check.
"""

import argparse
import json
import os
import sys
import urllib.request

import anthropic
import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openai_client import WEATHER, check, expect, worker  # noqa: E402

KEY = "sk-worker-test-key"
# Anthropic's current API has no sampling fields (the client refuses `temperature`); the
# worker takes them as extensions, sent here through the client's `extra_body`.
GREEDY = {"temperature": 0}
SYSTEM = "You are a helpful assistant. Answer in one sentence."
ASK = [{"role": "user", "content": "What is a GPU used for?"}]


def test_whole_and_stream(client, model):
    whole = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, system=SYSTEM, messages=ASK)
    check(whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_"),
          f"messages: a message {whole.id}")
    check(len(whole.content) == 1 and whole.content[0].type == "text" and whole.content[0].text,
          f"messages: text {whole.content[0].text!r}")
    check(whole.stop_reason in ("end_turn", "max_tokens"), f"messages: stop_reason {whole.stop_reason}")
    u = whole.usage
    check(u.input_tokens > 0 and 0 < u.output_tokens <= 24, f"messages: usage {u.input_tokens} in, {u.output_tokens} out")
    with client.messages.stream(model=model, max_tokens=24, extra_body=GREEDY, system=SYSTEM, messages=ASK) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    check(len(pieces) > 1, f"stream: {len(pieces)} text deltas")
    check("".join(pieces) == whole.content[0].text == final.content[0].text,
          "stream: the same greedy text as the whole answer, also in the client's final message")
    check(final.stop_reason == whole.stop_reason and final.usage.output_tokens == u.output_tokens
          and final.usage.input_tokens == u.input_tokens, "stream: stop_reason and usage agree")
    longer = client.messages.create(model=model, max_tokens=1, system=SYSTEM + " Be polite and precise.",
                                    messages=ASK)
    check(longer.usage.input_tokens > u.input_tokens, "messages: the system prompt is part of the prompt")
    return whole.content[0].text


def test_stops(client, model, text):
    words = text.split()
    check(len(words) >= 3, f"stops: a greedy answer of {len(words)} words to cut")
    stop = " " + words[2]
    cut = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, system=SYSTEM, messages=ASK,
                                 stop_sequences=[stop])
    check(cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop,
          f"stops: stop_reason stop_sequence, stop_sequence {cut.stop_sequence!r}")
    check(cut.content[0].text == text[:text.index(stop)], "stops: the text ends before the stop sequence")
    short = client.messages.create(model=model, max_tokens=2, extra_body=GREEDY, messages=ASK)
    check(short.stop_reason == "max_tokens" and short.usage.output_tokens == 2, "stops: max_tokens ends the answer")


TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def tool_uses(message):
    return [b for b in message.content if b.type == "tool_use"]


def test_tools(client, model):
    """A forced tool_use at temperature 1 over several seeds (the grammar makes every input valid), whole and
    through the client's stream accumulator; then the round trip: the reply's own content back in the history,
    the tool_result after it, answered whole and streamed."""
    forced = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    for seed in (1, 2, 3):
        kw = dict(model=model, max_tokens=128, tools=TOOLS, tool_choice=forced, messages=WEATHER_ASK,
                  extra_body={"temperature": 1, "seed": seed})
        whole = client.messages.create(**kw)
        uses = tool_uses(whole)
        check(whole.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather",
              f"tools seed {seed}: stop_reason {whole.stop_reason}, {len(uses)} tool_use")
        check(uses[0].id.startswith("toolu_"), f"tools seed {seed}: id {uses[0].id}")
        jsonschema.validate(uses[0].input, WEATHER)
        check(True, f"tools seed {seed}: input {uses[0].input} validates against the input_schema")
        with client.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        streamed = tool_uses(final)
        check(final.stop_reason == "tool_use" and [(u.name, u.input) for u in streamed]
              == [(u.name, u.input) for u in uses], f"tools seed {seed}: the stream's tool_use is the whole answer's")
    history = WEATHER_ASK + [
        {"role": "assistant", "content": whole.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "22 C, sunny"}]}]
    kw = dict(model=model, max_tokens=48, tools=TOOLS, messages=history, extra_body=GREEDY)
    after = client.messages.create(**kw)
    check(after.stop_reason in ("end_turn", "max_tokens", "tool_use"),
          f"tools: the round trip is answered ({after.stop_reason}: {after.content})")
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    check(final.model_dump()["content"] == after.model_dump()["content"],
          "tools: the streamed round trip gives the same greedy answer")
    plain = client.messages.create(model=model, max_tokens=16, tools=TOOLS, tool_choice={"type": "none"},
                                   messages=WEATHER_ASK, extra_body=GREEDY)
    check(plain.stop_reason != "tool_use" and not tool_uses(plain), "tools: tool_choice none answers with text")


def test_errors(client, model):
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    e = expect(anthropic.BadRequestError,
               lambda: client.messages.create(model=model, max_tokens=8, messages=ASK, tools=tools),
               "errors: a server tool")
    check(e.body["error"]["type"] == "invalid_request_error"
          and e.body["error"]["message"].startswith("tools[0].type: "),
          f"errors: the server tool named ({e.body['error']['message']})")
    e = expect(anthropic.BadRequestError, lambda: client.messages.create(
        model=model, max_tokens=8, messages=ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "f"}),
        "errors: tool_choice names a tool not in tools")
    check(e.body["error"]["message"].startswith("tool_choice: "), "errors: tool_choice named")
    image = [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]
    expect(anthropic.BadRequestError, lambda: client.messages.create(model=model, max_tokens=8, messages=image),
           "errors: an image block")
    expect(anthropic.NotFoundError,
           lambda: client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK), "errors: another model")
    e = expect(anthropic.BadRequestError,
               lambda: client.messages.create(model=model, max_tokens=9000, messages=ASK),
               "errors: max_tokens beyond the context")
    check("max_tokens" in e.body["error"]["message"], "errors: max_tokens named")


def served_model(base):
    """The served model's id, from the OpenAI-shaped `GET /v1/models` (the key is required there too)."""
    req = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", default="target/debug/worker-orcd")
    ap.add_argument("--model", default=".models/smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--backend", default="cpu", help="cpu, or cuda on a GPU machine")
    args = ap.parse_args()
    print(f"anthropic {anthropic.__version__}")
    with worker(args.worker, args.model, "--api-key", KEY, backend=args.backend) as base:
        client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0)
        model = served_model(base)
        text = test_whole_and_stream(client, model)
        test_stops(client, model, text)
        test_tools(client, model)
        test_errors(client, model)
        wrong = anthropic.Anthropic(base_url=base, api_key="not-the-key", max_retries=0)
        expect(anthropic.AuthenticationError,
               lambda: wrong.messages.create(model=model, max_tokens=8, messages=ASK), "auth: a wrong x-api-key")
    print("all checks passed")


if __name__ == "__main__":
    main()
