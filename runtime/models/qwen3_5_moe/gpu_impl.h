// runtime/models/qwen3_5_moe/gpu_impl.h: the GPU model's internals (not a public header), shared by
// qwen3_5_moe_gpu.cpp (upload, the decode step, the public API), qwen3_5_moe_gpu_prefill.cpp (batched
// prefill and the routed experts of n tokens), qwen3_5_moe_gpu_hybrid.cpp (the host handoff and
// expert deferral), qwen3_5_moe_gpu_stream.cpp (streamed prefill) and qwen3_5_moe_gpu_replace.cpp
// (online re-placement).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <vector>

#include "gpu_core/int4_tiles.cuh"
#include "gpu_core/attention.cuh"
#include "gpu_core/deltanet.cuh"
#include "gpu_core/gemm.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/int4_tiles.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/sampling.cuh"
#include "core/error.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "core/trace.h"

namespace tandem {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(e));
}
#define CK(expr) cuda_check((expr), #expr)

class Uploader;  // qwen3_5_moe_gpu.cpp: plans, then fills, the one device allocation

struct DevLinear {
  bool int4 = false;
  const uint16_t* w = nullptr;  // bf16 [out, in]
  gpu::Int4View q;
  int64_t out = 0, in = 0;
};

// Projections that read the same input, stored back to back in one bf16 block, as one matrix of
// their rows stacked (one decode launch instead of one per projection); out = 0 when they can't be
// (an int4 member, a different input width, rows not a multiple of 4, or not adjacent in the arena).
DevLinear stack_rows(std::initializer_list<const DevLinear*> parts);

struct DevLayer {
  LayerKind kind;
  const float *in_norm, *post_norm;
  DevLinear in_proj;  // DeltaNet qkv|z|b|a, attention q|k|v stacked (stack_rows), for decode
  DevLinear x_proj;   // router|shared gate|shared up|shared expert gate stacked, for decode
  DevLinear qkv, z, b, a, out_proj;
  const float *conv_w, *A_log, *dt_bias, *dn_norm;
  float *conv_state, *ssm_state;
  DevLinear q, k, v, o;
  const float *q_norm, *k_norm;
  uint16_t *k_cache, *v_cache;
  DevLinear router, sh_gate, sh_up, sh_down, sh_expert_gate;
  bool int4_experts = false;
  bool cpu_experts = false;  // some routed experts live in host memory (hybrid)
  int64_t expert_group = 0;
  gpu::Int4Expert* experts_i4 = nullptr;
  gpu::Bf16Expert* experts_bf16 = nullptr;
};

// How long a kernel waiting inside a hybrid step's graph waits for the host before giving up.
constexpr int64_t kHandoffTimeoutNs = 60'000'000'000;

