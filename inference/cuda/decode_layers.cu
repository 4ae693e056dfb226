// Every layer of a decode step of one prompt (2 rows: the prompt and its unconditional twin) or eight (16 rows) in
// one persistent launch, for Hopper (sm_90a); compiled at run time with NVRTC by inference/decode_layers.py.
// For each layer:
//   h = LN(x); qkv = h Wqkv^T; a = attention(q/k RMSNorm + RoPE, the new k/v written to the cache);
//   x += a Wo^T + bo; h = LN(x); act = silu(h Wg^T + bg) * (h Wu^T + bu); x += act Wd^T + bd
// and h = LN(x) after the last layer. Why one launch: a step of per-layer kernels waits at every kernel boundary
// for the previous kernel to drain; here the weights keep streaming across the layer's dependencies.
// - One CTA per multiprocessor (clusters of 4). One thread of a producer warpgroup copies the CTA's share of
//   every weight matrix, 8 rows at a time, into a ring of shared-memory stages with bulk copies (cp.async.bulk +
//   mbarriers), running ahead across phases and layers with at most INFLIGHT copies on their way (more only
//   lengthen the queue every other global access of the multiprocessor waits in). The warpgroup hands most of its
//   registers to the consumers (setmaxnreg).
// - Eight consumer warps multiply each stage with mma.m16n8k16 (the weight rows as B, the activation rows as A,
//   held in registers for the phase: each lane's K chunks of rows g and g + 8, LayerNorm applied in place).
// - Attention, 2 rows: cluster k owns the (row, head) pair k, each of its 4 CTAs a quarter of the pair's cache
//   slots; rank 0 merges the 4 partial softmaxes it gets through distributed shared memory. 16 rows: CTA c owns the
//   whole pairs c, c + grid, ... (192 pairs). The producer copies the keys and values through the ring too.
// - The down projection is split by CTA pairs (a K half each), the second sending its sums to the first.
// - Five grid barriers a layer (after q/k/v, attention, the output projection, gate/up and down) on a counter that
//   only grows: counter[0] counts arrivals, counter[1] launches, so graph replays need no reset.
// Needs every CTA resident at once (the host sizes the grid by the resident clusters) and no header: bf16 values
// are raw 16-bit words.
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned short bf16;

constexpr int CW = 8;                  // consumer warps
constexpr int CT = CW * 32;            // consumer threads
constexpr int THREADS = CT + 128;      // + the producer warpgroup (one thread copies; the warpgroup gives its
                                       // registers to the consumers)
constexpr int D = 1536;                // width
constexpr int F = 4 * D;               // MLP hidden width
constexpr int H = 12;                  // heads
constexpr int HD = D / H;              // head size (128: attention maps q to threads 0..127, k to 128..255)
constexpr int QKV = 3 * D;
constexpr int ROWS = 8;                // weight rows a stage (mma n)
constexpr int KS = D;                  // K a stage
constexpr int RS = KS * 2 + 64;        // padded row stride of the down stages (bytes)
constexpr int SBP = ROWS * RS;         // stage bytes in shared memory
constexpr int TX = ROWS * KS * 2;      // bytes a weight stage copies
constexpr int KW = KS / CW;            // K a consumer warp
constexpr int CH = KW / 32;            // 16-byte chunks a lane
constexpr int QB = QKV / ROWS;         // q/k/v stages a layer
constexpr int OB = D / ROWS;           // output projection stages a layer
constexpr int NB = 2 * F / ROWS;       // gate/up stages a layer (4 gate and the 4 up rows of the same outputs)
constexpr int RG = D / ROWS;           // down row groups
constexpr int SPLITS = 4;              // cluster size: CTAs a (row, head) attention pair
constexpr int MAXG = 4;                // down groups a CTA pair at most
constexpr int AP = HD + 2;             // a split's attention partial: o[HD], max, sum
constexpr int KVROWS = 96;             // cache slots a ring stage
constexpr int MAXSLOTS = 1280;         // cache slots a split at most
constexpr int MIN_CLUSTERS = 30;       // the host launches at least this many (grid >= 120)
constexpr int INFLIGHT = 2;
static_assert(2 * HD == CT && KVROWS * HD * 2 <= SBP && F == 4 * KS, "the thread maps assume these shapes");

