"""The one exception root: every error featurectl reports to a user is a `FeaturectlError`, whose message says
what was wrong and what to do. The CLI catches it once and prints that one line; anything else is a bug and
keeps its traceback."""

from __future__ import annotations

import reprlib


class FeaturectlError(Exception):
    """A problem the user can act on; the message names it and the fix."""


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 60, 60
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = _SHOWN.maxset = 5


def shown(value: object) -> str:
    """A short repr of a value a user sent, for error messages: bounded in length and nesting, so that a huge or
    deeply nested input never makes its own error message huge or recurse past Python's limit."""
    return _SHOWN.repr(value)