struct Qwen35MoeGpu::Impl {
  const Qwen35Moe& model;
  GpuOptions opts;
  GpuMemoryPlan plan;
  char* arena = nullptr;
  cudaStream_t stream = nullptr;
  // GpuOptions::parallel_shared: the shared expert's down GEMV on `side`, forked from and joined back
  // into `stream` around the routed experts (inside the step's graph when captured).
  cudaStream_t side = nullptr;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  cudaEvent_t pf_fork_ev = nullptr, pf_join_ev = nullptr;  // GpuOptions::l2_prefetch_bytes, on `side`
  std::vector<DevLayer> layers;
  const uint16_t* embed = nullptr;
  DevLinear lm_head;
  const float *final_norm = nullptr, *inv_freq = nullptr;
  int64_t pos = 0;
  // workspace
  float *h, *x, *o, *qkv, *z, *b, *a, *core, *conv_out, *qg, *kk, *vv, *q_rot, *attn_part, *attn_out, *router, *moe_out,
      *hscratch, *sg, *su, *sd, *sgate, *logits;
  uint16_t* xh;
  int32_t *ids, *topk_ids, *pos_dev;
  float* topk_w;
  unsigned* route_ticket = nullptr;  // the router / norm GEMVs' counter (their launches are stream-ordered)
  unsigned* dn_tickets = nullptr;    // deltanet_decode's per-head tickets (split recurrence), [max(Hv, 1)]
  float* cpu_out;  // the host experts' sum, copied in (hybrid)
  // Pinned host staging for the hybrid handoff and the host-side embedding row.
  float *hx = nullptr, *hw = nullptr, *hout = nullptr, *hembed = nullptr;
  int64_t hembed_rows = 1;  // rows hembed holds: a prompt chunk / streamed pass when the table is in host memory
  int32_t *hids = nullptr;
  std::vector<int32_t> masked;
  cudaEvent_t routed = nullptr;
  ExpertCounts counts;
  // --trace: events at the segment boundaries of every layer, turned into GPU spans after each step.
  std::vector<cudaEvent_t> tev;
  // Decode steps as CUDA graphs (GpuOptions::cuda_graph; not with --trace), cut at every host handoff
  // of a hybrid placement: segment i ends with a layer's router result on its way to the host (an
  // event node), the host runs that layer's experts, and segment i + 1 starts by adding their sum.
  // Without host experts a step is one graph. segs[0] without logits, [1] with logits copied to
  // hlogits, [2] with logits left on the device (forward_top).
  bool graph_ok = false;
  std::vector<cudaGraphExec_t> segs[3];
  std::vector<int> seg_layers;   // the layer whose host experts follow segment i
  uint64_t gpu_only_layers = 0;  // layers with no host experts (counted as GPU-served per step)
  bool segmenting = false;       // enqueue() under capture: cut at handoffs
  // GpuOptions::hybrid_one_graph: the step is one graph (segs[w][0]) and seg_layers the layers whose
  // host experts run while it waits inside it. hflags (mapped): [0] the last layer posted + 1 (GPU ->
  // host), [1] the last layer released + 1 (host -> GPU), [2] the layer + 1 a wait gave up on, [3] with
  // deferral: the last layer whose deferred sum is in hdef_posted + 1 (host -> GPU), [4] with
  // GpuOptions::host_prefetch: the last layer whose expert guess is in hgids + 1 (GPU -> host).
  bool one_graph = false;
  bool guessing = false;         // GpuOptions::host_prefetch in effect (one graph, side stream, bf16 routers)
  int32_t* hgids = nullptr;      // mapped: the guessed experts of the layer in hflags[4] - 1, best first
  float* hgw = nullptr;          // mapped: their guessed weights (posted with them, unused)
  bool post_guess(const DevLayer& L, size_t li);  // false: not for this layer (an int4 router)
  bool posting = false;          // enqueue() under capture for one_graph: handoffs inside the graph
  unsigned* hflags = nullptr;
  void run_one_graph(int w);
  std::vector<cudaGraphExec_t>* seg_out = nullptr;
  // forward_top: the logits row stays on the device (no copy at the end of a step or chunk); the
  // penalties and the top-k run there and only k (id, logit) pairs come back.
  float logits_sink = 0;  // as a logits destination: compute the row, leave it on the device
  gpu::Penalty* pen_dev = nullptr;  // [max_context]
  void* topk_ws = nullptr;
  int32_t* top_ids = nullptr;
  float* top_vals = nullptr;
  int32_t* hidpos = nullptr;  // pinned: the token id and position the graph copies in
  // Batched prefill (GpuOptions::batched_prefill): a prompt goes through layer by layer in chunks.
  bool batched = false;
  int64_t chunk = 0;
  gpu::BlasHandle blas = nullptr;
  void* blas_ws = nullptr;  // its workspace, inside the arena
  void* pgroup = nullptr;   // moe_int4_grouped's workspace (int4 experts)
  float* pterms = nullptr;  // the chunked DeltaNet's chunk terms (gpu::deltanet_chunk_terms_floats)
  float *ph = nullptr, *px = nullptr, *po = nullptr, *pqkv = nullptr, *pz = nullptr, *pb = nullptr, *pa = nullptr, *pcore = nullptr,
        *pconv = nullptr, *pqg = nullptr, *pk = nullptr, *pv = nullptr, *pattn = nullptr, *prouter = nullptr, *pmoe = nullptr,
        *psg = nullptr, *psu = nullptr, *psd = nullptr, *psgate = nullptr, *ptopk_w = nullptr, *pcpu = nullptr;
  uint16_t *phs = nullptr, *psplit = nullptr, *pxh = nullptr;
  int32_t *pids = nullptr, *ppos = nullptr, *ptopk_ids = nullptr;
  std::vector<int32_t> host_pos;
  float* hlogits = nullptr;   // pinned: the logits the graph copies out
  // Expert deferral (GpuOptions::defer_experts, hybrid): the host-resident ones among each token's N
  // lowest-weight experts of layer L run on the host while the GPU goes on with layer L+1, and join
  // the residual with layer L+1's MoE output (Qwen35State::defer_experts, deferrable = the CPU side).
  struct Deferred {
    bool pending = false;  // host work of `layer` not run yet
    bool ready = false;    // its result is queued into def_dev: add it with this layer's MoE output
    int layer = -1;
    int64_t n = 0;
    bool decode = false;   // set aside by a decode step (its run counts in ExpertCounts::host_run_ns)
    std::vector<float> x, w;
    std::vector<int32_t> ids;  // the deferred (token, slot) pairs' experts, -1 elsewhere
  } def;
  std::vector<int> order;     // scratch: a token's slots by ascending weight
  float* hdef = nullptr;      // pinned: the deferred result on its way to def_dev
  float* hdef_posted = nullptr;  // one graph a step (mapped, [2][H]): layer L's deferred sum in row L % 2, read in place
  // One graph with deferral: the deferred host sum of layer `from` (if >= 0) added to h from host memory
  // once the host's flag (hflags[3]) says it is there.
  void join_posted_deferred(int from);
  float* def_dev = nullptr;   // device
  cudaEvent_t def_copied = nullptr;
  cudaEvent_t tbase = nullptr;
  double tbase_us = 0;
  // Where the routed experts are served ([layer][expert], 1: the GPU); the plan's, then what online
  // re-placement made of it. Empty: every expert on the GPU.
  std::vector<std::vector<uint8_t>> resident;
  // Online re-placement (GpuOptions::replace, qwen3_5_moe_gpu_replace.cpp). An expert moving to the GPU
  // takes the slot (device allocations) of the one it displaces: that one is served by the host from
  // the next step on, the newcomer's weights are repacked on a worker thread into pinned staging,
  // copied into the slot on rp.copy (after rp.freed: no step reads the slot any more) and served by the
  // GPU from the step after they arrived. Streamed prefill keeps streaming the plan's host experts;
  // the plan's GPU experts that were displaced run on the host there (displaced()).
  struct Move {
    int layer = 0, expert = 0;  // the expert moving to the GPU
    gpu::Int4Expert i4{};       // the slot it takes
    gpu::Bf16Expert b16{};
    int staging = 0;            // index into rp.staging / rp.copied
    int order = 0;              // in its batch: packed once rp.packed > order
    bool copying = false;
  };
  struct Replace {
    bool on = false, paused = false;
    int64_t since = 0;                                   // decode steps since the last check
    std::vector<std::vector<uint64_t>> heat;             // [layer][expert] activations seen by the host
    std::vector<std::vector<gpu::Int4Expert>> i4, stream_i4;  // host copies of the device tables
    std::vector<std::vector<gpu::Bf16Expert>> b16;
    std::vector<Move> moving;                            // one batch (no check while it is in flight)
    std::future<void> packer;                            // one worker thread repacks the batch in order
    std::atomic<int> packed{0};                          // moves of the batch packed so far
    std::vector<char*> staging;                          // pinned, slot_bytes each
    std::vector<cudaEvent_t> copied;                     // per staging buffer
    std::vector<int> free;                               // staging buffers not in use
    uint64_t slot_bytes = 0;
    cudaStream_t copy = nullptr;
    cudaEvent_t freed = nullptr;
    // Table writes: a changed layer's whole table, one copy per table from pinned rows (a copy per
    // entry from pageable memory stalled the step that made 100 moves by milliseconds).
    std::vector<uint8_t> touched;                        // [layer]
    char* rows = nullptr;                                // pinned: [layer][E] expert tables, then [layer][E] streamed tables
    cudaEvent_t written = nullptr;                       // after the last table copies: rows may change
  } rp;
  // Streamed prefill's state (GpuOptions::stream_prefill_min_tokens; buffers: gpu::stream_buffer_bytes).
  struct Stream {
    bool on = false;
    std::string note;            // why it is off when it was asked for
    int max_experts = 0;         // host experts in the layer that has the most
    int64_t group_size = 0;      // of every expert matrix
    int64_t pass = 0;            // tokens per pass
    std::vector<HostExperts::StreamLayer> layout;  // per layer (no experts: nothing to stream)
    char* raw = nullptr;         // one layer's host experts as copied (tile layout)
    char* rows = nullptr;        // their row-layout form, one slot per expert
    gpu::Int4Expert* tables = nullptr;      // [layer][E]: GPU-resident views and the slots in `rows`
    gpu::Int4TilesToRows* jobs = nullptr;   // [layer][3 * max_experts]
    float* h = nullptr;          // [pass, H] hidden states of the pass
    int32_t *pos = nullptr, *ids = nullptr;
    cudaStream_t copy = nullptr;
    cudaEvent_t ready = nullptr, free = nullptr;
  } st;
  // GpuOptions::link_experts: each layer's host experts as the GPU sees them in page-locked host memory
  // (tile layout, gpu::moe_int4_tiles_decode), one device table [E] per layer that has host experts.
  struct Link {
    bool on = false;
    std::string note;       // why it is off when it was asked for
    int m = 0;              // a token's host experts the GPU takes (the first m in slot order)
    bool act_order = false;  // some gate / up has an input order (x gathered first)
    int64_t group_size = 0;
    std::vector<const gpu::Int4TilesExpert*> tables;  // [layer], nullptr: no host experts there
    std::vector<uint8_t> host_only;                  // [layer]: every routed expert on the host
    std::vector<gpu::Int4TilesExpert> host_tables;   // link_setup's, uploaded by link_upload
    std::vector<int> table_of;                       // [layer]: its table's index in host_tables / E, -1: none
    int stage_slots = 0;    // GpuOptions::link_stage as allocated (stage: as used, 0 without the one graph)
    void* mem = nullptr;    // in the arena (workspace): the tables, the kernel's scratch, the staging slots
    void* scratch = nullptr;
    // GpuOptions::link_stage (one graph): slots for `stage` guessed experts, what they hold, and the
    // layers whose guess the step's graph stages (set while it is captured; the host picks the same).
    int stage = 0;
    void* slots = nullptr;
    size_t slot_bytes = 0;
    int32_t* staged_ids = nullptr;
    gpu::Int4TilesExpert* staged_table = nullptr;
    int32_t* guess_dev = nullptr;  // [k] the layer's guess, copied beside hgids (post_guess)
    cudaEvent_t staged_ev = nullptr;
    std::vector<uint8_t> staged_at;
    bool replaying = false;  // run_one_graph's host loop (eager steps never stage)
  } link;
  void link_setup();                 // before the plan
  gpu::LinkBuffers link_buffers() const;  // what build() allocates for it
  void link_upload();                // after the commit

