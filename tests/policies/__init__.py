"""Each policy of the chain alone (docs/engine.md, The chain of policies): a package, so its test files may share their names with the integration tests of the same feature."""
