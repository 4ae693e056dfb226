"""On-demand views: built and checked eagerly (inputs, outputs, the function and what it reads), collected by the
repository, and carried to other processes as text that rebuilds the same function."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections import OrderedDict
from math import log1p

import dill
import numpy as np
import pyarrow as pa
import pytest

from cli_helpers import ROOT
from dsl import (Attribute, Bool, DefinitionError, DuplicateNameError, Entity, EventSource, FeatureService,
                 FeatureView, Float64, Int32, Int64, OnDemandView, Repository, RequestFields, String, Timestamp,
                 TypeMismatchError, UnknownReferenceError, load_repo, on_demand)
from dsl.transform import OnDemandUdf, TransformationError

ITEM = Entity("item", join_keys={"item_id": String})
EVENTS = EventSource("item_events", {"item_id": String, "price": Float64, "stock": Int64, "label": String,
                                     "live": Bool, "at": Timestamp}, timestamp_field="at", path="items")
ITEMS = FeatureView("items", ITEM, EVENTS, [Attribute(c) for c in ("price", "stock", "label", "live", "at")])
BASKET = RequestFields("basket", {"quantity": Int64, "coupon": String})
SCALE = 2.5


def _halve(x):
    return x / 2


def unit_price(inputs):
    """Price per unit after the coupon."""
    discount = np.where(inputs["coupon"] == "HALF", 0.5, 1.0)
    return {"total": inputs["price"] * inputs["quantity"] * discount, "in_stock": inputs["stock"] >= inputs["quantity"]}


def odfv(fn=unit_price, **kwargs) -> OnDemandView:
    args = {"name": "pricing", "sources": [ITEMS[["price", "stock"]], BASKET],
            "schema": {"total": Float64, "in_stock": Bool}, "transformation": fn, **kwargs}
    return OnDemandView(**args)


def test_a_view_knows_its_inputs_and_runs_over_columns():
    view = odfv()
    assert view.feature_names == ["total", "in_stock"] and view.join_keys == {"item_id": String}
    assert view.udf.inputs == {"price": Float64, "stock": Int64, "quantity": Int64, "coupon": String}
    assert view.request_schema == {"quantity": Int64, "coupon": String}
    out = view.udf.run({"price": [2.0, None, 3.0], "stock": [5, 1, None], "quantity": [2, 1, 4],
                        "coupon": ["HALF", "", "x"]}, 3)
    assert out == {"total": [2.0, None, 12.0], "in_stock": [True, True, False]}  # NaN stock: not >= 4


def test_the_decorator_names_the_view_after_the_function_and_keeps_its_docstring():
    @on_demand(sources=[ITEMS[["price"]]], schema={"doubled": Float64})
    def doubled(inputs):
        """Twice the price."""
        return {"doubled": inputs["price"] * 2}

    assert isinstance(doubled, OnDemandView) and doubled.name == "doubled"
    assert doubled.description == "Twice the price."
    assert doubled.udf.run({"price": [1.5]}, 1) == {"doubled": [3.0]}


def test_python_mode_runs_once_per_row_with_plain_values():
    def per_row(row):
        label = row["label"] or "none"
        return {"title": f"{label}:{row['quantity']}", "rank": len(label)}

    view = odfv(per_row, mode="python", sources=[ITEMS[["label"]], BASKET], schema={"title": String, "rank": Int64})
    out = view.udf.run({"label": ["chair", None], "quantity": [1, 2], "coupon": ["", ""]}, 2)
    assert out == {"title": ["chair:1", "none:2"], "rank": [5, 4]}

    def forgets_rank(row):
        return {"title": "x"}

    with pytest.raises(DefinitionError, match=r"on a sample row: .* returned no `rank`; it returned title"):
        odfv(forgets_rank, mode="python", sources=[ITEMS[["label"]]], schema={"title": String, "rank": Int64})


def _seen(row):
    return {"seen": repr(row["x"])}


def test_python_mode_gets_a_float_nan_as_none_online_and_offline():
    """Redis keeps no NaN (materialize writes it as missing), so a per-row function sees None for it online; a
    training set's column may hold the NaN itself, and must hand the function the same None."""
    udf = OnDemandUdf(_seen, "python", {"x": "float64"}, {"seen": "string"}, "v")
    assert udf.run({"x": [float("nan"), None, 2.5]}, 3) == {"seen": ["None", "None", "2.5"]}
    assert udf.run({"x": pa.array([float("nan"), 2.5], pa.float64())}, 2) == {"seen": ["None", "2.5"]}
    assert [udf.run_row([value]) for value in (float("nan"), None, 2.5)] == [["None"], ["None"], ["2.5"]]



