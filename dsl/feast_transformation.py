"""The Feast transformation an on-demand view registers as: Feast's "python" mode, with outputs as declared.

Feast's `apply` types an on-demand view's outputs by calling the function on made-up inputs and reading the
Python types of what comes back, even when a schema is given; a missing value (None, or NaN, which our
`OnDemandUdf` returns as None) has no type there, and the call runs the user's code on values it never gets.
The view's outputs are declared and checked when the view is built (`dsl.on_demand`), so they are Feast's answer.
Imported by `dsl.compile_feast` only when it builds Feast objects (Feast loads slowly).
"""

from __future__ import annotations

from typing import Any

from feast import Field
from feast.transformation.python_transformation import PythonTransformation

from dsl.transform import OnDemandUdf


class DeclaredOutputsTransformation(PythonTransformation):
    """A `PythonTransformation` of an `OnDemandUdf` whose inferred features are the udf's declared outputs."""

    udf: OnDemandUdf

    def infer_features(self, random_input: dict[str, Any], singleton: bool | None = False) -> list[Field]:
        return [Field(name=name, dtype=kind.feast_type()) for name, kind in self.udf.outputs.items()]
