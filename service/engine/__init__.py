"""Engine: per-model batching queues (`batcher`) and the set of served models with hot reload (`models`)."""
