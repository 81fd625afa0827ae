"""Component-tier fixtures: ``stack`` is the in-process dataplane stack (``_dataplane_stack``)."""

from _dataplane_stack import stack  # noqa: F401  (a fixture, found by pytest here)
