"""Run configs of the CoMLRL task repositories' experiments, bundled for ``comlrl train --config NAME``
(``comlrl configs`` lists them). Each file names its source and comlrl's few changes in its header."""
