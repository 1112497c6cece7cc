#!/usr/bin/env python3
"""Train the embedded default model, models/glm5-nano: a small glm5_next with every block type of GLM-5.3-Flash.

Runs on the GPU machine (transformers 5.17's own Glm5NextForConditionalGeneration, torch with CUDA):

    python3 tools/train_nano.py --out DIR [--minutes 8]
    python3 tools/train_nano.py --out DIR2 --init DIR --seed 54 --lr 1e-3   # continue DIR on new conversations

flash-linear-attention's Triton KDA kernels are used when installed (checked first with --kda-check); --profile
prints where a training step's time goes.

Stages:
  1. tokenizer   byte-level BPE (HF tokenizers) with GLM-4's pre-tokenizer regex and GLM-5.3's added tokens,
                 trained on rendered conversations; vocabulary padded to VOCAB
  2. data        tools/nano_data.py conversations rendered with the GLM-5.3 chat template by
                 transformers' apply_chat_template; loss on the assistant turns only (their text, the closing tag
                 and the turn marker that follows: <|user|> at the end, <|observation|> after a tool call)
  3. train       AdamW, bf16 autocast, time-budgeted cosine schedule; aux-free expert balancing (the router's
                 e_score_correction_bias follows the expert loads, as DeepSeek-V3 trains it); the MTP/NextN layer
                 (doc 3.7) trained on the detached trunk to predict the token after next
  4. save        hub layout (per-expert tensors, F32 where the release keeps F32) plus the MTP layer stored as
                 layers.{num_hidden_layers}, BF16; config, generation config, tokenizer files, chat template
  5. evaluate    teacher-forced exact match per task on held-out conversations, greedy transformers generations
                 on a few prompts (eval.json) and transformers' decode speed on this GPU

The indexer is not trained (transformers runs it under no_grad, as DeepSeek's DSA trains it in a separate
stage); index_topk covers 1024 tokens, so up to that length attention is dense and the indexer is not consulted.
"""

import argparse
import copy
import json
import math
import multiprocessing
import os
import random
import shutil
import sys
import time

# No kernels from the hub (the GPU machine is offline). flash-linear-attention's Triton KDA kernels are used when the
# package is installed (`--kda-check` compares them with transformers' torch reference first); NANO_TORCH_KDA=1 or
# its absence leaves transformers on the torch loops, which are exact but launch-bound.
os.environ.setdefault("USE_HUB_KERNELS", "0")
sys.modules.setdefault("causal_conv1d", None)
if os.environ.get("NANO_TORCH_KDA") == "1":
    sys.modules.setdefault("fla", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration, PreTrainedTokenizerFast  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next as glm_mod  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nano_data  # noqa: E402
from make_golden import DSA, F32_KEEP_SUFFIXES, KDA, LM, module_to_hub_experts, read_checkpoint  # noqa: E402
from make_golden import write_checkpoint  # noqa: E402
from make_serve_fixture import SPECIAL, TAGS, write_text_files  # noqa: E402

transformers.logging.set_verbosity_error()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The GLM-5.3 chat template (shared/data/glm53_chat_template.jinja), as the serve fixture carries it: the copy
# inside the repository is the one that travels to the GPU machine.
TEMPLATE = os.path.join(ROOT, "tests", "data", "serve_model", "chat_template.jinja")
VOCAB = 3072
# GLM-4/GLM-5's pre-tokenizer split (cl100k family: numbers in runs of up to three digits)
GLM4_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
MAX_LEN = 1024

TEXT_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=0, v_head_dim=64,
    n_routed_experts=24, num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1,
    norm_topk_prob=True, routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc",
    index_n_heads=4, index_head_dim=32, index_topk=MAX_LEN, index_kpool=4, index_kpool_always_select_tail=True,
    hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, rms_norm_eps=1e-5, swiglu_limit=10.0,
    hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
    num_nextn_predict_layers=0, max_position_embeddings=4096,
    layer_types=[KDA, KDA, KDA, DSA, KDA, KDA, KDA, DSA],
    indexer_types=["full"] * 8,
    mlp_layer_types=["dense"] + ["sparse"] * 7,
    linear_attn_config=dict(num_heads=4, head_dim=64, short_conv_kernel_size=4, gate_lower_bound=-5.0),
)
VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, projection_intermediate_size=32,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ------------------------------------------------------------------------------------------------------------------
# 1. tokenizer and rendering
# ------------------------------------------------------------------------------------------------------------------

