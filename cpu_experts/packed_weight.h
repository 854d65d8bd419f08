// cpu_experts/packed_weight.h: expert weight matrices in host memory, repacked once at load into the
// layout every CPU kernel (scalar, AVX2, AVX-512 VNNI, AMX) reads directly.
//
// A PackedMatrix is W [rows = out, cols = in] (nn.Linear terms). Rows come in tiles of 16; a tile's
// data is contiguous, so a block of tiles is one sequential stream. Layouts per format:
//  - Int4 (lossless repack of GPTQ): per tile, per group, per k-octet o (k = 8o .. 8o+7 of the group):
//    64 bytes = [16 rows][4 bytes], byte j of row r = q(8o+j) | q(8o+4+j) << 4, q = unsigned code 0..15.
//    Masking the low nibbles gives the VNNI / AMX-B layout [k/4][16][4] for k = 8o..8o+3, the high
//    nibbles for k = 8o+4..8o+7. W[n,k] = scale[g,n] * (q - zero[g,n]); zero = 8 when symmetric.
//  - Int8 (quantized at load from BF16/F16/F32, or from dequantized GPTQ): per tile, per group, per
//    k-quad: 64 bytes = [16 rows][4 bytes], code = q + 128 with q in -127..127 (symmetric per group:
//    scale = amax / 127 rounded to f16), so W[n,k] = scale[g,n] * (code - 128).
//  - BF16: per tile, per k-pair: 64 bytes = [16 rows][2 bf16] (the AMX-BF16 B layout); cols padded
//    to a multiple of 32.
// Scales are f16 [tile][group][16]; asymmetric int4 zeros are u8 [tile][group][16]. Padded rows and
// columns hold zero weight (code = zero point, scale 0). cols_padded is a multiple of the group size.
//
// Act-order (GPTQ desc_act): the input dimension is permuted at repack so that groups are contiguous;
// col_perm[k'] names the source column of packed column k', and activations are gathered with it.
// A row permutation can be applied at repack too: an expert's gate/up rows are reordered by down's
// col_perm so that the intermediate comes out already in down's input order (no gather between them).
//
// Memory comes from a HostArena: 64-byte aligned, in 2 MiB-aligned chunks advised MADV_HUGEPAGE, with
// hooks called on each chunk (the CUDA runtime registers them for pinned transfers; no CUDA here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/weights.h"

namespace tandem::cpu {

constexpr int kTileRows = 16;

enum class WeightFormat : uint8_t { Int4, Int8, BF16 };
const char* format_name(WeightFormat f);

struct PackedMatrix {
  WeightFormat format = WeightFormat::BF16;
  int64_t rows = 0, cols = 0;      // logical out x in
  int64_t tiles = 0;               // ceil(rows / 16)
  int64_t cols_padded = 0;         // multiple of group_size (int) or of 32 (bf16)
  int64_t group_size = 0, groups = 0;  // int formats; groups = cols_padded / group_size
  bool symmetric = true;           // int4: zero point 8 everywhere (zeros == nullptr)
  bool exact = true;               // false when repacking rounded the source (e.g. scales to f16)
  int64_t tile_bytes = 0;          // weight bytes per tile
  const uint8_t* w = nullptr;      // tiles * tile_bytes
  const uint16_t* scales = nullptr;  // f16 [tiles][groups][16]
  const uint8_t* zeros = nullptr;    // u8 [tiles][groups][16], asymmetric int4 only
  const int32_t* col_perm = nullptr;  // [cols] or nullptr (identity)

  bool is_int() const { return format != WeightFormat::BF16; }
  // Bytes a full pass over the matrix streams (weights + scales + zeros), for bandwidth figures.
  uint64_t stream_bytes() const;
  // Row n exactly as the kernels see it (scale * (code - zero)), length cols (unpermuted order if
  // `source_order`, else packed order). For tests and diagnostics, not for hot paths.
  void dequant_row(int64_t n, float* row, bool source_order = true) const;
};

// Bump allocator over large chunks (one mmap each). allocate() is thread-safe; memory lives until the
// arena dies. Chunks are first touched by whoever writes them (NUMA first-touch placement).
class HostArena {
 public:
  explicit HostArena(size_t chunk_bytes = size_t(256) << 20);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  void* allocate(size_t bytes, size_t align = 64);
  // Makes sure the next `bytes` can be served from one chunk (one registration for a whole layer).
  void reserve(size_t bytes);
  size_t mapped_bytes() const { return mapped_; }
  size_t huge_page_bytes() const { return huge_; }  // part advised MADV_HUGEPAGE successfully
  // The mappings (base, bytes), e.g. for the caller to page-lock them for DMA once they are filled
  // and placed on their NUMA nodes (locked pages cannot migrate).
  std::vector<std::pair<void*, size_t>> mappings() const;

 private:
  struct Chunk {
    uint8_t* base;
    size_t size, used;
  };
  Chunk& new_chunk(size_t min_bytes);
  size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  size_t mapped_ = 0, huge_ = 0;
  mutable std::mutex mu_;
};

struct PackOptions {
  WeightFormat format = WeightFormat::Int4;
  int64_t int8_group_size = 128;      // int8 from a dense source: 32, 64 or 128
  const int32_t* row_perm = nullptr;  // packed row n' = source row row_perm[n'] (length rows)
};

// Bytes pack_weight() will take from the arena for `src` (used to reserve a layer in one chunk).
size_t packed_bytes(const LinearWeight& src, const PackOptions& opt);

// Repacks `src` into `opt.format`. Int4 needs a GPTQ source (lossless); Int8 and BF16 take any source
// (GPTQ through dequant_row). Throws tandem::Error naming the module when the source cannot be packed.
PackedMatrix pack_weight(const LinearWeight& src, const PackOptions& opt, HostArena& arena);

}  // namespace tandem::cpu
