#!/usr/bin/env python3
"""Calibration text for quantizing the embedded default model: conversations of its training distribution
(tools/nano_data.py, a seed of their own) rendered by `kestrel render` with the model's chat template.

Usage:  python3 tools/make_nano_calibration.py --kestrel build/kestrel --model DIR --out FILE [--count 240]
"""

import argparse
import copy
import json
import subprocess

import nano_data


def openai_request(sample):
    """nano_data keeps tool-call arguments as objects (what the template reads); the API sends JSON strings."""
    messages = copy.deepcopy(sample["messages"])
    for m in messages:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    kwargs = {"enable_thinking": sample["enable_thinking"]}
    if sample["reasoning_effort"]:
        kwargs["reasoning_effort"] = sample["reasoning_effort"]
    request = {"messages": messages, "chat_template_kwargs": kwargs, "add_generation_prompt": False}
    if sample["tools"]:
        request["tools"] = sample["tools"]
    return request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kestrel", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=240)
    args = ap.parse_args()
    texts = []
    for sample in nano_data.make_samples(args.count, seed=777):
        done = subprocess.run([args.kestrel, "render", "--model", args.model], input=json.dumps(openai_request(sample)),
                              capture_output=True, text=True, check=True)
        texts.append(done.stdout + "<|user|>")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("".join(texts))
    print(f"wrote {args.out}: {len(texts)} conversations, {sum(map(len, texts))} characters")


if __name__ == "__main__":
    main()
