"""The long-running processes and what they serve: the workers' process
(:mod:`~printery.service.service`), the lifecycle it shares with ``printery service``, the
housekeeping sweeps (registry, retention, departed consumers, review deadlines), HTTP,
the ``/v1`` API and the web console."""
