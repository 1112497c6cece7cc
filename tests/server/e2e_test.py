#!/usr/bin/env python3
"""End-to-end tests of `kestrel serve` through the official openai client (and raw HTTP where the client hides the
wire): chat and completions, streaming and not, tools, n > 1, logprobs, seeds, stop strings, usage with cached prompt
tokens, the API key, metrics, tokenize/detokenize, and draining on SIGTERM.

The fixture model has random weights, so the text is junk: tests check the API's contracts, and compare outputs of
the same server with itself (streaming vs not, same seed, greedy reruns)."""

import json
import os
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import API_KEY, MODEL_NAME, Server, check_clean_exit  # noqa: E402

try:
    import openai
except ImportError:  # the suite must fail, not skip, without its client
    print("the openai package is missing: run scripts/test.sh (it creates .venv-test)", file=sys.stderr)
    sys.exit(1)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}
HELLO = [{"role": "user", "content": "Hello, how are you today?"}]


def reasoning_of(obj):
    extra = obj.model_extra or {}
    return extra.get("reasoning_content"), extra.get("reasoning")


class E2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(api_key=API_KEY)
        cls.client = openai.OpenAI(base_url=cls.server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        check_clean_exit(checker, cls.server)

    def chat(self, **kw):
        args = dict(model=MODEL_NAME, messages=HELLO, max_tokens=8)
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def complete(self, **kw):
        args = dict(model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8)
        args.update(kw)
        return self.client.completions.create(**args)

    # -- listing and small endpoints ---------------------------------------------------------------------------

    def test_models(self):
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], [MODEL_NAME])
        self.assertEqual(models[0].model_extra["max_model_len"], 512)

    def test_health_version_metrics_need_no_key(self):
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        status, _, body = self.server.request("GET", "/version")
        self.assertEqual(status, 200)
        self.assertIn("version", json.loads(body))
        status, headers, body = self.server.request("GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/plain"))

    def test_tokenize_detokenize_round_trip(self):
        status, _, body = self.server.request("POST", "/tokenize", {"prompt": "hello world"})
        self.assertEqual(status, 200)
        out = json.loads(body)
        self.assertEqual(out["count"], len(out["tokens"]))
        self.assertEqual(out["max_model_len"], 512)
        status, _, body = self.server.request("POST", "/detokenize", {"tokens": out["tokens"]})
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["prompt"], "hello world")
        status, _, body = self.server.request("POST", "/tokenize", {"messages": HELLO})
        self.assertEqual(status, 200)
        chat_count = json.loads(body)["count"]
        self.assertEqual(chat_count, self.chat(max_tokens=1).usage.prompt_tokens)

    # -- chat ----------------------------------------------------------------------------------------------------

    def test_chat_non_streaming(self):
        r = self.chat(temperature=0)
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL_NAME)
        self.assertEqual(len(r.choices), 1)
        choice = r.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertIn(choice.finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 5)
        self.assertTrue(1 <= r.usage.completion_tokens <= 8)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        rc, rr = reasoning_of(choice.message)
        self.assertEqual(rc, rr)  # both names carry the same text

    def test_chat_streaming_matches_non_streaming(self):
        full = self.chat(temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
        chunks = list(self.chat(temperature=0, max_tokens=12, stream=True, stream_options={"include_usage": True},
                                extra_body={"ignore_eos": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        reasoning, content, finish = "", "", None
        for c in chunks[:-1]:
            self.assertEqual(c.object, "chat.completion.chunk")
            self.assertEqual(c.id, chunks[0].id)
            d = c.choices[0].delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            if c.choices[0].finish_reason:
                finish = c.choices[0].finish_reason
        last = chunks[-1]
        self.assertEqual(last.choices, [])
        self.assertEqual(last.usage.completion_tokens, 12)
        self.assertEqual(last.usage.prompt_tokens, full.usage.prompt_tokens)
        self.assertEqual(finish, full.choices[0].finish_reason)
        self.assertEqual(finish, "length")
        self.assertEqual(content, full.choices[0].message.content or "")
        self.assertEqual(reasoning, reasoning_of(full.choices[0].message)[0] or "")

    def test_sse_wire_format(self):
        body = {"model": MODEL_NAME, "messages": HELLO, "max_tokens": 3, "stream": True}
        status, headers, raw = self.server.request("POST", "/v1/chat/completions", body,
                                                   {"Authorization": f"Bearer {API_KEY}"})
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/event-stream"))
        events = raw.decode().split("\n\n")
        self.assertEqual(events[-1], "")
        self.assertEqual(events[-2], "data: [DONE]")
        for e in events[:-2]:
            self.assertTrue(e.startswith("data: "), e)
            json.loads(e[len("data: "):])

    def test_thinking_off_via_chat_template_kwargs(self):
        on = self.chat(temperature=0, max_tokens=6)
        off = self.chat(temperature=0, max_tokens=6, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        # The template drops the reasoning-effort line and closes the think block: a different prompt.
        self.assertNotEqual(on.usage.prompt_tokens, off.usage.prompt_tokens)
        rc, _ = reasoning_of(off.choices[0].message)
        self.assertIsNone(rc)  # the reasoning parser is off with thinking off: everything is content

    # -- tools -----------------------------------------------------------------------------------------------------

    def test_tools_render_and_validate(self):
        plain = self.chat(max_tokens=2)
        with_tools = self.chat(max_tokens=2, tools=[WEATHER_TOOL])
        self.assertGreater(with_tools.usage.prompt_tokens, plain.usage.prompt_tokens + 20)
        self.assertIn(with_tools.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        for choice in ("none", "auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
            r = self.chat(max_tokens=2, tools=[WEATHER_TOOL], tool_choice=choice)
            self.assertEqual(len(r.choices), 1)
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertEqual(e.exception.body["param"], "tool_choice")
        with self.assertRaises(openai.BadRequestError):
            self.chat(tool_choice="required")
        with self.assertRaises(openai.BadRequestError):
            self.chat(tools=[{"type": "function", "function": {"description": "no name"}}])

    def test_tool_history_renders(self):
        messages = HELLO + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        r = self.chat(messages=messages, tools=[WEATHER_TOOL], max_tokens=2)
        self.assertGreater(r.usage.prompt_tokens, 0)

    # -- n, seeds, logprobs --------------------------------------------------------------------------------------

    def test_n_choices_and_usage(self):
        r = self.chat(n=3, temperature=1.0, seed=5, max_tokens=6, logprobs=True)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        self.assertEqual(r.usage.completion_tokens, sum(len(c.logprobs.content) for c in r.choices))
        chunks = list(self.chat(n=2, stream=True, max_tokens=4, seed=3))
        finished = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason}
        self.assertEqual(sorted(finished), [0, 1])

    def test_same_seed_same_output(self):
        a = self.complete(temperature=1.0, seed=1234, max_tokens=16, extra_body={"ignore_eos": True})
        b = self.complete(temperature=1.0, seed=1234, max_tokens=16, extra_body={"ignore_eos": True})
        c = self.complete(temperature=1.0, seed=4321, max_tokens=16, extra_body={"ignore_eos": True})
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertNotEqual(a.choices[0].text, c.choices[0].text)

    def test_chat_logprobs(self):
        r = self.chat(logprobs=True, top_logprobs=3, max_tokens=5, temperature=0)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for entry in content:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(len(entry.top_logprobs), 3)
            tops = [t.logprob for t in entry.top_logprobs]
            self.assertEqual(tops, sorted(tops, reverse=True))
            self.assertGreaterEqual(entry.logprob, tops[0] - 1e-6 if entry.token == entry.top_logprobs[0].token else -1e9)
            self.assertEqual(bytes(entry.bytes).decode("utf-8", "replace"), entry.token)
        # Greedy: the sampled token is the most likely one.
        self.assertAlmostEqual(content[0].logprob, content[0].top_logprobs[0].logprob, places=5)

    def test_completion_logprobs(self):
        r = self.complete(logprobs=2, max_tokens=5, extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 5)
        self.assertEqual(len(lp.token_logprobs), 5)
        self.assertEqual(len(lp.text_offset), 5)
        self.assertTrue(all(1 <= len(t) <= 2 for t in lp.top_logprobs))
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))

    # -- completions -----------------------------------------------------------------------------------------------

    def test_completions_streaming_matches_and_echo(self):
        full = self.complete(temperature=0, max_tokens=10, extra_body={"ignore_eos": True})
        self.assertTrue(full.id.startswith("cmpl-"))
        self.assertEqual(full.choices[0].finish_reason, "length")
        self.assertEqual(full.usage.completion_tokens, 10)
        chunks = list(self.complete(temperature=0, max_tokens=10, stream=True, stream_options={"include_usage": True},
                                    extra_body={"ignore_eos": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, full.choices[0].text)
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        echoed = self.complete(temperature=0, max_tokens=10, echo=True, extra_body={"ignore_eos": True})
        self.assertEqual(echoed.choices[0].text, "The quick brown fox" + full.choices[0].text)
        ids = self.complete(prompt=[1, 2, 3, 4], max_tokens=2)
        self.assertEqual(ids.usage.prompt_tokens, 4)
        batch = self.complete(prompt=["a b c", "d e f"], n=2, max_tokens=2)
        self.assertEqual([c.index for c in batch.choices], [0, 1, 2, 3])

    def test_max_tokens_and_length(self):
        r = self.complete(max_tokens=3, extra_body={"ignore_eos": True, "min_tokens": 3})
        self.assertEqual(r.usage.completion_tokens, 3)
        self.assertEqual(r.choices[0].finish_reason, "length")

    # -- stop strings ----------------------------------------------------------------------------------------------

    def test_stop_strings(self):
        base = self.complete(temperature=0, max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
        # A stop string from the middle of the greedy output, avoiding replacement characters.
        candidates = [base[i:i + 2] for i in range(3, len(base) - 2) if "\ufffd" not in base[i:i + 2]]
        self.assertTrue(candidates, repr(base))
        stop = candidates[len(candidates) // 2]
        cut = base.index(stop)
        r = self.complete(temperature=0, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, base[:cut])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].model_extra["stop_reason"], stop)
        self.assertLess(r.usage.completion_tokens, 24)
        kept = self.complete(temperature=0, max_tokens=24, stop=stop,
                             extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
        self.assertEqual(kept.choices[0].text, base[:cut + len(stop)])
        streamed = list(self.complete(temperature=0, max_tokens=24, stop=[stop], stream=True,
                                      extra_body={"ignore_eos": True}))
        self.assertEqual("".join(c.choices[0].text for c in streamed if c.choices), base[:cut])
        self.assertEqual(streamed[-1].choices[0].finish_reason, "stop")

    # -- usage and the prefix cache --------------------------------------------------------------------------------

    def test_cached_tokens_on_repeated_prompt(self):
        prompt = f"{uuid.uuid4()} " + "The quick brown fox jumps over the lazy dog. " * 6
        first = self.complete(prompt=prompt, max_tokens=2)
        second = self.complete(prompt=prompt, max_tokens=2)
        self.assertEqual(first.usage.prompt_tokens, second.usage.prompt_tokens)
        self.assertGreater(first.usage.prompt_tokens, 48)
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        self.assertGreaterEqual(cached, 32)
        self.assertLess(cached, second.usage.prompt_tokens)
        # The engine publishes its counters when the step that emitted the last token ends, a moment after the
        # response can reach us; wait for it rather than race it.
        deadline = time.monotonic() + 10
        while True:
            status, _, body = self.server.request("GET", "/metrics")
            hits = [line for line in body.decode().splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
            if float(hits[0].split()[-1]) >= cached or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(float(hits[0].split()[-1]), cached)

    # -- errors and auth -------------------------------------------------------------------------------------------

    def test_errors(self):
        with self.assertRaises(openai.NotFoundError) as e:
            self.chat(model="no-such-model")
        self.assertEqual(e.exception.body["param"], "model")
        with self.assertRaises(openai.BadRequestError):
            self.chat(max_tokens=10**9)
        with self.assertRaises(openai.BadRequestError):
            self.complete(prompt="word " * 600)  # > max_model_len 512
        with self.assertRaises(openai.BadRequestError):
            self.chat(temperature=-1)
        with self.assertRaises(openai.BadRequestError):
            self.chat(extra_body={"stop_token_ids": [100000]})
        with self.assertRaises(openai.BadRequestError):
            self.chat(logit_bias={"99999": 5})

    def test_api_key(self):
        for key in ("wrong-key", ""):
            bad = openai.OpenAI(base_url=self.server.base_url + "/v1", api_key=key or "x", max_retries=0)
            with self.assertRaises(openai.AuthenticationError):
                bad.models.list()
            bad.close()
        status, _, body = self.server.request("POST", "/v1/chat/completions", {"messages": HELLO})
        self.assertEqual(status, 401)
        err = json.loads(body)["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"})
        status, _, _ = self.server.request("GET", "/v1/models", headers={"Authorization": "Bearer " + API_KEY + "x"})
        self.assertEqual(status, 401)

    def test_metrics_after_requests(self):
        self.chat(max_tokens=4, extra_body={"ignore_eos": True})
        _, _, body = self.server.request("GET", "/metrics")
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0] + ("{" + name.split("{")[1] if "le=" in name or "finished_reason" in name else "")] = float(value)
        self.assertGreater(values["vllm:prompt_tokens_total"], 0)
        self.assertGreaterEqual(values["vllm:generation_tokens_total"], 4)
        self.assertGreater(values["vllm:time_to_first_token_seconds_count"], 0)
        self.assertGreater(values["vllm:inter_token_latency_seconds_count"], 0)
        self.assertIn("vllm:num_requests_running", values)
        self.assertIn("vllm:num_requests_waiting", values)
        self.assertIn("vllm:kv_cache_usage_perc", values)
        self.assertIn("vllm:prefix_cache_queries_total", values)


class EnvApiKey(unittest.TestCase):
    def test_vllm_api_key_env(self):
        server = Server(env={"VLLM_API_KEY": "env-key"})
        try:
            self.assertEqual(server.request("GET", "/v1/models")[0], 401)
            self.assertEqual(server.request("GET", "/v1/models", headers={"Authorization": "Bearer env-key"})[0], 200)
            self.assertEqual(server.request("GET", "/health")[0], 200)
        finally:
            check_clean_exit(self, server)


class Fp8KvCache(unittest.TestCase):
    """`--kv-cache-dtype fp8` (as the seed deployment runs) with `--dtype bfloat16`: the engine keeps the latents in
    e4m3 rows and rounds the bf16 matrices' inputs, the server answers, and the same prompt again (its prefix now read
    back from the fp8 rows) gives the same greedy text."""

    def test_fp8_latents_serve_and_repeat(self):
        server = Server("--kv-cache-dtype", "fp8", "--dtype", "bfloat16")
        try:
            body = {"model": MODEL_NAME, "prompt": "fp8 cache rows " * 8, "max_tokens": 12, "temperature": 0}
            answers = []
            for _ in range(2):
                status, _, raw = server.request("POST", "/v1/completions", body)
                self.assertEqual(status, 200, raw)
                answers.append(json.loads(raw)["choices"][0]["text"])
            self.assertTrue(answers[0])
            self.assertEqual(answers[0], answers[1])
            self.assertTrue(any("latents in fp8_e4m3" in line for line in server.stderr_lines), server.stderr_lines)
            self.assertTrue(any("take bfloat16 inputs" in line for line in server.stderr_lines), server.stderr_lines)
        finally:
            check_clean_exit(self, server)


class Cli(unittest.TestCase):
    def run_serve(self, *args):
        import subprocess
        from serve_fixture import BINARY, MODEL
        return subprocess.run([BINARY, "serve", *args], capture_output=True, text=True, timeout=60)

    def test_bad_flags_are_errors(self):
        from serve_fixture import MODEL
        for args, needle in [((), "--model"), (("--model", MODEL, "--no-such-flag"), "no-such-flag"),
                             (("--model", MODEL, "--kv-cache-dtype", "fp8_e5m2"), "kv-cache-dtype fp8_e5m2"),
                             (("--model", MODEL, "--dtype", "float16"), "--dtype float16"),
                             (("--model", MODEL, "--tool-call-parser", "hermes"), "tool-call-parser"),
                             (("--model", MODEL, "--port", "70000"), "port"),
                             (("--model", "/nonexistent/model"), "nonexistent")]:
            with self.subTest(args):
                r = self.run_serve(*args)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(needle, r.stderr + r.stdout)


class Drain(unittest.TestCase):
    def test_sigterm_finishes_in_flight_streams(self):
        server = Server()
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        results = {}

        def stream():
            chunks = list(client.completions.create(model=MODEL_NAME, prompt="drain me", max_tokens=48, stream=True,
                                                    extra_body={"ignore_eos": True}))
            results["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
            results["finish"] = chunks[-1].choices[0].finish_reason

        t = threading.Thread(target=stream)
        t.start()
        deadline = time.time() + 30
        while time.time() < deadline:  # wait until the request runs
            _, _, body = server.request("GET", "/metrics")
            if 'vllm:num_requests_running{model_name="tiny-glm"} 1' in body.decode():
                break
            time.sleep(0.005)
        server.proc.send_signal(15)
        t.join(120)
        self.assertEqual(results.get("finish"), "length")  # the stream ran to its end
        self.assertEqual(server.proc.wait(60), 0)
        client.close()
        check_clean_exit(self, server)


checker = unittest.TestCase()

if __name__ == "__main__":
    unittest.main(verbosity=2)
