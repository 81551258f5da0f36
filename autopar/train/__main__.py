"""``python -m autopar.train MODEL --plan ...`` (what ``torchrun -m autopar.train`` runs): the
same as ``autopar train``."""
import sys

from autopar.train.cli import main

sys.exit(main())
