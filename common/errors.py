"""The one exception root: every error featurectl reports to a user is a `FeaturectlError`, whose message says
what was wrong and what to do. The CLI catches it once and prints that one line; anything else is a bug and
keeps its traceback."""

from __future__ import annotations

import reprlib
import sys


class FeaturectlError(Exception):
    """A problem the user can act on; the message names it and the fix."""


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 60, 60
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = _SHOWN.maxset = 5


def shown(value: object) -> str:
    """A short repr of a value a user sent, for error messages: bounded in length and nesting, so that a huge or
    deeply nested input never makes its own error message huge or recurse past Python's limit."""
    return _SHOWN.repr(value)


def registry_unavailable(exc: BaseException) -> str | None:
    """The one line for a registry database that refused or dropped a connection (down, restarting, a wrong
    address), which a user fixes and is no bug; None for any other error. SQLAlchemy is looked up, not imported:
    a command that never loaded it cannot have failed on the database, and `--help` stays fast."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None or not isinstance(exc, sa_exc.OperationalError):
        return None
    detail = str(exc.orig if exc.orig is not None else exc).strip().splitlines()[0]
    return (f"the registry database is unavailable ({detail}); is it running? `featurectl services up --postgres` "
            "starts the local one, and `registry.path` in feature_store.yaml (or --registry) names the one used")
