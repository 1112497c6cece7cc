#!/usr/bin/env python3
"""Build tests/data/serve_model: the tiny random glm5_next checkpoint the server tests serve.

    config.json, generation_config.json, model.safetensors   random BF16 weights (F32 where the release keeps F32)
    tokenizer.json, tokenizer_config.json                     byte-level BPE of 384 ids with GLM's added tokens
    chat_template.jinja                                       the GLM-5.3 chat template (shared/data)

The weights are junk: the server tests check the API, not the text. The tensor layout is the one transformers 5.17
writes for Glm5NextForConditionalGeneration, taken from the golden fixture tests/data/golden/bf16_hc4_kp4 (built by
tools/make_golden.py) with the vocabulary resized; values are drawn with make_golden.py's rules so activations stay
O(1). Needs numpy and tokenizers only.

Usage:  python3 tools/make_serve_fixture.py [--out tests/data/serve_model]
"""

import argparse
import json
import math
import os
import shutil
import struct

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden", "bf16_hc4_kp4")
TEMPLATE = os.path.join(ROOT, "..", "shared", "data", "glm53_chat_template.jinja")
VOCAB = 384
SEED = 1234

# GLM-5.3's added tokens in its order. Turn and media markers are special (skip_special_tokens drops them); the
# tags the reasoning and tool parsers read are not, so they survive detokenization as in the real tokenizer.
SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
           "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
           "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|image|>", "<|video|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
        "</arg_key>", "<arg_value>", "</arg_value>"]

CORPUS = """The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
You may call one or more functions to assist with the user query. Reasoning Effort: Max Low High
# Tools You are provided with function signatures within XML tags. For each function call, output the function
name and arguments within the following XML format. What is the weather in Paris and Beijing? It is sunny, 23
degrees. The answer is 42. Let me think about this step by step. First, second, third; finally done.
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters":
{"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}, "required":
["location"]}}} Once upon a time there was a small model that produced random words, numbers 0123456789 and
symbols like ()[]{}<>=+-*/%&|^~!?@#$ and quotes ' " ` in many sentences. Grüße, café, naïve, 你好, 世界, 🙂.
"""


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    n_added = len(SPECIAL) + len(TAGS)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - n_added, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def golden_layout():
    with open(os.path.join(GOLDEN, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: (v["dtype"], list(v["shape"])) for k, v in sorted(header.items())}


def randomise(name, shape, rng, hidden, bounded=True):
    """make_golden.py's randomise_ rules, in numpy."""
    def rn(std):
        return rng.standard_normal(shape) * std

    def ru(a, b):
        return rng.random(shape) * (b - a) + a

    if name.endswith("embed_tokens.weight"):
        return rn(1.0)
    if name.endswith("lm_head.weight"):
        return rn(2.5 / math.sqrt(hidden))
    if name.endswith(("hc_attn_fn", "hc_ffn_fn")):
        return rn(1.0 / math.sqrt(shape[1]))
    if name.endswith(("hc_attn_base", "hc_ffn_base")):
        return rn(0.5)
    if name.endswith(("hc_attn_scale", "hc_ffn_scale")):
        return ru(0.5, 1.5)
    if name.endswith("A_log"):
        return ru(-0.7, 0.7) if bounded else ru(-1.5, 0.0)
    if name.endswith("dt_bias"):
        return ru(-4.5, 0.5)
    if "conv1d" in name:
        return rn(0.5)
    if name.endswith("e_score_correction_bias"):
        return rn(0.5)
    if name.endswith("index_kpool_compress_ape"):
        return rn(0.7)
    if name.endswith("indexer.weights_proj.weight"):
        return rn(3.0 / math.sqrt(shape[1]))
    if name.endswith("index_kpool_compress_gate"):
        return rn(1.0 / math.sqrt(shape[1]))
    if name.endswith(".bias"):
        return rn(0.1)
    if len(shape) == 1:
        return ru(0.7, 1.3)
    return rn(1.0 / math.sqrt(int(np.prod(shape[1:]))))


def to_bf16_bytes(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype(np.uint16).tobytes()


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in sorted(tensors.items()):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_text_files(out, tok, config, template):
    """tokenizer.json, chat_template.jinja, tokenizer_config.json and generation_config.json, and config.json with
    GLM's special-token ids (EOS, pad, image/video markers) taken from `tok`."""
    tok.save(os.path.join(out, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL + TAGS}
    eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]
    text = config["text_config"]
    text["eos_token_id"] = eos
    text["pad_token_id"] = ids["<|endoftext|>"]
    for key, token in (("image_start_token_id", "<|begin_of_image|>"), ("image_end_token_id", "<|end_of_image|>"),
                       ("video_start_token_id", "<|begin_of_video|>"), ("video_end_token_id", "<|end_of_video|>"),
                       ("image_token_id", "<|image|>"), ("video_token_id", "<|video|>")):
        config[key] = ids[token]
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2, sort_keys=True)
    json.dump({"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"], "do_sample": True,
               "temperature": 1.0, "top_p": 0.95},
              open(os.path.join(out, "generation_config.json"), "w"), indent=2)
    json.dump({"tokenizer_class": "TokenizersBackend", "model_max_length": 4096, "padding_side": "left",
               "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
               "do_lower_case": False, "remove_space": False},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    shutil.copyfile(template, os.path.join(out, "chat_template.jinja"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "serve_model"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    tok = train_tokenizer()
    config = json.load(open(os.path.join(GOLDEN, "config.json")))
    config["text_config"]["vocab_size"] = VOCAB
    write_text_files(args.out, tok, config, TEMPLATE)
    text = config["text_config"]

    rng = np.random.default_rng(SEED)
    hidden = text["hidden_size"]
    tensors = {}
    for name, (dtype, shape) in golden_layout().items():
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            shape = [VOCAB, shape[1]]
        values = randomise(name, shape, rng, hidden)
        data = to_bf16_bytes(values) if dtype == "BF16" else values.astype("<f4").tobytes()
        tensors[name] = (dtype, shape, data)
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors)
    print(f"wrote {args.out}: vocab {VOCAB}, eos {text['eos_token_id']}, {len(tensors)} tensors")


if __name__ == "__main__":
    main()
