// bench/dev/kernel_timeline.cpp: a CUPTI injection library that records every kernel's start and end on
// the GPU (graph-launched kernels included, each with its graph and node) and writes them, at the
// process's exit, to kernel_timeline.csv in the working directory. Nothing in Tandem changes: the CUDA
// driver loads it when CUDA_INJECTION64_PATH names it, e.g.
//
//   g++ -std=c++20 -O2 -shared -fPIC bench/dev/kernel_timeline.cpp -I$CUDA/include -L$CUPTI_LIB -lcupti
//       -Wl,-rpath,$CUPTI_LIB -o /tmp/libkernel_timeline.so
//   CUDA_INJECTION64_PATH=/tmp/libkernel_timeline.so build/tandem bench ...
//   python3 bench/dev/kernel_timeline.py kernel_timeline.csv
//
// (scripts/gpu_ab.sh's `timeline` step does all three.) The kernels run concurrently as they would
// untraced (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL; programmatic dependent launch stays on), each record
// costing the driver a timestamp pair.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

static_assert(CUPTI_API_VERSION >= 130000, "CUpti_ActivityKernel10 is CUPTI 13's kernel record");

namespace {

struct Record {
  uint64_t start, end, graph_node;
  uint32_t graph, stream, correlation;
  int grid, block;
  std::string name;
};

std::mutex records_mutex;
std::vector<Record> records;
constexpr size_t kBufferBytes = size_t{8} << 20;

bool cupti_ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_timeline: %s: %s\n", what, msg ? msg : "unknown CUPTI error");
  return false;
}

// The demangled name (kernel_timeline.py shortens it, as scripts/kernel_steps.py does ncu's).
std::string kernel_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && plain ? plain : mangled;
  std::free(plain);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Record> got;
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
    got.push_back({k->start, k->end, k->graphNodeId, k->graphId, k->streamId, k->correlationId, k->gridX * k->gridY * k->gridZ,
                   k->blockX * k->blockY * k->blockZ, kernel_name(k->name)});
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), got.begin(), got.end());
}

void write_records() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const std::lock_guard<std::mutex> lock(records_mutex);
  std::FILE* f = std::fopen("kernel_timeline.csv", "w");
  if (!f) {
    std::perror("kernel_timeline: kernel_timeline.csv");
    return;
  }
  std::fprintf(f, "start_ns,end_ns,graph,node,stream,correlation,blocks,threads,kernel\n");
  for (const Record& r : records)  // the name quoted: a C++ name holds commas, never a double quote
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%u,%d,%d,\"%s\"\n", static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
                 r.graph, static_cast<unsigned long long>(r.graph_node), r.stream, r.correlation, r.grid, r.block, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_timeline: %zu kernels in kernel_timeline.csv\n", records.size());
}

// A context about to go (the runtime's teardown may come before write_records): its records first.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  if (!cupti_ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks") ||
      !cupti_ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)"))
    return 0;
  CUpti_SubscriberHandle subscriber;
  if (cupti_ok(cuptiSubscribe(&subscriber, on_resource, nullptr), "cuptiSubscribe"))
    cupti_ok(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING), "cuptiEnableCallback");
  std::atexit(write_records);
  return 1;
}
