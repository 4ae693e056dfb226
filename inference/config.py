"""Sizes of the Cube 3D models as dataclasses plus named configs (`v0.1`, `v0.5`, `tiny`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from inference.errors import InvalidConfigError, UnknownConfigError


@dataclass(frozen=True)
class Cube3DConfig:
    """The dual-stream decoder ("DualStreamRoformer") of FACTS.md."""

    n_layer: int = 23                 # dual-stream layers; the last one is condition-pre-only
    n_single_layer: int = 1           # single-stream layers after the dual ones
    n_head: int = 12
    n_embd: int = 1536
    rope_theta: float = 10000.0
    eps: float = 1e-6                 # LayerNorm (no affine)
    qk_norm_eps: float = 1e-5         # per-head RMSNorm on q and k
    bias: bool = True
    shape_model_vocab_size: int = 16384
    shape_model_embed_dim: int = 32
    text_model_embed_dim: int = 768
    text_tokens: int = 77             # CLIP pads to 77 tokens
    use_bbox: bool = False
    n_generated: int = 512            # shape tokens per object (fixed length)
    guidance_scale: float = 3.0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "shape_model_vocab_size", "n_generated", "text_tokens"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"Cube3DConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise InvalidConfigError(f"Cube3DConfig: n_embd {self.n_embd} must split into n_head {self.n_head} "
                                     "heads of an even size (RoPE rotates pairs); change n_embd or n_head")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def bos_id(self) -> int:
        return self.shape_model_vocab_size

    @property
    def eos_id(self) -> int:
        return self.shape_model_vocab_size + 1

    @property
    def padding_id(self) -> int:
        return self.shape_model_vocab_size + 2

    @property
    def vocab_size(self) -> int:
        return self.shape_model_vocab_size + 3

    @property
    def cond_len(self) -> int:
        """Condition tokens: the text tokens plus one bbox token when `use_bbox`."""
        return self.text_tokens + int(self.use_bbox)

    @property
    def mlp_hidden(self) -> int:
        return 4 * self.n_embd

    @classmethod
    def from_name(cls, name: str) -> "Cube3DConfig":
        if name not in CUBE3D_CONFIGS:
            raise UnknownConfigError("cube3d", name, CUBE3D_CONFIGS)
        return CUBE3D_CONFIGS[name]


CUBE3D_CONFIGS: dict[str, Cube3DConfig] = {
    "v0.1": Cube3DConfig(),
    "v0.5": Cube3DConfig(use_bbox=True, n_generated=1024),
    # the architecture of tests/data/cube3d/tiny_reference.json
    "tiny": Cube3DConfig(n_layer=2, n_single_layer=1, n_head=4, n_embd=128, shape_model_vocab_size=64,
                         shape_model_embed_dim=8, text_model_embed_dim=16, text_tokens=5, use_bbox=True,
                         n_generated=12),
}


@dataclass(frozen=True)
class ShapeTokenizerConfig:
    """The parts of the shape tokenizer ("OneDAutoEncoder") that turn tokens into a mesh."""

    num_latents: int = 512            # one latent per shape token
    width: int = 768
    n_head: int = 12
    n_decoder_layer: int = 24
    num_codes: int = 16384
    code_dim: int = 32
    num_freqs: int = 128              # Fourier frequencies per input axis
    eps: float = 1e-6
    qk_norm_eps: float = 1e-5
    out_dim: int = 1
    bounds: float = 1.05              # the grid spans [-bounds, bounds]^3

    @property
    def embed_dim(self) -> int:
        """Fourier embedding width: the point itself plus cos and sin of every frequency, per axis."""
        return 3 * (2 * self.num_freqs + 1)

    @classmethod
    def from_name(cls, name: str) -> "ShapeTokenizerConfig":
        if name not in SHAPE_TOKENIZER_CONFIGS:
            raise UnknownConfigError("shape tokenizer", name, SHAPE_TOKENIZER_CONFIGS)
        return SHAPE_TOKENIZER_CONFIGS[name]


SHAPE_TOKENIZER_CONFIGS: dict[str, ShapeTokenizerConfig] = {
    "v0.1": ShapeTokenizerConfig(),
    # v0.5 decodes 1024 tokens: the same tokenizer layout with 1024 latent positions
    "v0.5": ShapeTokenizerConfig(num_latents=1024),
    "tiny": ShapeTokenizerConfig(num_latents=12, width=32, n_head=2, n_decoder_layer=2, num_codes=64,
                                 code_dim=8, num_freqs=8),
}


def with_overrides(cfg: Cube3DConfig, **changes: object) -> Cube3DConfig:
    """A copy of `cfg` with some fields changed (e.g. fewer generated tokens for a quick run)."""
    return replace(cfg, **changes)
