"""The declarations a step's policies enforce: ``Limit`` and ``Budget``."""
