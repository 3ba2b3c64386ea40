"""llama.cpp's prefill and decode speed on a GGUF file, measured as the candle bench measures ours.

    python scripts/llama-cpp-speed.py MODEL.gguf (--ids 1,2,3 | --text TEXT) [--threads 2]
        [--prefill 512] [--chunks 32,128,512] [--decode 32]

Runs llama.cpp (llama-cpp-python, as scripts/setup-llama-cpp installs it) with n_threads and
n_threads_batch = --threads. Prefill: the first --prefill ids into an empty cache, one llama.cpp
eval per chunk (so each llama_decode call gets a chunk, as n_batch = chunk would split it), once
per chunk size. Decode: --decode greedy tokens after the first min(--prefill, 128) ids, one token
per eval. Pass the ids the candle bench uses (`--text` tokenizes with llama.cpp instead: BOS as
the model's metadata says, special tokens parsed). Prints one JSON line:
{"prefill": [tok/s per chunk], "decode": tok/s}.

Each decode step includes Python's per-token overhead, kept small: the eval call and a numpy
argmax over the last logits row, read in place (about 25 us for Gemma 3's 262k vocabulary, 8 us
for SmolLM2's), against 10 ms or more per token.
"""

import argparse
import json
import sys
import time

import numpy as np
from llama_cpp import Llama


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--ids", help="comma-separated token ids")
    group.add_argument("--text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--chunks", default="32,128,512", help="comma-separated chunk sizes")
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()

    chunks = [int(c) for c in args.chunks.split(",") if c]
    prompt = min(args.prefill, 128)
    n_ctx = max(args.prefill, prompt + args.decode)
    # n_ubatch = n_batch: llama.cpp's default n_ubatch (512) would cap a larger chunk.
    batch = max(chunks + [prompt])
    llm = Llama(model_path=args.model, n_ctx=n_ctx, n_batch=batch, n_ubatch=batch,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    if args.ids is not None:
        ids = [int(i) for i in args.ids.split(",") if i]
    else:
        ids = llm.tokenize(args.text.encode(), add_bos=True, special=True)
    if len(ids) < args.prefill:
        sys.exit(f"llama-cpp-speed: {len(ids)} ids; expected at least {args.prefill}")

    prefill = []
    for chunk in chunks:
        llm.reset()
        start = time.perf_counter()
        for at in range(0, args.prefill, chunk):
            llm.eval(ids[at : min(at + chunk, args.prefill)])
        prefill.append(args.prefill / (time.perf_counter() - start))

    vocab = llm.n_vocab()

    def last():
        return int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)).argmax())

    llm.reset()
    llm.eval(ids[:prompt])
    token = last()
    start = time.perf_counter()
    for _ in range(args.decode):
        llm.eval([token])
        token = last()
    decode = args.decode / (time.perf_counter() - start)
    print(json.dumps({"prefill": prefill, "decode": decode}))


if __name__ == "__main__":
    main()
