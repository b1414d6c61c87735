#!/usr/bin/env python3
"""ci/speed.py WORKER MODEL...: first figures of speed through the HTTP API.

For each model file: start WORKER on it (--backend cuda unless $BACKEND says
otherwise), wait for /health, then run greedy jobs and read the worker's own
`end` event: time to first token (`first_token_ms`, from acceptance) for a
short chat prompt and for a ~512-token prompt, and decode tokens/s
((tokens_out - 1) / decode_time) over 128-token jobs. One warm-up job first;
medians of 5. Prints one JSON line per model. Standard library only, since the
GPU machine has no internet to install anything.
"""
import json, os, socket, statistics, subprocess, sys, time, urllib.request

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def post_job(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/execute", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    event, end = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event in ("end", "error"):
                end = (event, json.loads(line[6:]))
    if end is None or end[0] != "end":
        raise RuntimeError(f"job {body['job_id']} ended with {end}")
    return end[1]

def count_tokens(port, text):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize",
                                 data=json.dumps({"content": text, "add_special": False}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return len(json.load(r)["tokens"])

def measure(worker, model, backend):
    port = free_port()
    log = open(f"/tmp/speed-{os.path.basename(model)}.log", "w")
    p = subprocess.Popen([worker, "--worker-id", "6f1d7a2e-0000-4000-8000-00000000beef", "--model", model,
                          "--gpu-device", "0", "--port", str(port), "--backend", backend],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.time()
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = json.load(r)
                    if health.get("status") == "healthy":
                        break
            except OSError:
                pass
            if p.poll() is not None or time.time() - t0 > 300:
                raise RuntimeError(f"worker did not become healthy on {model}")
            time.sleep(0.2)
        load_s = time.time() - t0
        chat = {"messages": [{"role": "user", "content": "Write a haiku about GPU computing"}], "temperature": 0}
        long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 50)  # ~500 tokens
        post_job(port, dict(chat, job_id="warm", max_tokens=8))
        ttft = [post_job(port, dict(chat, job_id=f"t{i}", max_tokens=1))["first_token_ms"] for i in range(5)]
        ttft_long = [post_job(port, {"job_id": f"l{i}", "prompt": long_prompt, "max_tokens": 1, "temperature": 0})
                     for i in range(5)]
        decode = []
        for i in range(5):
            # A counting prompt keeps a greedy reply going for all 128 tokens.
            e = post_job(port, {"job_id": f"d{i}", "prompt": "Count upward: 1, 2, 3, 4, 5,",
                                "max_tokens": 128, "temperature": 0})
            if e["tokens_out"] > 1 and e["decode_time_ms"] > 0:
                decode.append((e["tokens_out"] - 1) * 1000.0 / e["decode_time_ms"])
        return {
            "model": os.path.basename(model), "backend": backend, "load_s": round(load_s, 2),
            "quant_kind": health.get("quant_kind"), "vram_bytes_used": health.get("vram_bytes_used"),
            "ttft_chat_ms_median": statistics.median(ttft),
            "prompt_tokens_long": count_tokens(port, long_prompt),
            "ttft_long_ms_median": statistics.median(e["first_token_ms"] for e in ttft_long),
            "decode_tok_s_median": round(statistics.median(decode), 1) if decode else None,
            "decode_jobs": len(decode),
        }
    finally:
        p.terminate()
        p.wait(timeout=30)

if __name__ == "__main__":
    worker, models = sys.argv[1], sys.argv[2:]
    for m in models:
        print(json.dumps(measure(worker, os.path.abspath(m), os.environ.get("BACKEND", "cuda"))), flush=True)
