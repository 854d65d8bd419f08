#include "cpu_experts/packed_weight.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "gpu_core/int4_layout.h"
#include "core/error.h"

namespace tandem::cpu {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct Geometry {
  int64_t tiles, cols_padded, group_size, groups, tile_bytes;
  bool zeros, perm;
};

int gptq_zero(const GptqView& q, int64_t N, int64_t g, int64_t n) {
  const uint32_t word = static_cast<uint32_t>(q.qzeros[g * (N / 8) + n / 8]);
  return gptq_zero_point(word, n, q.zero_offset);
}

// Symmetric GPTQ: zero point 8 in every group and column, so kernels subtract a constant.
bool gptq_symmetric(const LinearWeight& src) {
  for (int64_t g = 0; g < src.gptq.num_groups; ++g)
    for (int64_t n = 0; n < src.out; ++n)
      if (gptq_zero(src.gptq, src.out, g, n) != 8) return false;
  return true;
}

void check_int8_group(const LinearWeight& src, int64_t gs) {
  if (gs != 32 && gs != 64 && gs != 128)
    fail("cpu experts: int8 group size ", gs, " for '", src.name, "' is not supported (use 32, 64 or 128)");
}

Geometry geometry(const LinearWeight& src, const PackOptions& opt) {
  Geometry g{};
  g.tiles = (src.out + kTileRows - 1) / kTileRows;
  switch (opt.format) {
    case WeightFormat::Int4: {
      if (src.kind != LinearWeight::Kind::Gptq)
        fail("cpu experts: '", src.name, "' is a dense ", dtype_name(src.dense_dtype),
             " matrix; int4 needs a GPTQ source (choose int8 or bf16 for dense experts)");
      g.group_size = src.gptq.group_size;
      if (g.group_size % 8 != 0 || src.in % g.group_size != 0)
        fail("cpu experts: '", src.name, "': GPTQ group size ", g.group_size, " must be a multiple of 8 dividing ",
             src.in);
      g.cols_padded = src.in;
      g.groups = src.in / g.group_size;
      g.tile_bytes = kTileRows * g.cols_padded / 2;
      g.perm = src.gptq.g_idx != nullptr;
      g.zeros = !gptq_symmetric(src);
      break;
    }
    case WeightFormat::Int8:
      check_int8_group(src, opt.int8_group_size);
      g.group_size = opt.int8_group_size;
      g.cols_padded = round_up(src.in, g.group_size);
      g.groups = g.cols_padded / g.group_size;
      g.tile_bytes = kTileRows * g.cols_padded;
      break;
    case WeightFormat::BF16:
      g.cols_padded = round_up(src.in, int64_t(32));
      g.tile_bytes = kTileRows * g.cols_padded * 2;
      break;
  }
  return g;
}

// Stable sort of columns by group: packed column k' reads source column perm[k']. Every group must
// hold exactly group_size columns, as GPTQ's act-order produces.
std::vector<int32_t> act_order_perm(const LinearWeight& src) {
  const GptqView& q = src.gptq;
  std::vector<int32_t> perm(src.in);
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return q.g_idx[a] < q.g_idx[b]; });
  for (int64_t k = 0; k < src.in; ++k)
    if (q.g_idx[perm[k]] != k / q.group_size)
      fail("cpu experts: '", src.name, "': g_idx does not give every group exactly ", q.group_size,
           " columns (group ", q.g_idx[perm[k]], " at sorted position ", k, ")");
  return perm;
}

