#!/usr/bin/env python3
"""Write a GLM-5.3-Flash-shaped checkpoint with random weights, for `kestrel bench` (issue 6's real-dimension
benchmark; the release checkpoint cannot be downloaded here).

Usage:  python3 tools/make_synthetic_glm5.py --out DIR [--layers 4] [--dims real|tiny] [--seed 1]

--dims real: the release's text dimensions (hidden 4096, 288 routed experts top 8 of width 2048, KDA 64 x 128, MLA
64 heads with q_lora 1536 / kv_lora 512 / 256 + 256, indexer 32 x 128 with k-pool 4 and top-k 2048, vocab 154,880,
mHC 4 streams), the first `--layers` layers of its pattern (KDA where i % 4 != 3, dense FFN for i < 3), no MTP
layer and no vision tower. Routed experts are EXL3 4 bpw MCG (random trellis words, which decode to codebook values;
random sign flips; output scales of 1/64; the random bytes repeat every 32 MiB); everything else is BF16 (the release keeps some projections in block
FP8), norms at 1, gates' parameters at 0. --dims tiny: the same layout at toy sizes, for tests.

Standard library only; one safetensors shard per layer and model.safetensors.index.json, as the hub lays them out.
The values are random, so the model's output means nothing: only its speed and memory do.
"""
import argparse
import json
import os
import random
import struct

REAL = dict(hidden=4096, vocab=154880, intermediate=12288, moe_intermediate=2048, experts=288, top_k=8,
            kda_heads=64, kda_dim=128, heads=64, q_lora=1536, kv_lora=512, qk=256, v=256,
            index_heads=32, index_dim=128, index_topk=2048, kpool=4, context=1048576)
TINY = dict(hidden=128, vocab=512, intermediate=256, moe_intermediate=128, experts=8, top_k=2,
            kda_heads=2, kda_dim=32, heads=2, q_lora=64, kv_lora=64, qk=32, v=32,
            index_heads=2, index_dim=32, index_topk=16, kpool=4, context=4096)
HC = 4
MCG_MULTIPLIER = 0xCBAC1FED


def config(d, layers):
    layer_types = ["deepseek_sparse_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    text = {
        "model_type": "glm5_next_text", "dtype": "bfloat16", "vocab_size": d["vocab"], "hidden_size": d["hidden"],
        "num_hidden_layers": layers, "num_nextn_predict_layers": 0, "intermediate_size": d["intermediate"],
        "max_position_embeddings": d["context"], "rms_norm_eps": 1e-5, "hidden_act": "silu", "swiglu_limit": 10.0,
        "attention_bias": False, "eos_token_id": [0], "pad_token_id": 0, "tie_word_embeddings": False,
        "layer_types": layer_types, "mlp_layer_types": ["dense" if i < 3 else "sparse" for i in range(layers)],
        "indexer_types": ["full"] * layers,
        "linear_attn_config": {"num_heads": d["kda_heads"], "head_dim": d["kda_dim"], "short_conv_kernel_size": 4,
                               "gate_lower_bound": -5.0},
        "num_attention_heads": d["heads"], "num_key_value_heads": d["heads"], "q_lora_rank": d["q_lora"],
        "kv_lora_rank": d["kv_lora"], "qk_nope_head_dim": d["qk"], "qk_rope_head_dim": 0, "v_head_dim": d["v"],
        "qk_head_dim": d["qk"], "head_dim": 0, "index_n_heads": d["index_heads"], "index_head_dim": d["index_dim"],
        "index_topk": d["index_topk"], "index_kpool": d["kpool"], "index_kpool_always_select_tail": True,
        "n_routed_experts": d["experts"], "num_experts_per_tok": d["top_k"], "n_shared_experts": 1,
        "moe_intermediate_size": d["moe_intermediate"], "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
        "hc_mult": HC, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20,
    }
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
            "tie_word_embeddings": False, "text_config": text,
            "quantization_config": {"quant_method": "exl3", "version": "kestrel", "bits": 4.0, "head_bits": 16,
                                    "out_scales": "always", "codebook": "mcg"}}


