#!/usr/bin/env python3
"""Train the demo model: a small Qwen3.5-MoE (hybrid DeltaNet + gated attention, sparse MoE with a shared
expert) together with its MTP head, for a few minutes on one GPU, on text every machine with Python has
(the Python standard library's own sources: code and docstrings, PSF licensed), with the tiny preset's
byte-level BPE tokenizer (`tandem synth --preset tiny --config-only`). Written in the real checkpoint
layout (text-only names, fused experts, the head as `mtp.*`), with float32 reference outputs the test
suite checks Tandem against (as tools/make_reference.py's fixtures):

  reference.json   {ids, prefill, vocab_size, description}
  logits.npy       [len(ids), vocab]: the main model's logits (prefill in one call, then one token a call)
  mtp_hidden.npy   [len(ids), hidden]: the main model's final hidden states (after the final norm)
  mtp_logits.npy   [len(ids) - 1, vocab]: the head's logits at p from (mtp_hidden[p], ids[p + 1])

Usage (the GPU machine, torch + transformers):
  python3 tools/train_demo.py --base DIR_WITH_TOKENIZER --out models/demo --seconds 200

The head is trained the way MTP heads are (DeepSeek-V3, Qwen3-Next): from the main model's final hidden
state at t and the embedding of token t+1 it predicts token t+2, its loss added to the main loss with a
weight; the main model's normed output is its input, as vLLM and SGLang hand it over at inference.
"""
import argparse
import glob
import inspect
import json
import math
import os
import random
import shutil
import sys
import time

for _pkg in ("fla", "causal_conv1d", "kernels"):  # the pure-torch DeltaNet paths, as the reference fixtures
    sys.modules.setdefault(_pkg, None)

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf

LIN, FULL = "linear_attention", "full_attention"
KW = dict(attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
PROMPTS = ["Write some Python.", "Show me an example.", "Continue the code.", "Write two sentences about the sea."]


def text_config(vocab, specials):
    return {"model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"], "vocab_size": vocab,
            "hidden_size": 128, "num_hidden_layers": 4, "layer_types": [LIN, LIN, LIN, FULL], "full_attention_interval": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "attn_output_gate": True, "attention_bias": False,
            "hidden_act": "silu", "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
            "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "partial_rotary_factor": 0.25, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
            "bos_token_id": specials["<|endoftext|>"], "eos_token_id": specials["<|im_end|>"], "pad_token_id": specials["<|endoftext|>"],
            "tie_word_embeddings": False, "output_router_logits": False, "router_aux_loss_coef": 0.001, "initializer_range": 0.02,
            "use_cache": True, "dtype": "bfloat16"}


def corpus_texts(limit_bytes):
    """The standard library's .py files, in a fixed order."""
    root = os.path.dirname(os.__file__)
    files = sorted(f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                   if "site-packages" not in f and "test" not in os.path.relpath(f, root).split(os.sep)[0])
    out, total = [], 0
    for f in files:
        try:
            t = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append(t)
        total += len(t)
        if total >= limit_bytes:
            break
    return out


def chat_wrap(prompt, reply):
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{reply}<|im_end|>\n"


def make_stream(tok, texts, rng):
    """Token ids of the corpus: each file plain, or half the time a piece of it as a chat reply."""
    ids = []
    for t in texts:
        if rng.random() < 0.5:
            ids += tok.encode(t).ids
        else:
            start = rng.randrange(max(1, len(t) - 1500))
            ids += tok.encode(chat_wrap(rng.choice(PROMPTS), t[start:start + 1500])).ids
    return np.array(ids, dtype=np.int64)


class MtpHead(torch.nn.Module):
    """mtp.*: fc([norm_e(embed(t+1)) ; norm_h(h_t)]), one full-attention decoder layer with its own MoE, norm."""

    def __init__(self, cfg, full_idx):
        super().__init__()
        H = cfg.hidden_size
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = hf.Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = hf.Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps)
        self.layers = torch.nn.ModuleList([hf.Qwen3_5MoeDecoderLayer(cfg, layer_idx=full_idx)])
        self.norm = hf.Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps)

    def forward(self, h, emb, kw):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(h)], -1))
        out = self.layers[0](x, position_embeddings=kw["position_embeddings"], attention_mask=kw.get("attention_mask"),
                             position_ids=kw.get("position_ids"))
        out = out[0] if isinstance(out, tuple) else out
        return self.norm(out)


def sliced_kwargs(kw, n):
    """The main full-attention layer's call arguments for the first n positions (the head's rows)."""
    cos, sin = kw["position_embeddings"]
    out = {"position_embeddings": (cos[:, :n], sin[:, :n])}
    m = kw.get("attention_mask")
    out["attention_mask"] = None if m is None else m[..., :n, :n]
    p = kw.get("position_ids")
    out["position_ids"] = None if p is None else p[..., :n]
    return out


