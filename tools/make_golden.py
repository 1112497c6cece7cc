#!/usr/bin/env python3
"""Generate golden-test fixtures for Kestrel (GLM-5.3-Flash, HF model_type `glm5_next`).

Each fixture is a tiny random checkpoint in the official hub layout plus reference logits computed by
transformers (the reference implementation) in float32:

    tests/data/golden/<name>/
        config.json, model.safetensors | model-0000X-of-0000N.safetensors + model.safetensors.index.json
        ref_full.npy          float32 [T, vocab]  logits of one no-cache forward over all T tokens
        ref_incremental.npy   float32 [T, vocab]  prefill of `prefill` tokens (use_cache) + 1-token decode steps
        meta.json             tokens, prefill, knobs, seed, versions, checks

Seeds whose reference is ambiguous are rejected (see README): non-causal prefixes, incremental != full,
or a torch.topk call (MoE router, indexer pool selection) whose k-th / (k+1)-th values are closer than
--margin.

Usage:  python3 tools/make_golden.py [--out DIR] [--only NAME] [--device cpu|cuda]
"""

import argparse
import copy
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time

# The reference must be transformers' own torch code: keep optional fused kernels (FLA, causal-conv1d,
# kernels-hub) out of the picture, whatever is installed on the machine.
os.environ.setdefault("USE_HUB_KERNELS", "0")
for _m in ("fla", "causal_conv1d"):
    sys.modules.setdefault(_m, None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next as glm_mod  # noqa: E402

transformers.logging.set_verbosity_error()

LM = "model.language_model."
KDA = "linear_attention"
DSA = "deepseek_sparse_attention"

# ----------------------------------------------------------------------------------------------------------
# Fixture variants
# ----------------------------------------------------------------------------------------------------------

VISION_TINY = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, projection_intermediate_size=32,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)


def text_cfg(**over):
    base = dict(
        vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=0, v_head_dim=16,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc",
        index_n_heads=8, index_head_dim=16, index_topk=16, index_kpool=4, index_kpool_always_select_tail=True,
        hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, rms_norm_eps=1e-5, swiglu_limit=10.0,
        hidden_act="silu", attention_bias=False, tie_word_embeddings=False, pad_token_id=0,
        num_nextn_predict_layers=0, max_position_embeddings=4096,
        linear_attn_config=dict(num_heads=4, head_dim=16, short_conv_kernel_size=4, gate_lower_bound=-5.0),
    )
    base.update(over)
    return base