CHUNK = 1 << 24  # 16-bit values per piece written (randbytes takes fewer than 2^31 bits at once)


class Random:
    """Random tensor bytes in pieces of CHUNK values. Each kind of value is drawn once (random.randbytes, then
    bytes.translate fixes the high byte of each 16-bit value: sign random, exponent fixed, so magnitudes stay small
    without per-element Python) and repeats every CHUNK values: gigabytes are written at disk speed, and a speed
    benchmark does not care."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.drawn = {}

    def pieces(self, kind, count, draw):
        block = self.drawn.get(kind)
        if block is None:
            block = self.drawn[kind] = draw(CHUNK)
        for start in range(0, count, CHUNK):
            yield block[:2 * min(CHUNK, count - start)]

    def raw(self, n):  # n bytes, n even
        return self.pieces("raw", n // 2, lambda c: self.rng.randbytes(2 * c))

    def halves(self, count, high):
        """count 16-bit values: low byte random, high byte = high | random sign."""
        def draw(c):
            table = bytes((b & 0x80) | high for b in range(256))
            data = bytearray(self.rng.randbytes(2 * c))
            data[1::2] = bytes(data[1::2]).translate(table)
            return bytes(data)
        return self.pieces(("halves", high), count, draw)

    def signs(self, count, high):
        """fp16 +-value with mantissa 0: high byte = high | random sign."""
        def draw(c):
            table = bytes((b & 0x80) | high for b in range(256))
            data = bytearray(2 * c)
            data[1::2] = self.rng.randbytes(c).translate(table)
            return bytes(data)
        return self.pieces(("signs", high), count, draw)


def bf16_small(r, count):  # |x| in [2^-7, 2^-6): exponent 120, high byte 0x3C with its low bit 0
    return r.halves(count, 0x3C)


def repeated(value_bytes, count):
    yield value_bytes * count


def tensors_of_layer(d, i, r):
    """-> [(name, dtype, shape, bytes-producing function)] of layer i, names as the binder reads them."""
    D, p = d["hidden"], f"model.language_model.layers.{i}."
    out = []

    def bf16(name, *shape):
        n = 1
        for s in shape:
            n *= s
        out.append((p + name, "BF16", list(shape), lambda n=n: bf16_small(r, n)))

    def f32(name, value, *shape):
        n = 1
        for s in shape:
            n *= s
        out.append((p + name, "F32", list(shape), lambda n=n: repeated(struct.pack("<f", value), n)))

    def exl3(name, rows, cols):
        pad = lambda x: (x + 127) // 128 * 128  # noqa: E731
        k, n = pad(cols), pad(rows)
        out.append((p + name + ".trellis", "I16", [k // 16, n // 16, 64], lambda: r.raw(k * n // 2)))
        out.append((p + name + ".suh", "F16", [k], lambda: r.signs(k, 0x3C)))  # +-1
        out.append((p + name + ".svh", "F16", [n], lambda: r.signs(n, 0x24)))  # +-2^-6
        out.append((p + name + ".mcg", "I32", [], lambda: repeated(struct.pack("<I", MCG_MULTIPLIER), 1)))

    mix = (2 + HC) * HC
    f32("input_layernorm.weight", 1.0, D)
    f32("post_attention_layernorm.weight", 1.0, D)
    for site in ("attn", "ffn"):
        bf16(f"hc_{site}_fn", mix, HC * D)
        f32(f"hc_{site}_base", 0.0, mix)
        f32(f"hc_{site}_scale", 1.0, 3)
    a = "self_attn."
    if i % 4 != 3:
        H, Dh = d["kda_heads"], d["kda_dim"]
        C = H * Dh
        for proj in ("q", "k", "v"):
            bf16(f"{a}{proj}_proj.weight", C, D)
            bf16(f"{a}{proj}_conv1d.weight", C, 1, 4)
        bf16(a + "f_a_proj.weight", Dh, D)
        bf16(a + "f_b_proj.weight", C, Dh)
        f32(a + "A_log", 0.0, H)
        f32(a + "dt_bias", 0.0, C)
        bf16(a + "b_proj.weight", H, D)
        bf16(a + "g_a_proj.weight", Dh, D)
        bf16(a + "g_b_proj.weight", C, Dh)
        f32(a + "o_norm.weight", 1.0, Dh)
        bf16(a + "o_proj.weight", D, C)
    else:
        H = d["heads"]
        bf16(a + "q_a_proj.weight", d["q_lora"], D)
        f32(a + "q_a_layernorm.weight", 1.0, d["q_lora"])
        bf16(a + "q_b_proj.weight", H * d["qk"], d["q_lora"])
        bf16(a + "kv_a_proj_with_mqa.weight", d["kv_lora"], D)
        f32(a + "kv_a_layernorm.weight", 1.0, d["kv_lora"])
        bf16(a + "kv_b_proj.weight", H * (d["qk"] + d["v"]), d["kv_lora"])
        bf16(a + "o_proj.weight", D, H * d["v"])
        x, dim = a + "indexer.", d["index_dim"]
        bf16(x + "wq_b.weight", d["index_heads"] * dim, d["q_lora"])
        bf16(x + "wk.weight", dim, D)
        f32(x + "k_norm.weight", 1.0, dim)
        f32(x + "k_norm.bias", 0.0, dim)
        bf16(x + "weights_proj.weight", d["index_heads"], D)
        f32(x + "index_kpool_compress_ape", 0.0, d["kpool"], dim)
        bf16(x + "index_kpool_compress_gate", dim, D)
    if i < 3:
        bf16("mlp.gate_proj.weight", d["intermediate"], D)
        bf16("mlp.up_proj.weight", d["intermediate"], D)
        bf16("mlp.down_proj.weight", D, d["intermediate"])
    else:
        I = d["moe_intermediate"]
        bf16("mlp.gate.weight", d["experts"], D)
        f32("mlp.gate.e_score_correction_bias", 0.0, d["experts"])
        bf16("mlp.shared_experts.gate_proj.weight", I, D)
        bf16("mlp.shared_experts.up_proj.weight", I, D)
        bf16("mlp.shared_experts.down_proj.weight", D, I)
        for e in range(d["experts"]):
            exl3(f"mlp.experts.{e}.gate_proj", I, D)
            exl3(f"mlp.experts.{e}.up_proj", I, D)
            exl3(f"mlp.experts.{e}.down_proj", D, I)
    return out


def write_shard(path, tensors):
    sizes = {"BF16": 2, "F16": 2, "I16": 2, "F32": 4, "I32": 4}
    header, offset = {}, 0
    for name, dtype, shape, _ in tensors:
        n = sizes[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, _, _, produce in tensors:
            written = sum(f.write(piece) for piece in produce())
            if written != header[name]["data_offsets"][1] - header[name]["data_offsets"][0]:
                raise SystemExit(f"internal error: {name} produced {written} bytes")
    return offset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dims", choices=["real", "tiny"], default="real")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.layers < 1:
        raise SystemExit("--layers must be at least 1")
    d = REAL if args.dims == "real" else TINY
    os.makedirs(args.out, exist_ok=True)
    r = Random(args.seed)
    D, V = d["hidden"], d["vocab"]
    shards = [[("model.language_model.embed_tokens.weight", "BF16", [V, D], lambda: bf16_small(r, V * D)),
               ("model.language_model.norm.weight", "F32", [D], lambda: repeated(struct.pack("<f", 1.0), D)),
               ("lm_head.weight", "BF16", [V, D], lambda: bf16_small(r, V * D))]]
    shards += [tensors_of_layer(d, i, r) for i in range(args.layers)]
    weight_map, total = {}, 0
    for index, tensors in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(args.out, file), tensors)
        weight_map.update({name: file for name, _, _, _ in tensors})
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config(d, args.layers), f, indent=1)
    print(f"wrote {args.out}: {args.layers} layers ({args.dims} dims), {len(weight_map)} tensors, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
