"""The deployment pipeline: printery's own application, built on the public API only.

The modules here hold the deployment domain as plain functions (validation, probes,
webhook delivery, the outcome merge) so the workers that drive them stay thin and the
rules can be tested without Redis. This package imports nothing from printery but its
top-level names; import-linter enforces that.
"""