  explicit Impl(const Qwen35Moe& m, const GpuOptions& o) : model(m), opts(o) {
    if (o.expert_on_gpu) resident = *o.expert_on_gpu;
  }
  ~Impl() {
    // Re-placement first: a pack in flight writes into staging, a copy in flight into the arena.
    if (rp.packer.valid()) rp.packer.wait();
    if (rp.copy) {
      cudaStreamSynchronize(rp.copy);
      cudaStreamDestroy(rp.copy);
    }
    if (rp.freed) cudaEventDestroy(rp.freed);
    for (cudaEvent_t e : rp.copied) cudaEventDestroy(e);
    if (rp.written) cudaEventDestroy(rp.written);
    if (rp.rows) cudaFreeHost(rp.rows);
    for (char* p : rp.staging) cudaFreeHost(p);
    if (arena) cudaFree(arena);
    if (stream) cudaStreamDestroy(stream);
    if (side) cudaStreamDestroy(side);
    if (fork_ev) cudaEventDestroy(fork_ev);
    if (join_ev) cudaEventDestroy(join_ev);
    if (pf_fork_ev) cudaEventDestroy(pf_fork_ev);
    if (pf_join_ev) cudaEventDestroy(pf_join_ev);
    if (routed) cudaEventDestroy(routed);
    for (cudaEvent_t e : tev) cudaEventDestroy(e);
    for (auto& v : segs)
      for (cudaGraphExec_t g : v) cudaGraphExecDestroy(g);
    if (hidpos) cudaFreeHost(hidpos);
    if (hlogits) cudaFreeHost(hlogits);
    if (hflags) cudaFreeHost(hflags);
    if (hgids) cudaFreeHost(hgids);
    if (hgw) cudaFreeHost(hgw);
    gpu::blas_destroy(blas);
    if (tbase) cudaEventDestroy(tbase);
    if (def_copied) cudaEventDestroy(def_copied);
    if (link.staged_ev) cudaEventDestroy(link.staged_ev);
    if (st.copy) cudaStreamDestroy(st.copy);
    if (st.ready) cudaEventDestroy(st.ready);
    if (st.free) cudaEventDestroy(st.free);
    for (void* p : {static_cast<void*>(hx), static_cast<void*>(hw), static_cast<void*>(hout), static_cast<void*>(hembed),
                    static_cast<void*>(hids), static_cast<void*>(hdef), static_cast<void*>(hdef_posted)})
      if (p) cudaFreeHost(p);
  }

