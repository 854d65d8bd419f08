#include "cpu_experts/cpu_moe.h"

#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace tandem::cpu {

namespace {

int64_t key_of(int layer, int expert) { return (static_cast<int64_t>(layer) << 32) | static_cast<uint32_t>(expert); }
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Task sizes: small enough that 16 threads get several tasks each in a decode step (8 experts at the
// 35B shape: 128 phase-1 tasks of ~33 KB each of gate and up with the default
// CpuExpertStoreOptions::up_block_rows, and 64 phase-2 tasks of ~66 KB at int4), large enough to
// stream. They are also the units of the NUMA split (CpuExpertStore::bind_by_node).
constexpr int64_t kDownBlockTiles = 2;  // phase 2: 32 output rows per task

int64_t up_blocks(const PackedMatrix& gate, int64_t block_rows) {
  const int64_t tiles = block_rows / kTileRows;
  return (gate.tiles + tiles - 1) / tiles;
}

}  // namespace

// ---------------------------------------------------------------- store

CpuExpertStore::CpuExpertStore(CpuExpertStoreOptions opt)
    : opt_(std::move(opt)), arena_(std::make_unique<HostArena>()) {
  if (opt_.dense_format == WeightFormat::Int4)
    fail("cpu experts: dense_format cannot be int4 (int4 comes only from GPTQ checkpoints)");
  if (opt_.up_block_rows < kTileRows || opt_.up_block_rows % kTileRows)
    fail("cpu experts: up_block_rows must be a positive multiple of ", kTileRows, " (got ", opt_.up_block_rows, ")");
}

CpuExpertStore::~CpuExpertStore() = default;

WeightFormat CpuExpertStore::format_for(const LinearWeight& w) const {
  if (opt_.format == WeightFormat::Int4 && w.kind != LinearWeight::Kind::Gptq) return opt_.dense_format;
  return opt_.format;
}

size_t CpuExpertStore::expert_bytes(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down) const {
  auto bytes = [&](const LinearWeight& w) {
    return packed_bytes(w, {format_for(w), opt_.int8_group_size, nullptr}) + 64;
  };
  return bytes(gate) + bytes(up) + bytes(down);
}

ExpertWeights CpuExpertStore::pack_expert(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down) {
  if (gate.out != up.out || gate.in != up.in || down.in != gate.out || down.out != gate.in)
    fail("cpu experts: expert matrices '", gate.name, "' [", gate.out, "x", gate.in, "], '", up.name, "' [", up.out,
         "x", up.in, "], '", down.name, "' [", down.out, "x", down.in, "] do not form a SwiGLU expert");
  ExpertWeights e;
  e.hidden = gate.in;
  e.inter = gate.out;
  e.down = pack_weight(down, {format_for(down), opt_.int8_group_size, nullptr}, *arena_);
  // Gate/up rows follow down's (act-order) input order, so h needs no gather before down.
  e.gate = pack_weight(gate, {format_for(gate), opt_.int8_group_size, e.down.col_perm}, *arena_);
  e.up = pack_weight(up, {format_for(up), opt_.int8_group_size, e.down.col_perm}, *arena_);
  // GPTQ derives act-order from the input's statistics, so gate and up usually share it: one gather.
  if (e.gate.col_perm && e.up.col_perm && std::equal(e.gate.col_perm, e.gate.col_perm + e.gate.cols, e.up.col_perm))
    e.up.col_perm = e.gate.col_perm;
  return e;
}

void CpuExpertStore::insert(int layer, int expert, ExpertWeights w) {
  if (!entries_.empty() && entries_.front().hidden != w.hidden)
    fail("cpu experts: expert ", expert, " of layer ", layer, " has hidden size ", w.hidden, ", the store holds ",
         entries_.front().hidden);
  const int64_t key = key_of(layer, expert);
  if (index_.count(key)) fail("cpu experts: expert ", expert, " of layer ", layer, " is already in the store");
  index_[key] = entries_.size();
  entries_.push_back(std::move(w));
}

void CpuExpertStore::add_expert(int layer, int expert, const LinearWeight& gate, const LinearWeight& up,
                                const LinearWeight& down) {
  insert(layer, expert, pack_expert(gate, up, down));
}

void CpuExpertStore::add_layer(int layer, const MoeWeights& moe, std::span<const int> experts, ThreadPool* pool) {
  const int E = static_cast<int>(moe.gate.size());
  std::vector<int> ids(experts.begin(), experts.end());
  if (ids.empty()) {
    ids.resize(E);
    std::iota(ids.begin(), ids.end(), 0);
  }
  struct Src {
    const LinearWeight *g, *u, *d;
  };
  std::vector<Src> src;
  size_t total = 0;
  for (int id : ids) {
    if (id == E) {
      if (moe.shared_gate.empty()) fail("cpu experts: layer ", layer, " has no shared expert");
      src.push_back({&moe.shared_gate, &moe.shared_up, &moe.shared_down});
    } else if (id >= 0 && id < E) {
      src.push_back({&moe.gate[id], &moe.up[id], &moe.down[id]});
    } else {
      fail("cpu experts: expert id ", id, " is outside 0..", E, " (", E, " = shared expert) in layer ", layer);
    }
    total += expert_bytes(*src.back().g, *src.back().u, *src.back().d);
  }
  arena_->reserve(total);  // one chunk (one host registration) per layer
  std::vector<ExpertWeights> packed(src.size());
  auto job = [&](int64_t i, int) { packed[i] = pack_expert(*src[i].g, *src[i].u, *src[i].d); };
  if (pool) pool->run(static_cast<int64_t>(src.size()), job);
  else
    for (size_t i = 0; i < src.size(); ++i) job(static_cast<int64_t>(i), 0);
  if (pool && pool->numa_nodes() > 1)
    for (const ExpertWeights& e : packed) bind_by_node(e, *pool);
  for (size_t i = 0; i < ids.size(); ++i) insert(layer, ids[i], std::move(packed[i]));
}

void CpuExpertStore::bind_by_node(const ExpertWeights& e, const ThreadPool& pool) {
  // Node j computes phase-1 blocks node_range(j, blocks) of gate and up and phase-2 blocks
  // node_range(j, blocks) of down (cpu_moe_forward): those tiles' weights, scales and zeros go there.
  auto bind = [&](const PackedMatrix& m, int64_t tiles_per_block) {
    const int64_t blocks = (m.tiles + tiles_per_block - 1) / tiles_per_block, per_tile = m.groups * kTileRows;
    for (int j = 0; j < pool.numa_nodes(); ++j) {
      const auto [b0, b1] = pool.node_range(j, blocks);
      const int64_t t0 = b0 * tiles_per_block, t1 = std::min(m.tiles, b1 * tiles_per_block);
      if (t1 <= t0) continue;
      if (pool.bind_to_node(m.w + t0 * m.tile_bytes, static_cast<size_t>((t1 - t0) * m.tile_bytes), j))
        node_bound_bytes_ += static_cast<uint64_t>((t1 - t0) * m.tile_bytes);
      if (!m.is_int()) continue;
      pool.bind_to_node(m.scales + t0 * per_tile, static_cast<size_t>((t1 - t0) * per_tile * 2), j);
      if (m.zeros) pool.bind_to_node(m.zeros + t0 * per_tile, static_cast<size_t>((t1 - t0) * per_tile), j);
    }
  };
  bind(e.gate, opt_.up_block_rows / kTileRows);
  bind(e.up, opt_.up_block_rows / kTileRows);
  bind(e.down, kDownBlockTiles);
}

const ExpertWeights* CpuExpertStore::find(int layer, int expert) const {
  auto it = index_.find(key_of(layer, expert));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

uint64_t CpuExpertStore::stream_bytes() const {
  uint64_t b = 0;
  for (const auto& e : entries_) b += e.stream_bytes();
  return b;
}

std::string CpuExpertStore::description() const {
  std::map<std::string, int> kinds;
  bool exact = true;
  for (const auto& e : entries_) {
    for (const PackedMatrix* m : {&e.gate, &e.up, &e.down}) exact = exact && m->exact;
    const PackedMatrix& m = e.gate;
    std::string k = format_name(m.format);
    if (m.is_int()) k += str_cat(" g", m.group_size);
    if (m.format == WeightFormat::Int4) k += m.symmetric ? " sym" : " asym";
    if (m.col_perm || e.down.col_perm) k += " act-order";
    ++kinds[k];
  }
  std::string s = str_cat("cpu expert store: ", entries_.size(), " experts (");
  bool first = true;
  for (const auto& [k, n] : kinds) {
    s += str_cat(first ? "" : ", ", n, " ", k);
    first = false;
  }
  s += str_cat("), ", act_precision_name(opt_.act), " activations, ", stream_bytes() >> 20, " MiB of weights",
               exact ? "" : " (some rounded at repack)", ", ",
               arena_->mapped_bytes() >> 20, " MiB mapped, ", arena_->huge_page_bytes() >> 20, " MiB huge-page advised");
  if (node_bound_bytes_) s += str_cat(", ", node_bound_bytes_ >> 20, " MiB bound to the NUMA node that reads it");
  return s;
}

// ---------------------------------------------------------------- forward

namespace {

// Activations prepared once per call for all rows of x (identity column order).
struct XPrep {
  bool is_int = true;
  bool wide = false;  // 16-bit activations
  int64_t group_size = 0, cols_padded = 0;
  size_t off = 0;  // into the per-call buffer
  QuantActs q;
  const float* f = nullptr;
  int64_t f_stride = 0;
};

struct Job {
  const ExpertWeights* w = nullptr;
  int64_t tok0 = 0, ntok = 0;  // slice of job_tokens / job_weights
  int xprep_gate = -1, xprep_up = -1;  // -1: act-order, gathered per expert (xq_gate / xq_up)
  int64_t nblk = 0;                    // phase-1 blocks of up_block_rows rows
  size_t grp0 = 0;                     // first of this job's down-group counters
  size_t h_off = 0, hq_off = 0;  // into the per-call buffer
  size_t xg_off = 0, xu_off = 0;  // act-order: this expert's gathered, quantized rows (gate, up)
  QuantActs xq_gate, xq_up;
  bool up_shares_gate = false;
  float* h = nullptr;
  int64_t h_stride = 0;
  QuantActs hq;
};

size_t align64(size_t v) { return (v + 63) & ~size_t(63); }

// Prefetch (into L2) the weights, scales and zeros of tiles [t0, t1) of m.
void prefetch_tiles(const PackedMatrix& m, int64_t t0, int64_t t1) {
  const char* w = reinterpret_cast<const char*>(m.w + t0 * m.tile_bytes);
  for (int64_t o = 0; o < (t1 - t0) * m.tile_bytes; o += 64) _mm_prefetch(w + o, _MM_HINT_T1);
  if (!m.is_int()) return;
  const int64_t per_tile = m.groups * kTileRows;
  const char* sc = reinterpret_cast<const char*>(m.scales + t0 * per_tile);
  for (int64_t o = 0; o < (t1 - t0) * per_tile * 2; o += 64) _mm_prefetch(sc + o, _MM_HINT_T1);
  if (m.zeros) {
    const char* z = reinterpret_cast<const char*>(m.zeros + t0 * per_tile);
    for (int64_t o = 0; o < (t1 - t0) * per_tile; o += 64) _mm_prefetch(z + o, _MM_HINT_T1);
  }
}

}  // namespace

struct CpuMoeWorkspace::Impl {
  std::vector<Job> jobs;
  std::vector<int32_t> tokens, order;
  std::vector<float> tok_weights;
  std::vector<XPrep> preps;
  std::vector<std::pair<int32_t, int32_t>> tasks0;  // (x prep, row chunk) or (-1 - job, 0 gate / 1 up)
  std::vector<std::pair<int32_t, int32_t>> tasks1;  // (job, block), node by node
  std::vector<int64_t> node_end;                     // end of each node's slice of tasks1
  std::vector<int32_t> iota;
  std::unique_ptr<std::atomic<int32_t>[]> pending;  // per down group: phase-1 blocks still to write it
  size_t pending_cap = 0;
  std::vector<uint8_t> buf;      // per call: prepared x, h, hq
  std::vector<uint8_t> scratch;  // per worker
  size_t scratch_per_worker = 0;
};

CpuMoeWorkspace::CpuMoeWorkspace() : impl(std::make_unique<Impl>()) {}
CpuMoeWorkspace::~CpuMoeWorkspace() = default;

namespace {

void grow(std::vector<uint8_t>& v, size_t bytes) {
  if (v.size() < bytes) v.resize(bytes + bytes / 4);
}

// Whether m's activations are quantized to 16 bits (the store's precision, where the group size
// allows it: qmatmul.h's limit).
bool wide_acts(const PackedMatrix& m, ActPrecision act) {
  return m.is_int() && act == ActPrecision::Int16 && act16_group_ok(m);
}

// Quantized-activation buffer sizes for `rows` rows of a matrix input (16-bit: two planes, two sums).
size_t quant_bytes(int64_t rows, int64_t cols_padded, int64_t groups, bool wide) {
  const size_t planes = wide ? 2 : 1;
  return planes * align64(static_cast<size_t>(rows * round_up(cols_padded, 64))) +
         (1 + planes) * align64(static_cast<size_t>(rows * groups * 4));
}

QuantActs quant_view(uint8_t* base, int64_t rows, int64_t cols_padded, int64_t groups, bool wide) {
  QuantActs q;
  q.q_stride = round_up(cols_padded, 64);
  q.g_stride = groups;
  const size_t plane = align64(static_cast<size_t>(rows * q.q_stride)), sums = align64(static_cast<size_t>(rows * groups * 4));
  q.q = reinterpret_cast<int8_t*>(base);
  base += plane;
  q.scale = reinterpret_cast<float*>(base);
  base += sums;
  q.sum = reinterpret_cast<int32_t*>(base);
  base += sums;
  if (wide) {
    q.q_hi = reinterpret_cast<int8_t*>(base);
    q.sum_hi = reinterpret_cast<int32_t*>(base + plane);
  }
  return q;
}

int find_or_add_prep(std::vector<XPrep>& preps, const PackedMatrix& m, ActPrecision act) {
  if (m.col_perm) return -1;
  const bool wide = wide_acts(m, act);
  for (size_t i = 0; i < preps.size(); ++i)
    if (preps[i].is_int == m.is_int() && preps[i].cols_padded == m.cols_padded &&
        (!m.is_int() || (preps[i].group_size == m.group_size && preps[i].wide == wide)))
      return static_cast<int>(i);
  XPrep p;
  p.is_int = m.is_int();
  p.wide = wide;
  p.group_size = m.group_size;
  p.cols_padded = m.cols_padded;
  preps.push_back(p);
  return static_cast<int>(preps.size() - 1);
}

}  // namespace

void cpu_moe_forward(const CpuExpertStore& store, int layer, const float* x, int64_t T, const int32_t* ids,
                     const float* weights, int k, float* out, ThreadPool& pool, CpuMoeWorkspace& workspace,
                     const CpuKernels& kern) {
  cpu_moe_forward(store, layer, x, T, ids, weights, k, out, pool, workspace, kern, store.options().act);
}

void cpu_moe_forward(const CpuExpertStore& store, int layer, const float* x, int64_t T, const int32_t* ids,
                     const float* weights, int k, float* out, ThreadPool& pool, CpuMoeWorkspace& workspace,
                     const CpuKernels& kern, ActPrecision act) {
  if (T <= 0 || k <= 0) return;
  CpuMoeWorkspace::Impl& ws = *workspace.impl;
  const int64_t ub = store.options().up_block_rows;  // phase-1 rows per task

  // Group (token, weight) pairs by expert, experts in ascending id order (fixes the summation order).
  ws.order.resize(static_cast<size_t>(T * k));
  std::iota(ws.order.begin(), ws.order.end(), 0);
  std::stable_sort(ws.order.begin(), ws.order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  ws.jobs.clear();
  ws.tokens.clear();
  ws.tok_weights.clear();
  ws.preps.clear();
  int64_t H = 0, max_ntok = 0;
  for (size_t i = 0; i < ws.order.size(); ++i) {
    const int32_t slot = ws.order[i], e = ids[slot];
    if (e < 0) continue;
    if (ws.jobs.empty() || ids[ws.order[i - 1]] != e) {
      const ExpertWeights* w = store.find(layer, e);
      if (!w) fail("cpu experts: expert ", e, " of layer ", layer, " is not in the CPU expert store");
      Job j;
      j.w = w;
      j.tok0 = static_cast<int64_t>(ws.tokens.size());
      ws.jobs.push_back(j);
      H = w->hidden;
    }
    ws.tokens.push_back(slot / k);
    ws.tok_weights.push_back(weights[slot]);
    Job& j = ws.jobs.back();
    j.ntok = static_cast<int64_t>(ws.tokens.size()) - j.tok0;
    max_ntok = std::max(max_ntok, j.ntok);
  }
  if (ws.jobs.empty()) return;

  // Sizes: prepared x, per-job h and hq, per-worker scratch.
  size_t off = 0;
  for (Job& j : ws.jobs) {
    j.xprep_gate = find_or_add_prep(ws.preps, j.w->gate, act);
    j.xprep_up = find_or_add_prep(ws.preps, j.w->up, act);
  }
  for (XPrep& p : ws.preps) {
    p.off = off;
    if (p.is_int) off += quant_bytes(T, p.cols_padded, p.cols_padded / p.group_size, p.wide);
    else if (p.cols_padded != H) off += align64(static_cast<size_t>(T * p.cols_padded * 4));
  }
  size_t groups_total = 0;
  for (Job& j : ws.jobs) {
    const PackedMatrix &g = j.w->gate, &d = j.w->down;
    j.nblk = up_blocks(g, ub);
    j.h_stride = round_up(std::max(g.tiles * kTileRows, d.cols_padded), 16);
    j.grp0 = groups_total;
    if (d.is_int()) groups_total += static_cast<size_t>(d.groups);
    const PackedMatrix& u = j.w->up;
    j.up_shares_gate = u.col_perm && u.col_perm == g.col_perm && u.group_size == g.group_size &&
                       wide_acts(u, act) == wide_acts(g, act);
    if (g.col_perm) {
      j.xg_off = align64(off);
      off = j.xg_off + quant_bytes(j.ntok, g.cols_padded, g.groups, wide_acts(g, act));
    }
    if (u.col_perm && !j.up_shares_gate) {
      j.xu_off = align64(off);
      off = j.xu_off + quant_bytes(j.ntok, u.cols_padded, u.groups, wide_acts(u, act));
    }
    off = align64(off);
    j.h_off = off;
    off += static_cast<size_t>(j.ntok * j.h_stride * 4);
    j.hq_off = align64(off);
    off = j.hq_off + (d.is_int() ? quant_bytes(j.ntok, d.cols_padded, d.groups, wide_acts(d, act)) : 0);
  }
  grow(ws.buf, off + 64);
  uint8_t* base = reinterpret_cast<uint8_t*>(align64(reinterpret_cast<size_t>(ws.buf.data())));
  for (XPrep& p : ws.preps) {
    if (p.is_int) {
      p.q = quant_view(base + p.off, T, p.cols_padded, p.cols_padded / p.group_size, p.wide);
    } else if (p.cols_padded != H) {
      auto* f = reinterpret_cast<float*>(base + p.off);
      for (int64_t t = 0; t < T; ++t) {
        std::memcpy(f + t * p.cols_padded, x + t * H, static_cast<size_t>(H) * 4);
        std::fill(f + t * p.cols_padded + H, f + (t + 1) * p.cols_padded, 0.0f);
      }
      p.f = f;
      p.f_stride = p.cols_padded;
    } else {
      p.f = x;
      p.f_stride = H;
    }
  }
  for (Job& j : ws.jobs) {
    j.h = reinterpret_cast<float*>(base + j.h_off);
    const PackedMatrix &g = j.w->gate, &u = j.w->up, &d = j.w->down;
    if (g.col_perm) j.xq_gate = quant_view(base + j.xg_off, j.ntok, g.cols_padded, g.groups, wide_acts(g, act));
    if (u.col_perm)
      j.xq_up = j.up_shares_gate ? j.xq_gate : quant_view(base + j.xu_off, j.ntok, u.cols_padded, u.groups, wide_acts(u, act));
    if (d.is_int()) j.hq = quant_view(base + j.hq_off, j.ntok, d.cols_padded, d.groups, wide_acts(d, act));
    const int64_t written = j.w->gate.tiles * kTileRows;  // phase 1 writes columns [0, written)
    if (j.h_stride > written)
      for (int64_t i = 0; i < j.ntok; ++i) std::fill(j.h + i * j.h_stride + written, j.h + (i + 1) * j.h_stride, 0.0f);
  }
  // Down-input groups are re-quantized by whichever phase-1 task writes their last rows.
  if (ws.pending_cap < groups_total) {
    ws.pending = std::make_unique<std::atomic<int32_t>[]>(groups_total);
    ws.pending_cap = groups_total;
  }
  for (const Job& j : ws.jobs) {
    const PackedMatrix& d = j.w->down;
    if (!d.is_int()) continue;
    const int64_t rows = j.w->gate.tiles * kTileRows;
    for (int64_t g = 0; g < d.groups; ++g) {
      const int64_t c0 = g * d.group_size, c1 = std::min((g + 1) * d.group_size, rows);
      ws.pending[j.grp0 + static_cast<size_t>(g)].store(static_cast<int32_t>((c1 - 1) / ub - c0 / ub + 1),
                                                       std::memory_order_relaxed);
    }
  }
  // Per worker: gate and up outputs of one block, one down block.
  const size_t y_bytes = align64(static_cast<size_t>(max_ntok * ub * 4));
  const size_t down_bytes = align64(static_cast<size_t>(max_ntok * kDownBlockTiles * kTileRows * 4));
  const size_t per_worker = 2 * y_bytes + down_bytes;
  grow(ws.scratch, per_worker * static_cast<size_t>(pool.threads()) + 64);
  uint8_t* scratch = reinterpret_cast<uint8_t*>(align64(reinterpret_cast<size_t>(ws.scratch.data())));
  if (static_cast<int64_t>(ws.iota.size()) < max_ntok) {
    ws.iota.resize(static_cast<size_t>(max_ntok));
    std::iota(ws.iota.begin(), ws.iota.end(), 0);
  }

  // Phase 0: quantize x once per (group size, padding), by chunks of rows when T is large; and each
  // act-order expert's rows, gathered through its column permutation, once per expert.
  {
    constexpr int64_t kRowsPerTask = 16;
    const int64_t chunks = (T + kRowsPerTask - 1) / kRowsPerTask;
    ws.tasks0.clear();
    for (size_t p = 0; p < ws.preps.size(); ++p)
      if (ws.preps[p].is_int)
        for (int64_t c = 0; c < chunks; ++c) ws.tasks0.push_back({static_cast<int32_t>(p), static_cast<int32_t>(c)});
    int64_t rows = static_cast<int64_t>(ws.tasks0.size()) * kRowsPerTask;
    for (size_t j = 0; j < ws.jobs.size(); ++j) {
      const Job& job = ws.jobs[j];
      if (job.w->gate.col_perm) ws.tasks0.push_back({-1 - static_cast<int32_t>(j), 0});
      if (job.w->up.col_perm && !job.up_shares_gate) ws.tasks0.push_back({-1 - static_cast<int32_t>(j), 1});
      rows += job.w->gate.col_perm || job.w->up.col_perm ? job.ntok : 0;
    }
    auto prep = [&](int64_t task, int) {
      const auto [a, b] = ws.tasks0[static_cast<size_t>(task)];
      if (a >= 0) {
        const XPrep& p = ws.preps[static_cast<size_t>(a)];
        const int64_t r0 = b * kRowsPerTask, r1 = std::min(T, r0 + kRowsPerTask);
        QuantActs q = p.q;
        q.q += r0 * q.q_stride;
        q.scale += r0 * q.g_stride;
        q.sum += r0 * q.g_stride;
        if (q.wide()) {
          q.q_hi += r0 * q.q_stride;
          q.sum_hi += r0 * q.g_stride;
        }
        kern.quantize_rows(x + r0 * H, H, nullptr, r1 - r0, nullptr, H, p.cols_padded, p.group_size, q);
      } else {
        const Job& j = ws.jobs[static_cast<size_t>(-1 - a)];
        const PackedMatrix& m = b == 0 ? j.w->gate : j.w->up;
        kern.quantize_rows(x, H, ws.tokens.data() + j.tok0, j.ntok, m.col_perm, m.cols, m.cols_padded, m.group_size,
                           b == 0 ? j.xq_gate : j.xq_up);
      }
    };
    const int64_t n = static_cast<int64_t>(ws.tasks0.size());
    if (rows >= 64) pool.run(n, prep);  // a few rows cost less than waking the pool
    else
      for (int64_t t = 0; t < n; ++t) prep(t, 0);
  }

  // Phase 1: gate + up + SwiGLU (+ re-quantization for down) per (expert, block of rows); node by
  // node, each node's slice holding the blocks whose weights live there (bind_by_node).
  ws.tasks1.clear();
  ws.node_end.clear();
  for (int node = 0; node < pool.numa_nodes(); ++node) {
    for (size_t j = 0; j < ws.jobs.size(); ++j) {
      const auto [b0, b1] = pool.node_range(node, ws.jobs[j].nblk);
      for (int64_t b = b0; b < b1; ++b) ws.tasks1.push_back({static_cast<int32_t>(j), static_cast<int32_t>(b)});
    }
    ws.node_end.push_back(static_cast<int64_t>(ws.tasks1.size()));
  }
  auto act_for = [&](const Job& j, int prep, const QuantActs& gathered) {
    ActRows a;
    a.nrows = j.ntok;
    if (prep >= 0) {
      const XPrep& p = ws.preps[static_cast<size_t>(prep)];
      a.q = p.q;
      a.f = p.f;
      a.f_stride = p.f_stride;
      a.rows = ws.tokens.data() + j.tok0;
    } else {  // act-order: rows gathered and quantized for this expert in phase 0
      a.q = gathered;
      a.rows = ws.iota.data();
    }
    return a;
  };
  pool.run_split(static_cast<int64_t>(ws.tasks1.size()), ws.node_end.data(), [&](int64_t task, int worker) {
    const auto [ji, b] = ws.tasks1[static_cast<size_t>(task)];
    const Job& j = ws.jobs[static_cast<size_t>(ji)];
    const ExpertWeights& e = *j.w;
    uint8_t* s = scratch + per_worker * static_cast<size_t>(worker);
    auto* yg = reinterpret_cast<float*>(s);
    auto* yu = reinterpret_cast<float*>(s + y_bytes);
    const int64_t r0 = b * ub, r1 = std::min(r0 + ub, e.gate.tiles * kTileRows);
    const int64_t t0 = r0 / kTileRows, t1 = r1 / kTileRows, w = r1 - r0;
    const ActRows ag = act_for(j, j.xprep_gate, j.xq_gate);
    const ActRows au = act_for(j, j.xprep_up, j.xq_up);
    kern.matmul[static_cast<int>(e.gate.format)](e.gate, t0, t1, ag, yg, w);
    kern.matmul[static_cast<int>(e.up.format)](e.up, t0, t1, au, yu, w);
    for (int64_t i = 0; i < j.ntok; ++i) kern.swiglu(yg + i * w, yu + i * w, j.h + i * j.h_stride + r0, w);
    const PackedMatrix& d = e.down;
    if (d.is_int()) {
      for (int64_t g = r0 / d.group_size; g < d.groups && g * d.group_size < r1; ++g) {
        if (ws.pending[j.grp0 + static_cast<size_t>(g)].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
        QuantActs q = j.hq;
        const int64_t c0 = g * d.group_size;
        q.q += c0;
        q.scale += g;
        q.sum += g;
        if (q.wide()) {
          q.q_hi += c0;
          q.sum_hi += g;
        }
        kern.quantize_rows(j.h + c0, j.h_stride, nullptr, j.ntok, nullptr, d.group_size, d.group_size, d.group_size, q);
      }
    }
  });

  // Phase 2: down rows per output block, over all selected experts in order; run()'s proportional
  // split gives node j the blocks node_range(j, n2), whose weights bind_by_node put there.
  const int64_t h_tiles = (H + kTileRows - 1) / kTileRows;
  const int64_t n2 = (h_tiles + kDownBlockTiles - 1) / kDownBlockTiles;
  pool.run(n2, [&](int64_t task, int worker) {
    auto* y = reinterpret_cast<float*>(scratch + per_worker * static_cast<size_t>(worker) + 2 * y_bytes);
    const int64_t t0 = task * kDownBlockTiles, t1 = std::min(h_tiles, t0 + kDownBlockTiles);
    const int64_t m0 = t0 * kTileRows, m1 = std::min(H, t1 * kTileRows), ldy = (t1 - t0) * kTileRows;
    for (size_t ji = 0; ji < ws.jobs.size(); ++ji) {
      const Job& j = ws.jobs[ji];
      const PackedMatrix& d = j.w->down;
      // Each expert contributes only a few KiB here: start the next one's loads now, or every block
      // pays a full memory latency before the hardware prefetchers catch on.
      if (ji + 1 < ws.jobs.size()) prefetch_tiles(ws.jobs[ji + 1].w->down, t0, t1);
      ActRows a;
      a.nrows = j.ntok;
      a.rows = ws.iota.data();
      if (d.is_int()) a.q = j.hq;
      else {
        a.f = j.h;
        a.f_stride = j.h_stride;
      }
      kern.matmul[static_cast<int>(d.format)](d, t0, t1, a, y, ldy);
      for (int64_t i = 0; i < j.ntok; ++i) {
        const float wt = ws.tok_weights[static_cast<size_t>(j.tok0 + i)];
        float* o = out + ws.tokens[static_cast<size_t>(j.tok0 + i)] * H;
        const float* yi = y + i * ldy - m0;
        for (int64_t m = m0; m < m1; ++m) o[m] += wt * yi[m];
      }
    }
  });
}

}  // namespace tandem::cpu
