"""What waits for a person: reviews to decide, dead letters to replay or drop, and the
entries delivered and not acknowledged (``printery pending``)."""
