"""The test suite: a regular package, so that a subprocess importing `tests.…` finds this one and not a top-level
`tests` package some installed dependency ships (the `cwe` data package does)."""
