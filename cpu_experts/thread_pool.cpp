#include "cpu_experts/thread_pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <system_error>

#include "core/error.h"

#ifdef TANDEM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace tandem::cpu {

namespace {

struct Core {
  int cpu;   // OS index of the logical CPU we pin to
  int node;  // NUMA node (logical index)
};

bool allowed(const cpu_set_t& mask, int cpu) { return cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mask); }

#ifdef TANDEM_HAVE_HWLOC
std::vector<Core> discover_cores(const cpu_set_t& mask, std::string& how) {
  std::vector<Core> cores;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return cores;
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return cores;
  }
  const int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  const int nnodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < ncores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, i);
    int cpu = -1;
    // The first hardware thread of the core that this process may run on.
    for (int j = 0;; ++j) {
      hwloc_obj_t pu = hwloc_get_obj_inside_cpuset_by_type(topo, core->cpuset, HWLOC_OBJ_PU, j);
      if (!pu) break;
      if (allowed(mask, static_cast<int>(pu->os_index))) {
        cpu = static_cast<int>(pu->os_index);
        break;
      }
    }
    if (cpu < 0) continue;
    int node = 0;
    for (int j = 0; j < nnodes; ++j) {
      hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, j);
      if (hwloc_bitmap_isincluded(core->cpuset, numa->cpuset)) node = j;
    }
    cores.push_back({cpu, node});
  }
  hwloc_topology_destroy(topo);
  how = "hwloc";
  return cores;
}
#else
// Without hwloc: one logical CPU per core from sysfs (the first of its thread siblings), node 0.
std::vector<Core> discover_cores(const cpu_set_t& mask, std::string& how) {
  std::vector<Core> cores;
  std::set<std::string> seen;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!allowed(mask, cpu)) continue;
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
    std::string sib;
    if (!(f >> sib)) sib = std::to_string(cpu);
    if (seen.insert(sib).second) cores.push_back({cpu, 0});
  }
  how = "sysfs";
  return cores;
}
#endif

std::vector<Core> usable_cores(std::string& how) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0)
    for (int i = 0; i < static_cast<int>(std::thread::hardware_concurrency()); ++i) CPU_SET(i, &mask);
  std::vector<Core> cores = discover_cores(mask, how);
  if (cores.empty()) {
    how = "no topology";
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (allowed(mask, cpu)) cores.push_back({cpu, 0});
  }
  std::stable_sort(cores.begin(), cores.end(), [](const Core& a, const Core& b) { return a.node < b.node; });
  return cores;
}

void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

}  // namespace

int ThreadPool::physical_cores() {
  std::string how;
  return static_cast<int>(usable_cores(how).size());
}

ThreadPool::ThreadPool(Options opt) : opt_(opt) {
  std::string how;
  const std::vector<Core> cores = usable_cores(how);
  const int n = opt.threads > 0 ? opt.threads : static_cast<int>(cores.size());
  if (n < 1) fail("cpu experts: thread pool needs at least one thread");
  std::vector<int> node_ids;
  for (int i = 0; i < n; ++i) {
    const Core& c = cores[static_cast<size_t>(i) % cores.size()];
    node_ids.push_back(c.node);
    cpu_of_.push_back(opt.pin ? c.cpu : -1);
  }
  // Renumber the nodes in use densely (0 .. nodes-1).
  std::vector<int> uniq = node_ids;
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  nodes_ = static_cast<int>(uniq.size());
  os_node_ = uniq;
  for (int id : node_ids)
    node_of_.push_back(static_cast<int>(std::lower_bound(uniq.begin(), uniq.end(), id) - uniq.begin()));
  if (opt.pretend_nodes > 1) {  // contiguous groups of workers, as real nodes are numbered
    real_nodes_ = false;
    nodes_ = std::min(opt.pretend_nodes, n);
    for (int i = 0; i < n; ++i) node_of_[static_cast<size_t>(i)] = i * nodes_ / n;
  }
  node_workers_before_.assign(static_cast<size_t>(nodes_) + 1, 0);
  for (int i = 0; i < n; ++i) ++node_workers_before_[static_cast<size_t>(node_of_[static_cast<size_t>(i)]) + 1];
  for (int j = 0; j < nodes_; ++j) node_workers_before_[j + 1] += node_workers_before_[j];
  for (Slot& slot : slots_) slot.slices = std::make_unique<Slice[]>(static_cast<size_t>(nodes_));
#ifdef TANDEM_HAVE_HWLOC
  if (real_nodes_ && nodes_ > 1) {
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) == 0) {
      if (hwloc_topology_load(topo) == 0)
        topology_ = std::shared_ptr<void>(topo, [](void* t) { hwloc_topology_destroy(static_cast<hwloc_topology_t>(t)); });
      else
        hwloc_topology_destroy(topo);
    }
  }
