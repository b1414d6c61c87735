#!/usr/bin/env python3
"""How far llama.cpp's own quantized KV caches move the reference model's
log-probabilities from its f16 cache (issue 45's evidence for
worker/tests/golden_cpu.rs `quantized_kv_caches_stay_near_the_f16_cache`).

  python3 testdata/golden/kv_type_llama_cpp.py --llama-server BIN --model GGUF

For each golden case (greedy.json) and each of its first 8 generated
positions, teacher-forced: llama-server (-fa on, -ctk/-ctv TYPE) lists its
top 10 with the f16 cache; with q8_0 and q4_0 the same ids are looked up in
its top 400. Prints mean and max |difference| over those 320 tokens.
Measured with 0c1e57098's CPU build: q8_0 mean 0.1120 max 0.4980; q4_0
mean 0.4770 max 3.0478. Standard library only.
"""
import argparse, json, os, subprocess, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--llama-server", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--port", type=int, default=18801)
args = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
cases = json.load(open(os.path.join(here, "greedy.json")))["cases"]


def run(kv, n_probs):
    p = subprocess.Popen([args.llama_server, "-m", args.model, "--port", str(args.port), "-c", "2048", "-np", "1",
                          "-fa", "on", "-ctk", kv, "-ctv", kv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health")
                break
            except OSError:
                time.sleep(0.3)
        out = []
        for c in cases:
            for i in range(8):
                body = json.dumps({"prompt": c["prompt_token_ids"] + c["generated_token_ids"][:i], "n_predict": 1,
                                   "n_probs": n_probs, "temperature": 0, "cache_prompt": False}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{args.port}/completion", body,
                                             {"Content-Type": "application/json"})
                r = json.load(urllib.request.urlopen(req))
                out.append({d["id"]: d["logprob"] for d in r["completion_probabilities"][0]["top_logprobs"]})
        return out
    finally:
        p.terminate()
        p.wait()


f16 = run("f16", 10)
for kv in ["q8_0", "q4_0"]:
    q = run(kv, 400)
    diffs = [abs(v - b[k]) for a, b in zip(f16, q) for k, v in a.items() if k in b]
    missing = sum(len(a) for a in f16) - len(diffs)
    print(f"{kv}: llama.cpp against its f16 cache over {len(diffs)} tokens ({missing} not in its top 400): "
          f"mean {sum(diffs) / len(diffs):.4f} max {max(diffs):.4f}")
