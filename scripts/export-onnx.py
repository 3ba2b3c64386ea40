"""Exports a llama-architecture GGUF to an ONNX decoder in Hugging Face Optimum's layout.

    python scripts/export-onnx.py MODEL.gguf OUT_DIR

Why this exists: no ONNX LLM ships in a package these machines can install (the Hugging Face hub
is out of reach), so the tests of lmhost's `onnx` backend make one from the packaged GGUF
(SmolLM2-135M-Instruct, see scripts/fetch-models). scripts/setup-onnx runs this once and caches
the result in models/smollm2-onnx/.

OUT_DIR gets what Optimum's `optimum-cli export onnx --task text-generation-with-past` writes:
- model.onnx: one file, opset 17, plain ONNX operators, f32 weights dequantized from the GGUF.
  Inputs `input_ids`, `attention_mask` (past + new), `position_ids` and
  `past_key_values.N.key` / `.value` [batch, kv_heads, past, head_dim]; outputs `logits` and
  `present.N.key` / `.value` (the past with the new positions appended).
- config.json (LlamaConfig), generation_config.json, tokenizer.json (byte-level BPE built with
  `tokenizers` from the GGUF vocabulary) and tokenizer_config.json (chat template, special tokens).

Only onnx, gguf, numpy and tokenizers are needed (no onnxruntime, no torch). The output is
deterministic: the same GGUF gives byte-identical files.
"""

import json
import os
import sys
import time

import numpy as np
import onnx
from gguf import GGUFReader
from gguf.quants import dequantize
from onnx import TensorProto, helper, numpy_helper
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

OPSET = 17
F32_MIN = float(np.finfo(np.float32).min)  # score of a masked key (finite: no NaN rows)


