"""``python -m printery`` is ``printery``, the operator's tool (CONTRACT §1)."""

from printery.cli.operator import main

if __name__ == "__main__":
    main()
