#!/usr/bin/env python3
"""Serve N requests through a running `kestrel serve` and compare its memory gauges before and after.

Usage:  python3 tools/serve_leak_check.py --url http://127.0.0.1:8899 [--requests 1000] [--concurrency 16]
                                          [--max-tokens 16]

Standard library only (runs on the GPU machine as it is). The same N requests run twice: the first pass is the
warm-up, which takes every buffer to the high-water mark this workload gives it (sequence slots, and the scratch of
each path a pass of its size takes: the CUDA backend's fused MoE serves up to 64 tokens, the grouped one longer
prompt chunks); then the baseline of `kestrel:gpu_allocator_used_bytes` (what Kestrel's allocator holds) and
`kestrel:gpu_memory_used_bytes` (the device); then the second pass, with the same varied prompts (new cache blocks,
prefix hits, evictions), streaming and not; then the gauges again once nothing runs. A leak grows with every pass; a
high-water mark does not. Exit status 1 when a request failed or either gauge grew.
"""
import argparse
import concurrent.futures
import json
import sys
import time
import urllib.request


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, response.read()


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        values = {}
        for line in response.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name.split("{")[0]] = float(value)
        return values


def wait_idle(url):
    deadline = time.time() + 120
    while time.time() < deadline:
        m = metrics(url)
        if m.get("vllm:num_requests_running", 1) == 0 and m.get("vllm:num_requests_waiting", 1) == 0:
            return m
        time.sleep(0.2)
    sys.exit("the server did not go idle within 120 s")


def one_request(url, model, index, max_tokens):
    prompts = [f"count from 1 to {10 + index % 40}", f"what is {index % 97} + {index % 31}?",
               f"reverse the words: red green blue {index}", "hello"]
    body = {"model": model, "messages": [{"role": "user", "content": prompts[index % len(prompts)]}],
            "max_tokens": max_tokens, "temperature": 0.0 if index % 3 else 0.8, "stream": index % 2 == 0}
    # Most tokens are drawn on the GPU; logprobs and penalties send a request's logits to the host sampler instead.
    if index % 5 == 1:
        body.update({"logprobs": True, "top_logprobs": 2})
    elif index % 5 == 3:
        body["frequency_penalty"] = 0.5
    status, _ = post(url + "/v1/chat/completions", body)
    return status


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(args.url + "/health", timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("the server did not come up within 300 s")
            time.sleep(0.5)
    with urllib.request.urlopen(args.url + "/v1/models", timeout=30) as response:
        model = json.loads(response.read())["data"][0]["id"]

    def run(count, offset):
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            return list(pool.map(lambda i: one_request(args.url, model, offset + i, args.max_tokens), range(count)))

    warm = run(args.requests, 0)
    before = wait_idle(args.url)
    start = time.time()
    statuses = run(args.requests, 0)
    seconds = time.time() - start
    after = wait_idle(args.url)

    failed = sum(1 for s in statuses + warm if s != 200)
    print(f"{len(statuses)} requests in {seconds:.1f} s ({len(statuses) / seconds:.1f}/s), {failed} failed")
    grew = False
    for name in ("kestrel:gpu_allocator_used_bytes", "kestrel:gpu_memory_used_bytes"):
        if name not in before:
            sys.exit(f"{name} is not in /metrics: is the server on a GPU (--device cuda)?")
        delta = after[name] - before[name]
        print(f"{name}: before {before[name]:.0f}, after {after[name]:.0f}, change {delta:+.0f}")
        grew = grew or delta > 0
    print("generation tokens:", after.get("vllm:generation_tokens_total", 0) - before.get("vllm:generation_tokens_total", 0))
    sys.exit(1 if failed or grew else 0)


if __name__ == "__main__":
    main()
