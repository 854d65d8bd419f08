// cpu_experts/thread_pool.h: persistent worker threads for the expert kernels.
//
// One thread per physical core (hwloc; the calling thread counts as worker 0 and works too), each
// helper pinned to its own core. run(n, fn) hands out task ids 0..n-1 through atomic counters and
// returns when all tasks are done, whichever threads did them: a helper that is descheduled (shared
// machine) does not hold the run up, it skips it when it wakes. No thread is created or joined on
// the hot path. Idle helpers spin for `spin_us` (a decode step's runs follow each other within
// microseconds), then sleep on a futex (std::atomic::wait) until the next run().
//
// NUMA: helpers are numbered node by node. Tasks are split into one contiguous slice per node, in
// proportion to the node's workers (node_range), or as the caller says (run_split); a worker drains
// its own node's slice first, then steals. Callers that bind each node's share of their data to that
// node (bind_to_node, with the same node_range split) get local reads; on one node this is a single
// shared counter. Options::pretend_nodes splits the workers of a one-node machine into several
// "nodes" so tests exercise the per-node slicing and stealing (memory binding is skipped then).
//
// Threading contract: run() may be called from one thread at a time; fn must not call run().
// Exceptions thrown by fn are re-thrown from run() (the first one; the remaining tasks still run).
// A worker thread that cannot be started makes the constructor throw tandem::Error (after joining
// the ones it started).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tandem::cpu {

class ThreadPool {
 public:
  struct Options {
    int threads = 0;       // total workers including the caller; 0 = physical cores
    bool pin = true;       // pin helpers to cores (hwloc, else sched_setaffinity on logical CPUs)
    bool pin_caller = false;  // also pin the calling thread to worker 0's core
    int spin_us = 300;     // how long an idle helper spins before sleeping
    int pretend_nodes = 0;  // > 1: treat the workers as this many NUMA nodes (tests on one-node machines)
  };

  explicit ThreadPool(Options opt);
  ThreadPool() : ThreadPool(Options{}) {}
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(node_of_.size()); }
  int numa_nodes() const { return nodes_; }
  int node_of(int worker) const { return node_of_[worker]; }
  const std::string& description() const { return description_; }

  // Calls fn(task, worker) for every task in [0, n); worker < threads() names the calling thread's
  // slot (for per-worker scratch).
  template <typename F>
  void run(int64_t n, F&& fn) {
    auto call = [](void* ctx, int64_t task, int worker) { (*static_cast<std::remove_reference_t<F>*>(ctx))(task, worker); };
    run_impl(n, nullptr, call, static_cast<void*>(&fn));
  }
  // Like run(n, fn) with node j's slice given by the caller: tasks [node_end[j-1], node_end[j])
  // (node_end has numa_nodes() entries, non-decreasing, the last one n).
  template <typename F>
  void run_split(int64_t n, const int64_t* node_end, F&& fn) {
    auto call = [](void* ctx, int64_t task, int worker) { (*static_cast<std::remove_reference_t<F>*>(ctx))(task, worker); };
    run_impl(n, node_end, call, static_cast<void*>(&fn));
  }

  // Node j's share [first, second) of n units, in proportion to its workers (the split run() uses).
  std::pair<int64_t, int64_t> node_range(int node, int64_t n) const;
  // Binds the whole pages inside [p, p + bytes) to `node` and migrates what is already there; false
  // when nothing was done (one node, pretend nodes, no hwloc, or the OS refused).
  bool bind_to_node(const void* p, size_t bytes, int node) const;

  static int physical_cores();

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int worker);
  struct alignas(64) Slice {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  // Runs alternate between two slots, so a helper that wakes late for a finished run never reads
  // a slot that is being rewritten: the caller reuses a slot only when no helper is inside it.
  struct Slot {
    TaskFn fn = nullptr;
    void* ctx = nullptr;
    std::unique_ptr<Slice[]> slices;  // one per node
    alignas(64) std::atomic<int64_t> done{0};
    alignas(64) std::atomic<int> active{0};
  };
  void run_impl(int64_t n, const int64_t* node_end, TaskFn fn, void* ctx);
  void work(Slot& s, int worker);
  void helper_main(int worker);
  void stop_helpers() noexcept;

  Options opt_;
  int nodes_ = 1;
  bool real_nodes_ = true;       // false: pretend nodes (no memory binding)
  std::vector<int> os_node_;     // hwloc logical index of each node in use
  std::vector<int> node_workers_before_;  // workers on nodes 0..j-1, j = 0..nodes
  std::shared_ptr<void> topology_;        // hwloc topology kept for memory binding (multi-node only)
  std::vector<int> node_of_;
  std::vector<int> cpu_of_;  // logical CPU (OS index) each worker is pinned to, -1 if none
  std::string description_;
  std::vector<std::thread> helpers_;
  Slot slots_[2];

  alignas(64) std::atomic<uint64_t> generation_{0};  // written by the caller only
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace tandem::cpu
