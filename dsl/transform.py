"""An on-demand view's transformation as every runtime runs it: the online SDK and `featurectl serve`, training
sets, and Feast's own SDK (which calls `OnDemandUdf` as a Feast "python" mode function).

Columns in, columns out, one call per request over all its rows:
- mode `numpy` (the default): the function gets a dict of numpy arrays, one per input, and returns a dict of
  columns (arrays, lists or pandas Series; a scalar is repeated over the rows). Missing values follow pandas:
  a float or integer column with a missing value is float64 with NaN (an integer beyond 2**53 rounds), a string or
  bool column with one is an object array holding None. Not a pandas DataFrame: one row through a DataFrame (built
  from four inputs, two column operations, a frame of outputs) took about 1 ms here, against about 10 us with numpy
  arrays.
- mode `python`: the function gets one row at a time, a dict of Python values (None when missing, a float's NaN
  included), and returns a dict of values.
Outputs are checked against their declared types; NaN comes back as a missing value (None, Arrow null).
"""

from __future__ import annotations

import linecache
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from common.errors import FeaturectlError, shown
from dsl.types import FLOAT_TYPES, INT_RANGES, ValueType

MODES = ("numpy", "python")
INPUT_TYPES = (ValueType.STRING, ValueType.INT32, ValueType.INT64, ValueType.FLOAT32, ValueType.FLOAT64,
               ValueType.BOOL)
OUTPUT_TYPES = (ValueType.STRING, ValueType.INT64, ValueType.FLOAT64, ValueType.BOOL)
UDF_NAME = "featurectl_udf"  # the name Feast's registry records, and the variable that the registered text binds
Column = Sequence[Any] | Any  # a list of Python values, or a pyarrow Array / ChunkedArray


class TransformationError(FeaturectlError, ValueError):
    """An on-demand transformation failed on the rows given, or returned something other than its schema."""


def numpy_column(values: Column, kind: ValueType) -> np.ndarray:
    """One input column as the `numpy` mode's function sees it, from a list (online) or Arrow (training) alike."""
    return _INPUTS[kind](values)


def _object_column(values: Column) -> np.ndarray:
    if hasattr(values, "to_numpy"):
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=object)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _bool_column(values: Column) -> np.ndarray:
    if hasattr(values, "to_numpy"):
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=None if values.null_count else np.bool_)
    return _object_column(values) if None in values else np.array(values, dtype=np.bool_)


def _int_column(values: Column) -> np.ndarray:
    if hasattr(values, "to_numpy"):
        if values.null_count:
            return _float_column(values)
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.array(values, dtype=np.float64 if None in values else np.int64)  # None becomes NaN


def _float_column(values: Column) -> np.ndarray:
    """float64, an integer beyond 2**53 rounded to the nearest float64 alike from Arrow (whose safe cast refuses it)
    and from a list (as numpy converts it)."""
    if hasattr(values, "to_numpy"):
        import pyarrow as pa

        return np.asarray(values.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.float64)
    return np.array(values, dtype=np.float64)


_INPUTS: dict[ValueType, Callable[[Column], np.ndarray]] = {
    ValueType.STRING: _object_column, ValueType.BOOL: _bool_column, ValueType.INT32: _int_column,
    ValueType.INT64: _int_column, ValueType.FLOAT32: _float_column, ValueType.FLOAT64: _float_column}


def python_column(values: Column) -> list:
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)


