// gpu_core/moe_int4_wide.cu: decode MoE from integer dot products over 16-byte weight loads
// (moe_int4_decode_wide, see moe.cuh).
//
// Why this form: the fp16 form before it (each code word's 8 inputs as magic-number fp16 codes, the
// zero point subtracted, fp16 products converted to fp32: ~16 instructions a word) was issue-bound at
// several tokens: 62 us a layer at 8 tokens on the H100 against 31.5 us of bytes. Here the
// activations are quantised per 32-input vector to two int8 parts, x ~ sx (hi + lo / 254) with
// sx = max |x| / 127 (about 1.5e-5 of the vector's largest value: finer than fp16's 4.9e-4 of each
// value), and a word's 8 products are 4 dp4a on its nibbles masked in place (int4_layout.h's nibble
// order makes a word's low nibbles the inputs (0, 4, 1, 5) and its high nibbles 16 x (2, 6, 3, 7)):
// 6 instructions a word, the integer sums exact. Per vector,
//   sum (q - z)(254 hi + lo) = 254 sum q hi + sum q lo - z S,  S = sum (254 hi + lo),
// S stored with the vector's scale, then one conversion and the two scales. One layer on the H100
// (bench/results/2026-12-06-stop49-h100.md): 14.5-15.2 / 49.7-49.9 us at 1 / 8 tokens with x quantised by
// its own launch, against the fp16 form's 13.7 / 62.4; 4e-5 from the exact layer against 7e-4.
//
// Three launches: x quantised (a warp a vector; left out where the kernel that wrote x quantised it too:
// act_quant.cuh); gate/up, a block 32 rows of one (token, expert) pair so that they are one vector of
// h, quantised in the block; down, a half-warp two rows' shares of the token's experts. Every weight load
// of a thread is issued before any is used.
#include <type_traits>

#include "gpu_core/moe_int4_wide.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;

constexpr int kQuantWarps = 8;                 // x quantisation (when its writer did not): vectors per block

// x fp32 [T, H] -> quantised rows; block (vector block, token), a warp a vector.
__global__ void __launch_bounds__(kQuantWarps * 32) quantise_x_kernel(const float* __restrict__ x, int64_t H, QuantX q) {
  pdl_enter();  // x is the kernel before's output; a few blocks: let gate/up launch
  const int t = blockIdx.y, v = static_cast<int>(blockIdx.x) * kQuantWarps + static_cast<int>(threadIdx.x >> 5);
  quantise_vectors(x + t * H, H, q, t, v, static_cast<int>(H / 32));  // this warp's vector alone
}

// gate/up's warps a block for a launch of `blocks` blocks (stop 49, bench/results/2026-12-06-stop49-h100.md):
// up to about one block an SM, 32 warps of one row each keep more loads in flight; beyond, 8 of four
// (two blocks an SM). 16 of two, faster in the experiment's compile-time form, needs 104 registers here
// (one block an SM) and lost.
int gate_up_warps(int64_t blocks) { return blocks <= 128 ? 32 : 8; }

int vectors_per_lane(int64_t K, int lanes) { return static_cast<int>((K / 32 + lanes - 1) / lanes); }

// Returns launch(std::integral_constant<int, NV>) with the 16-byte vectors a lane holds (1, 2 or 4;
// the shapes moe_int4_decode_wide_fits takes need no more).
template <typename Launch>
cudaError_t with_vectors(int nv, Launch&& launch) {
  if (nv <= 1) return launch(std::integral_constant<int, 1>{});
  if (nv <= 2) return launch(std::integral_constant<int, 2>{});
  return launch(std::integral_constant<int, 4>{});
}

// log2(group_size / 32), or -1 when group_size is not 32 times a power of two.
int group_shift(int64_t group_size) {
  for (int s = 0; s < 8; ++s)
    if (group_size == (int64_t{32} << s)) return s;
  return -1;
}

}  // namespace

