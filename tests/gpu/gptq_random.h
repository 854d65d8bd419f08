// tests/gpu/gptq_random.h: a random GPTQ int4 matrix, viewed both as the runtime's LinearWeight
// (the definition) and as the source of the GPU repack.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_core/int4_layout.h"
#include "core/weights.h"

namespace tandem::test {

struct RandomGptq {
  int64_t N, K, gs;
  bool sym, act_order, v1;
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<uint16_t> scales;

  RandomGptq(std::mt19937& rng, int64_t n, int64_t k, int64_t group, bool symmetric, bool act, bool v1_format)
      : N(n), K(k), gs(group), sym(symmetric), act_order(act), v1(v1_format) {
    const int64_t G = K / gs;
    std::uniform_int_distribution<int> nib(0, 15), exp_dist(5, 9), mant(0, 1023);
    qweight.assign(K / 8 * N, 0);
    qzeros.assign(G * N / 8, 0);
    g_idx.resize(K);
    scales.resize(G * N);
    for (auto& w : qweight) w = static_cast<int32_t>(rng());
    for (auto& w : qzeros)
      for (int j = 0; j < 8; ++j)
        w |= static_cast<int32_t>(static_cast<uint32_t>(sym ? (v1 ? 7 : 8) : nib(rng)) << (4 * j));
    for (auto& s : scales) s = static_cast<uint16_t>((exp_dist(rng) << 10) | mant(rng));
    std::vector<int32_t> perm(K);
    std::iota(perm.begin(), perm.end(), 0);
    if (act_order) std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < K; ++i) g_idx[i] = static_cast<int32_t>(perm[i] / gs);
  }

  LinearWeight view() const {
    LinearWeight w;
    w.kind = LinearWeight::Kind::Gptq;
    w.out = N;
    w.in = K;
    w.gptq = {qweight.data(), qzeros.data(), scales.data(), DType::F16, act_order ? g_idx.data() : nullptr, gs, K / gs,
              v1 ? 1 : 0};
    return w;
  }
  gpu::GptqSource source() const {
    return {qweight.data(), qzeros.data(), scales.data(), act_order ? g_idx.data() : nullptr, N, K, gs, v1 ? 1 : 0};
  }
};

}  // namespace tandem::test
