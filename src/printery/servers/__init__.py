"""Redis-compatible server processes: starting one (:mod:`~printery.servers.process`) and
the embedded default of a data dir (:mod:`~printery.servers.embedded`). They manage
processes, not the wire, so they sit beside ``transport/`` rather than in it."""
