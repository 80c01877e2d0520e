"""The settings: their tables, their documentation, and where they are loaded from."""
