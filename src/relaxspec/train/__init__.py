"""Training code for the bundled model family (DESIGN §5): tokenizer, AR models, and the loop
the block-proposer and diffusion trainings reuse."""
