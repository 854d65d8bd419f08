// runtime/models/qwen3_5_moe/gpu_impl.h: the GPU model's internals (not a public header), shared by
// gpu.cpp (upload, the decode step, the public API), gpu_prefill.cpp (batched
// prefill and the routed experts of n tokens), gpu_link.cpp (the link experts) and gpu_stream.cpp
// (streamed prefill). The host's part of a hybrid step is HybridDispatch (hybrid_dispatch.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <vector>

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

class Uploader;  // gpu.cpp: plans, then fills, the one device allocation

struct DevLinear {
  bool int4 = false;
  const uint16_t* w = nullptr;  // bf16 [out, in]
  gpu::Int4View q;
  int64_t out = 0, in = 0;
  bool rows8 = false;           // quantized on load to 8-bit rows (GpuOptions::dense): q8
  gpu::Rows8View q8;
  bool bf16() const { return !int4 && !rows8; }
  bool swiglu_fused() const { return !int4; }  // Impl::swiglu_down takes it
  // A bf16 matrix already on the device (a stack of rows, the tied lm_head).
  static DevLinear bf16_rows(const uint16_t* w, int64_t out, int64_t in) {
    DevLinear d;
    d.w = w, d.out = out, d.in = in;
    return d;
  }
};

// Projections that read the same input, stored back to back in one bf16 block, as one matrix of
// their rows stacked (one decode launch instead of one per projection); out = 0 when they can't be
// (an int4 member, a different input width, rows not a multiple of 4, or not adjacent in the arena).
DevLinear stack_rows(std::span<const DevLinear* const> parts);

struct DevLayer {
  LayerKind kind;
  const float *in_norm, *post_norm;
  DevLinear in_proj;  // DeltaNet qkv|z|b|a, attention q|k|v stacked (stack_rows), for decode
  DevLinear x_proj;   // router|shared gate|shared up|shared expert gate stacked, for decode
  // router|shared expert gate stacked where x_proj is not (8-bit shared gate / up): the gate logit in the
  // router's launch
  DevLinear router_gate;
  DevLinear qkv, z, b, a, out_proj;
  const float *conv_w, *A_log, *dt_bias, *dn_norm;
  float *conv_state, *ssm_state;  // slot 0's; slot s at + s * conv_stride / ssm_stride
  float *kept_conv = nullptr, *kept_state = nullptr;  // verification steps: the state before and after each position
  DevLinear q, k, v, o;
  const float *q_norm, *k_norm;
  uint8_t *k_cache, *v_cache;  // slot 0's; slot s at + s * cache_stride bytes
  DevLinear router, sh_gate, sh_up, sh_down, sh_expert_gate;
  DevLinear sh_gate_up;  // shared gate|up stacked (8-bit rows, or bf16 where adjacent; out 0: none), when x_proj is not
  bool int4_experts = false;
  bool cpu_experts = false;  // some routed experts live in host memory (hybrid)
  int64_t expert_group = 0;
  // Some expert the GPU may run (its own, or a host one streamed in a prefill) carries an act-order
  // permutation: moe_int4_decode_wide does not take it.
  bool expert_act_order = false;
  gpu::Int4Expert* experts_i4 = nullptr;
  gpu::Bf16Expert* experts_bf16 = nullptr;
};

