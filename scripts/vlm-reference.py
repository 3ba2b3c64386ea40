#!/usr/bin/env python3
"""Writes a tiny random-weight Gemma 3 vision-language checkpoint and Transformers' outputs on
it into plugins/candle/tests/data/tiny-gemma3-vlm/, for the candle backend's tests. No VLM's
weights can be installed on these machines; the architecture, the file layout and the
processor are Transformers' own, only the sizes are small. Not run by the tests or CI (they
read the committed files); rerun it after a Transformers upgrade:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install transformers torch safetensors pillow
    /tmp/ref/bin/python scripts/vlm-reference.py

Written: config.json, model.safetensors, preprocessor_config.json, three test images (PNG:
landscape noise, a portrait gradient, a square of flat colours) and reference.safetensors with,
per image, the processor's pixel values and `get_image_features` of them.
"""

import json
import pathlib

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from transformers import Gemma3Config, Gemma3ForConditionalGeneration
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "plugins/candle/tests/data/tiny-gemma3-vlm"

# 56x56 images in 14x14 patches: a 4x4 grid, pooled 2x2 into 4 soft tokens.
IMAGE_SIZE, PATCH, TOKENS = 56, 14, 4
VOCAB = 64
BOI, IMAGE, EOI = 61, 62, 63


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
    processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor.save_pretrained(OUT)
    tensors = {}
    for name, pixels in images().items():
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
