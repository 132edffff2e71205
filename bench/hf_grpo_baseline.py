#!/usr/bin/env python3
"""The GRPO step's phases done by HF transformers on one GPU: the peer Tessera's GPU benchmark
(bench/gpu_grpo.sh) reports beside its own figures, on the same model directory in the same run.

  hf_grpo_baseline.py MODEL_DIR [--prompts 64] [--n 8] [--prompt-len 64] [--response-len 256]
                      [--logprob-micro 32] [--train-micro 16] [--no-gradient-checkpointing] [--json OUT]

Phases (as in the reference measurements): generate (sdpa, bf16, sampling, min_new_tokens =
max_new_tokens), a log-prob forward (fp32 master weights under bf16 autocast), and one AdamW
training step over the same sequences with gradient checkpointing (as verl's default
enable_gradient_checkpointing; --no-gradient-checkpointing keeps the activations) and clip 1.0. Prints one JSON
object with each phase's seconds, tokens/s and the step's MFU against the card's bf16 peak, and the
card's bf16 matmul rate measured in the same run (an 8192^3 matmul) with the FLOPs of one forward and
one update over the step's sequences: the floors any implementation's phases have on this card.
"""
import argparse
import json
import time

import torch
import transformers

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "B200": 2250.0}


def peak_flops():
    name = torch.cuda.get_device_name(0)
    for model, tflops in PEAK_TFLOPS.items():
        if model in name:
            return tflops * 1e12, name
    return 0.0, name


def layer_params(cfg, i):
    # The weights one token meets in layer i (workers/models/param_count.hpp): attention, and the
    # dense MLP or, on a sparse layer of a MoE model, the router and the num_experts_per_tok experts.
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q = cfg.num_attention_heads * head_dim
    kv = cfg.num_key_value_heads * head_dim
    attention = cfg.hidden_size * (2 * q + 2 * kv)
    experts = getattr(cfg, "num_experts", 0) or 0
    sparse = experts > 0 and i not in (getattr(cfg, "mlp_only_layers", None) or []) and \
        (i + 1) % getattr(cfg, "decoder_sparse_step", 1) == 0
    if not sparse:
        return attention + cfg.hidden_size * cfg.intermediate_size * 3
    shared = getattr(cfg, "shared_expert_intermediate_size", 0) or 0
    return (attention + cfg.hidden_size * experts + 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_experts_per_tok
            + (3 * cfg.hidden_size * shared + cfg.hidden_size if shared else 0))


def training_flops(cfg, tokens, seqlen):
    # verl's FlopsCounter (workers/ppo/flops_counter.cpp does the same).
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dense = sum(layer_params(cfg, i) for i in range(cfg.num_hidden_layers))
    dense += cfg.vocab_size * cfg.hidden_size * 2
    attn = 12 * (seqlen * seqlen) * (tokens // seqlen) * head_dim * cfg.num_attention_heads * cfg.num_hidden_layers
    return 6 * dense * tokens + attn


def matmul_rate(dev):
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    torch.matmul(x, y)  # warm-up
    _, s = timed(lambda: [torch.matmul(x, y) for _ in range(10)])
    return 2 * 8192 ** 3 * 10 / s


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-len", type=int, default=256)
    p.add_argument("--logprob-micro", type=int, default=32)
    p.add_argument("--train-micro", type=int, default=16)
    p.add_argument("--no-gradient-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--json")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    rows, T = a.prompts * a.n, a.prompt_len + a.response_len
    gen_model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                                  attn_implementation="sdpa").to(dev).eval()
    vocab = gen_model.config.vocab_size
    prompts = torch.randint(100, min(vocab, 30000), (rows, a.prompt_len), device=dev)
    mask = torch.ones_like(prompts)
    with torch.no_grad():
        gen_model.generate(prompts[:8], attention_mask=mask[:8], max_new_tokens=8, do_sample=True, top_k=0)  # warm-up
        out, gen_s = timed(lambda: gen_model.generate(prompts, attention_mask=mask, max_new_tokens=a.response_len,
                                                      min_new_tokens=a.response_len, do_sample=True, top_k=0))
    del gen_model
    torch.cuda.empty_cache()
    seqs = out[:, :T]
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                              attn_implementation="sdpa").to(dev)

    def log_probs(batch):
        logits = model(input_ids=batch).logits[:, a.prompt_len - 1:-1].float()
        return torch.log_softmax(logits, -1).gather(-1, batch[:, a.prompt_len:].unsqueeze(-1)).squeeze(-1)

    def forward_all():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return torch.cat([log_probs(seqs[i:i + a.logprob_micro]) for i in range(0, rows, a.logprob_micro)])

    forward_all()  # warm-up
    _, logprob_s = timed(forward_all)
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def train_step():
        for i in range(0, rows, a.train_micro):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = -log_probs(seqs[i:i + a.train_micro]).mean() * a.train_micro / rows
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    _, train_s = timed(train_step)
    peak, card = peak_flops()
    flops = training_flops(model.config, rows * T, T)
    result = {
        "card": card, "gradient_checkpointing": a.checkpointing, "transformers": transformers.__version__, "torch": torch.__version__,
        "generate_s": gen_s, "generate_tok_s": rows * a.response_len / gen_s,
        "log_prob_s": logprob_s, "update_s": train_s,
        "update_mfu": flops / train_s / peak if peak else 0.0,
        "composed_step_s": gen_s + 2 * logprob_s + train_s,
        "max_memory_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
        # 6x dense parameters x tokens: forward 2x, backward 4x (attention likewise a third forward).
        "forward_flops": flops / 3, "update_flops": flops, "matmul_flops_per_s": matmul_rate(dev),
    }
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
