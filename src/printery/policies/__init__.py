"""The policies of a step's entry pipeline: each its own module, one shape
(:class:`~printery.policies.base.Policy`), compiled once per step into a
:class:`~printery.policies.chain.Chain` in the order :mod:`printery.policies.order` gives
and docs/engine.md explains. A user's own are :class:`Middleware`."""

from printery.policies.middleware import Middleware

__all__ = ["Middleware"]
