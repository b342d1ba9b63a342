"""Domain adaptation worker: crop fine-tune → export → gate → publish (runs outside the API process)."""
