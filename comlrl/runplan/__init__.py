"""``comlrl train``'s run configuration: override syntax (``overrides``), value and key checks
(``values``), YAML + overrides -> ``RunPlan`` with every check and no model (``plan``), and the
bundled task configs (``bundled/``)."""