// What depends on the rows (2: one prompt with guidance; 16: eight): the partial sums of a phase keep every row,
// so 16 rows take a shallower ring to fit them.
template <int R>
struct Shape {
  static constexpr int STAGES = R <= 2 ? 8 : 6;
  static constexpr int PB = 13 * CW * R * 8;                       // partial sums: up to 13 stages a phase
  static constexpr int SCRATCH = 3 * HD + MAXSLOTS + 16 * HD;      // attention: q, k, v, scores, o by slot group
  static constexpr int PART = PB > SCRATCH ? PB : SCRATCH;
  // CTAs that share a (row, head) pair's cache slots: 2 rows make 24 pairs, split 4 ways over a cluster so the
  // chip streams the cache; 16 rows make 192, a CTA's each (no merge)
  static constexpr int ASPLIT = R <= 2 ? SPLITS : 1;
  static constexpr int PAIRS = (R * H + MIN_CLUSTERS * SPLITS / ASPLIT - 1) / (MIN_CLUSTERS * SPLITS / ASPLIT);
  static constexpr int NSUM = MAXG * ROWS * R;                     // down sums a CTA pair at most
  static constexpr int BARS = (8 * (2 * STAGES + 1 + PAIRS) + 15) / 16 * 16;
  static constexpr int SMEM = STAGES * SBP + BARS + 4 * (PART + 2 * NSUM + CW * 2 * R + PAIRS * (ASPLIT - 1) * AP);
};

struct LayerW {
  const bf16 *qkv_w, *qkv_b, *q_norm, *k_norm, *proj_w, *proj_b, *gw, *gb, *dw, *db;
  bf16 *kc, *vc;           // [rows, H, len, HD]
  long long len, offset;   // cache slots; where shape tokens start (condition tokens come first)
};

struct Params {
  const LayerW* layers;
  bf16* x;                 // [R, D] residual, in place (R: the kernel's rows)
  bf16* h;                 // [R, D] out: LN(x) after the last layer
  float* qkv;              // [R, QKV] scratch
  bf16* attn;              // [R, D] scratch: merged attention output
  bf16* act;               // [R, F] scratch
  const long long* pos;    // [1] the new token's shape position
  const float* cos;        // [positions, HD / 2]
  const float* sin;
  unsigned long long* counter;   // [2]: barrier arrivals, launches
  int n_layers;
  float eps, qk_eps, scale;
};

__device__ __forceinline__ float bf(bf16 v) { return __uint_as_float((uint32_t)v << 16); }
__device__ __forceinline__ bf16 to_bf(float f) {   // round to nearest even, as __float2bfloat16
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
  return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float round_bf(float v) { return bf(to_bf(v)); }
__device__ __forceinline__ float lo_bf(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// spin on an mbarrier phase; the cluster form also acquires what other CTAs of the cluster wrote before it
#define MBAR_WAIT_LOOP(op) \
  "{\n.reg .pred P1;\nLAB_WAIT:\n" op " P1, [%0], %1;\n@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n"
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(MBAR_WAIT_LOOP("mbarrier.try_wait.parity.shared::cta.b64") ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(MBAR_WAIT_LOOP("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64") ::"r"(bar), "r"(parity)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// a float into another CTA's shared memory, counted by its mbarrier
__device__ __forceinline__ void send_f32(uint32_t dst, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst), "f"(v),
               "r"(bar) : "memory");
}
// A consumer warp is done with a ring stage (`empty`: its barrier), so the producer may copy into it again. ptxas
// issues the arrive without waiting for the warp's shared-memory loads of the stage to return, so a late load could
// read the next copy (16 rows: identical steps differed after a few layers; compute-sanitizer's racecheck flagged
// these loads against the bulk copies). Each caller therefore first stores something computed from its loads
// (partial sums, scores), which the arrive, a release, waits for, or fences the async proxy where it stores nothing.
__device__ __forceinline__ void release_stage(const uint64_t* empty) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbar_arrive(smem_addr(empty));
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(CT) : "memory"); }

// L2 loads of what other CTAs write during the launch: volatile with a memory clobber, so the compiler neither
// hoists them out of the layer loop nor moves them across a barrier
__device__ __forceinline__ float ldcg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ bf16 ldcg_u16(const bf16* p) {
  bf16 v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ldcg_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
// over the consumer threads (every one gets it); red: CW floats, free on entry
__device__ __forceinline__ float block_sum(float v, float* red, int tid) {
  v = warp_sum(v);
  if ((tid & 31) == 0) red[tid >> 5] = v;
  consumers_sync();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < CW; w++) s += red[w];
  consumers_sync();
  return s;
}
__device__ __forceinline__ float block_max(float v, float* red, int tid) {
  v = warp_max(v);
  if ((tid & 31) == 0) red[tid >> 5] = v;
  consumers_sync();
  float s = -__int_as_float(0x7f800000);
#pragma unroll
  for (int w = 0; w < CW; w++) s = fmaxf(s, red[w]);
  consumers_sync();
  return s;
}

// grid barrier: a release reduction on the arrival counter, then acquire polls until thread 0's target
__device__ __forceinline__ void grid_sync(unsigned long long* ctr, unsigned long long& next, int tid) {
  consumers_sync();
  if (tid == 0) {
    next += gridDim.x;
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(ctr) : "memory");
    unsigned long long cur;
    do {
      asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(cur) : "l"(ctr) : "memory");
    } while (cur < next);
  }
  consumers_sync();
}