def chat_tokenizer(tok):
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = open(TEMPLATE, encoding="utf-8").read()
    return fast


def render(fast, sample, upto, generation_prompt):
    kwargs = {"enable_thinking": sample["enable_thinking"]}
    if sample["reasoning_effort"]:
        kwargs["reasoning_effort"] = sample["reasoning_effort"]
    return fast.apply_chat_template(sample["messages"][:upto], tools=sample["tools"], tokenize=False,
                                    add_generation_prompt=generation_prompt, **kwargs)


def render_with_spans(fast, sample):
    """-> (text, [(start, end) character spans the loss covers])."""
    messages = sample["messages"]
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(render(fast, sample, i, True))
        end = len(render(fast, sample, i + 1, False))
        spans.append([start, end])
    text = render(fast, sample, len(messages), False) + "<|user|>"
    for span in spans:  # the turn marker after each assistant turn is its stop token: learn it too
        rest = text[span[1]:].lstrip("\n")
        marker = next(t for t in ("<|user|>", "<|observation|>") if rest.startswith(t))
        span[1] = len(text) - len(rest) + len(marker)
    return text, spans


def train_tokenizer(samples):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n_added = len(SPECIAL) + len(TAGS)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - n_added, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    plain = chat_tokenizer(Tokenizer(models.BPE()))
    corpus = []
    for s in samples:  # the added tokens are whole tokens: keep them out of the merges
        text = render(plain, s, len(s["messages"]), False)
        for t in SPECIAL + TAGS:
            text = text.replace(t, "\n")
        corpus.append(text)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


_WORKER = {}


def _init_worker(tok_json):
    _WORKER["fast"] = chat_tokenizer(Tokenizer.from_str(tok_json))


def _encode(sample):
    fast = _WORKER["fast"]
    text, spans = render_with_spans(fast, sample)
    enc = fast.backend_tokenizer.encode(text, add_special_tokens=False)
    ids = np.array(enc.ids, dtype=np.int32)
    starts = np.array([o[0] for o in enc.offsets])
    mask = np.zeros(len(ids), dtype=bool)
    for a, b in spans:
        mask |= (starts >= a) & (starts < b)
    return ids, mask


def encode_all(tok, samples, workers, max_len):
    with multiprocessing.Pool(workers, _init_worker, (tok.to_str(),)) as pool:
        out = pool.map(_encode, samples, chunksize=256)
    return [(ids, mask) for ids, mask in out if len(ids) <= max_len]


# ------------------------------------------------------------------------------------------------------------------
# 3. model, MTP layer, training
# ------------------------------------------------------------------------------------------------------------------

