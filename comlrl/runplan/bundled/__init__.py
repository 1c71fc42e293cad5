"""The task configs shipped with comlrl (``comlrl configs`` lists them)."""