VARIANTS = [
    dict(
        name="f32_hc4_kp4_shared_vision",
        description="F32 weights, hc_mult 4, kpool 4 (topk 16 = 4 pools + tail), two adjacent DSA layers with the "
                    "second one 'shared' (reuses layer 1's top-k), bounded KDA gate (-5), norm_topk_prob on, "
                    "1 shared expert, n_group 1, swiglu_limit 10, tiny vision tower tensors (model.visual.*).",
        dtype="f32", T=170, prefill=101, vision=True, shards=None, mtp=False,
        text=text_cfg(
            layer_types=[KDA, DSA, DSA, KDA, KDA],
            indexer_types=["full", "full", "shared", "full", "full"],
            mlp_layer_types=["sparse", "dense", "sparse", "dense", "sparse"],
        ),
    ),
    dict(
        name="f32_hc2_kp2_softplus_group_sharded",
        description="F32 weights in 4 safetensors shards (index json), hc_mult 2, kpool 2 (topk 16 = 8 pools + tail), "
                    "DSA first, KDA softplus gate (gate_lower_bound null, safe_gate false), norm_topk_prob off, "
                    "n_group 2 / topk_group 1, 2 shared experts, swiglu_limit 1.5 (clamp active), hidden 48.",
        dtype="f32", T=166, prefill=99, vision=False, shards=4, mtp=False,
        text=text_cfg(
            hidden_size=48, intermediate_size=72, num_hidden_layers=6, hc_mult=2, index_kpool=2, index_topk=16,
            n_group=2, topk_group=1, n_shared_experts=2, norm_topk_prob=False, swiglu_limit=1.5,
            routed_scaling_factor=1.8,
            layer_types=[DSA, KDA, KDA, DSA, KDA, DSA],
            indexer_types=["full"] * 6,
            mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse", "sparse"],
            linear_attn_config=dict(num_heads=4, head_dim=16, short_conv_kernel_size=4, gate_lower_bound=None,
                                    safe_gate=False),
        ),
    ),
    dict(
        name="f32_kp1_mtp",
        description="F32 weights, hc_mult 4, kpool 1 (topk 8 single tokens, no tail), DSA+shared DSA at the end, "
                    "bounded gate, swiglu_limit 3.0, plus an MTP/NextN layer stored as layers.5.* "
                    "(num_nextn_predict_layers 1; ignored by the reference logits).",
        dtype="f32", T=172, prefill=101, vision=False, shards=None, mtp=True,
        text=text_cfg(
            num_hidden_layers=5, index_kpool=1, index_topk=8, swiglu_limit=3.0,
            layer_types=[KDA, KDA, DSA, KDA, DSA],
            indexer_types=["full"] * 5,
            mlp_layer_types=["sparse", "sparse", "dense", "sparse", "dense"],
        ),
    ),
    dict(
        name="bf16_hc4_kp4",
        description="BF16 weights (A_log, dt_bias, e_score_correction_bias, hc_*_base, hc_*_scale, *_conv1d kept F32), "
                    "hc_mult 4, kpool 4, shared DSA after full DSA, bounded gate, norm_topk on, n_group 2 / "
                    "topk_group 1, 2 shared experts, swiglu_limit 2.0.",
        dtype="bf16", T=168, prefill=101, vision=False, shards=None, mtp=False,
        text=text_cfg(
            num_hidden_layers=6, n_group=2, topk_group=1, n_shared_experts=2, swiglu_limit=2.0,
            layer_types=[KDA, DSA, KDA, DSA, DSA, KDA],
            indexer_types=["full", "full", "full", "full", "shared", "full"],
            mlp_layer_types=["dense", "dense", "sparse", "sparse", "dense", "sparse"],
        ),
    ),
    dict(
        name="fp8_block16_hc4_kp4",
        description="Block-FP8 (e4m3, weight_block_size [16,16], ragged edges: hidden 40, q_lora 24, moe 20) for DSA "
                    "q_a/q_b/kv_a/o and all dense/shared/routed expert gate/up/down, `*.weight_scale_inv` F32; "
                    "other tensors BF16 (A_log, dt_bias, e_score_correction_bias, hc base/scale F32); hc_mult 4, "
                    "kpool 4, bounded gate, norm_topk on, swiglu_limit 10.",
        dtype="fp8", T=165, prefill=103, vision=False, shards=None, mtp=False,
        text=text_cfg(
            hidden_size=40, intermediate_size=56, moe_intermediate_size=20, q_lora_rank=24, kv_lora_rank=24,
            num_hidden_layers=5,
            layer_types=[KDA, KDA, DSA, KDA, DSA],
            indexer_types=["full"] * 5,
            mlp_layer_types=["dense", "sparse", "sparse", "sparse", "dense"],
        ),
    ),
]

FP8_BLOCK = (16, 16)
FP8_MAX = 448.0
# 2-D linear weights the official release stores as block-FP8 (architecture doc section 2).
FP8_SUFFIXES = (
    "self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
    "mlp.shared_experts.down_proj.weight",
)
F32_KEEP_SUFFIXES = ("A_log", "dt_bias", "e_score_correction_bias", "hc_attn_base", "hc_attn_scale",
                     "hc_ffn_base", "hc_ffn_scale")


def is_fp8_name(name, cfg_text):
    if not name.startswith(LM + "layers."):
        return False
    if any(name.endswith(s) for s in FP8_SUFFIXES):
        return True
    if ".mlp.experts." in name and name.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight")):
        return True
    if name.endswith("self_attn.o_proj.weight"):
        # only the MLA o_proj (KDA o_proj stays BF16 in the release)
        layer = int(name[len(LM + "layers."):].split(".")[0])
        return layer >= cfg_text["num_hidden_layers"] or cfg_text["layer_types"][layer] == DSA
    return False


# ----------------------------------------------------------------------------------------------------------
# Model construction and re-randomisation
# ----------------------------------------------------------------------------------------------------------

def build_config(v):
    vis = dict(VISION_TINY, out_hidden_size=v["text"]["hidden_size"])
    return Glm5NextConfig(text_config=copy.deepcopy(v["text"]), vision_config=vis, tie_word_embeddings=False)


