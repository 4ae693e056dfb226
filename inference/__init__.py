"""Cube 3D text-to-shape inference: the dual-stream decoder under the released names, a generation engine with a
static KV cache and CUDA-graph decode, and the shape decoder that turns tokens into a mesh.

    engine = Engine("v0.1", "gpt.safetensors", "cuda", torch.bfloat16, codebook=shapes.codebook())
    ids = engine.generate(engine.condition(clip_hidden), engine.condition(clip_empty))       # [P, 512]
    mesh = shapes.decode_mesh(ids[0], resolution=8); mesh.export("object.glb")
"""

from inference.config import CUBE3D_CONFIGS, SHAPE_TOKENIZER_CONFIGS, Cube3DConfig, ShapeTokenizerConfig
from inference.engine import Engine, GenerationStats
from inference.errors import CheckpointError, Cube3DError, GenerationError, MeshError, UnknownConfigError
from inference.mesh import Mesh, ShapeDecoder
from inference.model import Cube3DDecoder

__all__ = ["CUBE3D_CONFIGS", "SHAPE_TOKENIZER_CONFIGS", "CheckpointError", "Cube3DConfig", "Cube3DDecoder",
           "Cube3DError", "Engine", "GenerationError", "GenerationStats", "Mesh", "MeshError", "ShapeDecoder",
           "ShapeTokenizerConfig", "UnknownConfigError"]