  // Whether prompts can go through in batches (GpuOptions::batched_prefill).
  bool wants_batched() const { return opts.batched_prefill && opts.prefill_chunk > 0; }
  // Tokens handed to the host at once: a prefill chunk when prompts go in batches, else one.
  int64_t host_rows() const { return wants_batched() ? opts.prefill_chunk : 1; }
  bool deferring() const { return opts.defer_experts > 0 && opts.host_experts; }

  bool on_gpu(int layer, int64_t e) const { return resident.empty() || resident[layer][e]; }
  // Whether the plan put expert e of layer l on the host (what streamed prefill streams, whatever
  // re-placement has done since).
  bool plan_host(int layer, int64_t e) const {
    return opts.expert_on_gpu && !opts.expert_on_gpu->empty() && !(*opts.expert_on_gpu)[layer][e];
  }
  // Whether the host computes expert e of layer li: a host expert, except in streamed prefill
  // (`streamed`), where the plan's host experts are streamed to the GPU and only the plan's GPU
  // experts that re-placement displaced run on the host.
  bool host_serves(int li, int64_t e, bool streamed) const {
    return !on_gpu(li, e) && !(streamed && rp.on && plan_host(li, e));
  }

  // ---- online re-placement (qwen3_5_moe_gpu_replace.cpp) ----
  void replace_setup();             // after the upload: staging, copy stream, the host's coverage
  void replace_tick();              // before each decode step: moves that arrived, and every N steps a check
  void finish_moves(bool wait);     // moves whose weights are packed / copied (all of them when `wait`)
  // Expert e of layer l now on the GPU in the slot i4 / b16, or (gpu false, empty slots) on the host:
  // the host copies of the tables, to be written by flush_tables().
  void place(int l, int e, bool gpu, const gpu::Int4Expert& i4, const gpu::Bf16Expert& b16);
  bool displaced(int l) const;      // some of the plan's GPU experts of layer l are on the host now
  void flush_tables();              // the device tables of the layers whose host copies changed (rp.touched)
  struct SlotImage {
    struct Piece {
      void* dst;        // on the device
      uint64_t offset;  // in staging
      uint64_t bytes;
    };
    std::vector<Piece> pieces;
    uint64_t span = 0;
    bool contiguous = true;
  };
  SlotImage slot_image(const Move& m) const;
  void pack_expert(int li, int e, const gpu::Int4Expert& slot, const SlotImage& image, char* dst) const;

