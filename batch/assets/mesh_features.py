"""A mesh's derived features: what `dsl.assets.MESH_FEATURES` declares, measured with trimesh, plus the D2 shape
distribution (Osada et al., 2002) as a fixed-size embedding.

D2 is the histogram of distances between random pairs of points on the surface. It needs no alignment (it is
invariant to rotation and translation), dividing the distances by their mean makes it invariant to scale, it is
robust to tessellation (points are sampled by area, not taken from vertices) and to small defects (holes, several
components), and it costs one sampling pass. The histogram is taken as probabilities and its square root stored,
so the vector has unit L2 norm and L2 (or cosine) distance between two vectors is a monotone function of the
Hellinger distance between the two distributions: nearest neighbours by L2 are nearest shapes by D2.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dsl.assets import ShapeDescriptor

D2_RANGE = 3.0  # distances / mean distance above this go into the last bin (a sphere's maximum is 2.0 / 0.75 ~ 2.7)


class MeshDecodeError(ValueError):
    """A file that is not a readable mesh with faces; the message is the reason recorded for the asset."""


@dataclass(frozen=True)
class MeshFeatures:
    values: dict[str, Any]  # name -> value, one per `dsl.assets.MESH_FEATURES` entry (volume None when not watertight)
    embedding: np.ndarray  # float32 [descriptor.bins], unit L2 norm


def decode_mesh(data: bytes, file_type: str, path: Optional[Path] = None):
    """One `trimesh.Trimesh` from a file's bytes, as `trimesh.load(path, force="mesh")` reads it (a scene's
    geometry concatenated; `path` resolves the files it refers to, a glTF's buffers or an OBJ's materials, beside
    it); MeshDecodeError otherwise, and for a mesh with vertices that are not finite: trimesh's load drops them with
    the faces that use them, so they are looked for in the geometry as parsed, before any processing."""
    import trimesh
    from trimesh.resolvers import FilePathResolver

    resolver = FilePathResolver(str(path)) if path is not None else None
    try:
        mesh = trimesh.load(io.BytesIO(data), file_type=file_type, resolver=resolver, force="mesh")
        raw = trimesh.load_scene(io.BytesIO(data), file_type=file_type, resolver=resolver, process=False)
    except Exception as exc:  # trimesh raises whatever its parsers raise on a broken file
        raise MeshDecodeError(f"not a readable {file_type} mesh: {type(exc).__name__}: {exc}") from None
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise MeshDecodeError(f"the {file_type} file holds no triangles")
    for geometry in raw.geometry.values():
        if isinstance(geometry, trimesh.Trimesh) and not np.isfinite(geometry.vertices).all():
            raise MeshDecodeError(f"the {file_type} file has vertices that are not finite numbers")
    return mesh


def d2_descriptor(mesh, descriptor: ShapeDescriptor) -> np.ndarray:
    """The D2 histogram of `descriptor.pairs` point pairs (seeded, so the same mesh gives the same vector)."""
    import trimesh

    points, _ = trimesh.sample.sample_surface(mesh, 2 * descriptor.pairs, seed=descriptor.seed)
    distances = np.linalg.norm(points[: descriptor.pairs] - points[descriptor.pairs:], axis=1)
    mean = distances.mean()
    scaled = distances / mean if mean > 0 else distances
    counts, _ = np.histogram(np.minimum(scaled, D2_RANGE * (1 - 1e-9)), bins=descriptor.bins, range=(0, D2_RANGE))
    return np.sqrt(counts / counts.sum()).astype(np.float32)


def mesh_features(mesh, descriptor: ShapeDescriptor) -> MeshFeatures:
    """Every declared mesh feature of `mesh`, as trimesh computes it, and its D2 embedding."""
    watertight = bool(mesh.is_watertight)
    extents = mesh.extents
    values = {
        "extent_x": float(extents[0]), "extent_y": float(extents[1]), "extent_z": float(extents[2]),
        "vertex_count": int(len(mesh.vertices)), "face_count": int(len(mesh.faces)),
        "surface_area": float(mesh.area), "volume": float(mesh.volume) if watertight else None,
        "is_watertight": watertight, "components": int(mesh.body_count),
    }
    return MeshFeatures(values, d2_descriptor(mesh, descriptor))
