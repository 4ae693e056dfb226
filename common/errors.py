"""The one exception root: every error featurectl reports to a user is a `FeaturectlError`, whose message says
what was wrong and what to do. The CLI catches it once and prints that one line; anything else is a bug and
keeps its traceback."""

from __future__ import annotations


class FeaturectlError(Exception):
    """A problem the user can act on; the message names it and the fix."""