  // uploaded(bytes): called after each layer while committing, with the bytes placed so far.
  void build(Uploader& up, const std::function<void(uint64_t)>& uploaded = {});

  // The layer's weights and state in the kernels' argument blocks; callers add the activations.
  gpu::DeltaNetDecodeArgs deltanet_args(const DevLayer& L) const;
  gpu::AttentionDecodeArgs attention_args(const DevLayer& L) const;

  // ---- the routed experts of one layer for n tokens, shared by decode (n = 1) and batched prefill ----

  // GPU-resident experts into `out` (the kernels skip the host-resident ones); xh / hs are scratch.
  // `table`: the layer's expert table with its host experts streamed in (prefill_streamed), nullptr: L's own.
  void gpu_experts(const DevLayer& L, const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n, uint16_t* xh_buf, void* hs, float* out,
                   const gpu::Int4Expert* table = nullptr);

  // Hybrid handoff, part 1: x and the top-k of n tokens to pinned host memory, then an event.
  void handoff_out(const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n);

  // Part 2: wait for the event (spinning: a blocking sync adds a wake-up), run the host-resident
  // experts of the n tokens, and queue their sum into moe_dev (through cpu_dev). Counts who served what.
  // With deferral, the host-resident ones among each token's N lowest-weight experts are set aside
  // for run_deferred() (next layer) instead.
  // Which pass hands tokens to the host: decode steps are counted (ExpertCounts, re-placement's heat),
  // a prompt chunk feeds only the heat, streamed prefill neither (and its host part is only the plan's
  // displaced GPU experts: host_serves).
  enum class Pass { decode, prefill, streamed };
  void handoff_back(size_t li, int64_t n, float* cpu_dev, float* moe_dev, Pass pass = Pass::decode);
  bool host_part(size_t li, int64_t n, bool always, bool wait_routed = true, Pass pass = Pass::decode);
  void join_host(int64_t n, float* cpu_dev, float* moe_dev);

