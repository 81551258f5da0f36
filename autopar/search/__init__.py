"""autopar.search (see the README's tour)."""
