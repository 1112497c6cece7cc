#!/usr/bin/env python3
"""Mutation check for the golden tests: each mutation breaks one block of the forward pass in a copy of the source
tree; the golden tests must then fail. Prints one line per mutation and exits non-zero if any mutant survives.

Usage: tools/mutation_check.py [--work /tmp/kestrel-mutants] [--only SUBSTRING]
Needs only the build dependencies (scripts/install-deps.sh) and python3.
"""
import argparse
import pathlib
import shutil
import subprocess
import sys

# (block, file, original text, mutated text)
MUTATIONS = [
    ("mHC post multiplier 2 -> 1", "src/backend/cpu/mhc.cpp",
     "post[t * hc + j] = 2.0f * logistic(", "post[t * hc + j] = 1.0f * logistic("),
    ("mHC one Sinkhorn iteration fewer", "src/backend/cpu/mhc.cpp",
     "for (int64_t iter = 1; iter < shape.sinkhorn_iters; ++iter)",
     "for (int64_t iter = 2; iter < shape.sinkhorn_iters; ++iter)"),
    ("mHC comb applied untransposed", "src/backend/cpu/mhc.cpp",
     "sum += c[i * hc + j] * x[i * hidden + d];", "sum += c[j * hc + i] * x[i * hidden + d];"),
    ("final collapse takes stream 0 instead of the mean", "src/backend/cpu/elementwise.cpp",
     "out[t * hidden + d] = sum / static_cast<float>(hc_mult);",
     "out[t * hidden + d] = streams[t * hc_mult * hidden + d] + 0.0f * sum;"),
    ("KDA conv without SiLU", "src/backend/cpu/kda.cpp",
     "y[t * channels + c] = sum / (1.0f + std::exp(-sum));", "y[t * channels + c] = sum;"),
    ("KDA conv state not carried", "src/backend/cpu/kda.cpp",
     "conv_state[s * channels + c] = window[static_cast<size_t>(num_tokens + s)];",
     "conv_state[s * channels + c] = 0.0f;"),
    ("KDA recurrent step ignores beta", "src/backend/cpu/kda.cpp",
     "const float beta = a.beta[t * H + h];", "const float beta = 1.0f;"),
    ("KDA chunked form without forward substitution", "src/backend/cpu/kda.cpp",
     "for (int64_t i = 1; i < L; ++i) {\n          std::vector<float> row",
     "for (int64_t i = L; i < L; ++i) {\n          std::vector<float> row"),
    ("KDA forget gate sign of the bound", "src/backend/cpu/elementwise.cpp",
     "g[i] = *lower_bound / (1.0f + std::exp(-(rate * x)));", "g[i] = *lower_bound / (1.0f + std::exp(rate * x));"),
    ("KDA softplus gate without A", "src/backend/cpu/elementwise.cpp",
     "g[i] = -rate * softplus;", "g[i] = -softplus;"),
    ("KDA output gate dropped", "src/backend/cpu/elementwise.cpp",
     "y[i] *= 1.0f / (1.0f + std::exp(-gate[i]));", "y[i] *= 1.0f / (1.0f + std::exp(-0.0f * gate[i]));"),
    ("DSA tail misses the current token", "src/backend/cpu/dsa.cpp",
     "for (int64_t p = position + 1 - tail; p <= position; ++p) positions.push_back(p);",
     "for (int64_t p = position + 1 - tail; p < position; ++p) positions.push_back(p);"),
    ("DSA one pool too many selected", "src/backend/cpu/dsa.cpp",
     "const int64_t keep = std::min(a.topk_pools, visible_pools);",
     "const int64_t keep = std::min(a.topk_pools + 1, visible_pools);"),
    ("DSA indexer without relu", "src/backend/cpu/dsa.cpp",
     "std::max(dot * softmax_scale, 0.0f)", "(dot * softmax_scale)"),
    ("DSA k-pool compression without ape", "src/backend/cpu/dsa.cpp",
     "+ ape[s * dim + c];", "+ 0.0f * ape[s * dim + c];"),
    ("MLA attention scale dropped", "src/backend/cpu/dsa.cpp",
     "probs[i] = score * a.scale;", "probs[i] = score;"),
    ("MoE correction bias used in weights", "src/backend/cpu/moe.cpp",
     "float weight = scores[static_cast<size_t>(e)];", "float weight = choice[static_cast<size_t>(e)];"),
    ("MoE routed scaling factor dropped", "src/backend/cpu/moe.cpp",
     "weight * a.routed_scaling_factor;", "weight;"),
    ("MoE groups ignored", "src/backend/cpu/moe.cpp",
     "const auto kept_groups = top_k_indices(group_scores, a.topk_group);",
     "const auto kept_groups = top_k_indices(group_scores, a.n_group);"),
    ("SwiGLU clamp removed", "src/backend/cpu/norm.cpp",
     "const float u = std::clamp(up[i], -limit, limit);", "const float u = up[i];"),
    ("RMSNorm weight ignored", "src/backend/cpu/norm.cpp",
     "out[i] = (weight ? weight[i] : 1.0f) * (in[i] * inv_rms);",
     "out[i] = (weight ? 1.0f + 0.0f * weight[i] : 1.0f) * (in[i] * inv_rms);"),
    ("FP8 block scale ignored", "src/backend/linear_weight.cpp",
     "out[j] = fp8_e4m3_to_f32(static_cast<uint8_t>(base[j])) * scale;",
     "out[j] = fp8_e4m3_to_f32(static_cast<uint8_t>(base[j])) * (0.0f * scale + 1.0f);"),
    ("shared indexer layer runs on a stale selection", "src/model/glm5_next.cpp",
     "backend_.indexer_select(args, selection);", "if (start == 0) backend_.indexer_select(args, selection);"),
]


def run(cmd, cwd, capture=True):
    return subprocess.run(cmd, cwd=cwd, capture_output=capture, text=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/kestrel-mutants")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    repo = pathlib.Path(__file__).resolve().parent.parent
    work = pathlib.Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns("build*", ".git"))
    build = work / "build"
    run(["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"], work)
    if run(["cmake", "--build", "build"], work).returncode != 0:
        sys.exit("the unmutated tree does not build")
    test = [str(build / "tests" / "kestrel_tests"), "--gtest_filter=Fixtures/GoldenTest.*", "--gtest_brief=1"]
    if run(test, work).returncode != 0:
        sys.exit("the golden tests fail on the unmutated tree")
    survivors = 0
    for block, rel, original, mutated in MUTATIONS:
        if args.only and args.only not in block:
            continue
        path = work / rel
        text = path.read_text()
        if text.count(original) != 1:
            print(f"STALE     {block}: pattern not found exactly once in {rel}")
            survivors += 1
            continue
        path.write_text(text.replace(original, mutated))
        built = run(["cmake", "--build", "build"], work).returncode == 0
        result = run(test, work) if built else None
        path.write_text(text)
        if not built:
            print(f"NOBUILD   {block}")
            survivors += 1
        elif result.returncode == 0:
            print(f"SURVIVED  {block}")
            survivors += 1
        else:
            failed = {line.split()[3].rstrip(",") for line in result.stdout.splitlines()
                      if line.startswith("[  FAILED  ]") and "GoldenTest." in line}
            print(f"killed    {block}: {len(failed)} golden tests fail")
    run(["cmake", "--build", "build"], work)
    print(f"{len(MUTATIONS)} mutations, {survivors} survived")
    sys.exit(1 if survivors else 0)


if __name__ == "__main__":
    main()