// the activation rows of a phase as mma A fragments: each lane's CH chunks of 8 K values of rows g (lo) and g + 8
// (hi, 16 rows only), zeros for rows past R
template <int R>
struct Frags {
  uint4 lo[CH], hi[CH];
};

// the fragments of the R x `stride` bf16 matrix v (global memory, written during the launch)
template <int R>
__device__ __forceinline__ void load_frags(Frags<R>& a, const bf16* v, int stride, int koff, int g) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < CH; i++) {
    a.lo[i] = g < R ? ldcg_u4(v + g * stride + koff + i * 32) : zero;
    if (R > 8) a.hi[i] = g + 8 < R ? ldcg_u4(v + (g + 8) * stride + koff + i * 32) : zero;
  }
}

__device__ __forceinline__ void chunk_sums(const uint4& w, float& s, float& q) {
  const uint32_t* wv = reinterpret_cast<const uint32_t*>(&w);
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const float a = lo_bf(wv[e]), b = hi_bf(wv[e]);
    s += a + b;
    q = fmaf(a, a, fmaf(b, b, q));
  }
}
__device__ __forceinline__ uint4 chunk_norm(const uint4& w, float mean, float rstd) {
  const uint32_t* wv = reinterpret_cast<const uint32_t*>(&w);
  uint4 out;
  uint32_t* ov = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int e = 0; e < 4; e++)
    ov[e] = (uint32_t)to_bf((lo_bf(wv[e]) - mean) * rstd) | ((uint32_t)to_bf((hi_bf(wv[e]) - mean) * rstd) << 16);
  return out;
}

// The fragments of LN(x) (no affine, float32 inside): the 256 consumer threads hold every element of x once, so
// the row sums and sums of squares are one reduction (the variance as E[x^2] - mean^2: float32 keeps it to about
// 1e-6 of the variance for means of a few standard deviations, far below bf16's rounding). red: CW * 2R floats.
template <int R>
__device__ void ln_frags(Frags<R>& a, const bf16* x, float* red, float eps, int koff, int tid) {
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  load_frags<R>(a, x, D, koff, g);
  float s[2] = {0.f, 0.f}, q[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < CH; i++) {
    chunk_sums(a.lo[i], s[0], q[0]);
    if (R > 8) chunk_sums(a.hi[i], s[1], q[1]);
  }
#pragma unroll
  for (int h = 0; h < (R > 8 ? 2 : 1); h++)
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      s[h] += __shfl_xor_sync(0xffffffff, s[h], o);
      q[h] += __shfl_xor_sync(0xffffffff, q[h], o);
    }
  if (t == 0) {
#pragma unroll
    for (int h = 0; h < (R > 8 ? 2 : 1); h++) {
      const int r = g + 8 * h;
      if (r < R) {
        red[(warp * R + r) * 2] = s[h];
        red[(warp * R + r) * 2 + 1] = q[h];
      }
    }
  }
  consumers_sync();
#pragma unroll
  for (int h = 0; h < (R > 8 ? 2 : 1); h++) {
    const int r = g + 8 * h;
    if (r >= R) continue;
    float ts = 0.f, tq = 0.f;
#pragma unroll
    for (int w = 0; w < CW; w++) {
      ts += red[(w * R + r) * 2];
      tq += red[(w * R + r) * 2 + 1];
    }
    const float mean = ts / D, rstd = rsqrtf(fmaxf(tq / D - mean * mean, 0.f) + eps);
#pragma unroll
    for (int i = 0; i < CH; i++) {
      if (h == 0) a.lo[i] = chunk_norm(a.lo[i], mean, rstd);
      else a.hi[i] = chunk_norm(a.hi[i], mean, rstd);
    }
  }
}

__device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One stage: the warp's K slice of 8 weight rows against the fragments. Each lane's 16-byte chunk (8 consecutive K)
// feeds the mma's k slots 2t, 2t+1, 2t+8, 2t+9 in A and B alike, so the sum over K is exact. c[.][0..1]: row g,
// weight rows 2t and 2t + 1; c[.][2..3]: row g + 8.
template <int R>
__device__ __forceinline__ void stage_mma(const unsigned char* st, const Frags<R>& a, float (*c)[4]) {
#pragma unroll
  for (int i = 0; i < CH; i++) {
    const uint4 w = *reinterpret_cast<const uint4*>(st + i * 64);
    mma(c[i & 1], a.lo[i].x, R > 8 ? a.hi[i].x : 0u, a.lo[i].y, R > 8 ? a.hi[i].y : 0u, w.x, w.y);
    mma(c[i & 1], a.lo[i].z, R > 8 ? a.hi[i].z : 0u, a.lo[i].w, R > 8 ? a.hi[i].w : 0u, w.z, w.w);
  }
}

