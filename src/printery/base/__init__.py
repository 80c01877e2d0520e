"""The base every room stands on: the error tree and ``Reason``, the ``Worker`` protocol, backoff, helpers."""
