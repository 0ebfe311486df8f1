"""How often sybils hold a panel majority: a simulation over the pure draw (docs/panels.md).

`python -m bench.sim_panel_sybils [--panels N]` prints one JSON object: for each scenario the
share of N first-round panels (task keys 1..N, one secret) in which sybil verifiers hold at
least two of the three seats. The pool is issue 25's: 200 sybil registrations against 50
honest verifiers, everybody at the starting calibration unless a scenario says otherwise.

- `before`: the draw as it was (per verifier, weighted by calibration, no operator rule),
  recomputed here with the same HMAC so the figures compare;
- `one_identity`: the sybils register under one operator id (what an allow-list enforces,
  and what an operator who cannot mint identities is left with);
- `self_declared_ids`: open admission, each sybil declaring an operator id of its own;
- `self_declared_ids_honest_earned`: the same, with honest verifiers at an earned 0.9;
- `allowlist_unlisted`: an allow-list that admits the honest verifiers only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
from collections.abc import Callable

from panels import rules

SECRET = b"sybil-simulation-secret-0123456789"
ESCROW = "0x" + "e3" * 20


def _old_draw(task_key: str, pool: list[rules.Candidate]) -> list[rules.Candidate]:
    remaining = sorted(pool, key=lambda c: c.id)
    chosen = []
    for seat in range(rules.PANEL_SIZE):
        weights = [c.calibration_ppm for c in remaining]
        message = f"escrowd-panel-draw|{task_key}|1|{seat}".encode()
        r = int.from_bytes(hmac.new(SECRET, message, hashlib.sha256).digest(), "big") % sum(weights)
        chosen.append(remaining.pop(rules.pick_index(weights, r)))
    return chosen


def _new_draw(task_key: str, pool: list[rules.Candidate]) -> list[rules.Candidate]:
    return rules.draw(SECRET, task_key, 1, pool)


def majority_share(panels: int, pool: list[rules.Candidate], draw: Callable[..., list[rules.Candidate]]) -> float:
    """The share of `panels` draws with two or more seats held by ids starting with `s`."""
    held = 0
    for task in range(1, panels + 1):
        seats = draw(f"31337:{ESCROW}:{task}", pool)
        held += sum(c.id.startswith("s") for c in seats) >= 2
    return round(held / panels, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panels", type=int, default=5_000)
    n = parser.parse_args().panels
    start = rules.START_CALIBRATION_PPM
    honest = [rules.Candidate(f"h{i:03d}", f"honest-{i}", start) for i in range(50)]
    earned = [rules.Candidate(c.id, c.operator, 900_000) for c in honest]
    one_id = [rules.Candidate(f"s{i:03d}", "sybil", start) for i in range(200)]
    own_ids = [rules.Candidate(f"s{i:03d}", f"sybil-{i}", start) for i in range(200)]
    print(json.dumps({
        "panels": n,
        "pool": {"sybils": 200, "honest": 50},
        "sybil_majority_share": {
            "before": majority_share(n, one_id + honest, _old_draw),
            "one_identity": majority_share(n, one_id + honest, _new_draw),
            "self_declared_ids": majority_share(n, own_ids + honest, _new_draw),
            "self_declared_ids_honest_earned": majority_share(n, own_ids + earned, _new_draw),
            "allowlist_unlisted": majority_share(n, honest, _new_draw),
        },
    }, indent=2))


if __name__ == "__main__":
    main()
