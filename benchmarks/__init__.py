"""Benchmarks of haystack-osa-memory: one script per question, sharing ``benchmarks.harness``.

Run a script as ``python -m benchmarks.<name>`` or ``python benchmarks/<name>.py`` (see README.md).
"""
