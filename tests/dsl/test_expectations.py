"""Expectations are validated with their view: each error names the view, the expectation and what to write."""

from __future__ import annotations

import dataclasses

import pytest

from dsl import (AllowedValues, Attribute, Aggregation, Bool, DefinitionError, Entity, EventSource, FeatureView,
                 Float64, InRange, Int64, MaxChange, NotNullRate, String, Timestamp, TypeMismatchError)
from dsl.view_version import changes, view_definition, view_version
from dsl.compile_flink import SourceSettings, compile_view

SHOP = Entity("shop", join_keys={"shop_id": Int64})
SALES = EventSource("sales", {"shop_id": Int64, "amount": Float64, "kind": String, "paid": Bool, "t": Timestamp},
                    timestamp_field="t", kafka_topic="sales", path="sales")
FEATURES = [Aggregation("sum", "amount", windows=["1h"], name="revenue"), Aggregation("count", windows=["1h"]),
            Attribute("kind"), Attribute("paid")]


def view(*expectations) -> FeatureView:
    return FeatureView("shop_sales", SHOP, SALES, FEATURES, tile="1h", expectations=list(expectations))


def test_valid_expectations_are_kept_in_order_with_their_labels():
    built = view(InRange("revenue_1h", min=0, max=1e6), NotNullRate("kind", at_least=0.99),
                 AllowedValues("kind", ["online", "store"]), AllowedValues("paid", [True]),
                 AllowedValues("count_1h", [0, 1, 2]), MaxChange("revenue_1h", relative=0.5))
    assert [e.label for e in built.expectations] == [
        "InRange(revenue_1h, min=0, max=1000000.0)", "NotNullRate(kind, at_least=0.99)",
        "AllowedValues(kind, values=['online', 'store'])", "AllowedValues(paid, values=[True])",
        "AllowedValues(count_1h, values=[0, 1, 2])", "MaxChange(revenue_1h, relative=0.5)"]
    assert isinstance(built.expectations, tuple)


@pytest.mark.parametrize("expectation, error, message", [
    (InRange("revenue_24h", min=0), DefinitionError,
     r"feature view `shop_sales`, expectation `InRange\(revenue_24h, min=0\)`: the view has no feature "
     r"`revenue_24h`; name one of: revenue_1h, count_1h, kind, paid"),
    (InRange("kind", min=0), TypeMismatchError,
     r"expectation `InRange\(kind, min=0\)`: `InRange` needs a numeric feature, `kind` is string; check strings"),
    (InRange("revenue_1h"), DefinitionError, r"`InRange\(revenue_1h\)`: has neither `min` nor `max`; give at least"),
    (InRange("revenue_1h", min=5, max=1), DefinitionError, r"`min` 5 is above `max` 1; swap them"),
    (InRange("revenue_1h", min="0"), DefinitionError, r"`min` '0' is not a finite number; write e.g. min=0"),
    (InRange("revenue_1h", max=float("nan")), DefinitionError, r"`max` nan is not a finite number"),
    (InRange("revenue_1h", min=True), DefinitionError, r"`min` True is not a finite number"),
    (NotNullRate("kind", at_least=1.5), DefinitionError, r"`at_least` 1.5 is not a share from 0 to 1; write e.g. "
                                                         r"at_least=0.99"),
    (AllowedValues("revenue_1h", [1.0]), TypeMismatchError, r"`AllowedValues` needs a string, integer or boolean "
                                                             r"feature, `revenue_1h` is float64; bound numbers"),
    (AllowedValues("kind", []), DefinitionError, r"`values` is empty; write e.g. AllowedValues\("),
    (AllowedValues("kind", "online"), DefinitionError, r"`values` 'online' is not a list"),
    (AllowedValues("kind", ["online", 3]), TypeMismatchError, r"value 3 is not of type string, the feature's; list "
                                                              r"string values only"),
    (AllowedValues("count_1h", [1, True]), TypeMismatchError, r"value True is not of type int64"),
    (AllowedValues("paid", [1]), TypeMismatchError, r"value 1 is not of type bool"),
    (MaxChange("kind"), TypeMismatchError, r"`MaxChange` needs a numeric feature, `kind` is string"),
    (MaxChange("revenue_1h", relative=0), DefinitionError, r"`relative` 0 is not a positive number; write e.g. "
                                                           r"relative=0.5"),
    (MaxChange("revenue_1h", relative=10 ** 400), DefinitionError, r"`relative` .* is not a positive number"),
])
def test_bad_expectations_name_the_view_the_expectation_and_the_fix(expectation, error, message):
    with pytest.raises(error, match=message):
        view(expectation)


def test_something_that_is_not_an_expectation_or_listed_twice():
    with pytest.raises(DefinitionError, match=r"feature view `shop_sales`: expectation 'revenue_1h >= 0' is not an "
                                              r"expectation; use InRange\(...\), NotNullRate"):
        view("revenue_1h >= 0")
    with pytest.raises(DefinitionError, match=r"expectation `InRange\(revenue_1h, min=0\)`: is listed twice"):
        view(InRange("revenue_1h", min=0), InRange("revenue_1h", min=0))


def test_expectations_are_in_the_definition_but_not_in_the_version():
    """Checks change no value: the version (what makes backfills stale) stays, `plan` shows them as a change."""
    bare, checked = view(), view(InRange("revenue_1h", min=0), AllowedValues("kind", ["a", "b", "c", "d", "e", "f"]))
    settings = SourceSettings("", "/data")
    assert view_version(bare, compile_view(bare, settings)) == view_version(checked, compile_view(checked, settings))
    assert "expectations" not in view_definition(bare)
    found = changes(view_definition(bare), view_definition(checked))
    assert [c.path for c in found] == ["expectations"]
    assert view_definition(checked)["expectations"][1] == {"check": "AllowedValues", "feature": "kind",
                                                           "values": ["a", "b", "c", "d", "e", "f"]}
    assert dataclasses.replace(checked, expectations=list(checked.expectations)) == checked
