#!/usr/bin/env python3
"""Bounded load on `kestrel serve`: 64 concurrent streaming clients (openai.AsyncOpenAI) send 320 requests, chat and
completions, streaming and not; every request must be answered completely (finish_reason, usage, exact token counts),
the engine must be idle afterwards and the server healthy. Prints the throughput seen."""

import asyncio
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import MODEL_NAME, Server, check_clean_exit  # noqa: E402

try:
    import openai
except ImportError:
    print("the openai package is missing: run scripts/test.sh (it creates .venv-test)", file=sys.stderr)
    sys.exit(1)

CONCURRENCY = 64
REQUESTS = 320
MAX_TOKENS = 8


async def one(client, i):
    """Runs request i; returns the number of completion tokens it reported."""
    kind = i % 4
    extra = {"ignore_eos": True}
    if kind == 0:
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=MAX_TOKENS,
            stream=True, stream_options={"include_usage": True}, extra_body=extra)]
        assert chunks[-2].choices[0].finish_reason == "length", chunks[-2]
        return chunks[-1].usage.completion_tokens
    if kind == 1:
        chunks = [c async for c in await client.completions.create(
            model=MODEL_NAME, prompt=f"request {i}", max_tokens=MAX_TOKENS, stream=True,
            stream_options={"include_usage": True}, extra_body=extra)]
        assert chunks[-2].choices[0].finish_reason == "length", chunks[-2]
        return chunks[-1].usage.completion_tokens
    if kind == 2:
        r = await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": f"r {i}"}],
                                                 max_tokens=MAX_TOKENS, extra_body=extra)
        assert r.choices[0].finish_reason == "length"
        return r.usage.completion_tokens
    r = await client.completions.create(model=MODEL_NAME, prompt=f"r {i}", max_tokens=MAX_TOKENS, n=2,
                                        extra_body=extra)
    assert [c.finish_reason for c in r.choices] == ["length", "length"]
    return r.usage.completion_tokens


async def run_load(base_url):
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=300)
    queue = list(range(REQUESTS))
    results, errors = {}, []

    async def worker():
        while queue:
            i = queue.pop()
            try:
                results[i] = await one(client, i)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                errors.append((i, repr(e)))

    start = time.time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.time() - start
    await client.close()
    return results, errors, elapsed


class Load(unittest.TestCase):
    def test_concurrent_streams(self):
        server = Server("--max-num-seqs", "32")
        try:
            results, errors, elapsed = asyncio.run(run_load(server.base_url))
            self.assertEqual(errors, [])
            self.assertEqual(len(results), REQUESTS)
            for i, tokens in results.items():
                self.assertEqual(tokens, MAX_TOKENS * (2 if i % 4 == 3 else 1), i)
            total = sum(results.values())
            print(f"\n{REQUESTS} requests ({total} tokens) by {CONCURRENCY} clients in {elapsed:.2f} s: "
                  f"{REQUESTS / elapsed:.1f} req/s, {total / elapsed:.1f} tok/s", file=sys.stderr)
            _, _, body = server.request("GET", "/metrics")
            text = body.decode()
            self.assertIn(f'vllm:num_requests_running{{model_name="{MODEL_NAME}"}} 0', text)
            self.assertIn(f'vllm:num_requests_waiting{{model_name="{MODEL_NAME}"}} 0', text)
            self.assertIn(f'vllm:request_success_total{{model_name="{MODEL_NAME}",finished_reason="length"}} {REQUESTS}',
                          text)
            self.assertTrue(server.healthy())
        finally:
            check_clean_exit(self, server)


if __name__ == "__main__":
    unittest.main(verbosity=2)
