"""lmhost as nlp-shap's backend, driven as nlp-shap's users drive it: its CLI and its Python API,
with ``backend.kind: lmhost`` found through the entry point the installed wheel declares.

Runs in .venv-nlp-shap (Python >= 3.12, scripts/setup-nlp-shap), with the wheel of
scripts/build-python installed.
"""

import asyncio
import json
import pathlib
import subprocess
import sys

import pytest
import yaml
from nlp_shap.domain.config import GenerationConfig
from nlp_shap.domain.conversation import AudioPart, ConversationSnapshot, Message, TextPart, Turn
from nlp_shap.domain.enums import Role
from nlp_shap.errors import BackendUnavailableError
from nlp_shap.pipeline.config import explain_config_from_yaml
from nlp_shap.pipeline.runner import ExplainRunner
from nlp_shap.plugins.builtin import default_registry

import lmhost
from lmhost.nlp_shap import LmhostBackend

ROOT = pathlib.Path(__file__).resolve().parents[2]
NLP_SHAP = pathlib.Path(sys.executable).parent / "nlp-shap"
DEFAULT = ROOT / "configs" / "default.toml"

SNAPSHOT = {
    "turns": [
        {
            "messages": [
                {"role": "system", "text": "Answer in one word."},
                {"role": "user", "text": "The sky is blue today."},
                {"role": "user", "text": "What colour is the sky?"},
            ]
        }
    ]
}
MESSAGES = [
    {"role": m["role"], "content": m["text"]} for m in SNAPSHOT["turns"][0]["messages"]
]
MOCK = {"kind": "mock", "model_id": "mock-model", "options": {"reply_words": 6}}


def nlp_shap_config(backend, value_fn="tfidf_cosine", archive="", kv_cache=True):
    """An nlp-shap config: exact Shapley over the snapshot's messages, 8-token greedy replies,
    one call at a time (so every coalition after the first finds a cached prefix)."""
    return {
        "backend": {"kind": "lmhost", **backend},
        "generation": {"max_new_tokens": 8},
        "explanation": {
            "estimator": "exact",
            "value_fn": value_fn,
            "players": "messages",
            "max_inflight": 1,
            "archive": {"path": str(archive), "on_exists": "overwrite"},
            "kv_cache": {"enabled": kv_cache, "max_entries": 8},
        },
    }


