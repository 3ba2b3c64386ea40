"""The Python package against the `lmhost` command: the same config and conversation must give
the same answer and the same attribution, in-process here and through the plugin libraries there.
"""

import json
import pathlib
import subprocess
import threading

import pytest

import lmhost

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = ROOT / "target" / "debug" / "lmhost"
SMOLLM2 = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

MESSAGES = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "The sky is blue today."},
    {"role": "user", "content": "What colour is the sky?"},
]


def mock(**options):
    return lmhost.Host(
        {
            "backend": {"kind": "mock", "model_id": "mock-model", "options": {"reply_words": 6, **options}},
            "explanation": {"players": "messages"},
        }
    )


def cli_explain(config, tmp_path, *flags):
    """`lmhost explain --json` on MESSAGES: its report as a dict."""
    conversation = tmp_path / "conversation.json"
    conversation.write_text(json.dumps({"messages": MESSAGES}))
    report = tmp_path / "report.json"
    subprocess.run(
        [CLI, "--quiet", "explain", "--config", config, "--conversation", conversation, "--json", report, *flags],
        check=True,
        capture_output=True,
    )
    return json.loads(report.read_text())


def test_generate_score_and_tokenize_agree():
    host = mock()
    answer = host.generate(MESSAGES)
    assert answer["text"] and len(answer["token_ids"]) == len(answer["logprobs"])
    again = host.generate(MESSAGES)
    assert (again["text"], again["logprobs"]) == (answer["text"], answer["logprobs"]), "deterministic"
    assert again["cached_prompt_tokens"] > 0, "the second call reuses the first one's prefix"
    score = host.score(MESSAGES, answer["text"])
    assert score["logprobs"] == pytest.approx(answer["logprobs"], abs=1e-6)
    assert score["total_logprob"] == pytest.approx(sum(answer["logprobs"]), abs=1e-5)
    tokens = host.tokenize(MESSAGES)
    assert len(tokens["token_ids"]) == len(tokens["pieces"]) > 0
    assert host.generate("What colour is the sky?")["text"], "a string is one user message"
    host.set_kv_cache(False)
    assert host.generate(MESSAGES)["cached_prompt_tokens"] == 0, "the cache is off"
    host.set_kv_cache(True, max_entries=4)
    host.generate(MESSAGES)
    assert host.generate(MESSAGES)["cached_prompt_tokens"] > 0
    stats = host.stats()
    assert stats["kv_cache_hits"] == 1 and stats["kv_cache_reused_tokens"] > 0, stats


def test_generation_settings_are_keyword_arguments():
    host = mock(reply_words=50)
    assert len(host.generate(MESSAGES, max_new_tokens=3)["token_ids"]) == 3
    with pytest.raises(lmhost.InvalidInputError, match="max_new_tken"):
        host.generate(MESSAGES, max_new_tken=3)
    with pytest.raises(lmhost.InvalidInputError, match="`top_k`: invalid value: integer `-1`"):
        host.generate(MESSAGES, top_k=-1)


def test_explanation_matches_the_command_line(tmp_path):
    config = tmp_path / "mock.toml"
    config.write_text(
        '[backend]\nkind = "mock"\nmodel_id = "mock-model"\n[backend.options]\nreply_words = 6\n'
        '[explanation]\nplayers = "messages"\n'
    )
    ex = lmhost.Host(str(config)).explain(MESSAGES)
    report = cli_explain(config, tmp_path)
    assert ex.reply == report["reply"]
    assert ex.values == pytest.approx([a["value"] for a in report["players"]], abs=1e-9)
    assert [p["text"] for p in ex.players] == [m["content"] for m in MESSAGES]
    assert sum(ex.values) == pytest.approx(ex.v_all - ex.v_none, abs=1e-9), "exact Shapley is efficient"
    assert ex.std_errors == [None, None, None]
    assert json.loads(ex.to_json())["players"] == report["players"]
    assert "<html" in ex.to_html() and len(ex) == 3


def test_interactions_are_a_keyword_argument_and_match_the_command_line(tmp_path):
    config = tmp_path / "mock.toml"
    config.write_text('[backend]\nkind = "mock"\nmodel_id = "mock-model"\n')
    ex = lmhost.Host(str(config)).explain(MESSAGES, interactions="pairs", interaction_index="sii")
    report = cli_explain(config, tmp_path, "--interactions", "pairs", "--interaction-index", "sii")
    assert ex.interactions == report["interactions"]
    assert [i["players"] for i in ex.interactions[3:]] == [["m0", "m1"], ["m0", "m2"], ["m1", "m2"]]
    # A player's SII is its Shapley value.
    assert [i["value"] for i in ex.interactions[:3]] == pytest.approx(ex.values, abs=1e-9)
    assert lmhost.Host(str(config)).explain(MESSAGES).interactions is None