def test_an_int_column_missing_a_value_is_float64_alike_online_and_offline():
    """An Int64 input missing a value is float64, beyond 2**53 rounded: from a training set's Arrow column as from
    the online lists, and no error blamed on the function (Arrow's safe cast refuses the rounding)."""
    udf = OnDemandUdf(lambda inputs: {"same": inputs["n"]}, "numpy", {"n": "int64"}, {"same": "int64"}, "v")
    big = 2**53 + 1
    online = udf.run({"n": [big, None]}, 2)
    assert udf.run({"n": pa.chunked_array([pa.array([big, None], pa.int64())])}, 2) == online == \
        {"same": [2**53, None]}
    assert udf.run({"n": pa.array([big, 1], pa.int64())}, 2) == {"same": [big, 1]}  # no missing value: exact

def returning(value, kind: str) -> OnDemandUdf:
    return OnDemandUdf(lambda inputs: {"out": value}, "numpy", {"x": "float64"}, {"out": kind}, "v")


@pytest.mark.parametrize("value, kind, expected", [
    (np.array([1.0, np.nan]), "float64", [1.0, None]),
    ([1, None], "float64", [1.0, None]),
    (3, "float64", [3.0, 3.0]),  # a scalar repeats over the rows
    (np.array([1.0, np.nan]), "int64", [1, None]),  # integers with a missing value arrive as floats
    (np.array([7, 8], dtype=np.int32), "int64", [7, 8]),
    (np.array([True, False]), "bool", [True, False]),
    ([np.bool_(True), None], "bool", [True, None]),
    (np.array(["a", "b"]), "string", ["a", "b"]),
    (["a", None], "string", ["a", None]),
])
def test_outputs_become_values_of_their_types(value, kind, expected):
    assert returning(value, kind).run({"x": [0.0, 0.0]}, 2) == {"out": expected}


@pytest.mark.parametrize("value, kind, message", [
    (np.array([1.5, 2.0]), "int64", r"output `out` holds float 1.5; it is declared int64 \(a whole number\)"),
    ([1, 0], "bool", r"output `out` holds int 1; it is declared bool"),
    ([3, "x"], "string", r"output `out` holds int 3; it is declared string"),
    (["x", "y"], "float64", r"output `out` holds str 'x'; it is declared float64"),
    ([1.0], "float64", r"output `out` has 1 values for 2 rows; return one value per row \(or a scalar\)"),
])
def test_outputs_of_another_type_are_errors_naming_the_view(value, kind, message):
    with pytest.raises(TransformationError, match=r"on-demand view `v`: " + message):
        returning(value, kind).run({"x": [0.0, 0.0]}, 2)


def test_a_function_that_raises_or_returns_no_dict_is_an_error_naming_the_view():
    with pytest.raises(TransformationError, match=r"on-demand view `v`: the transformation returned list; return a "
                                                  r"dict of output columns"):
        OnDemandUdf(lambda inputs: [1], "numpy", {"x": "float64"}, {"out": "float64"}, "v").run({"x": [1.0]}, 1)
    with pytest.raises(TransformationError, match=r"the transformation raised KeyError: 'y'"):
        OnDemandUdf(lambda inputs: inputs["y"], "numpy", {"x": "float64"}, {"out": "float64"}, "v").run({"x": [1]}, 1)


