#!/usr/bin/env python3
"""By-hand check of `trident export/import --format hf` against Hugging Face transformers (not
part of the tests: torch and transformers are no project dependencies; see
data_tools/hf_reference.py for the venv).

    # export: an exported directory loads with from_pretrained and gives Trident's logits
    hf_interop_check.py export CKPT.h5 HF_DIR
    # import: tiny random GPT-2, Llama and Mixtral models made with transformers (f32, bf16, f16,
    # save_pretrained) are imported, and the imported checkpoints give HF's logits
    hf_interop_check.py import WORK_DIR

Trident's logits come from build/bench/trident_logits (--build DIR, default build/); the
batch is 2 random sequences of model.seq_len tokens. Prints the worst absolute logit
difference of each comparison; exit 1 when one exceeds --tol (default 1e-4).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trident_logits(build, checkpoint, tokens, work):
    tok_path, out_path = os.path.join(work, "tokens.bin"), os.path.join(work, "logits.bin")
    tokens.astype("<i4").tofile(tok_path)
    subprocess.run([os.path.join(build, "bench", "trident_logits"), checkpoint, tok_path, out_path],
                   check=True, stdout=subprocess.DEVNULL)
    return np.fromfile(out_path, dtype="<f4")


def hf_logits(model_dir, tokens):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits
    return type(model).__name__, out.double().numpy()


def compare(label, build, checkpoint, model_dir, vocab, seq_len, work, tol):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, size=(2, seq_len))
    name, hf = hf_logits(model_dir, tokens)
    tri = trident_logits(build, checkpoint, tokens, work).reshape(hf.shape)
    worst = float(np.max(np.abs(hf - tri)))
    scale = float(np.max(np.abs(hf)))
    print(f"{label}: {name} from {model_dir}: logits {list(hf.shape)}, max |logit| {scale:.3f}, "
          f"worst |HF - Trident| {worst:.3e} ({'OK' if worst <= tol else 'FAIL'})")
    return worst <= tol


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["export", "import"])
    ap.add_argument("args", nargs="+")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    trident = os.path.join(a.build, "app", "trident")
    ok = True
    if a.mode == "export":
        checkpoint, hf_dir = a.args
        cfg = json.load(open(os.path.join(hf_dir, "config.json")))
        seq = cfg.get("n_positions") or cfg.get("max_position_embeddings")
        ok = compare("export", a.build, checkpoint, hf_dir, cfg["vocab_size"], seq, hf_dir, a.tol)
    else:
        from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                                  MixtralConfig, MixtralForCausalLM)
        work = a.args[0]
        os.makedirs(work, exist_ok=True)
        torch.manual_seed(0)
        models = {
            "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32,
                                               n_layer=2, n_head=4)),
            "llama": LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32,
                                                  intermediate_size=96, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=32,
                                                  tie_word_embeddings=False)),
            "mixtral": MixtralForCausalLM(MixtralConfig(vocab_size=256, hidden_size=32,
                                                        intermediate_size=48, num_hidden_layers=2,
                                                        num_attention_heads=4, num_key_value_heads=2,
                                                        num_local_experts=4, num_experts_per_tok=2,
                                                        max_position_embeddings=32,
                                                        tie_word_embeddings=False)),
        }
        # Larger weights than the init's 0.02 so that the logits are far from zero and every
        # path carries a visible signal.
        with torch.no_grad():
            for model in models.values():
                for p in model.parameters():
                    if p.dim() == 2:
                        p.mul_(10.0)
        for arch, model in models.items():
            for dtype, torch_dtype in (("f32", torch.float32), ("bf16", torch.bfloat16),
                                       ("f16", torch.float16)):
                hf_dir = os.path.join(work, f"{arch}_{dtype}")
                model.to(torch_dtype).save_pretrained(hf_dir)
                ckpt = os.path.join(work, f"{arch}_{dtype}.h5")
                if os.path.exists(ckpt):
                    os.remove(ckpt)
                subprocess.run([trident, "import", "--format", "hf", hf_dir, ckpt], check=True,
                               stdout=subprocess.DEVNULL)
                ok &= compare(f"import {arch} {dtype}", a.build, ckpt, hf_dir, 256, 32, work, a.tol)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