def run_cli(tmp_path, config, *command):
    """`nlp-shap <command> --config ...`: its exit code, stderr and JSON output (or None)."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    out = tmp_path / f"{command[0]}.json"
    done = subprocess.run(
        [NLP_SHAP, *command, "--config", config_file, "--out", out], capture_output=True, text=True
    )
    output = json.loads(out.read_text()) if done.returncode == 0 else None
    return done.returncode, done.stderr, output


def assert_efficient(output):
    """Exact Shapley values add up to v(all) - v(none)."""
    total = sum(output["values"])
    assert total == pytest.approx(output["grand_value"] - output["base_value"], abs=1e-9)


def test_the_entry_point_names_lmhost():
    registry = default_registry()
    assert "lmhost" in registry.names("nlp_shap.backends")
    assert registry.resolve_type("nlp_shap.backends", "lmhost") is LmhostBackend


@pytest.mark.parametrize("config", [DEFAULT, "mock"], ids=["smollm2", "mock"])
def test_cli_explains_and_reanalyzes_through_lmhost(tmp_path, config):
    """nlp-shap's CLI over lmhost: the run completes, its archive is written, the base
    generation is lmhost's own reply, lmhost's prefix cache served prompts, `reanalyze` gives the
    same values, efficiency holds."""
    if config == "mock":
        lmhost_config = tmp_path / "mock.toml"
        lmhost_config.write_text(
            '[backend]\nkind = "mock"\nmodel_id = "mock-model"\n[backend.options]\nreply_words = 6\n'
        )
    else:
        lmhost_config = config
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(SNAPSHOT))
    archive = tmp_path / "run"
    config = nlp_shap_config({"model_id": str(lmhost_config)}, archive=archive)
    code, stderr, explained = run_cli(tmp_path, config, "explain", "--snapshot", snapshot)
    assert code == 0, stderr
    assert explained["manifest"]["backend_kind"] == "lmhost"
    assert len(explained["values"]) == 3
    metrics = explained["metrics"]
    assert metrics["executed"] >= 7, "every coalition was generated"
    assert metrics["kv_cache_hits"] > 0 and metrics["kv_cache_reused_tokens"] > 0, metrics
    assert_efficient(explained)
    reply = lmhost.Host(str(lmhost_config)).generate(MESSAGES, max_new_tokens=8, top_k=1)
    assert (archive / "base_generation.txt").read_text() == reply["text"].strip()

    code, stderr, reanalyzed = run_cli(tmp_path, config, "reanalyze", "--archive", archive)
    assert code == 0, stderr
    assert reanalyzed["values"] == pytest.approx(explained["values"], abs=1e-12)


def test_python_api_with_the_backend_table_inline_and_logprob_values():
    """The lmhost `[backend]` table as `backend.options`, the `logprob` value function and the
    cache off: the grand coalition's value is the mean log-probability of lmhost's reply to the
    whole chat, and no prompt was served from a cache."""
    backend = {"model_id": "mock run", "options": MOCK}
    config = explain_config_from_yaml(yaml.safe_dump(nlp_shap_config(backend, "logprob", kv_cache=False)))
    output = ExplainRunner(config).explain_sync(ConversationSnapshot.from_json(json.dumps(SNAPSHOT)))
    assert_efficient(output.to_dict())
    assert output.to_dict()["metrics"]["kv_cache_reused_tokens"] == 0
    reply = lmhost.Host({"backend": MOCK}).generate(MESSAGES, max_new_tokens=8, top_k=1)
    mean = sum(reply["logprobs"]) / len(reply["logprobs"])
    assert output.to_dict()["grand_value"] == pytest.approx(mean, abs=1e-6)


@pytest.mark.parametrize(
    "toml, expected",
    [
        (None, "missing.toml"),
        ('[backend]\nkind = "mock"\nmodel_id = "m"\n[backend.options]\nreply_wrds = 6\n', "reply_wrds"),
    ],
    ids=["missing", "invalid"],
)
def test_a_config_that_cannot_open_is_backend_unavailable(tmp_path, toml, expected):
    """nlp-shap's CLI exits 3 ("backend unavailable") with lmhost's message inside, naming the
    file that is missing or the option that is wrong."""
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(SNAPSHOT))
    lmhost_config = tmp_path / "missing.toml"
    if toml is not None:
        lmhost_config.write_text(toml)
    config = nlp_shap_config({"model_id": str(lmhost_config)})
    code, stderr, _ = run_cli(tmp_path, config, "explain", "--snapshot", snapshot)
    assert code == 3, stderr
    assert "lmhost cannot open" in stderr and expected in stderr, stderr


def test_settings_and_parts_lmhost_refuses_are_value_errors():
    backend = LmhostBackend(_context({"model_id": "m", "options": MOCK}))
    snapshot = ConversationSnapshot.from_json(json.dumps(SNAPSHOT))
    with pytest.raises(ValueError, match="top_k"):
        asyncio.run(backend.generate(snapshot, GenerationConfig(top_k=-1)))
    audio = Message(role=Role.USER, content=(TextPart("Listen:"), AudioPart(b"RIFF", 16000)))
    with pytest.raises(ValueError, match="audio parts"):
        asyncio.run(backend.generate(ConversationSnapshot.from_turns((Turn((audio,)),)), GenerationConfig()))
    with pytest.raises(BackendUnavailableError, match="lmhost cannot open"):
        missing = LmhostBackend(_context({"model_id": "nowhere.toml"}))
        asyncio.run(missing.generate(snapshot, GenerationConfig()))


def test_records_carry_lmhosts_logprobs_and_embeddings_when_asked():
    backend = LmhostBackend(_context({"model_id": "m", "options": MOCK}))
    snapshot = ConversationSnapshot.from_json(json.dumps(SNAPSHOT))
    generation = GenerationConfig(max_new_tokens=8, compute_embeddings=True)
    record = asyncio.run(backend.generate(snapshot, generation))
    reply = lmhost.Host({"backend": MOCK}).generate(
        MESSAGES, max_new_tokens=8, top_k=1, compute_embeddings=True
    )
    assert record.text == reply["text"].strip()
    assert record.logprobs == pytest.approx(reply["logprobs"])
    assert record.embedding == pytest.approx(reply["embedding"]) and record.embedding
    assert record.contextual_embedding == pytest.approx(reply["contextual_embedding"])


def _context(backend):
    """The plugin context nlp-shap gives a backend it builds from `backend`."""
    from nlp_shap.plugins.context import PluginContext

    config = explain_config_from_yaml(yaml.safe_dump(nlp_shap_config(backend)))
    return PluginContext(config=config, registry=default_registry())