ONE_ROW_INPUTS = {"s": "string", "i32": "int32", "i64": "int64", "f32": "float32", "f64": "float64", "b": "bool"}
# per input: values of its type, None (missing) and the edges (NaN, the int64 limits, unicode, empty)
ONE_ROW_VALUES = {"s": ["ünï ✓", "", None], "i32": [-(1 << 31), 0, None], "i64": [(1 << 63) - 1, -7, None],
                  "f32": [1.5, float("nan"), None], "f64": [-0.0, 1e300, None], "b": [True, False, None]}


def _every_input(inputs):
    """Reads each input the way a numpy-mode function does: arithmetic, comparisons, iteration; and says which
    dtypes it got."""
    dtypes = ",".join(str(inputs[name].dtype) for name in ONE_ROW_INPUTS)
    return {"text": [f"{s}|{b}|{dtypes}" for s, b in zip(inputs["s"], inputs["b"])],
            "total": inputs["i32"] + inputs["f32"] * inputs["f64"],
            "big": inputs["i64"] // 2 if inputs["i64"].dtype == np.int64 else inputs["i64"],
            "flag": (inputs["f64"] > 0) | (inputs["b"] == True)}  # noqa: E712: elementwise


def _every_input_row(row):
    f32, f64 = row["f32"], row["f64"]
    return {"text": f"{row['s']}|{row['b']}", "total": None if None in (row["i32"], f32, f64) else
            row["i32"] + f32 * f64, "big": None if row["i64"] is None else row["i64"] // 2,
            "flag": None if row["b"] is None else bool(f64 is not None and f64 > 0) or row["b"]}


@pytest.mark.parametrize("fn, mode", [(_every_input, "numpy"), (_every_input_row, "python")])
def test_one_row_gives_what_a_column_of_one_row_gives(fn, mode):
    """`run_row` (the online 1-entity call) computes what `run` (many rows, training sets) computes for the same
    row, for inputs of every type holding values, missing values and the edges."""
    udf = OnDemandUdf(fn, mode, ONE_ROW_INPUTS, {"text": "string", "total": "float64", "big": "int64",
                                                 "flag": "bool"}, "v")
    rows = [dict(zip(ONE_ROW_VALUES, values)) for values in zip(*ONE_ROW_VALUES.values())]
    rows += [{**rows[0], name: None} for name in ONE_ROW_INPUTS]  # one input missing at a time
    for row in rows:
        columns = udf.run({name: [value] for name, value in row.items()}, 1)
        assert udf.run_row(list(row.values())) == [columns[name][0] for name in udf.outputs], row
    first = ["ünï ✓|True", -(1 << 31) - 0.0, ((1 << 63) - 1) // 2, True]
    if mode == "numpy":
        first[0] += "|object,int64,int64,float64,float64,bool"
    assert udf.run_row(list(rows[0].values())) == first


@pytest.mark.parametrize("fn, mode, message", [
    (lambda inputs: [1], "numpy", r"the transformation returned list; return a dict of output columns"),
    (lambda inputs: inputs["y"], "numpy", r"the transformation raised KeyError: 'y'"),
    (lambda inputs: {"out": np.array([1.5, 2.0])}, "numpy", r"output `out` has 2 values for 1 rows"),
    (lambda inputs: {"out": ["x"]}, "numpy", r"output `out` holds str 'x'; it is declared float64"),
    (lambda row: [1], "python", r"the transformation returned list; return a dict of output values"),
    (lambda row: {}, "python", r"the transformation returned no `out`; it returned nothing"),
    (lambda row: {"out": "x"}, "python", r"output `out` holds str 'x'; it is declared float64"),
    (lambda row: {"out": True}, "python", r"output `out` holds bool True; it is declared float64"),
])
def test_one_row_fails_as_a_column_of_one_row_fails(fn, mode, message):
    udf = OnDemandUdf(fn, mode, {"x": "float64"}, {"out": "float64"}, "v")
    for run in (lambda: udf.run({"x": [1.0]}, 1), lambda: udf.run_row([1.0])):
        with pytest.raises(TransformationError, match=r"on-demand view `v`: " + message):
            run()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"sources": [ITEMS[["price"]], RequestFields("r", {"price": Float64})]}, DuplicateNameError,
     r"input `price` comes from both feature view `items` and request fields `r`"),
    ({"sources": [RequestFields("r", {"item_id": String})], "schema": {"x": Float64}}, None, None),
    ({"sources": [ITEMS[["price"]], RequestFields("r", {"item_id": String})]}, DuplicateNameError,
     r"request field `item_id` is a join key of an input view"),
    ({"schema": {"price": Float64}}, DuplicateNameError, r"output `price` has the name of an input or join key"),
    ({"schema": {"total": Int32}}, TypeMismatchError, r"output `total` has type 'int32'; use one of: string, int64"),
    ({"schema": {"event_timestamp": Float64}}, DefinitionError, r"output `event_timestamp` is reserved"),
    ({"schema": {}}, DefinitionError, r"declares no outputs"),
    ({"sources": [ITEMS[["at"]]]}, TypeMismatchError, r"input `items:at` has type timestamp"),
    ({"sources": ["items:price"]}, DefinitionError, r"is not a view, view\[\[\"feature\", ...\]\] or RequestFields"),
    ({"sources": ITEMS}, DefinitionError, r"sources must be a non-empty list"),
    ({"mode": "pandas"}, DefinitionError, r"unknown mode `pandas`; use one of: numpy, python"),
    ({"name": "bad name"}, DefinitionError, r"name `bad name` is not allowed"),
])
def test_inputs_and_outputs_are_checked_eagerly(kwargs, error, message):
    if error is None:  # a request field may share a join key's name when no stored input brings that key
        assert odfv(constant, **kwargs).join_keys == {}
        return
    with pytest.raises(error, match=message):
        odfv(**kwargs)