// a stage's accumulators into the partial sums [stage][warp][R rows][8], or added to them
template <int R>
__device__ __forceinline__ void store_partial(float* part, int u, const float (*acc)[4], bool add) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < (R > 8 ? 2 : 1); h++) {
    if (g + 8 * h >= R) continue;
    float* dst = part + (u * CW + warp) * R * 8 + (g + 8 * h) * 8 + 2 * t;
    const float v0 = acc[0][2 * h] + acc[1][2 * h], v1 = acc[0][2 * h + 1] + acc[1][2 * h + 1];
    dst[0] = add ? dst[0] + v0 : v0;
    dst[1] = add ? dst[1] + v1 : v1;
  }
}

// the sum over warps of stage u's output (row r, weight row j of the stage)
template <int R>
__device__ __forceinline__ float stage_sum(const float* part, int u, int r, int j) {
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < CW; w++) s += part[(u * CW + w) * R * 8 + r * 8 + j];
  return s;
}

// the producer: wait for a free stage (and for all but INFLIGHT older copies to land), then arm it for `bytes`
template <int STAGES>
__device__ __forceinline__ uint32_t acquire(int it, const uint64_t* full, const uint64_t* empty, uint32_t bytes) {
  const int s = it % STAGES;
  mbar_wait(smem_addr(empty + s), ((it / STAGES) & 1) ^ 1);
  if (it >= INFLIGHT) {
    const int j = it - INFLIGHT;
    mbar_wait(smem_addr(full + j % STAGES), (j / STAGES) & 1);
  }
  mbar_expect_tx(smem_addr(full + s), bytes);
  return s;
}

// n stages of 8 weight rows x KS against the fragments a; partial sums into part
template <int R>
__device__ __forceinline__ void gemv_stages(int n, int& it, const unsigned char* ring, const uint64_t* full,
                                            const uint64_t* empty, const Frags<R>& a, float* part, int koff) {
  constexpr int STAGES = Shape<R>::STAGES;
  const int lane = threadIdx.x & 31, g = lane >> 2;
  for (int u = 0; u < n; u++, it++) {
    const int s = it % STAGES;
    mbar_wait(smem_addr(full + s), (it / STAGES) & 1);
    float acc[2][4] = {};
    stage_mma<R>(ring + s * SBP + g * (KS * 2) + koff * 2, a, acc);
    store_partial<R>(part, u, acc, false);   // before the release: see release_stage
    release_stage(empty + s);
  }
}

// the cache slots of split `part` of `nparts`: n filled (the new token's included), cnt of them from lo, old of
// them already in the cache (the last split owns the new token's slot, which it takes from shared memory)
struct Split {
  long long n, lo;
  int cnt, old;
};
__device__ __forceinline__ Split split_of(const LayerW& L, long long pos, int part, int nparts) {
  Split sp;
  sp.n = L.offset + pos + 1;
  sp.lo = part * sp.n / nparts;
  sp.cnt = (int)((part + 1) * sp.n / nparts - sp.lo);
  sp.old = sp.cnt - (part == nparts - 1 ? 1 : 0);
  return sp;
}

// the first (row, head) pair of this CTA's attention, and the step to its next
template <int R>
__device__ __forceinline__ int first_pair() {
  return Shape<R>::ASPLIT > 1 ? blockIdx.x / SPLITS : blockIdx.x;
}
template <int R>
__device__ __forceinline__ int pair_step() {
  return Shape<R>::ASPLIT > 1 ? gridDim.x / SPLITS : gridDim.x;
}

