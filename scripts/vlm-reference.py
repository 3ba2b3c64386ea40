#!/usr/bin/env python3
"""Writes a tiny random-weight Gemma 3 vision-language checkpoint and Transformers' outputs on
it into plugins/candle/tests/data/tiny-gemma3-vlm/, for the candle backend's tests. No VLM's
weights can be installed on these machines; the architecture, the file layout and the
processor are Transformers' own, only the sizes are small. Not run by the tests or CI (they
read the committed files); rerun it after a Transformers upgrade:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install transformers torch safetensors pillow
    /tmp/ref/bin/python scripts/vlm-reference.py

Written: config.json, model.safetensors, the processor's files (a word-level tokenizer that
knows Gemma's control and image tokens, Gemma 3's chat template, preprocessor_config.json),
three test images (PNG: landscape noise, a portrait gradient, a square of flat colours) and
reference.safetensors with, per image, the processor's pixel values and `get_image_features` of
them, and for three chats (no image, one, two) the ids of the prompt and a reply and the
model's logits over them.
"""

import json
import pathlib

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, PreTrainedTokenizerFast
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "plugins/candle/tests/data/tiny-gemma3-vlm"

# 56x56 images in 14x14 patches: a 4x4 grid, pooled 2x2 into 4 soft tokens.
IMAGE_SIZE, PATCH, TOKENS = 56, 14, 4
VOCAB = 64
BOI, IMAGE, EOI = 61, 62, 63
SPECIAL = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
MARKERS = {"<start_of_image>": BOI, "<image_soft_token>": IMAGE, "<end_of_image>": EOI}
WORDS = ["user", "model", "\n", "\n\n", "\n\n\n", "\n\n\n\n", "What", "is", "this", "?", "A", "cat", ".", "Be",
         "brief", "And", "now", "Compare", "them", "It", "red", "blue", "[UNK]"]

# Gemma 3's chat template, as google/gemma-3-4b-it's tokenizer_config.json ships it (the same
# text as scripts/processor-reference.py's).
TEMPLATE = (ROOT / "scripts/processor-reference.py").read_text().split('GEMMA3_TEMPLATE = """')[1].split('"""')[0]

# Chats as (role, parts), a part being text or the name of a test image; then the reply scored.
CHATS = {
    "text": ([("user", ["What is this?"])], "A cat."),
    "one": ([("user", ["noise", "What is this?"])], "It is red."),
    "two": (
        [("system", ["Be brief."]), ("user", ["gradient", "What is this?"]),
         ("assistant", ["A cat."]), ("user", ["And now this?", "flat", "Compare them."])],
        "It is blue.",
    ),
}


def tokenizer():
    """A word-level tokenizer over `SPECIAL`, `WORDS` and the image markers, with the ids the
    model config names."""
    vocab = dict(SPECIAL)
    for word in WORDS:
        vocab[word] = len(vocab)
    vocab.update(MARKERS)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex("\n+"), behavior="isolated"),
        pre_tokenizers.Split(pattern=" ", behavior="removed"),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    backend.add_special_tokens(list(SPECIAL) + list(MARKERS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="[UNK]",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "image_token": "<image_soft_token>",
            "eoi_token": "<end_of_image>",
        },
    )
    fast.chat_template = TEMPLATE
    return fast


def images():
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    y, x = np.mgrid[0:90, 0:40]
    gradient = np.stack([x * 6, y * 2, (x + y) * 2], axis=-1).astype(np.uint8)
    flat = np.zeros((50, 50, 3), dtype=np.uint8)
    flat[:25, :25] = [250, 10, 10]
    flat[25:, 25:] = [10, 10, 250]
    flat[:25, 25:] = [10, 200, 10]
    return {"noise": noise, "gradient": gradient, "flat": flat}


def main():
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config={
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": 256,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
        },
        mm_tokens_per_image=TOKENS,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=IMAGE,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    # Random norms and projector too: zeros or ones would hide a missing `1 +` or a transpose.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "mm_input_projection" in name:
                p.normal_(0.0, 0.5)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    pixels_of = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Gemma3Processor(pixels_of, tokenizer(), image_seq_length=TOKENS, chat_template=TEMPLATE)
    processor.save_pretrained(OUT)
    processor.tokenizer.save_pretrained(OUT)
    tensors = {}
    pictures = images()
    for name, (turns, reply) in CHATS.items():
        conversation = [
            {"role": role, "content": [
                {"type": "image", "image": Image.fromarray(pictures[p])} if p in pictures
                else {"type": "text", "text": p}
                for p in parts
            ]}
            for role, parts in turns
        ]
        inputs = processor.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=True, return_dict=True,
            return_tensors="pt",
        )
        reply_ids = processor.tokenizer(reply, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = torch.cat([inputs["input_ids"], reply_ids], dim=1)
        extra = {k: v for k, v in inputs.items() if k in ("pixel_values", "token_type_ids")}
        if "token_type_ids" in extra:
            extra["token_type_ids"] = torch.cat(
                [extra["token_type_ids"], torch.zeros_like(reply_ids)], dim=1
            )
        with torch.no_grad():
            logits = model(input_ids=ids, **extra).logits[0]
        tensors[f"chat.{name}.ids"] = ids[0].to(torch.int64).contiguous()
        tensors[f"chat.{name}.prompt_len"] = torch.tensor([inputs["input_ids"].shape[1]])
        tensors[f"chat.{name}.logits"] = logits.contiguous()
    for name, pixels in pictures.items():
        image = Image.fromarray(pixels)
        image.save(OUT / f"{name}.png")
        values = processor(image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            features = model.get_image_features(values).pooler_output
        tensors[f"{name}.pixel_values"] = values[0].contiguous()
        tensors[f"{name}.features"] = features[0].contiguous()
    save_file(tensors, OUT / "reference.safetensors", metadata={"transformers": transformers.__version__})
    sizes = {p.name: p.stat().st_size for p in OUT.iterdir()}
    print(json.dumps(sizes, indent=1))


if __name__ == "__main__":
    main()