def constant(inputs):
    return {"x": 1.0}


def test_request_fields_are_typed_and_named():
    with pytest.raises(TypeMismatchError, match=r"request fields `r`: field `when` has type 'timestamp'; use one of: "
                                                r"string, int64, float64, bool"):
        RequestFields("r", {"when": Timestamp})
    with pytest.raises(DefinitionError, match=r"field `tile_start` is reserved"):
        RequestFields("r", {"tile_start": String})
    with pytest.raises(DefinitionError, match=r"declare no fields"):
        RequestFields("r", {})


def closure_maker():
    factor = 3

    def scaled(inputs):
        return {"total": inputs["price"] * factor, "in_stock": True}

    return scaled


class NotAFunction:
    def __call__(self, inputs):
        return {}


UNPICKLABLE = object()


def reads_an_object(inputs):
    return {"total": inputs["price"] * (UNPICKLABLE is None), "in_stock": True}


def two_arguments(inputs, other):
    return {}


def forgets_an_output(inputs):
    return {"total": inputs["price"]}


def fails_on_missing(inputs):
    if np.isnan(inputs["price"]).any():
        raise ValueError("no price")
    return {"total": inputs["price"], "in_stock": True}


@pytest.mark.parametrize("fn, message", [
    (lambda inputs: {}, r"the transformation is a lambda; write it as a `def`"),
    (NotAFunction(), r"the transformation must be a function, got NotAFunction"),
    ("unit_price", r"the transformation must be a function, got str"),
    (closure_maker(), r"reads variables of an enclosing function \(factor\)"),
    (reads_an_object, r"reads global `UNPICKLABLE` \(object\), which cannot be rebuilt in another process; a "
                      r"transformation may read modules"),
    (two_arguments, r"cannot be called with one argument \(a dict of input arrays\)"),
    (forgets_an_output, r"on a sample row: on-demand view `pricing`: the transformation returned no `in_stock`"),
    (fails_on_missing, r"on a row whose stored inputs are missing \(a new entity\): .* raised ValueError: no price"),
])
def test_the_transformation_is_checked_when_the_view_is_built(fn, message):
    with pytest.raises(DefinitionError, match=message):
        odfv(fn)


