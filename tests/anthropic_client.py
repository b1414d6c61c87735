#!/usr/bin/env python3
"""The official `anthropic` package, unmodified, against a spawned CPU worker (issue 43).

`/v1/messages` whole and streamed (the client's own event accumulation), system prompts,
stop sequences, `max_tokens`, usage, the `x-api-key` header the client sends, and
refusals surfacing as the client's typed exceptions (BadRequestError for tools and images,
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openai_client import check, expect, worker  # noqa: E402

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


def test_errors(client, model):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    e = expect(anthropic.BadRequestError,
               lambda: client.messages.create(model=model, max_tokens=8, messages=ASK, tools=tools), "errors: tools")
    check(e.body["error"]["type"] == "invalid_request_error" and e.body["error"]["message"].startswith("tools: "),
          f"errors: tools named ({e.body['error']['message']})")
    image = [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]
    expect(anthropic.BadRequestError, lambda: client.messages.create(model=model, max_tokens=8, messages=image),
           "errors: an image block")
    expect(anthropic.NotFoundError,
           lambda: client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK), "errors: another model")
    e = expect(anthropic.BadRequestError,
               lambda: client.messages.create(model=model, max_tokens=4096, messages=ASK), "errors: max_tokens")
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
        test_errors(client, model)
        wrong = anthropic.Anthropic(base_url=base, api_key="not-the-key", max_retries=0)
        expect(anthropic.AuthenticationError,
               lambda: wrong.messages.create(model=model, max_tokens=8, messages=ASK), "auth: a wrong x-api-key")
    print("all checks passed")


if __name__ == "__main__":
    main()
