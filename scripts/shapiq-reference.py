"""Writes the interaction values shapiq's ExactComputer gives on stored games, which lmhost's
`interactions` must reproduce: explain/tests/data/shapiq_games.json.

The games: the README conversation's exact run (8 message players on the default model, its 256
coalition values read from a run directory), a planted game with effects of orders 1 to 3, and
a random game of 9 players. Each is stored with its values, so the Rust test needs neither the
model nor shapiq. Needs Python >= 3.12 with `shapiq` (PyPI, 1.8.0):
    $(pyenv root)/versions/3.12.1/bin/python3 -m venv /tmp/sq && /tmp/sq/bin/pip install shapiq==1.8.0
    target/release/lmhost -q explain --config configs/default.toml \
        --conversation examples/conversation.json --run-dir /tmp/readme-run
    /tmp/sq/bin/python scripts/shapiq-reference.py /tmp/readme-run \
        > explain/tests/data/shapiq_games.json
"""

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import shapiq

ROOT = Path(__file__).resolve().parent.parent
# lmhost's names for shapiq's indices.
INDICES = {"sii": "SII", "k-sii": "k-SII", "moebius": "Moebius"}


def readme_game(run_dir):
    """The README conversation's coalition values by mask (bit i: message i present), matched
    by the texts of the messages each stored prompt kept (the empty coalition's prompt is one
    empty message)."""
    conversation = json.loads((ROOT / "examples/conversation.json").read_text())
    texts = [m["content"] for m in conversation["messages"]]
    n = len(texts)
    values = [None] * (1 << n)
    db = sqlite3.connect(Path(run_dir) / "values.sqlite")
    for value, prompt_json in db.execute("SELECT value, prompt_json FROM coalition_values"):
        kept = [part["text"] for turn in json.loads(prompt_json) for message in turn["messages"]
                for part in message["parts"] if part["text"]]
        mask = sum(1 << texts.index(text) for text in kept)
        values[mask] = value
    missing = [mask for mask, v in enumerate(values) if v is None]
    if missing:
        sys.exit(f"{run_dir} lacks {len(missing)} of the {1 << n} coalitions: run exact first")
    return n, values


def planted_game():
    """Six players: a pair (0, 3), a triple (1, 4, 5), a main effect (2) and a size trend."""
    n = 6
    values = []
    for mask in range(1 << n):
        has = lambda *players: all(mask >> p & 1 for p in players)
        values.append(2.0 * has(0, 3) - 1.5 * has(1, 4, 5) + 0.7 * has(2)
                      + 0.3 * bin(mask).count("1") + 0.01 * np.sin(mask))
    return n, values


def random_game():
    n = 9
    return n, list(np.random.default_rng(0).normal(size=1 << n))


def computed(n, values, index, order):
    """shapiq's values of every subset of 1 to `order` players, keyed "i,j,..." (ascending);
    subsets shapiq leaves out (k-SII drops zeros) are 0."""
    table = np.array(values)

    def game(coalitions):
        masks = (coalitions.astype(np.int64) << np.arange(n)).sum(axis=1)
        return table[masks]

    result = shapiq.ExactComputer(n_players=n, game=game)(INDICES[index], order=order)
    return {",".join(map(str, players)): float(result.values[position])
            for players, position in result.interaction_lookup.items()
            if 1 <= len(players) <= order}


def main():
    games = [("readme", *readme_game(sys.argv[1])), ("planted", *planted_game()),
             ("random", *random_game())]
    out = {"shapiq_version": shapiq.__version__, "games": []}
    for name, n, values in games:
        indices = [{"index": index, "order": order, "values": computed(n, values, index, order)}
                   for index in INDICES for order in (2, n)]
        out["games"].append({"name": name, "n": n, "values": [float(v) for v in values],
                             "indices": indices})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
