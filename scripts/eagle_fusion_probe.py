"""Does EAGLE-3's multi-layer feature fusion pay at our depth? A paired fine-tuning probe.

Two copies of a trained head are fine-tuned for the same steps on the same batches:

- **final** — the head as it is: it reads the target's final (normed) feature ``f_t``;
- **fused** — it reads ``fuse([n(h_low) ; n(h_mid) ; f_t])``, a learned ``3H → H`` map of a low
  and a middle layer's residual stream (RMS-normalised, no weight) and the final feature
  (EAGLE-3 §3.3's low / mid / high features; vLLM's eagle3 default layers 2 and L // 2),
  initialised to pass ``f_t`` through, so it starts as the first arm and can only add what the
  lower layers know.

Both keep the EAGLE-1 objective (the target's final features and its law; train/eagle.py), one
step (the fused input only changes what the head reads at real positions, which is step 1 of a
chain). Reported: held-out step-1 accuracy (the head's top-1 equals the target's) on math and
code windows, before and after, for each arm. The batches come from the mixture the head (else
the target) records in its ``training.json``.

    OMP_NUM_THREADS=1 taskset -c 1 python scripts/eagle_fusion_probe.py --head models/eagle --steps 500

Figures: docs/models.md, "EAGLE-3's feature fusion".
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn

from relaxspec.data.tokens import training_data
from relaxspec.engine.proposers.eagle import EagleHead, load_eagle
from relaxspec.models import load_model
from relaxspec.train.draft_vocab import recorded_mixture
from relaxspec.train.eagle import CODE_EVAL_SETS, eagle_losses


def layer_features(target: nn.Module, ids: torch.Tensor, low: int, mid: int) -> tuple[torch.Tensor, ...]:
    """``(f, n(h_low), n(h_mid))``, each ``[B, T, H]``: the final normed feature and two layers'
    residual streams (``hidden_states[i]`` is layer i's output) RMS-normalised."""
    with torch.no_grad():
        out = target.get_decoder()(input_ids=ids, output_hidden_states=True)
        H = out.last_hidden_state.shape[-1]
        low_mid = [F.rms_norm(out.hidden_states[i].float(), (H,)) for i in (low, mid)]
        return out.last_hidden_state.float(), *low_mid


class Fuse(nn.Module):
    """``[h_low ; h_mid ; f] [.., 3H] -> [.., H]``, initialised to return ``f``."""

    def __init__(self, H: int) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * H, H, bias=False)
        with torch.no_grad():
            self.proj.weight.zero_()
            self.proj.weight[:, 2 * H :] = torch.eye(H)

    def forward(self, f: torch.Tensor, low: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([low, mid, f], dim=-1))


def step1(head: EagleHead, fuse: Fuse | None, target, ids, feats, noise: float) -> dict[str, torch.Tensor]:
    """Step-1 losses of one arm on windows ``ids`` with precomputed ``feats``."""
    f, low, mid = feats
    inputs = None if fuse is None else fuse(f, low, mid)
    return eagle_losses(head, target, ids, noise, 1, features=f, inputs=inputs)


@torch.no_grad()
def accuracy(head, fuse, target, windows: torch.Tensor, low: int, mid: int) -> float:
    """Mean step-1 accuracy over held-out ``windows[n, T]`` (no noise), batches of 8."""
    total = 0.0
    for start in range(0, len(windows), 8):
        ids = windows[start : start + 8]
        total += step1(head, fuse, target, ids, layer_features(target, ids, low, mid), 0.0)[
            "acc_1"
        ].item() * len(ids)
    return total / len(windows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default="models/eagle")
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--low", type=int, default=2)
    args = ap.parse_args()
    loaded = load_model(args.target)
    target = loaded.model.requires_grad_(False)
    mid = target.config.num_hidden_layers // 2
    mixture = recorded_mixture(args.head) or recorded_mixture(args.target)  # where the head was taught
    if mixture is None:
        raise SystemExit(f"neither {args.head} nor {args.target} records a training mixture")
    data, heldout = training_data(args.corpus, loaded.tokenizer, mixture, 256, heldout_windows=16)
    code = next(name for name in CODE_EVAL_SETS if name in heldout)
    base = load_eagle(args.head).head.float()
    H = base.config.hidden_size
    arms = {"final": (copy.deepcopy(base).train(), None), "fused": (copy.deepcopy(base).train(), Fuse(H))}

    def report(when: str) -> None:
        for name, (head, fuse) in arms.items():
            head.eval()
            acc = {s: accuracy(head, fuse, target, heldout[s], args.low, mid) for s in ("math_eval", code)}
            print(
                f"{when:>6} {name:6s} math {acc['math_eval']:.4f}  code ({code}) {acc[code]:.4f}", flush=True
            )
            head.train()

    report("before")
    optims = {
        name: torch.optim.AdamW([*head.parameters(), *(fuse.parameters() if fuse else [])], lr=args.lr)
        for name, (head, fuse) in arms.items()
    }
    for step in range(args.steps):
        ids = data.batch(0, step, 8, 256)
        feats = layer_features(target, ids, args.low, mid)  # one target forward for both arms
        for name, (head, fuse) in arms.items():
            losses = step1(head, fuse, target, ids, feats, noise=0.1)
            loss = losses["reg"] + 0.1 * losses["cls"]
            optims[name].zero_grad()
            loss.backward()
            optims[name].step()
        if (step + 1) % 50 == 0:
            print(f"step {step + 1}", flush=True)
    report("after")


if __name__ == "__main__":
    main()
