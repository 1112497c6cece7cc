#!/usr/bin/env python3
"""exllamav3's EXL3 kernels beside Kestrel's on identical weights (issue 6): one dense EXL3 linear and one MoE
layer's routed experts, µs per call at 1, 8 and 64 tokens. tools/run_exl3_bench.sh runs the whole comparison.

  write --out FILE [--seed N]
      Writes random EXL3 weights in exllamav3's checkpoint layout (numpy only; any trellis bit pattern is a valid
      EXL3 matrix), 4 bpw with the MCG codebook, plus what both sides share so that they do the same work:
        dense.{c}.up_proj.{trellis,suh,svh,mcg}    4096 -> 12288, c < 8: copies the calls cycle through, so the
                                                   50 MB L2 cannot serve the 25 MB matrix
        moe.experts.{e}.{gate,up,down}_proj.*      288 experts, hidden 4096, expert intermediate 2048
        moe.gate.weight                            F16 [288, 4096] zeros: exllamav3's BlockSparseMLP loads a router;
                                                   the routings below replace its output
        routing.t{T}.ids / .weights                I32 / F32 [16, T, 8]: 16 routings per token count T (1, 8, 64),
                                                   8 distinct experts per token, weights 1/8
        input.t{T}                                 F16 [T, 4096]: the fixed input whose outputs both sides save
      and __metadata__ {seed, swiglu_limit}. suh is ±1 and svh ±0.02 (random signs): W's entries then spread like a
      real layer's (0.025 RMS: the MCG codebook's RMS is 1.24) and every activation stays well inside fp16.
  build
      Imports exllamav3, which compiles its extension on first use; prints the time it took.
  time --file FILE --out OUTPUTS [--iterations N]
      Loads FILE with exllamav3's own loader and modules (Linear -> LinearEXL3, BlockSparseMLP), times each op with
      CUDA events around N back-to-back calls that cycle through the copies / routings (after a warm-up of one
      cycle), as kestrel_cuda_bench --exl3-file does, and prints a markdown table; then a second table of the GPU
      kernel time per call (torch profiler), which leaves out exllamav3's Python and launch overhead. Writes
      exllamav3's outputs on input.t{T} (copy 0, routing 0) to OUTPUTS: dense.t{T} F32 [T, 12288] and
      moe.t{T} F32 [T, 4096].
  summary --exllamav3 LOG --kestrel LOG
      The two tables side by side, from the logs of `time` and `kestrel_cuda_bench --exl3-file`.
"""
import argparse
import json
import os
import re
import struct
import sys
import tempfile
import time

import numpy as np

HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K = 4096, 2048, 288, 8
DENSE_OUT, DENSE_COPIES = 12288, 8
BITS, ROUTINGS, TOKEN_COUNTS = 4, 16, (1, 8, 64)
SWIGLU_LIMIT = 10.0  # GLM-5.3-Flash's swiglu_limit; both sides clamp gate and up at it
MCG_MARKER = -877912083  # 0xCBAC1FED as int32: the multiplier exllamav3 locks into `.mcg`
DENSE_OP = "dense EXL3 linear 4096->12288"
MOE_OP = "MoE routed experts (288, top 8)"
KERNELS_ONLY = ", GPU kernels only"