class OnDemandUdf:
    """The transformation of one on-demand view: its function, mode, typed inputs and outputs, and the text it was
    built from. Pickled as that text (Feast's registry keeps a dill pickle beside the text), so a fresh process
    rebuilds it by running the text again, never by importing the repo's files."""

    def __init__(self, fn: Callable, mode: str, inputs: Mapping[str, str], outputs: Mapping[str, str], view: str,
                 text: str = ""):
        self.fn = fn
        self.mode = mode
        self.inputs = {name: ValueType(kind) for name, kind in inputs.items()}
        self.outputs = {name: ValueType(kind) for name, kind in outputs.items()}
        self.view = view
        self.text = text
        self.__name__ = UDF_NAME
        self._readers = [(name, _INPUTS[kind]) for name, kind in self.inputs.items()]  # per request: no lookups
        self._writers = [(name, _OUTPUTS[kind]) for name, kind in self.outputs.items()]
        # python mode hands a float input's NaN over as None, the missing value it is online (Redis stores no NaN)
        self._float_inputs = [i for i, kind in enumerate(self.inputs.values()) if kind in FLOAT_TYPES]

    def run(self, columns: Mapping[str, Column], rows: int) -> dict[str, list]:
        """The output columns (lists of Python values) for `rows` rows of the input `columns`."""
        inputs = {name: read(columns[name]) for name, read in self._readers} if self.mode == "numpy" else {}
        try:  # featurectl's reading of the inputs above is not the function's failure
            result = self._run_rows(columns) if self.mode == "python" else self.fn(inputs)
        except TransformationError:
            raise
        except Exception as exc:  # the user's code: any failure is reported with its view
            raise self._raised(exc) from exc
        return self._outputs(result, rows)

    def run_row(self, values: Sequence[Any]) -> list[Any]:
        """One row: its input values in `inputs` order (None when missing) -> its output values in `outputs` order.
        What `run` computes for a one-row column of each input, through the same readers and output checks, with
        no columns built around the call (the online 1-entity request)."""
        try:
            if self.mode == "python":
                if self._float_inputs:
                    values = list(values)
                    for i in self._float_inputs:
                        if values[i] != values[i]:
                            values[i] = None
                result = self._checked(self.fn(dict(zip(self.inputs, values))), "values")
            else:
                result = self.fn({name: read([value]) for (name, read), value in zip(self._readers, values)})
        except TransformationError:
            raise
        except Exception as exc:
            raise self._raised(exc) from exc
        if self.mode == "python":  # a value each: `convert` is what `column` does to a list of one value
            return [output.convert(self.view, name, result[name]) for name, output in self._writers]
        result = self._checked(result, "columns")
        return [output.column(self.view, name, result[name], 1)[0] for name, output in self._writers]

    def _raised(self, exc: Exception) -> TransformationError:
        return TransformationError(f"on-demand view `{self.view}`: the transformation raised {type(exc).__name__}: "
                                   f"{exc}; fix the function (missing values are NaN or None)")

    def _run_rows(self, columns: Mapping[str, Column]) -> dict[str, list]:
        names = list(self.inputs)
        values = [python_column(columns[name]) for name in names]
        for i in self._float_inputs:
            values[i] = _without_nan(values[i])
        out: dict[str, list] = {name: [] for name in self.outputs}
        for row in zip(*values):
            result = self._checked(self.fn(dict(zip(names, row))), "values")
            for name, column in out.items():
                column.append(result[name])
        return out

    def _outputs(self, result: Any, rows: int) -> dict[str, list]:
        result = self._checked(result, "columns")
        return {name: output.column(self.view, name, result[name], rows) for name, output in self._writers}

    def _checked(self, result: Any, what: str) -> Mapping:
        """`result` when it is a mapping holding every output."""
        if not isinstance(result, Mapping):
            raise TransformationError(f"on-demand view `{self.view}`: the transformation returned "
                                      f"{type(result).__name__}; return a dict of output {what}")
        if not self.outputs.keys() <= result.keys():
            missing = [name for name in self.outputs if name not in result]
            raise TransformationError(f"on-demand view `{self.view}`: the transformation returned no "
                                      f"{', '.join(f'`{m}`' for m in missing)}; it returned "
                                      f"{', '.join(map(str, result)) or 'nothing'}")
        return result

    def __call__(self, columns: dict[str, list]) -> dict[str, list]:
        """Feast's "python" mode: a dict of input lists (Feast adds join keys and other columns) -> output lists."""
        rows = len(next(iter(columns.values()))) if columns else 0
        return self.run(columns, rows)

    def __reduce__(self):
        return load_udf, (self.text, self.fn.__name__, self.mode, _type_names(self.inputs),
                          _type_names(self.outputs), self.view)

    def registered_text(self) -> str:
        """What Feast's registry keeps as the function's source: a call of `load_udf` on this text. Feast runs it
        with `exec` (and falls back to the pickle, which runs the same call)."""
        return (f"# featurectl on-demand view `{self.view}`: its transformation, rebuilt by dsl.transform.load_udf\n"
                "from dsl.transform import load_udf\n\n"
                f"{UDF_NAME} = load_udf(view={self.view!r}, function={self.fn.__name__!r}, mode={self.mode!r},\n"
                f"    inputs={_type_names(self.inputs)!r},\n    outputs={_type_names(self.outputs)!r},\n"
                f"    text={_text_literal(self.text)})\n")


