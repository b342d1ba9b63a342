"""/adapt's worker half (torch): `embedder adapt-worker` claims a job from the store and runs its kind's declared
stages — split, train, export, evaluate, gate, publish."""
