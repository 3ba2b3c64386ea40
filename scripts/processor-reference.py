#!/usr/bin/env python3
"""Writes plugin-kit/tests/data/processors.json: what Transformers' own multimodal processors
make of images of several sizes and aspect ratios, for the processor contract's tests to compare
with. Not run by the tests or CI (they read the committed file); rerun it after a Transformers
upgrade:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install transformers pillow numpy
    /tmp/ref/bin/python scripts/processor-reference.py

For each processor configuration (Idefics3's defaults, SmolVLM-256M's, Gemma 3's) and image size
it records `_get_num_multimodal_tokens` (placeholder tokens and patches per image), the text an
image expands to, and, over a small word-level tokenizer that knows every marker token (written
into the file, so the Rust side tokenizes with the same vocabulary), a prompt's input ids and
Transformers' `mm_token_type_ids`. And PIL's resizes of a patterned image, for the resampler
that redoes them (`plugin-kit/src/multimodal/resample.rs`).
"""

import base64
import json
import pathlib

import numpy as np
import PIL
import transformers
from PIL import Image
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "plugin-kit/tests/data/processors.json"

# (height, width): landscape, portrait, square, tiny, exact tile multiples and one past them,
# a panorama and a tall strip.
SIZES = [
    (480, 640),
    (640, 480),
    (100, 100),
    (1, 1),
    (512, 512),
    (513, 1025),
    (1080, 1920),
    (200, 3000),
    (3000, 200),
]

IDEFICS3_MARKERS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]
GEMMA3_MARKERS = [
    "<start_of_image>",
    "<image_soft_token>",
    "<end_of_image>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
]
WORDS = ["User", ":", "What", "is", "this", "?", "\n", "\n\n", " "]
WORDS += ["user", "model", "Be", "brief", ".", "A", "cat", "And", "now", "Compare", "them"]

# Gemma 3's chat template, as google/gemma-3-4b-it's tokenizer_config.json ships it.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# A chat with two images, one before its text and one after: (role, parts), a part being text
# or an image's (height, width).
GEMMA3_CHAT = [
    ("system", ["Be brief."]),
    ("user", [(480, 640), "What is this?"]),
    ("assistant", ["A cat."]),
    ("user", ["And now this?", (100, 60), "Compare them."]),
]


def tokenizer(markers):
    """A word-level tokenizer: each marker is one special token, text splits on whitespace and
    punctuation, newlines are tokens of their own."""
    vocab = {"[UNK]": 0}
    for word in WORDS + markers:
        vocab.setdefault(word, len(vocab))
    model = models.WordLevel(vocab=vocab, unk_token="[UNK]")
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex("\n+"), behavior="isolated"),
            pre_tokenizers.Split(pattern=" ", behavior="removed"),
            pre_tokenizers.Punctuation(behavior="isolated"),
        ]
    )
    backend.add_special_tokens(markers)
    return backend


def image(height, width):
    rng = np.random.default_rng(height * 10007 + width)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def record(processor, backend, prompt, sizes, **kwargs):
    counts = processor._get_num_multimodal_tokens(image_sizes=sizes, **kwargs)
    cases = []
    for i, (h, w) in enumerate(sizes):
        inputs = processor(
            text=[prompt], images=[[image(h, w)]], return_mm_token_type_ids=True, **kwargs
        )
        images_kwargs = processor._merge_kwargs(**kwargs)["images_kwargs"]
        _, replacements = processor._process_images([[image(h, w)]], **images_kwargs)
        cases.append(
            {
                "height": h,
                "width": w,
                "num_image_tokens": int(counts["num_image_tokens"][i]),
                "num_image_patches": int(counts["num_image_patches"][i]),
                "image_text": replacements[0],
                "input_ids": [int(t) for t in inputs["input_ids"][0]],
                "mm_token_type_ids": [
                    int(t)
                    for t in inputs.get("mm_token_type_ids", inputs.get("token_type_ids"))[0]
                ],
            }
        )
    return {"tokenizer": json.loads(backend.to_str()), "prompt": prompt, "cases": cases}