void pack_int4(const LinearWeight& src, const Geometry& geo, const PackOptions& opt, PackedMatrix& m, uint8_t* w,
               uint16_t* scales, uint8_t* zeros, int32_t* perm_out) {
  const GptqView& q = src.gptq;
  const int64_t N = src.out, G = geo.groups, T = geo.tiles;
  auto src_row = [&](int64_t np) { return opt.row_perm ? opt.row_perm[np] : np; };
  auto zero_of = [&](int64_t g, int64_t n) { return gptq_zero(q, N, g, n); };
  const bool sym = zeros == nullptr;
  m.symmetric = sym;
  m.zeros = sym ? nullptr : zeros;

  // Scales and zeros, [tile][group][16]; padded rows get scale 0 and the zero point as code.
  bool exact = true;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int r = 0; r < kTileRows; ++r) {
        const int64_t np = t * kTileRows + r, at = (t * G + g) * kTileRows + r;
        if (np >= N) {
          scales[at] = 0;
          if (!sym) zeros[at] = 0;
          continue;
        }
        const int64_t n = src_row(np);
        if (q.scales_dtype == DType::F16) {
          scales[at] = static_cast<const uint16_t*>(q.scales)[g * N + n];
        } else {
          const float s = load_as_f32(q.scales, q.scales_dtype, g * N + n);
          scales[at] = f32_to_f16(s);
          exact = exact && f16_to_f32(scales[at]) == s;
        }
        if (!sym) zeros[at] = static_cast<uint8_t>(zero_of(g, n));
      }
  m.exact = exact;

  std::vector<int32_t> perm;
  if (q.g_idx) {
    perm = act_order_perm(src);
    std::copy(perm.begin(), perm.end(), perm_out);
    m.col_perm = perm_out;
  }
  const int64_t octs = src.in / 8;
  const uint8_t pad_byte = sym ? 0x88 : 0x00;
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* tile = w + t * geo.tile_bytes;
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t np = t * kTileRows + r;
      if (np >= N) {
        for (int64_t o = 0; o < octs; ++o) std::memset(tile + o * 64 + r * 4, pad_byte, 4);
        continue;
      }
      const int64_t n = src_row(np);
      for (int64_t o = 0; o < octs; ++o) {
        uint8_t* dst = tile + o * 64 + r * 4;
        if (perm.empty()) {
          const uint32_t word = static_cast<uint32_t>(q.qweight[o * N + n]);
          for (int j = 0; j < 4; ++j)
            dst[j] = static_cast<uint8_t>(((word >> (4 * j)) & 0xfu) | (((word >> (4 * j + 16)) & 0xfu) << 4));
        } else {
          auto code = [&](int64_t kp) {
            const int64_t k = perm[kp];
            return (static_cast<uint32_t>(q.qweight[(k / 8) * N + n]) >> (4 * (k % 8))) & 0xfu;
          };
          for (int j = 0; j < 4; ++j) dst[j] = static_cast<uint8_t>(code(8 * o + j) | (code(8 * o + 4 + j) << 4));
        }
      }
    }
  }
}

void pack_int8(const LinearWeight& src, const Geometry& geo, const PackOptions& opt, uint8_t* w,
               uint16_t* scales) {
  const int64_t N = src.out, K = src.in, gs = geo.group_size, G = geo.groups;
  std::vector<float> row(geo.cols_padded, 0.0f);
  for (int64_t np = 0; np < geo.tiles * kTileRows; ++np) {
    const int64_t t = np / kTileRows, r = np % kTileRows;
    uint8_t* tile = w + t * geo.tile_bytes;
    if (np < N) src.dequant_row(opt.row_perm ? opt.row_perm[np] : np, row.data());
    else std::fill(row.begin(), row.end(), 0.0f);
    for (int64_t g = 0; g < G; ++g) {
      float amax = 0.0f;
      for (int64_t k = g * gs; k < std::min(K, (g + 1) * gs); ++k) amax = std::max(amax, std::fabs(row[k]));
      uint16_t h = f32_to_f16(amax / 127.0f);
      if (amax > 0.0f && (h & 0x7fff) == 0) h = 1;  // below f16's range: smallest subnormal, codes clamp
      scales[(t * G + g) * kTileRows + r] = h;
      const float s = f16_to_f32(h);
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
        const float v = s > 0.0f ? std::nearbyint(row[k] / s) : 0.0f;
        const int qv = static_cast<int>(std::clamp(v, -127.0f, 127.0f));
        tile[(k / 4) * 64 + r * 4 + k % 4] = static_cast<uint8_t>(qv + 128);
      }
    }
  }
}

void pack_bf16(const LinearWeight& src, const Geometry& geo, const PackOptions& opt, PackedMatrix& m, uint8_t* w) {
  const int64_t N = src.out, K = src.in;
  std::vector<float> row(K);
  m.exact = src.kind == LinearWeight::Kind::Dense && src.dense_dtype == DType::BF16;
  for (int64_t np = 0; np < geo.tiles * kTileRows; ++np) {
    auto* tile = reinterpret_cast<uint16_t*>(w + (np / kTileRows) * geo.tile_bytes);
    const int64_t r = np % kTileRows;
    if (np < N) src.dequant_row(opt.row_perm ? opt.row_perm[np] : np, row.data());
    for (int64_t k = 0; k < geo.cols_padded; ++k) {
      const uint16_t v = (np < N && k < K) ? f32_to_bf16(row[k]) : 0;
      tile[(k / 2) * 32 + r * 2 + k % 2] = v;
    }
  }
}

}  // namespace

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Int4: return "int4";
    case WeightFormat::Int8: return "int8";
    case WeightFormat::BF16: return "bf16";
  }
  return "?";
}

uint64_t PackedMatrix::stream_bytes() const {
  uint64_t b = static_cast<uint64_t>(tiles * tile_bytes);
  if (is_int()) b += static_cast<uint64_t>(tiles * groups * kTileRows) * (zeros ? 3 : 2);
  return b;
}

