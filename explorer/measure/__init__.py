"""Measurement: request rows and percentiles (metrics), prompt sets and quality (workload), the bench and its
sweeps, the HTML report, the distribution audit, and the app's load test. Reads traces; decodes through the API."""