def idefics3(size, max_image_size, image_seq_len):
    backend = tokenizer(IDEFICS3_MARKERS)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": size}, max_image_size={"longest_edge": max_image_size}
    )
    processor = Idefics3Processor(images, fast, image_seq_len=image_seq_len)
    config = {"longest_edge": size, "max_image_size": max_image_size, "image_seq_len": image_seq_len}
    return {"config": config, **record(processor, backend, "User:<image>What is this?", SIZES)}


def gemma3():
    backend = tokenizer(GEMMA3_MARKERS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "image_token": "<image_soft_token>",
            "eoi_token": "<end_of_image>",
        },
    )
    fast.bos_token = "<bos>"
    processor = Gemma3Processor(
        Gemma3ImageProcessorPil(), fast, image_seq_length=256, chat_template=GEMMA3_TEMPLATE
    )
    config = {"mm_tokens_per_image": 256}
    reference = record(processor, backend, "User:<start_of_image>What is this?", SIZES[:3])
    return {"config": config, **reference, "chat": chat(processor)}


def chat(processor):
    """The chat through `apply_chat_template`, images included: Transformers' text, ids and
    `mm_token_type_ids`."""
    conversation = []
    for role, parts in GEMMA3_CHAT:
        content = [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": "image", "image": image(*p)}
            for p in parts
        ]
        conversation.append({"role": role, "content": content})
    inputs = processor.apply_chat_template(
        conversation,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_mm_token_type_ids=True,
    )
    text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    return {
        "template": GEMMA3_TEMPLATE,
        "bos_token": "<bos>",
        "messages": [{"role": r, "parts": [p if isinstance(p, str) else list(p) for p in ps]} for r, ps in GEMMA3_CHAT],
        "text": text,
        "input_ids": [int(t) for t in inputs["input_ids"][0]],
        "mm_token_type_ids": [int(t) for t in inputs.get("mm_token_type_ids", inputs.get("token_type_ids"))[0]],
    }


# Resizes for the resampler's test: (height, width) in and out, and PIL's filter. Up and down
# on both axes, one axis kept, and the height shrinking more than twice the width (where
# Pillow 13 runs its vertical pass first).
RESAMPLES = [
    ((13, 17), (29, 23), "bilinear"),
    ((31, 23), (12, 9), "bilinear"),
    ((20, 20), (20, 33), "bilinear"),
    ((13, 17), (29, 23), "lanczos"),
    ((31, 23), (12, 9), "lanczos"),
    ((40, 12), (9, 14), "lanczos"),
    ((18, 25), (18, 7), "lanczos"),
    ((9, 30), (27, 30), "lanczos"),
]


def pattern(height, width):
    """A deterministic image with sharp edges (the Rust test draws the same one)."""
    y, x, c = np.mgrid[0:height, 0:width, 0:3]
    return (((x * 37 + y * 91 + c * 53) ^ (x * y)) % 256).astype(np.uint8)


def resamples():
    """PIL's output of each of `RESAMPLES` on `pattern`, base64 bytes (row-major RGB)."""
    filters = {"bilinear": Image.BILINEAR, "lanczos": Image.LANCZOS}
    cases = []
    for (h, w), (oh, ow), name in RESAMPLES:
        out = Image.fromarray(pattern(h, w)).resize((ow, oh), filters[name])
        cases.append({"from": [h, w], "to": [oh, ow], "filter": name,
                      "rgb": base64.b64encode(np.asarray(out).tobytes()).decode()})
    return {"pillow": PIL.__version__, "cases": cases}


def main():
    reference = {
        "transformers": transformers.__version__,
        "idefics3": idefics3(4 * 364, 364, 169),
        "smolvlm": idefics3(2048, 512, 64),
        "gemma3": gemma3(),
        "resample": resamples(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(reference, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
