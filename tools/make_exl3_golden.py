#!/usr/bin/env python3
"""Make a golden fixture whose routed experts are EXL3, quantized by Kestrel itself. Two stages, so that the
C++ steps run where Kestrel is built and the transformers reference where torch is:

    # 1. where build/kestrel is (needs numpy, safetensors, tokenizers; no torch)
    python3 tools/make_exl3_golden.py prepare --kestrel build/kestrel \
        --source tests/data/golden/f32_hc4_kp4_shared_vision --out tests/data/golden/exl3_mcg4_hc4_kp4 --work WORK
    # 2. where torch + transformers 5.17 are (the GPU machine; runs on its CPU)
    python3 tools/make_exl3_golden.py reference --source tests/data/golden/f32_hc4_kp4_shared_vision \
        --out tests/data/golden/exl3_mcg4_hc4_kp4 --work WORK

prepare: `kestrel quantize` converts the source fixture's routed experts to EXL3, calibrated on a short multilingual
text (kept as calibration.txt) run through Kestrel's forward with a byte-level tokenizer added to the source (the
fixtures have 256-entry vocabularies and no tokenizer of their own); then `kestrel exl3 dequant` decodes every EXL3
module (the decoder tests/formats/exl3_oracle_test.cpp holds bit-exact against exllamav3's reconstruct) to float32,
and WORK/dequantized is the checkpoint with each expert replaced by that weight.
reference: transformers runs WORK/dequantized in float32 on the CPU over the source fixture's tokens and writes
ref_full.npy, ref_incremental.npy and meta.json. The golden tests then require Kestrel's forward over the EXL3
checkpoint to match within 1e-3.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file


CALIBRATION_TEXT = """The kestrel hovers above the field, wings beating fast, then drops on its prey.
Counting: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20.
def add(a, b):\n    return a + b  # small code, punctuation {}[]();:
Le faucon crecerelle chasse au-dessus des champs. Der Turmfalke rüttelt über dem Feld.
""" * 4


def byte_level_tokenizer(vocab):
    """A byte-level BPE tokenizer without merges: one token per byte, ids 0..255 (the fixtures' vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    assert vocab >= 256, vocab
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = {b: c for b, c in zip(range(256), sorted(alphabet, key=lambda c: _byte_of(c)))}
    tokenizer = Tokenizer(models.BPE(vocab={byte_to_char[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _byte_of(char):
    """GPT-2's bytes_to_unicode inverse: printable bytes map to themselves, the rest to U+0100 onwards in order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    code = ord(char)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def read_tensors(ckpt):
    """-> ({name: numpy array}, {name: file}) of a single-file or sharded checkpoint."""
    index = os.path.join(ckpt, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    tensors, where = {}, {}
    for name in files:
        for key, value in load_file(os.path.join(ckpt, name)).items():
            tensors[key], where[key] = value, name
    return tensors, where


def dequantized_checkpoint(kestrel, ckpt, dst, tmp):
    """Writes ckpt to dst as float32 with every EXL3 module replaced by `<module>.weight` (HF orientation)."""
    tensors, where = read_tensors(ckpt)
    modules = {k[: -len(".trellis")] for k in tensors if k.endswith(".trellis")}
    exl3_suffixes = (".trellis", ".suh", ".svh", ".mcg", ".mul1")
    out = {k: v.astype(np.float32) for k, v in tensors.items()
           if not (k.endswith(exl3_suffixes) and k.rsplit(".", 1)[0] in modules)}
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    text = cfg["text_config"]
    for prefix in sorted(modules):
        npy = os.path.join(tmp, prefix + ".npy")
        subprocess.run([kestrel, "exl3", "dequant", "--file", os.path.join(ckpt, where[prefix + ".trellis"]),
                        "--prefix", prefix, "--out", npy], check=True, stderr=subprocess.DEVNULL)
        w = np.load(npy).T  # (out_padded, in_padded)
        rows, cols = ((text["hidden_size"], text["moe_intermediate_size"]) if prefix.endswith("down_proj")
                      else (text["moe_intermediate_size"], text["hidden_size"]))
        # Past (rows, cols) the padded weight is not zero (the rotations spread quantization error there), but an
        # EXL3 linear zero-extends its input and drops its padded outputs, so only this block acts.
        out[prefix + ".weight"] = np.ascontiguousarray(w[:rows, :cols])
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    plain = copy.deepcopy(cfg)
    plain.pop("quantization_config", None)
    json.dump(plain, open(os.path.join(dst, "config.json"), "w"))
    return len(modules)


def prepare(args):
    source_cfg = json.load(open(os.path.join(args.source, "config.json")))
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    if os.path.exists(args.work):
        shutil.rmtree(args.work)
    os.makedirs(args.work)
    with tempfile.TemporaryDirectory(prefix="exl3_golden_") as tmp:
        source = os.path.join(tmp, "source")
        shutil.copytree(args.source, source)
        for stale in ("ref_full.npy", "ref_incremental.npy", "meta.json"):
            os.remove(os.path.join(source, stale))
        byte_level_tokenizer(source_cfg["text_config"]["vocab_size"]).save(os.path.join(source, "tokenizer.json"))
        calibration = os.path.join(tmp, "calibration.txt")
        with open(calibration, "w") as f:
            f.write(CALIBRATION_TEXT)
        command = [args.kestrel, "quantize", "--model", source, "--out", args.out, "--bits", str(args.bits),
                   "--codebook", args.codebook, "--modules", "experts", "--calibration", calibration, "--seed", "0"]
        subprocess.run(command, check=True)
        shutil.copy(calibration, os.path.join(args.out, "calibration.txt"))
        num_modules = dequantized_checkpoint(args.kestrel, args.out, os.path.join(args.work, "dequantized"), tmp)
    quantize_command = " ".join(["kestrel"] + command[1:3] + ["SOURCE+tokenizer.json"] + command[4:-4] +
                                ["--calibration", "calibration.txt", "--seed", "0"])
    json.dump({"num_modules": num_modules, "bits": args.bits, "codebook": args.codebook,
               "quantize_command": quantize_command}, open(os.path.join(args.work, "prepare.json"), "w"))
    print(f"prepared {num_modules} EXL3 modules in {args.out}; dequantized checkpoint in {args.work}")


def reference(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_golden as golden  # sets the reference-only environment before importing torch
    import torch
    import transformers

    source_meta = json.load(open(os.path.join(args.source, "meta.json")))
    prepared = json.load(open(os.path.join(args.work, "prepare.json")))
    ref_ckpt = os.path.join(args.work, "dequantized")
    cfg_json = json.load(open(os.path.join(ref_ckpt, "config.json")))
    with tempfile.TemporaryDirectory(prefix="exl3_golden_") as tmp:
        model, _ = golden.load_reference_model(ref_ckpt, cfg_json, "cpu", tmp)
        ids = torch.tensor(source_meta["tokens"])[None]
        margins = golden.TopkMargins(args.margin)
        with margins, torch.no_grad():
            full = golden.forward_full(model, ids)
            inc = golden.forward_incremental(model, ids, source_meta["prefill"])
    if margins.violations:
        sys.exit(f"top-k near-tie in the reference run: {margins.violations}; pick another --source or seed")
    d_inc = (inc - full).abs().max().item()
    np.save(os.path.join(args.out, "ref_full.npy"), full.numpy().astype("<f4"))
    np.save(os.path.join(args.out, "ref_incremental.npy"), inc.numpy().astype("<f4"))
    name = os.path.basename(os.path.normpath(args.out))
    codebook, bits, num_modules = prepared["codebook"], prepared["bits"], prepared["num_modules"]
    meta = dict(
        name=name,
        description=f"{source_meta['name']} with its routed experts quantized to EXL3 {codebook.upper()} K={bits} "
                    f"by `kestrel quantize` ({num_modules} modules, calibrated on calibration.txt through a "
                    "byte-level tokenizer). Reference: transformers with the experts replaced by `kestrel exl3 "
                    "dequant` of the stored trellis.",
        source_fixture=source_meta["name"], tokens=source_meta["tokens"], T=source_meta["T"],
        prefill=source_meta["prefill"], dtype="float32+exl3", exl3_bits=bits, exl3_codebook=codebook,
        quantize_command=prepared["quantize_command"],
        transformers_version=transformers.__version__, torch_version=torch.__version__, device="cpu",
        attn_implementation="eager", max_abs_logit=full.abs().max().item(), logit_std=full.std().item(),
        max_abs_full_minus_incremental=d_inc, min_topk_rel_gap=margins.min_rel_gap, topk_margin=args.margin,
        knobs=source_meta["knobs"],
    )
    json.dump(meta, open(os.path.join(args.out, "meta.json"), "w"), indent=1)
    print(f"[{name}] {num_modules} EXL3 modules; std={meta['logit_std']:.3f} max|full-inc|={d_inc:.3g} "
          f"min topk gap={ {k: round(x, 6) for k, x in margins.min_rel_gap.items()} }")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["prepare", "reference"])
    ap.add_argument("--kestrel", help="path to the kestrel binary (prepare)")
    ap.add_argument("--source", required=True, help="a golden fixture with float weights")
    ap.add_argument("--out", required=True, help="the fixture directory to write")
    ap.add_argument("--work", required=True, help="scratch directory shared by the two stages")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--codebook", default="mcg")
    ap.add_argument("--margin", type=float, default=1e-4, help="min relative top-k gap of the reference run")
    args = ap.parse_args()
    if args.stage == "prepare":
        if not args.kestrel:
            ap.error("prepare needs --kestrel")
        prepare(args)
    else:
        reference(args)


if __name__ == "__main__":
    main()