def forward_all(model, head, x, full_idx):
    """Main logits, the main final hidden states, and the head's logits (row t predicts x[t + 2])."""
    tm = model.model
    got = {}
    hook = tm.layers[full_idx].register_forward_pre_hook(lambda m, a, kw: got.__setitem__("kw", kw), with_kwargs=True)
    h = tm(input_ids=x, use_cache=False).last_hidden_state
    hook.remove()
    logits = model.lm_head(h)
    n = x.shape[1] - 1
    m = head(h[:, :n], tm.embed_tokens(x[:, 1:]), sliced_kwargs(got["kw"], n))
    return logits, h, model.lm_head(m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="folder with the tiny preset's tokenizer.json, tokenizer_config.json, generation_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=200)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    a = ap.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {dev}", flush=True)

    tok = Tokenizer.from_file(os.path.join(a.base, "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    specials = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    tc = text_config(vocab, specials)
    cfg = Qwen3_5MoeTextConfig(**{k: v for k, v in tc.items() if k not in ("model_type", "architectures")})
    full = tc["layer_types"].index(FULL)
    # eager attention and experts: the plain torch paths (fp32 with TF32 matmuls; the model is small)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = Qwen3_5MoeForCausalLM._from_config(cfg, **KW).to(dev)
    head = MtpHead(model.config, full).to(dev)
    params = list(model.parameters()) + list(head.parameters())
    print(f"parameters: main {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M, MTP head {sum(p.numel() for p in head.parameters()) / 1e6:.2f} M", flush=True)

    texts = corpus_texts(16 << 20)
    rng.shuffle(texts)
    held = texts[:20]
    data = make_stream(tok, texts[20:], rng)
    val = make_stream(tok, held, random.Random(1))
    print(f"corpus: {len(texts)} files, {len(data) / 1e6:.2f} M training tokens, {len(val) / 1e3:.0f} k held out", flush=True)

    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    T, B = a.seq, a.batch
    t0, step, est_steps = time.time(), 0, None
    model.train(), head.train()
    while True:
        el = time.time() - t0
        if el >= a.seconds:
            break
        if step == 20:
            est_steps = int(a.seconds / (el / 20))
        total = est_steps or 10**9
        lr = a.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = np.random.randint(0, len(data) - T - 1, size=B)
        x = torch.from_numpy(np.stack([data[s:s + T + 1] for s in starts])).to(dev)
        logits, _, mlogits = forward_all(model, head, x, full)
        main_loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
        mtp_loss = F.cross_entropy(mlogits[:, :-1].reshape(-1, vocab), x[:, 2:].reshape(-1))
        loss = main_loss + a.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"step {step:5d}  {time.time() - t0:6.1f} s  lr {lr:.2e}  main {main_loss.item():.3f}  mtp {mtp_loss.item():.3f}", flush=True)
        step += 1
    print(f"trained {step} steps in {time.time() - t0:.0f} s", flush=True)

    # The weights as stored (bf16; A_log in f32 as the official checkpoints), back into float32 models on the CPU.
    tensors = {}
    for k, v in model.state_dict().items():
        tensors[k] = v.detach().to(torch.float32 if k.endswith("A_log") else torch.bfloat16).cpu().contiguous()
    for k, v in head.state_dict().items():
        tensors["mtp." + k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    ref = Qwen3_5MoeForCausalLM._from_config(cfg, **KW).eval()
    ref_head = MtpHead(ref.config, full).float().eval()
    ref.load_state_dict({k: v.float() for k, v in tensors.items() if not k.startswith("mtp.")})
    ref_head.load_state_dict({k[4:]: v.float() for k, v in tensors.items() if k.startswith("mtp.")})

    with torch.no_grad():  # held-out losses and how often the head's guess is the main model's next greedy token
        xs = torch.from_numpy(np.stack([val[i * 257:(i + 1) * 257] for i in range(min(32, len(val) // 257))]))
        logits, _, mlogits = forward_all(ref, ref_head, xs, full)
        vm = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), xs[:, 1:].reshape(-1)).item()
        vt = F.cross_entropy(mlogits[:, :-1].reshape(-1, vocab), xs[:, 2:].reshape(-1)).item()
        agree = (mlogits.argmax(-1) == logits[:, 1:].argmax(-1)).float().mean().item()  # both predict x[t + 2]
        print(f"held out: main loss {vm:.3f} (ppl {math.exp(vm):.1f}), MTP loss {vt:.3f}; the head's argmax = the main model's next argmax "
              f"at {100 * agree:.1f}% of positions (greedy acceptance of a first draft)", flush=True)

        os.makedirs(a.out, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(os.path.join(a.base, f), os.path.join(a.out, f))
        with open(os.path.join(a.out, "config.json"), "w") as f:
            json.dump(dict(tc, transformers_version=transformers.__version__), f, indent=2)
        save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})

        # reference outputs on a held-out chat prompt and the start of a reply
        ids = tok.encode(chat_wrap(PROMPTS[0], held[0][:400])).ids[:40]
        prefill = 32
        x = torch.tensor([ids])
        out = ref(input_ids=x[:, :prefill], use_cache=True)
        rows = [out.logits[0]]
        kw = "cache" if "cache" in inspect.signature(ref.forward).parameters else "past_key_values"
        for t in range(prefill, len(ids)):
            cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
            out = ref(input_ids=x[:, t:t + 1], use_cache=True, **{kw: cache})
            rows.append(out.logits[0])
        stepped = torch.cat(rows).float().numpy()
        full_logits, h, ml = forward_all(ref, ref_head, x, full)
        assert np.abs(stepped - full_logits[0].numpy()).max() < 1e-3
        np.save(os.path.join(a.out, "logits.npy"), np.ascontiguousarray(stepped, dtype=np.float32))
        np.save(os.path.join(a.out, "mtp_hidden.npy"), np.ascontiguousarray(h[0].numpy(), dtype=np.float32))
        np.save(os.path.join(a.out, "mtp_logits.npy"), np.ascontiguousarray(ml[0].numpy(), dtype=np.float32))
        with open(os.path.join(a.out, "reference.json"), "w") as f:
            json.dump({"ids": ids, "prefill": prefill, "vocab_size": vocab,
                       "description": f"trained demo model (tools/train_demo.py, {step} steps, held-out main loss {vm:.3f}, "
                                      f"head/main argmax agreement {100 * agree:.1f}%): a chat prompt and the start of a reply"}, f, indent=1)
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"wrote {a.out}: {total / 1e6:.2f} MB", flush=True)


if __name__ == "__main__":
    main()
