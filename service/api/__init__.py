"""HTTP layer: schemas (`protocol`), request logic (`serving`) and thin routes (`routes`)."""
