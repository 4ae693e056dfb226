"""One exception hierarchy for feature definitions; each message names the object, the problem and the fix."""

from common.errors import FeaturectlError


class DefinitionError(FeaturectlError, ValueError):
    """A feature definition is invalid. Raised eagerly, when the object is built or the repo is validated."""

    def __init__(self, obj: str, problem: str, hint: str = ""):
        self.obj = obj
        self.problem = problem
        self.hint = hint
        msg = f"{obj}: {problem}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


class UnknownColumnError(DefinitionError):
    """A definition refers to a column its source does not have."""


class TypeMismatchError(DefinitionError):
    """A column has a type the operation cannot take (e.g. `sum` over a string)."""


class WindowError(DefinitionError):
    """A window is malformed, shorter than the tile, or not a whole number of tiles."""


class DuplicateNameError(DefinitionError):
    """Two objects of the same kind, or two features of one view, share a name."""


class UnknownReferenceError(DefinitionError):
    """A feature service names a view or feature that the repo does not define."""


class MissingTimestampError(DefinitionError):
    """An event source has no event-time field, so windows and point-in-time joins are impossible."""
