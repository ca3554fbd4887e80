"""Training the bundled model family (docs/design.md §5): tokenizer, the shared Accelerate loop, AR models,
drafter distillation, the block proposer, the diffusion drafter, survival signals; model cards."""
