"""The operator console's page, script and style sheet (served by :mod:`ingest.console`)."""