bool moe_int4_decode_wide_fits(int64_t H, int64_t I, int64_t group_size, int k, bool act_order) {
  return !act_order && k >= 1 && k <= kMaxK && H >= 32 && I >= 32 && H % 32 == 0 && I % 32 == 0 && group_shift(group_size) >= 0 &&
         H % group_size == 0 && I % group_size == 0 && vectors_per_lane(H, 32) <= 4 && vectors_per_lane(I, kDownLanes) <= 4;
}

bool shared_down_fits(int64_t in) { return in >= 8 && in % 8 == 0 && in <= 1024; }  // shared_down_row: every vector in registers

namespace {

// Whether `shared` asks for a shared down the down launch can take (moe.cuh), given one token and H rows.
bool shared_ok(const SharedDown& shared, int T, int64_t H) {
  if (!shared_down_fits(shared.in) || T != 1 || !shared.g || !shared.u || !shared.out) return false;
  if (shared.w) return !shared.w8.codes;
  const Rows8View& w8 = shared.w8;
  return w8.scales && w8.format == RowFormat::Int8 && w8.N == H && w8.K == shared.in && shared.in % 16 == 0;
}

}  // namespace

cudaError_t moe_int4_decode_wide(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                 const float* weights, int T, int k, const float* x, bool x_quantised, void* workspace, float* out,
                                 cudaStream_t stream, const SharedDown& shared) {
  if (T < 1 || T > kMaxGemvTokens || !moe_int4_decode_wide_fits(H, I, group_size, k, false)) return cudaErrorInvalidValue;
  const bool has_shared = shared.w || shared.w8.codes;
  if (has_shared && !shared_ok(shared, T, H)) return cudaErrorInvalidValue;
  const WideMoeLayout lay = wide_moe_layout(T, k, H, I);
  auto* base = static_cast<uint8_t*>(workspace);
  const QuantX q = wide_moe_x(workspace, T, k, H, I);
  const auto* xs = static_cast<const VecScale*>(q.vectors);
  auto* hq = base + lay.hq;
  auto* hs = reinterpret_cast<VecScale*>(base + lay.hs);
  auto* down = reinterpret_cast<DownRef*>(base + lay.down);
  const int gs = group_shift(group_size);
  cudaError_t err = cudaSuccess;
  if (!x_quantised) {
    const int nvx = static_cast<int>(H / 32);
    err = launch(quantise_x_kernel, dim3(static_cast<unsigned>((nvx + kQuantWarps - 1) / kQuantWarps), static_cast<unsigned>(T)),
                 dim3(kQuantWarps * 32), 0, stream, x, H, q);
    if (err != cudaSuccess) return err;
  }
  const dim3 up_grid(static_cast<unsigned>(I / kBlockRows), static_cast<unsigned>(T * k));
  const int warps = gate_up_warps(int64_t{up_grid.x} * up_grid.y);
  err = with_vectors(vectors_per_lane(H, 32), [&](auto nv) {
    auto go = [&](auto kernel, int w) {
      return launch(kernel, up_grid, dim3(w * 32), 0, stream, experts, H, I, ids, k, static_cast<const uint8_t*>(q.parts), xs, hq,
                    hs, down, gs);
    };
    if constexpr (nv.value <= 2) {  // 4 vectors a lane would spill at 32 warps' 64 registers
      if (warps == 32) return go(wide_gate_up_kernel<nv.value, 32>, 32);
    }
    return go(wide_gate_up_kernel<nv.value, 8>, 8);
  });
  if (err != cudaSuccess) return err;
  const dim3 down_grid(static_cast<unsigned>(H / (kDownRows * kDownRowsPer)), static_cast<unsigned>(T + (has_shared ? 1 : 0)));
  return with_vectors(vectors_per_lane(I, kDownLanes), [&](auto nv) {
    auto go = [&](auto kernel) {
      return launch(kernel, down_grid, dim3(kDownThreads), 0, stream, static_cast<const DownRef*>(down), H, I, weights, k, hq, hs, out, gs,
                    shared);
    };
    if (shared.w) return go(wide_down_kernel<nv.value, kSharedBf16>);
    return shared.w8.codes ? go(wide_down_kernel<nv.value, kSharedInt8>) : go(wide_down_kernel<nv.value, kNoShared>);
  });
}

}  // namespace tandem::gpu
