"""A single comparison's whole-distribution figures (full_distribution=true; core.distribution).

Where both sides see the same context in a comparison: its cross-scores, where one side
teacher-forces the other's tokens. So each side that can writes its full rows as it generates
(parity_ui.engines.full_distribution), and per pair ONE cross-scoring direction meets them: the
reference scoring the side's tokens where the reference can (an hf reference: its figures read
KL(ref‖side) over the side's sequence, as in a scored workload), else the side scoring the
reference's tokens (an hf side). The pooled figures go on the comparison (`Comparison.distribution`:
which sequence, which scorer, the distribution family); a pair neither direction can serve is named.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ..core.distribution import ROWS_WHEN_GENERATING, ROWS_WHEN_SCORING, Budget, RowsUnavailable, pool, scratch_bytes
from ..core.requests import Rows
from ..core.types import DISTRIBUTION_COLUMNS, Finding, step_column
from .rows_scratch import scratch_dir


class CompareRows:
    def __init__(self, prep: Any, findings: list[Finding]):
        cfg = prep.config
        Budget(cfg.full_distribution_budget_mb).check(prep.model.vocab_size, cfg.max_new_tokens)
        self.k = max(cfg.logprobs, 1)
        self.ref = prep.reference.name
        writes = {p.name: p.kind.name in ROWS_WHEN_GENERATING for p in prep.sides}
        meets = {p.name: p.kind.name in ROWS_WHEN_SCORING for p in prep.sides}
        self.direction: dict[str, tuple[str, str]] = {}  # side -> (the generator whose rows, the scorer meeting them)
        for p in prep.sides[1:]:
            if meets[self.ref] and writes[p.name]:
                self.direction[p.name] = (p.name, self.ref)
            elif meets[p.name] and writes[self.ref]:
                self.direction[p.name] = (self.ref, p.name)
            elif cfg.cross_score:
                u = RowsUnavailable(
                    p.name,
                    p.kind.label,
                    f"and the reference {self.ref} ({prep.reference.kind.label}) "
                    "cannot meet each other's full rows (one must generate them, hf or vllm, and the "
                    "other score them, hf)",
                )
                findings.append(
                    Finding(
                        code="full-distribution-unavailable",
                        severity="warning",
                        message=u.message(),
                        fix="compare the full distribution with an hf side on one end",
                    )
                )
        if not cfg.cross_score and prep.sides[1:]:
            findings.append(
                Finding(
                    code="full-distribution-unavailable",
                    severity="warning",
                    message="full_distribution compares a comparison's sides where they see the same "
                    "context, its cross-scores, and cross_score is off: no distribution figures",
                    fix="--set cross_score=true",
                )
            )
            self.direction = {}
        self.writers = {g for g, _ in self.direction.values()}
        n = max(1, len(getattr(prep, "prompts", None) or ()))  # every prompt's rows wait for the cross-scoring
        self.dir = scratch_dir(
            scratch_bytes(prep.model.vocab_size or 0, cfg.max_new_tokens, n) * len(self.writers)
        ).path

    def _path(self, who: str, i: int) -> str:
        return os.path.join(self.dir, f"{who}-{i}.npy")

    def generate_rows(self, side: str, n: int) -> list[Rows] | None:
        return [Rows(write=self._path(side, i), k=self.k) for i in range(n)] if side in self.writers else None

    def score_rows(self, c: Any, scorer: str, prompt: int) -> Rows | None:
        """The rows a cross-scoring of comparison c by `scorer` meets (None: not this direction)."""
        gen, meeter = self.direction.get(c.b, (None, None))
        if meeter != scorer or gen not in (c.a, c.b):
            return None
        return Rows(read=self._path(gen, prompt), read_is="side" if scorer == self.ref else "ref", k=self.k)

    def record(self, c: Any, scored: Any) -> None:
        """The scalars the scorer returned, pooled onto the comparison."""
        cols = {name: step_column(scored, name) for name in DISTRIBUTION_COLUMNS}
        figs = pool([cols]).figures()
        if figs["positions"]:
            gen, scorer = self.direction[c.b]
            c.distribution = {"generator": gen, "scorer": scorer, **figs}

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