def meta(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            sys.exit(f"export-onnx: GGUF key {key} is missing")
        return default
    return field.contents()


def f32_repr(x):
    """A float stored as f32 in the GGUF, written as its shortest f32 decimal (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


class Graph:
    """Collects nodes and initializers; names every node after its output so the file is stable."""

    def __init__(self):
        self.nodes, self.inits = [], []

    def init(self, name, array):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, name, values, dtype=np.int64):
        return self.init(name, np.asarray(values, dtype=dtype))

    def op(self, op_type, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def load_weights(reader):
    weights = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        weights[t.name] = w.reshape([int(d) for d in reversed(t.shape)])
    return weights


def unpermute(w, n_head):
    """Undoes llama.cpp's q/k row permutation (interleaved-pair RoPE -> Hugging Face rotate_half)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def build_model(weights, cfg):
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    NH, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    V, G = cfg["vocab_size"], cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    g = Graph()

    # Constants shared by all layers.
    g.const("eps", np.float32(cfg["rms_norm_eps"]), np.float32)
    g.const("scale", np.float32(1.0 / np.sqrt(D)), np.float32)
    g.const("masked", np.float32(F32_MIN), np.float32)
    g.const("zero", 0), g.const("one", 1), g.const("ax0", [0]), g.const("ax1", [1])
    g.const("ax2", [2]), g.const("ax_s_t", [0, 1]), g.const("ax_b_mask", [1, 2, 3])
    g.const("halves", [D // 2, D // 2])
    g.const("shape_q", [0, 0, NH, D]), g.const("shape_kv", [0, 0, KV, D])
    g.const("shape_q5", [0, KV, G, -1, D]), g.const("shape_o4", [0, NH, -1, D])
    g.const("shape_o3", [0, 0, NH * D]), g.const("shape_flat", [-1, H]), g.const("vocab", [V])

    # RoPE tables [context, head_dim] in Hugging Face's half layout, gathered by position_ids.
    inv_freq = 1.0 / (cfg["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D))
    angles = np.arange(cfg["max_position_embeddings"], dtype=np.float64)[:, None] * inv_freq
    angles = np.concatenate([angles, angles], axis=-1)
    g.init("rope_cos", np.cos(angles).astype(np.float32))
    g.init("rope_sin", np.sin(angles).astype(np.float32))
    cos = g.op("Unsqueeze", [g.op("Gather", ["rope_cos", "position_ids"], "cos3"), "ax1"], "cos")
    sin = g.op("Unsqueeze", [g.op("Gather", ["rope_sin", "position_ids"], "sin3"), "ax1"], "sin")

    # Mask [batch, 1, 1, seq, total]: key j is visible to new position s (absolute index
    # past + s) when j <= past + s and attention_mask[b, j] is 1.
    ids_shape = g.op("Shape", ["input_ids"], "ids_shape")
    seq = g.op("Gather", [ids_shape, "one"], "seq")
    past = g.op("Gather", [g.op("Shape", ["past_key_values.0.key"], "past_shape"), "ax2"], "past1")
    past = g.op("Squeeze", [past, "ax0"], "past")
    total = g.op("Gather", [g.op("Shape", ["attention_mask"], "mask_shape"), "one"], "total")
    qpos = g.op("Range", [past, g.op("Add", [past, seq], "past_plus_seq"), "one"], "qpos")
    kpos = g.op("Range", ["zero", total, "one"], "kpos")
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [kpos, "ax0"], "kpos_row"),
                                  g.op("Unsqueeze", [qpos, "ax1"], "qpos_col")], "causal")
    keep = g.op("Cast", ["attention_mask"], "mask_bool", to=TensorProto.BOOL)
    keep = g.op("Unsqueeze", [keep, "ax_b_mask"], "mask_b111t")
    visible = g.op("And", [g.op("Unsqueeze", [causal, "ax_s_t"], "causal_11st"), keep], "visible")

    def rms_norm(x, weight_name, out):
        w = g.init(weight_name, weights[weight_name])
        ms = g.op("ReduceMean", [g.op("Mul", [x, x], out + ".sq")], out + ".ms", axes=[-1], keepdims=1)
        inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, "eps"], out + ".ms_eps")],
                                         out + ".rms")], out + ".inv_rms")
        return g.op("Mul", [g.op("Mul", [x, inv], out + ".normed"), w], out)

    def linear(x, weight_name, out, w=None):
        w = weights[weight_name] if w is None else w
        return g.op("MatMul", [x, g.init(weight_name + ".T", w.T)], out)

    def rope(x, out):  # x [B, heads, S, D]: x * cos + rotate_half(x) * sin
        x1, x2 = out + ".x1", out + ".x2"
        g.nodes.append(helper.make_node("Split", [x, "halves"], [x1, x2], name=out + ".split", axis=-1))
        rot = g.op("Concat", [g.op("Neg", [x2], out + ".neg_x2"), x1], out + ".rot", axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos], out + ".xcos"),
                            g.op("Mul", [rot, sin], out + ".rsin")], out)

    h = g.op("Gather", ["token_embd.weight", "input_ids"], "embed")
    g.init("token_embd.weight", weights["token_embd.weight"])
    for i in range(L):
        p = f"blk.{i}."
        x = rms_norm(h, p + "attn_norm.weight", p + "attn_in")
        wq = unpermute(weights[p + "attn_q.weight"], NH)
        wk = unpermute(weights[p + "attn_k.weight"], KV)
        q = g.op("Reshape", [linear(x, p + "attn_q.weight", p + "q", wq), "shape_q"], p + "q4")
        k = g.op("Reshape", [linear(x, p + "attn_k.weight", p + "k", wk), "shape_kv"], p + "k4")
        v = g.op("Reshape", [linear(x, p + "attn_v.weight", p + "v"), "shape_kv"], p + "v4")
        q = rope(g.op("Transpose", [q], p + "q_bhsd", perm=[0, 2, 1, 3]), p + "q_rope")
        k = rope(g.op("Transpose", [k], p + "k_bhsd", perm=[0, 2, 1, 3]), p + "k_rope")
        v = g.op("Transpose", [v], p + "v_bhsd", perm=[0, 2, 1, 3])
        k = g.op("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        v = g.op("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        # Grouped-query attention without repeating K/V: q [B, KV, G, S, D] against
        # k, v [B, KV, 1, T, D]; MatMul broadcasts over the group axis.
        q = g.op("Reshape", [q, "shape_q5"], p + "q5")
        k = g.op("Transpose", [g.op("Unsqueeze", [k, "ax2"], p + "k5")], p + "k5t", perm=[0, 1, 2, 4, 3])
        v = g.op("Unsqueeze", [v, "ax2"], p + "v5")
        scores = g.op("Mul", [g.op("MatMul", [q, k], p + "qk"), "scale"], p + "scores")
        scores = g.op("Where", [visible, scores, "masked"], p + "scores_masked")
        probs = g.op("Softmax", [scores], p + "probs", axis=-1)
        o = g.op("Reshape", [g.op("MatMul", [probs, v], p + "o5"), "shape_o4"], p + "o4")
        o = g.op("Reshape", [g.op("Transpose", [o], p + "o_bshd", perm=[0, 2, 1, 3]), "shape_o3"], p + "o")
        h = g.op("Add", [h, linear(o, p + "attn_output.weight", p + "attn_out")], p + "h_attn")
        x = rms_norm(h, p + "ffn_norm.weight", p + "ffn_in")
        gate = linear(x, p + "ffn_gate.weight", p + "gate")
        silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], p + "gate_sigmoid")], p + "gate_silu")
        up = g.op("Mul", [silu, linear(x, p + "ffn_up.weight", p + "up")], p + "swiglu")
        h = g.op("Add", [h, linear(up, p + "ffn_down.weight", p + "ffn_out")], f"blk.{i}.out")

    # Logits: final norm, then the output projection (tied to the embedding unless the GGUF has
    # output.weight) as Gemm(transB=1) on the flattened states, so no transposed copy is stored.
    x = rms_norm(h, "output_norm.weight", "final_norm")
    head = "output.weight" if "output.weight" in weights else "token_embd.weight"
    if head != "token_embd.weight":
        g.init(head, weights[head])
    flat = g.op("Reshape", [x, "shape_flat"], "final_flat")
    logits = g.op("Gemm", [flat, head], "logits_flat", transB=1)
    out_shape = g.op("Concat", [ids_shape, "vocab"], "logits_shape", axis=0)
    g.op("Reshape", [logits, out_shape], "logits")

    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    kv_dims = ["batch_size", KV, "past_sequence_length", D]
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
              helper.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch_size", "sequence_length", V])]
    for i in range(L):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, kv_dims))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kind}", f32, ["batch_size", KV, "total_sequence_length", D]))
    graph = helper.make_graph(g.nodes, "llama", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="lmhost scripts/export-onnx.py", ir_version=8)
    onnx.checker.check_model(model)
    return model