  // The previous layer's deferred host experts, run while the GPU works on this layer; their sum is
  // queued into def_dev, and add_deferred() adds it with this layer's MoE output.
  void run_deferred();
  void deferred_sum(float* out, int64_t rows);  // the pending deferred experts' sum (zeros when none), host side
  void add_deferred(float* h_dev);

  // y [n, out] = x [n, in] W^T for a chunk of tokens: cuBLAS for bf16, the int4 GEMV 8 tokens at a time.
  void linear_rows(const DevLinear& L, const float* in, int64_t n, float* out);

  // n prompt tokens at positions pos.. through every layer at once (GpuOptions::batched_prefill);
  // logits of the last token to logits_last when given. Same math as n decode steps, except that
  // bf16 projections run on cuBLAS with split-bf16 activations (~1e-5) instead of the GEMV.
  void prefill_chunk(const int32_t* ids_host, int64_t n, float* logits_last);
  // One layer of it for n tokens with hidden states h [n, H] (in place) at positions pos_dev; with
  // `streamed` the layer's host experts run on the GPU from that table.
  void prefill_layer(size_t li, float* h, int64_t n, const int32_t* pos_dev, const gpu::Int4Expert* streamed);
  void prefill_logits(const float* h_last, float* logits_last);
  // A prompt piece's positions into pos_dev and embedding rows into h_dev (on the GPU, or from the
  // host table via hembed).
  void prefill_inputs(const int32_t* ids_host, int64_t n, int32_t* ids_dev, int32_t* pos_dev, float* h_dev);
  // The embedding rows of n tokens from the table in host memory (hembed staging) into h_dev [n, H].
  void host_embedding_rows(const int32_t* ids_host, int64_t n, float* h_dev);
  // Streamed prefill (GpuOptions::stream_prefill_min_tokens): n <= st.pass tokens layer by layer,
  // each layer's host experts copied over PCIe one layer ahead (see the .cpp).
  void prefill_streamed(const int32_t* ids_host, int64_t n, float* logits_last);
  // Asks the host experts for their layouts (setting st.on / st.note); before build().
  void stream_setup();
  bool host_layout(int l, int64_t gs, uint64_t align, HostExperts::StreamLayer& sl, std::string& note) const;  // stream_setup, link_setup
  // Layer li's streamed expert table and conversion jobs into st.tables / st.jobs (commit pass of build).
  void stream_table(int li, const std::vector<gpu::Int4Expert>& i4);
  // Whether streamed prefill copies layer l's host experts.
  bool streams(size_t l) const { return st.on && !st.layout[l].experts.empty(); }

  void linear(const DevLinear& L, const float* in, float* out);

  static constexpr int kMarks = 5;  // per layer: start, mixer done, routed, GPU experts done, end
  void mark(Trace* tr, size_t layer, int which) {
    if (tr) CK(cudaEventRecord(tev[layer * kMarks + which], stream));
  }
  void trace_begin(Trace* tr);
  void trace_end(Trace* tr);

  // One decode step: eagerly (trace, host embedding, deferral) or as captured CUDA graphs (see
  // graph_ok): the same enqueue() either way.
  void step(int32_t id, float* logits_host);

  // Captures segs[w]; cut_segment ends the segment under capture (and starts the next when `more`);
  // abandon_capture ends a capture after a failure so the stream stays usable.
  void capture(int w);
  void cut_segment(bool more);
  void abandon_capture();

  // Queues one token's work on the stream: id / position copied from id_src / pos_src (host memory),
  // logits (when logits_dst) copied to logits_dst. Host-side waits only for hybrid handoffs and the
  // host embedding (neither is captured in a graph).
  void enqueue(int32_t id, const int32_t* id_src, const int32_t* pos_src, float* logits_dst, Trace* tr);
};

}  // namespace tandem
