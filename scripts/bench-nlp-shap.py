"""nlp-shap's own CLI on one conversation, with its Transformers backend and with lmhost's, on
the same SmolLM2 weights: wall times side by side, and how far the generations, their
log-probabilities and the attributions agree. Run by scripts/bench-nlp-shap, in a venv holding
nlp-shap with its Transformers extra (Transformers < 5: its prefix cache fails on 5) and the
lmhost wheel.

The task is the issue's: exact Shapley over 5 message players (32 coalitions), 32-token greedy
replies, `tfidf_cosine`, both prefix caches on. Transformers reads the weights from a checkpoint
this script writes from the packaged GGUF (dequantized to f32); lmhost reads the GGUF itself,
once with `weights = "f32"` (the same arithmetic as Transformers' f32) and once with its default.
"""

import json
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
NLP_SHAP = pathlib.Path(sys.executable).parent / "nlp-shap"

SNAPSHOT = {
    "turns": [
        {
            "messages": [
                {"role": "system", "text": "You are a helpful assistant. Answer briefly."},
                {"role": "user", "text": "I am planning a picnic in Lisbon on Saturday."},
                {"role": "assistant", "text": "That sounds lovely. How can I help?"},
                {"role": "user", "text": "The forecast says heavy rain all weekend."},
                {"role": "user", "text": "Should I still go, and what should I bring?"},
            ]
        }
    ]
}


def checkpoint(cache: pathlib.Path) -> pathlib.Path:
    """A Transformers checkpoint of the GGUF's weights, dequantized to f32 (written once). A
    model loaded from a GGUF refuses `save_pretrained`, so its weights go into one built from
    its config."""
    out = cache / "smollm2-135m-instruct-f32"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = dict(pretrained_model_name_or_path=GGUF.parent, gguf_file=GGUF.name)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    loaded = AutoModelForCausalLM.from_pretrained(**source, torch_dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(loaded.config, torch_dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    # Converted from the GGUF, the tokenizer adds a BOS (`<|im_start|>`) to every encode, before
    # the one the chat template writes; the hub's SmolLM2 tokenizer adds none, nor does lmhost.
    tokenizer.add_bos_token = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def nlp_shap_config(backend: dict, archive: pathlib.Path, inflight: int) -> dict:
    return {
        "backend": backend,
        "generation": {"max_new_tokens": 32, "temperature": 0.0, "top_k": 1},
        "explanation": {
            "estimator": "exact",
            "value_fn": "tfidf_cosine",
            "players": "messages",
            "max_inflight": inflight,
            "archive": {"path": str(archive), "on_exists": "overwrite"},
            "kv_cache": {"enabled": True, "max_entries": 64},
        },
    }


def explain(work: pathlib.Path, name: str, backend: dict, inflight: int = 1) -> dict:
    """One `nlp-shap explain` run: its output, wall time and per-coalition generations."""
    config = work / f"{name}.yaml"
    archive = work / name
    config.write_text(yaml.safe_dump(nlp_shap_config(backend, archive, inflight)))
    snapshot = work / "snapshot.json"
    out = work / f"{name}.json"
    started = time.perf_counter()
    subprocess.run(
        [NLP_SHAP, "explain", "--config", config, "--snapshot", snapshot, "--out", out], check=True
    )
    wall = time.perf_counter() - started
    with sqlite3.connect(archive / "archive.sqlite") as db:
        # A coalition is its mask; the archive's key also hashes the model id.
        rows = db.execute("SELECT mask_words, generation_text, logprobs FROM coalition_records")
        records = {mask: (text, json.loads(lp) if lp else []) for mask, text, lp in rows}
    return {"name": name, "wall": wall, "output": json.loads(out.read_text()), "records": records}


def compare(run: dict, reference: dict) -> str:
    """Agreement with the reference run: identical replies, log-probability and value gaps."""
    keys = sorted(reference["records"].keys() & run["records"].keys())
    same = [k for k in keys if run["records"][k][0] == reference["records"][k][0]]
    gaps = [
        abs(a - b)
        for k in same
        for a, b in zip(run["records"][k][1], reference["records"][k][1], strict=False)
    ]
    values = zip(run["output"]["values"], reference["output"]["values"], strict=True)
    value_gap = max(abs(a - b) for a, b in values)
    logprob_gap = f"{max(gaps):.1e}" if gaps else "-"
    return f"{len(same)}/{len(keys)} | {logprob_gap} | {value_gap:.1e}"


def main() -> None:
    cache = pathlib.Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        (work / "snapshot.json").write_text(json.dumps(SNAPSHOT))
        f32 = work / "f32.toml"
        f32.write_text(
            f'[backend]\nkind = "candle"\nmodel_id = "{GGUF}"\n[backend.options]\nweights = "f32"\n'
        )
        default = ROOT / "configs" / "default.toml"
        transformers = {
            "kind": "transformers",
            "model_id": str(checkpoint(cache)),
            "options": {"dtype": "float32"},
        }
        runs = [explain(work, "transformers", transformers)]
        runs.append(explain(work, "lmhost-f32", {"kind": "lmhost", "model_id": str(f32)}))
        runs.append(explain(work, "lmhost-default", {"kind": "lmhost", "model_id": str(default)}))
        runs.append(
            explain(work, "lmhost-default-inflight4", {"kind": "lmhost", "model_id": str(default)}, 4)
        )
    reference = runs[0]
    print("| backend | wall, s | vs Transformers | replies identical | max logprob gap | max value gap |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run in runs:
        ratio = reference["wall"] / run["wall"]
        print(f"| {run['name']} | {run['wall']:.1f} | {ratio:.1f}x | {compare(run, reference)} |")
    for run in runs:
        values = ", ".join(f"{v:+.4f}" for v in run["output"]["values"])
        print(f"{run['name']}: values [{values}]")


if __name__ == "__main__":
    main()
