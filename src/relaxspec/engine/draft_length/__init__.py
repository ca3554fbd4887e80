"""Draft length chosen per cycle for goodput: speculation that adapts to load (issue 14).

A fixed draft length K is right for one request and wrong under load: in a batched step every row
verifies K + 1 tokens, so the verifier's forward grows with B·(K + 1) tokens while the tokens a
row gains per cycle do not. :class:`GoodputDraftLength` picks, before each cycle, the K in
``0 .. k_max`` (0 = a plain AR step) that maximises expected committed tokens per *second*:

    E[tokens | K] = Σ_{i=0}^{K} Π_{j=1}^{i} α_j        (the i = 0 term: the bonus / recovered token)
    T(K, B)       = t_target(B·(K+1)) + K · t_draft(B)        (predicted; then measured, below)
    K*            = argmax_K  E[tokens | K] / T(K, B)

where α_j is the measured rate at which draft position j is accepted given that positions
``< j`` were (:class:`AcceptanceTracker`, exponentially decayed so it follows the workload),
``t_model(n)`` the seconds of one forward over n new tokens (matrix multiplies on a CPU cost far
from linearly in n at small n): measured once on an idle server (:func:`measure_step_costs`),
then corrected by every real forward the server runs (:class:`LiveStepCosts`: load from other
processes, batching holes), and B the number of rows that share the step (1 without batching).
Forwards are not the whole cycle: sampling and the rule over K + 1 full-vocabulary rows, text
and stop strings, and the wait for the other rows of a lockstep batch all grow with B and K. So
the policy also times every whole cycle (:class:`CycleCosts`): where a (B, K) cell was measured,
its measured seconds replace the prediction; elsewhere the prediction adds K + 1 rounds of the
per-round overhead measured in B's bucket (a lockstep round costs the same thread wake-ups and
bookkeeping whether it runs a draft or a verify forward). Because ``K = 0`` is always a
candidate, the policy only speculates where it expects more tokens per second than AR.

Three modules: the forward and cycle costs (:mod:`.costs`), the measured goodput of decision
windows (:mod:`.windows`) and the policy with its frozen knobs (:mod:`.policy`:
:class:`GoodputDraftLength`, :class:`DraftLengthSettings`).
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
