"""Errors a user can fix. The CLI prints them as one line (no traceback) and exits non-zero.

Every message names the problem *and* the fix, e.g.
``plan field 'tp'=3 does not divide heads=96: choose tp in {1, 2, 4, 8, ...}``.
These live in costmodels (which never imports torch) so that every layer of autopar —
cost model, search, runtime — can raise the same family of errors.
"""


class AutoparError(Exception):
    """Base class: a problem in the user's input, reported as one clear line."""


class SpecError(AutoparError):
    """A model spec (preset, family settings, user code, hf config) is wrong."""


class TraceError(AutoparError):
    """The model could not be traced; the message names the operation and its source line."""


class ProfileError(AutoparError):
    """A hardware profile is missing or malformed; the message names the field."""


class PlanError(AutoparError):
    """A plan cannot exist for this model / cluster; the message names the constraint."""


class NoFeasiblePlanError(AutoparError):
    """The search found nothing that fits; the message says why and what would make it fit."""
