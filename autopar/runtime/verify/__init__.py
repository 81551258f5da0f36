"""Equivalence with the serial model: one plan against the single-process run (`serial`, what
`autopar verify` runs) and samples of the plan space in one shared gloo world (`sweep`)."""
