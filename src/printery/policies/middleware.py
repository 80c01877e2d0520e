"""What a user adds to a step's calls and commits: :class:`Middleware`, declared with
``middleware=`` on a :class:`~printery.Pipeline` (every step) or on a step
(docs/reference.md, Middleware). Dramatiq's middleware and watermill's
``HandlerMiddleware`` are the models: one object, hooks with defaults, applied in the
order given (the first outermost), the pipeline's around the step's."""

from __future__ import annotations

from collections.abc import Sequence

from printery.policies.base import Call, Policy
from printery.runtime.consumer import Delivery
from printery.runtime.handler import Handler, HandlerResult, Message, Output, outputs_of

__all__ = ["Middleware", "UserMiddleware"]


class Middleware:
    """Override :meth:`call` to act around each handler call (redact what reaches the
    model, time it, refuse it), :meth:`commit` to commit more outputs with the call's (an
    audit record: written atomically with them, or not at all). What either raises fails
    the entry's call as its handler's would (retried, then dead-lettered); its timeout
    covers both."""

    async def call(self, message: Message, call_next: Handler) -> HandlerResult:
        """Call the step with ``message`` (or a :func:`dataclasses.replace` of it:
        another ``envelope``, its costs still counted), and return what it returns or
        what should be committed instead."""
        return await call_next(message)

    def commit(self, message: Message, outputs: list[Output]) -> Sequence[Output]:
        """More outputs to commit with ``outputs``, the call's (none by default)."""
        return ()


class UserMiddleware(Policy):
    """A :class:`Middleware` in the chain (its ``wrap``; the hooks it does not override
    cost nothing)."""

    name = "middleware"

    def __init__(self, middleware: Middleware) -> None:
        if not isinstance(middleware, Middleware):
            raise TypeError(f"middleware= takes Middleware instances, not {middleware!r}")
        self.middleware = middleware

    def wrap(self, call: Call) -> Call:
        user = self.middleware
        around = type(user).call is not Middleware.call
        adds = type(user).commit is not Middleware.commit

        async def wrapped(delivery: Delivery, message: Message) -> HandlerResult:
            if around:
                async def call_next(passed: Message) -> HandlerResult:
                    return await call(delivery, passed)
                result = await user.call(message, call_next)
            else:
                result = await call(delivery, message)
            if not adds:
                return result
            outputs = outputs_of(result)
            return [*outputs, *outputs_of(list(user.commit(message, outputs)))]

        return wrapped