def exl3_module_specs(prefix, in_features, out_features):
    return [(f"{prefix}.trellis", "I16", [in_features // 16, out_features // 16, 16 * BITS], "trellis"),
            (f"{prefix}.suh", "F16", [in_features], "suh"),
            (f"{prefix}.svh", "F16", [out_features], "svh"),
            (f"{prefix}.mcg", "I32", [], "mcg")]


def tensor_specs():
    """(name, dtype, shape, kind) of every tensor, in file order."""
    specs = []
    for c in range(DENSE_COPIES):
        specs += exl3_module_specs(f"dense.{c}.up_proj", HIDDEN, DENSE_OUT)
    for e in range(NUM_EXPERTS):
        specs += exl3_module_specs(f"moe.experts.{e}.gate_proj", HIDDEN, INTERMEDIATE)
        specs += exl3_module_specs(f"moe.experts.{e}.up_proj", HIDDEN, INTERMEDIATE)
        specs += exl3_module_specs(f"moe.experts.{e}.down_proj", INTERMEDIATE, HIDDEN)
    specs.append(("moe.gate.weight", "F16", [NUM_EXPERTS, HIDDEN], "zeros"))
    for t in TOKEN_COUNTS:
        specs += [(f"routing.t{t}.ids", "I32", [ROUTINGS, t, TOP_K], "ids"),
                  (f"routing.t{t}.weights", "F32", [ROUTINGS, t, TOP_K], "route_weights"),
                  (f"input.t{t}", "F16", [t, HIDDEN], "input")]
    return specs


ELEMENT_BYTES = {"I16": 2, "F16": 2, "I32": 4, "F32": 4}


def tensor_bytes(rng, kind, shape):
    n = int(np.prod(shape, dtype=np.int64))
    if kind == "trellis":
        return rng.bytes(2 * n)
    if kind == "suh":
        return np.where(rng.integers(0, 2, n) == 1, 1.0, -1.0).astype("<f2").tobytes()
    if kind == "svh":
        return np.where(rng.integers(0, 2, n) == 1, 0.02, -0.02).astype("<f2").tobytes()
    if kind == "mcg":
        return np.array(MCG_MARKER, dtype="<i4").tobytes()
    if kind == "zeros":
        return bytes(2 * n)
    if kind == "ids":
        routings, tokens, top_k = shape
        ids = np.stack([rng.permutation(NUM_EXPERTS)[:top_k] for _ in range(routings * tokens)])
        return ids.astype("<i4").tobytes()
    if kind == "route_weights":
        return np.full(n, 1.0 / TOP_K, dtype="<f4").tobytes()
    if kind == "input":
        return rng.standard_normal(n).astype("<f2").tobytes()
    raise ValueError(kind)


def write(path, seed):
    """Streams the file tensor by tensor (3.8 GB, never all in memory)."""
    specs = tensor_specs()
    header, offset = {}, 0
    for name, dtype, shape, _ in specs:
        size = int(np.prod(shape, dtype=np.int64)) * ELEMENT_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "kestrel exl3 side-by-side", "seed": str(seed),
                              "swiglu_limit": repr(SWIGLU_LIMIT)}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"  # renamed at the end: an interrupted write never leaves a plausible file
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name, _, shape, kind in specs:
            data = tensor_bytes(rng, kind, shape)
            assert len(data) == header[name]["data_offsets"][1] - header[name]["data_offsets"][0], name
            f.write(data)
    os.replace(partial, path)
    print(f"wrote {path}: {len(specs)} tensors, {offset / 1e9:.2f} GB, seed {seed}")


def load_exllamav3():
    """Imports exllamav3's extension, which compiles on first use."""
    from exllamav3.ext import exllamav3_ext  # noqa: F401


def build():
    start = time.time()
    load_exllamav3()
    import importlib.metadata
    print(f"exllamav3 {importlib.metadata.version('exllamav3')} extension ready ({time.time() - start:.0f} s)")


class CycleTimer:
    """µs per call of `call(i)` over N back-to-back calls, i cycling through `cycle` values, measured with CUDA
    events on the current stream; and the GPU kernel time per call from the torch profiler's trace."""

    def __init__(self, torch, iterations):
        self.torch, self.iterations = torch, iterations

    def wall_us(self, call, cycle):
        torch = self.torch
        for i in range(cycle):  # warm-up: autotuning, graph capture, allocator
            call(i)
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for i in range(self.iterations):
            call(i % cycle)
        end.record()
        end.synchronize()
        return 1000.0 * begin.elapsed_time(end) / self.iterations

    def kernel_us(self, call, cycle):
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile
        calls = min(self.iterations, 4 * cycle)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(calls):
                call(i % cycle)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(trace)
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
        busy = sum(e.get("dur", 0) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
        return busy / calls if busy > 0 else float("nan")


def time_command(path, out_path, iterations):
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    if not torch.cuda.is_available():
        sys.exit("error: bench_exllamav3.py time needs a CUDA GPU")
    load_exllamav3()
    import importlib.metadata
    from exllamav3.loader import SafetensorsCollection
    from exllamav3.model.config import NullConfig
    from exllamav3.modules import BlockSparseMLP, Linear

    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        shared = {name: f.get_tensor(name) for name in f.keys() if name.startswith(("routing.", "input."))}
    if float(meta.get("swiglu_limit", "nan")) != SWIGLU_LIMIT:
        sys.exit(f"error: {path} was not written by this version of bench_exllamav3.py write (metadata {meta})")
    print(f"exllamav3 {importlib.metadata.version('exllamav3')}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(dev)}; {path} (seed {meta.get('seed')}), {iterations} calls per row")

    # exllamav3's loader reads every *.safetensors of a directory: give it one holding only this file.
    stc_dir = tempfile.mkdtemp(prefix="exl3_bench_")
    os.symlink(os.path.abspath(path), os.path.join(stc_dir, "weights.safetensors"))
    config = NullConfig()
    config.stc = SafetensorsCollection(stc_dir)

    start = time.time()
    dense = []
    for c in range(DENSE_COPIES):
        linear = Linear(config, f"dense.{c}.up_proj", HIDDEN, DENSE_OUT, out_dtype=torch.float)
        linear.load(dev)
        assert linear.quant_type == "exl3" and linear.inner.mcg, f"dense.{c}.up_proj did not load as EXL3 MCG"
        dense.append(linear)
    # As architecture/glm4_moe.py builds GLM's MoE, without the shared experts (Kestrel's DeviceExperts has none
    # either) and with Kestrel's clamp; the router type is irrelevant, its result is replaced.
    moe = BlockSparseMLP(config, key="moe", hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K,
                         key_up="experts.{expert_idx}.up_proj", key_gate="experts.{expert_idx}.gate_proj",
                         key_down="experts.{expert_idx}.down_proj", key_routing_gate="gate",
                         interm_dtype=torch.half, out_dtype=torch.float, router_type="std",
                         act_limit=SWIGLU_LIMIT)
    moe.load(dev)
    torch.cuda.synchronize()
    print(f"loaded {DENSE_COPIES} dense copies and {NUM_EXPERTS} experts in {time.time() - start:.1f} s; "
          f"MoE fast paths: multi-row graph (run_bszN) {'on' if moe.bc is not None else 'OFF'}, "
          f"fused exl3_moe {'on' if moe.fused_mode_buffers is not None else 'OFF'}")
    if moe.bc is None or moe.fused_mode_buffers is None:
        print("warning: exllamav3 did not enable its quantized MoE fast paths for these weights; "
              "its MoE rows below time a slower fallback", file=sys.stderr)

    # BlockSparseMLP.forward runs unchanged (exllamav3 1.4.1, block_sparse_mlp.py lines 1099-1541); only the
    # router's result (line 1132, `self.routing_fn(...)`) is replaced by the file's routing. With 288 experts and
    # top 8 (f_threshold 4), 1 and 8 tokens take the multi-row CUDA-graph path (lines 1335-1341:
    # BC_BlockSparseMLP.run_bszN, which patches the routing pointers into its graph on every launch), 64 tokens the
    # grouped path (lines 1169-1325: argsort, bincount, a host sync, then the fused ext.exl3_moe kernel, every
    # expert having at most 128 tokens).
    routing = {}
    moe.routing_fn = lambda bsz, cfg, z, params: routing["current"]

    timer = CycleTimer(torch, iterations)
    calls, outputs, measured = [], {}, 0
    for tokens in TOKEN_COUNTS:
        x = shared[f"input.t{tokens}"].to(dev).contiguous()
        ids = shared[f"routing.t{tokens}.ids"].to(dev).long()
        weights = shared[f"routing.t{tokens}.weights"].to(dev).half()
        routings = [(ids[r].contiguous(), weights[r].contiguous()) for r in range(ROUTINGS)]

        def dense_call(i, x=x):
            return dense[i].forward(x, {})

        def moe_call(i, x=x, routings=routings):
            routing["current"] = routings[i]
            return moe.forward(x, {})

        calls += [(DENSE_OP, tokens, dense_call, DENSE_COPIES, f"dense.t{tokens}"),
                  (MOE_OP, tokens, moe_call, ROUTINGS, f"moe.t{tokens}")]

    print("\n| op (exllamav3) | tokens | µs per call |\n|---|---|---|", flush=True)
    for op, tokens, call, cycle, key in calls:
        try:
            wall = timer.wall_us(call, cycle)
            # Output on the fixed input (copy 0 / routing 0); the MoE's is a view of a static buffer.
            outputs[key] = call(0).float().reshape(tokens, -1).clone().cpu()
            print(f"| {op} | {tokens} | {wall:.2f} |", flush=True)
            measured += 1
        except Exception as e:
            print(f"| {op} | {tokens} | FAILED: {type(e).__name__}: {e} |", flush=True)
    save_file(outputs, out_path, metadata={"exllamav3": importlib.metadata.version("exllamav3"),
                                           "gpu": torch.cuda.get_device_name(dev)})
    print(f"\nexllamav3 outputs on input.t{{1,8,64}} (routing 0): {out_path}")

    # After every wall-clock row: the profiler's CUPTI hooks could slow the launches that follow it.
    print("\n| op (exllamav3) | tokens | GPU kernel µs per call (torch profiler) |\n|---|---|---|", flush=True)
    for op, tokens, call, cycle, _ in calls:
        try:
            print(f"| {op}{KERNELS_ONLY} | {tokens} | {timer.kernel_us(call, cycle):.2f} |", flush=True)
        except Exception as e:  # a diagnostic: its failure must not hide the timings above
            print(f"| {op}{KERNELS_ONLY} | {tokens} | n/a: {type(e).__name__}: {e} |", flush=True)
    return 0 if measured == len(calls) else 1


ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*(\d+)\s*\|\s*([0-9.]+)\s*\|")


def table_rows(log_path):
    """{(op, tokens): µs} from the markdown rows `| op | tokens | µs |` of a log (absent file: empty)."""
    rows = {}
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = ROW.match(line)
                if m:
                    rows[(m.group(1), int(m.group(2)))] = float(m.group(3))
    return rows


def summary(exllamav3_log, kestrel_log):
    theirs, ours = table_rows(exllamav3_log), table_rows(kestrel_log)
    cell = lambda v: f"{v:.2f}" if v is not None else "not measured"
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
    # Kestrel's speed-up over exllamav3 as it runs (wall), and over exllamav3's kernels alone (its Python and launch
    # overhead left out; ours kept in).
    print("| op | tokens | exllamav3 µs | exllamav3 GPU kernels µs | Kestrel µs | Kestrel speed-up | over kernels |\n"
          "|---|---|---|---|---|---|---|")
    for op in (DENSE_OP, MOE_OP):
        for tokens in TOKEN_COUNTS:
            a, k, b = theirs.get((op, tokens)), theirs.get((op + KERNELS_ONLY, tokens)), ours.get((op, tokens))
            print(f"| {op} | {tokens} | {cell(a)} | {cell(k)} | {cell(b)} | {ratio(a, b)} | {ratio(k, b)} |")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("write")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    sub.add_parser("build")
    p = sub.add_parser("time")
    p.add_argument("--file", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--iterations", type=int, default=200)
    p = sub.add_parser("summary")
    p.add_argument("--exllamav3", required=True)
    p.add_argument("--kestrel", required=True)
    args = parser.parse_args()
    if args.command == "write":
        write(args.out, args.seed)
        return 0
    if args.command == "build":
        build()
        return 0
    if args.command == "time":
        return time_command(args.file, args.out, args.iterations)
    return summary(args.exllamav3, args.kestrel)


if __name__ == "__main__":
    sys.exit(main())
