#!/usr/bin/env python3
"""Writes tiny random-weight vision-language checkpoints and Transformers' outputs on them into
plugins/candle/tests/data/tiny-<model>-vlm/, for the candle backend's tests: Gemma 3
(`gemma3`) and SmolVLM's architecture, Idefics3 (`idefics3`). No VLM's weights can be installed
on these machines; the architectures, the file layouts and the processors are Transformers' own,
only the sizes are small. Not run by the tests or CI (they read the committed files); rerun it
after a Transformers upgrade:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install transformers torch safetensors pillow
    /tmp/ref/bin/python scripts/vlm-reference.py [gemma3] [idefics3]

Written per model: config.json, model.safetensors, the processor's files (a word-level
tokenizer that knows the model's control and image tokens, its chat template,
preprocessor_config.json), the test images (PNG: landscape noise, a portrait gradient, a square
of flat colours; Idefics3 also a wide strip, cut into tiles differently) and
reference.safetensors with, per image, the processor's pixel values and `get_image_features` of
them, and for three chats (no image, one, two) the ids of the prompt and a reply and the
model's logits over them.
"""

import json
import pathlib
import sys

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    PreTrainedTokenizerFast,
)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "plugins/candle/tests/data"

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


def word_level(vocab, special, template, **tokens):
    """A word-level tokenizer over `vocab` (token to id), `special` its control and image
    tokens, splitting at newlines, spaces and punctuation; `tokens` names its special tokens
    as Transformers' tokenizer arguments do."""
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex("\n+"), behavior="isolated"),
        pre_tokenizers.Split(pattern=" ", behavior="removed"),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    backend.add_special_tokens(special)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", **tokens)
    fast.chat_template = template
    return fast


def gemma3_tokenizer():
    """A word-level tokenizer over `SPECIAL`, `WORDS` and the image markers, with the ids the
    model config names."""
    vocab = dict(SPECIAL)
    for word in WORDS:
        vocab[word] = len(vocab)
    vocab.update(MARKERS)
    return word_level(
        vocab,
        list(SPECIAL) + list(MARKERS),
        TEMPLATE,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "image_token": "<image_soft_token>",
            "eoi_token": "<end_of_image>",
        },
    )


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


def gemma3():
    out = DATA / "tiny-gemma3-vlm"
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
    randomize(model, ("norm", "mm_input_projection"))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    pixels_of = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Gemma3Processor(pixels_of, gemma3_tokenizer(), image_seq_length=TOKENS, chat_template=TEMPLATE)
    processor.save_pretrained(out)
    processor.tokenizer.save_pretrained(out)
    # The hub's Gemma 3 checkpoints keep the image processor's settings in a file of their own,
    # where Transformers 5 nests them in processor_config.json (as the Idefics3 fixture keeps).
    nested = json.loads((out / "processor_config.json").read_text())["image_processor"]
    (out / "preprocessor_config.json").write_text(json.dumps(nested, indent=2, sort_keys=True) + "\n")
    pictures = images()
    tensors = chats(model, processor, CHATS, pictures)
    for name, pixels in pictures.items():
        image = Image.fromarray(pixels)
        image.save(out / f"{name}.png")
        values = processor(image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            features = model.get_image_features(values).pooler_output
        tensors[f"{name}.pixel_values"] = values[0].contiguous()
        tensors[f"{name}.features"] = features[0].contiguous()
    save(out, tensors)


def randomize(model, names):
    """Draws the parameters whose names hold one of `names` from N(0, 0.5)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in names):
                p.normal_(0.0, 0.5)


def chats(model, processor, chats, pictures):
    """For each chat, the ids of its prompt and reply and the model's logits over them."""
    tensors = {}
    for name, (turns, reply) in chats.items():
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
        extra = {
            k: v for k, v in inputs.items()
            if k in ("pixel_values", "pixel_attention_mask", "token_type_ids")
        }
        if "token_type_ids" in extra:
            extra["token_type_ids"] = torch.cat(
                [extra["token_type_ids"], torch.zeros_like(reply_ids)], dim=1
            )
        with torch.no_grad():
            logits = model(input_ids=ids, **extra).logits[0]
        tensors[f"chat.{name}.ids"] = ids[0].to(torch.int64).contiguous()
        tensors[f"chat.{name}.prompt_len"] = torch.tensor([inputs["input_ids"].shape[1]])
        tensors[f"chat.{name}.logits"] = logits.contiguous()
    return tensors


def save(out, tensors):
    save_file(tensors, out / "reference.safetensors", metadata={"transformers": transformers.__version__})
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    print(json.dumps(sizes, indent=1))


# Idefics3: 32x32 tiles in 8x8 patches, a 4x4 grid shuffled 2x2 into 4 placeholders per tile;
# images scaled to a longest side of 64, so into 2x2, 2x1 or 1x2 tiles and the global view.
I3_TILE, I3_PATCH, I3_SCALE, I3_LONGEST = 32, 8, 2, 64
I3_SEQ = (I3_TILE // I3_PATCH) ** 2 // I3_SCALE**2
I3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
              "<image>", "<global-img>"] + [f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)]
