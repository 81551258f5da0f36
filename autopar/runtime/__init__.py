"""autopar.runtime (see the README's tour)."""
