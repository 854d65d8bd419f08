// tests/unit/cpu_experts_cases.h: synthetic expert weights for the cpu_experts tests and benchmarks.
//
// GPTQ matrices are packed here independently of the runtime (spec §4: qweight [in/8, out] nibbles
// along in, qzeros [groups, out/8] nibbles along out, f16 scales [groups, out], g_idx for act-order),
// so the repack is checked against the format's definition, not against itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/weights.h"

namespace tandem::test {

// A LinearWeight plus the storage it points into (heap-allocated so the pointers stay valid).
struct SynthMatrix {
  LinearWeight w;
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<uint16_t> scales, dense;
};

struct GptqSpec {
  int64_t group_size = 128;  // a size that does not divide `in` becomes `in` (GPTQ group_size -1)
  bool sym = true, act_order = false, v1 = true;
  bool up_own_order = false;  // act-order: up gets its own g_idx (GPTQ gives gate and up the same one)
};

inline std::unique_ptr<SynthMatrix> synth_gptq(std::mt19937& rng, int64_t out, int64_t in, GptqSpec spec) {
  auto m = std::make_unique<SynthMatrix>();
  const int64_t gs = in % spec.group_size == 0 ? spec.group_size : in;
  const int64_t groups = in / gs;
  std::uniform_int_distribution<int> nib(0, 15), zero_dist(0, 15);
  // f16 scales between ~1e-3 and ~4e-3 with random mantissas: weights ~ +-0.03, like real experts.
  std::uniform_int_distribution<int> exp_dist(5, 6), mant_dist(0, 1023);
  m->qweight.assign(static_cast<size_t>(in / 8 * out), 0);
  for (int64_t k = 0; k < in; ++k)
    for (int64_t n = 0; n < out; ++n)
      m->qweight[(k / 8) * out + n] |= static_cast<int32_t>(static_cast<uint32_t>(nib(rng)) << (4 * (k % 8)));
  m->qzeros.assign(static_cast<size_t>(groups * (out / 8)), 0);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n = 0; n < out; ++n) {
      const int zero = spec.sym ? 8 : zero_dist(rng);
      m->qzeros[g * (out / 8) + n / 8] |= static_cast<int32_t>(static_cast<uint32_t>(zero) << (4 * (n % 8)));
    }
  // v1 as GPTQModel writes it: the v2 word minus 0x11111111 (zero points of 0 borrow).
  if (spec.v1)
    for (auto& w : m->qzeros) w = static_cast<int32_t>(static_cast<uint32_t>(w) - 0x11111111u);
  m->scales.resize(static_cast<size_t>(groups * out));
  for (auto& s : m->scales) s = static_cast<uint16_t>((exp_dist(rng) << 10) | mant_dist(rng));
  if (spec.act_order) {
    std::vector<int> perm(static_cast<size_t>(in));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    m->g_idx.resize(static_cast<size_t>(in));
    for (int64_t k = 0; k < in; ++k) m->g_idx[k] = static_cast<int32_t>(perm[k] / gs);
  }
  LinearWeight& w = m->w;
  w.kind = LinearWeight::Kind::Gptq;
  w.name = "synthetic.gptq";
  w.out = out;
  w.in = in;
  w.gptq.qweight = m->qweight.data();
  w.gptq.qzeros = m->qzeros.data();
  w.gptq.scales = m->scales.data();
  w.gptq.scales_dtype = DType::F16;
  w.gptq.g_idx = spec.act_order ? m->g_idx.data() : nullptr;
  w.gptq.group_size = gs;
  w.gptq.num_groups = groups;
  w.gptq.zero_offset = spec.v1 ? 1 : 0;
  return m;
}

inline std::unique_ptr<SynthMatrix> synth_bf16(std::mt19937& rng, int64_t out, int64_t in, float stddev = 0.02f) {
  auto m = std::make_unique<SynthMatrix>();
  std::normal_distribution<float> d(0.0f, stddev);
  m->dense.resize(static_cast<size_t>(out * in));
  for (auto& v : m->dense) v = f32_to_bf16(d(rng));
  LinearWeight& w = m->w;
  w.kind = LinearWeight::Kind::Dense;
  w.name = "synthetic.bf16";
  w.out = out;
  w.in = in;
  w.dense = m->dense.data();
  w.dense_dtype = DType::BF16;
  return m;
}

struct SynthExpert {
  std::unique_ptr<SynthMatrix> gate, up, down;
};

// GPTQ expert (gate/up/down with one spec) or dense BF16 expert when `gptq` is false.
inline SynthExpert synth_expert(std::mt19937& rng, int64_t hidden, int64_t inter, bool gptq, GptqSpec spec = {}) {
  SynthExpert e;
  if (gptq) {
    e.gate = synth_gptq(rng, inter, hidden, spec);
    e.up = synth_gptq(rng, inter, hidden, spec);
    if (spec.act_order && !spec.up_own_order && e.up->w.gptq.group_size == e.gate->w.gptq.group_size) {
      e.up->g_idx = e.gate->g_idx;
      e.up->w.gptq.g_idx = e.up->g_idx.data();
    }
    e.down = synth_gptq(rng, hidden, inter, spec);
  } else {
    e.gate = synth_bf16(rng, inter, hidden);
    e.up = synth_bf16(rng, inter, hidden);
    e.down = synth_bf16(rng, hidden, inter);
  }
  return e;
}

// Top-k routing with distinct experts per token and weights that sum to 1 (as the router's are).
inline void synth_routing(std::mt19937& rng, int64_t T, int k, int num_experts, std::vector<int32_t>& ids,
                          std::vector<float>& weights) {
  ids.resize(static_cast<size_t>(T * k));
  weights.resize(static_cast<size_t>(T * k));
  std::vector<int32_t> all(static_cast<size_t>(num_experts));
  std::iota(all.begin(), all.end(), 0);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      ids[t * k + j] = all[j];
      sum += weights[t * k + j] = u(rng);
    }
    for (int j = 0; j < k; ++j) weights[t * k + j] /= sum;
  }
}

}  // namespace tandem::test
