"""llama.cpp's logits for a GGUF file: the reference the candle model tests compare against.

    python scripts/llama-cpp-logits.py MODEL.gguf OUT.f32 (--ids 1,2,3 | --text TEXT) [--f32-kv]

Runs llama.cpp (llama-cpp-python, as scripts/setup-llama-cpp installs it) on 2 threads with
`logits_all`, evaluates the ids (or the text, tokenized by llama.cpp with BOS as the model's
metadata says and special tokens parsed), writes every position's logits to OUT.f32 as
little-endian f32 rows of the vocab width, and prints one JSON line:
{"ids": [...], "rows": N, "vocab": V}.

llama.cpp keeps keys and values in f16 by default, which moves the logits of a tiny f32 model by
up to about 1e-2; `--f32-kv` keeps them in f32, making the run an f32 reference (it agrees with
the candle plugin's f32 code to about 1e-5).
"""

import argparse
import json
import sys

import numpy as np
from llama_cpp import GGML_TYPE_F32, Llama


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--ids", help="comma-separated token ids")
    group.add_argument("--text")
    parser.add_argument("--n-ctx", type=int, default=512)
    parser.add_argument("--f32-kv", action="store_true", help="keys and values in f32, not f16")
    args = parser.parse_args()

    kv = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if args.f32_kv else {}
    llm = Llama(model_path=args.model, logits_all=True, n_ctx=args.n_ctx, n_threads=2,
                n_threads_batch=2, n_batch=args.n_ctx, verbose=False, **kv)
    if args.ids is not None:
        ids = [int(i) for i in args.ids.split(",") if i]
    else:
        ids = llm.tokenize(args.text.encode(), add_bos=True, special=True)
    if not ids or len(ids) > args.n_ctx:
        sys.exit(f"llama-cpp-logits: {len(ids)} ids; expected 1 to {args.n_ctx}")
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype="<f4")
    logits.tofile(args.out)
    print(json.dumps({"ids": ids, "rows": logits.shape[0], "vocab": logits.shape[1]}))


if __name__ == "__main__":
    main()
