"""The N-replica leg of bench/cluster.py's free-running workload alone, its tokens checked against a run
already stored (the 1-replica leg of an earlier bench/cluster.py run, in that run's database): for a GPU
session whose first call ran out of time after the 1-replica leg.

    python3 bench/cluster_free_n.py --against /tmp/bench-cluster-XXXX/runs.db --free-prompts 32 --chunk 8 --out $OUT
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster  # noqa: E402  (bench/cluster.py: the same config, prompts and run)


def main() -> int:
    ap = cluster.argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--against", required=True, help="the database holding the 1-replica free run")
    for a, kw in (("--model", {"default": cluster.os.environ.get("PARITY_DEMO_MODEL", "demo")}),
                  ("--free-prompts", {"type": int, "default": 32}), ("--tokens", {"type": int, "default": 128}),
                  ("--dtype", {"default": "bfloat16"}), ("--batch", {"type": int, "default": 64}),
                  ("--chunk", {"type": int, "default": 8}), ("--replicas", {"type": int, "default": 2}),
                  ("--out", {"default": "."})):
        ap.add_argument(a, **kw)
    args = ap.parse_args()
    args.small = False
    from parity_ui.service import ParityService

    old = ParityService(db_path=args.against)
    row = sqlite3.connect(args.against).execute(
        "SELECT id FROM runs WHERE kind = 'workload' AND status IN ('ok', 'diverged') ORDER BY datetime_utc DESC LIMIT 1").fetchone()
    base = old.get_run(row[0])
    base_tokens = {s: [list(p.results[s].token_ids) for p in base.prompts] for s in ("ref", "b")}
    old.close()
    svc = ParityService(db_path=str(Path(args.against).with_name("runs-n.db")))
    try:
        res = cluster.one(svc, args, "free", args.free_prompts, "local", args.replicas)
    finally:
        svc.close()
    differ = {s: sum(a != b for a, b in zip(res["tokens"][s], base_tokens[s])) for s in ("ref", "b")}
    res["against_run"] = row[0]
    res["prompts_with_other_tokens"] = differ
    tokens = res.pop("tokens")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "cluster-free-n.json").write_text(json.dumps(res, indent=1, default=str))
    cluster.say(f"free {args.replicas} replicas: wall {res['wall_s']} s, work {res['work_s']} s; prompts with other "
                f"tokens than the 1-replica run: {differ} (of {len(tokens['ref'])})")
    return 0 if not any(differ.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