void PackedMatrix::dequant_row(int64_t n, float* row, bool source_order) const {
  const int64_t t = n / kTileRows, r = n % kTileRows;
  const uint8_t* tile = w + t * tile_bytes;
  for (int64_t k = 0; k < cols; ++k) {
    float v;
    if (format == WeightFormat::BF16) {
      v = bf16_to_f32(reinterpret_cast<const uint16_t*>(tile)[(k / 2) * 32 + r * 2 + k % 2]);
    } else {
      const int64_t g = k / group_size, at = (t * groups + g) * kTileRows + r;
      const float s = f16_to_f32(scales[at]);
      int code, zero;
      if (format == WeightFormat::Int4) {
        const uint8_t byte = tile[(k / 8) * 64 + r * 4 + (k % 4)];
        code = (k % 8) < 4 ? (byte & 0xf) : (byte >> 4);
        zero = zeros ? zeros[at] : 8;
      } else {
        code = tile[(k / 4) * 64 + r * 4 + k % 4];
        zero = 128;
      }
      v = s * static_cast<float>(code - zero);
    }
    row[(source_order && col_perm) ? col_perm[k] : k] = v;
  }
}

size_t packed_bytes(const LinearWeight& src, const PackOptions& opt) {
  const Geometry g = geometry(src, opt);
  size_t b = round_up(static_cast<size_t>(g.tiles * g.tile_bytes), 64);
  if (opt.format != WeightFormat::BF16) b += round_up(static_cast<size_t>(g.tiles * g.groups * kTileRows * 2), 64);
  if (g.zeros) b += round_up(static_cast<size_t>(g.tiles * g.groups * kTileRows), 64);
  if (g.perm) b += round_up(static_cast<size_t>(src.in * 4), 64);
  return b;
}

PackedMatrix pack_weight(const LinearWeight& src, const PackOptions& opt, HostArena& arena) {
  if (src.empty()) fail("cpu experts: cannot pack an empty weight");
  const Geometry geo = geometry(src, opt);
  PackedMatrix m;
  m.format = opt.format;
  m.rows = src.out;
  m.cols = src.in;
  m.tiles = geo.tiles;
  m.cols_padded = geo.cols_padded;
  m.group_size = geo.group_size;
  m.groups = geo.groups;
  m.tile_bytes = geo.tile_bytes;
  auto* w = static_cast<uint8_t*>(arena.allocate(static_cast<size_t>(geo.tiles * geo.tile_bytes)));
  m.w = w;
  uint16_t* scales = nullptr;
  if (opt.format != WeightFormat::BF16) {
    scales = static_cast<uint16_t*>(arena.allocate(static_cast<size_t>(geo.tiles * geo.groups * kTileRows * 2)));
    m.scales = scales;
  }
  switch (opt.format) {
    case WeightFormat::Int4: {
      auto* zeros = geo.zeros
                        ? static_cast<uint8_t*>(arena.allocate(static_cast<size_t>(geo.tiles * geo.groups * kTileRows)))
                        : nullptr;
      auto* perm = geo.perm ? static_cast<int32_t*>(arena.allocate(static_cast<size_t>(src.in * 4))) : nullptr;
      pack_int4(src, geo, opt, m, w, scales, zeros, perm);
      break;
    }
    case WeightFormat::Int8:
      pack_int8(src, geo, opt, w, scales);
      m.exact = false;
      break;
    case WeightFormat::BF16:
      pack_bf16(src, geo, opt, m, w);
      break;
  }
  return m;
}

// ---- HostArena ----

HostArena::HostArena(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

HostArena::~HostArena() {
  for (Chunk& c : chunks_) munmap(c.base, c.size);
}

std::vector<std::pair<void*, size_t>> HostArena::mappings() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<void*, size_t>> out;
  for (const Chunk& c : chunks_) out.push_back({c.base, c.size});
  return out;
}

HostArena::Chunk& HostArena::new_chunk(size_t min_bytes) {
  const size_t size = round_up(std::max(min_bytes, chunk_bytes_), kHugePage);
  // Over-map by one huge page and trim, so the chunk starts on a 2 MiB boundary.
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) fail("cpu experts: cannot map ", size >> 20, " MiB of host memory for expert weights");
  auto* p = static_cast<uint8_t*>(raw);
  auto* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<size_t>(p), kHugePage));
  if (base > p) munmap(p, static_cast<size_t>(base - p));
  if (base + size < p + size + kHugePage) munmap(base + size, static_cast<size_t>(p + size + kHugePage - (base + size)));
  if (madvise(base, size, MADV_HUGEPAGE) == 0) huge_ += size;
  mapped_ += size;
  chunks_.push_back({base, size, 0});
  return chunks_.back();
}

void HostArena::reserve(size_t bytes) {
  std::lock_guard lock(mu_);
  if (chunks_.empty() || chunks_.back().size - chunks_.back().used < bytes) new_chunk(bytes);
}

void* HostArena::allocate(size_t bytes, size_t align) {
  std::lock_guard lock(mu_);
  auto fits = [&](const Chunk& c) { return round_up(c.used, align) + bytes <= c.size; };
  if (chunks_.empty() || !fits(chunks_.back())) new_chunk(bytes + align);
  Chunk& c = chunks_.back();
  c.used = round_up(c.used, align);
  void* p = c.base + c.used;
  c.used += std::max<size_t>(bytes, 1);
  return p;
}

}  // namespace tandem::cpu
