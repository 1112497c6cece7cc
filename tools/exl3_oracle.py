#!/usr/bin/env python3
"""exllamav3 as the oracle for Kestrel's EXL3 codec and quantizer.

Runs on a CUDA machine where the `exllamav3` PyPI package is installed (its extension is compiled on first import;
this tool compiles nothing of its own). Two commands:

  vectors --out DIR
      Quantizes random layers with exllamav3 (every codebook, K = 1..8, several shapes, a Hessian from correlated
      activations) and writes what Kestrel's tests compare against:
        codebooks.safetensors  lut.{3inst,mcg,mul1}: the 65,536 codebook values (ext.decode), F16
        packing.safetensors    pack.k{K}.{states,packed,unpacked}: ext.pack_trellis / unpack_trellis, K = 1..8
        layers.safetensors     q.{cb}.k{K}[.{k}x{n}].{trellis,suh,svh,mcg|mul1}: stored tensors, named as in a
                               checkpoint, with .ref_rotated (ext.reconstruct: the decoded trellis values),
                               .ref_weight (LinearEXL3.get_weight_tensor: W in the original basis, fp16), and for
                               some, .ref_x / .ref_y (exllamav3's GEMM on x, fp32 output)
        proxy.safetensors      layer.weight [in, out] F32 and layer.hessian [in, in] F32, plus exllamav3's
                               quantization of it at K = 2, 3, 4, 6 (MCG) under px.k{K}.*
        meta.json              versions, GPU, proxy errors per K and seed
  verify --file F.safetensors --decoded DIR --out LOG.json
      For every EXL3 module P in F (a file Kestrel's quantizer wrote), reconstructs it with exllamav3 and compares
      with DIR/P.rotated.npy (Kestrel's `exl3 dequant --rotated`, must be bit-identical) and DIR/P.weight.npy
      (Kestrel's fp32 dequant, must agree within get_weight_tensor's fp16 rounding).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

CODEBOOKS = ("3inst", "mcg", "mul1")
MCG_MARKER = -877912083   # 0xCBAC1FED as int32
MUL1_MARKER = -2082680531  # 0x83DCD12D as int32


def load_exllamav3():
    import exllamav3  # noqa: F401  (compiles the extension on first use)
    from exllamav3.ext import exllamav3_ext as ext
    from exllamav3.modules.quant.exl3 import LinearEXL3
    from exllamav3.modules.quant.exl3_lib.quantize import quantize_exl3
    return ext, LinearEXL3, quantize_exl3


def codebook_flags(codebook):
    return codebook == "mcg", codebook == "mul1"


def quant_args(K, codebook, seed):
    args = {"K": K, "devices": [0], "seed": seed, "apply_out_scales": True}
    # exllamav3 tests key presence, not the value, when it picks the codebook of the tile encoder
    if codebook != "3inst":
        args[codebook] = True
    return args


def hessian_data(H, device):
    return {"H": H.clone().to(device), "count": 1, "finalized": False, "first_key": "oracle", "num_total": 0,
            "device": device}


def correlated_activations(rows, k, generator):
    """Activations with a decaying spectrum and a few outlier channels, like a real layer's inputs."""
    basis = torch.randn(k, k, generator=generator)
    spectrum = torch.logspace(0, -2, k)
    x = torch.randn(rows, k, generator=generator) @ (basis * spectrum[:, None])
    outliers = torch.randperm(k, generator=generator)[: max(1, k // 64)]
    x[:, outliers] *= 8.0
    return x


def make_linear(LinearEXL3, k, n, tensors, codebook):
    mcg, mul1 = codebook_flags(codebook)
    return LinearEXL3(None, k, n, trellis=tensors["trellis"], suh=tensors["suh"], svh=tensors["svh"],
                      mcg=tensors.get("mcg") if mcg else None, mul1=tensors.get("mul1") if mul1 else None,
                      bias=None, out_dtype=torch.float)


def vectors(out_dir):
    os.environ["EXL3_INT8_GEMV"] = "0"  # GEMM references from the fp16 path, not the approximate int8 one
    ext, LinearEXL3, quantize_exl3 = load_exllamav3()
    dev = torch.device("cuda:0")
    os.makedirs(out_dir, exist_ok=True)
    meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    import importlib.metadata
    meta["exllamav3"] = importlib.metadata.version("exllamav3")
    generator = torch.Generator().manual_seed(1234)

    # Codebooks: every state through the GPU decoder.
    states = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(1024, 64).to(dev)
    luts = {}
    for codebook in CODEBOOKS:
        out = torch.empty(1024, 64, dtype=torch.half, device=dev)
        ext.decode(states, out, *codebook_flags(codebook))
        luts[f"lut.{codebook}"] = out.flatten().cpu()
    save_file(luts, os.path.join(out_dir, "codebooks.safetensors"))

    # Packing: random states through the packer, and back.
    packing = {}
    for K in range(1, 9):
        raw = torch.randint(-32768, 32768, (2, 3, 256), dtype=torch.int32, generator=generator).to(torch.int16)
        packed = torch.empty(2, 3, 16 * K, dtype=torch.int16, device=dev)
        ext.pack_trellis(packed, raw.to(dev), K)
        unpacked = torch.empty(2, 3, 256, dtype=torch.int16, device=dev)
        ext.unpack_trellis(unpacked, packed, K)
        packing.update({f"pack.k{K}.states": raw, f"pack.k{K}.packed": packed.cpu(),
                        f"pack.k{K}.unpacked": unpacked.cpu()})
    save_file(packing, os.path.join(out_dir, "packing.safetensors"))

    # Layers: every codebook and K on 128x256; MCG K4 also on wider shapes; GEMM outputs on a few.
    cases = [(cb, K, 128, 256) for cb in CODEBOOKS for K in range(1, 9)]
    cases += [("mcg", 4, 256, 384), ("mcg", 4, 384, 128), ("mul1", 3, 256, 384)]
    gemm_cases = {("mcg", 4, 128, 256), ("mcg", 4, 256, 384), ("3inst", 2, 128, 256), ("mul1", 3, 256, 384)}
    layers = {}
    meta["layers"] = {}
    for codebook, K, k, n in cases:
        name = f"q.{codebook}.k{K}" + ("" if (k, n) == (128, 256) else f".{k}x{n}")
        weight = torch.randn(k, n, generator=generator) * 0.02
        H = correlated_activations(512, k, generator)
        H = (H.T @ H) / 512
        _, proxy_err, tensors = quantize_exl3(weight.to(dev), hessian_data(H, dev), quant_args(K, codebook, 7),
                                              return_weight_q=False)
        linear = make_linear(LinearEXL3, k, n, tensors, codebook)
        rotated = torch.empty(k, n, dtype=torch.half, device=dev)
        ext.reconstruct(rotated, tensors["trellis"], K, *codebook_flags(codebook))
        for key, value in tensors.items():
            layers[f"{name}.{key}"] = value.cpu().contiguous()
        layers[f"{name}.ref_rotated"] = rotated.cpu()
        layers[f"{name}.ref_weight"] = linear.get_weight_tensor().cpu()
        if (codebook, K, k, n) in gemm_cases:
            x = torch.randn(8, k, generator=generator).half()
            layers[f"{name}.ref_x"] = x
            layers[f"{name}.ref_y"] = linear.forward(x.to(dev), {}, out_dtype=torch.float).cpu()
        meta["layers"][name] = {"codebook": codebook, "K": K, "k": k, "n": n, "proxy_err": float(proxy_err)}
        print(f"{name}: proxy error {proxy_err:.6f}", flush=True)
    save_file(layers, os.path.join(out_dir, "layers.safetensors"))

    # Proxy error reference: one layer, one Hessian, K = 2, 3, 4, 6 (MCG), three seeds each.
    k, n = 256, 512
    weight = torch.randn(k, n, generator=generator) * 0.02
    weight[:, torch.randperm(n, generator=generator)[:8]] *= 4.0
    x = correlated_activations(2048, k, generator)
    H = (x.T @ x) / 2048
    proxy = {"layer.weight": weight.contiguous(), "layer.hessian": H.contiguous()}
    meta["proxy"] = {}
    for K in (2, 3, 4, 6):
        errors = []
        for seed in (0, 1, 2):
            _, err, tensors = quantize_exl3(weight.to(dev), hessian_data(H, dev), quant_args(K, "mcg", seed),
                                            return_weight_q=False)
            errors.append(float(err))
            if seed == 0:
                for key, value in tensors.items():
                    proxy[f"px.k{K}.{key}"] = value.cpu().contiguous()
        meta["proxy"][f"k{K}"] = {"proxy_err": errors, "mean": sum(errors) / len(errors)}
        print(f"proxy K={K}: {errors}", flush=True)
    save_file(proxy, os.path.join(out_dir, "proxy.safetensors"))

    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def verify(path, decoded_dir, out_path):
    ext, LinearEXL3, _ = load_exllamav3()
    dev = torch.device("cuda:0")
    tensors = load_file(path)
    prefixes = sorted(key[: -len(".trellis")] for key in tensors if key.endswith(".trellis"))
    report = {"file": os.path.basename(path), "modules": {}}
    failures = 0
    for prefix in prefixes:
        codebook = "mcg" if f"{prefix}.mcg" in tensors else "mul1" if f"{prefix}.mul1" in tensors else "3inst"
        trellis = tensors[f"{prefix}.trellis"].to(dev)
        k, n, K = trellis.shape[0] * 16, trellis.shape[1] * 16, trellis.shape[2] // 16
        rotated = torch.empty(k, n, dtype=torch.half, device=dev)
        ext.reconstruct(rotated, trellis, K, *codebook_flags(codebook))
        ours_rotated = np.load(os.path.join(decoded_dir, f"{prefix}.rotated.npy"))
        theirs = rotated.cpu().float().numpy()
        mismatches = int(np.sum(theirs.view(np.uint32) != ours_rotated.astype(np.float32).view(np.uint32)))
        stored = {key[len(prefix) + 1:]: value.to(dev) for key, value in tensors.items()
                  if key.startswith(prefix + ".")}
        linear = make_linear(LinearEXL3, k, n, stored, codebook)
        weight = linear.get_weight_tensor().float().cpu().numpy()
        ours_weight = np.load(os.path.join(decoded_dir, f"{prefix}.weight.npy"))
        scale = float(np.abs(weight).max()) or 1.0
        weight_diff = float(np.abs(weight - ours_weight).max()) / scale
        # get_weight_tensor rounds to fp16 after each Hadamard and scale step: a few fp16 ulps of the largest value
        ok = mismatches == 0 and weight_diff < 4e-3
        failures += not ok
        report["modules"][prefix] = {"codebook": codebook, "K": K, "k": k, "n": n, "rotated_mismatches": mismatches,
                                     "weight_max_rel_diff": weight_diff, "ok": ok}
        print(f"{prefix}: {codebook} K={K} {k}x{n} rotated mismatches {mismatches}, "
              f"weight max diff {weight_diff:.2e} of max |W| -> {'ok' if ok else 'FAIL'}", flush=True)
    report["failures"] = failures
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    return 1 if failures or not prefixes else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="import exllamav3 (compiles its extension) and exit")
    p = sub.add_parser("vectors")
    p.add_argument("--out", required=True)
    p = sub.add_parser("verify")
    p.add_argument("--file", required=True)
    p.add_argument("--decoded", required=True)
    p.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: exl3_oracle needs a CUDA GPU")
    if args.command == "build":
        load_exllamav3()
        return 0
    if args.command == "vectors":
        vectors(args.out)
        return 0
    return verify(args.file, args.decoded, args.out)


if __name__ == "__main__":
    sys.exit(main())
