"""Task scheduling: how a global trial budget is spread over the tasks of a model."""
