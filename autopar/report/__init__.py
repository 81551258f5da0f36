"""autopar.report (see the README's tour)."""
