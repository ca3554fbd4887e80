"""Adapters that run relaxspec's rules inside other serving engines (docs/design.md §8: the vLLM
plugin). They adapt tensor layouts and call :mod:`relaxspec.core`; they never copy a rule."""
