#!/usr/bin/env python3
"""Writes tokenize.json: llama.cpp's tokenization of Gemma 3 270M (Q4_K_M) for a
set of strings, from a running llama-server (0c1e57098's llama-vocab.cpp) on that
file: `llama-server -m gemma-3-270m-q4_k_m.gguf --port PORT`, then
`python3 make_tokenize.py PORT > tokenize.json`."""
import json, sys, urllib.request

TEXTS = [
    ("plain_english", "Hello world"),
    ("plain_sentence", "Hello, world! How are you doing today?"),
    ("leading_space", " Hello world"),
    ("trailing_space", "Hello world "),
    ("space_runs", "   three leading spaces, and two trailing  "),
    ("mixed_runs", "a  b   c    d\n\n\n e"),
    ("many_spaces", "x" + " " * 40 + "y"),
    ("newlines", "line one\nline two\n\nline four\n"),
    ("newline_only", "\n"),
    ("many_newlines", "\n" * 12 + "end"),
    ("tabs_crlf", "\tTabbed\r\nCRLF line\r\n"),
    ("indented_code", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("c_code", 'int main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}'),
    ("digits", "1234567890"),
    ("long_digits", "12345678901234567890"),
    ("numbers", "3.14159 2025-02-20 1,000,000 0x1F -42"),
    ("punctuation", "Wait... what?! (Yes) [no] {maybe} <tag> @user #hash $5 & 50%"),
    ("contractions", "don't won't I'm you're they'll we've IT'S"),
    ("case", "HELLO hello HeLLo hElLo"),
    ("url", "https://github.com/ggml-org/llama.cpp/blob/master/README.md?plain=1#L42"),
    ("chinese", "你好，世界！今天天气很好。"),
    ("japanese", "こんにちは世界。カタカナとひらがな、漢字です。"),
    ("korean", "안녕하세요, 세계!"),
    ("arabic", "مرحبا بالعالم"),
    ("russian", "Привет, мир!"),
    ("hindi", "नमस्ते दुनिया"),
    ("emoji", "I love 🦙 llamas 🚀🔥👍🏽"),
    ("zwj_family", "👨\u200d👩\u200d👧\u200d👦 family"),
    ("combining", "é vs e\u0301; ño; ǟ; Z͑ͫ̓ͪ̂"),
    ("mixed_scripts", "Hello 世界 مرحبا 🌍 Привет"),
    ("rare_chars", "\u0000\u0001\u007f \U0001d49c \U000e0001 \ufeff"),
    ("gemma_turns", "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"),
    ("special_in_middle", "Text with <end_of_turn> in the middle"),
    ("bos_text", "<bos>"),
    ("eos_then_text", "<eos>after"),
    ("special_lookalike", "<start_of_turn >, <0x41>, <unused0>, [multimodal]"),
    ("empty", ""),
    ("single_space", " "),
    ("long_text", "The quick brown fox jumps over the lazy dog 1234 times; naïve café owners say “¡olé!” " * 12),
]


def tokenize(port, text, add_special, parse_special):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/tokenize",
        data=json.dumps({"content": text, "add_special": add_special, "parse_special": parse_special}).encode(),
        headers={"content-type": "application/json"},
    )
    return json.load(urllib.request.urlopen(req))["tokens"]


def main():
    port = int(sys.argv[1])
    out = []
    for name, text in TEXTS:
        for add_bos, parse_special in ((False, True), (False, False), (True, True)):
            ids = tokenize(port, text, add_bos, parse_special)
            out.append({"name": name, "text": text, "ids": ids, "add_bos": add_bos,
                        "parse_special": parse_special, "n_tokens": len(ids),
                        "utf8_bytes": len(text.encode())})
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


main()
