"""The offline training corpus (docs/design.md §5), built by the project's own code on the ground floor:
standard-library Python source, the synthetic math generator, and tokenized training streams."""
