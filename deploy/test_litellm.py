#!/usr/bin/env python3
"""Two CPU workers behind the LiteLLM proxy (deploy/litellm.yaml), driven by the
official `openai` client (issue 16): 100 chat requests, four at a time; both
workers get work; worker 2 is stopped after 30 answers, and every request is
still answered (the proxy retries on the other worker).

    python deploy/test_litellm.py --worker target/debug/worker-orcd \
        --model .models/smollm2-135m-instruct-q4_1.gguf

Needs `litellm[proxy]` and `openai` in the running Python (see deploy/README.md).
"""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import openai

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from openai_client import free_port, worker  # noqa: E402

REQUESTS = 100
STOP_AFTER = 30


def completed(base: str) -> int:
    """The worker's completed jobs, from its Prometheus counter."""
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    m = re.search(r'^worker_requests_total\{outcome="completed"\} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def start_proxy(config: str, port: int, env: dict):
    log = tempfile.NamedTemporaryFile(prefix="litellm-", suffix=".log", delete=False)
    bin_dir = os.path.dirname(sys.executable)
    proc = subprocess.Popen([os.path.join(bin_dir, "litellm"), "--config", config, "--port", str(port)],
                            stdout=log, stderr=log, env={**os.environ, **env})
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited: {open(log.name).read()[-4000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=1)
            return proc, log.name
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("litellm not ready after 180 s")
            time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", default="target/debug/worker-orcd")
    ap.add_argument("--model", default=".models/smollm2-135m-instruct-q4_1.gguf")
    args = ap.parse_args()
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "litellm.yaml")
    with worker(args.worker, args.model) as w1, worker(args.worker, args.model) as w2:
        port = free_port()
        proxy, proxy_log = start_proxy(config, port, {"WORKER_1": w1 + "/v1", "WORKER_2": w2 + "/v1"})
        try:
            run(port, w1, w2)
        except BaseException:
            print(open(proxy_log).read()[-6000:], file=sys.stderr)
            raise
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)


def run(port: int, w1: str, w2: str):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                           timeout=300)
    answered, errors, lock = [], [], threading.Lock()
    stopped = threading.Event()
    w2_before_stop = []

    def one(i: int):
        try:
            r = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": f"Say a number after {i}."}],
                max_tokens=8, temperature=0.7, seed=i)
            ok = bool(r.choices[0].message.content) and r.usage.completion_tokens > 0
        except Exception as e:  # every failure is reported below
            with lock:
                errors.append((i, repr(e)))
            return
        with lock:
            answered.append(i) if ok else errors.append((i, "empty answer"))
            if len(answered) == STOP_AFTER and not stopped.is_set():
                stopped.set()
                w2_before_stop.append(completed(w2))
                stop_worker(w2)

    t = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(REQUESTS)))
    elapsed = time.monotonic() - t
    w1_done = completed(w1)
    print(f"{len(answered)} of {REQUESTS} answered in {elapsed:.1f} s; errors: {errors}")
    print(f"worker 1 completed {w1_done}; worker 2 completed {w2_before_stop} before it was stopped")
    assert not errors, errors
    assert len(answered) == REQUESTS
    assert w2_before_stop and w2_before_stop[0] > 0 and w1_done > 0, "both workers got work"
    print("all checks passed")


def stop_worker(base: str):
    """Stops a worker the way an operator would: POST /shutdown."""
    req = urllib.request.Request(base + "/shutdown", data=b"{}", method="POST",
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=5)
    print(f"stopped {base}", flush=True)


if __name__ == "__main__":
    main()