def randomise_(named_tensors, cfg_t, gen, lm_gain=2.5):
    """Give every tensor a modest non-degenerate random value (the HF init leaves many at 0/1)."""
    H = cfg_t.hidden_size
    bounded = cfg_t.linear_lower_bound is not None

    def rn(shape, std):
        return torch.randn(shape, generator=gen) * std

    def ru(shape, a, b):
        return torch.rand(shape, generator=gen) * (b - a) + a

    for name, t in named_tensors:
        s = tuple(t.shape)
        if name.endswith("embed_tokens.weight"):
            val = rn(s, 1.0)
        elif name.endswith("lm_head.weight"):
            val = rn(s, lm_gain / math.sqrt(H))
        elif name.endswith(("hc.fn", "hc_attn_fn", "hc_ffn_fn")):
            val = rn(s, 1.0 / math.sqrt(s[1]))
        elif name.endswith(("hc.base", "hc_attn_base", "hc_ffn_base")):
            val = rn(s, 0.5)
        elif name.endswith(("hc.scale", "hc_attn_scale", "hc_ffn_scale")):
            val = ru(s, 0.5, 1.5)
        elif name.endswith("A_log"):
            val = ru(s, -0.7, 0.7) if bounded else ru(s, -1.5, 0.0)
        elif name.endswith("dt_bias"):
            val = ru(s, -4.5, 0.5) if bounded else ru(s, -4.0, -0.5)
        elif "conv1d" in name:
            val = rn(s, 0.5)
        elif name.endswith("e_score_correction_bias"):
            val = rn(s, 0.5)  # wide spread of biased router scores -> fewer near-ties at the top-k boundary
        elif name.endswith("index_kpool_compress_ape"):
            val = rn(s, 0.7)
        elif name.endswith("indexer.weights_proj.weight"):
            val = rn(s, 3.0 / math.sqrt(s[1]))  # index scores O(1) so relative top-k gaps are not tiny
        elif name.endswith("index_kpool_compress_gate"):
            val = rn(s, 1.0 / math.sqrt(s[1]))
        elif name.endswith("experts.gate_up_proj"):
            val = rn(s, 1.0 / math.sqrt(s[2]))
        elif name.endswith("experts.down_proj"):
            val = rn(s, 1.0 / math.sqrt(s[2]))
        elif name.endswith(".bias"):
            val = rn(s, 0.1)
        elif t.dim() == 1:  # every remaining 1-D tensor is a norm weight
            val = ru(s, 0.7, 1.3)
        elif t.dim() >= 2:
            fan_in = int(np.prod(s[1:]))
            val = rn(s, 1.0 / math.sqrt(fan_in))
        else:
            raise RuntimeError(f"unhandled tensor {name} {s}")
        with torch.no_grad():
            t.copy_(val.to(t.dtype))


