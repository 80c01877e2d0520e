"""Runs as an application and an operator see them: the :class:`~printery.runs.client.Client`,
the server's runs façade (:mod:`~printery.runs.facade`, shared by the client, ``/v1`` and
the console), reading a run's entries (:mod:`~printery.runs.reader`) and following it live
(:mod:`~printery.runs.tail`), its history, its cost and its replay."""
