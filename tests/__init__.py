"""The test suite.

The package leaves its host's environment alone; the test process, like `osa-memory`, opts out of
Haystack's usage telemetry here, before any test module imports Haystack (it reads the variable once).
"""

import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