def module_to_hub_experts(prefix, sd_items):
    """Module-layout MoE/attention state (`experts.gate_up_proj` [E,2I,H], `experts.down_proj` [E,H,I])
    -> hub layout (`experts.{e}.gate_proj.weight` ...)."""
    out = {}
    for k, t in sd_items:
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[prefix + base + f"{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[prefix + base + f"{e}.up_proj.weight"] = t[e, inter:].clone()
        elif k.endswith("experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[prefix + base + f"{e}.down_proj.weight"] = t[e].clone()
        else:
            out[prefix + k] = t.clone()
    return out


def make_mtp_tensors(cfg, gen):
    """Tensors of one MTP/NextN block stored as layer `num_hidden_layers`, official names (doc section 2/3.7)."""
    tc = cfg.text_config.to_dict()
    L = cfg.text_config.num_hidden_layers
    for key in ("layer_types", "indexer_types", "mlp_layer_types"):
        tc[key] = list(tc[key]) + [{"layer_types": DSA, "indexer_types": "full", "mlp_layer_types": "sparse"}[key]]
    tc["num_hidden_layers"] = L + 1
    tc.pop("model_type", None)
    cfg2 = type(cfg.text_config)(**tc)
    attn = glm_mod.Glm5NextTextAttention(cfg2, L)
    moe = glm_mod.Glm5NextTextMoE(cfg2)
    items = [("self_attn." + k, v) for k, v in attn.state_dict().items()]
    items += [("mlp." + k, v) for k, v in moe.state_dict().items()]
    H = cfg.text_config.hidden_size
    items += [("enorm.weight", torch.empty(H)), ("hnorm.weight", torch.empty(H)),
              ("eh_proj.weight", torch.empty(H, 2 * H)), ("shared_head.norm.weight", torch.empty(H)),
              ("input_layernorm.weight", torch.empty(H)), ("post_attention_layernorm.weight", torch.empty(H))]
    items = [(k, v.detach().clone().float()) for k, v in items]
    randomise_(items, cfg.text_config, gen)
    return module_to_hub_experts(f"{LM}layers.{L}.", items)


# ----------------------------------------------------------------------------------------------------------
# Checkpoint I/O
# ----------------------------------------------------------------------------------------------------------

def read_checkpoint(d):
    """-> (ordered dict name -> tensor, dict name -> file) for a saved checkpoint dir."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        files = sorted(set(wm.values()))
    else:
        files = ["model.safetensors"]
    tensors, where = {}, {}
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as sf:
            for k in sf.keys():
                tensors[k] = sf.get_tensor(k)
                where[k] = f
    return tensors, where


def write_checkpoint(d, tensors, where):
    files = sorted(set(where.values()))
    if len(files) > 1:  # renumber consecutively (stripping model.visual.* may have emptied a shard)
        ren = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
        where = {k: ren[f] for k, f in where.items()}
        files = sorted(set(where.values()))
    for f in files:
        part = {k: v.contiguous() for k, v in tensors.items() if where[k] == f}
        save_file(dict(sorted(part.items())), os.path.join(d, f), metadata={"format": "pt"})
    idx = os.path.join(d, "model.safetensors.index.json")
    if len(files) > 1:
        total = sum(v.numel() * v.element_size() for v in tensors.values())
        wm = {k: where[k] for k in sorted(tensors)}
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, open(idx, "w"), indent=2)
    elif os.path.exists(idx):
        os.remove(idx)


def fp8_quantize(w, block):
    rows, cols = w.shape
    br, bc = block
    gr, gc = -(-rows // br), -(-cols // bc)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    sinv = torch.empty(gr, gc, dtype=torch.float32)
    for i in range(gr):
        for j in range(gc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].float()
            amax = blk.abs().max().item()
            scale = amax / FP8_MAX if amax > 0 else 1.0
            sinv[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (blk / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, sinv


def fp8_dequantize(q, sinv, block):
    rows, cols = q.shape
    br, bc = block
    s = sinv.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    return q.float() * s


def dequantized_f32(tensors, qcfg):
    """On-disk tensors -> float32 state dict in hub names (scale_inv consumed)."""
    out = {}
    block = tuple(qcfg["weight_block_size"]) if qcfg else None
    for k, t in tensors.items():
        if k.endswith("_scale_inv"):
            continue
        sk = k + "_scale_inv"
        if sk in tensors:
            out[k] = fp8_dequantize(t, tensors[sk], block)
        else:
            out[k] = t.float()
    return out


def check_hub_layout(names, cfg):
    """Assert the checkpoint uses the official hub names (architecture doc section 2), not module names."""
    bad = [n for n in names if any(s in n for s in (".forget_gate.", "attn_hc.", "ffn_hc.", "self_attn.conv1d."))
           or n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))]
    bad += [n for n in names if not (n.startswith(LM) or n.startswith("model.visual.") or n.startswith("lm_head."))]
    if bad:
        raise RuntimeError(f"module-layout names in checkpoint: {bad[:8]}")
    tc = cfg.text_config
    for i, lt in enumerate(tc.layer_types):
        p = f"{LM}layers.{i}."
        need = [p + f"hc_{s}_{x}" for s in ("attn", "ffn") for x in ("fn", "base", "scale")]
        if lt == KDA:
            need += [p + "self_attn." + x for x in ("A_log", "dt_bias", "f_a_proj.weight", "f_b_proj.weight",
                                                     "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")]
        else:
            need += [p + "self_attn.q_a_proj.weight", p + "self_attn.kv_b_proj.weight"]
            if tc.indexer_types[i] == "full":
                need += [p + "self_attn.indexer." + x for x in ("wq_b.weight", "wk.weight", "k_norm.weight",
                                                                 "k_norm.bias", "weights_proj.weight",
                                                                 "index_kpool_compress_ape",
                                                                 "index_kpool_compress_gate")]
        if tc.mlp_layer_types[i] == "sparse":
            need += [p + "mlp.gate.weight", p + "mlp.gate.e_score_correction_bias",
                     p + "mlp.shared_experts.gate_proj.weight"]
            need += [p + f"mlp.experts.{e}.{w}_proj.weight" for e in range(tc.n_routed_experts)
                     for w in ("gate", "up", "down")]
        else:
            need += [p + "mlp.gate_proj.weight"]
    missing = [n for n in need if n not in names]
    if missing:
        raise RuntimeError(f"hub-layout tensors missing: {missing[:8]}")


# ----------------------------------------------------------------------------------------------------------
# top-k margin recorder
# ----------------------------------------------------------------------------------------------------------

class TopkMargins:
    """Monkeypatches torch.topk / Tensor.topk; records, for calls with k < n, the gap between the k-th and
    (k+1)-th largest value of every row whose (k+1)-th value is not masked (> -1e30)."""

    def __init__(self, margin):
        self.margin = margin
        self.reset()

    def reset(self):
        self.min_rel_gap = {}
        self.violations = {}
        self.calls = 0

    def _record(self, inp, k, dim, largest, who):
        n = inp.shape[dim]
        if k >= n:
            return
        self.calls += 1
        x = inp.detach().float()
        if not largest:
            x = -x
        vals = self._orig_torch(x, k + 1, dim=dim, largest=True, sorted=True).values
        vals = vals.movedim(dim, -1)
        a, b = vals[..., k - 1], vals[..., k]
        valid = b > -1e30
        if not bool(valid.any()):
            return
        rel = ((a - b) / torch.clamp(torch.maximum(a.abs(), b.abs()), min=1.0))[valid]
        m = float(rel.min())
        self.min_rel_gap[who] = min(self.min_rel_gap.get(who, float("inf")), m)
        nv = int((rel < self.margin).sum())
        if nv:
            self.violations[who] = self.violations.get(who, 0) + nv

    def __enter__(self):
        self._orig_torch = torch.topk
        self._orig_tensor = torch.Tensor.topk
        rec = self

        def who():
            f = sys._getframe(2)
            s = f.f_locals.get("self")
            return type(s).__name__ if s is not None else f.f_code.co_name

        def topk_fn(input, k, dim=-1, largest=True, sorted=True, **kw):
            rec._record(input, k, dim, largest, who())
            return rec._orig_torch(input, k, dim=dim, largest=largest, sorted=sorted, **kw)

        def topk_m(self_, k, dim=-1, largest=True, sorted=True):
            rec._record(self_, k, dim, largest, who())
            return rec._orig_tensor(self_, k, dim, largest, sorted)

        torch.topk = topk_fn
        torch.Tensor.topk = topk_m
        return self

    def __exit__(self, *a):
        torch.topk = self._orig_torch
        torch.Tensor.topk = self._orig_tensor
        return False


# ----------------------------------------------------------------------------------------------------------
# Reference runs
# ----------------------------------------------------------------------------------------------------------

@torch.no_grad()
def forward_full(model, ids):
    return model(input_ids=ids, use_cache=False).logits[0].float()


@torch.no_grad()
def forward_incremental(model, ids, n):
    out = model(input_ids=ids[:, :n], use_cache=True)
    pkv = out.past_key_values
    rows = [out.logits[0].float()]
    for t in range(n, ids.shape[1]):
        out = model(input_ids=ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        rows.append(out.logits[0].float())
    return torch.cat(rows, 0)


def prefix_lengths(T, mode):
    if mode == "all":
        return list(range(1, T))
    s = set(range(1, T, 7)) | set(range(max(1, T - 20), T))
    return sorted(s)


@torch.no_grad()
def sensitivity(model, ids, full, cfg):
    """max |dlogits| when one block's output is zeroed, per layer and site, plus dense-indexer and bias checks."""
    tc = cfg.text_config
    layers = model.model.language_model.layers
    res = {}

    def zero_hook(mod, inp, out):
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]),) + tuple(out[1:])
        return torch.zeros_like(out)

    for i, layer in enumerate(layers):
        for site, mod in (("attn", layer.self_attn), ("mlp", layer.mlp)):
            h = mod.register_forward_hook(zero_hook)
            try:
                d = (forward_full(model, ids) - full).abs().max().item()
            finally:
                h.remove()
            res[f"L{i}.{site}"] = d
        # mHC parameters
        hc = layer.attn_hc
        old = hc.base.detach().clone()
        hc.base.add_(0.5)
        res[f"L{i}.hc_base"] = (forward_full(model, ids) - full).abs().max().item()
        hc.base.copy_(old)
        if tc.mlp_layer_types[i] == "sparse":
            g = layer.mlp.gate
            old = g.e_score_correction_bias.detach().clone()
            g.e_score_correction_bias.zero_()
            res[f"L{i}.e_score_bias"] = (forward_full(model, ids) - full).abs().max().item()
            g.e_score_correction_bias.copy_(old)
    # dense attention instead of indexer selection
    idx = [l.self_attn.indexer for i, l in enumerate(layers)
           if tc.layer_types[i] == DSA and l.self_attn.indexer is not None]
    olds = [m.index_topk for m in idx]
    for m in idx:
        m.index_topk = (ids.shape[1] // m.index_kpool + 1) * m.index_kpool  # >= every pool
    res["indexer_dense"] = (forward_full(model, ids) - full).abs().max().item()
    for m, o in zip(idx, olds):
        m.index_topk = o
    return res


@torch.no_grad()
def activation_stats(model, ids, cfg):
    """Fraction of SwiGLU gate/up pre-activations hit by the clamp."""
    tc = cfg.text_config
    lim = tc.swiglu_limit
    hits, total = [0], [0]
    hooks = []

    def lin_hook(mod, inp, out):
        hits[0] += int((out.abs() > lim).sum())
        total[0] += out.numel()

    for layer in model.model.language_model.layers:
        mlp = layer.mlp
        for lin in ([mlp.gate_proj, mlp.up_proj] if hasattr(mlp, "gate_proj") else
                    [mlp.shared_experts.gate_proj, mlp.shared_experts.up_proj]):
            hooks.append(lin.register_forward_hook(lin_hook))
    try:
        forward_full(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return hits[0] / max(total[0], 1)


def load_reference_model(ckpt_dir, cfg_json, device, tmp):
    """Load a float32 model from the exact on-disk values (upcast/dequantised), through from_pretrained."""
    tensors, _ = read_checkpoint(ckpt_dir)
    qcfg = cfg_json.get("quantization_config")
    f32 = dequantized_f32(tensors, qcfg)
    L = cfg_json["text_config"]["num_hidden_layers"]
    f32 = {k: v for k, v in f32.items() if not k.startswith(f"{LM}layers.{L}.")}  # MTP block: not in the model
    ref_dir = os.path.join(tmp, "ref_f32")
    os.makedirs(ref_dir, exist_ok=True)
    c = copy.deepcopy(cfg_json)
    c.pop("quantization_config", None)
    c["dtype"] = "float32"
    c["text_config"]["dtype"] = "float32"
    c["text_config"]["num_nextn_predict_layers"] = 0
    json.dump(c, open(os.path.join(ref_dir, "config.json"), "w"))
    save_file(f32, os.path.join(ref_dir, "model.safetensors"), metadata={"format": "pt"})
    model, info = Glm5NextForConditionalGeneration.from_pretrained(
        ref_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.startswith("model.visual.")]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise RuntimeError(f"reference load mismatch: missing={missing[:5]} unexpected={info['unexpected_keys'][:5]}"
                           f" mismatched={info.get('mismatched_keys')}")
    # every loaded parameter must equal the on-disk value (catches silent renames / dtype casts)
    chk, _ = read_checkpoint(ref_dir)
    sd = model.state_dict()
    for k, v in chk.items():
        if k.startswith("model.visual.") and not any(n.startswith("model.visual.") for n in tensors):
            continue
        mk = k
        for a, b in ((".self_attn.f_a_proj.", ".self_attn.forget_gate.f_a_proj."),
                     (".self_attn.f_b_proj.", ".self_attn.forget_gate.f_b_proj."),
                     (".self_attn.dt_bias", ".self_attn.forget_gate.dt_bias"),
                     (".self_attn.A_log", ".self_attn.forget_gate.A_log"),
                     ("hc_attn_", "attn_hc."), ("hc_ffn_", "ffn_hc.")):
            mk = mk.replace(a, b)
        if mk in sd and not torch.equal(sd[mk].float().cpu(), v):
            raise RuntimeError(f"loaded value differs from disk for {k}")
    # merged module layouts: experts.gate_up_proj = [gate; up] per expert, conv1d = [q; k; v] conv
    for mk, t in sd.items():
        p = mk.rsplit(".", 1)[0] + "."
        if mk.endswith("mlp.experts.gate_up_proj"):
            for e in range(t.shape[0]):
                ref = torch.cat([chk[f"{p}{e}.gate_proj.weight"], chk[f"{p}{e}.up_proj.weight"]], 0)
                assert torch.equal(t[e].float().cpu(), ref), mk
        elif mk.endswith("mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                assert torch.equal(t[e].float().cpu(), chk[f"{p}{e}.down_proj.weight"]), mk
        elif mk.endswith("self_attn.conv1d.weight"):
            pp = mk[: -len("conv1d.weight")]
            ref = torch.cat([chk[pp + f"{c}_conv1d.weight"] for c in "qkv"], 0)
            assert torch.equal(t.float().cpu(), ref), mk
    want_lb = cfg_json["text_config"]["linear_attn_config"].get("gate_lower_bound")
    if model.config.text_config.linear_lower_bound != want_lb:
        raise RuntimeError(f"KDA gate bound parsed as {model.config.text_config.linear_lower_bound}, want {want_lb}")
    model.eval()
    return model.to(device), f32


# ----------------------------------------------------------------------------------------------------------
# One fixture
# ----------------------------------------------------------------------------------------------------------

def build_candidate(v, seed, stage):
    """Build + save the checkpoint for (variant, seed) into `stage`. Returns (cfg, config.json dict)."""
    cfg = build_config(v)
    torch.manual_seed(seed)
    model = Glm5NextForConditionalGeneration(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    params = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                               if n.endswith("e_score_correction_bias")]
    randomise_(params, cfg.text_config, gen)
    raw = os.path.join(stage, "raw")
    kw = {}
    if v["shards"]:  # aim at v["shards"] text shards (visual tensors are stripped afterwards)
        nbytes = sum(t.numel() * t.element_size() for n, t in model.state_dict().items()
                     if not n.startswith("model.visual."))
        kw["max_shard_size"] = int(nbytes / (v["shards"] - 0.5))
    model.save_pretrained(raw, safe_serialization=True, **kw)
    del model
    tensors, where = read_checkpoint(raw)
    check_hub_layout(set(tensors), cfg)
    last_file = sorted(set(where.values()))[-1]
    if not v["vision"]:
        for k in [k for k in tensors if k.startswith("model.visual.")]:
            del tensors[k], where[k]
    if v["mtp"]:
        for k, t in make_mtp_tensors(cfg, gen).items():
            tensors[k] = t
            where[k] = last_file
    cfg_json = json.load(open(os.path.join(raw, "config.json")))
    tc = cfg_json["text_config"]
    dt = v["dtype"]
    if dt in ("bf16", "fp8"):
        cfg_json["dtype"] = "bfloat16"
        tc["dtype"] = "bfloat16"
        for k in list(tensors):
            t = tensors[k]
            if dt == "fp8" and is_fp8_name(k, v["text"]):
                q, s = fp8_quantize(t, FP8_BLOCK)
                tensors[k] = q
                sk = k + "_scale_inv"
                tensors[sk] = s
                where[sk] = where[k]
            elif k.endswith(F32_KEEP_SUFFIXES) or (dt == "bf16" and "conv1d" in k):
                tensors[k] = t.float()
            else:
                tensors[k] = t.to(torch.bfloat16)
    if dt == "fp8":
        not_conv = sorted({k[: -len(".weight")] for k, t in tensors.items()
                           if k.endswith(".weight") and t.dim() == 2 and t.dtype != torch.float8_e4m3fn})
        cfg_json["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                           "weight_block_size": list(FP8_BLOCK),
                                           "modules_to_not_convert": not_conv}
    tc["num_nextn_predict_layers"] = 1 if v["mtp"] else 0
    out = os.path.join(stage, "ckpt")
    os.makedirs(out, exist_ok=True)
    write_checkpoint(out, tensors, where)
    json.dump(cfg_json, open(os.path.join(out, "config.json"), "w"), indent=2, sort_keys=True)
    return cfg, cfg_json


def run_variant(v, args, device):
    name = v["name"]
    T, N = v["T"], v["prefill"]
    rejected = []
    t0 = time.time()
    for attempt in range(args.max_seeds):
        seed = 1000 + attempt
        stage = tempfile.mkdtemp(prefix=f"golden_{name}_")
        try:
            cfg, cfg_json = build_candidate(v, seed, stage)
            model, f32 = load_reference_model(os.path.join(stage, "ckpt"), cfg_json, device, stage)
            g = torch.Generator().manual_seed(seed)
            tokens = torch.randint(1, cfg.text_config.vocab_size, (T,), generator=g)
            ids = tokens[None].to(device)
            margins = TopkMargins(args.margin)
            with margins:
                full = forward_full(model, ids)
                if margins.violations:
                    rejected.append((seed, f"topk tie in full forward {margins.violations} "
                                           f"min_gap={margins.min_rel_gap}"))
                    continue
                inc = forward_incremental(model, ids, N)
                d_inc = (inc - full).abs().max().item()
                if margins.violations:
                    rejected.append((seed, f"topk tie in incremental run {margins.violations}"))
                    continue
                if d_inc > args.tol:
                    rejected.append((seed, f"incremental != full (max diff {d_inc:.3g})"))
                    continue
                d_pre, worst = 0.0, None
                for L in prefix_lengths(T, args.prefixes):
                    d = (forward_full(model, ids[:, :L]) - full[:L]).abs().max().item()
                    if d > d_pre:
                        d_pre, worst = d, L
                    if d > args.tol:
                        break
                if margins.violations:
                    rejected.append((seed, f"topk tie in a prefix forward {margins.violations}"))
                    continue
                if d_pre > args.tol:
                    rejected.append((seed, f"non-causal: prefix {worst} differs by {d_pre:.3g}"))
                    continue
            std = full.std().item()
            mx = full.abs().max().item()
            if not (0.5 <= std <= 8.0):
                rejected.append((seed, f"logit std {std:.3g} outside [0.5, 8]"))
                continue
            sens = sensitivity(model, ids, full, cfg)
            weak = {k: d for k, d in sens.items() if d < args.min_effect}
            if weak:
                rejected.append((seed, f"blocks with no visible effect: {weak}"))
                continue
            clamp_frac = activation_stats(model, ids, cfg)
            # --- accepted: write the fixture
            dst = os.path.join(args.out, name)
            if os.path.exists(dst):
                shutil.rmtree(dst)
            shutil.copytree(os.path.join(stage, "ckpt"), dst)
            np.save(os.path.join(dst, "ref_full.npy"), full.cpu().numpy().astype("<f4"))
            np.save(os.path.join(dst, "ref_incremental.npy"), inc.cpu().numpy().astype("<f4"))
            tc = cfg.text_config
            kp = tc.index_kpool
            knobs = dict(
                hc_mult=tc.hc_mult, index_kpool=kp, index_topk=tc.index_topk,
                index_pools_selected=tc.index_topk // kp, index_n_heads=tc.index_n_heads,
                complete_pools_at_T=T // kp, indexer_drops_positions=(T // kp) > tc.index_topk // kp,
                layer_types=list(tc.layer_types), indexer_types=list(tc.indexer_types),
                mlp_layer_types=list(tc.mlp_layer_types),
                gate_lower_bound=tc.linear_lower_bound, kda_gate="bounded_sigmoid" if tc.linear_lower_bound
                is not None else "softplus",
                norm_topk_prob=tc.norm_topk_prob, n_group=tc.n_group, topk_group=tc.topk_group,
                n_routed_experts=tc.n_routed_experts, num_experts_per_tok=tc.num_experts_per_tok,
                n_shared_experts=tc.n_shared_experts, routed_scaling_factor=tc.routed_scaling_factor,
                swiglu_limit=tc.swiglu_limit, swiglu_clamp_fraction=round(clamp_frac, 4),
                hidden_size=tc.hidden_size, vocab_size=tc.vocab_size, num_hidden_layers=tc.num_hidden_layers,
                weights=v["dtype"], sharded=bool(v["shards"]),
                num_shards=len([f for f in os.listdir(dst) if f.endswith(".safetensors")]),
                mtp_layer=v["mtp"], vision_tensors=v["vision"],
                fp8_weight_block_size=list(FP8_BLOCK) if v["dtype"] == "fp8" else None,
                kda_chunk_size=64,
            )
            meta = dict(
                name=name, description=v["description"], tokens=[int(x) for x in tokens], T=T, prefill=N,
                dtype={"f32": "float32", "bf16": "bfloat16", "fp8": "float8_e4m3fn-block"}[v["dtype"]],
                knobs=knobs, seed=seed, rejected_seeds=[dict(seed=s, reason=r) for s, r in rejected],
                transformers_version=transformers.__version__, torch_version=torch.__version__,
                device=str(device), attn_implementation="eager", tf32=False,
                max_abs_logit=mx, logit_std=std,
                max_abs_full_minus_incremental=d_inc, max_abs_full_minus_prefix=d_pre,
                prefix_check=args.prefixes, tolerance=args.tol,
                topk_margin=args.margin, min_topk_rel_gap=margins.min_rel_gap, topk_calls_checked=margins.calls,
                sensitivity_max_abs_dlogit=sens,
                reference_note="logits computed by transformers in float32 from the on-disk values "
                               "(bf16 upcast / fp8 dequantised W = fp8 * weight_scale_inv per block)",
            )
            json.dump(meta, open(os.path.join(dst, "meta.json"), "w"), indent=1)
            gen_cfg = os.path.join(dst, "generation_config.json")
            if os.path.exists(gen_cfg):
                os.remove(gen_cfg)
            print(f"[{name}] seed {seed} accepted in {time.time() - t0:.1f}s: std={std:.3f} max|logit|={mx:.3f} "
                  f"max|full-inc|={d_inc:.3g} max|full-prefix|={d_pre:.3g} (worst prefix {worst}) "
                  f"min topk gap={ {k: round(x, 6) for k, x in margins.min_rel_gap.items()} } "
                  f"clamp={clamp_frac:.3f} weakest block={min(sens.items(), key=lambda kv: kv[1])}", flush=True)
            return dict(name=name, T=T, N=N, d_inc=d_inc, d_pre=d_pre, max_logit=mx, seed=seed, rejected=rejected)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            gc.collect()
        # (continue jumps here)
    for s, r in rejected:
        print(f"[{name}] rejected seed {s}: {r}")
    raise SystemExit(f"[{name}] no acceptable seed in {args.max_seeds} tries")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--only", default=None, help="generate only this fixture (name)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--max-seeds", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-4, help="max |diff| for causality / incremental checks")
    ap.add_argument("--margin", type=float, default=1e-4, help="min relative top-k gap")
    ap.add_argument("--min-effect", type=float, default=1e-2, help="min max|dlogit| when a block is zeroed")
    ap.add_argument("--prefixes", choices=["auto", "all", "sparse"], default="auto",
                    help="check every prefix length, or every 7th + the last 20 (auto: all on cuda, sparse on cpu)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()

    if args.list:
        for v in VARIANTS:
            print(f"{v['name']}: {v['description']}")
        return
    device = torch.device(args.device)
    if args.prefixes == "auto":
        args.prefixes = "all" if device.type == "cuda" else "sparse"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.out, exist_ok=True)
    todo = [v for v in VARIANTS if args.only in (None, v["name"])]
    if not todo:
        raise SystemExit(f"unknown fixture {args.only}; known: {[v['name'] for v in VARIANTS]}")
    rows = []
    for v in todo:
        rows.append(run_variant(v, args, device))
    print()
    print(f"{'fixture':40s} {'T':>4s} {'N':>4s} {'max|full-inc|':>14s} {'max|full-pre|':>14s} {'max|logit|':>10s} "
          f"{'seed':>5s}  rejected")
    for r in rows:
        rej = ", ".join(f"{s}: {why}" for s, why in r["rejected"]) or "-"
        print(f"{r['name']:40s} {r['T']:4d} {r['N']:4d} {r['d_inc']:14.3g} {r['d_pre']:14.3g} {r['max_logit']:10.3f} "
              f"{r['seed']:5d}  {rej}")
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"total size of {args.out}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