class NextNLayer(nn.Module):
    """The MTP/NextN block (doc 3.7): plain pre-norm MLA+DSA and MoE, no mHC, shared embedding and head."""

    def __init__(self, text_cfg):
        super().__init__()
        cfg = copy.deepcopy(text_cfg)
        n = cfg.num_hidden_layers
        cfg.layer_types = list(cfg.layer_types) + [DSA]
        cfg.indexer_types = list(cfg.indexer_types) + ["full"]
        cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        cfg.num_hidden_layers = n + 1
        h = cfg.hidden_size
        self.enorm = glm_mod.Glm5NextTextRMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = glm_mod.Glm5NextTextRMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = glm_mod.Glm5NextTextRMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = glm_mod.Glm5NextTextAttention(cfg, n)
        self.post_attention_layernorm = glm_mod.Glm5NextTextRMSNorm(h, cfg.rms_norm_eps)
        self.mlp = glm_mod.Glm5NextTextMoE(cfg)
        self.shared_head_norm = glm_mod.Glm5NextTextRMSNorm(h, cfg.rms_norm_eps)

    def forward(self, trunk_hidden, next_embeds):
        """Row p: (final hidden at p, embedding of token p+1) -> hidden that predicts token p+2."""
        next_embeds = next_embeds.clone()
        next_embeds[:, 0] = 0  # the row at position 0 gets no embedding (doc 3.7)
        x = self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(trunk_hidden)], dim=-1))
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        attn, _, _ = self.self_attn(self.input_layernorm(x), attention_mask=mask)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return self.shared_head_norm(x)

    def hub_tensors(self, layer):
        items = [("enorm.weight", self.enorm.weight), ("hnorm.weight", self.hnorm.weight),
                 ("eh_proj.weight", self.eh_proj.weight), ("shared_head.norm.weight", self.shared_head_norm.weight),
                 ("input_layernorm.weight", self.input_layernorm.weight),
                 ("post_attention_layernorm.weight", self.post_attention_layernorm.weight)]
        items += [("self_attn." + k, v) for k, v in self.self_attn.state_dict().items()]
        items += [("mlp." + k, v) for k, v in self.mlp.state_dict().items()]
        return module_to_hub_experts(f"{LM}layers.{layer}.", [(k, v.detach().float().cpu()) for k, v in items])


def module_state_from_hub(tensors, prefix):
    """Inverse of NextNLayer.hub_tensors: the tensors under `prefix` (hub names, one matrix per expert) -> the
    module's state dict (experts fused as transformers holds them: gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
    state, gate, up, down = {}, {}, {}, {}
    for name, t in tensors.items():
        if not name.startswith(prefix):
            continue
        k = name[len(prefix):]
        parts = k.split(".")
        if "experts" in parts and parts[-1] == "weight" and parts[-2] in ("gate_proj", "up_proj", "down_proj"):
            i = parts.index("experts")
            base, e = ".".join(parts[:i + 1]), int(parts[i + 1])
            {"gate_proj": gate, "up_proj": up, "down_proj": down}[parts[-2]].setdefault(base, {})[e] = t
        else:
            state["shared_head_norm.weight" if k == "shared_head.norm.weight" else k] = t
    for base in gate:
        n = len(gate[base])
        state[base + ".gate_up_proj"] = torch.stack([torch.cat([gate[base][e], up[base][e]]) for e in range(n)])
        state[base + ".down_proj"] = torch.stack([down[base][e] for e in range(n)])
    return state


def load_initial_weights(model, mtp, directory):
    """Continue training from a checkpoint this script saved: the model through transformers' own loader (hub
    layout), the MTP block from `layers.{num_hidden_layers}`. Shapes must match TEXT_CONFIG."""
    loaded = Glm5NextForConditionalGeneration.from_pretrained(directory, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not k.startswith("model.visual.")]
    assert not missing and not unexpected, (missing, unexpected)
    tensors, _ = read_checkpoint(directory)
    layer = model.config.text_config.num_hidden_layers
    state = module_state_from_hub(tensors, f"{LM}layers.{layer}.")
    mtp.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    log(f"init: model and MTP weights from {directory}")


class ExpertBalancer:
    """Aux-loss-free balancing: after each step every router's bias moves toward under-used experts."""

    def __init__(self, routers, rate):
        self.routers, self.rate = routers, rate
        self.counts = [None] * len(routers)
        for i, r in enumerate(routers):
            r.register_forward_hook(self._hook(i))

    def _hook(self, i):
        def hook(module, inputs, output):
            if module.training:
                c = torch.bincount(output[2].flatten(), minlength=module.num_experts).float()
                self.counts[i] = c if self.counts[i] is None else self.counts[i] + c
        return hook

    @torch.no_grad()
    def step(self):
        imbalance = []
        for r, c in zip(self.routers, self.counts):
            if c is None:
                continue
            r.e_score_correction_bias += self.rate * torch.sign(c.mean() - c)
            imbalance.append((c.max() / c.mean().clamp_min(1)).item())
        self.counts = [None] * len(self.routers)
        return max(imbalance) if imbalance else 0.0