#endif

  description_ = str_cat(n, " threads on ", cores.size(), " physical cores (", how, "), ", nodes_, " NUMA node",
                         nodes_ > 1 ? "s" : "", real_nodes_ ? "" : " (pretend)",
                         real_nodes_ && nodes_ > 1 ? (topology_ ? ", weights bound per node" : ", no memory binding") : "",
                         opt.pin ? ", pinned" : ", not pinned", n > static_cast<int>(cores.size()) ? ", oversubscribed" : "");
  if (opt.pin && opt.pin_caller) pin_to(cpu_of_[0]);
  for (int i = 1; i < n; ++i) {
    try {
      helpers_.emplace_back(&ThreadPool::helper_main, this, i);
    } catch (const std::system_error& e) {
      // The destructor does not run for a half-built object: stop and join the helpers started so far
      // (destroying a joinable std::thread would call std::terminate).
      stop_helpers();
      fail("cpu experts: cannot start worker thread ", i + 1, " of ", n, " (", e.what(), "); use fewer threads (--threads, cpu.threads)");
    }
  }
}

void ThreadPool::stop_helpers() noexcept {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : helpers_) t.join();
  helpers_.clear();
}

ThreadPool::~ThreadPool() { stop_helpers(); }

std::pair<int64_t, int64_t> ThreadPool::node_range(int node, int64_t n) const {
  const int64_t T = threads();
  const int64_t b = node_workers_before_[static_cast<size_t>(node)], e = node_workers_before_[static_cast<size_t>(node) + 1];
  return {node == 0 ? 0 : n * b / T, node + 1 == nodes_ ? n : n * e / T};
}

bool ThreadPool::bind_to_node(const void* p, size_t bytes, int node) const {
#ifdef TANDEM_HAVE_HWLOC
  if (!topology_ || node < 0 || node >= nodes_) return false;
  auto topo = static_cast<hwloc_topology_t>(topology_.get());
  const uintptr_t page = 4096, a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1),
                  e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (e <= a) return false;
  hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(os_node_[static_cast<size_t>(node)]));
  if (!obj) return false;
  return hwloc_set_area_membind(topo, reinterpret_cast<const void*>(a), e - a, obj->nodeset, HWLOC_MEMBIND_BIND,
                                HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_MIGRATE) == 0;
#else
  (void)p, (void)bytes, (void)node;
  return false;
#endif
}

void ThreadPool::run_impl(int64_t n, const int64_t* node_end, TaskFn fn, void* ctx) {
  if (n <= 0) return;
  const int T = threads();
  if (T == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i, 0);
    return;
  }
  const uint64_t g = generation_.load(std::memory_order_relaxed) + 1;
  Slot& s = slots_[g & 1];
  // Helpers that joined run g-2 (same slot) may still be leaving it; they only find exhausted counters.
  for (int spins = 0; s.active.load(std::memory_order_seq_cst) != 0; ++spins) {
    if (spins < 1000) _mm_pause();
    else std::this_thread::yield();
  }
  s.fn = fn;
  s.ctx = ctx;
  s.done.store(0, std::memory_order_relaxed);
  // One contiguous slice of task ids per node: the caller's, or sized by the node's share of the workers.
  int64_t start = 0;
  for (int j = 0; j < nodes_; ++j) {
    const int64_t end = j + 1 == nodes_ ? n : std::clamp(node_end ? node_end[j] : node_range(j, n).second, start, n);
    s.slices[j].next.store(start, std::memory_order_relaxed);
    s.slices[j].end = end;
    start = end;
  }
  generation_.store(g, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  work(s, 0);
  for (int spins = 0; s.done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 20000) _mm_pause();
    else std::this_thread::yield();  // a helper holding a task was descheduled
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadPool::work(Slot& s, int worker) {
  const int home = node_of_[worker];
  for (int d = 0; d < nodes_; ++d) {
    Slice& sl = s.slices[(home + d) % nodes_];
    for (;;) {
      const int64_t t = sl.next.fetch_add(1, std::memory_order_relaxed);
      if (t >= sl.end) break;
      try {
        s.fn(s.ctx, t, worker);
      } catch (...) {
        std::lock_guard lock(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
      s.done.fetch_add(1, std::memory_order_release);
    }
  }
}

void ThreadPool::helper_main(int worker) {
  pin_to(cpu_of_[worker]);
  using clock = std::chrono::steady_clock;
  // Generation 0 is the constructor's: a run() may be posted before this thread first looks.
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    auto since = clock::now();
    for (int spins = 1; (g = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
      _mm_pause();
      if (spins % 256 == 0 && clock::now() - since > std::chrono::microseconds(opt_.spin_us)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        generation_.wait(seen, std::memory_order_seq_cst);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        since = clock::now();
      }
    }
    seen = g;
    if (stop_.load()) return;
    Slot& s = slots_[g & 1];
    s.active.fetch_add(1, std::memory_order_seq_cst);
    // Still run g? Then the caller cannot rewrite this slot until we leave it (it waits for active
    // == 0 first). Otherwise the run is over (or the slot is being rewritten): skip it.
    if (generation_.load(std::memory_order_seq_cst) == g) work(s, worker);
    s.active.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace tandem::cpu
