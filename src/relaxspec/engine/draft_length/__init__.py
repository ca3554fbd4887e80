"""Draft length chosen per cycle for goodput: speculation that adapts to load (issue 14).

In a batched step every row verifies K + 1 tokens, so the verifier's forward grows with B·(K + 1)
tokens while the tokens a row gains per cycle do not. :class:`GoodputDraftLength` picks, before
each cycle, the K in ``0 .. k_max`` (0 = a plain AR step) that maximises committed tokens per second:

    E[tokens | K] = Σ_{i=0}^{K} Π_{j=1}^{i} α_j        (the i = 0 term: the bonus / recovered token)
    T(K, B)       = t_target(B·(K+1)) + K · t_draft(B)        (predicted, then measured)
    K*            = argmax_K  E[tokens | K] / T(K, B)

α_j: the decayed acceptance rate of draft position j given the earlier ones
(:class:`AcceptanceTracker`); ``t_model(n)``: one forward over n new tokens; B: rows in the step.
Modules: forward and cycle costs (:mod:`.costs`), the goodput of decision windows
(:mod:`.windows`), the policy and its frozen knobs (:mod:`.policy`). Measured behaviour under
load: docs/performance.md §6; the server's flags: docs/server.md ("Draft length that adapts to load").
"""

from relaxspec.engine.draft_length.costs import (
    TOKEN_COUNTS,
    Costs,
    CycleCosts,
    LiveStepCosts,
    StepCosts,
    ema,
    isotonic,
    measure_step_costs,
)
from relaxspec.engine.draft_length.policy import (
    AcceptanceTracker,
    DraftLengthSettings,
    GoodputDraftLength,
    best_draft_length,
    expected_tokens,
    needs_fixed_k,
)
from relaxspec.engine.draft_length.windows import WindowRates, rows_bucket

__all__ = [
    "TOKEN_COUNTS",
    "AcceptanceTracker",
    "Costs",
    "CycleCosts",
    "DraftLengthSettings",
    "GoodputDraftLength",
    "LiveStepCosts",
    "StepCosts",
    "WindowRates",
    "best_draft_length",
    "ema",
    "expected_tokens",
    "isotonic",
    "measure_step_costs",
    "needs_fixed_k",
    "rows_bucket",
]