def pack_rows(data, row_len, rng):
    """Conversations in random order packed into rows of up to row_len tokens (each starts with [gMASK]<sop>, so
    the model sees where one ends): every batch mixes the tasks and carries no padding."""
    order = list(range(len(data)))
    rng.shuffle(order)
    rows, ids, mask = [], [], []
    for i in order:
        if ids and len(ids) + len(data[i][0]) > row_len:
            rows.append((np.array(ids, dtype=np.int32), np.array(mask, dtype=bool)))
            ids, mask = [], []
        ids += data[i][0].tolist()
        mask += data[i][1].tolist()
    if ids:
        rows.append((np.array(ids, dtype=np.int32), np.array(mask, dtype=bool)))
    return rows


def collate(data, idx, pad, device):
    n = max(len(data[i][0]) for i in idx)
    ids = np.full((len(idx), n), pad, dtype=np.int64)
    mask = np.zeros((len(idx), n), dtype=bool)
    for r, i in enumerate(idx):
        ids[r, :len(data[i][0])] = data[i][0]
        mask[r, :len(data[i][1])] = data[i][1]
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def losses(model, mtp, ids, mask):
    """Main next-token loss and MTP token-after-next loss over the assistant tokens (right padding needs no mask:
    padding only follows the tokens that count)."""
    out = model.model(input_ids=ids)
    hidden = out.last_hidden_state
    logits = model.lm_head(hidden[:, :-1]).float()
    target = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
    main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
    embed_w = model.get_input_embeddings().weight.detach()
    h = mtp(hidden[:, :-2].detach(), F.embedding(ids[:, 1:-1], embed_w))
    mtp_logits = F.linear(h, model.lm_head.weight.detach()).float()
    mtp_target = ids[:, 2:].masked_fill(~mask[:, 2:], -100)
    aux = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]), mtp_target.reshape(-1), ignore_index=-100)
    return main, aux, logits, target


