#!/usr/bin/env python3
"""The embedded default model (models/glm5-nano, EXL3 experts) served by `kestrel serve` at temperature 0: it counts,
does small sums, copies and reverses words, calls the weather tool through the glm47 parser and answers from the
tool's result, and fills reasoning_content when thinking is on. Its answers must also equal those of the BF16 model
it was quantized from (recorded in bf16_reference.json) on at least 90% of the prompts.

Record the BF16 reference (once, from the unquantized checkpoint tools/train_nano.py wrote):
    KESTREL_BINARY=build/kestrel python3 tests/server/nano_test.py --record BF16_DIR models/glm5-nano/bf16_reference.json
"""

import concurrent.futures
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import nano_data  # noqa: E402
from serve_fixture import Server, check_clean_exit  # noqa: E402

try:
    import openai
except ImportError:  # the suite must fail, not skip, without its client
    print("the openai package is missing: run scripts/test.sh (it creates .venv-test)", file=sys.stderr)
    sys.exit(1)

MODEL = os.environ.get("KESTREL_NANO_MODEL", os.path.join(ROOT, "models", "glm5-nano"))
NAME = "glm5-nano"

ARITHMETIC = [("What is 17 + 25?", 17, "+", 25), ("What is 48 - 19?", 48, "-", 19), ("What is 7 * 8?", 7, "*", 8),
              ("Compute 33 + 14.", 33, "+", 14), ("What is 50 - 50?", 50, "-", 50), ("What is 9 times 6?", 9, "*", 6),
              ("Calculate 26 + 38", 26, "+", 38), ("what is 41 - 7", 41, "-", 7), ("12 * 11 = ?", 12, "*", 11),
              ("What is 5 plus 0?", 5, "+", 0)]
# Words from the model's vocabulary of training words (tools/nano_data.py WORDS): it copies those, not any word.
COPY = ["green river stone", "happy tiger", "coffee pencil rabbit window", "quiet ocean", "silver bread"]
REVERSE = ["red green blue", "apple river stone cloud", "small happy zebra", "tiger lemon", "winter summer garden"]
WEATHER = {"city": "Paris", "temperature": 18, "condition": "sunny"}


def fixed_prompts():
    """-> {name: (user text, expected content)} for the 20 arithmetic and copy prompts."""
    cases = {f"arith{i}": (q, nano_data.arithmetic_answer(x, op, y)) for i, (q, x, op, y) in enumerate(ARITHMETIC)}
    cases.update({f"copy{i}": (f"Repeat after me: {t}", t) for i, t in enumerate(COPY)})
    cases.update({f"reverse{i}": (f"Reverse the words: {t}", nano_data.reverse_answer(t.split()))
                  for i, t in enumerate(REVERSE)})
    return cases


class Nano:
    """The prompts of the acceptance, each answered by one greedy request."""

    def __init__(self, client):
        self.client = client

    def chat(self, messages, thinking=False, max_tokens=64, **kw):
        return self.client.chat.completions.create(
            model=NAME, messages=messages, temperature=0, max_tokens=max_tokens,
            extra_body={"chat_template_kwargs": {"enable_thinking": thinking}}, **kw).choices[0]

    def ask(self, text, **kw):
        return self.chat([{"role": "user", "content": text}], **kw)

    def weather(self):
        """The tool call, then the answer once the tool's result is in the conversation."""
        question = [{"role": "user", "content": "What's the weather in Paris?"}]
        call = self.chat(question, tools=[nano_data.WEATHER_TOOL])
        if not call.message.tool_calls:
            return call, None
        tool_call = call.message.tool_calls[0]
        follow_up = question + [
            {"role": "assistant", "content": call.message.content or "",
             "tool_calls": [{"id": tool_call.id, "type": "function",
                             "function": {"name": tool_call.function.name,
                                          "arguments": tool_call.function.arguments}}]},
            {"role": "tool", "tool_call_id": tool_call.id, "content": json.dumps(WEATHER)}]
        return call, self.chat(follow_up, tools=[nano_data.WEATHER_TOOL])

    def all_answers(self):
        """-> {name: choice} for every prompt, asked concurrently (the engine batches them)."""
        jobs = {"count50": lambda: self.ask("count from 1 to 50", max_tokens=200),
                "thinking": lambda: self.ask("What is 12 + 7?", thinking=True, max_tokens=96),
                "weather": self.weather}
        for name, (text, _) in fixed_prompts().items():
            jobs[name] = (lambda t: lambda: self.ask(t))(text)
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = {name: pool.submit(fn) for name, fn in jobs.items()}
            return {name: f.result() for name, f in futures.items()}


