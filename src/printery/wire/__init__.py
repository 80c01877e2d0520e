"""The wire format: the entry codec (``Envelope``, ``Codec``), entry fields and every key name."""