def test_an_agent_trace_is_explained_as_the_command_line_explains_its_file(tmp_path):
    config = tmp_path / "mock.toml"
    config.write_text('[backend]\nkind = "mock"\nmodel_id = "mock-model"\n')
    trace = json.loads((ROOT / "examples" / "agent.json").read_text())
    ex = lmhost.Host(str(config)).explain(trace)
    report = tmp_path / "report.json"
    subprocess.run(
        [CLI, "--quiet", "explain", "--config", config, "--conversation", ROOT / "examples" / "agent.json",
         "--json", report],
        check=True,
        capture_output=True,
    )
    report = json.loads(report.read_text())
    assert [p["id"] for p in ex.players][2:4] == ["m2.call0", "m2.call1"]
    assert ex.values == pytest.approx([a["value"] for a in report["players"]], abs=1e-9)
    broken = dict(trace, messages=trace["messages"][:3] + [dict(trace["messages"][3], tool_call_id="nope")])
    with pytest.raises(lmhost.InvalidInputError, match=r"messages\[3\]: the tool message answers call \"nope\""):
        lmhost.Host(str(config)).explain(broken)


def test_sampling_settings_are_keyword_arguments():
    ex = mock().explain(MESSAGES, players="words", estimator="kernel", budget=64, seed=3)
    assert len(ex.values) == len(ex.players) > 3
    assert all(e is not None for e in ex.std_errors)


def test_image_regions_from_the_messages_are_players(tmp_path):
    """Regions on an image part are explain's players with `image_players="regions"`; the mock
    sees the red square inside the "ball" box, so that region ranks first for the answer "red"."""
    import base64
    import struct
    import zlib

    rows = b"".join(
        b"\x00" + b"".join(bytes([250, 10, 10] if 20 <= y < 28 and 36 <= x < 44 else [128] * 3) for x in range(64))
        for y in range(64)
    )

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    image = {
        "type": "image",
        "data_base64": base64.b64encode(png).decode(),
        "regions": [{"label": "sky", "box": [0, 0, 64, 16]}, {"label": "ball", "box": [34, 18, 46, 30]}],
    }
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
    ex = mock().explain(messages, reply="red", image_players="regions", estimator="exact")
    ball = ex.players[2]
    assert (ball["id"], ball["label"], ball["box"]) == ("m0.i0.r1", "ball", [34, 18, 46, 30])
    assert max(range(len(ex.values)), key=lambda i: abs(ex.values[i])) == 2
    hidden = mock().explain(messages, reply="red", image_players="regions", absence="hide", estimator="exact")
    assert hidden.values == pytest.approx(ex.values, abs=1e-9), "the mock forgets a hidden box as a painted one"
    with pytest.raises(lmhost.InvalidInputError, match="`audio_window` must be >= 0.02"):
        mock().explain(messages, reply="red", audio_players="windows", audio_window=0.001)


def test_progress_is_reported_and_an_exception_in_it_stops_the_run_keeping_its_values(tmp_path):
    host = mock()
    settings = dict(players="words", estimator="permutation", budget=48, batch_size=4)
    seen = []
    complete = host.explain(MESSAGES, progress=lambda done, planned: seen.append((done, planned)), **settings)
    assert seen and seen[-1][0] == seen[-1][1], seen
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    def stop_after_two_batches(done, planned):
        if done >= 8:
            raise KeyboardInterrupt

    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        host.explain(MESSAGES, run_dir=str(run_dir), progress=stop_after_two_batches, **settings)
    resumed = host.explain(MESSAGES, run_dir=str(run_dir), **settings)
    assert resumed.values == pytest.approx(complete.values, abs=1e-12)


def test_the_gil_is_released_while_the_backend_runs():
    host = mock(latency_ms=300)
    worker = threading.Thread(target=host.generate, args=(MESSAGES,))
    worker.start()
    spins = 0
    while worker.is_alive():
        spins += 1
    worker.join()
    # Holding the GIL for the call's 300 ms would leave this thread a handful of turns at most.
    assert spins > 10_000, spins


def test_errors_are_raised_by_kind(tmp_path):
    with pytest.raises(lmhost.PluginNotFoundError, match="no plugin named `nonesuch`"):
        lmhost.Host({"backend": {"kind": "nonesuch"}})
    with pytest.raises(lmhost.ConfigError, match="colour"):
        lmhost.Host({"backend": {"kind": "mock"}, "colour": 1})
    with pytest.raises(lmhost.ConfigError, match="reply_words"):
        lmhost.Host({"backend": {"kind": "mock", "options": {"reply_words": "six"}}})
    with pytest.raises(lmhost.FileError) as missing:
        lmhost.Host(str(tmp_path / "missing.toml"))
    assert isinstance(missing.value, OSError)
    host = mock()
    with pytest.raises(lmhost.InvalidInputError, match="role"):
        host.generate([{"role": "narrator", "content": "Once"}])
    with pytest.raises(ValueError, match="estimator"):
        host.explain(MESSAGES, estimator="guess")
    with pytest.raises(lmhost.InvalidInputError):
        host.explain(MESSAGES, players="paragraphs")


def test_candle_on_smollm2_matches_the_command_line(tmp_path):
    assert SMOLLM2.exists(), "scripts/fetch-models installs SmolLM2"
    config = tmp_path / "smollm2.toml"
    config.write_text(
        f'[backend]\nkind = "candle"\nmodel_id = "{SMOLLM2}"\n[generation]\nmax_new_tokens = 6\n'
        '[explanation]\nplayers = "messages"\n'
    )
    host = lmhost.Host(str(config))
    assert (host.plugin, host.model_id) == ("candle", str(SMOLLM2))
    ex = host.explain(MESSAGES)
    report = cli_explain(config, tmp_path)
    assert ex.reply == report["reply"] == host.generate(MESSAGES)["text"]
    assert ex.values == pytest.approx([a["value"] for a in report["players"]], abs=1e-4)
