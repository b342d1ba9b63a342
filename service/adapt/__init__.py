"""/adapt in the API process: routes, schemas, the SQLite job store and the worker supervisor (torch-free)."""