I3_WORDS = ["User", "Assistant", "System", ":", "\n", "\n\n"] + WORDS[6:]
# SmolVLM-Instruct's chat template (Transformers' `smolvlm` processor's, without its video part).
I3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
I3_CHATS = {
    "text": ([("user", ["What is this?"])], "A cat."),
    "one": ([("user", ["noise", "What is this?"])], "It is red."),
    "two": (
        [("system", ["Be brief."]), ("user", ["gradient", "What is this?"]),
         ("assistant", ["A cat."]), ("user", ["And now this?", "strip", "Compare them."])],
        "It is blue.",
    ),
}


def idefics3_tokenizer():
    vocab = {token: i for i, token in enumerate(I3_SPECIAL)}
    for word in I3_WORDS:
        vocab[word] = len(vocab)
    return word_level(
        vocab,
        I3_SPECIAL,
        I3_TEMPLATE,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
        },
    )


def idefics3():
    out = DATA / "tiny-idefics3-vlm"
    torch.manual_seed(0)
    tokenizer = idefics3_tokenizer()
    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100_000.0},
            "tie_word_embeddings": False,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": I3_TILE,
            "patch_size": I3_PATCH,
        },
        scale_factor=I3_SCALE,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    model = Idefics3ForConditionalGeneration(config).eval()
    randomize(model, ("norm", "modality_projection"))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    pixels_of = Idefics3ImageProcessorPil(
        size={"longest_edge": I3_LONGEST}, max_image_size={"longest_edge": I3_TILE}
    )
    processor = Idefics3Processor(pixels_of, tokenizer, image_seq_len=I3_SEQ, chat_template=I3_TEMPLATE)
    processor.save_pretrained(out)
    processor.tokenizer.save_pretrained(out)
    pictures = images()
    y, x = np.mgrid[0:12, 0:90]
    pictures["strip"] = np.stack([x * 2, y * 20, 255 - x * 2], axis=-1).astype(np.uint8)
    tensors = chats(model, processor, I3_CHATS, pictures)
    for name, pixels in pictures.items():
        image = Image.fromarray(pixels)
        image.save(out / f"{name}.png")
        inputs = processor.image_processor(image, return_tensors="pt")
        values, mask = inputs["pixel_values"], inputs["pixel_attention_mask"]
        with torch.no_grad():
            features = model.get_image_features(values, mask).pooler_output
        tensors[f"{name}.pixel_values"] = values[0].contiguous()
        tensors[f"{name}.features"] = torch.cat(list(features)).contiguous()
    save(out, tensors)


MODELS = {"gemma3": gemma3, "idefics3": idefics3}


def main():
    for name in sys.argv[1:] or MODELS:
        MODELS[name]()


if __name__ == "__main__":
    main()
