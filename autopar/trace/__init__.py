"""autopar.trace (see the README's tour)."""
