"""The example repo: asset-centric features for a 3D asset marketplace and the Cube 3D generation service."""

import numpy as np

from dsl import (MESH_FEATURES, Aggregation, AssetSource, Attribute, Entity, EventSource, FeatureService, FeatureView,
                 Float64, Int64, RequestFields, ShapeDescriptor, String, Timestamp, col, on_demand)
from dsl import AllowedValues, InRange, NotNullRate  # data-quality expectations

asset = Entity("asset", join_keys={"asset_id": String}, description="a 3D asset in the catalog")
user = Entity("user", join_keys={"user_id": String}, description="a person browsing and generating assets")

interactions = EventSource(
    name="asset_interactions",
    schema={
        "asset_id": String,
        "user_id": String,
        "event_type": String,  # view | like | download | generate
        "dwell_ms": Int64,
        "event_time": Timestamp,
    },
    timestamp_field="event_time",
    kafka_topic="asset_interactions",
    path="asset_interactions",
    watermark_delay="5s",
    description="one event per interaction of a user with an asset",
)

catalog = EventSource(
    name="asset_catalog",
    schema={
        "asset_id": String,
        "category": String,
        "creator_id": String,
        "style": String,
        "bbox_x": Float64,
        "bbox_y": Float64,
        "bbox_z": Float64,
        "polygon_count": Int64,
        "updated_at": Timestamp,
    },
    timestamp_field="updated_at",
    kafka_topic="asset_catalog",
    path="asset_catalog",
    description="asset metadata, one row per change",
)

WINDOWS = ["10m", "1h", "24h"]
is_type = {kind: col("event_type") == kind for kind in ("view", "like", "download", "generate")}

asset_activity = FeatureView(
    name="asset_activity",
    entity=asset,
    source=interactions,
    tile="1m",
    ttl="2d",
    features=[
        Aggregation("count", windows=WINDOWS, filter=is_type["view"], name="views"),
        Aggregation("count", windows=WINDOWS, filter=is_type["like"], name="likes"),
        Aggregation("count", windows=WINDOWS, filter=is_type["download"], name="downloads"),
        Aggregation("count", windows=["1h", "24h"], filter=is_type["generate"], name="generations"),
        Aggregation("approx_distinct", "user_id", windows=["1h", "24h"], name="unique_users"),
        Aggregation("mean", "dwell_ms", windows=["1h"], filter=is_type["view"], name="dwell_ms_mean"),
        Aggregation("max", "dwell_ms", windows=["24h"], name="dwell_ms_max"),
        Aggregation("last", "user_id", windows=["24h"], name="last_user"),
    ],
    description="engagement with each asset over sliding windows",
    expectations=[InRange("views_24h", min=0), InRange("dwell_ms_mean_1h", min=0)],
)

asset_attributes = FeatureView(
    name="asset_attributes",
    entity=asset,
    source=catalog,
    tile="1h",
    ttl="365d",
    features=[Attribute(c) for c in ("category", "creator_id", "style", "bbox_x", "bbox_y", "bbox_z",
                                     "polygon_count")],
    description="static attributes of each asset, latest version",
    expectations=[
        NotNullRate("category", at_least=0.99),
        AllowedValues("style", ["realistic", "low_poly", "cartoon", "voxel", "sci_fi", "medieval"]),
        InRange("bbox_x", min=0), InRange("bbox_y", min=0), InRange("bbox_z", min=0),
    ],
)

user_activity = FeatureView(
    name="user_activity",
    entity=user,
    source=interactions,
    tile="5m",
    ttl="7d",
    features=[
        Aggregation("count", windows=["1h", "24h"], name="events"),
        Aggregation("count", windows=["24h"], filter=is_type["generate"], name="generations"),
        Aggregation("approx_distinct", "asset_id", windows=["24h"], name="unique_assets"),
    ],
    description="how active each user is",
)


# The meshes themselves: `featurectl datagen assets N` writes them and their list, `featurectl assets process`
# derives each changed one on Ray into this source's history and the view's offline table (then materializes it).
asset_meshes = AssetSource(
    name="asset_meshes",
    assets="assets/assets.parquet",
    embedding=ShapeDescriptor(bins=64),
    description="3D asset files, one row per derived version",
)

asset_geometry = FeatureView(
    name="asset_geometry",
    entity=asset,
    source=asset_meshes,
    tile="1h",
    ttl="3650d",
    features=[Attribute(c) for c in ["category", *MESH_FEATURES, "shape_d2"]],
    description="measured from each asset's mesh, with its D2 shape embedding (`featurectl assets similar`)",
)


@on_demand(sources=[asset_activity[["likes_24h", "views_24h"]], asset_attributes[["bbox_x", "bbox_y", "bbox_z"]]],
           schema={"likes_per_view_24h": Float64, "bbox_volume": Float64})
def asset_ratios(inputs):
    """Likes per view over 24 h (0 without views) and the bounding box's volume; NULL where an input is missing."""
    views = inputs["views_24h"]
    with np.errstate(divide="ignore", invalid="ignore"):
        likes_per_view = np.where(views == 0, 0.0, inputs["likes_24h"] / views)
    return {"likes_per_view_24h": likes_per_view, "bbox_volume": inputs["bbox_x"] * inputs["bbox_y"] * inputs["bbox_z"]}


generation_request = RequestFields("generation_request", {"prompt": String, "target_volume": Float64},
                                   description="what a generation request asks for")


@on_demand(sources=[generation_request, asset_attributes[["bbox_x", "bbox_y", "bbox_z"]]],
           schema={"prompt_length": Int64, "scale_to_target": Float64})
def generation_fit(inputs):
    """The prompt's length in characters, and the uniform scale that gives the asset the requested volume (NULL
    without a bounding box of positive volume)."""
    volume = inputs["bbox_x"] * inputs["bbox_y"] * inputs["bbox_z"]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.cbrt(inputs["target_volume"] / np.where(volume > 0, volume, np.nan))
    return {"prompt_length": [len(prompt) for prompt in inputs["prompt"]], "scale_to_target": scale}


asset_ranking = FeatureService(
    name="asset_ranking",
    features=[asset_activity, asset_attributes[["category", "style"]], asset_ratios],
    description="features of the asset ranking model",
)

cube3d_conditioning = FeatureService(
    name="cube3d_conditioning",
    features=[
        asset_attributes[["bbox_x", "bbox_y", "bbox_z", "category", "style"]],
        asset_activity[["views_24h", "likes_24h", "unique_users_24h"]],
    ],
    description="asset features that condition Cube 3D generation (bbox token + extra tokens)",
)
