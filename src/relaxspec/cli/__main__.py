"""``python -m relaxspec.cli``: the ``relaxspec`` command."""

from relaxspec.cli import main

if __name__ == "__main__":
    main()