struct Qwen35MoeGpu::Impl {
  std::vector<std::shared_ptr<SnapshotPool>> snapshot_pools;  // save_slot's memory, VRAM tier first (GpuOptions::snapshot_*)
  const Qwen35Moe& model;
  GpuOptions opts;
  GpuMemoryPlan plan;
  char* arena = nullptr;
  cudaStream_t stream = nullptr;
  // The shared expert's down GEMV on `side`, forked from and joined back into `stream` around the
  // routed experts (inside the step's graph when captured), where it does not run in their down launch
  // (shared_in_down: several tokens, 8-bit rows, the link).
  cudaStream_t side = nullptr;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  cudaEvent_t pf_fork_ev = nullptr, pf_join_ev = nullptr;  // the L2 prefetch (l2_prefetch), on `side`
  bool pdl = false;          // decode kernels with programmatic dependent launch (the device takes it)
  int64_t l2_prefetch = 0;   // one-graph hybrid step: bytes of the next layer's input projection fetched into L2
  std::vector<DevLayer> layers;
  const uint16_t* embed = nullptr;
  DevLinear lm_head;
  const float *final_norm = nullptr, *inv_freq = nullptr;
  int64_t pos = 0;  // the selected slot's position
  // Slots (GpuOptions::batch): `cur` is the one forward() / step() / the prefill paths work on; the
  // others' positions wait in slot_pos. Their states lie stride elements apart.
  int slots = 1, cur = 0;
  std::vector<int64_t> slot_pos;
  int64_t conv_stride = 0, ssm_stride = 0, cache_stride = 0;
  // step_rows: up to `rows` tokens of several sequences on the batched prefill's buffers, with
  // b_part (attention splits), b_logits ([rows][V]) and the step's table `bio` on the device, copied
  // from pinned `hio`: ids [rows], positions [rows], each token's slot [rows], each group's slot
  // [rows] and first token [rows + 1].
  int64_t rows = 1;
  float *bpart = nullptr, *blogits = nullptr, *hrows = nullptr;  // hrows: pinned [rows][V]
  int32_t *bio = nullptr, *hio = nullptr;
  int32_t* btop_ids = nullptr;
  float* btop_vals = nullptr;
  std::vector<std::pair<int, cudaGraphExec_t>> row_graphs;  // by step shape (row_graph_key)
  struct Kept {  // the last keep step: its slot, start position and tokens
    int slot = -1;
    int64_t from = 0, n = 0;
  } kept;
  // workspace
  float *h, *x, *o, *qkv, *z, *b, *a, *core, *conv_out, *qg, *kk, *vv, *q_rot, *attn_part, *attn_out, *router, *moe_out,
      *hscratch, *sg, *su, *sd, *sgate, *logits;
  uint16_t* xh;
  int32_t *ids, *topk_ids, *pos_dev;
  float* topk_w;
  unsigned* route_ticket = nullptr;  // the router / norm GEMVs' counter (their launches are stream-ordered)
  float* cpu_out;  // the host experts' sum, copied in (hybrid)
  float* hembed = nullptr;  // pinned: embedding rows gathered on the host (the table in host memory)
  int64_t hembed_rows = 1;  // rows hembed holds: a prompt chunk / streamed pass when the table is in host memory
  ExpertCounts counts;
  // Hybrid: the host's part of each step and the handoff's memory (hybrid_dispatch.h).
  HybridDispatch hy;
  // --trace: events at the segment boundaries of every layer, turned into GPU spans after each step.
  std::vector<cudaEvent_t> tev;
  // Decode steps as CUDA graphs (not with GpuOptions::eager or --trace), one a step: graphs[0] without
  // logits, [1] with logits copied to hlogits, [2] with logits left on the device (forward_top). With
  // host experts the host handoffs run inside it (one_graph, hy.serve_graph): handoff_layers are the
  // layers whose host experts run while it waits.
  bool graph_ok = false;
  cudaGraphExec_t graphs[6] = {};  // [3 + w]: the same with the hidden state after the final norm copied to mtp.hhid
  std::vector<int> handoff_layers;
  uint64_t gpu_only_layers = 0;  // layers with no host experts (counted as GPU-served per step)
  bool one_graph = false;
  bool posting = false;          // enqueue() under capture for one_graph: handoffs inside the graph
  // forward_top: the logits row stays on the device (no copy at the end of a step or chunk); the
  // penalties and the top-k run there and only k (id, logit) pairs come back.
  float logits_sink = 0;  // as a logits destination: compute the row, leave it on the device
  gpu::Penalty* pen_dev = nullptr;  // [max_context]
  void* topk_ws = nullptr;
  int32_t* top_ids = nullptr;
  float* top_vals = nullptr;
  int32_t* hidpos = nullptr;  // pinned: the token id and position the graph copies in
  // Batched prefill (GpuOptions::prefill_chunk): a prompt goes through layer by layer in chunks.
  bool batched = false;
  int64_t chunk = 0;
  gpu::BlasHandle blas = nullptr;
  void* blas_ws = nullptr;  // its workspace, inside the arena
  void* pgroup = nullptr;   // moe_int4_grouped_tc's workspace (int4 experts)
  float* pterms = nullptr;  // the chunked DeltaNet's chunk terms (gpu::deltanet_chunk_terms_floats)
  float *ph = nullptr, *px = nullptr, *po = nullptr, *pqkv = nullptr, *pz = nullptr, *pb = nullptr, *pa = nullptr, *pcore = nullptr,
        *pconv = nullptr, *pqg = nullptr, *pk = nullptr, *pv = nullptr, *pattn = nullptr, *prouter = nullptr, *pmoe = nullptr,
        *psg = nullptr, *psu = nullptr, *psd = nullptr, *psgate = nullptr, *ptopk_w = nullptr, *pcpu = nullptr;
  uint16_t *phs = nullptr, *psplit = nullptr, *pxh = nullptr;
  uint16_t* prows8 = nullptr;  // an 8-bit projection's codes as bf16, for a prompt chunk's GEMM (gpu::gemm_rows8)
  int32_t *pids = nullptr, *ppos = nullptr, *ptopk_ids = nullptr;
  std::vector<int32_t> host_pos;
  float* hlogits = nullptr;   // pinned: the logits the graph copies out
  // Expert deferral (GpuOptions::defer_experts): the deferred sum on the device (eager steps and
  // prompt chunks; hybrid_dispatch.h).
  float* def_dev = nullptr;
  cudaEvent_t tbase = nullptr;
  double tbase_us = 0;
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
    void* mem = nullptr;    // in the arena (workspace): the tables, then the kernel's scratch
    void* scratch = nullptr;
  } link;
  // GpuOptions::mtp: the head's weights (fc split into its embedding and hidden halves, each [H, H]),
  // its decoder layer (an attention layer, experts all on the GPU, a KV cache per slot) and pinned
  // staging for the hidden rows that cross (step_rows' hidden, mtp_rows' input) [rows, H] and the
  // head's output state after them [H].
  struct Mtp {
    bool on = false;
    DevLayer layer{};
    DevLinear fc_e, fc_h;
    const float *norm_e = nullptr, *norm_h = nullptr, *norm = nullptr;
    float* hhid = nullptr;
    DevLinear lm_head;  // the drafts' own 8-bit copy (GpuOptions::mtp_lm_head); out == 0: none
  } mtp;
  const DevLinear& draft_lm_head() const { return mtp.lm_head.out ? mtp.lm_head : lm_head; }  // what the drafts read
  // mtp_chain's pinned table after hio's: the drafts [kMaxGemvTokens], the chain steps' positions
  // [kMaxGemvTokens], and a 1 (a one-token group's end).
  static constexpr int kChainIo = 2 * gpu::kMaxGemvTokens + 1;
  int32_t* chain_io() const { return hio + 5 * rows + 2; }
  // Layer li of the walk: the model's, or the MTP head's at num_layers.
  const DevLayer& layer_at(size_t li) const { return li < layers.size() ? layers[li] : mtp.layer; }
  void link_setup();                 // before the plan
  gpu::LinkBuffers link_buffers() const;  // what build() allocates for it
  void link_upload();                // after the commit

  explicit Impl(const Qwen35Moe& m, const GpuOptions& o) : model(m), opts(o) {}
  ~Impl() {
    if (arena) cudaFree(arena);
    if (stream) cudaStreamDestroy(stream);
    if (side) cudaStreamDestroy(side);
    if (fork_ev) cudaEventDestroy(fork_ev);
    if (join_ev) cudaEventDestroy(join_ev);
    if (pf_fork_ev) cudaEventDestroy(pf_fork_ev);
    if (pf_join_ev) cudaEventDestroy(pf_join_ev);
    for (cudaEvent_t e : tev) cudaEventDestroy(e);
    for (cudaGraphExec_t g : graphs)
      if (g) cudaGraphExecDestroy(g);
    if (hidpos) cudaFreeHost(hidpos);
    if (hio) cudaFreeHost(hio);
    if (hrows) cudaFreeHost(hrows);
    for (auto& g : row_graphs) cudaGraphExecDestroy(g.second);
    if (hlogits) cudaFreeHost(hlogits);
    gpu::blas_destroy(blas);
    if (tbase) cudaEventDestroy(tbase);
    if (st.copy) cudaStreamDestroy(st.copy);
    if (st.ready) cudaEventDestroy(st.ready);
    if (st.free) cudaEventDestroy(st.free);
    if (hembed) cudaFreeHost(hembed);
    if (mtp.hhid) cudaFreeHost(mtp.hhid);
  }

  // Whether prompts go through in batches: a chunk is set and the attention prefill kernel takes the
  // head size (other head sizes prefill token by token, as decode steps).
  bool wants_batched() const { return opts.prefill_chunk > 0 && gpu::attention_prefill_fits(model.config().head_dim); }
  // Tokens handed to the host at once: a prefill chunk when prompts go in batches, else one.
  int64_t host_rows() const { return wants_batched() ? opts.prefill_chunk : 1; }
  bool deferring() const { return opts.defer_experts > 0 && opts.host_experts; }

  // Whether expert e of layer `layer` lives on the GPU (the plan's; every expert without a hybrid placement).
  bool on_gpu(int layer, int64_t e) const {
    if (layer >= model.config().num_layers) return !opts.mtp_host_experts;  // the MTP head's: all on one side
    return !opts.expert_on_gpu || static_cast<size_t>(layer) >= opts.expert_on_gpu->size() || (*opts.expert_on_gpu)[layer][e];
  }

  // uploaded(bytes): called after each layer while committing, with the bytes placed so far.
  void build(Uploader& up, const std::function<void(uint64_t)>& uploaded = {});
  DevLayer upload_layer(Uploader& up, const LayerWeights& L, int li);  // build's, per decoder layer

  // The layer's weights and state in the kernels' argument blocks; callers add the activations.
  // slot >= 0: that slot's state; -1: slot 0's with the strides (the step's slots come from the device).
  gpu::DeltaNetDecodeArgs deltanet_args(const DevLayer& L, int slot) const;
  gpu::AttentionDecodeArgs attention_args(const DevLayer& L, int slot) const;

  // ---- the routed experts of one layer for n tokens, shared by decode (n = 1) and batched prefill ----

  // GPU-resident experts into `out` (the kernels skip the host-resident ones); xh / hs are scratch.
  // `table`: the layer's expert table with its host experts streamed in (prefill_streamed), nullptr: L's own.
  // x_quantised: the kernel that wrote x also wrote it into hs as moe_x(L, n, hs) asked.
  // shared (w set; one token, where shared_in_down(L)): the shared expert's down into shared.out in the
  // routed experts' down launch.
  void gpu_experts(const DevLayer& L, const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n, uint16_t* xh_buf, void* hs, float* out,
                   const gpu::Int4Expert* table, bool x_quantised, const gpu::SharedDown& shared = {});
  // Whether L's shared expert's down can run in its routed experts' down launch at one token
  // (gpu::SharedDown): the wide kernel, the shared gate and up computed with the router (the x_proj
  // stack, or 8-bit rows beside router_gate: shared8_in_router), a down of rows it takes (bf16, or int8
  // rows). shared_down_of: that launch's argument for sg, su -> sd. (Several tokens keep the tensor-core
  // GEMV beside the experts: gpu_core/moe.cuh.)
  bool shared_in_down(const DevLayer& L) const {
    if (!wide_experts(L) || !gpu::shared_down_fits(L.sh_down.in)) return false;
    if (L.x_proj.out) return L.sh_down.bf16();
    return shared8_in_router(L) && L.sh_down.rows8 && L.sh_down.q8.format == RowFormat::Int8 && L.sh_down.in % 16 == 0;
  }
  static gpu::SharedDown shared_down_of(const DevLayer& L, const float* sg, const float* su, float* sd) {
    gpu::SharedDown s;
    if (L.sh_down.rows8) s.w8 = L.sh_down.q8;
    else s.w = L.sh_down.w;
    s.in = L.sh_down.in, s.g = sg, s.u = su, s.out = sd;
    return s;
  }

  // Whether L's 8-bit shared gate / up (sh_gate_up's rows) are computed in the one-token router's launch
  // with router_gate (gpu::gemv_bf16_router_topk_norm's w8), into sg|su.
  static bool shared8_in_router(const DevLayer& L) {
    return L.router_gate.out && L.sh_gate_up.rows8 && L.sh_gate_up.in == L.router_gate.in && L.sh_gate_up.in % 16 == 0;
  }
  // Whether L's GPU experts run on gpu::moe_int4_decode_wide (int4, shapes it takes, no act order).
  bool wide_experts(const DevLayer& L) const;
  // Where the kernel that writes n tokens' x (before L's experts) also writes it quantised for the
  // decode MoE (gpu::moe_int4_decode_wide, its workspace hs); none (parts null) where L's experts run
  // on another kernel.
  gpu::QuantX moe_x(const DevLayer& L, int64_t n, void* hs) const;

  // y [n, out] = x [n, in] W^T for a chunk of tokens: cuBLAS for bf16 and 8-bit rows (their codes as
  // bf16, gpu::gemm_rows8; with `gemv` the GEMVs instead), the int4 GEMV 8 tokens at a time.
  void linear_rows(const DevLinear& L, const float* in, int64_t n, float* out, bool gemv = false);
  // The GEMV of a bf16 or 8-bit matrix (a stack too) over n tokens, 8 a launch, its outputs laid out by `out`.
  void gemv_rows(const DevLinear& L, const float* in, int64_t n, const gpu::RowsOut& out) { gemv_rows(L, in, n, out, stream); }
  void gemv_rows(const DevLinear& L, const float* in, int64_t n, const gpu::RowsOut& out, cudaStream_t on);
  // A stacked projection's members (stack: DevLayer::in_proj, x_proj, sh_gate_up; out 0: not stacked)
  // each into its own rows: with `gemv` one GEMV launch for the stack, else linear_rows member by member.
  struct StackMember {
    const DevLinear* part;
    float* out;
  };
  void linear_stack(const DevLinear& stack, std::initializer_list<StackMember> members, const float* in, int64_t n, bool gemv);
  // The stack's outputs split by member, each into its own rows (one token's layout; gemv_rows moves
  // each part per token).
  static gpu::RowsOut stack_out(const DevLinear& stack, std::initializer_list<StackMember> members);
  // The same as GEMVs on `on` (bf16 or 8-bit members): the stack in one launch for every 8 tokens, or
  // member by member where there is no stack.
  void gemv_stack(const DevLinear& stack, std::initializer_list<StackMember> members, const float* in, int64_t n, cudaStream_t on);

  // n prompt tokens at positions pos.. through every layer at once (GpuOptions::prefill_chunk);
  // logits of the last token to logits_last when given. Same math as n decode steps, except that
  // bf16 projections run on cuBLAS with split-bf16 activations (~1e-5) instead of the GEMV.
  void prefill_chunk(const int32_t* ids_host, int64_t n, float* logits_last, float* hidden = nullptr);
  // One layer of it for n tokens with hidden states h [n, H] (in place) at positions pos_dev; with
  // `streamed` the layer's host experts run on the GPU from that table.
  // `batch`: a step_rows step of `groups` sequences (the decode kernels on each token's slot, bio's
  // tables; keep: its state kept position by position) instead of a prompt chunk of the selected slot.
  struct Batch {
    int groups = 0;
    bool keep = false;
  };
  // normed: px holds the layer's input norm already (the previous call returned true); returns whether
  // it leaves the next layer's there.
  bool prefill_layer(size_t li, float* h, int64_t n, const int32_t* pos_dev, const gpu::Int4Expert* streamed, const Batch* batch = nullptr,
                     bool normed = false);
  // step_rows' work on the stream for n tokens in `groups` (hio filled): logits of every row to
  // logits_dst (hrows, logits_sink: left in blogits, nullptr: none).
  // hidden_dst: the rows after the final norm to the pinned mtp.hhid (nullptr: none).
  void enqueue_rows(int64_t n, const Batch& b, float* logits_dst, float* hidden_dst = nullptr);
  // As a graph where it can be, else eagerly; hidden rows to `hidden` (host memory) when given.
  void run_rows(int64_t n, const Batch& b, float* logits_dst, float* hidden = nullptr);
  // Candidates picked on the device (forward_top, step_rows_top): whether the rows' k (0..kMaxTopK) and
  // penalty lists fit; then penalties[r] applied to row r of logits_dev [rows, vocab] and its k[r] best
  // (id, penalised logit) pairs to tops[r] (k[r] 0: none), through ids_dev / vals_dev [rows * max k].
  bool device_tops_fit(std::span<const std::span<const gpu::Penalty>> penalties, std::span<const int> k) const;
  void device_tops(float* logits_dev, std::span<const std::span<const gpu::Penalty>> penalties, std::span<const int> k, int32_t* ids_dev,
                   float* vals_dev, std::span<std::vector<std::pair<int32_t, float>>* const> tops);
  // The graph row_graphs holds under `key`, else `enqueue` captured as it (step_rows' and the MTP
  // head's steps: keys by step shape).
  cudaGraphExec_t cached_graph(int key, const std::function<void()>& enqueue);
  // The MTP head over n rows of one slot (hio filled as step_rows' table of one group; the hidden rows
  // copied to po, the ids to bio or, for a chunk, pids and ppos; ids_host: the same ids in host memory
  // for the embedding table in host memory): fc, its layer, mtp.norm of the last row into x; the batch
  // kernels (n <= rows) or the prompt-chunk ones on the selected slot.
  void enqueue_mtp(int64_t n, bool chunk, const int32_t* ids_host);
  void prefill_logits(const float* h_last, float* logits_last);
  // A prompt piece's positions into pos_dev and embedding rows into h_dev (on the GPU, or from the
  // host table via hembed).
  void prefill_inputs(const int32_t* ids_host, int64_t n, int32_t* ids_dev, int32_t* pos_dev, float* h_dev);
  // The embedding rows of n tokens from the table in host memory (hembed staging) into h_dev [n, H].
  void host_embedding_rows(const int32_t* ids_host, int64_t n, float* h_dev);
  // Streamed prefill (GpuOptions::stream_prefill_min_tokens): n <= st.pass tokens layer by layer,
  // each layer's host experts copied over PCIe one layer ahead (see the .cpp).
  void prefill_streamed(const int32_t* ids_host, int64_t n, float* logits_last, float* hidden = nullptr);
  // Asks the host experts for their layouts (setting st.on / st.note); before build().
  void stream_setup();
  bool host_layout(int l, int64_t gs, uint64_t align, HostExperts::StreamLayer& sl, std::string& note) const;  // stream_setup, link_setup
  // Layer li's streamed expert table and conversion jobs into st.tables / st.jobs (commit pass of build).
  void stream_table(int li, const std::vector<gpu::Int4Expert>& i4);
  // Whether streamed prefill copies layer l's host experts.
  bool streams(size_t l) const { return st.on && l < st.layout.size() && !st.layout[l].experts.empty(); }

  // The shared expert's down projection of silu(g) * u [T, in], formed as it reads (bf16 or 8-bit rows:
  // swiglu_fused): silu_mul then the GEMV, in one launch.
  void swiglu_down(const DevLinear& L, const float* g, const float* u, int T, float* out, cudaStream_t on);
  // The shared expert's gate, up (sg, su: [n, shared intermediate] each) and gate logit (sgate [n], unless
  // router_gate computed it) of n tokens of x on `on`, where no x_proj stack computed them with the
  // router (8-bit shared projections beside a bf16 router): so they can go beside the routed experts too.
  // shared_beside_ok: the layer's are GEMVs that need no workspace of the routed experts' (bf16 or 8-bit
  // rows, not int4).
  void shared_inputs(const DevLayer& L, const float* x, int64_t n, float* sg, float* su, float* sgate, cudaStream_t on);
  static bool shared_beside_ok(const DevLayer& L) {
    if (L.x_proj.out) return true;
    const bool stacked = L.sh_gate_up.out != 0;
    return !L.sh_expert_gate.int4 && (stacked ? !L.sh_gate_up.int4 : !L.sh_gate.int4 && !L.sh_up.int4);
  }
  void linear(const DevLinear& L, const float* in, float* out, bool early_next = false);  // early_next: gemv_bf16's / gemv_rows8's

  static constexpr int kMarks = 5;  // per layer: start, mixer done, routed, GPU experts done, end
  void mark(Trace* tr, size_t layer, int which) {
    if (tr) CK(cudaEventRecord(tev[layer * kMarks + which], stream));
  }
  void trace_begin(Trace* tr);
  void trace_end(Trace* tr);

  // One decode step: eagerly (GpuOptions::eager, --trace, and the cases graph_ok excludes) or as the
  // captured CUDA graph: the same enqueue() either way.
  // hidden_host: the token's hidden state after the final norm [H] (the MTP head's input), when given.
  void step(int32_t id, float* logits_host, float* hidden_host = nullptr);

  // Captures graphs[w]; abandon_capture ends a capture after a failure so the stream stays usable.
  void capture(int w);
  void abandon_capture();

  // Queues one token's work on the stream: id / position copied from id_src / pos_src (host memory),
  // logits (when logits_dst) copied to logits_dst. Host-side waits only for hybrid handoffs and the
  // host embedding (neither is captured in a graph).
  // hidden_dst: the hidden state after the final norm [H] copied there too (nullptr: none).
  void enqueue(int32_t id, const int32_t* id_src, const int32_t* pos_src, float* logits_dst, Trace* tr, float* hidden_dst = nullptr);
};

}  // namespace tandem
