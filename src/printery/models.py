"""``printery.models``, as docs/reference.md names model steps: the names of
:mod:`printery.pipeline.models`, where they live."""

from printery.pipeline.models import *  # noqa: F403
from printery.pipeline.models import __all__  # noqa: F401
