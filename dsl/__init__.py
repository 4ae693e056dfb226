"""The feature DSL: declarative, validated definitions and their compilers (to Feast objects, to Flink SQL).

    from dsl import (Entity, EventSource, FeatureView, FeatureService, FeatureLogging, Aggregation, Attribute, col,
                     String, Vector)
    from dsl import RequestFields, on_demand      # request-time features (`dsl.on_demand`)
    from dsl import AssetSource, MESH_FEATURES    # features derived from 3D asset files (`dsl.assets`)
"""

from dsl.assets import MESH_FEATURES, AssetSource, ShapeDescriptor
from dsl.entity import Entity
from dsl.errors import (DefinitionError, DuplicateNameError, MissingTimestampError, TypeMismatchError,
                        UnknownColumnError, UnknownReferenceError, WindowError)
from dsl.expectations import AllowedValues, InRange, MaxChange, NotNullRate
from dsl.expr import col
from dsl.feature_logging import FeatureLogging
from dsl.feature_view import FeatureRef, FeatureService, FeatureView
from dsl.features import Aggregation, Attribute, Window
from dsl.on_demand import OnDemandView, RequestFields, on_demand
from dsl.repo import Repository, load_repo
from dsl.source import EventSource
from dsl.types import Bool, Float32, Float64, Int32, Int64, String, Timestamp, ValueType, Vector

__all__ = [
    "MESH_FEATURES", "Aggregation", "AllowedValues", "AssetSource", "Attribute", "Bool", "DefinitionError",
    "DuplicateNameError", "Entity", "EventSource", "FeatureLogging", "FeatureRef", "FeatureService", "FeatureView",
    "Float32", "Float64", "InRange", "Int32", "Int64", "MaxChange", "MissingTimestampError", "NotNullRate",
    "OnDemandView", "Repository", "RequestFields", "ShapeDescriptor", "String", "Timestamp", "TypeMismatchError",
    "UnknownColumnError", "UnknownReferenceError", "ValueType", "Vector", "Window", "WindowError", "col",
    "load_repo", "on_demand",
]