def uses_helpers(inputs):
    return {"total": _halve(inputs["price"]) * SCALE + log1p(0) + od_len(), "in_stock": inputs["stock"] > 0}


def od_len():
    return len(OrderedDict())


def test_the_text_binds_modules_constants_functions_and_helpers():
    text = odfv(uses_helpers).udf.text
    assert "from math import log1p" in text and "SCALE = 2.5" in text
    # functions of an importable module (this test module) travel by import; a repo file's by source (below)
    assert "from test_on_demand import _halve" in text and "from test_on_demand import od_len" in text
    assert text.rstrip().endswith('"in_stock": inputs["stock"] > 0}')
    columns = {"price": [4.0], "stock": [1], "quantity": [1], "coupon": [""]}
    assert odfv(uses_helpers).udf.run(columns, 1) == {"total": [5.0], "in_stock": [True]}


def test_the_repository_collects_views_and_checks_names():
    view = odfv()
    repo = Repository.of([view, FeatureService("svc", [view, ITEMS[["label"]]])])
    assert repo.on_demand == [view] and repo.views == [ITEMS]  # its input views come with it
    assert [r.view for r in repo.resolve_service(repo.services[0])] == ["pricing", "items"]
    with pytest.raises(DuplicateNameError, match=r"on-demand view `items`: has the name of a feature view"):
        Repository.of([odfv(name="items")])
    with pytest.raises(UnknownReferenceError, match=r"names unknown feature `pricing:discount`"):
        Repository.of([view, FeatureService("svc", ["pricing:discount"])])
    other = odfv(name="pricing2", sources=[ITEMS[["price", "stock"]], RequestFields("basket", {"quantity": Int64,
                                                                                               "coupon": Bool})])
    with pytest.raises(DuplicateNameError, match=r"request fields `basket`: are defined twice"):
        Repository.of([view, other])
    with pytest.raises(UnknownReferenceError, match=r"on-demand view `pricing`: has no feature discount"):
        view[["discount"]]


def test_a_repo_file_transformation_travels_to_a_fresh_process(tmp_path):
    """Repo files are imported under synthetic module names: the function still loads elsewhere, from the pickle
    Feast keeps and from the text Feast runs first."""
    (tmp_path / "features.py").write_text(textwrap.dedent('''
        import math
        import numpy as np
        from dsl import Entity, EventSource, FeatureView, Attribute, Float64, String, Timestamp, on_demand

        box = Entity("box", join_keys={"box_id": String})
        src = EventSource("boxes", {"box_id": String, "side": Float64, "at": Timestamp}, timestamp_field="at", path="b")
        boxes = FeatureView("boxes", box, src, [Attribute("side")])
        EXPONENT = 3

        def cube(x):
            return np.power(x, EXPONENT)

        @on_demand(sources=[boxes[["side"]]], schema={"volume": Float64, "log_volume": Float64})
        def box_volume(inputs):
            volume = cube(inputs["side"])
            return {"volume": volume, "log_volume": [math.log(v) if v > 0 else None for v in volume]}
        '''))
    view = load_repo(tmp_path).on_demand[0]
    assert all(part in view.udf.text for part in ("import math\n", "EXPONENT = 3\n", "def cube(x):"))
    body = dill.dumps(view.udf, recurse=True)
    assert b"featurectl_repo_" not in body
    script = textwrap.dedent('''
        import sys, dill
        pickled = dill.loads(sys.stdin.buffer.read())
        namespace = {}
        exec(sys.argv[1], namespace)  # what Feast does with the registered text before it tries the pickle
        rebuilt = namespace["featurectl_udf"]
        assert not [m for m in sys.modules if m.startswith("featurectl_repo_")]
        print(pickled({"side": [2.0, None]}), rebuilt({"side": [2.0, None]}))
        ''')
    done = subprocess.run([sys.executable, "-c", script, view.udf.registered_text()], input=body, cwd=ROOT,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    expected = {"volume": [8.0, None], "log_volume": [math.log(8.0), None]}
    assert done.stdout.decode().strip() == f"{expected} {expected}"
