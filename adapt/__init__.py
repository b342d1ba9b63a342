"""/adapt as one feature: the job's typed spec, the SQLite store and the corpus intake (torch-free: the API process
uses them), and the worker that runs a job's stages — split, train, export, evaluate, gate, publish."""
