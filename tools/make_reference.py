#!/usr/bin/env python3
"""Build tiny random Qwen3.5-MoE checkpoints plus float32 reference logits for the Tandem test suite.

Usage:  python3 tools/make_reference.py --out tests/data

Every fixture directory gets config.json + safetensors (in a real on-disk layout), reference.json
({ids, prefill, vocab_size, description}) and logits.npy (float32 [len(ids), vocab]). Row t holds the
logits after feeding ids[t]: ids[:prefill] go through ONE forward call (HF chunked DeltaNet path), the
rest are fed one at a time through the returned cache (HF recurrent DeltaNet path).

The reference is HF transformers itself (eager attention, eager experts, CPU, float32). Weights are
drawn with numpy (stable streams across torch versions) and are rounded to the dtype they are stored
in, so the checkpoint holds exactly the numbers the float32 reference used. GPTQ fixtures cannot be
loaded by plain HF, so their routed experts are dequantised here (exact in float32) and written into
the fused expert params before the reference forward.
"""
import argparse
import inspect
import json
import os
import shutil
import sys

# Keep HF on its pure-torch reference paths even where optional kernels are installed: HF silently
# prefers flash-linear-attention / causal-conv1d / hub kernels, which are CUDA-only and round differently.
for _pkg in ("fla", "causal_conv1d", "kernels"):
    sys.modules.setdefault(_pkg, None)

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration,
                          Qwen3_5MoeTextConfig)

LIN, FULL = "linear_attention", "full_attention"
MIN_ROUTER_GAP = 0.1   # router logits have std ~2.5; keeps top-k choices stable under bf16 rounding
TORCH_DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
# The official GPTQ-Int4 `dynamic` block (spec §4): everything but the routed experts stays 16-bit.
OFFICIAL_DYNAMIC = {"lm_head": {}, "model.language_model.embed_tokens": {}, "-:.*attn.*": {},
                    "-:.*shared_expert.*": {}, "-:.*mtp.*": {}, "-:.*visual.*": {}}
# Tiny but real vision tower: HF builds it for the composite class, and fixture 1 ships its weights so
# that the C++ loader has to skip model.visual.* tensors.
TINY_VISION = {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 16, "intermediate_size": 32,
               "num_heads": 2, "in_channels": 3, "patch_size": 2, "temporal_patch_size": 2,
               "spatial_merge_size": 2, "num_position_embeddings": 16, "hidden_act": "gelu_pytorch_tanh",
               "deepstack_visual_indexes": []}


def text_cfg(**kw):
    """Official-looking text config fields (incl. ones HF ignores, like attn_output_gate)."""
    base = {"model_type": "qwen3_5_moe_text", "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "attention_bias": False, "attn_output_gate": True, "linear_conv_kernel_dim": 4,
            "max_position_embeddings": 4096, "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False, "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "initializer_range": 0.02, "tie_word_embeddings": False,
            "use_cache": True, "dtype": "bfloat16"}
    base.update(kw)
    return base


