#!/usr/bin/env python3
"""ci/speed.py WORKER MODEL...: first figures of speed through the HTTP API.

For each model file: start WORKER on it (--backend cuda unless $BACKEND says
otherwise), wait for /health, then run greedy jobs and read the worker's own
`end` event: time to first token (`first_token_ms`, from acceptance) for a
short chat prompt and for a ~512-token prompt, and decode tokens/s
((tokens_out - 1) / decode_time) over 128-token jobs. One warm-up job first;
medians of 5. Prints one JSON line per model. Standard library only, since the
GPU machine has no internet to install anything.

`measure_http` below is what ci/gpu-bench uses: the same three kinds of job
against either the worker or llama-server, timed by this client in the same
way for both (see its docstring).
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

def fresh_prompt_flags(worker):
    """The worker's flags for measuring fresh prompts: its prefix cache off (a
    build that has one), as llama-server runs here with `cache_prompt` off, so
    that a repeated prompt is prefilled whole every time."""
    try:
        helptext = subprocess.run([worker, "serve", "--help"], capture_output=True, text=True,
                                  timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return ["--prefix-cache", "off"] if "--prefix-cache" in helptext else []

def measure(worker, model, backend):
    port = free_port()
    log = open(f"/tmp/speed-{os.path.basename(model)}.log", "w")
    p = subprocess.Popen([worker, "--worker-id", "6f1d7a2e-0000-4000-8000-00000000beef", "--model", model,
                          "--gpu-device", "0", "--port", str(port), "--backend", backend,
                          *fresh_prompt_flags(worker)],
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

# The prompts of the side-by-side comparison; the long one is ~500 tokens, the
# retrieval-sized one ~3,400 (issue #17's long-context first token).
CHAT = [{"role": "user", "content": "Write a haiku about GPU computing"}]
LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 50)
RAG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 340)
PROMPTS = {"long": LONG_PROMPT, "rag": RAG_PROMPT}
COUNT_PROMPT = "Count upward: 1, 2, 3, 4, 5,"

def stream(port, path, body, timeout=600):
    """POSTs `body` and reads the SSE reply; returns (seconds from sending to the
    end of the stream, [(arrival seconds, event, data)]) for every data line.
    The worker names its events (`event:` lines); llama-server sends only data."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    events, event = [], "message"
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and line[6:].strip() != "[DONE]":
                events.append((time.perf_counter() - t0, event, json.loads(line[6:])))
                event = "message"
    return time.perf_counter() - t0, events

class WorkerApi:
    """The worker's /execute; a token is an `event: token`."""
    name, health_path = "worker-orcd", "/health"

    @staticmethod
    def healthy(body):
        return body.get("status") == "healthy"

    @staticmethod
    def job(port, i, kind, max_tokens):
        body = {"job_id": f"{kind}{i}-{time.time_ns()}", "max_tokens": max_tokens, "temperature": 0}
        if kind == "chat":
            body["messages"] = CHAT
        else:
            body["prompt"] = PROMPTS.get(kind, COUNT_PROMPT)
        total, events = stream(port, "/execute", body)
        ends = [d for _, e, d in events if e in ("end", "error")]
        if not ends or "tokens_out" not in ends[-1]:
            raise RuntimeError(f"worker job {kind}{i} ended with {ends[-1:] or 'nothing'}")
        return total, [t for t, e, _ in events if e == "token"]

class LlamaServerApi:
    """llama-server's /v1/chat/completions and /completion, streamed, with its
    prompt cache off so every job prefills its whole prompt as the worker does."""
    name, health_path = "llama.cpp", "/health"

    @staticmethod
    def healthy(body):
        return body.get("status") == "ok"

    @staticmethod
    def job(port, i, kind, max_tokens):
        common = {"temperature": 0, "stream": True, "cache_prompt": False}
        if kind == "chat":
            body = dict(common, messages=CHAT, max_tokens=max_tokens)
            total, events = stream(port, "/v1/chat/completions", body)
            tokens = [t for t, _, d in events if d.get("choices") and d["choices"][0].get("delta", {}).get("content")]
        else:
            prompt = PROMPTS.get(kind, COUNT_PROMPT)
            body = dict(common, prompt=prompt, n_predict=max_tokens, ignore_eos=kind == "decode")
            total, events = stream(port, "/completion", body)
            tokens = [t for t, _, d in events if not d.get("stop")]
        return total, tokens

def gpu_memory_used_mib():
    """Device memory in use on GPU 0 (MiB), or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.split()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None

def measure_http(api, cmd, port, reps=5, log_path=None, decode_tokens=128):
    """Starts `cmd` (a server listening on `port`), waits until `api.healthy`,
    then: one warm-up job; `reps` chat jobs, `reps` ~500-token-prompt jobs and
    `reps` ~3,400-token-prompt jobs of one token each, whose time from sending
    to the end of the reply is the time to first token (`ttft_chat_ms`,
    `ttft_long_ms`, `ttft_rag_ms`); `reps` jobs of
    `decode_tokens` tokens, whose decode rate is (tokens - 1) / (arrival of the
    last token - arrival of the first) (`decode_tok_s`). Also the load time
    (start to healthy, one sample) and, where nvidia-smi answers, the peak rise
    of GPU memory while the server ran (`vram_mib`, polled every 0.2 s).
    Returns {figure: [samples]}."""
    import threading
    before = gpu_memory_used_mib()
    peak = [before]
    log = open(log_path or os.devnull, "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    done = threading.Event()

    def poll():
        while before is not None and not done.is_set():
            m = gpu_memory_used_mib()
            if m is not None:
                peak[0] = max(peak[0], m)
            done.wait(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        t0 = time.perf_counter()
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{api.health_path}", timeout=2) as r:
                    if api.healthy(json.load(r)):
                        break
            except (OSError, ValueError):
                pass
            if p.poll() is not None or time.perf_counter() - t0 > 600:
                raise RuntimeError(f"{api.name} did not become healthy: {' '.join(cmd)}")
            time.sleep(0.05)
        figures = {"load_s": [time.perf_counter() - t0]}
        api.job(port, 0, "chat", 8)
        figures["ttft_chat_ms"] = [1000 * api.job(port, i, "chat", 1)[0] for i in range(reps)]
        figures["ttft_long_ms"] = [1000 * api.job(port, i, "long", 1)[0] for i in range(reps)]
        figures["ttft_rag_ms"] = [1000 * api.job(port, i, "rag", 1)[0] for i in range(reps)]
        rates = []
        for i in range(reps):
            _, tokens = api.job(port, i, "decode", decode_tokens)
            if len(tokens) > 1 and tokens[-1] > tokens[0]:
                rates.append((len(tokens) - 1) / (tokens[-1] - tokens[0]))
        figures["decode_tok_s"] = rates
        if before is not None:
            figures["vram_mib"] = [peak[0] - before]
        return figures
    finally:
        done.set()
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()

if __name__ == "__main__":
    worker, models = sys.argv[1], sys.argv[2:]
    for m in models:
        print(json.dumps(measure(worker, os.path.abspath(m), os.environ.get("BACKEND", "cuda"))), flush=True)