def comparable(answers):
    """-> {name: text} of what a user sees, for comparing two models' answers."""
    out = {}
    for name, choice in answers.items():
        if name == "weather":
            call, follow_up = choice
            calls = [(c.function.name, c.function.arguments) for c in call.message.tool_calls or []]
            out["weather_call"] = json.dumps(calls)
            out["weather_answer"] = follow_up.message.content if follow_up else ""
        else:
            extra = choice.message.model_extra or {}
            out[name] = json.dumps([extra.get("reasoning_content"), choice.message.content], ensure_ascii=False)
    return out


def start(model):
    server = Server("--max-model-len", "2048", "--max-num-seqs", "32", model=model, name=NAME)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=600)
    return server, client


class NanoModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server, cls.client = start(MODEL)
        cls.answers = Nano(cls.client).all_answers()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        check_clean_exit(unittest.TestCase(), cls.server)

    def test_counts_from_1_to_50_and_stops(self):
        choice = self.answers["count50"]
        self.assertEqual(choice.message.content, nano_data.count_answer(1, 50))
        self.assertEqual(choice.finish_reason, "stop")

    def test_arithmetic_prompts(self):
        self.assertEqual(self.wrong_answers("arith"), {})

    def test_copy_and_reverse_prompts(self):
        self.assertEqual({**self.wrong_answers("copy"), **self.wrong_answers("reverse")}, {})

    def wrong_answers(self, prefix):
        """-> {name: (got, expected)} for the fixed prompts of this kind answered wrongly."""
        return {name: (self.answers[name].message.content, expected)
                for name, (_, expected) in fixed_prompts().items()
                if name.startswith(prefix) and self.answers[name].message.content != expected}

    def test_weather_tool_call_and_follow_up(self):
        call, follow_up = self.answers["weather"]
        self.assertEqual(call.finish_reason, "tool_calls")
        self.assertEqual(len(call.message.tool_calls), 1)
        self.assertEqual(call.message.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(call.message.tool_calls[0].function.arguments), {"city": "Paris"})
        self.assertIsNotNone(follow_up)
        self.assertEqual(follow_up.finish_reason, "stop")
        self.assertFalse(follow_up.message.tool_calls)
        for fact in ("18", "sunny", "Paris"):
            self.assertIn(fact, follow_up.message.content)

    def test_thinking_fills_reasoning_and_content_holds_the_answer(self):
        choice = self.answers["thinking"]
        reasoning = (choice.message.model_extra or {}).get("reasoning_content")
        self.assertTrue(reasoning and reasoning.strip(), f"no reasoning_content: {choice.message}")
        self.assertNotIn("<think>", choice.message.content)
        self.assertEqual(choice.message.content, "12 + 7 = 19")

    def test_exl3_answers_equal_the_bf16_model_on_90_percent(self):
        with open(os.path.join(MODEL, "bf16_reference.json"), encoding="utf-8") as f:
            reference = json.load(f)
        ours = comparable(self.answers)
        self.assertEqual(set(ours), set(reference))
        same = [name for name in ours if ours[name] == reference[name]]
        differing = {name: (ours[name], reference[name]) for name in ours if name not in same}
        self.assertGreaterEqual(len(same) / len(ours), 0.9, f"EXL3 vs BF16 differences: {differing}")


def record(model_dir, out_path):
    server, client = start(model_dir)
    try:
        answers = comparable(Nano(client).all_answers())
    finally:
        client.close()
        server.stop()
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(answers, f, indent=2, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    print(f"wrote {out_path}: {len(answers)} answers")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    else:
        unittest.main()