def mrope(theta, prf, head_dim):
    # mrope_section must cover the rotary half-dim; for text tokens T/H/W positions coincide anyway.
    half = int(head_dim * prf) // 2
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf,
            "mrope_section": [half - 2 * (half // 4), half // 4, half // 4], "mrope_interleaved": True}


FIXTURES = [
    dict(name="bf16_fused", seed=101, composite=True, quant=None, layout="fused", shards=3, extras=True,
         prefill=70, decode=4,
         desc="composite config, explicit layer_types (full attn at 1,2), Hv=2*Hk, dk!=dv, GQA 4, top-2 of 8, "
              "official fused BF16 layout (A_log F32), 3 shards, + model.visual.* and mtp.* tensors to ignore; "
              "prefill 70 (>1 DeltaNet chunk of 64) + 4 decode",
         text=text_cfg(vocab_size=1031, hidden_size=48, num_hidden_layers=4, layer_types=[LIN, FULL, FULL, LIN],
                       full_attention_interval=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=24, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, partial_rotary_factor=0.25,
                       rope_parameters=mrope(1e7, 0.25, 32))),
    dict(name="bf16_text_only", seed=202, composite=False, quant=None, layout="per_expert", shards=1,
         extras=False, prefill=5, decode=3, mtp="per_expert",
         desc="text-only config (qwen3_5_moe_text, Qwen3_5MoeForCausalLM, prefix model.), full_attention_interval 3 "
              "(5 layers -> full at 2), partial_rotary_factor 0.5 / rope_theta 1e6 only inside rope_parameters, "
              "Hv=Hk, GQA 2, top-4 of 16, per-expert names, single file, mixed dtypes (norms/A_log/dt_bias F32, "
              "lm_head + shared expert + conv1d F16, rest BF16); prefill 5 + 3 decode",
         text=text_cfg(architectures=["Qwen3_5MoeForCausalLM"], vocab_size=1301, hidden_size=48,
                       num_hidden_layers=5, full_attention_interval=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
                       linear_key_head_dim=32, linear_value_head_dim=32, num_experts=16, num_experts_per_tok=4,
                       moe_intermediate_size=16, shared_expert_intermediate_size=40,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5})),
    dict(name="gptq_sym_v1", seed=303, composite=True, quant=dict(bits=4, group_size=32, sym=True, desc_act=False),
         layout="gptq", shards=1, extras=False, prefill=20, decode=4, mtp="fused",
         desc="GPTQ int4 g32 sym, desc_act false, no checkpoint_format (v1: stored zero = 7), per-expert "
              "qweight/qzeros/scales/g_idx, rest BF16 (A_log F32); GQA 4, Hv=2*Hk, top-4 of 8; prefill 20 + 4 decode",
         text=text_cfg(vocab_size=1063, hidden_size=64, num_hidden_layers=4, layer_types=[LIN, LIN, LIN, FULL],
                       full_attention_interval=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, num_experts=8, num_experts_per_tok=4, moe_intermediate_size=64,
                       shared_expert_intermediate_size=32, partial_rotary_factor=0.25,
                       rope_parameters=mrope(1e7, 0.25, 32))),
    dict(name="gptq_asym_actorder", seed=404, composite=True,
         quant=dict(bits=4, group_size=16, sym=False, desc_act=True, checkpoint_format="gptq_v2"),
         layout="gptq", shards=2, extras=False, prefill=12, decode=4,
         desc="GPTQ int4 g16 asym, desc_act true (random g_idx permutation), checkpoint_format gptq_v2 (stored "
              "zero = zero), 2 shards, all BF16 incl. A_log; GQA 1, top-3 of 10; prefill 12 + 4 decode",
         text=text_cfg(vocab_size=1531, hidden_size=48, num_hidden_layers=3, layer_types=[LIN, FULL, LIN],
                       full_attention_interval=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, num_experts=10, num_experts_per_tok=3, moe_intermediate_size=48,
                       shared_expert_intermediate_size=32, partial_rotary_factor=0.25,
                       rope_parameters=mrope(1e7, 0.25, 16))),
    dict(name="gptq_asym_v1", seed=505, composite=True,
         quant=dict(bits=4, group_size=32, sym=False, desc_act=True),
         layout="gptq", shards=1, extras=False, prefill=10, decode=4,
         desc="GPTQ int4 g32 asym, desc_act true, no checkpoint_format (v1) written as GPTQModel writes it: "
              "the v2 qzeros words minus 0x11111111, so zero points of 0 borrow from the next nibble; "
              "GQA 2, top-2 of 8; prefill 10 + 4 decode",
         text=text_cfg(vocab_size=1201, hidden_size=64, num_hidden_layers=2, layer_types=[LIN, FULL],
                       full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                       shared_expert_intermediate_size=32, partial_rotary_factor=0.25,
                       rope_parameters=mrope(1e7, 0.25, 16))),
]


def stored_dtype(fx, name):
    if fx["name"] == "bf16_text_only":
        if name.endswith(("norm.weight", "A_log", "dt_bias")):
            return "F32"
        if name == "lm_head.weight" or ".shared_expert." in name or "conv1d" in name:
            return "F16"
        return "BF16"
    if name.endswith("A_log") and fx["name"] != "gptq_asym_actorder":
        return "F32"  # the official BF16 checkpoint keeps A_log in F32
    return "BF16"


def init_value(rng, name, shape, H):
    """Random values chosen so activations stay O(1) while logits / routing / decays are far from flat."""
    n = lambda s: rng.standard_normal(shape) * s
    fan_in = shape[-1] if len(shape) >= 2 else 1
    if name.startswith("model.visual."):
        return n(0.3 / np.sqrt(fan_in)) if len(shape) >= 2 else n(0.1)
    if name.endswith("embed_tokens.weight"):
        return n(1.0)
    if name == "lm_head.weight":
        return n(4.0 / np.sqrt(H))                      # logits std ~4
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + n(0.3)                             # gated norm uses w directly
    if name.endswith("norm.weight") or name.startswith("mtp.pre_fc_norm_"):
        return n(0.3)                                   # zero-centred norms use (1 + w)
    if name.endswith("A_log"):
        # log-uniform A in [0.05, 16]: mixes slow-decay heads (state matters) with fast-forgetting ones
        return rng.uniform(np.log(0.05), np.log(16.0), shape)
    if name.endswith("dt_bias"):
        return n(1.0)
    if name.endswith("conv1d.weight"):
        return n(0.5)
    if name.endswith("mlp.gate.weight"):
        return n(2.5 / np.sqrt(H))                      # peaked, non-uniform routing
    if name.endswith("in_proj_b.weight"):
        return n(1.5 / np.sqrt(H))
    if name.endswith("experts.gate_up_proj"):
        return n(1.0 / np.sqrt(shape[2]))
    if name.endswith("experts.down_proj"):
        return n(1.0 / np.sqrt(shape[2]))
    assert len(shape) == 2, name
    return n(1.0 / np.sqrt(fan_in))


def round_to(t, dt):
    return t.to(TORCH_DT[dt]).to(torch.float32)


# ---------------------------------------------------------------- GPTQ packing (spec §4)
V1_WORD_OFFSET = 0x11111111


def quantize_expert(rng, K, N, q):
    """Random int4 codes for an nn.Linear of [N out, K in]. Returns (tensors, exact float32 W[N, K])."""
    gs = q["group_size"]
    ng = K // gs
    assert K % gs == 0 and K % 8 == 0 and N % 8 == 0
    # desc_act: an arbitrary channel->group assignment with exactly gs channels per group
    g_idx = (rng.permutation(K) // gs if q["desc_act"] else np.arange(K) // gs).astype(np.int32)
    codes = rng.integers(0, 16, size=(K, N), dtype=np.int64)
    zero = np.full((ng, N), 8, np.int64) if q["sym"] else rng.integers(0, 16, size=(ng, N), dtype=np.int64)
    if not q["sym"] and q.get("checkpoint_format") != "gptq_v2":
        zero[0, :8] = np.arange(8) % 2 * 5         # v1: zero points of 0 beside non-zero ones in one word
    spread = np.sqrt(np.var(np.arange(16)) * (1 if q["sym"] else 2))   # std of (code - zero)
    scales = (rng.uniform(0.5, 1.5, (ng, N)) / (np.sqrt(K) * spread)).astype(np.float16)
    # fp16 scale * small int is exact in float32
    W = scales.astype(np.float32)[g_idx] * (codes - zero[g_idx]).astype(np.float32)     # [K, N]
    shifts = (4 * np.arange(8, dtype=np.uint64))
    qweight = (codes.reshape(K // 8, 8, N).astype(np.uint64) << shifts[None, :, None]).sum(1)
    qzeros = (zero.reshape(ng, N // 8, 8).astype(np.uint64) << shifts[None, None, :]).sum(2)   # v2 words
    if q.get("checkpoint_format") != "gptq_v2":
        # v1 as GPTQModel writes it: each packed v2 word minus 0x11111111 (a zero of 0 borrows)
        qzeros = (qzeros - V1_WORD_OFFSET) % (1 << 32)
    tensors = {"qweight": qweight.astype(np.uint32).view(np.int32), "qzeros": qzeros.astype(np.uint32).view(np.int32),
               "scales": scales, "g_idx": g_idx}
    return tensors, np.ascontiguousarray(W.T)


def dequantize(t, q):
    """Independent unpacking of the stored tensors (numpy only) for the round-trip check."""
    qw = t["qweight"].view(np.uint32)
    K, N = qw.shape[0] * 8, qw.shape[1]
    codes = ((qw[:, None, :] >> (4 * np.arange(8, dtype=np.uint32))[None, :, None]) & 0xF).reshape(K, N)
    qz = t["qzeros"].view(np.uint32).astype(np.uint64)
    if q.get("checkpoint_format") != "gptq_v2":
        qz = (qz + V1_WORD_OFFSET) % (1 << 32)      # GPTQModel's v1 -> v2: add 0x11111111 to the word
    zero = ((qz[:, :, None] >> (4 * np.arange(8, dtype=np.uint64))[None, None, :]) & 0xF).reshape(qz.shape[0], N)
    zero = zero.astype(np.int64)
    g = t["g_idx"].astype(np.int64)
    W = t["scales"].astype(np.float32)[g] * (codes.astype(np.int64) - zero[g]).astype(np.float32)
    return W.T


# ---------------------------------------------------------------- checkpoint writing
def write_safetensors(folder, tensors, shards):
    """tensors: list of (name, torch tensor in its stored dtype). HF-style shards + index when shards > 1."""
    if shards == 1:
        save_file(dict(tensors), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        return
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    groups, cur, acc = [], [], 0
    for name, t in tensors:                           # contiguous split by bytes, like save_pretrained
        cur.append((name, t))
        acc += t.numel() * t.element_size()
        if acc >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    weight_map = {}
    for i, grp in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(dict(grp), os.path.join(folder, fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name, _ in grp})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def read_safetensors(folder, framework="pt", keep=lambda k: True):
    out = {}
    for fn in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        with safe_open(os.path.join(folder, fn), framework=framework) as f:
            out.update({k: f.get_tensor(k) for k in f.keys() if keep(k)})
    return out


def split_expert_name(name, e, proj):
    return name.replace("experts.gate_up_proj", f"experts.{e}.{proj}").replace("experts.down_proj", f"experts.{e}.{proj}")


# ---------------------------------------------------------------- the MTP head (spec §3.6)
def text_model_of(model):
    m = model.model
    return m.language_model if hasattr(m, "language_model") else m


@torch.no_grad()
def mtp_head(fx, model, ids):
    """A whole MTP head (mtp.*) with random values from its own stream (the main tensors and ids stay
    as they were), and its float32 reference: h = the main model's final hidden states (after the final
    norm, as vLLM and SGLang hand them to the head), then for row p, from (h[p], ids[p + 1]) at RoPE
    position p, x = fc([norm_e(embed(id)) ; norm_h(h)]), HF's own decoder layer for mtp.layers.0 (full
    attention + sparse MoE, causal over the head's rows), mtp.norm, lm_head. Returns (tensors, h, logits)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf
    rng = np.random.default_rng(fx["seed"] + 1000)
    tm = text_model_of(model)
    cfg = tm.config
    H = cfg.hidden_size
    full = cfg.layer_types.index("full_attention")
    layer = hf.Qwen3_5MoeDecoderLayer(cfg, layer_idx=full).float().eval()
    norms = {k: hf.Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps).float() for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    fc = torch.nn.Linear(2 * H, H, bias=False).float()
    params = [(f"mtp.layers.0.{k}", p) for k, p in layer.named_parameters()]
    params += [(f"mtp.{k}.weight", m.weight) for k, m in norms.items()] + [("mtp.fc.weight", fc.weight)]
    tensors = []
    for name, p in params:
        dt = stored_dtype(fx, name)
        val = round_to(torch.from_numpy(init_value(rng, name, tuple(p.shape), H).astype(np.float32)), dt)
        p.data.copy_(val)
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")) and fx["mtp"] == "per_expert":
            for e in range(p.shape[0]):
                if name.endswith("gate_up_proj"):
                    I = p.shape[1] // 2
                    tensors.append((split_expert_name(name, e, "gate_proj") + ".weight", val[e, :I].to(TORCH_DT[dt]).contiguous()))
                    tensors.append((split_expert_name(name, e, "up_proj") + ".weight", val[e, I:].to(TORCH_DT[dt]).contiguous()))
                else:
                    tensors.append((split_expert_name(name, e, "down_proj") + ".weight", val[e].to(TORCH_DT[dt]).contiguous()))
        else:
            tensors.append((name, val.to(TORCH_DT[dt]).contiguous()))

    # the main model's final hidden states, and what its full-attention layers are called with
    got = {}
    h1 = tm.norm.register_forward_hook(lambda m, i, o: got.__setitem__("h", o))
    h2 = tm.layers[full].register_forward_pre_hook(lambda m, a, kw: got.__setitem__("kw", kw), with_kwargs=True)
    model(input_ids=torch.tensor([ids]), use_cache=False)
    h1.remove(), h2.remove()
    h, kw = got["h"][0], got["kw"]
    n = len(ids) - 1
    cos, sin = kw["position_embeddings"]
    mask = kw.get("attention_mask")
    if mask is None:
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    else:
        mask = mask[..., :n, :n]
    emb = tm.embed_tokens(torch.tensor(ids[1:]))
    x = fc(torch.cat([norms["pre_fc_norm_embedding"](emb), norms["pre_fc_norm_hidden"](h[:n])], -1))[None]
    rec = RouterGaps(layer)
    out = layer(x, position_embeddings=(cos[:, :n], sin[:, :n]), attention_mask=mask, position_ids=kw.get("position_ids"))
    rec.close()
    out = out[0] if isinstance(out, tuple) else out
    lm = model.lm_head
    logits = lm(norms["norm"](out))[0]
    print(f"[{fx['name']}] MTP head ({fx['mtp']} experts): {len(tensors)} tensors, logits std {logits.std():.3f}, "
          f"min router top-k gap {min(g.min().item() for g in rec.gaps):.3f}")
    return tensors, h.float().numpy(), logits.float().numpy()


# ---------------------------------------------------------------- HF helpers
def load_kwargs():
    return dict(attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)


@torch.no_grad()
def reference_logits(model, ids, prefill):
    # transformers 5.17 calls the cache `past_key_values`; later releases renamed it to `cache`.
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x[:, :prefill], use_cache=True)
    rows = [out.logits[0]]
    for t in range(prefill, len(ids)):
        cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
        out = model(input_ids=x[:, t:t + 1], use_cache=True, **{kw: cache})
        rows.append(out.logits[0])
    stepped = torch.cat(rows).float().numpy()
    full = model(input_ids=x, use_cache=False).logits[0].float().numpy()
    return stepped, full


class RouterGaps:
    """Records, per router call, the gap between the k-th and (k+1)-th router logit of every token."""

    def __init__(self, model):
        self.gaps = []
        self.hooks = [m.register_forward_hook(self.hook) for n, m in model.named_modules() if n.endswith("mlp.gate")]

    def hook(self, mod, inp, _out):
        logits = torch.nn.functional.linear(inp[0].reshape(-1, mod.weight.shape[1]), mod.weight)
        top = logits.sort(dim=-1, descending=True).values
        self.gaps.append(top[:, mod.top_k - 1] - top[:, mod.top_k])

    def close(self):
        for h in self.hooks:
            h.remove()


@torch.no_grad()
def choose_ids(model, rng, V, T, min_gap):
    """Random ids, but a candidate is redrawn while any layer routes it within min_gap of a top-k tie:
    a bf16 runtime would legitimately pick different experts there and fail a correct test. The first
    and last vocabulary rows are placed as early as they pass."""
    ids, rec = [], RouterGaps(model)
    for t in range(T):
        for tries in range(1000):
            special = [v for v in (V - 1, 0) if v not in ids]
            cand = special[0] if (t >= 1 and tries == 0 and special) else int(rng.integers(0, V))
            rec.gaps.clear()
            model(input_ids=torch.tensor([ids + [cand]]), use_cache=False)
            if min(g[-1].item() for g in rec.gaps) >= min_gap:   # causal: only the new token can change
                ids.append(cand)
                break
        else:
            raise RuntimeError("no candidate token with a clear routing decision")
    rec.close()
    return ids


# ---------------------------------------------------------------- one fixture
def build(fx, root):
    folder = os.path.join(root, fx["name"])
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rng = np.random.default_rng(fx["seed"])
    tc = fx["text"]
    H, V = tc["hidden_size"], tc["vocab_size"]

    if fx["composite"]:
        cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
               "text_config": tc, "vision_config": dict(TINY_VISION, out_hidden_size=H),
               "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
               "vision_end_token_id": 248054, "tie_word_embeddings": False,
               "transformers_version": transformers.__version__}
        if fx["quant"]:
            cfg["quantization_config"] = dict(quant_method="gptq", dynamic=OFFICIAL_DYNAMIC, **fx["quant"])
        cls, cfg_cls = Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeConfig
    else:
        cfg = dict(tc, transformers_version=transformers.__version__)
        cls, cfg_cls = Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    # Let HF parse exactly the file we ship (full_attention_interval, rope precedence, ...).
    config = cfg_cls.from_pretrained(folder)
    if hasattr(config, "quantization_config"):
        del config.quantization_config               # the dequantised reference is a plain float model
    model = cls._from_config(config, **load_kwargs()).eval()

    tensors, gptq_ref = [], {}
    for name, p in model.named_parameters():
        dt = stored_dtype(fx, name)
        val = round_to(torch.from_numpy(init_value(rng, name, tuple(p.shape), H).astype(np.float32)), dt)
        is_expert = name.endswith(("experts.gate_up_proj", "experts.down_proj"))
        if is_expert and fx["layout"] == "gptq":
            E = p.shape[0]
            for e in range(E):
                if name.endswith("gate_up_proj"):
                    I = p.shape[1] // 2
                    parts = [("gate_proj", I, H), ("up_proj", I, H)]
                else:
                    parts = [("down_proj", H, p.shape[2])]
                Ws = []
                for proj, N, K in parts:
                    qt, W = quantize_expert(rng, K, N, fx["quant"])
                    base = split_expert_name(name, e, proj)
                    for k in ("qweight", "qzeros", "scales", "g_idx"):
                        tensors.append((f"{base}.{k}", torch.from_numpy(qt[k])))
                    gptq_ref[base] = W
                    Ws.append(torch.from_numpy(W))
                val[e] = torch.cat(Ws, 0)
        elif is_expert and fx["layout"] == "per_expert":
            for e in range(p.shape[0]):
                if name.endswith("gate_up_proj"):
                    I = p.shape[1] // 2
                    tensors.append((split_expert_name(name, e, "gate_proj") + ".weight", val[e, :I].to(TORCH_DT[dt])))
                    tensors.append((split_expert_name(name, e, "up_proj") + ".weight", val[e, I:].to(TORCH_DT[dt])))
                else:
                    tensors.append((split_expert_name(name, e, "down_proj") + ".weight", val[e].to(TORCH_DT[dt])))
        elif fx["quant"] and name.startswith("model.visual."):
            pass                                       # GPTQ fixtures ship the text model only
        else:
            tensors.append((name, val.to(TORCH_DT[dt]).contiguous()))
        p.data.copy_(val)
    if fx["extras"]:
        # MTP head weights (spec §2, HF skips ^mtp.*): a few real names, random values.
        for name, shape in [("mtp.fc.weight", (H, 2 * H)), ("mtp.norm.weight", (H,)),
                            ("mtp.pre_fc_norm_embedding.weight", (H,)), ("mtp.pre_fc_norm_hidden.weight", (H,)),
                            ("mtp.layers.0.input_layernorm.weight", (H,))]:
            tensors.append((name, torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)))
    ids = choose_ids(model, rng, V, fx["prefill"] + fx["decode"], MIN_ROUTER_GAP)
    if fx.get("mtp"):
        mtp_tensors, mtp_h, mtp_logits = mtp_head(fx, model, ids)
        tensors += mtp_tensors
        np.save(os.path.join(folder, "mtp_hidden.npy"), np.ascontiguousarray(mtp_h, dtype=np.float32))
        np.save(os.path.join(folder, "mtp_logits.npy"), np.ascontiguousarray(mtp_logits, dtype=np.float32))
    write_safetensors(folder, tensors, fx["shards"])

    rec = RouterGaps(model)
    stepped, full = reference_logits(model, ids, fx["prefill"])
    rec.close()
    np.save(os.path.join(folder, "logits.npy"), np.ascontiguousarray(stepped, dtype=np.float32))
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"ids": ids, "prefill": fx["prefill"], "vocab_size": V, "description": fx["desc"]}, f, indent=1)

    top2 = np.sort(stepped, axis=1)[:, -2:]
    print(f"[{fx['name']}] logits std {stepped.std():.3f}, mean top-2 margin {np.mean(top2[:, 1] - top2[:, 0]):.3f}, "
          f"|stepped - full| max {np.abs(stepped - full).max():.2e}, "
          f"min router top-k gap {min(g.min().item() for g in rec.gaps):.3f}")
    assert np.abs(stepped - full).max() < 1e-4

    verify(fx, folder, cls, model, ids, stepped, gptq_ref)


GPTQ_SUFFIXES = (".qweight", ".qzeros", ".scales", ".g_idx")


def verify(fx, folder, cls, model, ids, stepped, gptq_ref):
    """Prove the files on disk hold exactly the weights the reference logits were computed with."""
    state = {k: v.detach() for k, v in model.named_parameters()}
    if fx["quant"]:
        # numpy API (no torch): unpack + dequantise every expert matrix, compare bit-exactly
        packed = read_safetensors(folder, "numpy", lambda k: k.endswith(GPTQ_SUFFIXES))
        for base, W in gptq_ref.items():
            Wd = dequantize({s[1:]: packed[base + s] for s in GPTQ_SUFFIXES}, fx["quant"])
            prefix, e, proj = base.rsplit(".", 2)
            fused = state[prefix + (".down_proj" if proj == "down_proj" else ".gate_up_proj")][int(e)]
            I = fused.shape[0] // 2
            used = {"gate_proj": fused[:I], "up_proj": fused[I:], "down_proj": fused}[proj].numpy()
            assert np.array_equal(Wd, W) and np.array_equal(Wd, used), base
        for k, v in read_safetensors(folder, "pt", lambda k: not k.endswith(GPTQ_SUFFIXES) and not k.startswith("mtp.")).items():
            assert torch.equal(v.float(), state[k]), k
        print(f"[{fx['name']}] GPTQ round trip: {len(gptq_ref)} expert matrices unpacked + dequantised, "
              f"bit-identical to the weights used; all 16-bit tensors identical too")
        return
    re, info = cls.from_pretrained(folder, output_loading_info=True, **load_kwargs())
    re.eval()
    missing = sorted(info["missing_keys"])
    if missing:
        # Older/newer HF without the per-expert -> fused converter: fuse the stored tensors ourselves.
        assert all(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in missing), missing
        ckpt, fixed = read_safetensors(folder), {}
        for k in missing:
            pre, E = k.rsplit(".", 1)[0], state[k].shape[0]
            parts = ["gate_proj", "up_proj"] if k.endswith("gate_up_proj") else ["down_proj"]
            fixed[k] = torch.stack([torch.cat([ckpt[f"{pre}.{e}.{p}.weight"] for p in parts]) for e in range(E)]).float()
        re.load_state_dict(fixed, strict=False)
        print(f"[{fx['name']}] note: HF left {len(missing)} fused expert params unloaded; fused them by hand")
    for k, v in re.named_parameters():
        assert torch.equal(v.detach(), state[k]), k
    d = np.abs(reference_logits(re, ids, fx["prefill"])[0] - stepped).max()
    print(f"[{fx['name']}] reload via {cls.__name__}.from_pretrained: all params identical, max |logit diff| "
          f"{d:.2e}, missing {len(missing)}, unexpected {len(info['unexpected_keys'])} (mtp.* is on HF's ignore list)")
    assert d < 1e-5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)build")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)                          # same reduction order on every machine
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    os.makedirs(args.out, exist_ok=True)
    for fx in FIXTURES:
        if not args.only or fx["name"] in args.only:
            build(fx, args.out)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    print(f"total size of {args.out}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
