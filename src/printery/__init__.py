"""printery: worker orchestration over Redis Streams."""