def _text_literal(text: str) -> str:
    """`text` as a readable raw triple-quoted literal (opening on a line of its own), or its repr when it holds
    both kinds of triple quotes."""
    for quote in ("'''", '"""'):
        if quote not in text and not text.endswith("\\"):
            return f"r{quote}\n{text}{quote}"
    return repr(text)


def _type_names(schema: Mapping[str, ValueType]) -> dict[str, str]:
    return {name: kind.value for name, kind in schema.items()}


def load_udf(text: str, function: str, mode: str, inputs: Mapping[str, str], outputs: Mapping[str, str],
             view: str) -> OnDemandUdf:
    """Run `text` (a transformation's portable source, `dsl.portable`) and wrap the function it defines. Its lines
    are registered under `<on-demand view NAME>`, so tracebacks through the function show them."""
    filename = f"<on-demand view {view}>"
    text = text.lstrip("\n")  # the registered text opens its string literal on a line of its own
    namespace: dict[str, Any] = {"__name__": f"featurectl_on_demand_{view}"}
    exec(compile(text, filename, "exec"), namespace)  # noqa: S102: the repo's own code, as registered by `apply`
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    return OnDemandUdf(namespace[function], mode, inputs, outputs, view, text)


def output_values(view: str, name: str, value: Any, kind: ValueType, rows: int) -> list:
    """One returned column as a list of `kind` values (None when missing), or a TransformationError."""
    return _OUTPUTS[kind].column(view, name, value, rows)


@dataclass(frozen=True)
class _Output:
    """How a returned column becomes values of one output type. The usual columns, a numpy array of a kind in
    `array_kinds` or a list of `list_type` values, take a fast path (this runs per request); anything else goes
    through `convert`, value by value."""

    array_kinds: str
    list_type: type
    convert: Callable[[str, str, Any], Any]

    def column(self, view: str, name: str, value: Any, rows: int) -> list:
        if type(value) is not np.ndarray and type(value) is not list:  # the usual columns skip these checks
            if hasattr(value, "to_numpy"):  # a pandas Series
                value = value.to_numpy()
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                value = [value] * rows
        if len(value) != rows:
            raise TransformationError(f"on-demand view `{view}`: output `{name}` has {len(value)} values for "
                                      f"{rows} rows; return one value per row (or a scalar)")
        if isinstance(value, np.ndarray):
            if value.dtype.kind in self.array_kinds and value.dtype != _UINT64:
                if self.list_type is float:
                    return _without_nan((value if value.dtype == _FLOAT64 else value.astype(np.float64)).tolist())
                return value.tolist()
            value = value.tolist()
        elif set(map(type, value)) <= {self.list_type}:
            if self.list_type is float:
                return _without_nan(value)
            if self.list_type is not int or not value or _INT64[0] <= min(value) <= max(value) <= _INT64[1]:
                return list(value)
        return [self.convert(view, name, v) for v in value]


def _without_nan(values: list) -> list:
    """NaN is a missing value (NaN is the only value not equal to itself)."""
    return [None if v != v else v for v in values]


def _bad(view: str, name: str, value: Any, want: str) -> TransformationError:
    return TransformationError(f"on-demand view `{view}`: output `{name}` holds {type(value).__name__} "
                               f"{shown(value)}; it is declared {want}")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _float(view: str, name: str, value: Any) -> float | None:
    if _missing(value):
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _bad(view, name, value, "float64")
    out = float(value)
    return None if out != out else out


def _int(view: str, name: str, value: Any) -> int | None:
    if _missing(value):
        return None
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise _bad(view, name, value, "int64 (a whole number)")
    if not _INT64[0] <= int(value) <= _INT64[1]:
        raise _bad(view, name, value, "int64 (out of range)")
    return int(value)


def _bool(view: str, name: str, value: Any) -> bool | None:
    if _missing(value):
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(view, name, value, "bool")
    return bool(value)


def _str(view: str, name: str, value: Any) -> str | None:
    if _missing(value):
        return None
    if not isinstance(value, str):
        raise _bad(view, name, value, "string")
    return str(value)


_INT64 = INT_RANGES[ValueType.INT64]
_UINT64, _FLOAT64 = np.dtype(np.uint64), np.dtype(np.float64)
_OUTPUTS = {ValueType.FLOAT64: _Output("fiub", float, _float), ValueType.INT64: _Output("iu", int, _int),
            ValueType.BOOL: _Output("b", bool, _bool), ValueType.STRING: _Output("", str, _str)}
