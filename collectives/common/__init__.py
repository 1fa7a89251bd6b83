"""The ground layer: what every other layer may import and which imports no other layer.

The exceptions (errors.py), reduce ops and their kernels (ops.py), the environment (config.py),
the buffer type alias (types.py), the library's log lines (logs.py), a rate limit for warnings
(throttle.py), shared docstring sections (apidoc.py), the job's secret (secret.py) and job security, the
CURVE keys derived from it and the ZAP guard of every socket (security.py).
"""