def build_tokenizer(reader):
    tokens = meta(reader, "tokenizer.ggml.tokens")
    types = meta(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in meta(reader, "tokenizer.ggml.merges")]
    unk = reader.fields.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                     unk_token=tokens[int(unk.contents())] if unk else None, byte_fallback=False)
    tok = Tokenizer(bpe)
    # SmolLM's pre-tokenizer (GGUF pre "smollm"): digits one by one, then GPT-2's byte-level split.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    if meta(reader, "tokenizer.ggml.add_bos_token", False):
        bos_id = int(meta(reader, "tokenizer.ggml.bos_token_id"))
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    return tok, tokens


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: export-onnx.py MODEL.gguf OUT_DIR")
    src, out_dir = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    reader = GGUFReader(src)
    arch = meta(reader, "general.architecture")
    if arch != "llama":
        sys.exit(f"export-onnx: {src} is a {arch!r} model; only 'llama' is supported")
    tok_model = meta(reader, "tokenizer.ggml.model")
    if tok_model != "gpt2":
        sys.exit(f"export-onnx: tokenizer {tok_model!r} is not supported; only gpt2 byte-level BPE")
    pre = meta(reader, "tokenizer.ggml.pre", "default")
    if pre != "smollm":
        print(f"export-onnx: warning: pre-tokenizer {pre!r}; writing SmolLM's (digits, byte-level)",
              file=sys.stderr)

    H = int(meta(reader, "llama.embedding_length"))
    NH = int(meta(reader, "llama.attention.head_count"))
    bos, eos = (int(meta(reader, f"tokenizer.ggml.{k}_token_id")) for k in ("bos", "eos"))
    weights = load_weights(reader)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": int(meta(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(meta(reader, "llama.block_count")),
        "num_attention_heads": NH,
        "num_key_value_heads": int(meta(reader, "llama.attention.head_count_kv", NH)),
        "head_dim": int(meta(reader, "llama.rope.dimension_count", H // NH)),
        "hidden_act": "silu",
        "rms_norm_eps": f32_repr(meta(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_repr(meta(reader, "llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(meta(reader, "llama.context_length")),
        "vocab_size": int(weights["token_embd.weight"].shape[0]),
        "tie_word_embeddings": "output.weight" not in weights,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    if cfg["head_dim"] * NH != H:
        sys.exit(f"export-onnx: head_dim {cfg['head_dim']} x {NH} heads != hidden {H}")
    model = build_model(weights, cfg)
    tok, tokens = build_tokenizer(reader)

    os.makedirs(out_dir, exist_ok=True)
    onnx.save_model(model, os.path.join(out_dir, "model.onnx"))
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    pad = reader.fields.get("tokenizer.ggml.padding_token_id")
    unk = reader.fields.get("tokenizer.ggml.unknown_token_id")
    tok_cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(meta(reader, "tokenizer.ggml.add_bos_token", False)),
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "unk_token": tokens[int(unk.contents())] if unk else None,
        "pad_token": tokens[int(pad.contents())] if pad else None,
        "model_max_length": cfg["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": meta(reader, "tokenizer.chat_template", ""),
    }
    files = {"config.json": cfg, "tokenizer_config.json": tok_cfg,
             "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos}}
    for name, obj in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    size = os.path.getsize(os.path.join(out_dir, "model.onnx"))
    print(f"export-onnx: {cfg['num_hidden_layers']} layers, hidden {H}, {NH}/{cfg['num_key_value_heads']} "
          f"heads, vocab {cfg['vocab_size']}, {len(model.graph.node)} nodes, model.onnx {size / 1e6:.0f} MB, "
          f"{time.monotonic() - start:.0f} s -> {out_dir}")


if __name__ == "__main__":
    main()
