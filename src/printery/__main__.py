"""``python -m printery`` is ``printery``, the operator's tool (docs/reference.md,
Commands)."""

from printery.cli.operator import main

if __name__ == "__main__":
    main()