def train(model, mtp, data, args, device, pad):
    params = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")] + list(mtp.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    routers = [m for m in list(model.modules()) + list(mtp.modules()) if isinstance(m, glm_mod.Glm5NextTextTopkRouter)]
    balancer = ExpertBalancer(routers, 1e-3)
    rng = random.Random(1)
    budget = args.minutes * 60
    start = time.time()
    step, epoch, warmup = 0, 0, 100
    model.train()
    mtp.train()
    while True:
        epoch += 1
        rows = pack_rows(data, args.max_len, rng)
        per_batch = max(1, args.batch_tokens // args.max_len)
        for k in range(0, len(rows) - per_batch + 1, per_batch):
            idx = list(range(k, k + per_batch))
            frac = (time.time() - start) / budget
            if frac >= 1 or (args.max_steps and step >= args.max_steps):
                log(f"trained {step} steps, {epoch} epochs, {time.time() - start:.0f} s")
                return step
            lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1))))
            for g in opt.param_groups:
                g["lr"] = lr
            ids, mask = collate(rows, idx, pad, device)
            profiling = args.profile and step == 3
            if profiling:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                    [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
                profiler.__enter__()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                main, aux, _, _ = losses(model, mtp, ids, mask)
            loss = main + 0.3 * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            imbalance = balancer.step()
            if profiling:
                profiler.__exit__(None, None, None)
                averages = profiler.key_averages()
                for key in ("self_cuda_time_total", "self_cpu_time_total"):
                    if key == "self_cuda_time_total" and device.type != "cuda":
                        continue
                    log(f"profile of step 4 by {key}:\n" + averages.table(sort_by=key, row_limit=25))
                log(f"profile: {sum(a.count for a in averages)} op calls in step 4")
            step += 1
            if step % 50 == 0 or step == 1:
                log(f"step {step} ep {epoch} lr {lr:.2e} loss {main.item():.4f} mtp {aux.item():.4f} "
                    f"gnorm {norm.item():.2f} max/mean expert load {imbalance:.2f} tokens {ids.numel()}"
                    + (f" peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else ""))


# ------------------------------------------------------------------------------------------------------------------
# 4. save, 5. evaluate
# ------------------------------------------------------------------------------------------------------------------

def save(model, mtp, tok, out, tmp):
    raw = os.path.join(tmp, "raw")
    model.save_pretrained(raw, safe_serialization=True)
    tensors, where = read_checkpoint(raw)
    for k in [k for k in tensors if k.startswith("model.visual.")]:
        del tensors[k], where[k]
    last = sorted(set(where.values()))[-1]
    for k, t in mtp.hub_tensors(model.config.text_config.num_hidden_layers).items():
        tensors[k], where[k] = t, last
    for k in list(tensors):
        keep_f32 = k.endswith(F32_KEEP_SUFFIXES) or "conv1d" in k
        tensors[k] = tensors[k].float() if keep_f32 else tensors[k].to(torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    write_checkpoint(out, tensors, where)

    cfg = json.load(open(os.path.join(raw, "config.json")))
    cfg["dtype"] = "bfloat16"
    cfg["text_config"].update(dtype="bfloat16", num_nextn_predict_layers=1)
    write_text_files(out, tok, cfg, TEMPLATE)


@torch.no_grad()
def teacher_forced_accuracy(model, mtp, data, device, pad):
    """Fraction of held-out conversations whose every assistant token is the model's argmax."""
    model.eval()
    mtp.eval()
    exact, tokens_ok, tokens = 0, 0, 0
    for k in range(0, len(data), 32):
        idx = list(range(k, min(k + 32, len(data))))
        ids, mask = collate(data, idx, pad, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            _, _, logits, target = losses(model, mtp, ids, mask)
        ok = (logits.argmax(-1) == target) | (target == -100)
        exact += ok.all(-1).sum().item()
        tokens_ok += ((logits.argmax(-1) == target) & (target != -100)).sum().item()
        tokens += (target != -100).sum().item()
    return exact / len(data), tokens_ok / max(tokens, 1)


EVAL_PROMPTS = [
    ({"role": "user", "content": "Count from 1 to 20."}, False),
    ({"role": "user", "content": "What is 17 + 25?"}, False),
    ({"role": "user", "content": "Reverse the words: red green blue"}, True),
    ({"role": "user", "content": "Hello!"}, False),
]


@torch.no_grad()
def generate_samples(model, tok, device):
    fast = chat_tokenizer(tok)
    eos = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    results, timing = [], []
    for message, thinking in EVAL_PROMPTS:
        prompt = fast.apply_chat_template([message], tokenize=False, add_generation_prompt=True,
                                          enable_thinking=thinking)
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device=device)
        t0 = time.time()
        out = model.generate(input_ids=ids, max_new_tokens=80, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos[0])
        if device.type == "cuda":
            torch.cuda.synchronize()
        new = out[0, ids.shape[1]:].tolist()
        timing.append((len(new), time.time() - t0))
        results.append({"prompt": prompt, "completion_ids": new, "completion": tok.decode(new, skip_special_tokens=False)})
    n = sum(t[0] for t in timing)
    return results, n / sum(t[1] for t in timing)


def kda_kernel_check(device):
    """Exit status 0 when the KDA kernel transformers dispatches to (fla's chunk_kda when installed) agrees with
    transformers' torch reference on outputs and input gradients; 1 otherwise."""
    import inspect
    kernel = glm_mod.chunk_kimi_delta_attention
    reference = inspect.unwrap(kernel)
    log("kda check: kernel from", "flash-linear-attention" if sys.modules.get("fla") else "transformers (torch)")
    torch.manual_seed(0)
    b, t, h, d = 2, 300, 4, 64
    shapes = [(b, t, h, d)] * 3 + [(b, t, h, d), (b, t, h)]
    base = [torch.randn(s, device=device) for s in shapes]
    base[3] = -5.0 * torch.sigmoid(base[3])  # the forget gate's range: log decay in (-5, 0)
    base[4] = torch.sigmoid(base[4])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what training feeds under autocast
    results = []
    for fn in (kernel, reference):
        xs = [x.to(dtype).requires_grad_(True) for x in base]
        out, _ = fn(xs[0], xs[1], xs[2], g=xs[3], beta=xs[4], initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=True)
        out.float().square().sum().backward()
        results.append([out.detach().float()] + [x.grad.float() for x in xs])
    worst = max(((a - r).abs().max() / r.abs().max().clamp_min(1e-6)).item() for a, r in zip(*results))
    log(f"kda check: worst relative difference {worst:.2e} (output and 5 gradients)")
    return 0 if worst < 5e-2 else 1


def main():
    if "--kda-check" in sys.argv:
        sys.exit(kda_kernel_check(torch.device("cuda" if torch.cuda.is_available() else "cpu")))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--samples", type=int, default=160000)
    ap.add_argument("--batch-tokens", type=int, default=49152)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--max-len", type=int, default=MAX_LEN, help="drop longer conversations (smoke runs)")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables of training step 4")
    ap.add_argument("--init", help="continue from a checkpoint this script saved (its tokenizer and weights)")
    ap.add_argument("--seed", type=int, default=53, help="seed of the generated conversations")
    args = ap.parse_args()
    device = torch.device(args.device)
    t_start = time.time()

    samples = nano_data.make_samples(args.samples, seed=args.seed)
    held_out = nano_data.make_samples(512, seed=9001)
    # A continued run keeps its tokenizer: the token ids are the embedding rows it learned.
    tok = Tokenizer.from_file(os.path.join(args.init, "tokenizer.json")) if args.init else train_tokenizer(samples[:20000])
    log(f"tokenizer: {tok.get_vocab_size()} entries")
    data = encode_all(tok, samples, args.workers, args.max_len)
    val = encode_all(tok, held_out, args.workers, args.max_len)
    n_tok = sum(len(d[0]) for d in data)
    n_loss = sum(int(d[1].sum()) for d in data)
    log(f"data: {len(data)} conversations, {n_tok} tokens ({n_loss} in the loss), longest "
        f"{max(len(d[0]) for d in data)}")
    fast = chat_tokenizer(tok)
    text, spans = render_with_spans(fast, samples[0])
    log("sample:", repr(text), "loss on:", [text[a:b] for a, b in spans])

    pad = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = Glm5NextConfig(text_config=dict(copy.deepcopy(TEXT_CONFIG), pad_token_id=pad), vision_config=dict(VISION, out_hidden_size=256),
                         tie_word_embeddings=False)
    model = Glm5NextForConditionalGeneration(cfg).to(device)
    mtp = NextNLayer(model.config.text_config).to(device)
    for m in mtp.modules():
        model.model.language_model._init_weights(m)
    if args.init:
        load_initial_weights(model, mtp, args.init)
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.visual."))
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters + MTP {n_mtp / 1e6:.2f} M; setup {time.time() - t_start:.0f} s")

    steps = train(model, mtp, data, args, device, pad)
    exact, token_acc = teacher_forced_accuracy(model, mtp, val, device, pad)
    log(f"held-out: exact conversations {exact:.3f}, assistant tokens {token_acc:.4f}")

    save(model.to(torch.float32), mtp.float(), tok, args.out, os.path.join(args.out + ".tmp"))
    shutil.rmtree(args.out + ".tmp", ignore_errors=True)
    samples_out, tok_per_s = generate_samples(model.to(torch.bfloat16).eval(), tok, device)
    for s in samples_out:
        log("generate:", repr(s["completion"]))
    report = {"steps": steps, "minutes": args.minutes, "init": args.init, "seed": args.seed, "held_out_exact": exact, "held_out_token_accuracy": token_acc,
              "parameters": n_params, "mtp_parameters": n_mtp, "transformers_decode_tok_per_s": tok_per_s,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "generations": samples_out, "wall_s": time.time() - t_start}
    json.dump(report, open(os.path.join(args.out, "train_report.json"), "w"), indent=2, ensure_ascii=False)
    log(f"done in {time.time() - t_start:.0f} s; transformers decode {tok_per_s:.1f} tok/s")


if __name__ == "__main__":
    main()
