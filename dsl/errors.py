"""One exception hierarchy for feature definitions; each message names the object, the problem and the fix."""

from common.errors import FeaturectlError, shown

_SHOWN_CHARS = 80


def backticked(name: object) -> str:
    """A user's name as messages quote it: in backticks, cut short when long, so a hostile name cannot flood the
    one line of its own error."""
    text = name if isinstance(name, str) else shown(name)
    return f"`{text[:_SHOWN_CHARS]}...`" if len(text) > _SHOWN_CHARS else f"`{text}`"


def _one_line(text: str) -> str:
    """Line breaks and other unprintable characters of a message escaped, as in a repr: the CLI prints one line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class DefinitionError(FeaturectlError, ValueError):
    """A feature definition is invalid. Raised eagerly, when the object is built or the repo is validated."""

    def __init__(self, obj: str, problem: str, hint: str = ""):
        self.obj = obj
        self.problem = problem
        self.hint = hint
        msg = f"{obj}: {problem}"
        if hint:
            msg += f"; {hint}"
        super().__init__(_one_line(msg))


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