// One split of the (row, head) pair pr: q and the new k (RMSNorm, RoPE) and v from the q/k/v sums, the new k and
// v written to the cache by the split that owns their slot, the softmax over this split's slots (their keys and
// values from the ring), merged on rank 0 (apeer, attn_bar: this pair's), which writes the pair's output; with
// one split a pair, the CTA writes it.
// scratch: Shape::SCRATCH floats.
template <int R>
__device__ void attention_split(const Params& p, const LayerW& L, long long pos, int pr, int rank, float* scratch,
                                float* red, float* apeer, uint64_t* attn_bar, int l, int tid, int& it,
                                const unsigned char* ring, const uint64_t* full, const uint64_t* empty) {
  constexpr int STAGES = Shape<R>::STAGES;
  const int r = pr % R, hh = pr / R, warp = tid >> 5, lane = tid & 31;
  float* qf = scratch;
  float* kf = scratch + HD;
  float* vf = scratch + 2 * HD;
  float* sc = scratch + 3 * HD;
  float* ored = sc + MAXSLOTS;   // [16 slot groups][HD]
  constexpr int NS = Shape<R>::ASPLIT;
  const int part = NS > 1 ? rank : 0;
  const Split sp = split_of(L, pos, part, NS);
  const int cnt = sp.cnt;
  if (NS > 1 && part == 0 && tid == 0) mbar_expect_tx(smem_addr(attn_bar), (NS - 1) * AP * 4);
  {  // threads 0..HD-1: q (and v), HD..2HD-1: k
    const int d = tid & (HD - 1);
    const bool isk = tid >= HD;
    const int col = (isk ? D : 0) + hh * HD + d;
    const float v = ldcg_f32(p.qkv + r * QKV + col) + bf(L.qkv_b[col]);
    const float ss = warp_sum(v * v);
    if (lane == 0) red[warp] = ss;
    float vv = 0.f;
    if (!isk) vv = round_bf(ldcg_f32(p.qkv + r * QKV + 2 * D + hh * HD + d) + bf(L.qkv_b[2 * D + hh * HD + d]));
    consumers_sync();
    const int w0 = isk ? 4 : 0;
    const float tot = red[w0] + red[w0 + 1] + red[w0 + 2] + red[w0 + 3];
    const float y = v * rsqrtf(tot / HD + p.qk_eps) * bf(isk ? L.k_norm[d] : L.q_norm[d]);
    const float other = __shfl_xor_sync(0xffffffff, y, 1);
    const float c = p.cos[pos * (HD / 2) + (d >> 1)], s = p.sin[pos * (HD / 2) + (d >> 1)];
    const float rot = (d & 1) ? other * s + y * c : y * c - other * s;   // (x0, x1) rotated as a complex number
    const size_t slot = ((size_t)(r * H + hh) * L.len + (sp.n - 1)) * HD + d;
    if (isk) {
      kf[d] = round_bf(rot);
      if (part == NS - 1) L.kc[slot] = to_bf(rot);
    } else {
      qf[d] = rot;
      vf[d] = vv;
      if (part == NS - 1) L.vc[slot] = to_bf(vv);
    }
  }
  consumers_sync();
  float mx = -__int_as_float(0x7f800000);
  const int nch = (sp.old + KVROWS - 1) / KVROWS;
  for (int m = 0; m < nch; m++, it++) {   // scores, a thread a slot
    const int s = it % STAGES, base = m * KVROWS, cn = min(KVROWS, sp.old - base);
    mbar_wait(smem_addr(full + s), (it / STAGES) & 1);
    if (tid < cn) {
      const unsigned char* row = ring + s * SBP + tid * HD * 2;
      float acc = 0.f;
#pragma unroll
      for (int jj = 0; jj < HD / 8; jj++) {
        const int j = (jj + tid) & (HD / 8 - 1);   // rotated, so the threads' 16-byte reads spread over the banks
        const uint4 w = *reinterpret_cast<const uint4*>(row + j * 16);
        const uint32_t* wv = reinterpret_cast<const uint32_t*>(&w);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          acc = fmaf(qf[j * 8 + 2 * e], lo_bf(wv[e]), acc);
          acc = fmaf(qf[j * 8 + 2 * e + 1], hi_bf(wv[e]), acc);
        }
      }
      acc *= p.scale;
      sc[base + tid] = acc;   // before the release: see release_stage
      mx = fmaxf(mx, acc);
    }
    release_stage(empty + s);
  }
  if (sp.old < cnt && warp == CW - 1) {   // the new token's slot
    float v = 0.f;
#pragma unroll
    for (int e = 0; e < HD / 32; e++) v = fmaf(qf[lane * (HD / 32) + e], kf[lane * (HD / 32) + e], v);
    v = warp_sum(v) * p.scale;
    if (lane == 0) sc[cnt - 1] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, red, tid);
  float ls = 0.f;
  for (int i = tid; i < cnt; i += CT) {
    const float e = __expf(sc[i] - mx);
    sc[i] = e;
    ls += e;
  }
  ls = block_sum(ls, red, tid);   // its barriers also publish sc
  {  // o: 16 groups of slots x 16 chunks of 8 dims
    const int dc = tid & 15, grp = tid >> 4;
    float acc[8] = {};
    for (int m = 0; m < nch; m++, it++) {
      const int s = it % STAGES, base = m * KVROWS, cn = min(KVROWS, sp.old - base);
      mbar_wait(smem_addr(full + s), (it / STAGES) & 1);
      for (int i = grp; i < cn; i += 16) {
        const float pw = sc[base + i];
        const uint4 w = *reinterpret_cast<const uint4*>(ring + s * SBP + i * HD * 2 + dc * 16);
        const uint32_t* wv = reinterpret_cast<const uint32_t*>(&w);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          acc[2 * e] = fmaf(pw, lo_bf(wv[e]), acc[2 * e]);
          acc[2 * e + 1] = fmaf(pw, hi_bf(wv[e]), acc[2 * e + 1]);
        }
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // nothing stored: see release_stage
      release_stage(empty + s);
    }
    if (sp.old < cnt && grp == 0) {
#pragma unroll
      for (int e = 0; e < 8; e++) acc[e] = fmaf(sc[cnt - 1], vf[dc * 8 + e], acc[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) ored[grp * HD + dc * 8 + e] = acc[e];
  }
  consumers_sync();
  float o = 0.f;
  if (tid < HD) {
#pragma unroll
    for (int gq = 0; gq < 16; gq++) o += ored[gq * HD + tid];
  }
  if (NS == 1) {
    if (tid < HD) p.attn[r * D + hh * HD + tid] = to_bf(o / ls);
  } else if (part != 0) {   // (o, max, sum) to rank 0
    const uint32_t bar = map_to_rank(smem_addr(attn_bar), 0);
    const uint32_t dst = map_to_rank(smem_addr(apeer + (rank - 1) * AP), 0);
    if (tid < AP) send_f32(dst + tid * 4, tid < HD ? o : (tid == HD ? mx : ls), bar);
  } else {
    mbar_wait_cluster(smem_addr(attn_bar), l & 1);
    if (tid < HD) {
      float m = mx;
#pragma unroll
      for (int s = 0; s < NS - 1; s++) m = fmaxf(m, apeer[s * AP + HD]);
      float den = ls * __expf(mx - m), num = o * __expf(mx - m);
#pragma unroll
      for (int s = 0; s < NS - 1; s++) {
        const float f = __expf(apeer[s * AP + HD] - m);
        den = fmaf(apeer[s * AP + HD + 1], f, den);
        num = fmaf(apeer[s * AP + tid], f, num);
      }
      p.attn[r * D + hh * HD + tid] = to_bf(num / den);
    }
  }
}

// The producer warp's one thread: the CTA's stages in the order the consumers take them.
template <int R>
__device__ void produce(const Params& p, unsigned char* ring, const uint64_t* full, const uint64_t* empty, int rank) {
  constexpr int STAGES = Shape<R>::STAGES;
  const int G = gridDim.x, c = blockIdx.x, prank = rank & 1, pair = c >> 1, P = G >> 1;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  int it = 0;
  long long pos = 0;
  for (int l = 0; l < p.n_layers; l++) {
    const LayerW L = p.layers[l];
    for (int u = c * QB / G; u < (c + 1) * QB / G; u++, it++) {
      const int s = acquire<STAGES>(it, full, empty, TX);
      bulk_copy(smem_addr(ring + s * SBP), L.qkv_w + (size_t)u * ROWS * D, TX, smem_addr(full + s), policy);
    }
    for (int pr = first_pair<R>(); pr < R * H; pr += pair_step<R>()) {   // each pair's cached keys, then values
      if (l == 0 && pr == first_pair<R>()) {   // the position is written by the kernel before this one
        asm volatile("griddepcontrol.wait;" ::: "memory");
        pos = p.pos[0];
      }
      const Split sp = split_of(L, pos, Shape<R>::ASPLIT > 1 ? rank : 0, Shape<R>::ASPLIT);
      const size_t head = ((size_t)(pr % R) * H + pr / R) * L.len + sp.lo;
      for (int kv = 0; kv < 2; kv++)
        for (int m = 0; m * KVROWS < sp.old; m++, it++) {
          const uint32_t bytes = min(KVROWS, sp.old - m * KVROWS) * HD * 2;
          const int s = acquire<STAGES>(it, full, empty, bytes);
          bulk_copy(smem_addr(ring + s * SBP), (kv ? L.vc : L.kc) + (head + m * KVROWS) * HD, bytes,
                    smem_addr(full + s), policy);
        }
    }
    for (int u = c * OB / G; u < (c + 1) * OB / G; u++, it++) {
      const int s = acquire<STAGES>(it, full, empty, TX);
      bulk_copy(smem_addr(ring + s * SBP), L.proj_w + (size_t)u * ROWS * D, TX, smem_addr(full + s), policy);
    }
    for (int u = c * NB / G; u < (c + 1) * NB / G; u++, it++) {
      const int s = acquire<STAGES>(it, full, empty, TX);
      const uint32_t bar = smem_addr(full + s), dst = smem_addr(ring + s * SBP);
      bulk_copy(dst, L.gw + (size_t)u * 4 * D, 4 * D * 2, bar, policy);
      bulk_copy(dst + 4 * D * 2, L.gw + ((size_t)F + u * 4) * D, 4 * D * 2, bar, policy);
    }
    for (int kk = 0; kk < 2; kk++)   // padded rows: the consumers' reads spread over the banks
      for (int q = pair * RG / P; q < (pair + 1) * RG / P; q++, it++) {
        const int s = acquire<STAGES>(it, full, empty, TX);
        const uint32_t bar = smem_addr(full + s), dst = smem_addr(ring + s * SBP);
        const size_t k0 = (size_t)(2 * prank + kk) * KS;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
          bulk_copy(dst + r * RS, L.dw + ((size_t)q * ROWS + r) * F + k0, KS * 2, bar, policy);
      }
  }
}

template <int R>
__device__ void run_layers(const Params& p, unsigned char* smem) {
  using S = Shape<R>;
  constexpr int STAGES = S::STAGES;
  constexpr int EPI = (13 * 4 * R + CT - 1) / CT;   // epilogue values a thread at most (gate/up's)
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * SBP);
  uint64_t* empty = full + STAGES;
  uint64_t* peer_bar = empty + STAGES;                        // down: the pair's second CTA's sums
  uint64_t* attn_bar = peer_bar + 1;                          // attention: ranks 1.. partials, one a pair
  float* part = reinterpret_cast<float*>(smem + STAGES * SBP + S::BARS);   // [PART]
  float* sums = part + S::PART;                               // [NSUM]
  float* peer = sums + S::NSUM;                               // [NSUM]
  float* red = peer + S::NSUM;                                // [CW * 2R]
  float* apeer = red + CW * 2 * R;                            // [PAIRS][ASPLIT - 1][AP] on rank 0

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int G = gridDim.x, c = blockIdx.x;
  const int rank = (int)cluster_rank(), prank = rank & 1, pair = c >> 1, P = G >> 1;
  const int qb0 = c * QB / G, qb1 = (c + 1) * QB / G;
  const int ob0 = c * OB / G, ob1 = (c + 1) * OB / G;
  const int b0 = c * NB / G, b1 = (c + 1) * NB / G;
  const int g0 = pair * RG / P, g1 = (pair + 1) * RG / P;

  if (tid == 0) {
    for (int s = 0; s < STAGES; s++) {
      mbar_init(smem_addr(full + s), 1);
      mbar_init(smem_addr(empty + s), CW);
    }
    for (int j = 0; j <= S::PAIRS; j++) mbar_init(smem_addr(peer_bar + j), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // 12 warps allow ptxas 168 registers a thread, and 16 rows need more (it spilled addresses and indices and
  // reloaded them every layer): the producer warpgroup keeps 56 and gives the rest to the 8 consumer warps (224)
  if (warp >= CW) {  // producer: weights are never written during a step, so it starts before the PDL wait
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
    if (warp == CW && lane == 0) produce<R>(p, ring, full, empty, rank);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;" ::: "memory");

  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
  const long long pos = p.pos[0];
  unsigned long long launch = 0, next = 0;   // thread 0: launches before this one, the next barrier's target
  if (tid == 0) {
    asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(launch) : "l"(p.counter + 1) : "memory");
    next = launch * (unsigned long long)(5 * p.n_layers) * G;
  }
  int it = 0;
  const int koff = warp * KW + t * 8;   // this lane's first K element in a stage
  Frags<R> a;
  for (int l = 0; l < p.n_layers; l++) {
    const LayerW L = p.layers[l];
    // the output projection's residual and bias, loaded ahead (epilogue value e = tid)
    const int no = (ob1 - ob0) * ROWS * R;
    float xo = 0.f, bo = 0.f;
    if (tid < no) {
      const int n = ob0 * ROWS + tid % ROWS + tid / (ROWS * R) * ROWS, r = (tid / ROWS) % R;
      xo = bf(ldcg_u16(p.x + r * D + n));
      bo = bf(L.proj_b[n]);
    }
    ln_frags<R>(a, p.x, red, p.eps, koff, tid);

    // q/k/v, sums without the bias
    gemv_stages<R>(qb1 - qb0, it, ring, full, empty, a, part, koff);
    consumers_sync();
    for (int e = tid; e < (qb1 - qb0) * ROWS * R; e += CT) {
      const int u = e / (ROWS * R), r = (e / ROWS) % R, j = e % ROWS;
      p.qkv[r * QKV + (qb0 + u) * ROWS + j] = stage_sum<R>(part, u, r, j);
    }
    grid_sync(p.counter, next, tid);

    for (int pr = first_pair<R>(), j = 0; pr < R * H; pr += pair_step<R>(), j++)
      attention_split<R>(p, L, pos, pr, rank, part, red, apeer + j * (S::ASPLIT - 1) * AP, attn_bar + j, l, tid, it,
                         ring, full, empty);
    grid_sync(p.counter, next, tid);

    // output projection and residual: x += attn Wo^T + bo
    load_frags<R>(a, p.attn, D, koff, g);
    gemv_stages<R>(ob1 - ob0, it, ring, full, empty, a, part, koff);
    consumers_sync();
    if (tid < no) {
      const int u = tid / (ROWS * R), r = (tid / ROWS) % R, j = tid % ROWS;
      p.x[r * D + (ob0 + u) * ROWS + j] = to_bf(xo + (stage_sum<R>(part, u, r, j) + bo));
    }
    grid_sync(p.counter, next, tid);

    // the down projection's residual and bias, loaded ahead (epilogue values e = tid, tid + CT on the pair's first)
    const int nsum = (g1 - g0) * ROWS * R;
    float xd[2] = {0.f, 0.f}, bd[2] = {0.f, 0.f};
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int e = tid + k * CT;
      if (prank == 0 && e < nsum) {
        const int n = (g0 + e / (ROWS * R)) * ROWS + e % ROWS, r = (e / ROWS) % R;
        xd[k] = bf(ldcg_u16(p.x + r * D + n));
        bd[k] = bf(L.db[n]);
      }
    }
    ln_frags<R>(a, p.x, red, p.eps, koff, tid);

    // gate/up + SwiGLU
    float gb[EPI], ub[EPI];   // the biases, loaded before the stages need them
#pragma unroll
    for (int k = 0; k < EPI; k++) {
      const int e = tid + k * CT;
      gb[k] = ub[k] = 0.f;
      if (e < (b1 - b0) * 4 * R) {
        const int n = (b0 + e / (4 * R)) * 4 + e % 4;
        gb[k] = bf(L.gb[n]);
        ub[k] = bf(L.gb[F + n]);
      }
    }
    gemv_stages<R>(b1 - b0, it, ring, full, empty, a, part, koff);
    consumers_sync();
#pragma unroll
    for (int k = 0; k < EPI; k++) {
      const int e = tid + k * CT;
      if (e < (b1 - b0) * 4 * R) {
        const int u = e / (4 * R), r = (e / 4) % R, j = e % 4, n = (b0 + u) * 4 + j;
        const float gs = stage_sum<R>(part, u, r, j) + gb[k], us = stage_sum<R>(part, u, r, 4 + j) + ub[k];
        p.act[r * F + n] = to_bf(gs / (1.f + __expf(-gs)) * us);
      }
    }
    grid_sync(p.counter, next, tid);

    // down and residual: this CTA's K half of act (two chunks) against its pair's groups of 8 rows; the pair's
    // second CTA sends its sums to the first, which adds them, the bias and the residual
    if (prank == 0 && tid == 0) mbar_expect_tx(smem_addr(peer_bar), nsum * 4);
    for (int kk = 0; kk < 2; kk++) {
      load_frags<R>(a, p.act + (2 * prank + kk) * KS, F, koff, g);
      for (int q = g0; q < g1; q++, it++) {
        const int s = it % STAGES;
        mbar_wait(smem_addr(full + s), (it / STAGES) & 1);
        float acc[2][4] = {};
        stage_mma<R>(ring + s * SBP + g * RS + koff * 2, a, acc);
        store_partial<R>(part, q - g0, acc, kk == 1);   // before the release: see release_stage
        release_stage(empty + s);
      }
    }
    consumers_sync();
    for (int e = tid; e < nsum; e += CT) {
      const float sum = stage_sum<R>(part, e / (ROWS * R), (e / ROWS) % R, e % ROWS);
      if (prank == 1)
        send_f32(map_to_rank(smem_addr(peer + e), rank - 1), sum, map_to_rank(smem_addr(peer_bar), rank - 1));
      else
        sums[e] = sum;
    }
    consumers_sync();
    if (prank == 0) {
      mbar_wait_cluster(smem_addr(peer_bar), l & 1);
#pragma unroll
      for (int k = 0; k < 2; k++) {
        const int e = tid + k * CT;
        if (e < nsum) {
          const int n = (g0 + e / (ROWS * R)) * ROWS + e % ROWS, r = (e / ROWS) % R;
          p.x[r * D + n] = to_bf(xd[k] + (sums[e] + peer[e] + bd[k]));
        }
      }
    }
    grid_sync(p.counter, next, tid);
  }
  if (c == 0) {   // every CTA read the launch count before its first barrier: count this launch; h = LN(x)
    if (tid == 0) asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p.counter + 1), "l"(launch + 1) : "memory");
    ln_frags<R>(a, p.x, red, p.eps, koff, tid);
#pragma unroll
    for (int i = 0; i < CH; i++) {
      if (g < R) *reinterpret_cast<uint4*>(p.h + g * D + koff + i * 32) = a.lo[i];
      if (R > 8 && g + 8 < R) *reinterpret_cast<uint4*>(p.h + (g + 8) * D + koff + i * 32) = a.hi[i];
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) decode_layers_r2(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  run_layers<2>(p, smem);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) decode_layers_r16(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  run_layers<16>(p, smem);
}
