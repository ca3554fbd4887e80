"""Ground floor: pure tensor functions, no model loading or I/O.

The acceptance rules and ``verify`` (docs/design.md §2), the theory identities (§3), and the sampling
processing that turns logits into the ``p`` and ``q`` the rules see.
"""
