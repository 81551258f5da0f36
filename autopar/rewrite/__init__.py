"""autopar.rewrite (see the README's tour)."""
