#!/usr/bin/env python3
"""Writes greedy.json: llama.cpp's greedy continuations of Gemma 3 270M (Q4_K_M) for five
one-turn chat prompts, with the top-10 log-probabilities of the first 8 generated positions,
from a running llama-server on that file:
`llama-server -m gemma-3-270m-q4_k_m.gguf --host 127.0.0.1 --port PORT -t 2 -c 4096 -np 1`,
then `python3 make_greedy.py PORT > greedy.json`."""
import json, sys, urllib.request

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
LLAMA_CPP_COMMIT = "0c1e57098"
BOS_ID, EOS_ID, END_OF_TURN_ID = 2, 1, 106
N_PREDICT, N_PROBS, N_POSITIONS = 48, 10, 8

MESSAGES = [
    "What is the capital of France?",
    "Write a short poem about the ocean.",
    "Write a Python function that checks whether a number is prime.",
    "Translate to French: The weather is nice today and I would like to go for a walk.",
    "List three benefits of regular exercise and explain each one briefly.",
]


def render(message):
    # Hugging Face's Gemma 3 chat template, one user turn, add_generation_prompt=True.
    return f"<bos><start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n"


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    return json.load(urllib.request.urlopen(req))


def entry(p):
    return {"id": p["id"], "token": p["token"], "logprob": p["logprob"]}


def main():
    port = int(sys.argv[1])
    cases = []
    generation_settings = None
    for message in MESSAGES:
        prompt = render(message)
        assert prompt.startswith("<bos>")
        ids = post(port, "/tokenize", {"content": prompt[len("<bos>"):], "add_special": True,
                                       "parse_special": True})["tokens"]
        assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1, ids
        request = {"prompt": ids, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1, "seed": 0,
                   "cache_prompt": False, "n_probs": N_PROBS, "post_sampling_probs": False,
                   "return_tokens": True}
        r = post(port, "/completion", request)
        generation_settings = r.get("generation_settings")
        probs = r["completion_probabilities"]
        gen_ids = [p["id"] for p in probs]
        # Server's own token list, when it returns one, must agree.
        if r.get("tokens"):
            assert r["tokens"] == gen_ids[:len(r["tokens"])], (r["tokens"], gen_ids)
        if "prompt" in r and isinstance(r["prompt"], str):
            assert r["prompt"] == prompt, (r["prompt"], prompt)
        text = r["content"]
        detok = post(port, "/detokenize", {"tokens": [t for t in gen_ids
                                                      if t not in (EOS_ID, END_OF_TURN_ID)]})["content"]
        top = []
        for p in probs[:N_POSITIONS]:
            assert not p.get("prob"), "expected logprobs (post_sampling_probs false)"
            cands = [entry(c) for c in p["top_logprobs"]]
            assert len(cands) == N_PROBS and cands[0]["id"] == p["id"], p
            top.append({**entry(p), "top_logprobs": cands})
        cases.append({
            "user_message": message,
            "template_rendering": "Hugging Face Gemma 3 chat template, one user turn, add_generation_prompt=True",
            "prompt": prompt,
            "prompt_token_ids": ids,
            "n_prompt_tokens": len(ids),
            "tokens_evaluated": r.get("tokens_evaluated"),
            "generated_token_ids": gen_ids,
            "server_tokens": r.get("tokens"),
            "n_generated": len(gen_ids),
            "generated_text": text,
            "detokenized_generated_ids_matches_text": detok == text,
            "stop_type": r.get("stop_type"),
            "stopping_word": r.get("stopping_word"),
            "truncated": r.get("truncated"),
            "top10_logprobs_first8": top,
            "request": request,
        })
    out = {
        "model_file": MODEL_FILE,
        "notes": (
            "Greedy (temperature 0, top_k 1, seed 0) via llama-server /completion with prompt = the "
            "token ids of the chat-templated prompt, n_predict 48, cache_prompt false, n_probs 10, "
            "post_sampling_probs false. prompt = Hugging Face's Gemma 3 chat template for one user turn "
            "with generation prompt (the GGUF has no chat template); prompt_token_ids = /tokenize of that "
            "text without its leading \"<bos>\", add_special=true (llama.cpp prepends BOS id 2 itself), "
            "parse_special=true. generated_token_ids = the ids of completion_probabilities (every sampled "
            "token, including a final end-of-generation token <end_of_turn> 106 / <eos> 1 when "
            "stop_type is \"eos\"; server_tokens is the server's own `tokens` list); generated_text = "
            "`content` (the EOG token is not in it) and equals /detokenize of generated_token_ids without "
            "the EOG token. top10 logprobs are natural-log, pre-sampling softmax over the full vocab for "
            "the first 8 generated tokens. stop_type \"limit\" = 48 tokens reached."
        ),
        "server_args": ["-m", MODEL_FILE, "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                        "-c", "4096", "-np", "1"],
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "generation_settings": generation_settings,
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


main()
